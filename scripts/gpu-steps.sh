# Sourced by the device scripts (gpu-suite.sh, gpu-attn.sh, gpu-python.sh): one timed step.
# step NAME TIMEOUT_S COMMAND...: runs COMMAND under a timeout, appends its output to $LOG between
# "=== NAME: ..." lines, counts a failure in $fails, records "name rc seconds note" in $STEPS
# when that is set, and returns the command's status (124 or 137: it ran past the timeout).
fails=0
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
