// expect_error(fn, code, {parts...}): fn must throw a dsa::Error of `code` whose message holds
// every one of `parts`.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dsa/error.h"

namespace dsa::testing {

template <typename Fn>
void expect_error(Fn&& fn, ErrorCode code, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no dsa::Error was thrown; expected one mentioning "
                  << (parts.empty() ? std::string() : parts.front());
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
    }
  }
}

}  // namespace dsa::testing
