#!/usr/bin/env bash
# Installs what building and testing tide needs on Debian 12: Meson, Ninja, CMake (the CMake
# package tests), OpenBLAS (the transformer model), GoogleTest, Google Benchmark, Open MPI,
# nlohmann/json (policy files, tide-plan), liburing (the storage tier's io_uring), Doxygen (the API
# reference), and Python's jsonschema and matplotlib (the file formats' schemas, tide-plan's PNG).
# The CUDA toolkit is optional (the CUDA targets are compiled when nvcc is found). Does nothing
# when everything is already there.
set -euo pipefail
pkgs=(meson ninja-build g++ pkg-config python3 cmake libopenblas-dev libgtest-dev libbenchmark-dev libopenmpi-dev openmpi-bin
      nlohmann-json3-dev doxygen liburing-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
python_modules() {
  python3 -c "import jsonschema, matplotlib" 2>/dev/null && return 0
  echo "tide: installing Python's jsonschema and matplotlib" >&2
  if [ "$(command -v python3)" = /usr/bin/python3 ]; then  # Debian's Python: its packages
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q python3-jsonschema python3-matplotlib >/dev/null
  else
    python3 -m pip install -q jsonschema matplotlib >/dev/null
  fi
}
# cuFile (GPUDirect Storage), when there is a CUDA toolkit without it: the nvidia-cufile wheel's
# headers and library, into a directory of tide's own (tools/find_nvidia_lib.py looks there). Optional:
# without it the CUDA backend stages spilled slots through the pinned ring.
cufile() {
  local nvcc_path
  nvcc_path=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null) || return 0
  [ -n "$(python3 "$(dirname "$0")/find_nvidia_lib.py" cufile "$(dirname "$(dirname "$nvcc_path")")")" ] && return 0
  local dir="${TIDE_CUFILE_DIR:-$HOME/.cache/tide/nvidia-cufile}" cu
  cu=$("$nvcc_path" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  echo "tide: installing cuFile (the nvidia-cufile wheel for CUDA $cu) into $dir" >&2
  python3 -m pip install -q --no-deps --target "$dir" "$([ "$cu" = 12 ] && echo nvidia-cufile-cu12 || echo nvidia-cufile)" >/dev/null 2>&1 ||
    echo "tide: could not install nvidia-cufile (no network?): the CUDA backend builds without GPUDirect Storage" >&2
}
[ ${#missing[@]} -eq 0 ] && { python_modules; cufile; exit 0; }
echo "tide: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || {
  $sudo apt-get update -q >/dev/null
  $sudo apt-get install -y -q "${missing[@]}" >/dev/null
}
python_modules
cufile
