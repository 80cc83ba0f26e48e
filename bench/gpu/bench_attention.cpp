// Attention benches: the DSA decode hot path at serving shapes.
//   indexer_logits/{fp8,bf16}/B=64/L=32768 and B=1/L=131072   64 heads x 128; floor: key + scale
//       + page-table bytes; fp8 also .../given (DSA_CUDA_INDEXER_Q=given: the query's encoding
//       handed to the kernel, as indexer_query writes it, instead of encoded by every block), and
//       fp8 .../ring=6|9|17 after either (DSA_CUDA_INDEXER_RING forced; the default row is
//       auto: 9 stages where 6 would take more than one wave); B=1|8/L=4096/ld=131072 (short rows
//       in a long capacity, interleaved tiles, the default) and .../contiguous
//       (DSA_CUDA_INDEXER_TILES=contiguous)
//   topk/k={2048,512}/B={1,64,256}/L={32768,131072} floor: logits read + positions and slots
//       written (k = 512: V4's indexer)
// With --legacy, also topk_legacy/... (the kernel DSA_CUDA_TOPK=legacy selects) and
// indexer_logits_legacy/... (DSA_CUDA_INDEXER_VARIANT=legacy), timed in the same process; with
// --indexer-variants V,..., indexer_logits_V/... per forced variant, and --indexer-rows the batch
// sizes of the indexer rows (1 at L = 131072, others at L = 32768; default 64 and 1). Indexer
// rows are timed as eager launches (us) and as launches captured into one CUDA graph (graph_us:
// no per-launch host cost, as a decode step replays them).
//   sparse_mla/{bf16,fp8}/B={1,64,256}/H=128/topk=2048 floor: 2 * H * topk * (576 + 512) flops
//       per row, or the measured launch latency when that is more (the default kernel, and
//       .../default/splits=4|8|2|1 with the split bound set); also
//       .../mma (the mma.sync kernel, DSA_CUDA_SPARSE_MLA_VARIANT=mma) with .../heads=H (its heads
//       per CTA forced, DSA_CUDA_SPARSE_MLA_HEADS) and .../splits=16
//       (DSA_CUDA_SPARSE_MLA_MAX_SPLITS), .../wgmma (the wgmma kernel), .../wgmma/splits=16,
//       .../wgmma/pv=mma (its check path, DSA_CUDA_SPARSE_MLA_WGMMA_PV=mma), .../wgmma/serial and
//       .../wgmma/overlap (its token loop's schedules, DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE),
//       .../wgmma/heads=32|16 (its heads per CTA forced),
//       bf16 only .../wgmma64 and .../wgmma64/splits=16 (the 64-token, token-split kernel,
//       DSA_CUDA_SPARSE_MLA_VARIANT=wgmma64; an fp8 cache would run the wgmma kernel),
//       .../ws, .../ws/splits=16|8|4|2|1, .../ws/heads=64|32|16 and .../ws/q=l2|cluster (its
//       warp-specialized form, =ws, bf16 and fp8; heads per CTA forced; q's way forced) and at B
//       = 1 .../graph,
//       .../mma/graph, .../wgmma/graph, .../wgmma/overlap/graph and (bf16) .../wgmma64/graph and
//       .../ws/graph (bf16 and fp8; graph-launched); .../hn and .../hn/splits=16|8|2|1 (the
//       heads-as-N kernel, =hn) and at B = 1 .../hn/graph, .../hn/splits=8|16/graph and
//       .../ws/splits=8/graph; with --mla-trace, sparse_mla_trace/bf16/B=.../ws, .../hn and
//       .../hn/splits=8: one traced launch of the kernel, its CTAs' mean time per phase, and
//       cluster_exchange/{pull,push,global}/ctas=16|1024: the combine's data movement alone
// Every row gets its own pages in a random order (a serving pool's layout). Inputs rotate over
// more than 3x L2 where one set would fit in it (top-k's small batches, the attention's queries).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "dsa/pool_fill.h"
#include "dsa/slot.h"
#include "dsa/token_codec.h"

