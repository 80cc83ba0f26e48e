// The profiling backend: every op forwards to the wrapped backend; while recording, each is
// bracketed by two stopwatch points (so host gaps between launches are not charged to the op).
#include "op_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "dsa/error.h"
#include "dsa/slot.h"

namespace dsa::tools {
namespace {

double f32_bytes(double elements) { return 4.0 * elements; }
double index_k_token_bytes(KvDtype d) { return double(index_k_page_bytes(d)) / kPageSize; }

}  // namespace

double Ceilings::floor_us(const OpCost& c) const {
  return std::max(c.bytes / (gb_per_s * 1e3), c.flops / (tflop_per_s * 1e6));
}

std::string Ceilings::describe() const {
  return fmt::format("copy {:.4g} GB/s ({}), matrix {:.4g} TFLOP/s ({})", gb_per_s, copy_source,
                     tflop_per_s, rate_source);
}

CeilingProbe ceiling_probe(BackendKind kind) {
  CeilingProbe probe;
  if (kind == BackendKind::kCuda) {
    probe.copy_bytes = size_t(1) << 30;
    probe.gemm_dim = 8192;
  } else {
    probe.copy_bytes = size_t(64) << 20;
    probe.gemm_dim = 512;
  }
  return probe;
}

namespace {

// A device allocation freed on every path out of measure_ceilings.
class Scratch {
 public:
  Scratch(Backend& be, size_t bytes) : be_(be), p_(be.allocate(bytes)) {}
  ~Scratch() { be_.deallocate(p_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  Backend& be_;
  void* p_;
};

// The median time of `iters` runs of `run` after one more, each bracketed by stopwatch points.
template <typename Run>
double median_us(Backend& be, int iters, Run&& run) {
  std::unique_ptr<Stopwatch> watch = be.stopwatch();
  run();  // warm-up: first-touch pages, kernel selection, caches
  std::vector<int> marks{watch->mark()};
  for (int i = 0; i < iters; ++i) {
    run();
    marks.push_back(watch->mark());
  }
  be.synchronize();
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) us.push_back(watch->elapsed_us(marks[i], marks[i + 1]));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

double measure_copy_gbps(Backend& be, size_t bytes, int iters) {
  Scratch src(be, bytes), dst(be, bytes);
  be.fill(src.as<void>(), 0x5a, bytes);
  be.fill(dst.as<void>(), 0x00, bytes);
  const double us =
      median_us(be, iters, [&] { be.copy_on_device(dst.as<void>(), src.as<void>(), bytes); });
  // The copy moved what it was asked to: its first and last bytes hold the source's pattern.
  std::vector<uint8_t> head(std::min<size_t>(bytes, 4096)), tail(head.size());
  be.copy_to_host(head.data(), dst.as<uint8_t>(), head.size());
  be.copy_to_host(tail.data(), dst.as<uint8_t>() + bytes - tail.size(), tail.size());
  const auto is_pattern = [](const std::vector<uint8_t>& v) {
    return std::all_of(v.begin(), v.end(), [](uint8_t b) { return b == 0x5a; });
  };
  require(is_pattern(head) && is_pattern(tail), ErrorCode::kInternal,
          "ceilings: the {} MiB device copy did not copy its source", bytes >> 20);
  require(us > 0, ErrorCode::kInternal, "ceilings: the stopwatch timed the copy at {} us", us);
  return 2.0 * double(bytes) / (us * 1e3);
}

// y = x w^T, m = n = k = dim, bf16 operands (x also as f32 for backends that read that), every
// value bf16 0x3c3c (0.01147...), so every output is dim * 0.01147^2 up to the summation's
// rounding.
double measure_gemm_tflops(Backend& be, int dim, int iters) {
  const size_t elems = size_t(dim) * size_t(dim);
  Scratch w(be, 2 * elems), x16(be, 2 * elems), x32(be, 4 * elems), y(be, 4 * elems);
  be.fill(w.as<void>(), 0x3c, 2 * elems);
  be.fill(x16.as<void>(), 0x3c, 2 * elems);
  // f32 0x3c3c0000 is bf16 0x3c3c widened: the same operand either way.
  std::vector<uint32_t> row(size_t(dim), 0x3c3c0000u);
  for (int r = 0; r < dim; ++r) {
    be.copy_to_device(x32.as<uint32_t>() + size_t(r) * dim, row.data(), 4 * size_t(dim));
  }
  GemmParams p;
  p.x = x32.as<float>();
  p.x_bf16 = x16.as<Bf16>();
  p.w = w.as<Bf16>();
  p.y = y.as<float>();
  p.m = p.n = p.k = dim;
  p.ld_x = p.ld_x_bf16 = p.ld_w = p.ld_y = dim;
  p.w_constant = true;
  const GemmMode mode = be.gemm_mode();
  be.set_gemm_mode(GemmMode::kFast);
  double us = 0;
  try {
    us = median_us(be, iters, [&] { be.gemm(p); });
  } catch (...) {
    be.set_gemm_mode(mode);
    throw;
  }
  be.set_gemm_mode(mode);
  float corners[2];
  be.copy_to_host(&corners[0], y.as<float>(), 4);
  be.copy_to_host(&corners[1], y.as<float>() + elems - 1, 4);
  const double v = double(bf16_to_float(Bf16{0x3c3c}));
  const double expect = dim * v * v;
  for (float c : corners) {
    require(std::abs(c - expect) <= 1e-2 * expect, ErrorCode::kInternal,
            "ceilings: the {}^3 GEMM gave {} where {} was due", dim, c, expect);
  }
  require(us > 0, ErrorCode::kInternal, "ceilings: the stopwatch timed the GEMM at {} us", us);
  return 2.0 * double(dim) * dim * dim / (us * 1e6);
}

}  // namespace

Ceilings measure_ceilings(Backend& backend, Ceilings given, const CeilingProbe& probe) {
  require(probe.iters > 0, ErrorCode::kInvalidArgument, "ceilings: iters {} must be > 0",
          probe.iters);
  Ceilings c = given;
  if (c.gb_per_s <= 0) {
    require(probe.copy_bytes >= 4096, ErrorCode::kInvalidArgument,
            "ceilings: a copy of {} bytes is too small to time", probe.copy_bytes);
    c.gb_per_s = measure_copy_gbps(backend, probe.copy_bytes, probe.iters);
    c.copy_source = fmt::format("measured: a {} MiB device copy, read and write counted",
                                probe.copy_bytes >> 20);
  }
  if (c.tflop_per_s <= 0) {
    require(probe.gemm_dim >= 16, ErrorCode::kInvalidArgument,
            "ceilings: a GEMM of {}^3 is too small to time", probe.gemm_dim);
    c.tflop_per_s = measure_gemm_tflops(backend, probe.gemm_dim, probe.iters);
    c.rate_source =
        fmt::format("measured: a {}^3 GEMM of bf16 operands into f32, --gemm fast", probe.gemm_dim);
  }
  return c;
}

std::vector<OpTiming> median_timings(const std::vector<std::vector<OpTiming>>& runs) {
  require(!runs.empty(), ErrorCode::kInternal, "profile: no recorded runs");
  std::vector<OpTiming> out = runs.front();
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<double> us;
    for (const auto& run : runs) {
      require(run.size() == out.size() && run[i].cost.op == out[i].cost.op, ErrorCode::kInternal,
              "profile: the step's op sequence changed between runs");
      us.push_back(run[i].us);
    }
    std::sort(us.begin(), us.end());
    out[i].us = us[us.size() / 2];
  }
  return out;
}

std::string profile_table(const std::vector<OpTiming>& ops, const Ceilings& ceilings,
                          double empty_us) {
  double total = 0, bytes = 0, flops = 0, floor = 0;
  for (const OpTiming& t : ops) {
    total += t.us;
    bytes += t.cost.bytes;
    flops += t.cost.flops;
    floor += ceilings.floor_us(t.cost);
  }
  const bool vs_empty = empty_us > 0;
  std::string out = fmt::format("{:>4}  {:<16} {:<34} {:>9} {:>6} {:>9} {:>9} {:>9} {:>7}{}\n", "#",
                                "op", "shape", "us", "%", "MB", "GFLOP", "floor us", "floor/us",
                                vs_empty ? fmt::format(" {:>7}", "/empty") : "");
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpTiming& t = ops[i];
    const double f = ceilings.floor_us(t.cost);
    out += fmt::format(
        "{:>4}  {:<16} {:<34} {:>9.1f} {:>6.1f} {:>9.2f} {:>9.3f} {:>9.2f} {:>7.2f}{}\n", i + 1,
        t.cost.op, t.cost.shape, t.us, total > 0 ? 100 * t.us / total : 0.0, t.cost.bytes / 1e6,
        t.cost.flops / 1e9, f, t.us > 0 ? f / t.us : 0.0,
        vs_empty ? fmt::format(" {:>7.2f}", t.us / empty_us) : "");
  }
  out += fmt::format("{:>4}  {:<16} {:<34} {:>9.1f} {:>6.1f} {:>9.2f} {:>9.3f} {:>9.2f} {:>7.2f}\n",
                     "", "sum", "", total, 100.0, bytes / 1e6, flops / 1e9, floor,
                     total > 0 ? floor / total : 0.0);
  if (vs_empty) {
    out += fmt::format("      empty launch (a 4-byte fill, timed like the ops): {:.1f} us\n",
                       empty_us);
  }
  out += fmt::format("      floors at {}\n", ceilings.describe());
  return out;
}

nlohmann::json profile_json(const std::vector<OpTiming>& ops, const Ceilings& ceilings,
                            double empty_us) {
  nlohmann::json list = nlohmann::json::array();
  double total = 0, floor = 0;
  for (const OpTiming& t : ops) {
    const double f = ceilings.floor_us(t.cost);
    total += t.us;
    floor += f;
    list.push_back({{"op", t.cost.op},
                    {"shape", t.cost.shape},
                    {"us", t.us},
                    {"bytes", t.cost.bytes},
                    {"flops", t.cost.flops},
                    {"floor_us", f}});
  }
  return {{"ops", list},
          {"sum_us", total},
          {"floor_us", floor},
          {"gb_per_s", ceilings.gb_per_s},
          {"tflop_per_s", ceilings.tflop_per_s},
          {"gb_per_s_source", ceilings.copy_source},
          {"tflop_per_s_source", ceilings.rate_source},
          {"empty_launch_us", empty_us}};
}

double ProfilingBackend::empty_launch_us(int n) {
  require(n > 0, ErrorCode::kInvalidArgument, "profile: empty_launch_us needs n > 0");
  void* word = inner_.allocate(sizeof(uint32_t));
  start();
  for (int i = 0; i < n; ++i) timed({"empty", "fill 4 B", 0, 0}, [&] { inner_.fill(word, 0, 4); });
  std::vector<OpTiming> runs = finish();
  inner_.deallocate(word);
  std::vector<double> us;
  for (const OpTiming& t : runs) us.push_back(t.us);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

void ProfilingBackend::start() {
  inner_.synchronize();
  watch_->reset();
  ops_.clear();
  recording_ = true;
}

std::vector<OpTiming> ProfilingBackend::finish() {
  recording_ = false;
  inner_.synchronize();
  std::vector<OpTiming> out;
  for (const Pending& p : ops_) out.push_back({p.cost, watch_->elapsed_us(p.begin, p.end)});
  ops_.clear();
  watch_->reset();
  return out;
}

std::unique_ptr<Graph> ProfilingBackend::capture(const std::function<void()>& step) {
  const bool was = recording_;
  recording_ = false;  // a graph holds the ops only: no stopwatch points inside it
  auto g = inner_.capture(step);
  recording_ = was;
  return g;
}

template <typename Launch>
void ProfilingBackend::timed(OpCost cost, Launch&& launch) {
  if (!recording_) {
    launch();
    return;
  }
  const int begin = watch_->mark();
  launch();
  ops_.push_back({std::move(cost), begin, watch_->mark()});
}

void ProfilingBackend::rmsnorm(const RmsNormParams& p) {
  const double n = double(p.rows) * p.dim;
  timed({"rmsnorm", fmt::format("rows={} dim={}", p.rows, p.dim), f32_bytes(2 * n) + 2.0 * p.dim,
         4 * n},
        [&] { inner_.rmsnorm(p); });
}

void ProfilingBackend::layernorm(const LayerNormParams& p) {
  const double n = double(p.rows) * p.dim;
  timed({"layernorm", fmt::format("rows={} dim={}", p.rows, p.dim), f32_bytes(2 * n) + 4.0 * p.dim,
         8 * n},
        [&] { inner_.layernorm(p); });
}

// With p.out set, the fused rope + copy_rows: "rope_copy", one more write of the rotated dims.
void ProfilingBackend::rope(const RopeParams& p) {
  const double n = double(p.rows) * p.heads * p.rope_dim;
  const bool copy = p.out != nullptr;
  timed({copy ? "rope_copy" : "rope",
         fmt::format("rows={} heads={} dims={}", p.rows, p.heads, p.rope_dim),
         f32_bytes((copy ? 3 : 2) * n + p.rows) + 4.0 * p.rows * p.rope_dim, 3 * n},
        [&] { inner_.rope(p); });
}

void ProfilingBackend::hadamard(const HadamardParams& p) {
  const double n = double(p.rows) * p.dim;
  timed({"hadamard", fmt::format("rows={} dim={}", p.rows, p.dim), f32_bytes(2 * n),
         n * std::log2(double(p.dim))},
        [&] { inner_.hadamard(p); });
}

void ProfilingBackend::gemm(const GemmParams& p) {
  const double b = p.batch, m = p.m, n = p.n, k = p.k;
  const double y_passes = p.output == GemmOutput::kAccumulate ? 2 : 1;
  const std::string shape = p.batch > 1 ? fmt::format("{}x m={} n={} k={}", p.batch, p.m, p.n, p.k)
                                        : fmt::format("m={} n={} k={}", p.m, p.n, p.k);
  const double w_bytes = p.w_fp8 ? n * k + f32_bytes(std::ceil(n / 128) * std::ceil(k / 128))
                                 : 2 * n * k;  // fp8: a byte a weight, plus the block scales
  timed({"gemm", p.w_fp8 ? shape + (p.x_fp8 ? " w8a8" : " fp8w") : shape,
         b * (w_bytes + f32_bytes(m * k) + y_passes * f32_bytes(m * n)), 2 * b * m * n * k},
        [&] { inner_.gemm(p); });
}

void ProfilingBackend::swiglu(const SwigluParams& p) {
  const double n = double(p.rows) * p.inter;
  timed({"swiglu", fmt::format("rows={} inter={}", p.rows, p.inter), f32_bytes(3 * n), 5 * n},
        [&] { inner_.swiglu(p); });
}

void ProfilingBackend::softmax(const SoftmaxParams& p) {
  const double n = double(p.rows) * p.cols;
  timed({"softmax", fmt::format("rows={} cols={}", p.rows, p.cols), f32_bytes(2 * n), 4 * n},
        [&] { inner_.softmax(p); });
}

void ProfilingBackend::embed(const EmbedParams& p) {
  const double n = double(p.rows) * p.dim;
  timed({"embed", fmt::format("rows={} dim={}", p.rows, p.dim), 6 * n, 0},
        [&] { inner_.embed(p); });
}

void ProfilingBackend::add(const AddParams& p) {
  const double n = double(p.rows) * p.dim;
  timed({"add", fmt::format("rows={} dim={}", p.rows, p.dim), f32_bytes(3 * n), n},
        [&] { inner_.add(p); });
}

void ProfilingBackend::copy_rows(const CopyRowsParams& p) {
  const double n = double(p.rows) * p.dim;
  timed({"copy_rows", fmt::format("rows={} dim={}", p.rows, p.dim), f32_bytes(2 * n), 0},
        [&] { inner_.copy_rows(p); });
}

void ProfilingBackend::moe_route(const MoeRouteParams& p) {
  const double n = double(p.rows) * p.n_experts;
  timed({"moe_route", fmt::format("rows={} experts={}", p.rows, p.n_experts), f32_bytes(2 * n),
         4 * n},
        [&] { inner_.moe_route(p); });
}

void ProfilingBackend::scale_rows(const ScaleRowsParams& p) {
  const double n = double(p.rows) * p.dim;
  timed({"scale_rows", fmt::format("rows={} dim={}", p.rows, p.dim), f32_bytes(2 * n), n},
        [&] { inner_.scale_rows(p); });
}

void ProfilingBackend::store_index_k(const StoreIndexKParams& p) {
  const double rows = p.batch.rows;
  timed({"store_index_k", fmt::format("rows={} {}", p.batch.rows, kv_dtype_name(p.pool.dtype)),
         rows * (f32_bytes(kIndexHeadDim) + 8 + index_k_token_bytes(p.pool.dtype)), 0},
        [&] { inner_.store_index_k(p); });
}

void ProfilingBackend::store_latent_kv(const StoreLatentKvParams& p) {
  const double rows = p.batch.rows;
  timed({"store_latent_kv", fmt::format("rows={} {}", p.batch.rows, kv_dtype_name(p.pool.dtype)),
         rows * (f32_bytes(kLatentDim) + 8 + double(latent_token_bytes(p.pool.dtype))), 0},
        [&] { inner_.store_latent_kv(p); });
}

// The fused layernorm + rope + hadamard + index-K store: the keys read and written once (f32), the
// row's angles, slot and stored token, the norm's weights.
void ProfilingBackend::indexer_key(const IndexerKeyParams& p) {
  const double rows = p.batch.rows;
  timed({"indexer_key", fmt::format("rows={} {}", p.batch.rows, kv_dtype_name(p.pool.dtype)),
         rows * (f32_bytes(2 * kIndexHeadDim + kRopeDim + 1) + 8 +
                 index_k_token_bytes(p.pool.dtype)) +
             4.0 * kIndexHeadDim,
         rows * kIndexHeadDim * (8 + 3 + std::log2(double(kIndexHeadDim)))},
        [&] { inner_.indexer_key(p); });
}

// The fused rope + hadamard of the indexer's query heads: each head read and written once.
void ProfilingBackend::indexer_query(const IndexerQueryParams& p) {
  const double n = double(p.rows) * p.heads * kIndexHeadDim;
  timed({"indexer_query", fmt::format("rows={} heads={}", p.rows, p.heads),
         f32_bytes(2 * n + p.rows) + 4.0 * p.rows * kRopeDim,
         n * (3 + std::log2(double(kIndexHeadDim)))},
        [&] { inner_.indexer_query(p); });
}

// The fused rmsnorm + rope + latent store: c and k_rope read and written once (f32), the row's
// angles, slot and stored token, the norm's weights.
void ProfilingBackend::latent_kv(const LatentKvParams& p) {
  const double rows = p.batch.rows;
  timed({"latent_kv", fmt::format("rows={} {}", p.batch.rows, kv_dtype_name(p.pool.dtype)),
         rows * (f32_bytes(2 * kLatentDim + kRopeDim + 1) + 8 +
                 double(latent_token_bytes(p.pool.dtype))) +
             2.0 * kKvLoraRank,
         rows * (4.0 * kKvLoraRank + 3.0 * kRopeDim)},
        [&] { inner_.latent_kv(p); });
}

// Every row is charged ld_logits tokens: exact when each row attends to the whole context, as in
// bench-decode, an upper bound otherwise.
void ProfilingBackend::indexer_logits(const IndexerLogitsParams& p) {
  const double tokens = double(p.rows) * double(p.ld_logits);
  timed({"indexer_logits",
         fmt::format("rows={} heads={} tokens={} {}", p.rows, p.heads, p.ld_logits,
                     kv_dtype_name(p.pool.dtype)),
         tokens * (index_k_token_bytes(p.pool.dtype) + 4) +
             f32_bytes(double(p.rows) * p.heads * (kIndexHeadDim + 1)),
         2.0 * tokens * p.heads * kIndexHeadDim},
        [&] { inner_.indexer_logits(p); });
}

void ProfilingBackend::topk(const TopkParams& p) {
  const double rows = p.rows;
  timed({"topk", fmt::format("rows={} tokens={} k={}", p.rows, p.ld_logits, p.k),
         rows * (f32_bytes(double(p.ld_logits)) + 12.0 * p.k), 0},
        [&] { inner_.topk(p); });
}

void ProfilingBackend::sparse_mla(const SparseMlaParams& p) {
  const double rows = p.rows, sel = double(p.rows) * p.topk;
  timed({"sparse_mla",
         fmt::format("rows={} heads={} topk={} {}", p.rows, p.heads, p.topk,
                     kv_dtype_name(p.pool.dtype)),
         sel * (double(latent_token_bytes(p.pool.dtype)) + 8) +
             f32_bytes(rows * p.heads * (kLatentDim + kKvLoraRank)),
         2.0 * sel * p.heads * (kLatentDim + kKvLoraRank)},
        [&] { inner_.sparse_mla(p); });
}

void ProfilingBackend::audit_slots(const AuditSlotsParams& p) {
  timed({"audit_slots", fmt::format("n={}", p.n), 0, 0}, [&] { inner_.audit_slots(p); });
}

void ProfilingBackend::digest_rows(const DigestRowsParams& p) {
  timed({"digest_rows", fmt::format("rows={}", p.rows), 0, 0}, [&] { inner_.digest_rows(p); });
}

void ProfilingBackend::audit_sample(const AuditSampleParams& p) {
  timed({"audit_sample", fmt::format("sample={} pools={}", p.sample, p.n_pools), 0, 0},
        [&] { inner_.audit_sample(p); });
}

void ProfilingBackend::sample(const SampleParams& p) {
  timed({"sample", fmt::format("rows={} vocab={}", p.rows, p.vocab),
         f32_bytes(double(p.rows) * p.vocab), 0},
        [&] { inner_.sample(p); });
}

}  // namespace dsa::tools
