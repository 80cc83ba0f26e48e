#!/usr/bin/env bash
# The serving runs. Runs ON the device, from the repository root, with the build of
# scripts/gpu-build.sh carried (build-gpu/{lib,dsa}). Writes to $OUT:
#   serve-summary.md   the client-side incident table (11 cells), the overhead/RSS figures and the
#                      prefix cache on and off
#   serve-results.json every bench-serve --json and the overhead/RSS numbers
#   serve.log          every server's and client's log
# 1. The matrix: index-K {bf16, fp8} x mode {eager, graph} x {guarded, --inject incident}, each a
#    `dsa serve --backend cuda --preset tiny` under `dsa bench-serve --sessions 60 --concurrency 60
#    --check`, every session replayed alone against a guarded eager server of the same index-K;
#    then bf16 + graph + incident again without the prefix cache, and both with --audit (the
#    clobbered slots, for the blast radius).
# 2. Server overhead: output tok/s at concurrency 60 over HTTP (bench-serve --prompt-ids) against
#    the engine driven directly (bench-engine) on the same workload, REPEATS (5) interleaved pairs
#    and their median; TTFT p50 at concurrency 1.
# 3. RSS of the server over 10,000 requests.
# 4. The prefix cache: agent sessions of 4..8 turns with the cache and with --no-prefix-cache.
# Environment: OUT (default ./gpu-out), SESSIONS (60), CONCURRENCY (60), SKIP_MATRIX=1,
# SKIP_PERF=1, SKIP_PREFIX=1, REPEATS (5), PERF_REQUESTS (600), BACKEND (cuda), PAGES (200: the
# pool runs full, as in a serving deployment), PREFIX_PAGES (1000: room for the 60 conversations'
# histories, up to 1024 tokens each, so the cache's hit rate measures the cache rather than the
# pool's size; 200 pages evict most of it).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
TMP="$(mktemp -d)"
export LD_LIBRARY_PATH="$PWD/build-gpu/lib:${LD_LIBRARY_PATH:-}"
DSA="$PWD/build-gpu/dsa"
LOG="$OUT/serve.log"
SUMMARY="$OUT/serve-summary.md"
SESSIONS="${SESSIONS:-60}"
CONCURRENCY="${CONCURRENCY:-60}"
PAGES="${PAGES:-200}"
: > "$LOG"
: > "$SUMMARY"
BACKEND="${BACKEND:-cuda}"  # cpu: a slow smoke run of this script on a machine without a GPU
MODEL=(--backend "$BACKEND" --preset tiny --max-rows 64 --pages "$PAGES")

