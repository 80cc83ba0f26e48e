// The lanes of a step (Backend::set_lane, lane_wait): the model's split of its ops between the
// main and the side lane must hold whatever order a backend runs unordered work in. On the CPU,
// a backend that defers every op and then runs the two lanes in the most extreme orders the
// waits allow (the main lane as far ahead as it may go, or the side lane) must give the bits of
// program order: the tokens and every byte of every pool. A lane that read what the other writes
// while the two are unordered would read it too early in one order or too late in the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/expect_error.h"
#include "common/test_util.h"
#include "dsa/error.h"
#include "dsa/generate.h"
#include "dsa/runner.h"
#include "graph/graph_fixture.h"

namespace dsa {
namespace {

using testing::micro_config;
using testing::snapshot;
using Lane = Backend::Lane;

enum class Order { kProgram, kMainFirst, kSideFirst };

// The CPU backend behind a queue per lane. kProgram runs each op when it is called. The others
// queue ops and run them at the next call that is not an op (memory, synchronize, capture, ...):
// always the preferred lane's next op when the waits allow it, else the other lane's.
class LaneOrderBackend final : public Backend {
 public:
  struct Queued {
    Lane lane;
    std::string op;
    int64_t needs;  // ops of the other lane that must have run before this one
  };

  explicit LaneOrderBackend(Order order) : cpu_(make_cpu_backend()), order_(order) {}
  ~LaneOrderBackend() override = default;

  BackendKind kind() const override { return cpu_->kind(); }
  std::string describe() const override { return "lane-order " + cpu_->describe(); }
  void* allocate(size_t bytes) override { return cpu_->allocate(bytes); }
  void deallocate(void* p) override {
    flush();
    cpu_->deallocate(p);
  }
  void copy_to_device(void* d, const void* s, size_t n) override {
    flush();
    cpu_->copy_to_device(d, s, n);
  }
  void copy_to_host(void* d, const void* s, size_t n) override {
    flush();
    cpu_->copy_to_host(d, s, n);
  }
  void copy_on_device(void* d, const void* s, size_t n) override {
    flush();
    cpu_->copy_on_device(d, s, n);
  }
  void fill(void* d, uint8_t byte, size_t n) override {
    flush();
    cpu_->fill(d, byte, n);
  }
  void synchronize() override {
    flush();
    cpu_->synchronize();
  }
  std::unique_ptr<Graph> capture(const std::function<void()>& step) override {
    flush();
    return cpu_->capture(step);
  }
  size_t sample_workspace_bytes(int rows, int vocab) const override {
    return cpu_->sample_workspace_bytes(rows, vocab);
  }
  void reserve_gemm_scratch(size_t x_elements, int max_rows) override {
    cpu_->reserve_gemm_scratch(x_elements, max_rows);
  }

  void set_lane(Lane lane) override {
    Backend::set_lane(lane);
    lane_ = lane;
  }
  void lane_wait(Lane waiter, Lane waited) override {
    Backend::lane_wait(waiter, waited);
    if (waiter == waited) return;
    int64_t& needs = needs_[int(waiter)];
    needs = std::max(needs, queued_[int(waited)]);
  }

  void rmsnorm(const RmsNormParams& p) override {
    op("rmsnorm", [=, this] { cpu_->rmsnorm(p); });
  }
  void layernorm(const LayerNormParams& p) override {
    op("layernorm", [=, this] { cpu_->layernorm(p); });
  }
  void rope(const RopeParams& p) override {
    op("rope", [=, this] { cpu_->rope(p); });
  }
  void hadamard(const HadamardParams& p) override {
    op("hadamard", [=, this] { cpu_->hadamard(p); });
  }
  void gemm(const GemmParams& p) override {
    op("gemm", [=, this] {
      cpu_->set_gemm_mode(gemm_mode());
      cpu_->gemm(p);
    });
  }
  void swiglu(const SwigluParams& p) override {
    op("swiglu", [=, this] { cpu_->swiglu(p); });
  }
  void softmax(const SoftmaxParams& p) override {
    op("softmax", [=, this] { cpu_->softmax(p); });
  }
  void embed(const EmbedParams& p) override {
    op("embed", [=, this] { cpu_->embed(p); });
  }
  void add(const AddParams& p) override {
    op("add", [=, this] { cpu_->add(p); });
  }
  void copy_rows(const CopyRowsParams& p) override {
    op("copy_rows", [=, this] { cpu_->copy_rows(p); });
  }
  void moe_route(const MoeRouteParams& p) override {
    op("moe_route", [=, this] { cpu_->moe_route(p); });
  }
  void scale_rows(const ScaleRowsParams& p) override {
    op("scale_rows", [=, this] { cpu_->scale_rows(p); });
  }
  void store_index_k(const StoreIndexKParams& p) override {
    op("store_index_k", [=, this] { cpu_->store_index_k(p); });
  }
  void store_latent_kv(const StoreLatentKvParams& p) override {
    op("store_latent_kv", [=, this] { cpu_->store_latent_kv(p); });
  }
  void indexer_key(const IndexerKeyParams& p) override {
    op("indexer_key", [=, this] { cpu_->indexer_key(p); });
  }
  void latent_kv(const LatentKvParams& p) override {
    op("latent_kv", [=, this] { cpu_->latent_kv(p); });
  }
  void indexer_query(const IndexerQueryParams& p) override {
    op("indexer_query", [=, this] { cpu_->indexer_query(p); });
  }
  void indexer_logits(const IndexerLogitsParams& p) override {
    op("indexer_logits", [=, this] { cpu_->indexer_logits(p); });
  }
  void topk(const TopkParams& p) override {
    op("topk", [=, this] { cpu_->topk(p); });
  }
  void sparse_mla(const SparseMlaParams& p) override {
    op("sparse_mla", [=, this] { cpu_->sparse_mla(p); });
  }
  void audit_slots(const AuditSlotsParams& p) override {
    op("audit_slots", [=, this] { cpu_->audit_slots(p); });
  }
  void digest_rows(const DigestRowsParams& p) override {
    op("digest_rows", [=, this] { cpu_->digest_rows(p); });
  }
  void audit_sample(const AuditSampleParams& p) override {
    op("audit_sample", [=, this] { cpu_->audit_sample(p); });
  }
  void sample(const SampleParams& p) override {
    op("sample", [=, this] { cpu_->sample(p); });
  }

