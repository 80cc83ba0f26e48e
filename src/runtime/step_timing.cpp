#include "dsa/step_timing.h"

#include <fmt/format.h>

#include <chrono>

namespace dsa {

StepTimes StepTimes::per_step_us(int64_t steps) const {
  const double k = steps > 0 ? 1e6 / double(steps) : 0.0;
  return {schedule * k, stage * k, launch * k, device_wait * k, post * k, audit * k};
}

std::string StepTimes::describe_us() const {
  return fmt::format(
      "host {:.1f} us (schedule {:.1f}, stage {:.1f}, post {:.1f}); launch {:.1f} us, device wait "
      "{:.1f} us, audit {:.1f} us",
      host(), schedule, stage, post, launch, device_wait, audit);
}

double PhaseTimer::steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void PhaseTimer::charge() {
  const double now = now_();
  seconds_[size_t(current_)] += now - last_;
  last_ = now;
}

void PhaseTimer::start(StepPhase phase) {
  seconds_.fill(0.0);
  current_ = phase;
  last_ = now_();
}

StepPhase PhaseTimer::enter(StepPhase phase) {
  charge();
  const StepPhase previous = current_;
  current_ = phase;
  return previous;
}

double PhaseTimer::take(StepPhase phase) {
  charge();
  const double s = seconds_[size_t(phase)];
  seconds_[size_t(phase)] = 0.0;
  return s;
}

}  // namespace dsa
