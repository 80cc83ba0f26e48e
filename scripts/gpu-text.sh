#!/usr/bin/env bash
# The text layer against Hugging Face `tokenizers` (Python), on the device's CPU, where that package
# is installed. Runs ON the device from the repository root, with build-gpu/{lib,dsa,bench} carried
# and the DeepSeek-V3 tokenizer directory given as TOKENIZER_DIR (default
# ../shared/data/deepseek-v3-tokenizer). One thread each, on the same corpus, in the same run:
#   dsa_bench_text (C++ encode MB/s and ns/token), hf_tokenizer_bench.py (Python tokenizers, and
#   `dsa tokenize` equal ids for the corpus), check_tokenizer_goldens.py (the committed goldens
#   re-encoded by Python tokenizers). Writes $OUT/text.log and $OUT/text-summary.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
DIR="${TOKENIZER_DIR:-../shared/data/deepseek-v3-tokenizer}"
export LD_LIBRARY_PATH="$PWD/build-gpu/lib:${LD_LIBRARY_PATH:-}"
export TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1
LOG="$OUT/text.log"
: > "$LOG"
source scripts/gpu-steps.sh
step cpu 10 bash -c "lscpu | grep -E 'Model name|^CPU\\(s\\)'"
step dsa-encode 240 build-gpu/bench/dsa_bench_text --tokenizer-dir "$DIR" \
  --benchmark_filter='EncodeMixed|EncodeTokens' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true
step hf-encode 240 python3 bench/text/hf_tokenizer_bench.py --tokenizer-dir "$DIR" \
  --dsa build-gpu/dsa
step goldens 120 python3 scripts/check_tokenizer_goldens.py --deepseek-dir "$DIR"
{
  echo "# Text layer vs Python tokenizers ($(date -u +%F), device CPU)"
  echo '```'
  grep -E "Encode|MB/s|ns/token|identical|same ids|Model name" "$LOG"
  echo '```'
} > "$OUT/text-summary.md"
echo "gpu-text: $fails step(s) failed" | tee -a "$LOG"
[[ $fails -eq 0 ]]
