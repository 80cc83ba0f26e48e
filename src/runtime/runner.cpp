// The graph policy of dsa.cpp, in one file (DESIGN §4).
//
// - Buckets are an explicit ascending list, captured largest first at construction.
// - Every bucket owns static device buffers that never move after capture, and host staging.
// - At every replay, every per-row input of every row is rewritten: real rows copied in, rows
//   [B, G) set to slot -1, seq_len 0, page-table row 0 (the dummy: page 0 only), position 0,
//   token 0; n_real = B. Nothing from a previous replay survives — unless the stale-padding fault
//   is on, which is the incident.
// - A batch larger than the largest bucket runs eagerly, and the log says so once.
#include "dsa/runner.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "dsa/error.h"

namespace dsa {

std::string FaultSet::describe() const {
  std::string s;
  if (stale_padding) s += "stale-padding";
  if (unguarded_store) s += std::string(s.empty() ? "" : ",") + "unguarded-store";
  if (wild_slots) s += std::string(s.empty() ? "" : ",") + "wild-slot";
  return s.empty() ? "none" : s;
}

FaultSet parse_faults(std::string_view list) {
  FaultSet f;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(',', start), list.size());
    const std::string_view item = list.substr(start, end - start);
    if (item == "stale-padding") {
      f.stale_padding = true;
    } else if (item == "unguarded-store") {
      f.unguarded_store = true;
    } else if (item == "incident") {
      f.stale_padding = f.unguarded_store = true;
    } else if (item == "wild-slot") {
      f.wild_slots = true;
    } else if (!item.empty() && item != "none") {
      fail(ErrorCode::kInvalidArgument,
           "unknown fault '{}' (known: stale-padding, unguarded-store, incident, wild-slot, none)",
           item);
    }
    start = end + 1;
  }
  return f;
}

std::vector<int> default_buckets() {
  std::vector<int> b = {1, 2, 4, 8, 12, 16, 24};
  for (int g = 32; g <= 256; g += g < 64 ? 16 : 32) b.push_back(g);
  return b;
}

// Where each per-row field lives in a bucket's one staging block (16-byte aligned offsets).
// Inputs and outputs share the block so a step moves it in one asynchronous copy each way: up,
// everything before the page table's unused rows; down, error_count and the sampled tokens (and
// log-probs). error_count is staged as 0 with the inputs, so no separate fill is needed.
struct StepLayout {
  size_t n_real, error_count, out_tokens, out_logprobs, slots, seeds, sample_index, tokens,
      positions, seq_lens, temperature, top_p, page_table, bytes;

  StepLayout(int rows, int64_t ld_page_table) {
    size_t at = 0;
    auto take = [&at](size_t n) {
      const size_t here = at;
      at += (n + 15) / 16 * 16;
      return here;
    };
    const size_t r = size_t(rows);
    n_real = take(4);
    error_count = n_real + 4;  // right after n_real, inside the same 16 bytes
    out_tokens = take(r * 4);
    out_logprobs = take(r * 4);
    slots = take(r * 8);
    seeds = take(r * 8);
    sample_index = take(r * 8);
    tokens = take(r * 4);
    positions = take(r * 4);
    seq_lens = take(r * 4);
    temperature = take(r * 4);
    top_p = take(r * 4);
    page_table = take(r * size_t(ld_page_table) * 4);
    bytes = at;
  }
};

struct Runner::StaticStep {
  StaticStep(Backend& be, int rows_, int max_pages, float* logits_, void* workspace, int layers,
             const RunnerOptions& options)
      : rows(rows_),
        ld_page_table(max_pages),
        layout(rows_, max_pages),
        device(be, layout.bytes),
        host(be, layout.bytes),
        logits(logits_),
        sample_workspace(workspace),
        h_n_real(staged<int32_t>(layout.n_real, 1)),
        h_error_count(staged<int32_t>(layout.error_count, 1)),
        h_tokens(staged<int32_t>(layout.tokens, rows)),
        h_positions(staged<int32_t>(layout.positions, rows)),
        h_seq_lens(staged<int32_t>(layout.seq_lens, rows)),
        h_page_table(staged<int32_t>(layout.page_table, size_t(rows) * max_pages)),
        h_slots(staged<int64_t>(layout.slots, rows)),
        h_temperature(staged<float>(layout.temperature, rows)),
        h_top_p(staged<float>(layout.top_p, rows)),
        h_seeds(staged<uint64_t>(layout.seeds, rows)),
        h_sample_index(staged<uint64_t>(layout.sample_index, rows)),
        h_out_tokens(staged<int32_t>(layout.out_tokens, rows)),
        h_out_logprobs(staged<float>(layout.out_logprobs, rows)) {
    std::fill(host.data(), host.data() + layout.bytes, uint8_t(0));
    if (options.write_digests == WriteDigests::kOn) {
      write_digests = DeviceArray<uint64_t>(be, size_t(layers) * 2 * rows_);
      h_write_digests = HostArray<uint64_t>(be, write_digests.size());
    }
    if (options.write_values == WriteValues::kOn) {
      store_values = DeviceArray<float>(be, size_t(layers) * rows_ * kStoreValuesDim);
      h_store_values = HostArray<float>(be, store_values.size());
    }
  }

