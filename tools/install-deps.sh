#!/usr/bin/env bash
# Installs what building and testing tide needs on Debian 12: Meson, Ninja, CMake (the CMake
# package tests), OpenBLAS (the transformer model), GoogleTest, Google Benchmark, Open MPI. The
# CUDA toolkit is optional (the CUDA targets are compiled when nvcc is found). Does nothing when
# everything is already there.
set -euo pipefail
pkgs=(meson ninja-build g++ pkg-config python3 cmake libopenblas-dev libgtest-dev libbenchmark-dev libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "tide: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
  $sudo apt-get update -q >/dev/null
  $sudo apt-get install -y -q "${missing[@]}" >/dev/null
}