  std::vector<Queued> log;  // every op in the order it was called
  int max_parked = 0;       // the most ops a flush found queued (0 in program order)

 private:
  void op(const char* name, std::function<void()> run) {
    const int l = int(lane_);
    log.push_back({lane_, name, needs_[l]});
    ++queued_[l];
    if (order_ == Order::kProgram) {
      run();
      ++done_[l];
      return;
    }
    parked_[l].push_back({std::move(run), needs_[l]});
  }
  void flush() {
    max_parked = std::max(max_parked, int(parked_[0].size() + parked_[1].size()));
    const int first = order_ == Order::kSideFirst ? 1 : 0;
    while (!parked_[0].empty() || !parked_[1].empty()) {
      bool ran = false;
      for (const int l : {first, 1 - first}) {
        if (parked_[l].empty() || parked_[l].front().needs > done_[1 - l]) continue;
        auto run = std::move(parked_[l].front().run);
        parked_[l].pop_front();
        run();
        ++done_[l];
        ran = true;
        break;
      }
      require(ran, ErrorCode::kInternal, "lane-order backend: the lanes wait for each other");
    }
  }

  struct Parked {
    std::function<void()> run;
    int64_t needs;
  };
  std::unique_ptr<Backend> cpu_;
  Order order_;
  Lane lane_ = Lane::kMain;
  int64_t queued_[2] = {0, 0}, done_[2] = {0, 0}, needs_[2] = {0, 0};
  std::deque<Parked> parked_[2];
};

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<std::vector<uint8_t>> pools;
  std::vector<LaneOrderBackend::Queued> log;
  int max_parked = 0;
};

// Greedy generation (prefill in chunks of 8 rows, then decode) through a runner in `mode`, with
// `index_k` keys, on `config` (default: the micro model) with `dtype` weights.
Outcome generate_in(Order order, RunMode mode, KvDtype index_k,
                    const ModelConfig& config = micro_config(),
                    WeightDtype dtype = WeightDtype::kBf16) {
  LaneOrderBackend be(order);
  Weights weights = Weights::synthetic(be, config, 7);
  if (holds_fp8(dtype)) weights.quantize_fp8(be);
  weights.set_fp8_activations(dtype == WeightDtype::kW8A8);
  Model model(be, config, std::move(weights), 8, 128);
  CacheConfig cc;
  cc.num_layers = config.num_hidden_layers;
  cc.num_pages = 6;
  cc.index_k_dtype = index_k;
  KvCache cache(be, cc);
  RunnerOptions ro;
  ro.mode = mode;
  ro.buckets = {1, 2, 4, 8};
  Runner runner(model, cache, ro);
  Outcome run;
  // Longer than index_topk (16), so the selection drops tokens and the indexer's order matters.
  const std::vector<int32_t> prompt =
      byte_tokens("lanes run the indexer beside the query projections");
  std::vector<int32_t> ids = prompt;
  for (int32_t& t : ids) t %= config.vocab_size;
  run.tokens = generate_greedy(runner, cache, model, ids, 10);
  be.synchronize();
  run.pools = snapshot(be, cache);
  run.log = be.log;
  run.max_parked = be.max_parked;
  return run;
}

TEST(Lanes, ExtremeOrdersGiveTheBitsOfProgramOrder) {
  for (const RunMode mode : {RunMode::kEager, RunMode::kGraph}) {
    for (const KvDtype index_k : {KvDtype::kBf16, KvDtype::kFp8}) {
      SCOPED_TRACE(std::string(mode == RunMode::kEager ? "eager" : "graph") + ", index-K " +
                   kv_dtype_name(index_k));
      const Outcome program = generate_in(Order::kProgram, mode, index_k);
      ASSERT_EQ(program.tokens.size(), 10u);
      for (const Order order : {Order::kMainFirst, Order::kSideFirst}) {
        SCOPED_TRACE(order == Order::kMainFirst ? "main lane first" : "side lane first");
        const Outcome reordered = generate_in(order, mode, index_k);
        // The reordering is real: whole steps were queued before they ran.
        EXPECT_GT(reordered.max_parked, 10);
        EXPECT_EQ(reordered.tokens, program.tokens);
        ASSERT_EQ(reordered.pools.size(), program.pools.size());
        for (size_t i = 0; i < program.pools.size(); ++i) {
          EXPECT_TRUE(reordered.pools[i] == program.pools[i]) << "pool " << i << " differs";
        }
      }
    }
  }
}

// The same with a MoE layer (tiny-moe: layer 1 routes to experts on the main lane, after the join).
TEST(Lanes, ExtremeOrdersGiveTheBitsOfProgramOrderWithExperts) {
  const ModelConfig config = preset_config("tiny-moe");
  const Outcome program = generate_in(Order::kProgram, RunMode::kGraph, KvDtype::kBf16, config);
  for (const Order order : {Order::kMainFirst, Order::kSideFirst}) {
    const Outcome reordered = generate_in(order, RunMode::kGraph, KvDtype::kBf16, config);
    EXPECT_GT(reordered.max_parked, 10);
    EXPECT_EQ(reordered.tokens, program.tokens);
    EXPECT_TRUE(reordered.pools == program.pools);
  }
}

// With w8a8 weights the indexer's head weights stay bf16 and get a GEMM of their own, on the side
// lane beside q_up's: the lanes' GEMMs must not share scratch or order.
TEST(Lanes, ExtremeOrdersGiveTheBitsOfProgramOrderWithW8a8Weights) {
  const Outcome program = generate_in(Order::kProgram, RunMode::kGraph, KvDtype::kFp8,
                                      micro_config(), WeightDtype::kW8A8);
  int side_gemms = 0;
  for (const LaneOrderBackend::Queued& q : program.log) {
    side_gemms += q.lane == Lane::kSide && q.op == "gemm";
  }
  EXPECT_GT(side_gemms, 0);
  for (const Order order : {Order::kMainFirst, Order::kSideFirst}) {
    const Outcome reordered =
        generate_in(order, RunMode::kGraph, KvDtype::kFp8, micro_config(), WeightDtype::kW8A8);
    EXPECT_EQ(reordered.tokens, program.tokens);
    EXPECT_TRUE(reordered.pools == program.pools);
  }
}

// The split the model promises (model.cpp, attention): the stores and the indexer on the side
// lane, everything else on the main lane, and sparse MLA after every side op queued before it.
TEST(Lanes, TheStoresAndTheIndexerRunOnTheSideLane) {
  const Outcome run = generate_in(Order::kProgram, RunMode::kEager, KvDtype::kBf16);
  const std::vector<std::string> side_ops = {"latent_kv", "indexer_key", "indexer_query",
                                             "indexer_logits", "topk"};
  int64_t side_queued = 0, mla = 0;
  for (const LaneOrderBackend::Queued& q : run.log) {
    const bool side_op = std::find(side_ops.begin(), side_ops.end(), q.op) != side_ops.end();
    if (q.lane == Lane::kSide) {
      ++side_queued;
      // The side lane also carries the stores' digests and value copies, when asked for.
      EXPECT_TRUE(side_op || q.op == "digest_rows" || q.op == "copy_rows") << q.op;
    } else {
      EXPECT_FALSE(side_op) << q.op << " on the main lane";
    }
    if (q.op == "sparse_mla") {
      ++mla;
      EXPECT_EQ(q.needs, side_queued) << "sparse MLA before the side lane is joined";
    }
  }
  EXPECT_GT(mla, 0);
  EXPECT_GE(side_queued, 5 * mla);
}

TEST(Lanes, RefusesALaneThatIsNeither) {
  auto be = make_cpu_backend();
  EXPECT_NO_THROW(be->set_lane(Lane::kSide));
  EXPECT_NO_THROW(be->lane_wait(Lane::kMain, Lane::kSide));
  testing::expect_error([&] { be->set_lane(Lane(2)); }, ErrorCode::kInvalidArgument,
                        {"set_lane", "neither main"});
  testing::expect_error([&] { be->lane_wait(Lane::kMain, Lane(9)); }, ErrorCode::kInvalidArgument,
                        {"lane_wait", "neither main"});
}

}  // namespace
}  // namespace dsa