  template <typename T>
  T* on_device(size_t offset) const {
    return reinterpret_cast<T*>(device.data() + offset);
  }
  template <typename T>
  std::span<T> staged(size_t offset, size_t count) const {
    return {reinterpret_cast<T*>(host.data() + offset), count};
  }

  StepView view(int active_rows) const {
    StepView v;
    v.rows = active_rows;
    v.tokens = on_device<int32_t>(layout.tokens);
    v.positions = on_device<int32_t>(layout.positions);
    v.slots = on_device<int64_t>(layout.slots);
    v.seq_lens = on_device<int32_t>(layout.seq_lens);
    v.page_table = on_device<int32_t>(layout.page_table);
    v.ld_page_table = ld_page_table;
    v.n_real = on_device<int32_t>(layout.n_real);
    v.error_count = on_device<int32_t>(layout.error_count);
    v.logits = logits;
    v.write_digests = write_digests.data();
    v.store_values = store_values.data();
    return v;
  }

  SampleParams sample_params(int active_rows, int vocab, bool logprobs) const {
    SampleParams p;
    p.logits = logits;
    p.temperature = on_device<float>(layout.temperature);
    p.top_p = on_device<float>(layout.top_p);
    p.seed = on_device<uint64_t>(layout.seeds);
    p.index = on_device<uint64_t>(layout.sample_index);
    p.tokens = on_device<int32_t>(layout.out_tokens);
    p.logprobs = logprobs ? on_device<float>(layout.out_logprobs) : nullptr;
    p.workspace = sample_workspace;
    p.rows = active_rows;
    p.vocab = vocab;
    p.ld_logits = vocab;
    return p;
  }

  // The bytes a step uploads when it reads `n` rows: every field, and n rows of the page table.
  size_t upload_bytes(int n) const {
    return layout.page_table + size_t(n) * size_t(ld_page_table) * sizeof(int32_t);
  }

  int rows;
  int64_t ld_page_table;
  StepLayout layout;
  DeviceArray<uint8_t> device;
  // Host staging. It persists between steps: the stale-padding fault relies on exactly that.
  HostArray<uint8_t> host;
  float* logits;                        // the runner's, [rows, vocab]
  void* sample_workspace;               // the runner's
  DeviceArray<uint64_t> write_digests;  // [layers, 2, rows] when WriteDigests::kOn, else empty
  DeviceArray<float> store_values;      // [layers, rows, kStoreValuesDim] when WriteValues::kOn
  // Their host copies (pinned on CUDA), queued before the step's one synchronizing copy down.
  HostArray<uint64_t> h_write_digests;
  HostArray<float> h_store_values;
  std::span<int32_t> h_n_real, h_error_count, h_tokens, h_positions, h_seq_lens, h_page_table;
  std::span<int64_t> h_slots;
  std::span<float> h_temperature, h_top_p;
  std::span<uint64_t> h_seeds, h_sample_index;
  std::span<int32_t> h_out_tokens;
  std::span<float> h_out_logprobs;
  std::unique_ptr<Graph> graph;
};

