#!/usr/bin/env bash
# The GPU check: on a machine with a GPU, builds tide for the GPU present and runs, numbers first:
# a preflight (can the CUDA runtime use the GPU?), the GPU benchmarks, the CUDA test suite (one
# test at a time: one GPU), the transformer's CUDA twin (once) and compute-sanitizer's memcheck and
# racecheck on a small case. It prints the versions, a phase/status summary, the versions again, a
# list of what was not verified on this machine and why, a compact table and the goals it checks.
#
# Made for the machine it is meant for: a fresh clone, no network, no Debian packages beyond the
# CUDA toolkit, Meson, Ninja and Python 3 (GoogleTest is vendored in subprojects/gtest; the GPU
# benchmarks have their own harness), one try. Budget: 470 s by default (--budget), held even when
# something hangs: every phase runs under `timeout -k` cut to what is left, and the benchmarks keep
# a reserved share that the build cannot take. It cannot fail silently: a failed phase shows its
# log's tail, every phase that does not depend on it still runs, the summary and the table (cut or
# missing rows said) are always printed, and the script then exits 1.
#
# Usage: bench/gpu/check.sh [--results DIR] [--commit SHA] [--budget SECONDS]
#                           [--dry-run [--simulate-failure PHASE] [--reuse-build]] [build-dir]
#        (default build dir: build-gpu-check)
#   --results DIR: copies there, at most eight files: check.log (everything printed), summary.txt
#              (versions, summary, what was not verified, table, goals), gpu_bench.json (the
#              benchmark rows) and phases.log (the end of each phase's log). Also
#              TIDE_GPU_CHECK_RESULTS.
#   --commit SHA: the commit to report, for a copy that is not a git checkout (also TIDE_COMMIT).
#   --dry-run: everything but the GPU, as CI runs it: sm_90, the same configure and build, the
#              device probe (which finds none), the CUDA suite (whose GPU tests skip), gpu_bench
#              --list, and the table and goals from synthetic rows with one row missing and the last
#              line cut, so that the table's handling of a run cut short is exercised every time.
#   --reuse-build: with --dry-run, build in build-dir as it is configured instead of configuring it.
#   --simulate-failure PHASE: with --dry-run, PHASE (preflight, build, benchmarks, build-tests,
#              cuda-tests, transformer or sanitizer) fails: the summary and table must still appear.
#
# Goals (checked from the benchmark rows, printed as met / missed / not measured; a missed goal is
# a finding to record, not a failure of the script):
#   G1  copies through tide, net of tide's fixed per-step cost (measured: an empty step), reach
#       >= 95% of raw cudaMemcpyAsync bandwidth at 16 MiB and above.
#   G2  hidden offload's step time is within 3% of keep-all's, in each case (16 layers x 1024, and
#       a wide case) where the copies of each phase take at most 70% of that phase's compute.
#   G3  hidden offload is faster than the same offload with its copies on the compute stream.
set -euo pipefail

dry_run=0
reuse=0
simulate=""
results=${TIDE_GPU_CHECK_RESULTS:-}
commit=${TIDE_COMMIT:-}
budget=""
while [[ ${1:-} == --* ]]; do
  case $1 in
    --dry-run) dry_run=1; shift ;;
    --reuse-build) reuse=1; shift ;;
    --simulate-failure) simulate=${2:?--simulate-failure needs a phase}; shift 2 ;;
    --results) results=${2:?--results needs a directory}; shift 2 ;;
    --commit) commit=${2:?--commit needs a commit}; shift 2 ;;
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    *) echo "check.sh: unknown option $1 (see the usage at the top of bench/gpu/check.sh)" >&2; exit 2 ;;
  esac
done
if { [[ -n $simulate ]] || ((reuse)); } && ((!dry_run)); then
  echo "check.sh: --simulate-failure and --reuse-build need --dry-run" >&2
  exit 2
