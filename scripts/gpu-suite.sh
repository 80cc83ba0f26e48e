#!/usr/bin/env bash
# The GPU suite. Runs ON the device, from the repository root, with the build of
# scripts/gpu-build.sh carried (build-gpu/{lib,tests,bench,dsa}). One run tells everything:
#   parity tests (gtest JSON), CPU tests, compute-sanitizer (memcheck, racecheck, initcheck,
#   synccheck) over a short parity filter, memcheck and racecheck over graph-replayed decode (the
#   CUDA graph tests and a short check-replay), dsa_gpu_bench, the torch baselines, the report.
# Every step has a timeout and the suite goes on after a failure. Files written to $OUT (a few,
# logs concatenated): summary.md, results.json, suite.log, parity.json, bench_merged.json.
# Environment: OUT (default ./gpu-out), SANITIZER_FILTER (gtest filter for the sanitizer runs),
# SANITIZER_TIMEOUT (s per tool, default 50), RACECHECK_TIMEOUT (s per racecheck run, default 150:
# on 2026-12-03 every racecheck run passed 45 s without a report), SKIP_PARITY=1 and SKIP_BENCH=1
# (sanitizers only).
set -uo pipefail
cd "$(dirname "$0")/.."

source scripts/gpu-steps.sh
steps_setup suite.log
TMP="$(mktemp -d)"
rm -f "$STEPS"
STEPS="$TMP/steps.tsv"  # name, rc, seconds, note (kept out of OUT)
: > "$STEPS"
# Sparse MLA's and top-k's batch-invariance families (up to 256 rows of 2048 tokens, 40000
# logits) are too long for racecheck's budget: their parity cases (every split shape of sparse
# MLA, padded and short rows; sliced and unsliced top-k rows) stand in for them.
SANITIZER_FILTER="${SANITIZER_FILTER:-ParityStore.LargeBatchMatchesCpu:ParityOps.Hadamard:ParityOps.Softmax:ParityOps.RmsNorm:ParityAttention.IndexerLogitsBatchInvariant:ParityAttention.SparseMlaMatchesCpu:ParityAttention.TopkMatchesCpuExactly}"

step nvidia-smi 20 nvidia-smi
# Tensor cores in the SASS of the kernels (the dsa program links all of them), per kernel.
step sass 60 bash -c "cuobjdump --dump-sass build-gpu/dsa | awk '/Function :/ {f=\$3} /HMMA|HGMMA|QMMA|QGMMA/ {match(\$0, /[HQ]G?MMA[.A-Z0-9]*/); c[f\" \"substr(\$0, RSTART, RLENGTH)]++} END {for (k in c) print c[k], k}' | sort -k2"
[[ -n ${SKIP_PARITY:-} ]] || step parity 150 "$B/tests/dsa_parity_tests" --gtest_output="json:$OUT/parity.json"
# The CPU tests (dsa_tests) run in CI; device time goes to what needs the GPU.

for tool in memcheck racecheck initcheck synccheck; do
  limit="${SANITIZER_TIMEOUT:-50}"
  [[ $tool == racecheck ]] && limit="${RACECHECK_TIMEOUT:-150}"
  sanitize "sanitizer-$tool" "$tool" "$limit" "$B/tests/dsa_parity_tests" \
    --gtest_filter="$SANITIZER_FILTER" --gtest_brief=1
done
# memcheck and racecheck over graph-replayed decode too: the graph tests replay captured CUDA
# graphs with padded rows and planted garbage, and a short check-replay drives the runner's
# buckets (graph launches of the whole decode step) with the auditor's kernels on.
GRAPH_FILTER="${GRAPH_SANITIZER_FILTER:-IndexK/ParityGraph.*}"
for tool in memcheck racecheck; do
  limit="${SANITIZER_TIMEOUT:-50}"
  [[ $tool == racecheck ]] && limit="${RACECHECK_TIMEOUT:-150}"
  sanitize "sanitizer-$tool-graph" "$tool" "$limit" "$B/tests/dsa_parity_tests" \
    --gtest_filter="$GRAPH_FILTER" --gtest_brief=1
  sanitize "sanitizer-$tool-replay" "$tool" "$limit" "$B/dsa" --log error check-replay \
    --backend cuda --steps 40 --buckets 1 4 16 --no-parity
