// The detectors of DESIGN §6 against the faults they exist for: the auditor's truth comes from
// what a real row meant to write (a clobber in the same step is a finding), page 0 is watched,
// the shadow oracle counts every change independently, store errors fail requests loudly, page
// ids are checked on the host, and the replay check shows both detection channels working.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/test_util.h"
#include "dsa/auditor.h"
#include "dsa/engine.h"
#include "dsa/error.h"
#include "dsa/shadow_oracle.h"
#include "dsa/slot_digest.h"
#include "graph/graph_fixture.h"
#include "parity/parity_harness.h"

namespace dsa {
namespace {

using testing::micro_config;

// The micro model with one cache and a graph runner of one bucket of 2, the incident's faults on.
struct IncidentRig {
  explicit IncidentRig(FaultSet faults = {true, true}) : backend(make_cpu_backend()) {
    const ModelConfig config = micro_config();
    model =
        std::make_unique<Model>(*backend, config, Weights::synthetic(*backend, config, 3), 4, 128);
    CacheConfig cc;
    cc.num_layers = config.num_hidden_layers;
    cc.num_pages = 8;
    cache = std::make_unique<KvCache>(*backend, cc);
    RunnerOptions o{RunMode::kGraph, {2}, faults, WriteDigests::kOn, WriteValues::kOn};
    runner = std::make_unique<Runner>(*model, *cache, o);
  }
  std::vector<uint64_t> current_digests(int64_t slot) {  // [layers * 2], read back
    std::vector<uint64_t> out;
    for (int l = 0; l < cache->config().num_layers; ++l) {
      for (PoolKind k : {PoolKind::kLatent, PoolKind::kIndexK}) {
        const PoolView pool = k == PoolKind::kLatent ? cache->latent(l) : cache->index_k(l);
        out.push_back(slot_digest(k == PoolKind::kLatent ? latent_slot_bytes(pool, slot)
                                                         : index_k_slot_bytes(pool, slot)));
      }
    }
    return out;
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Runner> runner;
};

// A stale padded row writes the slot a real row wrote in the same step (on the CPU it writes
// last). Reading the pool back after the step, the old way, takes the clobbered bytes as the
// truth; the digest of what the real row meant to write does not.
TEST(Detection, SameStepClobberIsAFinding) {
  IncidentRig rig;
  const std::vector<int32_t> page1 = {1}, page2 = {2};
  // Step 1: two real rows, the second writes slot 128 (page 2, offset 0) for "request X".
  const std::vector<RowInput> both = {{7, 0, 64, 1, page1}, {9, 0, 128, 1, page2}};
  rig.runner->step(both);
  // Step 2: X is gone and page 2 went to "request Y", whose only row writes slot 128 too; the
  // stale padded row 1 replays X's row and rewrites slot 128 with X's keys after Y's.
  const std::vector<RowInput> y = {{30, 0, 128, 1, page2}};
  const StepResult r = rig.runner->step(y);
  ASSERT_EQ(r.bucket, 2);
  ASSERT_EQ(r.write_digests.size(), size_t(micro_config().num_hidden_layers) * 2);

  const std::vector<uint64_t> read_back = rig.current_digests(128);
  int index_k_differs = 0;
  for (size_t k = 0; k < read_back.size(); ++k) {
    const bool differs = read_back[k] != r.write_digests[k];
    EXPECT_EQ(differs, k % 2 == 1) << "pool " << k;  // only the unguarded index-K is clobbered
    index_k_differs += differs;
  }
  EXPECT_EQ(index_k_differs, micro_config().num_hidden_layers);

  SlotAuditor auditor(*rig.backend, *rig.cache);
  const std::vector<int64_t> slots = {128}, owners = {42};
  auditor.record_written(slots, owners, r.write_digests, 2);
  const std::vector<AuditFinding> found = auditor.verify_all(2);
  ASSERT_EQ(found.size(), size_t(micro_config().num_hidden_layers));
  for (const AuditFinding& f : found) {
    EXPECT_EQ(f.slot, 128);
    EXPECT_EQ(f.pool, PoolKind::kIndexK);
    EXPECT_EQ(f.owner, 42);
  }
  // Reported once: the changed bytes become the truth.
  auditor.accept_current(slots, 2);
  EXPECT_TRUE(auditor.verify_all(3).empty());

  // The oracle, from the store inputs alone, sees the same slots change.
  ShadowOracle oracle(*rig.backend, *rig.cache);
  oracle.write(slots, owners, r.store_values);
  const std::vector<Clobber> clobbers = oracle.compare(2);
  ASSERT_EQ(clobbers.size(), found.size());
  for (const Clobber& c : clobbers) EXPECT_EQ(c.pool, PoolKind::kIndexK);
  EXPECT_TRUE(oracle.compare(3).empty());  // once
}

// Guarded, the same two steps leave the written slot exactly as the row meant it.
TEST(Detection, GuardedStepsMatchTheirWriteDigests) {
  IncidentRig rig(FaultSet{});
  const std::vector<int32_t> page1 = {1}, page2 = {2};
  rig.runner->step(std::vector<RowInput>{{7, 0, 64, 1, page1}, {9, 0, 128, 1, page2}});
  const StepResult r = rig.runner->step(std::vector<RowInput>{{30, 0, 128, 1, page2}});
  EXPECT_EQ(rig.current_digests(128), r.write_digests);
  ShadowOracle oracle(*rig.backend, *rig.cache);
  oracle.write(std::vector<int64_t>{128}, std::vector<int64_t>{1}, r.store_values);
  EXPECT_TRUE(oracle.compare(2).empty());
}

// digest_rows is the digest of the bytes the store writes, for every layout; 0 past n_real.
TEST(Detection, DigestRowsEqualTheStoredSlotsDigest) {
  testing::Rng rng(17);
  auto be = make_cpu_backend();
  for (PoolKind kind : {PoolKind::kIndexK, PoolKind::kLatent}) {
    for (KvDtype dtype : {KvDtype::kBf16, KvDtype::kFp8}) {
      for (ScaleRounding rounding : {ScaleRounding::kExact, ScaleRounding::kUe8m0}) {
        const int rows = 5;
        const int64_t ld = 700;
        const std::vector<float> v = rng.normals(size_t(rows) * ld, 3.0f);
        const int64_t page_bytes =
            kind == PoolKind::kIndexK ? index_k_page_bytes(dtype) : latent_page_bytes(dtype);
        std::vector<uint8_t> bytes(size_t(4 * page_bytes), 0);
        const PoolView pool{bytes.data(), dtype, rounding, 4};
        const std::vector<int64_t> slots = {64, 65, 130, 200, 255};
        const int32_t n_real = 4;
        int32_t errors = 0;
        const SlotBatch batch{slots.data(), &n_real, rows, &errors};
        if (kind == PoolKind::kIndexK) {
          be->store_index_k({batch, v.data(), ld, pool, StoreGuard::kEnforced});
        } else {
          be->store_latent_kv({batch, v.data(), v.data() + kKvLoraRank, ld, ld, pool});
        }
        std::vector<uint64_t> digests(rows, 7);
        DigestRowsParams d{kind,  v.data(), v.data() + kKvLoraRank, ld, ld, &n_real, rows,
                           dtype, rounding, digests.data()};
        be->digest_rows(d);
        for (int r = 0; r < rows; ++r) {
          const SlotBytes b = kind == PoolKind::kIndexK ? index_k_slot_bytes(pool, slots[r])
                                                        : latent_slot_bytes(pool, slots[r]);
          if (r < n_real) {
            EXPECT_EQ(digests[r], slot_digest(b)) << int(kind) << int(dtype) << " row " << r;
          } else {
            EXPECT_EQ(digests[r], 0u);
          }
        }
      }
    }
  }
}

// Page 0 of every pool must stay zero: any change there is a finding (owner -1), reported once.
TEST(Detection, AWriteIntoPageZeroIsAFinding) {
  IncidentRig rig(FaultSet{});
  SlotAuditor auditor(*rig.backend, *rig.cache);
  EXPECT_TRUE(auditor.verify_all(0).empty());
  const PoolView pool = rig.cache->latent(1);
  const uint8_t byte = 0x11;
  rig.backend->copy_to_device(pool.data + 17 * latent_token_bytes(pool.dtype) + 3, &byte, 1);
  const std::vector<AuditFinding> found = auditor.verify(std::vector<int64_t>{}, 1);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].slot, 17);
  EXPECT_EQ(found[0].layer, 1);
  EXPECT_EQ(found[0].pool, PoolKind::kLatent);
  EXPECT_EQ(found[0].owner, kReservedPageOwner);
  EXPECT_NE(found[0].describe().find("reserved page 0"), std::string::npos);
  auditor.accept_current(std::vector<int64_t>{17}, 1);
  EXPECT_TRUE(auditor.verify_all(2).empty());
  ShadowOracle oracle(*rig.backend, *rig.cache);
  EXPECT_EQ(oracle.compare(2).size(), 1u);
}

// The recall tally matches clobbers and findings by layer, pool and slot, later findings too, and
// forgets clobbers of released slots (they stay missed).
TEST(Detection, RecallTallyMatchesLaterFindingsAndCountsMisses) {
  RecallTally t;
  t.saw_clobbers(std::vector<Clobber>{{0, PoolKind::kIndexK, 100, 1, 5},
                                      {1, PoolKind::kIndexK, 100, 1, 5},
                                      {0, PoolKind::kIndexK, 300, 2, 5}});
  t.saw_findings(std::vector<AuditFinding>{{0, PoolKind::kIndexK, 100, 1, 4, 6, {}}});
  t.released(std::vector<int64_t>{300});
  t.saw_findings(std::vector<AuditFinding>{{0, PoolKind::kIndexK, 300, 9, 7, 8, {}},
                                           {1, PoolKind::kIndexK, 100, 1, 4, 9, {}}});
  EXPECT_EQ(t.oracle_clobbers(), 3);
  EXPECT_EQ(t.auditor_found(), 2);
  EXPECT_EQ(t.auditor_unconfirmed(), 1);  // slot 300's new owner: no clobber behind it
}

// A real row whose page table names a page outside the pool, or the reserved page, is refused
// when the runner stages it, on every backend, before anything runs.
TEST(Detection, RunnerRefusesBadPageIdsBeforeTheStep) {
  IncidentRig rig(FaultSet{});
  for (int32_t bad : {0, -1, 8, 1 << 30}) {
    const std::vector<int32_t> pages = {1, bad};
    const std::vector<RowInput> rows = {{5, 70, 1 * 64 + 6, 71, pages}};
    try {
      rig.runner->step_eager(rows);
      ADD_FAILURE() << "page " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("page " + std::to_string(bad)), std::string::npos)
          << e.what();
    }
  }
}