Runner::Runner(Model& model, KvCache& cache, RunnerOptions options)
    : model_(model), cache_(cache), options_(std::move(options)) {
  max_pages_ = (model_.max_context() + kPageSize - 1) / kPageSize;
  Backend& be = model_.backend();
  const int vocab = model_.config().vocab_size;
  if (options_.faults.any()) {
    spdlog::warn(
        "!!! FAULT INJECTION ON: {} — this runner reproduces the incident and WILL "
        "corrupt caches; never serve with it !!!",
        options_.faults.describe());
  }
  logits_ = DeviceArray<float>(be, size_t(model_.max_rows()) * vocab);
  sample_workspace_ = DeviceArray<uint8_t>(be, be.sample_workspace_bytes(model_.max_rows(), vocab));
  be.fill(sample_workspace_.data(), 0, sample_workspace_.bytes());  // sample() needs it zeroed once
  const int layers = model_.config().num_hidden_layers;
  auto static_step = [&](int rows) {
    return std::make_unique<StaticStep>(be, rows, max_pages_, logits_.data(),
                                        sample_workspace_.data(), layers, options_);
  };
  eager_ = static_step(model_.max_rows());
  if (options_.mode != RunMode::kGraph) return;

  auto& b = options_.buckets;
  require(!b.empty(), ErrorCode::kInvalidArgument, "graph mode needs at least one bucket");
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  require(b.front() >= 1 && b.back() <= model_.max_rows(), ErrorCode::kInvalidArgument,
          "buckets must lie in [1, max_rows = {}], got {}..{}", model_.max_rows(), b.front(),
          b.back());
  graphs_.resize(b.size());
  const StepOptions step_options{options_.faults.unguarded_store ? StoreGuard::kIncidentScatter
                                                                 : StoreGuard::kEnforced};
  for (size_t i = b.size(); i-- > 0;) {  // largest first
    auto s = static_step(b[i]);
    stage_rows(*s, {}, {}, Padding::kRewrite);  // every row starts as padding
    const StaticStep* step = s.get();
    s->graph = be.capture(
        [this, step, step_options] { forward_and_sample(*step, step->rows, step_options); });
    graphs_[i] = std::move(s);
  }
  spdlog::info("runner: captured {} graph buckets ({}..{} rows)", b.size(), b.front(), b.back());
}

Runner::~Runner() = default;

StepResult Runner::step(std::span<const RowInput> rows, const StepOutputs& outputs) {
  if (options_.mode == RunMode::kGraph) {
    for (auto& g : graphs_) {
      if (g->rows >= int(rows.size())) return run(*g, rows, Launch::kReplay, outputs);
    }
    if (!logged_oversize_) {
      spdlog::info("runner: a batch of {} rows exceeds the largest bucket ({}); running eagerly",
                   rows.size(), graphs_.empty() ? 0 : graphs_.back()->rows);
      logged_oversize_ = true;
    }
  }
  return step_eager(rows, outputs);
}

StepResult Runner::step_eager(std::span<const RowInput> rows, const StepOutputs& outputs) {
  return run(*eager_, rows, Launch::kEager, outputs);
}

void Runner::forward_and_sample(const StaticStep& s, int rows, const StepOptions& options) {
  model_.forward(s.view(rows), cache_, options);
  model_.backend().sample(s.sample_params(rows, model_.config().vocab_size, options_.logprobs));
}

void Runner::plant_garbage_inputs(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t capacity = cache_.capacity_slots();
  auto wild = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  Backend& be = model_.backend();
  for (auto& g : graphs_) {
    StaticStep& s = *g;
    for (int r = 0; r < s.rows; ++r) {
      s.h_tokens[r] = int32_t(wild(-1000, 1000000));
      s.h_positions[r] = int32_t(wild(-5, 1 << 30));
      s.h_seq_lens[r] = int32_t(wild(-5, 1 << 30));
      s.h_slots[r] = wild(0, 3) == 0 ? -wild(2, 1 << 20) : wild(0, capacity + 100);
      s.h_temperature[r] = float(wild(-3, 3));
      s.h_top_p[r] = float(wild(-1, 2));
      s.h_seeds[r] = uint64_t(wild(0, INT64_MAX));
      s.h_sample_index[r] = uint64_t(wild(0, INT64_MAX));
    }
    for (auto& p : s.h_page_table) p = int32_t(wild(-3, cache_.config().num_pages + 3));
    s.h_n_real[0] = s.rows;
    be.copy_to_device(s.device.data(), s.host.data(), s.upload_bytes(s.rows));
  }
  be.synchronize();  // the staging is rewritten by the next step
}

