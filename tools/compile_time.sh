#!/usr/bin/env bash
# What including tide costs (issue 41): CPU seconds (user + system) of one compile at -O2, best of N
# (default 3), for the translation units a user meets first:
#   empty         an empty main (the compiler's own start-up)
#   std           a TU with <vector>, <string>, <algorithm>, <functional>, <thread>, <random>, <sstream>
#   umbrella      #include <tide/tide.hpp> and an empty main
#   readme        the README's first C++ program (a compile-time stack, one step on the host backend)
#   runtime       bench/compile_time/runtime_stack.cpp (a run-time stack, one step on the host backend)
#   schedule61    bench/compile_time/schedule61.cpp (a 61-layer constexpr schedule)
#   transformer   examples/transformer/main.cpp (a run-time-stack trainer; needs OpenBLAS's headers)
#   tide-plan     tools/tide-plan/main.cpp (needs nlohmann/json)
#   cuda          examples/cuda_stack/main.cu with nvcc (sm_90; needs nvcc)
#   library       src/tide.cpp, separate compilation's library (once)
# each header-only and in separate compilation (-DTIDE_SEPARATE_COMPILATION, include/tide/core/config.hpp:
# the library, src/tide.cpp, is timed once as "library"), then the phases g++ -ftime-report names
# for the README program in both modes.
#
# Usage: tools/compile_time.sh [--instructions] [N] [NAME...]   (CXX, NVCC override the compilers)
# CPU seconds, not wall: this is a benchmark to read side by side in one run, not a timed test.
# --instructions counts the instructions the compiler executes instead (billions, under Valgrind's
# cachegrind, one run each, about 25x slower): the same on every run, so a change's cost can be read
# on a machine whose speed drifts (this repository's VM ran 1x-2x within a day); seconds, not
# instructions, are what issue 41's goals are in, and the two do not scale alike (parsing the
# standard headers takes more time per instruction than tide's), so read instruction counts as
# before/after and time as the goal.
set -euo pipefail
cd "$(dirname "$0")/.."
cxx=${CXX:-g++}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
n=3
count=seconds
if [[ ${1:-} == --instructions ]]; then count=instructions; shift; fi
if [[ ${1:-} =~ ^[0-9]+$ ]]; then n=$1; shift; fi
if [[ $count == instructions ]]; then
  command -v valgrind >/dev/null || { echo "compile_time.sh: --instructions needs valgrind (Debian: apt install valgrind)" >&2; exit 2; }
  n=1  # deterministic
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '%s\n' '#include <algorithm>' '#include <functional>' '#include <random>' '#include <sstream>' '#include <string>' \
  '#include <thread>' '#include <vector>' \
  'int main() { std::vector<std::string> v{"b", "a"}; std::sort(v.begin(), v.end()); std::ostringstream s; s << v[0];' \
  '  std::mt19937 g(1); std::function<int()> f = [&] { return int(g() % 2); }; std::thread t([] {}); t.join(); return f(); }' \
  >"$work/std.cpp"
echo 'int main() { return 0; }' >"$work/empty.cpp"
printf '%s\n' '#include <tide/tide.hpp>' 'int main() { return 0; }' >"$work/umbrella.cpp"
awk '/^```cpp/ {f = 1; n++; next} /^```/ {f = 0} f && n == 1' README.md >"$work/readme.cpp"

openblas=$(pkg-config --cflags openblas 2>/dev/null || true)
json=$(pkg-config --cflags nlohmann_json 2>/dev/null || true)
cccl=$(dirname "$(dirname "$nvcc")")/include/cccl

# cpu_seconds COMMAND...: CPU seconds of COMMAND and its children, best of n; "-" if it fails.
# With --instructions: the instructions COMMAND and its children executed, in billions.
cpu_seconds() {
  if [[ $count == instructions ]]; then
    # Valgrind exits with the compiler's status; its report and the compiler's errors share stderr.
    if ! valgrind --tool=cachegrind --cache-sim=no --trace-children=yes --cachegrind-out-file=/dev/null "$@" \
        >/dev/null 2>"$work/err"; then
      echo "-"
      echo "compile_time.sh: '$*' failed: $(grep -v '^==' "$work/err" | head -c 400)" >&2
      return
    fi
    awk '/I +refs:/ {gsub(",", "", $4); s += $4} END {printf "%.3f", s / 1e9}' "$work/err"
    echo
    return
  fi
  local best="" i t
  for ((i = 0; i < n; i++)); do
    local TIMEFORMAT='%U %S'
    t=$({ time "$@" >/dev/null 2>"$work/err" || echo FAIL; } 2>&1 | tail -n 1)
    if [[ $t == FAIL* ]] || ! [[ $t =~ ^[0-9.]+\ [0-9.]+$ ]]; then
      echo "-"
      echo "compile_time.sh: '$*' failed: $(head -c 400 "$work/err")" >&2
      return
    fi
    t=$(awk -v a="${t% *}" -v b="${t#* }" 'BEGIN {printf "%.2f", a + b}')
    [[ -z $best ]] || awk -v a="$t" -v b="$best" 'BEGIN {exit !(a < b)}' && best=$t
  done
  echo "$best"
}