done

if [[ -z ${SKIP_BENCH:-} ]]; then
step dsa_gpu_bench 150 "$B/bench/dsa_gpu_bench" --json "$TMP/dsa_bench.json"
torch_jsons=()
for script in bench/gpu/torch_*.py; do
  [[ -f $script ]] || continue
  stem="$(basename "$script" .py)"
  step "$stem" 60 python3 "$script" --json "$TMP/$stem.json"
  [[ -f $TMP/$stem.json ]] && torch_jsons+=("$TMP/$stem.json")
done
if [[ -f $TMP/dsa_bench.json ]]; then
  step report 20 python3 bench/gpu/report.py --dsa "$TMP/dsa_bench.json" \
    --torch "${torch_jsons[@]}" --markdown "$TMP/report.md" --json "$OUT/bench_merged.json"
fi

fi  # SKIP_BENCH

# summary.md and results.json: every step's status, the gtest counts, the sanitizer error
# counts (from the log), and the bench report.
python3 - "$STEPS" "$LOG" "$OUT" "$TMP/report.md" <<'PY'
import json, os, re, sys
steps_path, log_path, out, report = sys.argv[1:5]
log = open(log_path, errors="replace").read()
steps = []
for line in open(steps_path):
    name, rc, secs, note = (line.rstrip("\n").split("\t") + [""])[:4]
    s = {"name": name, "rc": int(rc), "seconds": int(secs), "note": note}
    begin = log.find(f"=== {name}: ")
    section = log[begin:log.find(f"=== {name}: rc=", begin)] if begin >= 0 else ""
    if name.startswith("sanitizer-"):
        m = re.findall(r"ERROR SUMMARY: (\d+) error", section) or \
            re.findall(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error", section)
        s["errors"] = int(m[-1]) if m else None
        s["racecheck_hazards"] = re.findall(r"RACECHECK SUMMARY: (\d+) hazard", section)
    m = re.findall(r"\[  PASSED  \] (\d+) test", section)
    if m: s["passed"] = int(m[-1])
    m = re.findall(r"\[  FAILED  \] (\d+) test", section)
    if m: s["failed"] = int(m[-1])
    m = re.findall(r"\[  SKIPPED \] (\d+) test", section)
    if m: s["skipped"] = int(m[-1])
    steps.append(s)
failures = []
pj = os.path.join(out, "parity.json")
if os.path.exists(pj):
    g = json.load(open(pj))
    for suite in g.get("testsuites", []):
        for t in suite.get("testsuite", []):
            for f in t.get("failures", []):
                failures.append(f"{suite['name']}.{t['name']}: {f.get('failure', '')[:600]}")
ok = all(s["rc"] == 0 for s in steps)
lines = ["# GPU suite", "", f"overall: {'PASS' if ok else 'FAIL'}", "",
         "| step | rc | s | passed | failed | skipped | sanitizer errors | note |",
         "|---|---|---|---|---|---|---|---|"]
for s in steps:
    lines.append(f"| {s['name']} | {s['rc']} | {s['seconds']} | {s.get('passed', '')} | "
                 f"{s.get('failed', '')} | {s.get('skipped', '')} | {s.get('errors', '')} | "
                 f"{s['note']} |")
if failures:
    lines += ["", "## parity failures (first 20)", ""] + [f"- {f}" for f in failures[:20]]
if os.path.exists(report):
    lines += ["", open(report).read()]
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
json.dump({"ok": ok, "steps": steps, "parity_failures": failures},
          open(os.path.join(out, "results.json"), "w"), indent=2)
PY
rm -rf "$TMP"
echo
cat "$OUT/summary.md"