# serve PORT ARGS...: starts a server in the background, sets SERVER_PID, and waits until /health
# answers 200; fails at once (rc 1) when the server exits first, e.g. on a bad flag.
serve() {
  local port="$1"
  shift
  echo "=== serve :$port $*" >> "$LOG"
  "$DSA" --log info serve "${MODEL[@]}" --port "$port" "$@" >> "$LOG" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "=== serve :$port exited before it was ready" | tee -a "$LOG" >&2
      return 1
    fi
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health") == 200 ]] && return 0
    sleep 0.2
  done
  echo "=== serve :$port not ready after 120 s" | tee -a "$LOG" >&2
  return 1
}
stop() {
  kill -TERM "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
bench() {  # bench NAME TIMEOUT ARGS...: runs bench-serve (serve() already waited for /health)
  local name="$1" limit="$2"
  shift 2
  echo "=== bench $name: $*" >> "$LOG"
  timeout --kill-after=5 "$limit" "$DSA" bench-serve --quiet --wait-ready 10 \
    --json "$TMP/$name.json" "$@" > "$TMP/$name.txt" 2>> "$LOG"
  local rc=$?
  cat "$TMP/$name.txt" >> "$LOG"
  echo "=== bench $name: rc=$rc" >> "$LOG"
  return $rc
}

if [[ -z ${SKIP_MATRIX:-} ]]; then
  echo "## Client-side incident table (dsa serve + dsa bench-serve --check; prefix cache on, the default)" >> "$SUMMARY"
  echo >> "$SUMMARY"
  echo "| condition | corrupted sessions (k/N, %) | replayed requests | output tok/s | TTFT p50 (ms) | auditor findings |" >> "$SUMMARY"
  echo "|---|---|---|---|---|---|" >> "$SUMMARY"
  # No tool definitions: they take ~900 of the tiny model's 1024 positions in its 1024-id
  # tokenizer, which would leave each session one turn.
  WORKLOAD=(--sessions "$SESSIONS" --concurrency "$CONCURRENCY" --turns 2..4 --input-len 48
            --output-len 24 --range-ratio 0.5 --no-tools --check)
  # cell KDT MODE FAULTS [SERVER FLAGS...]: one row of the table, against the reference on :8100.
  cell() {
    local kdt="$1" mode="$2" faults="$3"
    shift 3
    local extra=("$@") name="matrix-$kdt-$mode-$faults${*// /}"
    [[ $faults == incident ]] && extra+=(--inject incident --allow-fault-injection)
    serve 8000 --index-k "$kdt" --mode "$mode" "${extra[@]}"
    bench "$name" 540 --url http://127.0.0.1:8000 --check-url http://127.0.0.1:8100 \
      "${WORKLOAD[@]}"
    local findings
    findings="$(curl -s http://127.0.0.1:8000/metrics | awk '/^dsa:auditor_findings_total/ {print $2}')"
    stop "$SERVER_PID"
    python3 - "$TMP/$name.json" "$kdt" "$mode" "$faults" "$findings" "$*" >> "$SUMMARY" <<'PY'
import json, sys
path, kdt, mode, faults, findings, flags = sys.argv[1:7]
cond = f"{kdt} index-K + {mode} + {'incident faults' if faults == 'incident' else 'guarded'}"
if flags:
    cond += f" ({flags})"
elif faults == "incident" and mode == "graph" and kdt == "bf16":
    cond = f"**{cond}**"
try:
    j = json.load(open(path))
except Exception as e:
    print(f"| {cond} | no result ({e}) | | | | |"); sys.exit()
c = j["check"]
pct = 100.0 * c["corrupted"] / max(c["total"], 1)
audited = "--audit" in flags
print(f"| {cond} | {c['corrupted']}/{c['total']} ({pct:.0f}%) | {c['replayed_requests']} | "
      f"{j['output_throughput']:.0f} | {j['ttft_ms']['median']:.2f} | "
      f"{(findings or '?') if audited else ''} |")
PY
  }
  for kdt in bf16 fp8; do
    serve 8100 --index-k "$kdt" --mode eager  # the reference: guarded, eager, replays alone
    REF_PID=$SERVER_PID
    for mode in eager graph; do
      for faults in guarded incident; do
        cell "$kdt" "$mode" "$faults"
      done
    done
    if [[ $kdt == bf16 ]]; then
      # The incident's cell without the prefix cache, and both with the auditor counting the
      # clobbered slots: the corruption rate and the blast radius (sessions per clobbered slot)
      # with shared pages and without.
      cell bf16 graph incident --no-prefix-cache
      cell bf16 graph incident --audit
      cell bf16 graph incident --audit --no-prefix-cache
    fi
    stop "$REF_PID"
  done
  echo >> "$SUMMARY"
fi

if [[ -z ${SKIP_PERF:-} ]]; then
  echo "## Server overhead (tiny, H200, graph mode, guarded)" >> "$SUMMARY"
  echo '```' >> "$SUMMARY"
  PERF=(--input-len 64 --output-len 128)
  # Interleaved pairs (engine direct, then over HTTP, against one server left running): a single
  # pair of 0.8 s runs moves by about +-4% from run to run, so the overhead is each pair's and
  # their median.
  engine_direct() {  # engine_direct N C: one bench-engine run, its summary lines to the summary
    echo "=== bench-engine n=$1 c=$2" >> "$LOG"
    timeout 300 "$DSA" bench-engine "${MODEL[@]}" --mode graph --num-prompts "$1" \
      --concurrency "$2" "${PERF[@]}" 2>> "$LOG" | tee -a "$LOG" | sed "s/^/engine direct: /" >> "$SUMMARY"
  }
  over_http() {  # over_http NAME N C: one bench-serve run against :8000, its line to the summary
    bench "$1" 300 --url http://127.0.0.1:8000 --prompt-ids --num-prompts "$2" \
      --concurrency "$3" "${PERF[@]}"
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(f\"over HTTP: $2 requests at concurrency $3: {j['output_throughput']:.1f} output tok/s, TTFT median {j['ttft_ms']['median']:.3f} ms\")" \
      "$TMP/$1.json" >> "$SUMMARY"
  }
  serve 8000 --mode graph
  for i in $(seq "${REPEATS:-5}"); do
    engine_direct "${PERF_REQUESTS:-600}" 60
    over_http "http-c60-$i" "${PERF_REQUESTS:-600}" 60
  done
  engine_direct 50 1
  over_http http-c1 50 1
  stop "$SERVER_PID"
  python3 - "$SUMMARY" >> "$SUMMARY" <<'PY'
import re, statistics, sys
lines = open(sys.argv[1]).read().splitlines()
rate = lambda l: float(re.search(r"([0-9.]+) output tok/s", l).group(1))
eng = [rate(l) for l in lines if l.startswith("engine direct:") and "concurrency 60" in l]
http = [rate(l) for l in lines if l.startswith("over HTTP:") and "concurrency 60" in l]
pairs = [100.0 * (1.0 - h / e) for e, h in zip(eng, http)]
if pairs:
    print(f"HTTP overhead at concurrency 60: median {statistics.median(pairs):.1f}% over "
          f"{len(pairs)} interleaved pairs ({', '.join(f'{p:.1f}%' for p in pairs)})")
PY
  # RSS over 10,000 requests, sampled after every 1,000.
  serve 8000 --mode graph
  rss() { awk '/VmRSS/ {print $2}' "/proc/$SERVER_PID/status"; }
  line="RSS (KiB) after 0"
  bench "rss-warm" 120 --url http://127.0.0.1:8000 --num-prompts 64 --concurrency 64 \
    --input-len 16 --output-len 8
  line="$line: $(rss)"
  for k in 1 2 3 4 5 6 7 8 9 10; do
    bench "rss-$k" 120 --url http://127.0.0.1:8000 --num-prompts 1000 --concurrency 64 \
      --input-len 16 --output-len 8 --seed "$k"
    line="$line, ${k}k: $(rss)"
  done
  stop "$SERVER_PID"
  echo "$line" >> "$SUMMARY"
  echo '```' >> "$SUMMARY"
fi

# 4. The prefix cache: agent sessions resending their history, with the cache and without it
#    (TTFT p50 at turns >= 3 should fall by >= 3x; prefill tokens per turn ~ the new tokens).
#    Runs once `dsa serve` has --no-prefix-cache (the engine's EngineOptions::prefix_cache).
if [[ -z ${SKIP_PREFIX:-} ]] && "$DSA" serve --help 2>/dev/null | grep -q -- --no-prefix-cache; then
  echo "## Prefix cache: $SESSIONS agent sessions, 4..8 turns (graph, guarded, ${PREFIX_PAGES:-1000} pages)" >> "$SUMMARY"
  echo '```' >> "$SUMMARY"
  MODEL=(--backend "$BACKEND" --preset tiny --max-rows 64 --pages "${PREFIX_PAGES:-1000}")
  for variant in on off; do
    flags=(--mode graph)
    [[ $variant == off ]] && flags+=(--no-prefix-cache)
    serve 8000 "${flags[@]}"
    bench "prefix-$variant" 600 --url http://127.0.0.1:8000 --sessions "$SESSIONS" \
      --concurrency "$CONCURRENCY" --turns 4..8 --input-len 32 --output-len 16 --range-ratio 0.5 \
      --no-tools
    curl -s http://127.0.0.1:8000/metrics | grep -E '^dsa:prefix_cache_(queries|hits|evictions)_total' \
      | sed "s/^/prefix cache $variant: /" >> "$SUMMARY"
    stop "$SERVER_PID"
    sed "s/^/prefix cache $variant: /" "$TMP/prefix-$variant.txt" >> "$SUMMARY"
  done
  echo '```' >> "$SUMMARY"
fi

python3 - "$TMP" "$OUT/serve-results.json" <<'PY'
import glob, json, os, sys
tmp, out = sys.argv[1:3]
results = {}
for path in sorted(glob.glob(os.path.join(tmp, "*.json"))):
    try:
        results[os.path.basename(path)[:-5]] = json.load(open(path))
    except Exception as e:
        results[os.path.basename(path)[:-5]] = {"error": str(e)}
json.dump(results, open(out, "w"), indent=1)
PY
cat "$SUMMARY"