fi
case $simulate in
  "" | preflight | build | benchmarks | build-tests | cuda-tests | transformer | sanitizer) ;;
  *) echo "check.sh: --simulate-failure takes preflight, build, benchmarks, build-tests, cuda-tests, transformer or sanitizer, not '$simulate'" >&2; exit 2 ;;
esac
if [[ -n $budget ]] && ! [[ $budget =~ ^[0-9]+$ && $budget -ge 60 ]]; then
  echo "check.sh: --budget takes whole seconds, at least 60, not '$budget'" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build-gpu-check}
mkdir -p "$build"
build=$(cd "$build" && pwd)
cd "$root"
if [[ -n $results ]]; then
  mkdir -p "$results" || { echo "check.sh: cannot create the results directory $results" >&2; exit 2; }
  results=$(cd "$results" && pwd)
  rm -f "$results"/{check.log,summary.txt,gpu_bench.json,phases.log}
  # Everything printed from here on is kept, whatever ends the run.
  exec > >(tee -a "$results/check.log") 2>&1
fi
start=$SECONDS
# A 2-core CI machine compiles the CUDA targets much more slowly than a GPU machine's 16 cores.
: "${budget:=$( ((dry_run)) && echo 2400 || echo 470)}"
bench_reserve=150  # seconds the build cannot take from the benchmarks

# Phases: each ends with a status (OK, FAIL, SKIP: why) and its time, listed again at the end.
names=() statuses=() times=() unverified=()
current="" began=0
phase() { current=$1; began=$SECONDS; printf '\n== %s (%ds)\n' "$1" $((SECONDS - start)); }
finish() {  # STATUS...: the current phase's status
  names+=("$current")
  statuses+=("$*")
  times+=($((SECONDS - began)))
  echo "-- $current: $* ($((SECONDS - began)) s)"
}
status_of() {  # NAME: its status, or nothing
  local i
  for i in "${!names[@]}"; do [[ ${names[$i]} == "$1" ]] && { echo "${statuses[$i]}"; return; }; done
}
ok() { [[ $(status_of "$1") == OK* ]]; }
left() { echo $((start + budget - SECONDS)); }
# within SECONDS COMMAND...: COMMAND under a timeout of SECONDS, or of what is left of the budget;
# SIGTERM first, SIGKILL 10 s later (a CUDA program stuck in the driver may ignore SIGTERM).
within() {
  local t=$1 l
  l=$(left)
  shift
  ((l < t)) && t=$l
  if ((t <= 0)); then
    echo "check.sh: out of time (the budget is $budget s) before: $*" >&2
    return 124
  fi
  timeout -k 10 "$t" "$@"
}
# logged NAME SECONDS COMMAND...: COMMAND with its output in $build/NAME.log; on failure shows the
# log's tail and returns non-zero. The phase `--simulate-failure` names fails here, without running.
logged() {
  local name=$1 t=$2 log="$build/$1.log" rc=0
  shift 2
  if [[ $name == "$simulate" ]]; then
    echo "check.sh: '$name' fails (--simulate-failure)" | tee "$log" >&2
    return 1
  fi
  within "$t" "$@" >"$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    echo "check.sh: '$*' failed (exit $rc$( ((rc == 124 || rc == 137)) && echo ', timed out')); the end of $log:" >&2
    tail -n 40 "$log" >&2 || true
  fi
  return $rc
}

export PATH=/usr/local/cuda/bin:$PATH
if ((dry_run)); then
  gpu="none (dry run)"
  arch=sm_90
  driver="none (dry run)"