namespace dsa::bench {
namespace {

// Device memory from the backend, released on scope exit.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer(Backend& be, size_t count)
      : be_(be), count_(count), p_(static_cast<T*>(be.allocate(count * sizeof(T)))) {}
  ~DeviceBuffer() { be_.deallocate(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* data() const { return p_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  Backend& be_;
  size_t count_;
  T* p_;
};

// Copies `block` over dst repeatedly until `bytes` are filled.
void fill_repeating(Backend& be, void* dst, size_t bytes, const std::vector<uint8_t>& block) {
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t done = 0; done < bytes; done += block.size()) {
    be.copy_to_device(d + done, block.data(), std::min(block.size(), bytes - done));
  }
}

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<float> normals(std::mt19937_64& gen, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Page tables [rows, pages_per_row] over pages 1 .. rows * pages_per_row, shuffled.
std::vector<int32_t> shuffled_pages(std::mt19937_64& gen, int64_t count) {
  std::vector<int32_t> pages(static_cast<size_t>(count));
  std::iota(pages.begin(), pages.end(), 1);
  std::shuffle(pages.begin(), pages.end(), gen);
  return pages;
}

// Runs fn with the environment variable `name` set to `value` (when name is not null), then puts
// back what the process had, however fn ends (a knob set for the whole run stays set for the next
// rows).
void with_env(const char* name, const char* value, const std::function<void()>& fn) {
  if (name == nullptr) return fn();
  struct Restore {
    const char* name;
    bool had;
    std::string before;
    ~Restore() { had ? setenv(name, before.c_str(), 1) : unsetenv(name); }
  };
  const char* had = std::getenv(name);
  const Restore restore{name, had != nullptr, had != nullptr ? had : ""};
  setenv(name, value, 1);
  fn();
}

// variant: a forced kernel variant (DSA_CUDA_INDEXER_VARIANT), as row
// indexer_logits_<variant>/...; null: the default, as row indexer_logits/...
// ld: the rows' capacity (IndexerLogitsParams::ld_logits, the model's max context; 0: kLen), rows
// of kLen tokens in it, as a server's short sessions sit in a long context's cache; the row's
// name gains /ld=<ld> and, for the default kernel, /contiguous (DSA_CUDA_INDEXER_TILES) after
// the interleaved default.
void bench_indexer(BenchContext& ctx, KvDtype dtype, int kRows, int kLen, std::mt19937_64& gen,
                   const char* variant, int64_t ld = 0) {
  constexpr int kHeads = 64;
  Backend& be = ctx.backend;
  if (ld < kLen) ld = kLen;
  const int64_t page_bytes = index_k_page_bytes(dtype);
  // Sets of page tables over disjoint pages, rotated so that a set that fits in L2 is not read
  // from it (B = 1: 17 MB of fp8 keys). A row's table covers its capacity; the entries past its
  // kLen tokens name page 0 and are never dereferenced.
  const int64_t pages_per_row = kLen / kPageSize, set_pages = kRows * pages_per_row;
  const int64_t table_ld = (ld + kPageSize - 1) / kPageSize, set_entries = kRows * table_ld;
  const int sets = BenchContext::rotation_sets(double(set_pages) * page_bytes);
  const int64_t pages = sets * set_pages + 1;
  DeviceBuffer<uint8_t> pool(be, size_t(pages * page_bytes));
  be.fill(pool.data(), 0, pool.bytes());  // page 0 stays zero
  fill_pool_random(be, PoolView{pool.data(), dtype, ScaleRounding::kExact, pages},
                   PoolKind::kIndexK, gen());
  DeviceBuffer<int32_t> table(be, size_t(sets * set_entries)), seq_lens(be, kRows);
  const std::vector<int32_t> shuffled = shuffled_pages(gen, sets * set_pages);
  std::vector<int32_t> tables(size_t(sets * set_entries), 0);
  for (int64_t r = 0; r < sets * kRows; ++r) {
    std::copy_n(shuffled.begin() + r * pages_per_row, pages_per_row, tables.begin() + r * table_ld);
  }
  be.copy_to_device(table.data(), tables.data(), table.bytes());
  const std::vector<int32_t> lens(kRows, kLen);
  be.copy_to_device(seq_lens.data(), lens.data(), seq_lens.bytes());
  DeviceBuffer<float> q(be, size_t(kRows) * kHeads * kIndexHeadDim), w(be, size_t(kRows) * kHeads);
  const std::vector<float> q_host = normals(gen, size_t(kRows) * kHeads * kIndexHeadDim);
  be.copy_to_device(q.data(), q_host.data(), q.bytes());
  be.copy_to_device(w.data(), normals(gen, size_t(kRows) * kHeads, 0.1f).data(), w.bytes());
  DeviceBuffer<float> logits(be, size_t(kRows) * ld);

  IndexerLogitsParams p;
  p.q = q.data(), p.w = w.data(), p.page_table = table.data(), p.seq_lens = seq_lens.data();
  p.logits = logits.data();
  p.pool = PoolView{pool.data(), dtype, ScaleRounding::kExact, pages};
  p.rows = kRows, p.heads = kHeads;
  p.ld_q = kHeads * kIndexHeadDim, p.ld_w = kHeads, p.ld_page_table = table_ld;
  p.ld_logits = ld;
  // fp8: the query's encoding too, as indexer_query writes it (the group encoder per head), which
  // the default kernel reads under DSA_CUDA_INDEXER_Q=given (the .../given row) and ignores else.
  DeviceBuffer<uint8_t> q8(be, dtype == KvDtype::kFp8 ? size_t(kRows) * kHeads * kIndexHeadDim : 1);
  DeviceBuffer<float> q_scale(be, dtype == KvDtype::kFp8 ? size_t(kRows) * kHeads : 1);
  if (dtype == KvDtype::kFp8) {
    std::vector<uint8_t> q8_host(q8.bytes());
    std::vector<float> scale_host(size_t(kRows) * kHeads);
    for (size_t u = 0; u < scale_host.size(); ++u) {
      scale_host[u] = encode_fp8_group(
          q_host.data() + u * kIndexHeadDim, kIndexHeadDim,
          reinterpret_cast<Fp8E4M3*>(q8_host.data()) + u * kIndexHeadDim, ScaleRounding::kExact);
    }
    be.copy_to_device(q8.data(), q8_host.data(), q8.bytes());
    be.copy_to_device(q_scale.data(), scale_host.data(), q_scale.bytes());
    p.q_fp8 = q8.data(), p.q_fp8_scale = q_scale.data(), p.ld_q_fp8 = kHeads * kIndexHeadDim;
  }
  // The default kernel's other rows: fp8 with the given query and each forced ring (full rows),
  // and contiguous tiles (rows shorter than their capacity).
  const bool short_rows = ld > kLen;
  const bool fp8_rows = dtype == KvDtype::kFp8 && variant == nullptr && !short_rows;
  struct Knobs {
    const char* query;
    const char* ring;
    const char* tiles;
  };
  std::vector<Knobs> knobs = {{"", "", ""}};
  if (fp8_rows) {
    for (const char* query : {"", "given"}) {
      for (const char* ring : {"", "6", "9", "17"}) {
        if (*query || *ring) knobs.push_back({query, ring, ""});
      }
    }
  }
  if (short_rows && variant == nullptr) knobs.push_back({"", "", "contiguous"});
  for (const Knobs& k : knobs) {
    int64_t call = 0;
    double us = 0, graph_us = 0;
    with_env(*k.query ? "DSA_CUDA_INDEXER_Q" : nullptr, k.query, [&] {
      with_env(*k.ring ? "DSA_CUDA_INDEXER_RING" : nullptr, k.ring, [&] {
        with_env(*k.tiles ? "DSA_CUDA_INDEXER_TILES" : nullptr, k.tiles, [&] {
          with_env(variant ? "DSA_CUDA_INDEXER_VARIANT" : nullptr, variant, [&] {
            auto one = [&] {
              p.page_table = table.data() + (call++ % sets) * set_entries;
              be.indexer_logits(p);
            };
            us = ctx.time_us(one, kRows == 1 ? 100 : 20);
            graph_us = ctx.time_graph_us(one, kRows == 1 ? 100 : 20);
          });
        });
      });
    });

    BenchResult r;
    r.name = (variant ? "indexer_logits_" + std::string(variant) + "/" : "indexer_logits/") +
             std::string(kv_dtype_name(dtype)) + "/B=" + std::to_string(kRows) +
             "/L=" + std::to_string(kLen) + (short_rows ? "/ld=" + std::to_string(ld) : "") +
             (*k.query ? "/" + std::string(k.query) : "") +
             (*k.ring ? "/ring=" + std::string(k.ring) : "") +
             (*k.tiles ? "/" + std::string(k.tiles) : "");
    r.us = us;
    r.bytes = double(kRows) * kLen * double(page_bytes / kPageSize) + double(set_pages) * 4;
    r.floor_us = std::max(ctx.hbm_floor_us(r.bytes), ctx.empty_launch_us);
    r.floor_kind = ctx.hbm_floor_us(r.bytes) > ctx.empty_launch_us ? "hbm" : "launch";
    const double gbs = r.bytes / (us * 1e3);
    r.extra = {{"gbs_read", gbs},
               {"pct_of_copy", 100.0 * gbs / ctx.copy_gbs},
               {"heads", kHeads},
               {"rotation_sets", sets},
               {"graph_us", graph_us},
               {"graph_pct_of_copy", 100.0 * r.bytes / (graph_us * 1e3) / ctx.copy_gbs}};
    std::printf("    %.0f GB/s read = %.0f%% of copy %.0f GB/s; in a graph %.2f us = %.0f%%\n", gbs,
                100.0 * gbs / ctx.copy_gbs, ctx.copy_gbs, graph_us,
                100.0 * r.bytes / (graph_us * 1e3) / ctx.copy_gbs);
    ctx.add(std::move(r));
  }
}

// legacy: the kernel that DSA_CUDA_TOPK=legacy selects, as row topk_legacy/...
void bench_topk(BenchContext& ctx, int rows, int len, int kK, std::mt19937_64& gen, bool legacy) {
  Backend& be = ctx.backend;
  const double set_bytes = double(rows) * len * 4;
  const int sets = BenchContext::rotation_sets(set_bytes);
  DeviceBuffer<float> logits(be, size_t(sets) * rows * len);
  fill_repeating(be, logits.data(), logits.bytes(), as_bytes(normals(gen, size_t(1) << 22)));
  const int64_t pages_per_row = len / kPageSize;
  DeviceBuffer<int32_t> table(be, size_t(rows * pages_per_row)), seq_lens(be, size_t(rows));
  be.copy_to_device(table.data(), shuffled_pages(gen, rows * pages_per_row).data(), table.bytes());
  const std::vector<int32_t> lens(size_t(rows), len);
  be.copy_to_device(seq_lens.data(), lens.data(), seq_lens.bytes());
  DeviceBuffer<int32_t> positions(be, size_t(rows) * kK);
  DeviceBuffer<int64_t> slots(be, size_t(rows) * kK);

  TopkParams p;
  p.seq_lens = seq_lens.data(), p.out_positions = positions.data(), p.out_slots = slots.data();
  p.page_table = table.data();
  p.rows = rows, p.k = kK, p.ld_logits = len, p.ld_page_table = pages_per_row;
  int64_t call = 0;
  double us = 0;
  with_env(legacy ? "DSA_CUDA_TOPK" : nullptr, "legacy", [&] {
    us = ctx.time_us(
        [&] {
          p.logits = logits.data() + (call++ % sets) * int64_t(rows) * len;
          be.topk(p);
        },
        rows == 1 ? 200 : 20);
  });

  BenchResult r;
  r.name = std::string(legacy ? "topk_legacy" : "topk") + "/k=" + std::to_string(kK) +
           "/B=" + std::to_string(rows) + "/L=" + std::to_string(len);
  r.us = us;
  r.bytes = set_bytes + double(rows) * kK * (4 + 8);
  r.floor_us = std::max(ctx.hbm_floor_us(r.bytes), ctx.empty_launch_us);
  r.floor_kind = ctx.hbm_floor_us(r.bytes) > ctx.empty_launch_us ? "hbm" : "launch";
  r.extra = {{"rotation_sets", sets}};
  ctx.add(std::move(r));
}

// One launch of the warp-specialized sparse MLA kernel with SparseMlaParams::trace set (p as the
// bench built it), summarized: the mean over CTAs of each phase in microseconds (clock64 spans
// scaled by the CTAs' own globaltimer span), the mean chunk of the token loop, the launch's span
// and how much of span x SMs the CTAs' lifetimes cover.
void trace_sparse_mla(BenchContext& ctx, SparseMlaParams p, int kRows, const char* kernel,
                      const char* splits) {
  using T = SparseMlaTrace;
  Backend& be = ctx.backend;
  // 128 heads in groups of 16 at the least, at most 16 splits: the CTAs launched are the first
  // ones written.
  const int most = kRows * 8 * 16;
  DeviceBuffer<uint64_t> trace(be, size_t(most) * T::kWords);
  be.fill(trace.data(), 0, trace.bytes());
  p.trace = trace.data();
  with_env("DSA_CUDA_SPARSE_MLA_VARIANT", kernel, [&] {
    with_env(splits != nullptr ? "DSA_CUDA_SPARSE_MLA_MAX_SPLITS" : nullptr, splits, [&] {
      be.sparse_mla(p);  // warm (the first launch sets the kernel's attributes)
      be.sparse_mla(p);
    });
  });
  const std::string label =
      std::string(kernel) + (splits != nullptr ? std::string("/splits=") + splits : "");
  be.synchronize();
  std::vector<uint64_t> w(size_t(most) * T::kWords);
  be.copy_to_host(w.data(), trace.data(), trace.bytes());
  int ctas = 0;
  while (ctas < most && w[size_t(ctas) * T::kWords + T::kNsStart] != 0) ++ctas;
  if (ctas == 0) return;
  // The phases: name, from word, to word (each CTA's mean in us).
  struct Phase {
    const char* name;
    int from, to;
  };
  static constexpr Phase kPhases[] = {
      {"q_stored_us", T::kStart, T::kQStored},       // q's loads and the stores into the cluster
      {"prologue_us", T::kStart, T::kPrologue},      // ... and the cluster barrier after them
      {"first_chunk_us", T::kPrologue, T::kFirstS},  // chunk 0's copies landing
      {"loop_us", T::kFirstS, T::kLoop0},            // warpgroup 0's token loop
      {"wg1_after_wg0_us", T::kLoop0, T::kLoop1},    // warpgroup 1 past warpgroup 0's loop end
      {"parts_us", T::kLoop0, T::kParts},    // the partial into shared memory, the cluster barrier
      {"pull_us", T::kParts, T::kCombined},  // the remote loads and the sums of this CTA's slice
      {"exit_us", T::kCombined, T::kEnd},    // the last cluster barrier
      {"combine_us", T::kLoop0, T::kEnd},           {"life_us", T::kStart, T::kEnd},
  };
  constexpr int kN = int(std::size(kPhases));
  double sum[kN] = {}, chunk_us = 0, life_us = 0;
  int chunked = 0;
  uint64_t first = UINT64_MAX, last = 0;
  std::vector<int> sms;
  for (int c = 0; c < ctas; ++c) {
    const uint64_t* t = w.data() + size_t(c) * T::kWords;
    const double cycles = double(t[T::kEnd] - t[T::kStart]);
    const double us_per_cycle =
        cycles > 0 ? double(t[T::kNsEnd] - t[T::kNsStart]) * 1e-3 / cycles : 0;
    auto span = [&](int a, int b) { return double(int64_t(t[b] - t[a])) * us_per_cycle; };
    for (int i = 0; i < kN; ++i) sum[i] += span(kPhases[i].from, kPhases[i].to);
    const int n_chunks = int(t[T::kWhere] >> 32);
    if (n_chunks > 0) chunk_us += span(T::kFirstS, T::kLoop0) / n_chunks, ++chunked;
    life_us += double(t[T::kNsEnd] - t[T::kNsStart]) * 1e-3;
    first = std::min(first, t[T::kNsStart]);
    last = std::max(last, t[T::kNsEnd]);
    sms.push_back(int(t[T::kWhere] & 0xffffffffu));
  }
  std::sort(sms.begin(), sms.end());
  const int used_sms = int(std::unique(sms.begin(), sms.end()) - sms.begin());
  const double span_us = double(last - first) * 1e-3;
  const double cover = life_us / (span_us * std::max(1, used_sms));
  std::printf(
      "  sparse_mla_trace/bf16/B=%d/%s: %d CTAs on %d SMs over %.2f us (%.0f%% covered); "
      "per CTA us:",
      kRows, label.c_str(), ctas, used_sms, span_us, 100 * cover);
  for (int i = 0; i < kN; ++i) std::printf(" %s %.2f", kPhases[i].name, sum[i] / ctas);
  std::printf(", a chunk %.2f\n", chunked ? chunk_us / chunked : 0.0);
  BenchResult r;
  r.name = "sparse_mla_trace/bf16/B=" + std::to_string(kRows) + "/" + label;
  r.us = span_us;
  r.extra = {{"ctas", ctas},
             {"sms", used_sms},
             {"covered", cover},
             {"chunk_us", chunked ? chunk_us / chunked : 0.0}};
  for (int i = 0; i < kN; ++i) r.extra[kPhases[i].name] = sum[i] / ctas;
  ctx.add(std::move(r));
}

void bench_sparse_mla(BenchContext& ctx, KvDtype dtype, int kRows, std::mt19937_64& gen) {
  constexpr int kHeads = 128, kTopk = 2048;
  Backend& be = ctx.backend;
  const int64_t token_bytes = latent_token_bytes(dtype);
  const double set_bytes =
      double(kRows) * kTopk * token_bytes + double(kRows) * kHeads * (kLatentDim + kKvLoraRank) * 4;
  const int sets = BenchContext::rotation_sets(set_bytes);
  // Each set selects from its own 2048 pages (131072 tokens) of the pool.
  const int64_t set_tokens = int64_t(kRows) * kTopk, pages = sets * set_tokens / kPageSize + 1;
  DeviceBuffer<uint8_t> pool(be, size_t(pages * kPageSize * token_bytes));
  be.fill(pool.data(), 0, pool.bytes());  // page 0 stays zero
  fill_pool_random(be, PoolView{pool.data(), dtype, ScaleRounding::kExact, pages},
                   PoolKind::kLatent, gen());
  std::vector<int64_t> indices(size_t(sets) * set_tokens);
  for (int s = 0; s < sets; ++s) {
    std::vector<int64_t> slots(static_cast<size_t>(set_tokens));
    std::iota(slots.begin(), slots.end(), kPageSize + s * set_tokens);
    std::shuffle(slots.begin(), slots.end(), gen);  // each row: 2048 random distinct slots
    std::copy(slots.begin(), slots.end(), indices.begin() + s * set_tokens);
  }
  DeviceBuffer<int64_t> d_indices(be, indices.size());
  be.copy_to_device(d_indices.data(), indices.data(), d_indices.bytes());
  const size_t q_count = size_t(kRows) * kHeads * kLatentDim;
  DeviceBuffer<float> q(be, size_t(sets) * q_count);
  fill_repeating(be, q.data(), q.bytes(), as_bytes(normals(gen, size_t(1) << 20)));
  DeviceBuffer<float> out(be, size_t(sets) * kRows * kHeads * kKvLoraRank);
  DeviceBuffer<float> lse(be, size_t(sets) * kRows * kHeads);

  SparseMlaParams p;
  p.pool = PoolView{pool.data(), dtype, ScaleRounding::kExact, pages};
  p.rows = kRows, p.heads = kHeads, p.topk = kTopk;
  p.ld_q = kHeads * kLatentDim, p.ld_indices = kTopk, p.ld_out = kHeads * kKvLoraRank;
  p.scale = 1.0f / std::sqrt(192.0f);
  // One row per variant: the batch's own choice, then each heads-per-CTA forced (.../heads=H),
  // 16 splits per row (.../splits=16) and the wgmma kernel (.../wgmma), so the dispatch is
  // checked against the alternatives in the same run. At B = 1 also .../graph: 50 launches
  // captured in one CUDA graph (no host launch cost, as in the decode graphs), the batch's own
  // choice, and .../wgmma/graph.
  struct Variant {
    const char* env;  // null: none
    const char* value;
    const char* suffix;
    bool graph;
    const char* kernel = nullptr;  // DSA_CUDA_SPARSE_MLA_VARIANT (mma | wgmma | wgmma64 | ws);
                                   // null: the default
  };
  std::vector<Variant> variants = {
      {nullptr, "", "", false},
      {nullptr, "", "/mma", false, "mma"},
      {"DSA_CUDA_SPARSE_MLA_HEADS", "16", "/heads=16", false, "mma"},
      {"DSA_CUDA_SPARSE_MLA_HEADS", "32", "/heads=32", false, "mma"},
      {"DSA_CUDA_SPARSE_MLA_HEADS", "64", "/heads=64", false, "mma"},
      {"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "16", "/splits=16", false, "mma"},
      {"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "4", "/default/splits=4", false},
      {"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "8", "/default/splits=8", false},
      {"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "2", "/default/splits=2", false},
      {"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "1", "/default/splits=1", false},
      {nullptr, "", "/wgmma", false, "wgmma"},
      {"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "16", "/wgmma/splits=16", false, "wgmma"},
      {"DSA_CUDA_SPARSE_MLA_WGMMA_PV", "mma", "/wgmma/pv=mma", false, "wgmma"},
      {"DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE", "serial", "/wgmma/serial", false, "wgmma"},
      {"DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE", "overlap", "/wgmma/overlap", false, "wgmma"},
      {"DSA_CUDA_SPARSE_MLA_HEADS", "32", "/wgmma/heads=32", false, "wgmma"},
      {"DSA_CUDA_SPARSE_MLA_HEADS", "16", "/wgmma/heads=16", false, "wgmma"}};
  const bool bf16 = dtype == KvDtype::kBf16;
  if (bf16) {
    variants.push_back({nullptr, "", "/wgmma64", false, "wgmma64"});
    variants.push_back(
        {"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "16", "/wgmma64/splits=16", false, "wgmma64"});
  }
  // ws on either dtype (the default for both; fp8: its in-tile expansion).
  variants.push_back({nullptr, "", "/ws", false, "ws"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "16", "/ws/splits=16", false, "ws"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "8", "/ws/splits=8", false, "ws"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "4", "/ws/splits=4", false, "ws"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "2", "/ws/splits=2", false, "ws"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "1", "/ws/splits=1", false, "ws"});
  // ws's heads per CTA forced (unset: the batch's choice, 16 or 32 at small batches, else 64) and
  // q's way forced (unset: from L2).
  variants.push_back({"DSA_CUDA_SPARSE_MLA_HEADS", "64", "/ws/heads=64", false, "ws"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_HEADS", "32", "/ws/heads=32", false, "ws"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_HEADS", "16", "/ws/heads=16", false, "ws"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_Q", "l2", "/ws/q=l2", false, "ws"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_Q", "cluster", "/ws/q=cluster", false, "ws"});
  // hn (heads as the MMA's N, 16 heads per CTA: for small batches) at every split bound.
  variants.push_back({nullptr, "", "/hn", false, "hn"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "16", "/hn/splits=16", false, "hn"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "8", "/hn/splits=8", false, "hn"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "2", "/hn/splits=2", false, "hn"});
  variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "1", "/hn/splits=1", false, "hn"});
  if (kRows == 1) {
    variants.push_back({nullptr, "", "/hn/graph", true, "hn"});
    variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "8", "/hn/splits=8/graph", true, "hn"});
    variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "16", "/hn/splits=16/graph", true, "hn"});
    variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "8", "/ws/splits=8/graph", true, "ws"});
    variants.push_back({nullptr, "", "/graph", true});
    variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "4", "/default/splits=4/graph", true});
    variants.push_back({"DSA_CUDA_SPARSE_MLA_MAX_SPLITS", "8", "/default/splits=8/graph", true});
    variants.push_back({nullptr, "", "/mma/graph", true, "mma"});
    variants.push_back({nullptr, "", "/wgmma/graph", true, "wgmma"});
    variants.push_back(
        {"DSA_CUDA_SPARSE_MLA_WGMMA_SCHEDULE", "overlap", "/wgmma/overlap/graph", true, "wgmma"});
    if (bf16) variants.push_back({nullptr, "", "/wgmma64/graph", true, "wgmma64"});
    variants.push_back({nullptr, "", "/ws/graph", true, "ws"});
  }
  for (const Variant& v : variants) {
    int64_t call = 0;
    double us = 0;
    auto launch = [&] {
      const int64_t s = call++ % sets;
      p.q = q.data() + s * q_count;
      p.indices = d_indices.data() + s * set_tokens;
      p.out = out.data() + s * kRows * kHeads * kKvLoraRank;
      p.lse = lse.data() + s * kRows * kHeads;
      be.sparse_mla(p);
    };
    // A variant that cannot launch here (16 splits: a cluster of 16 the GPU cannot place) is
    // reported and skipped; the other rows go on.
    try {
      with_env(v.kernel ? "DSA_CUDA_SPARSE_MLA_VARIANT" : nullptr, v.kernel, [&] {
        with_env(v.env, v.value, [&] {
          us = v.graph ? ctx.time_graph_us(launch, 50) : ctx.time_us(launch, kRows == 1 ? 200 : 10);
        });
      });
    } catch (const std::exception& e) {
      std::printf("  sparse_mla/%s/B=%d%s FAILED: %s\n", kv_dtype_name(dtype), kRows, v.suffix,
                  e.what());
      continue;
    }

    BenchResult r;
    r.name = std::string("sparse_mla/") + kv_dtype_name(dtype) + "/B=" + std::to_string(kRows) +
             "/H=128/topk=2048" + v.suffix;
    r.us = us;
    r.flops = 2.0 * kHeads * kTopk * (kLatentDim + kKvLoraRank) * double(kRows);
    r.bytes = set_bytes;
    r.floor_us = std::max(ctx.bf16_floor_us(r.flops), ctx.empty_launch_us);
    r.floor_kind = ctx.bf16_floor_us(r.flops) > ctx.empty_launch_us ? "bf16" : "launch";
    const double tflops = r.flops / (us * 1e6);
    r.extra = {{"tflops", tflops},
               {"pct_of_bf16", 100.0 * tflops / ctx.bf16_tflops},
               {"rotation_sets", sets},
               {"variant", (v.kernel ? "DSA_CUDA_SPARSE_MLA_VARIANT=" + std::string(v.kernel) + " "
                                     : std::string()) +
                               (v.env == nullptr ? "" : std::string(v.env) + "=" + v.value)}};
    std::printf("    %.0f TFLOP/s = %.0f%% of bf16 %.0f TFLOP/s\n", tflops,
                100.0 * tflops / ctx.bf16_tflops, ctx.bf16_tflops);
    ctx.add(std::move(r));
  }
  if (ctx.mla_trace && bf16) {
    p.q = q.data(), p.indices = d_indices.data(), p.out = out.data(), p.lse = lse.data();
    trace_sparse_mla(ctx, p, kRows, "ws", nullptr);
    trace_sparse_mla(ctx, p, kRows, "hn", nullptr);
    trace_sparse_mla(ctx, p, kRows, "hn", "8");
  }
}

}  // namespace

// The split combine's data movement alone (run_cluster_exchange), at 2 clusters (B = 1's 16 CTAs)
// and 128 (B = 64's 1024): rows cluster_exchange/<how>/ctas=N, the mean per-CTA span, and the
// bytes each CTA brings in from elsewhere (7 of its 8 slices: 112 KiB; through global memory also
// the 128 KiB it writes).
void bench_cluster_exchange(BenchContext& ctx) {
  const char* names[] = {"pull", "push", "global"};
  for (int clusters : {2, 128}) {
    for (int mode = 0; mode < 3; ++mode) {
      ClusterExchangeResult x;
      const cudaError_t err = run_cluster_exchange(mode, clusters, ctx.stream, x);
      if (err != cudaSuccess) {
        std::printf("  cluster_exchange/%s FAILED: %s\n", names[mode], cudaGetErrorString(err));
        continue;
      }
      const double remote = 7.0 * 64 * 64 * 4, bytes = remote + (mode == 2 ? 64.0 * 512 * 4 : 0);
      std::printf(
          "  cluster_exchange/%s/ctas=%d: %.2f us a CTA (%.0f cycles, %.1f B/clk remote), "
          "launch span %.2f us on %d SMs\n",
          names[mode], x.ctas, x.cta_us, x.cta_cycles, remote / x.cta_cycles, x.launch_us, x.sms);
      BenchResult r;
      r.name = std::string("cluster_exchange/") + names[mode] + "/ctas=" + std::to_string(x.ctas);
      r.us = x.cta_us;
      r.bytes = bytes;
      r.extra = {{"cta_cycles", x.cta_cycles},
                 {"remote_bytes_per_clk", remote / x.cta_cycles},
                 {"launch_us", x.launch_us},
                 {"sms", x.sms}};
      ctx.add(std::move(r));
    }
  }
}

void run_attention_benches(BenchContext& ctx) {
  std::mt19937_64 gen(2025);
  std::puts("attention benches");
  auto wanted = [&](const char* family) {
    return ctx.attention_only.empty() ||
           std::find(ctx.attention_only.begin(), ctx.attention_only.end(), family) !=
               ctx.attention_only.end();
  };
  if (wanted("indexer_logits")) {
    std::vector<std::string> variants = ctx.indexer_variants;
    if (ctx.legacy_rows &&
        std::find(variants.begin(), variants.end(), "legacy") == variants.end()) {
      variants.push_back("legacy");
    }
    const std::vector<int> batches =
        ctx.indexer_rows.empty() ? std::vector<int>{64, 1} : ctx.indexer_rows;
    for (KvDtype dtype : {KvDtype::kFp8, KvDtype::kBf16}) {
      for (int rows : batches) {
        const int len = rows == 1 ? 131072 : 32768;
        bench_indexer(ctx, dtype, rows, len, gen, nullptr);
        for (const std::string& v : variants) bench_indexer(ctx, dtype, rows, len, gen, v.c_str());
      }
      // A server's short sessions in a long context's cache: rows of 4096 tokens in a capacity of
      // 128K (the grid follows the capacity), contiguous tiles against interleaved ones.
      for (int rows : {1, 8}) bench_indexer(ctx, dtype, rows, 4096, gen, nullptr, 131072);
    }
  }
  if (wanted("topk")) {
    for (int k : {2048, 512}) {
      for (int len : {32768, 131072}) {
        for (int rows : {1, 64, 256}) {
          bench_topk(ctx, rows, len, k, gen, false);
          if (ctx.legacy_rows) bench_topk(ctx, rows, len, k, gen, true);
        }
      }
    }
  }
  if (wanted("sparse_mla")) {
    for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
      for (int rows : {1, 64, 256}) {
        const auto& only = ctx.sparse_mla_rows;
        if (only.empty() || std::find(only.begin(), only.end(), rows) != only.end()) {
          bench_sparse_mla(ctx, dtype, rows, gen);
        }
      }
    }
    if (ctx.mla_trace) bench_cluster_exchange(ctx);
  }
}

}  // namespace dsa::bench
