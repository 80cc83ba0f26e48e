#!/usr/bin/env bash
# Installs the Debian 12 packages dsa.cpp builds with, then configures and builds it.
#   scripts/setup.sh            packages + build (preset "default": CUDA when nvcc is found)
#   DSA_PRESET=cpu scripts/setup.sh   another CMake preset
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config git
          libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
          libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev libpcre2-dev
          pybind11-dev python3-dev python3-numpy python3-pytest python3-pip python3-setuptools
          python3-wheel python3-venv clang-format ccache curl)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 || "${CI:-}" == "true" ]]; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "setup: installing ${missing[*]:-(refreshing)}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${packages[@]}"
fi

preset="${DSA_PRESET:-default}"
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$(nproc)"