else
  if ! command -v nvidia-smi >/dev/null || ! timeout -k 5 30 nvidia-smi -L >/dev/null 2>&1; then
    echo "check.sh: no GPU (nvidia-smi finds none); nothing to check (bench/gpu/check.sh --dry-run checks the rest)" >&2
    exit 77
  fi
  # GPU 0 only; each query guarded: a failed query is reported, it does not end the check.
  gpu=$(timeout -k 5 30 nvidia-smi -i 0 --query-gpu=name,compute_cap,memory.total --format=csv,noheader 2>/dev/null) || gpu="unknown (nvidia-smi failed)"
  cap=$(timeout -k 5 30 nvidia-smi -i 0 --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .') || cap=""
  [[ $cap =~ ^[0-9]+$ ]] && arch=sm_$cap || { echo "check.sh: nvidia-smi gave no compute capability ('$cap'); building for sm_90" >&2; arch=sm_90; }
  driver=$(timeout -k 5 30 nvidia-smi -i 0 --query-gpu=driver_version --format=csv,noheader 2>/dev/null) || driver="unknown (nvidia-smi failed)"
fi
cuda_version="not found"
cuda_root=""
if command -v nvcc >/dev/null; then
  cuda_version=$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
fi
nccl_where=$(python3 "$root/tools/find_nvidia_lib.py" nccl "${cuda_root:-/usr/local/cuda}" 2>/dev/null || true)
nccl="not found"
if [[ -n $nccl_where ]]; then
  nccl=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH)[ \t]/ {v = v (v ? "." : "") $3} END {print v}' "$(sed -n 1p <<<"$nccl_where")/nccl.h" 2>/dev/null || true)
  nccl="${nccl:-unknown version} ($(sed -n 3p <<<"$nccl_where"))"
fi
if [[ -z $commit ]]; then
  if commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null); then
    git -C "$root" diff --quiet HEAD 2>/dev/null || commit+=" (with local changes)"
  else
    commit="unknown (not a git checkout: pass --commit SHA or set TIDE_COMMIT)"
  fi
fi
when=$(date -u '+%Y-%m-%d %H:%M UTC')
header() {
  echo "GPU: $gpu ($arch)"
  echo "driver: $driver"
  echo "CUDA: $cuda_version"
  echo "NCCL: $nccl"
  echo "commit: $commit"
  echo "date: $when"
  echo "host: $(nproc) cores; budget $budget s$( ((dry_run)) && echo '; dry run')"
}
header

phase "dependencies"
# Nothing is installed: the GPU machine is offline. What the check needs must already be there.
deps_ok=1
if [[ $cuda_version == "not found" ]]; then
  echo "check.sh: nvcc not found (looked in PATH and /usr/local/cuda/bin)" >&2
  deps_ok=0
elif [[ ${cuda_version%%.*} -lt 12 ]]; then
  echo "check.sh: CUDA $cuda_version is older than 12.0, the oldest toolkit tide supports" >&2
  deps_ok=0
fi
for tool in meson ninja python3; do
  command -v $tool >/dev/null || { echo "check.sh: $tool not found (pip install meson ninja, or apt-get install meson ninja-build)" >&2; deps_ok=0; }
done
if command -v meson >/dev/null; then
  meson_version=$(meson --version)
  if [[ $(printf '%s\n1.0.0\n' "$meson_version" | sort -V | head -n 1) != 1.0.0 ]]; then
    echo "check.sh: Meson $meson_version is older than 1.0" >&2
    deps_ok=0
  fi
  echo "meson $meson_version, ninja $(ninja --version 2>/dev/null || echo missing), $(python3 --version 2>&1)"
fi
((deps_ok)) && finish OK || finish FAIL

phase "preflight"
# Can the CUDA runtime use the GPU nvidia-smi sees? A driver older than the runtime makes every
# CUDA test exit 77 (skipped) as if there were no GPU: here that is a failure, with the reason.
# Before the build: a machine whose GPU cannot be used is known in seconds, not minutes.
if ! ok dependencies; then
  finish "SKIP: needs dependencies"
else
  probe_src="$build/device_probe.cu"
  printf '%s\n' '#include <tide/backends/cuda/device_probe.hpp>' '#include <cstdio>' \
    'int main() { auto const p = tide::probe_devices(); std::printf("%s\n", p.describe().c_str());' \
    '  return p.state == tide::device_probe::status::usable ? 0 : p.state == tide::device_probe::status::no_device ? 77 : 1; }' \
    >"$probe_src"
  rc=0
  if logged preflight 120 nvcc -std=c++20 -I"$root/include" -I"$cuda_root/include/cccl" "$probe_src" -o "$build/device_probe"; then
    probe=$(within 60 "$build/device_probe") || rc=$?
    echo "device probe: ${probe:-no answer} (exit $rc)"
  else
    rc=1
  fi
  if ((dry_run)) && ((rc == 0 || rc == 77)); then finish "OK (dry run: $( ((rc == 0)) && echo 'a device' || echo 'no device'))"
  elif ((rc == 0)); then finish OK
  else finish "FAIL: the CUDA runtime cannot use the GPU nvidia-smi lists"
  fi
