# Sourced by the device scripts (gpu-suite.sh, gpu-attn.sh, gpu-python.sh): one timed step.
# step NAME TIMEOUT_S COMMAND...: runs COMMAND under a timeout, appends its output to $LOG between
# "=== NAME: ..." lines, counts a failure in $fails, records "name rc seconds note" in $STEPS
# when that is set, and returns the command's status (124 or 137: it ran past the timeout).
# steps_setup LOG_NAME: the device scripts' common setting (run from the repository root): OUT
# (default ./gpu-out), B (the carried build), its libraries on LD_LIBRARY_PATH, and empty $LOG
# (OUT/LOG_NAME) and $STEPS files.
# sanitize NAME TOOL TIMEOUT_S COMMAND...: COMMAND under compute-sanitizer's TOOL as one step
# (exit 17 on an error, 30 reports at most; racecheck reports every hazard, not only errors).
# sanitize_parity TIMEOUT_S FILTER: memcheck and racecheck over those parity tests.
# budgeted NAME TIMEOUT_S COMMAND...: `step` with its timeout cut to what is left before $DEADLINE
# (a SECONDS value the script sets), skipped (status 1) with under 15 s left: a script kept
# within one device call.
# budget_setup LOG_NAME BUDGET_S: steps_setup, then DEADLINE (BUDGET_S from now, for `budgeted`),
# P (the parity tests), DSA (the dsa binary), and the card's name and clocks as the first step.
# budgeted_parity TIMEOUT_S COMMAND...: `budgeted parity`; a parity step that runs out of time (a
# kernel that hangs would hang every step after it) ends the budget there.
# expect_incident COMMAND...: runs a `check-replay --inject incident` COMMAND (exit 1 by design)
# and passes when it says CORRUPTION FOUND with its detectors agreeing (no "DISAGREE" line);
# exported, for `step NAME T bash -c 'expect_incident "$@"' _ COMMAND...`.
# attention_summary TITLE: joins $OUT/bench.json and $OUT/torch_attention.json into
# $OUT/report.md (bench/gpu/report.py, as a step), then writes $OUT/summary.md (the steps' table
# and the report) and prints it.
# steps_summary TITLE: prints a markdown table of the steps in $STEPS with the gtest counts and
# sanitizer summaries found in each step's part of $LOG, then the failed tests.
fails=0
SAN="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
steps_setup() {
  OUT="${OUT:-$PWD/gpu-out}"
  mkdir -p "$OUT"
  B=build-gpu
  export LD_LIBRARY_PATH="$PWD/$B/lib:${LD_LIBRARY_PATH:-}"
  export PYTHONUNBUFFERED=1
  LOG="$OUT/$1"
  STEPS="$OUT/steps.tsv"  # name, rc, seconds, note
  : > "$LOG"
  : > "$STEPS"
}

step() {
  local name="$1" limit="$2"
  shift 2
  echo "=== $name: $* (timeout ${limit}s)" | tee -a "$LOG"
  local start=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  local note=""
  [[ $rc -eq 124 || $rc -eq 137 ]] && note="TIMEOUT"
  [[ $rc -ne 0 ]] && fails=$((fails + 1))
  [[ -n ${STEPS:-} ]] && printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" "$note" >> "$STEPS"
  echo "=== $name: rc=$rc $note in $((SECONDS - start))s" | tee -a "$LOG"
  return $rc
}

sanitize() {
  local name="$1" tool="$2" limit="$3"
  shift 3
  local extra=()
  [[ $tool == racecheck ]] && extra=(--racecheck-report all)
  step "$name" "$limit" "$SAN" --tool "$tool" "${extra[@]}" --error-exitcode 17 --print-limit 30 "$@"
}

# sanitize_parity TIMEOUT_S FILTER: memcheck, then racecheck, over the parity tests FILTER names,
# each one step (sanitizer-memcheck, sanitizer-racecheck).
sanitize_parity() {
  local limit="$1" filter="$2" tool
  for tool in memcheck racecheck; do
    sanitize "sanitizer-$tool" "$tool" "$limit" "$B/tests/dsa_parity_tests" \
      --gtest_filter="$filter" --gtest_brief=1
  done
}

budget_setup() {
  steps_setup "$1"
  DEADLINE=$((SECONDS + $2))
  P="$B/tests/dsa_parity_tests"
  DSA="$B/dsa"
  step nvidia-smi 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
}

budgeted_parity() {
  budgeted parity "$@"
  local rc=$?
  ((rc == 124 || rc == 137)) && DEADLINE=$SECONDS
  return $rc
}

budgeted() {
  local name="$1" limit="$2" left=$((DEADLINE - SECONDS))
  shift 2
  if ((left < 15)); then
    echo "=== $name: skipped (the script's budget is spent)" | tee -a "$LOG"
    return 1
  fi
  step "$name" $((left < limit ? left : limit)) "$@"
}

expect_incident() {
  local text
  text="$("$@" 2>&1)"
  echo "$text"
  grep -q "verdict      CORRUPTION FOUND" <<< "$text" && ! grep -q "DISAGREE" <<< "$text"
}
export -f expect_incident

# log_section NAME: the log's part of step NAME: its opening "=== NAME: " line (the command) and
# what it printed, up to its closing "=== NAME: rc=..." line.
log_section() {
  awk -v n="=== $1: " 'index($0, n) == 1 {on = !on} on' "$LOG"
}

# pack_json ARCHIVE: every JSON in $OUT into $OUT/ARCHIVE, the JSONs and steps.tsv removed (a
# device call brings back at most 8 files).
pack_json() {
  (cd "$OUT" && tar -czf "$1" ./*.json && rm -f ./*.json steps.tsv)
}

steps_summary() {
  echo "# $1"
  echo
  echo "| step | rc | s | note | gtest / sanitizer |"
  echo "|---|---|---|---|---|"
  local name rc secs note section facts
  while IFS=$'\t' read -r name rc secs note; do
    section="$(log_section "$name")"
    facts="$(grep -hoE '\[  (PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?|ERROR SUMMARY: [0-9]+ errors?|RACECHECK SUMMARY: [0-9]+ hazards?[^)]*\)' <<< "$section" | tr '\n' ' ')"
    echo "| $name | $rc | $secs | $note | $facts |"
  done < "$STEPS"
  echo
  grep -h '^\[  FAILED  \]' "$LOG" | sort -u | head -20
  echo
}

attention_summary() {
  if [[ -f $OUT/bench.json ]]; then
    step report 10 python3 bench/gpu/report.py --dsa "$OUT/bench.json" \
      --torch "$OUT/torch_attention.json" --markdown "$OUT/report.md"
  fi
  {
    steps_summary "$1"
    [[ -f $OUT/report.md ]] && cat "$OUT/report.md"
  } > "$OUT/summary.md"
  cat "$OUT/summary.md"
}
