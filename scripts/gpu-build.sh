#!/usr/bin/env bash
# Builds the GPU suite on a machine without a GPU: preset "gpu" (build-gpu/, Release, CUDA ON),
# then copies the shared libraries the binaries need that the device image lacks (fmt, spdlog,
# gtest, benchmark, xxhash, ...) into build-gpu/lib/, so the carried build runs on the device.
# The device image brings its own CUDA and C/C++ runtime; those are never copied.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake --preset gpu
cmake --build --preset gpu -j "${JOBS:-2}" --target dsa_parity_tests dsa_gpu_bench dsa_tests dsa \
  dsa_bench_text

bins=(build-gpu/tests/dsa_parity_tests build-gpu/tests/dsa_tests build-gpu/bench/dsa_gpu_bench
      build-gpu/bench/dsa_bench_text build-gpu/dsa)
mkdir -p build-gpu/lib
rm -f build-gpu/lib/*
for bin in "${bins[@]}"; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    # CUDA: the device has its own (13.0), matched to its driver.
    libcuda.so*|libcudart*|libcublas*|libcublasLt*|libnvrtc*|libnvJitLink*) continue ;;
    # The C and C++ runtime: the device's (Ubuntu 24.04) are newer and compatible.
    libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*|libpthread*|libdl.so*|librt.so*) continue ;;
  esac
  case "$lib" in /usr/local/cuda*) continue ;; esac
  cp -L "$lib" build-gpu/lib/
  echo "bundled $(basename "$lib")"
done

# The Python module is compiled on the device, for its own interpreter (scripts/gpu-python.sh):
# it needs the rooms it links, built here, and the fmt headers the device lacks.
rm -rf build-gpu/py
mkdir -p build-gpu/py/include
cp build-gpu/libdsa_backend.a build-gpu/libdsa_core.a build-gpu/py/
cp -r /usr/include/fmt build-gpu/py/include/
echo "python module inputs in build-gpu/py"

echo
echo "binaries and bundled libraries (carry these):"
du -ch "${bins[@]}" build-gpu/lib build-gpu/py | sed 's/^/  /'