fi
gpu_ready() { ok preflight; }

phase "build"
# The benchmarks' programs first (numbers first); the test programs after the benchmarks ran.
configured=0
if ! ok dependencies; then
  finish "SKIP: needs dependencies"
else
  # Offline by construction: wraps never download (GoogleTest comes from subprojects/gtest).
  # Separate compilation (include/tide/core/config.hpp): tide's compiled parts once, in libtide.a,
  # so a CUDA translation unit compiles in about 15 CPU s instead of 27 (tools/compile_time.sh);
  # the suite runs header-only in CI's main build, and tests/cuda's self-contained check compiles
  # every header header-only with nvcc.
  options=(-Dcuda=enabled -Dbenchmarks=true -Dgpu_arch="$arch" -Dbuildtype=release -Dseparate_compilation=true --wrap-mode=nodownload)
  reconfigure=()
  [[ -f $build/build.ninja ]] && reconfigure=(--reconfigure)
  if ((reuse)) && [[ -f $build/build.ninja ]]; then
    echo "reusing $build as it is configured (--reuse-build)"
    configured=1
  elif logged setup 180 meson setup "${reconfigure[@]}" "$build" "${options[@]}"; then
    configured=1
    sed -n '/^  tide$/,/^$/p' "$build/setup.log" || true  # Meson's summary: CUDA, NCCL, cuFile found or why not
  fi
  bench_targets=(bench/gpu/gpu_bench)
  if ((configured)) && logged build $(($(left) - bench_reserve)) ninja -C "$build" "${bench_targets[@]}"; then
    finish OK
  else
    finish FAIL
  fi
fi

phase "benchmarks"
json="$build/gpu_bench.json"
rm -f "$json" "$build/gpu_bench.cases"
bench="$build/bench/gpu/gpu_bench"
if [[ ! -x $bench ]]; then
  finish "SKIP: gpu_bench not built"
elif ! within 30 "$bench" --list >"$build/gpu_bench.cases" 2>&1; then
  finish "FAIL: gpu_bench --list failed: $(tail -n 3 "$build/gpu_bench.cases")"
elif ! gpu_ready; then
  finish "SKIP: needs preflight"
elif ((dry_run)) && [[ $simulate != benchmarks ]]; then
  # Synthetic rows in gpu_bench's own format for the cases it lists, one row missing and the last
  # line cut mid-write, so that the table and goals run exactly as on a GPU after a run cut short.
  python3 - "$json" "$build/gpu_bench.cases" <<'PY'
import json, sys
cases = [l.strip() for l in open(sys.argv[2]) if l.strip()]
steps = {"step_keep_all": (10.0, 768, 0), "step_remat": (12.5, 320, 0), "step_offload_on_compute": (16.0, 400, 384),
         "step_offload_hidden": (10.2, 400, 384), "step_offload_hidden_default_priority": (10.3, 400, 384),
         "step_offload_hidden_chunked": (10.25, 400, 384), "step_wide_keep_all": (40.0, 4864, 0),
         "step_wide_offload_on_compute": (52.0, 4352, 256), "step_wide_offload_hidden": (40.6, 4352, 256)}
