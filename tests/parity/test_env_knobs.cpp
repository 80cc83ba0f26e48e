// The CUDA kernels' environment knobs (backend/cuda/env_knobs.h): every listed value is taken, any
// other is refused with the variable, the value and the list in the message, and the list names
// every DSA_CUDA_ variable the kernels read. Host code only: these run without a GPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/env_knobs.h"
#include "common/expect_error.h"
#include "common/restore_env.h"

namespace dsa::cuda {
namespace {

std::vector<std::string> knob_names() {
  std::vector<std::string> names;
  for (const EnvKnob& knob : env_knobs()) names.push_back(knob.name);
  return names;
}

TEST(CudaEnvKnobs, ListedValuesPassOthersAreRefused) {
  testing::RestoreEnv restore(knob_names());
  for (const EnvKnob& knob : env_knobs()) unsetenv(knob.name);
  EXPECT_NO_THROW(check_env_knobs());
  for (const EnvKnob& knob : env_knobs()) {
    ASSERT_FALSE(knob.values.empty()) << knob.name;
    for (const std::string& value : knob.values) {
      setenv(knob.name, value.c_str(), 1);
      EXPECT_NO_THROW(check_env_knobs()) << knob.name << "=" << value;
    }
    setenv(knob.name, "", 1);  // empty: the default
    EXPECT_NO_THROW(check_env_knobs()) << knob.name << " empty";
    // A near miss of a listed value: another case, a trailing space, a number off by one.
    for (const std::string& bad :
         {knob.values.front() + " ", std::string("3"), std::string("WS")}) {
      setenv(knob.name, bad.c_str(), 1);
      testing::expect_error([] { check_env_knobs(); }, ErrorCode::kInvalidArgument,
                            {knob.name, "'" + bad + "'", knob.values.front(), knob.values.back()});
    }
    unsetenv(knob.name);
  }
}

// Every DSA_CUDA_ variable read in src/backend/cuda is a knob here, or one of the GEMM's, which
// the backend parses itself (and refuses when unknown) when it is made.
TEST(CudaEnvKnobs, ListNamesEveryVariableTheKernelsRead) {
  const std::set<std::string> gemm(gemm_env_knob_names().begin(), gemm_env_knob_names().end());
  const std::vector<std::string> listed = knob_names();
  const std::set<std::string> knobs(listed.begin(), listed.end());
  const std::regex read(R"re(getenv\("(DSA_CUDA_[A-Z0-9_]+)"\))re");
  std::set<std::string> seen;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(DSA_SOURCE_DIR) + "/src/backend/cuda")) {
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    for (std::sregex_iterator it(s.begin(), s.end(), read), end; it != end; ++it) {
      seen.insert((*it)[1]);
      EXPECT_TRUE(knobs.count((*it)[1]) || gemm.count((*it)[1]))
          << (*it)[1] << " is read in " << entry.path().filename() << " but is no knob";
    }
  }
  for (const std::string& name : listed) {
    EXPECT_TRUE(seen.count(name)) << name << " is a knob that no kernel reads";
  }
  EXPECT_GE(seen.size(), listed.size());
}

// The knobs a process set, as a backend's describe() reports them: set ones in list order,
// attention's before the GEMM's, empty and unset ones left out.
TEST(CudaEnvKnobs, SetKnobsAreNamedInListOrder) {
  std::vector<std::string> names = knob_names();
  names.insert(names.end(), gemm_env_knob_names().begin(), gemm_env_knob_names().end());
  testing::RestoreEnv restore(names);
  for (const std::string& name : names) unsetenv(name.c_str());
  EXPECT_EQ(env_knobs_set(), "");
  setenv("DSA_CUDA_GEMM", "mma", 1);
  setenv("DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "1", 1);
  setenv("DSA_CUDA_SPARSE_MLA_VARIANT", "ws", 1);
  setenv("DSA_CUDA_SPARSE_MLA_HEADS", "", 1);
  EXPECT_EQ(env_knobs_set(),
            "DSA_CUDA_SPARSE_MLA_VARIANT=ws, DSA_CUDA_SPARSE_MLA_MAX_SPLITS=1, DSA_CUDA_GEMM=mma");
}

}  // namespace
}  // namespace dsa::cuda
