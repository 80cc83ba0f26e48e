// The decode runner (DESIGN §4): eager at the batch's own size, or graph replay per batch bucket
// with safe padding, plus the incident's fault injection (DESIGN §5).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dsa/cache.h"
#include "dsa/model.h"
#include "dsa/sampler.h"

namespace dsa {

enum class RunMode : uint8_t { kEager, kGraph };

// Faults that reproduce the incident, and one that exercises the store error path. Off by
// default; turning one on is logged loudly.
struct FaultSet {
  bool stale_padding = false;    // padded rows keep what the previous replay left in them
  bool unguarded_store = false;  // the bf16 index-K writer behaves like the incident's scatter
  bool wild_slots = false;       // every real row's slot is moved past the pool's capacity, so
                                 // every store rejects it and raises the step's error flag
  bool any() const { return stale_padding || unguarded_store || wild_slots; }
  std::string describe() const;  // "none" or e.g. "stale-padding,unguarded-store"
};
// "", "none", or a comma list of stale-padding, unguarded-store, incident (both), wild-slot;
// throws on anything else.
FaultSet parse_faults(std::string_view list);

std::vector<int> default_buckets();  // 1, 2, 4, 8, 12, 16, 24, 32, 48, ..., 256

// Whether each step also returns, per layer and pool, the digest of what every real row meant to
// write (the auditor's truth) ...
enum class WriteDigests : uint8_t { kOff, kOn };
// ... and the store inputs themselves (for the shadow oracle's host-side copy).
enum class WriteValues : uint8_t { kOff, kOn };

struct RunnerOptions {
  RunMode mode = RunMode::kEager;
  std::vector<int> buckets = default_buckets();  // graph mode; every bucket <= model.max_rows()
  FaultSet faults;
  WriteDigests write_digests = WriteDigests::kOff;
  WriteValues write_values = WriteValues::kOff;
  bool logprobs = false;  // every step (replays too) computes log-probs, so steps may ask for them
};

// One row of a step: one token of one request.
struct RowInput {
  int32_t token = 0;
  int32_t position = 0;
  int64_t slot = kPadSlot;         // where the row's token is stored
  int32_t seq_len = 0;             // tokens it attends to (position + 1 for a real row)
  std::span<const int32_t> pages;  // the request's page table
};

// How one row's next token is drawn (sampler.h).
struct RowSampling {
  SamplingParams params;  // greedy by default
  uint64_t index = 0;     // the draw's position in the request's output
};

// How a step draws each row's next token on the device, and what it copies back besides them.
struct StepOutputs {
  std::span<const RowSampling> sampling;  // one per row; empty: every row greedy
  bool logprobs = false;                  // needs RunnerOptions::logprobs
  bool logits = false;                    // [rows, vocab] floats: for parity checks and diagnostics

  StepOutputs with_sampling(std::span<const RowSampling> s) const {
    StepOutputs o = *this;
    o.sampling = s;
    return o;
  }
  StepOutputs with_logprobs(bool on = true) const {
    StepOutputs o = *this;
    o.logprobs = on;
    return o;
  }
  StepOutputs with_logits(bool on = true) const {
    StepOutputs o = *this;
    o.logits = on;
    return o;
  }
};

struct StepResult {
  std::vector<int32_t> tokens;  // [rows] each real row's next token, drawn on the device
  std::vector<float> logprobs;  // [rows] log softmax(logits)[token] at temperature 1, when asked
  std::vector<float> logits;    // [rows, vocab] for the real rows, when asked
  int bucket = 0;               // the replayed bucket, 0 when the step ran eagerly
  int32_t store_errors = 0;  // the step's error flag (DESIGN §3 rule 4 / bad slots, bad page ids)
  // With store_errors > 0: the real rows whose slot the store contract rejects as an error (the
  // same judge_slot, on the host); empty when no real row's slot explains the flag.
  std::vector<int> error_rows;
  // With WriteDigests::kOn: [layers * 2][rows], latent then index-K per layer (whatever the row's
  // slot; the caller keeps the rows whose slot was written). With WriteValues::kOn:
  // [layers][rows][kStoreValuesDim].
  std::vector<uint64_t> write_digests;
  std::vector<float> store_values;
  // Host time of the step, split: checking and staging the rows and queuing the upload; launching
  // (the CPU backend computes the step here); waiting for the device at the step's end. The rest
  // of the call (reading the results back) is the caller's to measure.
  double stage_us = 0;
  double launch_us = 0;
  double wait_us = 0;
  uint64_t write_digest(int layer, PoolKind pool, size_t row, size_t rows) const {
    return write_digests[(size_t(layer) * 2 + (pool == PoolKind::kLatent ? 0 : 1)) * rows + row];
  }
};

class Runner {
 public:
  Runner(Model& model, KvCache& cache, RunnerOptions options);
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Runs one step over rows.size() real rows and draws each row's next token on the device.
  // Graph mode replays the smallest bucket that holds them; a larger batch runs eagerly (and says
  // why in the log once). Throws kInternal when every logit of a real row is NaN.
  StepResult step(std::span<const RowInput> rows, const StepOutputs& outputs = {});
  StepResult step_eager(std::span<const RowInput> rows, const StepOutputs& outputs = {});

  // Diagnostics: writes seeded garbage (wild and valid-looking slots, huge positions and seq_lens,
  // out-of-vocabulary tokens, random page ids) into every per-row input of every bucket, on the
  // device and in the staging. A correct runner rewrites all of it before the next replay; the
  // stale-padding fault lets it through.
  void plant_garbage_inputs(uint64_t seed);

  const RunnerOptions& options() const { return options_; }

 private:
  struct StaticStep;  // one bucket's (or the eager path's) device buffers and host staging
  enum class Launch : uint8_t { kEager, kReplay };
  enum class Padding : uint8_t { kRewrite, kLeaveStale };
  StepResult run(StaticStep& s, std::span<const RowInput> rows, Launch launch,
                 const StepOutputs& outputs);
  void stage_rows(StaticStep& s, std::span<const RowInput> rows,
                  std::span<const RowSampling> sampling, Padding padding);
  void forward_and_sample(const StaticStep& s, int rows, const StepOptions& options);
  void queue_records(StaticStep& s, int launched_rows);
  void read_records(StaticStep& s, int real_rows, StepResult& result);

  Model& model_;
  KvCache& cache_;
  RunnerOptions options_;
  int max_pages_;
  // Shared by every bucket (one step runs at a time): the logits and the sampler's workspace.
  DeviceArray<float> logits_;
  DeviceArray<uint8_t> sample_workspace_;
  std::unique_ptr<StaticStep> eager_;
  std::vector<std::unique_ptr<StaticStep>> graphs_;  // ascending bucket size
  bool logged_oversize_ = false;
};

}  // namespace dsa