// The store error path: every slot rejected, so every request fails with the step and rows named,
// and the engine counts it; nothing is silently dropped.
TEST(Detection, StoreErrorsFailTheAffectedRequests) {
  auto be = make_cpu_backend();
  const ModelConfig config = micro_config();
  Model model(*be, config, Weights::synthetic(*be, config, 3), 8, 128);
  CacheConfig cc;
  cc.num_layers = config.num_hidden_layers;
  cc.num_pages = 16;
  KvCache cache(*be, cc);
  EngineOptions o;
  o.runner.faults = parse_faults("wild-slot");
  o.audit = true;
  Engine e(model, cache, o);
  RequestParams p;
  p.max_new_tokens = 4;
  const int64_t a = e.submit({1, 2, 3}, p), b = e.submit({4, 5}, p);
  e.run_until_idle();
  const std::vector<RequestOutput> out = e.take_finished();
  ASSERT_EQ(out.size(), 2u);
  for (const RequestOutput& r : out) {
    EXPECT_TRUE(r.id == a || r.id == b);
    EXPECT_EQ(r.reason, FinishReason::kFailed);
    ASSERT_TRUE(r.error.has_value());
    EXPECT_NE(r.message.find("raised its error flag"), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("rows: 0 (slot"), std::string::npos) << r.message;
  }
  EXPECT_GT(e.stats().store_errors, 0);
  EXPECT_EQ(e.stats().failed_by_store_errors, 2);
  EXPECT_EQ(cache.allocator().used_pages(), 0);
}