host=(-std=c++20 -O2 -Iinclude -c -o /dev/null)
declare -A cmd
cmd[empty]="$cxx ${host[*]} $work/empty.cpp"
cmd[std]="$cxx ${host[*]} $work/std.cpp"
cmd[umbrella]="$cxx ${host[*]} $work/umbrella.cpp"
cmd[readme]="$cxx ${host[*]} $work/readme.cpp"
cmd[runtime]="$cxx ${host[*]} bench/compile_time/runtime_stack.cpp"
cmd[schedule61]="$cxx ${host[*]} bench/compile_time/schedule61.cpp"
cmd[transformer]="$cxx ${host[*]} -Iexamples/common -Iexamples/transformer $openblas examples/transformer/main.cpp"
cmd[tide-plan]="$cxx ${host[*]} -Iexamples/common $json tools/tide-plan/main.cpp"
cmd[cuda]="$nvcc -std=c++20 -O2 -arch=sm_90 -Iinclude -I$cccl -Iexamples/common -Iexamples/cuda_stack -c -o /dev/null examples/cuda_stack/main.cu"
names=("$@")
((${#names[@]})) || names=(empty std umbrella readme runtime schedule61 transformer tide-plan cuda library)
separate=-DTIDE_SEPARATE_COMPILATION

if [[ $count == instructions ]]; then
  echo "compile cost: instructions executed (billions, cachegrind) by one compile, -O2; $($cxx --version | head -n 1); $(date -u '+%Y-%m-%d %H:%M')"
else
  echo "compile time: CPU seconds (user + sys) of one compile, -O2, best of $n; $($cxx --version | head -n 1); $(date -u '+%Y-%m-%d %H:%M'); $(nproc) cores"
fi
printf '  %-12s %12s %12s\n' "unit" "header-only" "separate"
for name in "${names[@]}"; do
  [[ $name == library ]] && continue
  [[ -n ${cmd[$name]:-} ]] || { echo "compile_time.sh: no unit '$name' (${!cmd[*]})" >&2; exit 2; }
  sep="-"
  # shellcheck disable=SC2086 # the command lines are split on purpose
  case $name in empty | std | schedule61) ;; *) sep=$(cpu_seconds ${cmd[$name]} $separate) ;; esac
  # shellcheck disable=SC2086
  printf '  %-12s %12s %12s\n' "$name" "$(cpu_seconds ${cmd[$name]})" "$sep"
done
# shellcheck disable=SC2086
[[ " ${names[*]} " == *" library "* ]] && printf '  %-12s %12s %12s\n' "library" "-" "$(cpu_seconds $cxx "${host[@]}" $separate src/tide.cpp)"

if [[ $count == seconds && " ${names[*]} " == *" readme "* ]]; then
  for mode in header-only separate; do
  flag=""
  [[ $mode == separate ]] && flag=$separate
  echo
  echo "g++ -ftime-report, the README program, $mode: the largest phases and items (user s, share)"
  # shellcheck disable=SC2086
  $cxx "${host[@]}" $flag -ftime-report "$work/readme.cpp" 2>&1 >/dev/null | python3 -c '
import re, sys
rows = []
for line in sys.stdin:
    m = re.match(r"^ ([^:]+?)\s*:\s*([0-9.]+) \(\s*([0-9]+)%\)", line)  # name, usr s, usr share
    if m and not m.group(1).startswith("TOTAL"):
        rows.append((float(m.group(2)), m.group(3), m.group(1).strip()))
for w, share, name in sorted(rows, reverse=True)[:8]:
    print(f"  {w:6.2f} s {share:>3s}%  {name}")  # "phase ..." rows are the totals; "|" rows are within them
'
  done
fi