void Runner::stage_rows(StaticStep& s, std::span<const RowInput> rows,
                        std::span<const RowSampling> sampling, Padding padding) {
  const ModelConfig& c = model_.config();
  const int64_t num_pages = cache_.config().num_pages;
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowInput& in = rows[r];
    require(in.token >= 0 && in.token < c.vocab_size, ErrorCode::kInvalidArgument,
            "row {}: token {} is outside the vocabulary [0, {})", r, in.token, c.vocab_size);
    require(in.seq_len >= 1 && in.seq_len <= model_.max_context(), ErrorCode::kOutOfRange,
            "row {}: seq_len {} must be in [1, max_context = {}]", r, in.seq_len,
            model_.max_context());
    require(in.position >= 0 && in.position < model_.max_context(), ErrorCode::kOutOfRange,
            "row {}: position {} exceeds the context of {} tokens", r, in.position,
            model_.max_context());
    require(
        int64_t(in.pages.size()) * kPageSize >= in.seq_len && int(in.pages.size()) <= max_pages_,
        ErrorCode::kInvalidArgument, "row {}: {} pages cannot hold seq_len {} (max {} pages)", r,
        in.pages.size(), in.seq_len, max_pages_);
    // Page ids are checked once, here, for both backends: a real row reads only pages of the
    // pool, never the reserved page. (The kernels also refuse a bad id, through the error flag.)
    const auto bad_page = std::find_if(in.pages.begin(), in.pages.end(), [num_pages](int32_t p) {
      return p <= kReservedPage || p >= num_pages;
    });
    require(bad_page == in.pages.end(), ErrorCode::kInvalidArgument,
            "row {}: page-table entry {} is page {}, outside the pool's pages [1, {})", r,
            bad_page - in.pages.begin(), bad_page == in.pages.end() ? 0 : *bad_page, num_pages);
    const RowSampling draw = sampling.empty() ? RowSampling{} : sampling[r];
    draw.params.validate();
    s.h_tokens[r] = in.token;
    s.h_positions[r] = in.position;
    s.h_slots[r] = in.slot;
    if (options_.faults.wild_slots && in.slot >= 0) {
      s.h_slots[r] = in.slot + cache_.capacity_slots();
    }
    s.h_seq_lens[r] = in.seq_len;
    s.h_temperature[r] = draw.params.temperature;
    s.h_top_p[r] = draw.params.top_p;
    s.h_seeds[r] = draw.params.seed;
    s.h_sample_index[r] = draw.index;
    int32_t* pt = s.h_page_table.data() + r * s.ld_page_table;
    std::fill(std::copy(in.pages.begin(), in.pages.end(), pt), pt + s.ld_page_table, kReservedPage);
  }
  if (padding == Padding::kLeaveStale) return;
  for (int r = int(rows.size()); r < s.rows; ++r) {
    s.h_tokens[r] = 0;
    s.h_positions[r] = 0;
    s.h_slots[r] = kPadSlot;
    s.h_seq_lens[r] = 0;
    s.h_temperature[r] = 0.0f;  // greedy
    s.h_top_p[r] = 1.0f;
    s.h_seeds[r] = 0;
    s.h_sample_index[r] = 0;
    int32_t* pt = s.h_page_table.data() + r * s.ld_page_table;
    std::fill(pt, pt + s.ld_page_table, kReservedPage);  // page-table row of the dummy request
  }
}

