#!/usr/bin/env bash
# offline-gpu-machine.sh CMD...: runs CMD as on the GPU machines tide's check script is meant for:
# no network at all, and neither Debian's GoogleTest nor Google Benchmark installed. It runs CMD in
# its own mount and network namespaces, with those packages' files whited out by overlays, so
# nothing on this machine changes. Needs root (unshare, mount); Debian 12 paths.
#   tools/offline-gpu-machine.sh bash bench/gpu/check.sh --dry-run
# (tools/test.sh runs the GPU check's dry run under it, so that CI walks the GPU machine's path.)
# OFFLINE_NO_CMAKE=1 also hides cmake, ctest and cpack (a bare CUDA image may have no CMake;
# tools/test.sh sets it: tide's setup needs no cmake program).
set -u
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
unshare -m -n bash -c '
set -e
w='"$w"'
hide() {  # hide DIR NAME...: overlay DIR with whiteouts for NAME...
  local dir=$1; shift
  local k; k=$(echo "$dir" | tr / _)
  mkdir -p "$w/$k.up" "$w/$k.work"
  for n in "$@"; do mknod "$w/$k.up/$n" c 0 0; done
  mount -t overlay overlay -o lowerdir="$dir",upperdir="$w/$k.up",workdir="$w/$k.work" "$dir"
}
L=/usr/lib/x86_64-linux-gnu
hide $L libbenchmark.so libbenchmark.so.1.7.1 libbenchmark.so.1debian libbenchmark_main.a libgmock.a libgmock_main.a libgtest.a libgtest_main.a
hide $L/pkgconfig gtest.pc gtest_main.pc gmock.pc gmock_main.pc benchmark.pc
hide $L/cmake GTest benchmark
hide /usr/include gtest gmock benchmark
hide /usr/src googletest
if [ "${OFFLINE_NO_CMAKE:-0}" = 1 ]; then hide /usr/bin cmake ctest cpack; fi
exec "$@"' bash "$@"
