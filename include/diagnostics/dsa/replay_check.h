// `dsa check-replay`: a randomized sequence of growing and shrinking decode batches through the
// graph runner, with graph-vs-eager parity and the slot-integrity auditor on (DESIGN §4-6).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "dsa/auditor.h"
#include "dsa/runner.h"

namespace dsa {

struct ReplayCheckOptions {
  int steps = 1000;
  uint64_t seed = 1;
  RunMode mode = RunMode::kGraph;  // the checked runner; kEager runs it at the batch's size
  FaultSet faults;                 // applied to the checked runner only; eager is the reference
  std::vector<int> buckets = {1, 2, 4, 8, 12, 16};
  int max_live_requests = 16;        // concurrent sequences
  int max_request_tokens = 160;      // a sequence ends at this length (or earlier, at random)
  double finish_probability = 0.04;  // per step and row: short lives make pages get reused
  // Up to this many live sequences at a time live past the model's index_topk (to a length in
  // (index_topk, max_request_tokens]) and never finish early, so a clobbered index key changes
  // their top-k selection and shows in the parity channel; the others stay within index_topk.
  int long_live = 2;
  bool parity = true;          // also run every step eagerly on a twin cache and compare
  int audit_sample = 48;       // slots verified per step (plus all slots the step wrote)
  int full_audit_every = 250;  // steps between audits of every watched slot (0: never)
  std::function<void(int step, int steps)> progress;  // optional, called every few steps
};

struct ReplayCheckReport {
  int steps = 0;
  std::map<int, int> bucket_histogram;  // bucket -> replays; 0 = ran eagerly
  int parity_mismatches = 0;            // steps whose real rows differed from eager
  int first_parity_mismatch_step = -1;
  int64_t store_errors = 0;
  std::vector<AuditFinding> findings;
  std::set<int64_t> victims;   // requests named by the auditor
  std::set<int64_t> diverged;  // requests whose logits differed from eager (parity on)
  int64_t audited_slots = 0;
  int64_t tokens = 0;
  int long_sequences = 0;  // sequences that lived past index_topk
  // With faults on, the shadow oracle watches too (see dsa/shadow_oracle.h).
  bool oracle = false;
  int64_t oracle_clobbers = 0, auditor_found = 0, auditor_unconfirmed = 0;
  int diverged_not_flagged() const;  // diverged requests the auditor never named
  int flagged_and_diverged() const;  // victims whose corruption also changed logits
  bool clean() const { return parity_mismatches == 0 && findings.empty() && store_errors == 0; }
  // The oracle saw every change the auditor reported and vice versa, and every divergence had a
  // finding behind it.
  bool detectors_agree() const {
    return auditor_found == oracle_clobbers && auditor_unconfirmed == 0 &&
           diverged_not_flagged() == 0;
  }
};

// Runs the check on `model` (whose backend runs both runners). Two caches of the same shape are
// made from `cache_config`: the graph runner's (audited) and, with parity on, the eager twin's.
ReplayCheckReport run_replay_check(Model& model, const CacheConfig& cache_config,
                                   const ReplayCheckOptions& options);

}  // namespace dsa
