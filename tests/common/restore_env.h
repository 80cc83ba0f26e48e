// RestoreEnv: puts environment variables back as they were (set to their value, or unset) at the
// end of a scope, however it ends; for tests that set variables a backend reads when it is made.
#pragma once

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace dsa::testing {

class RestoreEnv {
 public:
  explicit RestoreEnv(std::vector<std::string> names) : names_(std::move(names)) {
    for (const std::string& name : names_) {
      const char* v = std::getenv(name.c_str());
      saved_.emplace_back(v != nullptr, v != nullptr ? v : "");
    }
  }
  ~RestoreEnv() {
    for (size_t i = 0; i < names_.size(); ++i) {
      saved_[i].first ? setenv(names_[i].c_str(), saved_[i].second.c_str(), 1)
                      : unsetenv(names_[i].c_str());
    }
  }
  RestoreEnv(const RestoreEnv&) = delete;
  RestoreEnv& operator=(const RestoreEnv&) = delete;

 private:
  std::vector<std::string> names_;
  std::vector<std::pair<bool, std::string>> saved_;
};

}  // namespace dsa::testing
