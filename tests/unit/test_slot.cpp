// The store guard of DESIGN §3, as one pure function shared by every writer.
#include <gtest/gtest.h>

#include "dsa/error.h"
#include "dsa/slot.h"

namespace dsa {
namespace {

constexpr int64_t kCapacity = 10 * kPageSize;

TEST(JudgeSlot, WritesOnlyWhenAllFourRulesHold) {
  EXPECT_EQ(judge_slot(0, 1, kPageSize, kCapacity), SlotVerdict::kWrite);
  EXPECT_EQ(judge_slot(3, 4, kCapacity - 1, kCapacity), SlotVerdict::kWrite);
}

TEST(JudgeSlot, EachRuleHasItsOwnVerdict) {
  EXPECT_EQ(judge_slot(4, 4, 100, kCapacity), SlotVerdict::kSkipStale);     // rule 1
  EXPECT_EQ(judge_slot(0, 4, kPadSlot, kCapacity), SlotVerdict::kSkipPad);  // rule 2
  EXPECT_EQ(judge_slot(0, 4, 0, kCapacity), SlotVerdict::kSkipReserved);    // rule 3
  EXPECT_EQ(judge_slot(0, 4, kPageSize - 1, kCapacity), SlotVerdict::kSkipReserved);
  EXPECT_EQ(judge_slot(0, 4, kCapacity, kCapacity), SlotVerdict::kErrorRange);  // rule 4
  EXPECT_EQ(judge_slot(0, 4, -2, kCapacity), SlotVerdict::kErrorNegative);
  EXPECT_EQ(judge_slot(0, 4, INT64_MIN, kCapacity), SlotVerdict::kErrorNegative);
}

TEST(JudgeSlot, StaleTailWinsOverEveryOtherRule) {
  // A row past n_real is never examined further, even when its slot is garbage.
  EXPECT_EQ(judge_slot(5, 2, -7, kCapacity), SlotVerdict::kSkipStale);
  EXPECT_EQ(judge_slot(5, 2, kCapacity * 3, kCapacity), SlotVerdict::kSkipStale);
  EXPECT_FALSE(verdict_is_error(SlotVerdict::kSkipStale));
  EXPECT_TRUE(verdict_is_error(SlotVerdict::kErrorRange));
  EXPECT_TRUE(verdict_is_error(SlotVerdict::kErrorNegative));
}

TEST(Error, MessageNamesValueLimitAndPlace) {
  try {
    require(7 <= 5, ErrorCode::kOutOfRange, "prompt has {} tokens, context holds {}", 7, 5);
    FAIL() << "require did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("prompt has 7 tokens, context holds 5"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("test_slot.cpp"), std::string::npos);
  }
}

}  // namespace
}  // namespace dsa
