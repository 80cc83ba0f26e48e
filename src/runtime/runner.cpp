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

struct Runner::StaticStep {
  StaticStep(Backend& be, int rows_, int max_pages, int vocab, int layers,
             const RunnerOptions& options)
      : rows(rows_),
        tokens(be, rows_),
        positions(be, rows_),
        seq_lens(be, rows_),
        page_table(be, size_t(rows_) * max_pages),
        n_real(be, 1),
        error_count(be, 1),
        slots(be, rows_),
        logits(be, size_t(rows_) * vocab),
        h_tokens(rows_, 0),
        h_positions(rows_, 0),
        h_seq_lens(rows_, 0),
        h_page_table(size_t(rows_) * max_pages, kReservedPage),
        h_slots(rows_, kPadSlot),
        ld_page_table(max_pages) {
    if (options.write_digests == WriteDigests::kOn) {
      write_digests = DeviceArray<uint64_t>(be, size_t(layers) * 2 * rows_);
    }
    if (options.write_values == WriteValues::kOn) {
      store_values = DeviceArray<float>(be, size_t(layers) * rows_ * kStoreValuesDim);
    }
  }

  StepView view(int active_rows) const {
    StepView v;
    v.rows = active_rows;
    v.tokens = tokens.data();
    v.positions = positions.data();
    v.slots = slots.data();
    v.seq_lens = seq_lens.data();
    v.page_table = page_table.data();
    v.ld_page_table = ld_page_table;
    v.n_real = n_real.data();
    v.error_count = error_count.data();
    v.logits = logits.data();
    v.write_digests = write_digests.data();
    v.store_values = store_values.data();
    return v;
  }

  int rows;
  DeviceArray<int32_t> tokens, positions, seq_lens, page_table, n_real, error_count;
  DeviceArray<int64_t> slots;
  DeviceArray<float> logits;
  DeviceArray<uint64_t> write_digests;  // [layers, 2, rows] when WriteDigests::kOn, else empty
  DeviceArray<float> store_values;      // [layers, rows, kStoreValuesDim] when WriteValues::kOn
  // Host staging. It persists between steps: the stale-padding fault relies on exactly that.
  std::vector<int32_t> h_tokens, h_positions, h_seq_lens, h_page_table;
  std::vector<int64_t> h_slots;
  int64_t ld_page_table;
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
  const int layers = model_.config().num_hidden_layers;
  eager_ = std::make_unique<StaticStep>(be, model_.max_rows(), max_pages_, vocab, layers, options_);
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
    auto s = std::make_unique<StaticStep>(be, b[i], max_pages_, vocab, layers, options_);
    stage_rows(*s, {}, Padding::kRewrite);  // every row starts as padding
    const StepView view = s->view(s->rows);
    Model* captured_model = &model_;
    KvCache* kv = &cache_;
    s->graph = be.capture([captured_model, kv, view, step_options] {
      captured_model->forward(view, *kv, step_options);
    });
    graphs_[i] = std::move(s);
  }
  spdlog::info("runner: captured {} graph buckets ({}..{} rows)", b.size(), b.front(), b.back());
}

Runner::~Runner() = default;

StepResult Runner::step(std::span<const RowInput> rows) {
  if (options_.mode == RunMode::kGraph) {
    for (auto& g : graphs_) {
      if (g->rows >= int(rows.size())) return run(*g, rows, Launch::kReplay);
    }
    if (!logged_oversize_) {
      spdlog::info("runner: a batch of {} rows exceeds the largest bucket ({}); running eagerly",
                   rows.size(), graphs_.empty() ? 0 : graphs_.back()->rows);
      logged_oversize_ = true;
    }
  }
  return step_eager(rows);
}

StepResult Runner::step_eager(std::span<const RowInput> rows) {
  return run(*eager_, rows, Launch::kEager);
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
    }
    for (auto& p : s.h_page_table) p = int32_t(wild(-3, cache_.config().num_pages + 3));
    be.copy_to_device(s.tokens.data(), s.h_tokens.data(), s.rows * sizeof(int32_t));
    be.copy_to_device(s.positions.data(), s.h_positions.data(), s.rows * sizeof(int32_t));
    be.copy_to_device(s.seq_lens.data(), s.h_seq_lens.data(), s.rows * sizeof(int32_t));
    be.copy_to_device(s.slots.data(), s.h_slots.data(), s.rows * sizeof(int64_t));
    be.copy_to_device(s.page_table.data(), s.h_page_table.data(),
                      s.h_page_table.size() * sizeof(int32_t));
    const int32_t wild_n_real = s.rows;
    be.copy_to_device(s.n_real.data(), &wild_n_real, sizeof(int32_t));
  }
}