// check-replay under the incident: both channels fire, they agree with the oracle, and long
// sequences let a clobbered key change the logits.
TEST(Detection, ReplayCheckIncidentDetectorsAgreeWithTheOracle) {
  const ReplayCheckReport r =
      testing::run_micro_check(BackendKind::kCpu, KvDtype::kBf16, 300, FaultSet{true, true});
  EXPECT_TRUE(r.oracle);
  EXPECT_GT(r.oracle_clobbers, 0);
  EXPECT_EQ(r.auditor_found, r.oracle_clobbers);
  EXPECT_EQ(r.auditor_unconfirmed, 0);
  EXPECT_EQ(r.diverged_not_flagged(), 0);
  EXPECT_GT(r.long_sequences, 0);
  EXPECT_GT(r.flagged_and_diverged(), 0) << "no finding changed logits";
  EXPECT_TRUE(r.detectors_agree());
}

// The parity harness's per-row bound sees one wrong element that nmse over a large output cannot.
TEST(ParityHarness, OneWrongElementFailsThePerRowBound) {
  testing::Rng rng(5);
  const size_t rows = 64, cols = 4096;
  std::vector<float> a = rng.normals(rows * cols);
  std::vector<float> b = a;
  auto bytes = [](const std::vector<float>& v) {
    std::vector<uint8_t> out(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  };
  const parity::Check check = parity::Check::nmse(1e-5).per_row(cols);
  EXPECT_EQ(parity::compare_output(bytes(a), bytes(b), check), "");
  b[17 * cols + 5] = a[17 * cols + 5] + 1.0f;  // nmse ~ 3.8e-6 < 1e-5
  const std::string d = parity::compare_output(bytes(a), bytes(b), check);
  EXPECT_NE(d.find("row 17"), std::string::npos) << d;
}

}  // namespace
}  // namespace dsa
