#!/usr/bin/env bash
# Proves `pip install ./python` on this machine the way the README shows it: copies the tracked
# sources to a temporary folder (the install writes build files next to setup.py), makes a venv
# over Debian's Python, installs with Debian's setuptools (no download: --no-build-isolation
# --no-index), then imports the installed module from outside the tree and runs one guarded store
# on numpy arrays. The CPU backend is built (DSA_CUDA=OFF, the quick build); CUDA is the same
# CMake with nvcc found. Used by CTest (python.pip_install); exits non-zero on any failure.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-/usr/bin/python3}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

mkdir "$TMP/src"
if git -C "$ROOT" rev-parse --git-dir > /dev/null 2>&1; then
  git -C "$ROOT" ls-files -z | (cd "$ROOT" && tar --null -T - -cf -) | tar -xf - -C "$TMP/src"
else
  cp -r "$ROOT"/. "$TMP/src"
fi
"$PY" -m venv --system-site-packages "$TMP/venv"
DSA_CUDA=OFF DSA_BUILD_DIR="$TMP/cmake" "$TMP/venv/bin/pip" install --quiet --no-build-isolation \
  --no-index "$TMP/src/python"
cd "$TMP"
"$TMP/venv/bin/python" - <<'PY'
import numpy as np

import dsa

assert dsa.__file__.find("/venv/") > 0, f"dsa imported from {dsa.__file__}, not the venv"
pool = np.zeros((3, 64, 128), dtype=np.uint16)
slots = np.array([64, -1, 70], dtype=np.int64)
k = np.arange(3 * 128, dtype=np.float32).reshape(3, 128)
errors = dsa.store_index_k(pool, slots, k, 2)
flat = pool.reshape(-1, 128)
assert int(np.asarray(errors)[0]) == 0
assert flat[64].view(np.uint16).any() and not flat[70].any(), "rows < n_real only"
print(f"pip install ./python: dsa {dsa.__version__} from {dsa.__file__}: a guarded store ran")
PY