void Runner::stage_rows(StaticStep& s, std::span<const RowInput> rows, Padding padding) {
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
    for (size_t i = 0; i < in.pages.size(); ++i) {
      require(in.pages[i] > kReservedPage && in.pages[i] < num_pages, ErrorCode::kInvalidArgument,
              "row {}: page-table entry {} is page {}, outside the pool's pages [1, {})", r, i,
              in.pages[i], num_pages);
    }
    s.h_tokens[r] = in.token;
    s.h_positions[r] = in.position;
    s.h_slots[r] = in.slot;
    if (options_.faults.wild_slots && in.slot >= 0)
      s.h_slots[r] = in.slot + cache_.capacity_slots();
    s.h_seq_lens[r] = in.seq_len;
    int32_t* pt = s.h_page_table.data() + r * s.ld_page_table;
    std::fill(pt, pt + s.ld_page_table, kReservedPage);
    std::copy(in.pages.begin(), in.pages.end(), pt);
  }
  if (padding == Padding::kLeaveStale) return;
  for (int r = int(rows.size()); r < s.rows; ++r) {
    s.h_tokens[r] = 0;
    s.h_positions[r] = 0;
    s.h_slots[r] = kPadSlot;
    s.h_seq_lens[r] = 0;
    int32_t* pt = s.h_page_table.data() + r * s.ld_page_table;
    std::fill(pt, pt + s.ld_page_table, kReservedPage);  // page-table row of the dummy request
  }
}

StepResult Runner::run(StaticStep& s, std::span<const RowInput> rows, Launch launch) {
  const int B = int(rows.size());
  require(B >= 1 && B <= s.rows, ErrorCode::kInvalidArgument, "a step needs 1..{} rows, got {}",
          s.rows, B);
  const bool replay = launch == Launch::kReplay;
  const bool stale = replay && options_.faults.stale_padding;
  stage_rows(s, rows, stale ? Padding::kLeaveStale : Padding::kRewrite);

  // Upload every row the step will read: G rows for a replay, B rows eagerly.
  Backend& be = model_.backend();
  const int n = replay ? s.rows : B;
  be.copy_to_device(s.tokens.data(), s.h_tokens.data(), n * sizeof(int32_t));
  be.copy_to_device(s.positions.data(), s.h_positions.data(), n * sizeof(int32_t));
  be.copy_to_device(s.slots.data(), s.h_slots.data(), n * sizeof(int64_t));
  be.copy_to_device(s.seq_lens.data(), s.h_seq_lens.data(), n * sizeof(int32_t));
  be.copy_to_device(s.page_table.data(), s.h_page_table.data(),
                    size_t(n) * s.ld_page_table * sizeof(int32_t));
  const int32_t n_real = B;
  be.copy_to_device(s.n_real.data(), &n_real, sizeof(n_real));
  be.fill(s.error_count.data(), 0, sizeof(int32_t));

  if (replay) {
    s.graph->replay();
  } else {
    const StepOptions opts{options_.faults.unguarded_store ? StoreGuard::kIncidentScatter
                                                           : StoreGuard::kEnforced};
    model_.forward(s.view(B), cache_, opts);
  }

  StepResult result;
  result.bucket = replay ? s.rows : 0;
  const size_t vocab = size_t(model_.config().vocab_size);
  result.logits.resize(size_t(B) * vocab);
  be.copy_to_host(result.logits.data(), s.logits.data(), result.logits.size() * sizeof(float));
  be.copy_to_host(&result.store_errors, s.error_count.data(), sizeof(int32_t));
  if (result.store_errors > 0) {
    const int64_t capacity = cache_.capacity_slots();
    for (int r = 0; r < B; ++r) {
      if (verdict_is_error(judge_slot(r, B, s.h_slots[r], capacity)))
        result.error_rows.push_back(r);
    }
  }
  read_records(s, B, result);
  return result;
}

// The step's write digests and store values of the B real rows, when the options ask for them.
// The device buffers are laid out for the step's launched rows (s.rows for a replay, B eagerly).
void Runner::read_records(StaticStep& s, int real_rows, StepResult& result) {
  Backend& be = model_.backend();
  const int layers = model_.config().num_hidden_layers;
  const size_t B = size_t(real_rows);
  // The model indexes both records by the step's row count: the bucket, or B when eager.
  const size_t launched = &s == eager_.get() ? B : size_t(s.rows);
  if (s.write_digests.data()) {
    std::vector<uint64_t> all(size_t(layers) * 2 * launched);
    be.copy_to_host(all.data(), s.write_digests.data(), all.size() * sizeof(uint64_t));
    result.write_digests.resize(size_t(layers) * 2 * B);
    for (size_t k = 0; k < size_t(layers) * 2; ++k) {
      std::copy_n(all.begin() + k * launched, B, result.write_digests.begin() + k * B);
    }
  }
  if (s.store_values.data()) {
    result.store_values.resize(size_t(layers) * B * kStoreValuesDim);
    for (int l = 0; l < layers; ++l) {
      be.copy_to_host(result.store_values.data() + l * B * kStoreValuesDim,
                      s.store_values.data() + l * launched * kStoreValuesDim,
                      B * kStoreValuesDim * sizeof(float));
    }
  }
}

}  // namespace dsa
