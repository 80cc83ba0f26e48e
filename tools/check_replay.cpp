// dsa check-replay: randomized padded graph replays with parity and the auditor; exit 0 when
// clean, 1 when it found corruption, 2 on bad usage.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>

#include "common.h"
#include "dsa/error.h"
#include "dsa/replay_check.h"

namespace dsa::tools {
namespace {

void print_report(const ReplayCheckReport& r, double seconds) {
  fmt::print("check-replay: {} steps, {} tokens in {:.1f} s\n", r.steps, r.tokens, seconds);
  fmt::print("  buckets      ");
  for (const auto& [bucket, n] : r.bucket_histogram) {
    fmt::print(" {}:{}", bucket == 0 ? std::string("eager") : std::to_string(bucket), n);
  }
  fmt::print("\n  parity       {} mismatching steps", r.parity_mismatches);
  if (r.first_parity_mismatch_step >= 0)
    fmt::print(" (first at step {})", r.first_parity_mismatch_step);
  fmt::print("\n  store errors {}\n", r.store_errors);
  fmt::print(
      "  auditor      {} findings over {} audited slots; victims: {}\n", r.findings.size(),
      r.audited_slots,
      r.victims.empty() ? std::string("none") : fmt::format("{}", fmt::join(r.victims, ", ")));
  const size_t shown = std::min<size_t>(r.findings.size(), 10);
  for (size_t i = 0; i < shown; ++i) fmt::print("    {}\n", r.findings[i].describe());
  if (r.findings.size() > shown) fmt::print("    ... and {} more\n", r.findings.size() - shown);
  fmt::print("  sequences    {} lived past index_topk; {} diverged from eager\n", r.long_sequences,
             r.diverged.size());
  fmt::print(
      "  detection    {} of {} victims also diverged (their findings changed logits); "
      "diverged_not_flagged {}\n",
      r.flagged_and_diverged(), r.victims.size(), r.diverged_not_flagged());
  if (r.oracle) {
    fmt::print("  oracle       oracle_clobbers {}, auditor_found {}, auditor_unconfirmed {}\n",
               r.oracle_clobbers, r.auditor_found, r.auditor_unconfirmed);
  }
  if (!r.detectors_agree()) {
    fmt::print("  detectors    DISAGREE: the auditor missed or invented changes\n");
  }
  fmt::print("  verdict      {}\n", r.clean() ? "CLEAN" : "CORRUPTION FOUND");
}

}  // namespace

void register_check_replay(CLI::App& app, SubcommandAction& run) {
  struct Opts {
    ModelOptions model;
    ReplayCheckOptions check;
    std::string inject, mode = "graph";
    std::vector<int> buckets;
  };
  auto o = std::make_shared<Opts>();
  o->model.max_rows = 16;
  o->model.max_context = 256;
  CLI::App* cmd = app.add_subcommand(
      "check-replay", "randomized padded graph replays with graph-vs-eager parity and the auditor");
  add_model_options(cmd, o->model);
  add_int_option(cmd, "--steps", o->check.steps, 1, 10000000, "decode steps");
  add_seed_option(cmd, "--seed", o->check.seed, "seed of the batch sequence");
  cmd->add_option("--inject", o->inject, "faults: stale-padding,unguarded-store (or incident)");
  cmd->add_option("--mode", o->mode, "graph | eager (the checked runner)")->capture_default_str();
  add_int_option(cmd, "--buckets", o->buckets, 1, kMaxRowsLimit,
                 "graph batch buckets, each at most --max-rows (default 1 2 4 8 12 16)");
  add_int_option(cmd, "--max-live", o->check.max_live_requests, 1, kMaxRowsLimit,
                 "concurrent sequences");
  add_int_option(cmd, "--max-request-tokens", o->check.max_request_tokens, 2, kMaxContextLimit,
                 "longest sequence (at most the context)");
  add_int_option(cmd, "--audit-sample", o->check.audit_sample, 0, 1 << 20,
                 "slots audited per step, besides those the step wrote");
  cmd->add_flag("!--no-parity", o->check.parity, "skip the eager twin run");
  cmd->callback([&run, o] {
    run = [o] {
      ModelOptions mo = o->model;
      ReplayCheckOptions ro = o->check;
      if (o->buckets.empty()) {  // the default list, up to --max-rows
        std::erase_if(ro.buckets, [&](int b) { return b > mo.max_rows; });
      } else {
        ro.buckets = o->buckets;
      }
      for (int b : ro.buckets) {
        require(b <= mo.max_rows, ErrorCode::kInvalidArgument,
                "--buckets {} exceeds --max-rows {} (raise --max-rows, at most {})", b, mo.max_rows,
                kMaxRowsLimit);
      }
      ro.max_request_tokens = std::min(ro.max_request_tokens, mo.max_context);
      ro.faults = parse_faults(o->inject);
      require(o->mode == "graph" || o->mode == "eager", ErrorCode::kInvalidArgument,
              "--mode must be graph or eager, got '{}'", o->mode);
      ro.mode = o->mode == "graph" ? RunMode::kGraph : RunMode::kEager;
      ModelStack stack = build_model_stack(mo);
      CacheConfig cc = stack.cache->config();
      stack.cache.reset();  // the check makes its own pair of caches of this shape
      fmt::print("check-replay: preset {}, backend {}, index-K {}, latent {}, faults {}, seed {}\n",
                 mo.preset, stack.backend->describe(), mo.index_k, mo.latent, ro.faults.describe(),
                 ro.seed);
      ro.progress = [](int step, int steps) {
        fmt::print(stderr, "\r  step {}/{} ", step, steps);
        if (step == steps) fmt::print(stderr, "\n");
      };
      const auto t0 = std::chrono::steady_clock::now();
      const ReplayCheckReport report = run_replay_check(*stack.model, cc, ro);
      print_report(report,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return report.clean() && report.detectors_agree() ? 0 : 1;
    };
  });
}

}  // namespace dsa::tools
