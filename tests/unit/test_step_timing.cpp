// The engine's step timing: phase switches charge the elapsed time to the phase being left, nested
// scopes charge only themselves, and the per-step figures are the sums over the steps. A fake
// clock drives it, so nothing here depends on real time.
#include <gtest/gtest.h>

#include "dsa/step_timing.h"

namespace dsa {
namespace {

double fake_now = 0;
double fake_clock() { return fake_now; }

TEST(StepTiming, PhasesAreChargedWithTheTimeSpentInThem) {
  fake_now = 100.0;
  PhaseTimer t(fake_clock);
  t.start(StepPhase::kSchedule);
  fake_now += 2.0;
  EXPECT_EQ(t.enter(StepPhase::kRunner), StepPhase::kSchedule);
  fake_now += 5.0;
  t.enter(StepPhase::kPost);
  fake_now += 1.0;
  {
    const PhaseScope audit(t, StepPhase::kAudit);
    EXPECT_EQ(t.current(), StepPhase::kAudit);
    fake_now += 3.0;
    {
      const PhaseScope again(t, StepPhase::kAudit);  // nested: still the audit's time
      fake_now += 0.5;
    }
    fake_now += 0.25;
  }
  EXPECT_EQ(t.current(), StepPhase::kPost);  // back where the scope began
  fake_now += 4.0;
  EXPECT_DOUBLE_EQ(t.take(StepPhase::kSchedule), 2.0);
  EXPECT_DOUBLE_EQ(t.take(StepPhase::kRunner), 5.0);
  EXPECT_DOUBLE_EQ(t.take(StepPhase::kAudit), 3.75);
  EXPECT_DOUBLE_EQ(t.take(StepPhase::kPost), 5.0);  // 1 before the audit, 4 after
  EXPECT_DOUBLE_EQ(t.take(StepPhase::kPost), 0.0);  // taken means cleared

  t.start(StepPhase::kPost);  // a new step forgets everything
  fake_now += 7.0;
  EXPECT_DOUBLE_EQ(t.take(StepPhase::kRunner), 0.0);
  EXPECT_DOUBLE_EQ(t.take(StepPhase::kPost), 7.0);
}

TEST(StepTiming, PerStepFiguresAreMicrosecondsPerStep) {
  StepTimes sum;
  sum.schedule = 0.002;
  sum.stage = 0.001;
  sum.launch = 0.5;
  sum.device_wait = 0.25;
  sum.post = 0.003;
  sum.audit = 0.004;
  const StepTimes us = sum.per_step_us(100);
  EXPECT_DOUBLE_EQ(us.schedule, 20.0);
  EXPECT_DOUBLE_EQ(us.stage, 10.0);
  EXPECT_DOUBLE_EQ(us.post, 30.0);
  EXPECT_DOUBLE_EQ(us.host(), 60.0);  // launch, waiting and the audit are not the engine's own
  EXPECT_DOUBLE_EQ(us.total(), 60.0 + 5000.0 + 2500.0 + 40.0);
  EXPECT_EQ(sum.per_step_us(0).total(), 0.0);
  EXPECT_NE(us.describe_us().find("host 60.0 us (schedule 20.0, stage 10.0, post 30.0)"),
            std::string::npos);
}

}  // namespace
}  // namespace dsa