lines = []
for name in cases:
    row = {"name": name, "run_type": "iteration"}
    if name == "h2d_tide/268435456":
        continue  # the missing row
    if name == "step_empty":
        row["us"] = 20.0
    elif "_raw/" in name or "_tide/" in name:
        n = int(name.split("/")[1])
        bw = 50e9 if name.startswith("d2h") else 52e9
        raw_us = n / bw * 1e6
        row["us"] = raw_us if "_raw/" in name else raw_us * 1.01 + 20.0
        row["bytes_per_second"] = n / (row["us"] * 1e-6)
    elif name in steps:
        ms, dev, host = steps[name]
        row.update(real_time=ms, device_MiB=dev, host_MiB=host, label=name.replace("step_", "").replace("_", " "))
    elif name.startswith("max_batch_"):
        row.update(max_batch=4096, budget_MiB=768, label=name[len("max_batch_"):].replace("_", " "))
    lines.append(json.dumps(row))
text = "\n".join(lines) + "\n"
open(sys.argv[1], "w").write(text[: len(text) - len(lines[-1]) // 2 - 1])  # the last line cut
PY
  finish "SKIP: dry run (synthetic rows for the $(wc -l <"$build/gpu_bench.cases") cases gpu_bench lists, written to $json)"
elif logged benchmarks $(($(left) - 30)) "$bench" --out "$json"; then
  finish OK
else
  finish "FAIL (the rows written before it ended are in the table)"
fi

phase "build-tests"
# Exactly what the test phases run: the CUDA suite's programs (from Meson's own introspection,
# tools/test_targets.py), the sanitizer's example and the twin among them. The compile-only tests
# (suite compile: the docs' code with nvcc) are CI's, not the GPU's. -k 0: one program that
# does not compile does not keep the others from running.
if ((!configured)); then
  finish "SKIP: needs build (configure)"
elif ! mapfile -t test_targets < <(python3 tools/test_targets.py "$build" --only cuda --except compile --benchmarks) || ((${#test_targets[@]} == 0)); then
  finish "FAIL: tools/test_targets.py listed no targets for the cuda suite"
elif logged build-tests $(($(left) - 60)) ninja -C "$build" -k 0 "${test_targets[@]}"; then
  echo "built: ${test_targets[*]}"
  finish OK
else
  finish FAIL
fi

phase "cuda-tests"
if ! gpu_ready; then
  finish "SKIP: needs preflight"
elif ! ok build-tests; then
  finish "SKIP: needs build-tests"
# Its own log name: a reused build's testlog is left as it was. One test at a time: one GPU. The
# twin (suite twin) runs once, in the next phase.
elif logged cuda-tests 200 meson test -C "$build" --suite cuda --no-suite twin --no-suite compile --print-errorlogs --no-rebuild \
    --num-processes 1 --logbase gpu-check; then
  counts=$(grep -E '^(Ok|Fail|Skipped|Timeout):' "$build/cuda-tests.log" | tr -s ' \n' ' ')
  echo "$counts"
  skipped=$(sed -n 's/^Skipped: *\([0-9]*\).*/\1/p' "$build/cuda-tests.log")
  # With a GPU a skipped CUDA test ran nothing: a failure (without one, the dry run, it is expected).
  if ((!dry_run)) && ((${skipped:-0} > 0)); then finish "FAIL: $skipped CUDA test(s) skipped on a machine with a GPU"
  else finish OK
  fi
else
  grep -E '^ *[0-9]+/[0-9]+ .*(FAIL|TIMEOUT)' "$build/cuda-tests.log" | sed 's/^/  /' || true
  finish FAIL
fi
grep -q 'TIDE_HAVE_CUFILE=1' "$build/build.ninja" 2>/dev/null ||
  unverified+=("GPUDirect Storage: this build found no cuFile (tools/find_nvidia_lib.py cufile); the gpu_direct test checked only the error without it")
grep -q 'TIDE_HAS_NCCL=1' "$build/build.ninja" 2>/dev/null ||
  unverified+=("NCCL hooks and the data-parallel example: this build found no NCCL (tools/find_nvidia_lib.py nccl)")

phase "transformer"
transformer_row="not run"
twin="$build/examples/transformer/transformer_cuda"
if ! gpu_ready; then
  finish "SKIP: needs preflight"
elif [[ ! -x $twin ]] && ! grep -q 'transformer_cuda' "$build/build.ninja" 2>/dev/null; then
  transformer_row="not built: no OpenBLAS (its CPU model draws the weights)"
  finish "SKIP: $transformer_row"
elif [[ ! -x $twin ]]; then
  transformer_row="not built (see build-tests)"
  finish "FAIL: transformer_cuda did not build"
elif ((dry_run)) && [[ $simulate != transformer ]]; then
  transformer_row="skipped (dry run)"
  finish "SKIP: dry run"
elif logged transformer 150 env OPENBLAS_NUM_THREADS=1 "$twin" --small --graph; then
  transformer_row=$(tail -n 1 "$build/transformer.log")
  finish OK
else
  transformer_row="failed (see $build/transformer.log)"
  finish FAIL
fi
echo "transformer (CUDA twin, every policy): $transformer_row"

phase "sanitizer"
example="$build/examples/cuda_stack/cuda_stack"
if ! gpu_ready; then
  finish "SKIP: needs preflight"
elif ((dry_run)) && [[ $simulate != sanitizer ]]; then
  finish "SKIP: dry run"
elif [[ $simulate == sanitizer ]]; then
  logged sanitizer 1 true || finish FAIL
elif ! command -v compute-sanitizer >/dev/null; then
  unverified+=("memcheck and racecheck: compute-sanitizer is not installed")
  finish "SKIP: compute-sanitizer not installed"
elif [[ ! -x $example ]]; then
  finish "FAIL: cuda_stack did not build"
else
  small=(--layers 4 --width 64 --batch 32 --steps 2)
  clean=1
  for tool in memcheck racecheck; do
    logged "sanitizer-$tool" 120 compute-sanitizer --tool "$tool" --error-exitcode 99 "$example" "${small[@]}" || clean=0
  done
  ((clean)) && finish "OK (memcheck + racecheck clean)" || finish FAIL
fi

# ---- the report: summary, the versions again, what was not verified, the table ----------------
((dry_run)) && unverified+=("everything that needs a GPU: this was a dry run (the benchmark rows are synthetic)")
failed=0
{
  printf '\n== summary (%ds of a %d s budget)\n' $((SECONDS - start)) "$budget"
  for i in "${!names[@]}"; do
    printf '  %-14s %5d s  %s\n' "${names[$i]}" "${times[$i]}" "${statuses[$i]}"
    [[ ${statuses[$i]} == FAIL* ]] && failed=1
  done
  echo
  header
  printf '\n== not verified on this machine\n'
  for i in "${!names[@]}"; do
    [[ ${statuses[$i]} == SKIP* ]] && echo "  ${names[$i]}: ${statuses[$i]#SKIP: }"
  done
  for u in "${unverified[@]}"; do echo "  $u"; done
  printf '\n== table\n'
  [[ -s $build/gpu_bench.cases ]] && expect=(--expect "$build/gpu_bench.cases") || expect=()
  python3 "$root/bench/gpu/table.py" "$json" "${expect[@]}" || echo "(bench/gpu/table.py failed: the rows are in $json)"
} | tee "$build/summary.txt"
for i in "${!names[@]}"; do [[ ${statuses[$i]} == FAIL* ]] && failed=1; done

if [[ -n $results ]]; then
  cp "$build/summary.txt" "$results/summary.txt"
  [[ -f $json ]] && cp "$json" "$results/gpu_bench.json"
  for log in "$build"/{setup,preflight,build,benchmarks,build-tests,cuda-tests,transformer,sanitizer-memcheck,sanitizer-racecheck}.log; do
    [[ -f $log ]] || continue
    printf '\n===== %s (its last 300 lines)\n' "$(basename "$log")"
    tail -n 300 "$log"
  done >"$results/phases.log"
  echo "results: $results (check.log, summary.txt, gpu_bench.json, phases.log)"
fi
if ((failed)); then
  echo "check.sh: FAILED (see the summary above)" >&2
  exit 1
fi
echo "check.sh: every phase passed; what was skipped is listed under 'not verified on this machine'"
