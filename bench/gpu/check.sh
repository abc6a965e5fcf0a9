#!/usr/bin/env bash
# The GPU check: on a machine with a GPU, builds tide for the GPU present, runs the CUDA tests,
# compute-sanitizer memcheck and racecheck on a small case (when installed), the GPU benchmarks,
# and prints a compact table. Budget: under 8 minutes on one H100/H200-class GPU, held even when
# something hangs: every phase runs under a timeout cut to what is left of 470 s.
#
# Usage: bench/gpu/check.sh [build-dir]     (default: build-gpu-check, next to build/)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build-gpu-check}
cd "$root"
start=$SECONDS
phase() { printf '\n== %s (%ds)\n' "$1" $((SECONDS - start)); }
# within SECONDS COMMAND...: COMMAND under a timeout of SECONDS, or of what is left of the budget.
within() {
  local t=$1 left=$((start + 470 - SECONDS))
  shift
  ((left < t)) && t=$left
  if ((t <= 0)); then
    echo "check.sh: out of time (the budget is 8 minutes) before: $*" >&2
    return 124
  fi
  timeout "$t" "$@"
}

if ! command -v nvidia-smi >/dev/null || ! within 30 nvidia-smi -L >/dev/null 2>&1; then
  echo "check.sh: no GPU (nvidia-smi finds none); nothing to check" >&2
  exit 77
fi
# GPU 0 only: `| head -n 1` would fail under pipefail (SIGPIPE) on a node with many GPUs.
gpu=$(within 30 nvidia-smi -i 0 --query-gpu=name,compute_cap,driver_version --format=csv,noheader)
arch=sm_$(within 30 nvidia-smi -i 0 --query-gpu=compute_cap --format=csv,noheader | tr -d ' .')
echo "GPU: $gpu ($arch)"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
export PATH=/usr/local/cuda/bin:$PATH

phase "build ($arch, release)"
options=(-Dcuda=enabled -Dbenchmarks=true -Dgpu_arch="$arch")
if [[ -d $build ]]; then
  # Re-asserted: an existing build directory may have been set up without CUDA or benchmarks.
  within 60 meson setup --reconfigure "$build" "${options[@]}" >/dev/null
else
  within 60 meson setup "$build" "${options[@]}" -Dbuildtype=release >/dev/null
fi
targets=(tests/cuda/cuda_test examples/cuda_stack/cuda_stack bench/gpu/gpu_bench)
# Built only when NCCL was found, and then run by the CUDA suite too. (A variable, not a pipe:
# grep -q quitting early would fail the pipe under pipefail.)
all_targets=$(ninja -C "$build" -t targets all)
if grep -q '^examples/cuda_stack/data_parallel:' <<<"$all_targets"; then
  targets+=(examples/cuda_stack/data_parallel)
fi
within 300 ninja -C "$build" "${targets[@]}"

phase "CUDA tests"
within 150 meson test -C "$build" --suite cuda --print-errorlogs --no-rebuild

phase "compute-sanitizer (small case)"
sanitized=skipped
if command -v compute-sanitizer >/dev/null; then
  small=(--layers 4 --width 64 --batch 32 --steps 2)
  for tool in memcheck racecheck; do
    log="$build/$tool.log"
    if ! within 150 compute-sanitizer --tool "$tool" --error-exitcode 99 --log-file "$log" \
        "$build/examples/cuda_stack/cuda_stack" "${small[@]}" >/dev/null; then
      echo "compute-sanitizer $tool failed (or timed out); the end of $log:" >&2
      tail -n 40 "$log" >&2 || true
      exit 1
    fi
  done
  sanitized="memcheck + racecheck clean"
fi
echo "compute-sanitizer: $sanitized"

phase "benchmarks"
json="$build/gpu_bench.json"
within 300 "$build/bench/gpu/gpu_bench" --benchmark_out="$json" --benchmark_out_format=json >/dev/null

phase "table"
python3 - "$json" <<'PY'
import json, re, sys
def key(name):  # "d2h_raw/1048576/manual_time" -> "d2h_raw/1048576"; "step_remat/iterations:10/..." -> "step_remat"
    return "/".join(p for p in name.split("/") if not re.fullmatch(r"iterations:\d+|manual_time|real_time|min_time:.*", p))
runs = {key(b["name"]): b for b in json.load(open(sys.argv[1]))["benchmarks"]
        if b.get("run_type", "iteration") == "iteration"}
def get(name): return runs.get(name)
print("copy bandwidth, pinned (GB/s)           size   raw    tide   tide/raw")
for d in ("d2h", "h2d"):
    for mib in (1, 16, 64, 256):
        n = mib << 20
        r, t = get(f"{d}_raw/{n}"), get(f"{d}_tide/{n}")
        if r and t:
            rb, tb = r["bytes_per_second"] / 1e9, t["bytes_per_second"] / 1e9
            print(f"  {d}                               {mib:5d} MiB {rb:6.1f} {tb:6.1f}   {100 * tb / rb:5.1f}%")
print("\nstep time (16 layers, width 1024, 4096 tokens)   ms     vs keep-all  device MiB  host MiB")
keep = get("step_keep_all")
for name in ("step_keep_all", "step_remat", "step_offload_on_compute", "step_offload_hidden",
             "step_offload_hidden_default_priority", "step_offload_hidden_chunked"):
    b = get(name)
    if not b: continue
    ms = b["real_time"]
    print(f"  {b.get('label', name):46s} {ms:8.2f}  {100 * (ms / keep['real_time'] - 1):+7.1f}%  "
          f"{b['device_MiB']:9.0f} {b['host_MiB']:9.0f}")
print("\nlargest batch under the keep-all budget         tokens")
for name in ("max_batch_keep_all", "max_batch_remat", "max_batch_offload_hidden"):
    b = get(name)
    if b: print(f"  {b.get('label', name):46s} {int(b['max_batch']):6d}   (budget {b['budget_MiB']:.0f} MiB)")
PY
phase "done"
