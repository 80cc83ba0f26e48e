#!/usr/bin/env bash
# The runtime half of the GPU runs. Runs ON the device from the repository root, with the build of
# scripts/gpu-build.sh carried: the decode step (graph replay vs eager, V3.2 dims and tiny), the
# replay check through real CUDA graphs (guarded, then the incident), the stress matrix (tiny, and
# V3.2 dims with two layers), and the incident cell at 240 sessions. ONLY=REGEX runs only the steps
# whose names match (e.g. ONLY='stress' or ONLY='decode-v32'). Writes $OUT/runtime.json and
# $OUT/runtime.log; prints a summary last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
TMP="$(mktemp -d)"
: > "$TMP/steps.tsv"
export LD_LIBRARY_PATH="$PWD/build-gpu/lib:${LD_LIBRARY_PATH:-}"
DSA=build-gpu/dsa
LOG="$OUT/runtime.log"
: > "$LOG"

run() {  # run NAME TIMEOUT COMMAND...
  local name="$1" limit="$2"
  shift 2
  [[ -n ${ONLY:-} && ! $name =~ $ONLY ]] && return 0
  echo "=== $name: $*" | tee -a "$LOG"
  local start=$SECONDS
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: rc=$rc in $((SECONDS - start))s" | tee -a "$LOG"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$TMP/steps.tsv"
}

run decode-v32-invariant 150 "$DSA" bench-decode --backend cuda --preset v32 --layers 1 \
  --batches 1 8 64 256 --context 4096 --iters 10 --gemm invariant --profile \
  --json "$TMP/decode_v32_inv.json"
run decode-v32-fast 150 "$DSA" bench-decode --backend cuda --preset v32 --layers 1 \
  --batches 1 8 64 256 --context 4096 --iters 10 --gemm fast --json "$TMP/decode_v32_fast.json"
run decode-tiny 60 "$DSA" bench-decode --backend cuda --preset tiny --layers 0 \
  --batches 1 8 64 256 --context 1000 --iters 20 --json "$TMP/decode_tiny.json"
run check-replay-guarded 90 "$DSA" check-replay --backend cuda --steps 3000 --seed 7
run check-replay-incident 60 "$DSA" check-replay --backend cuda --steps 600 --seed 7 --inject incident
run check-replay-incident-fp8 60 "$DSA" check-replay --backend cuda --steps 600 --seed 7 \
  --inject incident --index-k fp8
# The stress matrix: the default one (60 sessions at concurrency 60 per cell), then the incident
# cell's exact reproduction of the H200 report that exposed a missed same-step clobber. Both exit
# by the fingerprint and print oracle_clobbers / auditor_found per faulted cell; their JSON is
# kept whole in $OUT as well as inside runtime.json.
run stress-cuda 300 "$DSA" stress --backend cuda --sessions 60 --concurrency 60 \
  --json "$TMP/stress.json" --plot "$OUT/stress.svg"
run stress-cuda-incident-240 300 "$DSA" stress --backend cuda --sessions 240 --concurrency 120 \
  --index-k bf16 --mode all --seed 424242 --json "$TMP/stress_incident_240.json"
# V3.2 dims, two layers, concurrency 60: the guarded cells' tokens/s with the real projection and
# attention shapes (synthetic weights), every cell compared with its eager cache-off references.
run stress-cuda-v32-2layers 300 "$DSA" stress --backend cuda --preset v32 --layers 2 \
  --sessions 60 --concurrency 60 --index-k all --json "$TMP/stress_v32.json"
cp "$TMP"/stress*.json "$OUT/" 2>/dev/null

python3 - "$TMP" "$OUT/runtime.json" <<'PY'
import glob, json, os, sys
tmp, out = sys.argv[1:3]
res = {"steps": []}
for line in open(os.path.join(tmp, "steps.tsv")):
    name, rc, secs = line.split()
    res["steps"].append({"name": name, "rc": int(rc), "seconds": int(secs)})
for path in glob.glob(os.path.join(tmp, "*.json")):
    res[os.path.basename(path)[:-5]] = json.load(open(path))
json.dump(res, open(out, "w"), indent=2)
print("runtime summary:")
for s in res["steps"]:
    print(f"  {s['name']:28s} rc={s['rc']} {s['seconds']}s")
PY
