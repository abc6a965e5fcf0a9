#!/usr/bin/env bash
# How long a translation unit that builds a 61-layer constexpr schedule takes to compile, against
# the same translation unit without the schedule (same includes) and an empty one. Best of N.
set -euo pipefail
cd "$(dirname "$0")/.."
cxx=${CXX:-g++}
n=${1:-3}
src=bench/compile_time/schedule61.cpp
best() {
  local b=999999
  for _ in $(seq "$n"); do
    local t0 t1
    t0=$(date +%s%N)
    "$cxx" -std=c++20 -O2 -Iinclude "$@" -c -o /dev/null
    t1=$(date +%s%N)
    b=$(( (t1 - t0) / 1000000 < b ? (t1 - t0) / 1000000 : b ))
  done
  echo "$b"
}
echo 'int main() { return 0; }' > /tmp/tide_empty.cpp
empty=$(best /tmp/tide_empty.cpp)
includes=$(best -DTIDE_EMPTY "$src")
sched=$(best "$src")
echo "compile time ($cxx, -O2, best of $n): empty TU ${empty} ms; <tide/tide.hpp> only ${includes} ms; 61-layer constexpr schedule ${sched} ms (+$((sched - includes)) ms for the schedule, +$((sched - empty)) ms over an empty TU)"
