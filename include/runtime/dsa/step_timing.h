// Where the wall time of engine steps goes, phase by phase, measured on the host.
//
// The engine's own host work per step is schedule + stage + post: what the host must do between
// two device steps. launch is reported beside it, because on the CPU backend launching a step is
// the step's whole compute (on CUDA it is the graph launch, or the kernel launches when eager).
// audit is the diagnostics (the slot auditor and the shadow oracle), off by default.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace dsa {

// Seconds summed over steps, or microseconds per step (StepTimes::per_step_us).
struct StepTimes {
  double schedule = 0;     // admission, page growth and preemption, building rows, the store check
  double stage = 0;        // the runner: checking and staging rows, queuing the upload
  double launch = 0;       // the runner: launching the step (the CPU backend computes it here)
  double device_wait = 0;  // waiting for the device at the end of runner steps
  double post = 0;   // reading results back, appending tokens, finishing requests, sharing pages
  double audit = 0;  // the slot auditor and the shadow oracle

  double host() const { return schedule + stage + post; }  // the engine's own host work
  double total() const { return host() + launch + device_wait + audit; }
  StepTimes per_step_us(int64_t steps) const;  // seconds summed over `steps` -> us per step
  // "host 21.4 us (schedule 9.1, stage 4.0, post 8.3); launch 3.2 us, device wait 950.1 us,
  // audit 0.0 us", for figures that are already us per step.
  std::string describe_us() const;
};

// What the host is doing now, for PhaseTimer.
enum class StepPhase : uint8_t { kSchedule, kRunner, kPost, kAudit };

// Charges elapsed wall time to the phase the host is in. enter() switches phase and returns the
// previous one, so a nested phase (an audit inside scheduling) is charged to itself alone.
class PhaseTimer {
 public:
  using Clock = double (*)();  // seconds on a monotonic clock
  explicit PhaseTimer(Clock now = steady_seconds) : now_(now) {}

  void start(StepPhase phase);       // clears every phase and starts in `phase`
  StepPhase enter(StepPhase phase);  // charges the current phase; returns it
  double take(StepPhase phase);      // charges the current phase, then returns and clears `phase`
  StepPhase current() const { return current_; }

  static double steady_seconds();

 private:
  void charge();

  Clock now_;
  double last_ = 0;
  StepPhase current_ = StepPhase::kSchedule;
  std::array<double, 4> seconds_{};
};

// Runs a scope in one phase and returns to the previous phase when it ends.
class PhaseScope {
 public:
  PhaseScope(PhaseTimer& timer, StepPhase phase) : timer_(timer), previous_(timer.enter(phase)) {}
  ~PhaseScope() { timer_.enter(previous_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseTimer& timer_;
  StepPhase previous_;
};

}  // namespace dsa
