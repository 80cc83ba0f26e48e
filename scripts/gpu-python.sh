#!/usr/bin/env bash
# The Python module on the GPU. Runs ON the device, from the repository root, with
# build-gpu/lib and build-gpu/py carried (scripts/gpu-build.sh made them here). Builds dsa._dsa for
# the device's python3 (torch's) against the carried static libraries, then runs the Python tests
# (CPU and CUDA), the incident in plain torch, the host-time profile of one store call (before and
# after the attribute path) and the store/auditor bench. Files written to $OUT: python.log,
# pytest.xml, incident_torch.md, py_store_bench.json, py_store_bench.md, py_call_profile.md. The
# tables, the pytest summary and the tail of the log when a step failed also go to stdout, so a
# run whose $OUT is lost still shows them.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
B=build-gpu
LOG="$OUT/python.log"
: > "$LOG"
export LD_LIBRARY_PATH="$PWD/$B/lib:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="$PWD/$B/python"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY="${PYTHON:-python3}"
source scripts/gpu-steps.sh

build() {
  local cuda nvcc version ext pyinc pbinc
  nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  cuda="$(cd "$(dirname "$nvcc")/.." && pwd)"
  version="$(sed -n 's/^project(dsa .*VERSION \([0-9.]*\)).*/\1/p' CMakeLists.txt)"
  ext="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
  pyinc="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  pbinc="$("$PY" -c 'import pybind11; print(pybind11.get_include())')"
  [[ -f $pyinc/Python.h ]] || { echo "no Python.h under $pyinc: the device's python lacks headers"; return 1; }
  [[ -f $B/py/libdsa_backend.a ]] || { echo "carry build-gpu/py (scripts/gpu-build.sh)"; return 1; }
  mkdir -p "$B/python/dsa"
  cp python/dsa/* "$B/python/dsa/"
  echo "python $("$PY" --version 2>&1), pybind11 $("$PY" -c 'import pybind11; print(pybind11.__version__)'), CUDA at $cuda"
  g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden -Wall -Wno-unused-parameter \
    -DDSA_HAVE_CUDA=1 -DDSA_VERSION="\"$version\"" \
    -Iinclude/core -Iinclude/layout -Iinclude/backend -Isrc -I"$B/py/include" \
    -I"$pyinc" -I"$pbinc" -I"$cuda/include" \
    src/python/*.cpp "$B/py/libdsa_backend.a" "$B/py/libdsa_core.a" \
    "$B"/lib/libspdlog.so.* "$B"/lib/libfmt.so.* \
    -L"$cuda/lib64" -lcublasLt -lcublas -lcudart \
    -o "$B/python/dsa/_dsa$ext"
  "$PY" -c "import dsa; print('dsa', dsa.__version__, 'cuda built', dsa.cuda_built(), 'available', dsa.cuda_available())"
}

step nvidia-smi 20 nvidia-smi -L
export -f build
export B PY
if step build 300 bash -c build; then
  step pytest 240 "$PY" -m pytest -q -p no:cacheprovider python/tests --junitxml="$OUT/pytest.xml"
  step incident_torch 240 "$PY" python/examples/incident_torch.py --markdown "$OUT/incident_torch.md"
  step incident_numpy 120 "$PY" python/examples/incident_numpy.py
  step py_call_profile 120 "$PY" bench/gpu/py_call_profile.py --markdown "$OUT/py_call_profile.md"
  step py_store_bench 300 "$PY" bench/gpu/py_store_bench.py --json "$OUT/py_store_bench.json" \
    --markdown "$OUT/py_store_bench.md"
fi
echo
grep -E "^[0-9]+ (passed|failed)|^FAILED|^ERROR" "$LOG" | tail -n 20
for table in incident_torch.md py_call_profile.md py_store_bench.md; do
  [[ -f $OUT/$table ]] && { echo; cat "$OUT/$table"; }
done
if [[ $fails -ne 0 ]]; then
  echo
  echo "--- the last 80 lines of $LOG:"
  tail -n 80 "$LOG"
fi
echo "gpu-python: $fails step(s) failed" | tee -a "$LOG"
[[ $fails -eq 0 ]]