StepResult Runner::run(StaticStep& s, std::span<const RowInput> rows, Launch launch,
                       const StepOutputs& outputs) {
  using Clock = std::chrono::steady_clock;
  auto us_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
  };
  const auto start = Clock::now();
  const int B = int(rows.size());
  require(B >= 1 && B <= s.rows, ErrorCode::kInvalidArgument, "a step needs 1..{} rows, got {}",
          s.rows, B);
  require(!outputs.logprobs || options_.logprobs, ErrorCode::kInvalidArgument,
          "a step asked for log-probs, but the runner was built without RunnerOptions::logprobs");
  const bool replay = launch == Launch::kReplay;
  const bool stale = replay && options_.faults.stale_padding;
  require(outputs.sampling.empty() || outputs.sampling.size() == rows.size(),
          ErrorCode::kInvalidArgument, "a step of {} rows got {} sampling entries", rows.size(),
          outputs.sampling.size());
  stage_rows(s, rows, outputs.sampling, stale ? Padding::kLeaveStale : Padding::kRewrite);
  s.h_n_real[0] = B;
  s.h_error_count[0] = 0;

  // One copy up of every row the step will read: G rows for a replay, B rows eagerly.
  Backend& be = model_.backend();
  be.copy_to_device(s.device.data(), s.host.data(), s.upload_bytes(replay ? s.rows : B));
  const StepOptions opts{options_.faults.unguarded_store ? StoreGuard::kIncidentScatter
                                                         : StoreGuard::kEnforced};
  const double stage_us = us_since(start);
  const auto launch_start = Clock::now();
  if (replay) {
    s.graph->replay();
  } else {
    forward_and_sample(s, B, opts);
  }

  // One synchronizing copy down: the error flag, the tokens, and the log-probs when asked. The
  // records, when the options ask for them, are queued before it on the same stream, so they
  // have landed when it returns (one wait per step, not one per record array and layer).
  const double launch_us = us_since(launch_start);
  const auto wait_start = Clock::now();
  queue_records(s, replay ? s.rows : B);
  const size_t down_end =
      (outputs.logprobs ? s.layout.out_logprobs : s.layout.out_tokens) + size_t(B) * sizeof(float);
  be.copy_to_host(s.host.data() + s.layout.error_count, s.device.data() + s.layout.error_count,
                  down_end - s.layout.error_count);
  StepResult result;
  result.wait_us = us_since(wait_start);
  result.stage_us = stage_us;
  result.launch_us = launch_us;
  result.bucket = replay ? s.rows : 0;
  result.store_errors = s.h_error_count[0];
  result.tokens.assign(s.h_out_tokens.begin(), s.h_out_tokens.begin() + B);
  if (outputs.logprobs) {
    result.logprobs.assign(s.h_out_logprobs.begin(), s.h_out_logprobs.begin() + B);
  }
  if (result.store_errors > 0) {
    const int64_t capacity = cache_.capacity_slots();
    for (int r = 0; r < B; ++r) {
      if (verdict_is_error(judge_slot(r, B, s.h_slots[r], capacity))) {
        result.error_rows.push_back(r);
      }
    }
  }
  if (outputs.logits) {
    result.logits.resize(size_t(B) * size_t(model_.config().vocab_size));
    be.copy_to_host(result.logits.data(), s.logits, result.logits.size() * sizeof(float));
  }
  read_records(s, B, result);
  for (int r = 0; r < B; ++r) {
    require(result.tokens[r] >= 0, ErrorCode::kInternal, "row {}: every one of {} logits is NaN", r,
            model_.config().vocab_size);
  }
  return result;
}

// Queues the copies down of the step's write digests and store values, when the options ask for
// them: one asynchronous copy per record array of the step's launched rows (s.rows for a replay,
// B eagerly; the model indexes both records by that row count), into the step's host copies.
void Runner::queue_records(StaticStep& s, int launched_rows) {
  Backend& be = model_.backend();
  const size_t layers = size_t(model_.config().num_hidden_layers);
  const size_t launched = size_t(launched_rows);
  if (s.write_digests.data()) {
    be.copy_to_host_async(s.h_write_digests.data(), s.write_digests.data(),
                          layers * 2 * launched * sizeof(uint64_t));
  }
  if (s.store_values.data()) {
    be.copy_to_host_async(s.h_store_values.data(), s.store_values.data(),
                          layers * launched * kStoreValuesDim * sizeof(float));
  }
}

// The B real rows' records out of the host copies queue_records() filled (landed: the step's
// synchronizing copy down came after them on the same stream).
void Runner::read_records(StaticStep& s, int real_rows, StepResult& result) {
  const size_t layers = size_t(model_.config().num_hidden_layers);
  const size_t B = size_t(real_rows);
  const size_t launched = &s == eager_.get() ? B : size_t(s.rows);
  if (s.write_digests.data()) {
    const uint64_t* all = s.h_write_digests.data();
    result.write_digests.resize(layers * 2 * B);
    for (size_t k = 0; k < layers * 2; ++k) {
      std::copy_n(all + k * launched, B, result.write_digests.begin() + ptrdiff_t(k * B));
    }
  }
  if (s.store_values.data()) {
    const float* all = s.h_store_values.data();
    const size_t row = kStoreValuesDim;
    result.store_values.resize(layers * B * row);
    for (size_t l = 0; l < layers; ++l) {
      std::copy_n(all + l * launched * row, B * row,
                  result.store_values.begin() + ptrdiff_t(l * B * row));
    }
  }
}

}  // namespace dsa
