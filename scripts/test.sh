#!/usr/bin/env bash
# Sets up (packages + build) and runs the whole test suite under CTest. On a machine without a
# GPU the CUDA parity tests are compiled and skip at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
preset="${DSA_PRESET:-default}"
ctest --preset "$preset" -j "$(nproc)"
