#!/usr/bin/env bash
# The GPU check: on a machine with a GPU, builds tide for the GPU present, runs the CUDA tests,
# compute-sanitizer memcheck and racecheck on a small case (when installed), the GPU benchmarks,
# and prints the versions, a compact table and the goals it checks. Budget: under 8 minutes on one
# H100/H200-class GPU, held even when something hangs: every phase runs under a timeout cut to
# what is left of 470 s. It cannot fail silently: every phase logs to a file whose tail is shown
# when the phase fails, and the script exits non-zero.
#
# Usage: bench/gpu/check.sh [--dry-run] [build-dir]   (default build dir: build-gpu-check)
#   --dry-run: everything but the GPU: no nvidia-smi, sm_90, the same configure and build, the
#              CUDA suite (which skips without a GPU), and the table and goals computed from a
#              synthetic benchmark file with a missing row. CI runs this.
#
# Goals (checked from the benchmark rows, printed as met / missed / not measured; a missed goal is
# a finding to record, not a failure of the script):
#   G1  copies through tide reach >= 95% of raw cudaMemcpyAsync bandwidth at 16 MiB and above.
#   G2  hidden offload's step time is within 3% of keep-all's, when the copies take at most 70% of
#       the compute they hide behind (copy/compute ratio below; above 0.7 it is reported only).
#   G3  hidden offload is faster than the same offload with its copies on the compute stream.
set -euo pipefail

dry_run=0
if [[ ${1:-} == --dry-run ]]; then
  dry_run=1
  shift
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$root/build-gpu-check}
mkdir -p "$build"
build=$(cd "$build" && pwd)
cd "$root"
start=$SECONDS
budget=470
((dry_run)) && budget=1500  # a 2-core CI machine compiles the CUDA targets much more slowly
phase() { printf '\n== %s (%ds)\n' "$1" $((SECONDS - start)); }
# within SECONDS COMMAND...: COMMAND under a timeout of SECONDS, or of what is left of the budget.
within() {
  local t=$1 left=$((start + budget - SECONDS))
  shift
  ((left < t)) && t=$left
  if ((t <= 0)); then
    echo "check.sh: out of time (the budget is $budget s) before: $*" >&2
    return 124
  fi
  timeout "$t" "$@"
}
# logged NAME SECONDS COMMAND...: runs COMMAND with its output in $build/NAME.log; on failure shows
# the log's tail and exits (meson prints its errors on stdout, so nothing may be discarded).
logged() {
  local name=$1 t=$2 log="$build/$1.log" rc=0
  shift 2
  within "$t" "$@" >"$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    echo "check.sh: '$*' failed (exit $rc$( ((rc == 124)) && echo ', timed out')); the end of $log:" >&2
    tail -n 40 "$log" >&2 || true
    exit 1
  fi
}

export PATH=/usr/local/cuda/bin:$PATH
if ((dry_run)); then
  gpu="none (dry run)"
  arch=sm_90
  driver="none (dry run)"
else
  if ! command -v nvidia-smi >/dev/null || ! within 30 nvidia-smi -L >/dev/null 2>&1; then
    echo "check.sh: no GPU (nvidia-smi finds none); nothing to check (bench/gpu/check.sh --dry-run checks the rest)" >&2
    exit 77
  fi
  # GPU 0 only: `| head -n 1` would fail under pipefail (SIGPIPE) on a node with many GPUs.
  gpu=$(within 30 nvidia-smi -i 0 --query-gpu=name,compute_cap,memory.total --format=csv,noheader)
  arch=sm_$(within 30 nvidia-smi -i 0 --query-gpu=compute_cap --format=csv,noheader | tr -d ' .')
  driver=$(within 30 nvidia-smi -i 0 --query-gpu=driver_version --format=csv,noheader)
fi
command -v nvcc >/dev/null || { echo "check.sh: nvcc not found (looked in PATH and /usr/local/cuda/bin)" >&2; exit 1; }
cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
nccl_h=$(ls "$cuda_root"/include/nccl.h /usr/include/nccl.h 2>/dev/null | head -n 1 || true)
nccl="not found"
if [[ -n $nccl_h ]]; then
  nccl=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH)[ \t]/ {v = v (v ? "." : "") $3} END {print v}' "$nccl_h")
fi
echo "GPU: $gpu ($arch)"
echo "driver: $driver"
echo "CUDA: $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
echo "NCCL: $nccl"
echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (with local changes)')"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"

phase "dependencies"
# The GPU machine may be offline: never let Meson's wraps try to download; install what is
# missing from Debian instead, and say exactly what is missing when that fails.
missing=()
for p in gtest benchmark; do pkg-config --exists "$p" 2>/dev/null || missing+=("$p"); done
command -v meson >/dev/null || missing+=(meson)
command -v ninja >/dev/null || missing+=(ninja)
if ((${#missing[@]})); then
  echo "missing: ${missing[*]}; installing from Debian (tools/install-deps.sh)"
  logged install-deps 300 "$root/tools/install-deps.sh"
fi
echo "meson $(meson --version), ninja $(ninja --version), gtest and benchmark found"

phase "build ($arch, release)"
options=(-Dcuda=enabled -Dbenchmarks=true -Dgpu_arch="$arch" -Dbuildtype=release --wrap-mode=nodownload)
if [[ -f $build/build.ninja ]]; then
  # Re-asserted, build type included: an existing build directory may have been set up otherwise.
  logged setup 120 meson setup --reconfigure "$build" "${options[@]}"
else
  logged setup 120 meson setup "$build" "${options[@]}"
fi
targets=(tests/cuda/cuda_test examples/cuda_stack/cuda_stack examples/adjoint/adjoint_cuda bench/gpu/gpu_bench)
# Built only when NCCL was found, and then run by the CUDA suite too. (A variable, not a pipe:
# grep -q quitting early would fail the pipe under pipefail.)
all_targets=$(ninja -C "$build" -t targets all)
for t in "${targets[@]}"; do
  grep -q "^$t:" <<<"$all_targets" || { echo "check.sh: the build defines no target $t (is CUDA enabled?)" >&2; exit 1; }
done
if grep -q '^examples/cuda_stack/data_parallel:' <<<"$all_targets"; then
  targets+=(examples/cuda_stack/data_parallel)
fi
# The transformer's CUDA twin, where OpenBLAS was found (its CPU model draws the weights).
if grep -q '^examples/transformer/transformer_cuda:' <<<"$all_targets"; then
  targets+=(examples/transformer/transformer_cuda)
fi
logged build 1200 ninja -C "$build" "${targets[@]}"
echo "built: ${targets[*]}"

phase "CUDA tests"
logged cuda-tests 150 meson test -C "$build" --suite cuda --print-errorlogs --no-rebuild
grep -E '^(Ok|Fail|Skipped|Timeout):' "$build/cuda-tests.log" | tr '\n' ' '
echo

transformer_row="not built (no OpenBLAS)"
if [[ -x $build/examples/transformer/transformer_cuda ]]; then
  if ((dry_run)); then
    transformer_row="skipped (dry run)"
  else
    transformer_row=$(within 300 env OPENBLAS_NUM_THREADS=1 "$build/examples/transformer/transformer_cuda" --small | tail -n 1) ||
      { echo "check.sh: the transformer's CUDA twin failed: $transformer_row" >&2; exit 1; }
  fi
fi
echo "transformer (CUDA twin, every policy): $transformer_row"

phase "compute-sanitizer (small case)"
sanitized=skipped
if ((dry_run)); then
  sanitized="skipped (dry run)"
elif command -v compute-sanitizer >/dev/null; then
  small=(--layers 4 --width 64 --batch 32 --steps 2)
  for tool in memcheck racecheck; do
    log="$build/$tool.log"
    if ! within 150 compute-sanitizer --tool "$tool" --error-exitcode 99 --log-file "$log" \
        "$build/examples/cuda_stack/cuda_stack" "${small[@]}" >/dev/null; then
      echo "check.sh: compute-sanitizer $tool failed (or timed out); the end of $log:" >&2
      tail -n 40 "$log" >&2 || true
      exit 1
    fi
  done
  sanitized="memcheck + racecheck clean"
fi
echo "compute-sanitizer: $sanitized"

phase "benchmarks"
json="$build/gpu_bench.json"
if ((dry_run)); then
  # Synthetic rows in the benchmark's own format, one of them missing, so that the table and the
  # goals are exercised exactly as on a GPU.
  python3 - "$json" <<'PY'
import json, sys
rows = []
for d, bw in (("d2h", 50e9), ("h2d", 52e9)):
    for mib in (1, 16, 64, 256):
        n = mib << 20
        rows.append({"name": f"{d}_raw/{n}/manual_time", "run_type": "iteration", "bytes_per_second": bw})
        if not (d == "h2d" and mib == 256):  # the missing row
            rows.append({"name": f"{d}_tide/{n}/manual_time", "run_type": "iteration", "bytes_per_second": bw * 0.99})
for name, ms, dev, host in (("step_keep_all", 10.0, 768, 0), ("step_remat", 12.5, 320, 0),
                            ("step_offload_on_compute", 16.0, 400, 384), ("step_offload_hidden", 10.2, 400, 384)):
    rows.append({"name": f"{name}/iterations:10/manual_time", "run_type": "iteration", "real_time": ms,
                 "label": name.replace("step_", "").replace("_", " "), "device_MiB": dev, "host_MiB": host})
rows.append({"name": "max_batch_keep_all/iterations:1", "run_type": "iteration", "max_batch": 4096, "budget_MiB": 768,
             "label": "keep all"})
json.dump({"context": {"dry_run": True}, "benchmarks": rows}, open(sys.argv[1], "w"))
PY
  echo "benchmarks: skipped (dry run); synthetic rows written to $json"
else
  logged gpu-bench 300 "$build/bench/gpu/gpu_bench" --benchmark_out="$json" --benchmark_out_format=json
fi

phase "table"
python3 - "$json" <<'PY'
import json, re, sys
def key(name):  # "d2h_raw/1048576/manual_time" -> "d2h_raw/1048576"; "step_remat/iterations:10/..." -> "step_remat"
    return "/".join(p for p in name.split("/") if not re.fullmatch(r"iterations:\d+|manual_time|real_time|min_time:.*", p))
runs = {key(b["name"]): b for b in json.load(open(sys.argv[1]))["benchmarks"]
        if b.get("run_type", "iteration") == "iteration"}
missing = []
def get(name):
    r = runs.get(name)
    if r is None: missing.append(name)
    return r
def field(row, name, default=None):
    return row.get(name, default) if row else default

print("copy bandwidth, pinned (GB/s)           size   raw    tide   tide/raw")
ratios = []
for d in ("d2h", "h2d"):
    for mib in (1, 16, 64, 256):
        n = mib << 20
        r, t = get(f"{d}_raw/{n}"), get(f"{d}_tide/{n}")
        if r and t and "bytes_per_second" in r and "bytes_per_second" in t:
            rb, tb = r["bytes_per_second"] / 1e9, t["bytes_per_second"] / 1e9
            print(f"  {d}                               {mib:5d} MiB {rb:6.1f} {tb:6.1f}   {100 * tb / rb:5.1f}%")
            if mib >= 16: ratios.append(tb / rb)
        else:
            print(f"  {d}                               {mib:5d} MiB   (not measured)")

print("\nstep time (16 layers, width 1024, 4096 tokens)   ms     vs keep-all  device MiB  host MiB")
keep = get("step_keep_all")
keep_ms = field(keep, "real_time")
steps = {}
for name in ("step_keep_all", "step_remat", "step_offload_on_compute", "step_offload_hidden",
             "step_offload_hidden_default_priority", "step_offload_hidden_chunked"):
    b = runs.get(name)
    if not b or "real_time" not in b:
        print(f"  {name:46s}   (not measured)")
        continue
    ms = b["real_time"]
    steps[name] = b
    rel = f"{100 * (ms / keep_ms - 1):+7.1f}%" if keep_ms else "      ?"
    print(f"  {b.get('label', name):46s} {ms:8.2f}  {rel}  {field(b, 'device_MiB', 0):9.0f} {field(b, 'host_MiB', 0):9.0f}")

print("\nlargest batch under the keep-all budget         tokens")
for name in ("max_batch_keep_all", "max_batch_remat", "max_batch_offload_hidden"):
    b = runs.get(name)
    if b and "max_batch" in b:
        print(f"  {b.get('label', name):46s} {int(b['max_batch']):6d}   (budget {field(b, 'budget_MiB', 0):.0f} MiB)")
    else:
        print(f"  {name:46s}   (not measured)")

# Copy/compute ratio: the hidden offload's copies (host bytes each way at the measured 16 MiB tide
# bandwidth) against keep-all's step time, the compute they hide behind.
hidden, naive = steps.get("step_offload_hidden"), steps.get("step_offload_on_compute")
ratio = None
bw = [runs[k]["bytes_per_second"] for k in ("d2h_tide/16777216", "h2d_tide/16777216") if k in runs]
if hidden and keep_ms and len(bw) == 2:
    host = field(hidden, "host_MiB", 0) * (1 << 20)
    copy_ms = 1e3 * (host / bw[0] + host / bw[1])
    ratio = copy_ms / keep_ms
    print(f"\ncopy/compute ratio: {ratio:.2f} ({copy_ms:.2f} ms of copies each step against {keep_ms:.2f} ms of compute)")
else:
    print("\ncopy/compute ratio: not measured")

def goal(name, text, ok):
    print(f"  {name} {'met' if ok else 'missed' if ok is not None else 'not measured'}: {text}")
print("\ngoals")
goal("G1", "tide copies >= 95% of raw bandwidth at >= 16 MiB" + (f" (lowest {100 * min(ratios):.1f}%)" if ratios else ""),
     min(ratios) >= 0.95 if ratios else None)
if hidden and keep_ms and ratio is not None and ratio <= 0.7:
    goal("G2", f"hidden offload within 3% of keep-all at copy/compute {ratio:.2f} "
               f"({100 * (hidden['real_time'] / keep_ms - 1):+.1f}%)", hidden["real_time"] <= 1.03 * keep_ms)
else:
    print(f"  G2 not asserted: copy/compute ratio {'unknown' if ratio is None else f'{ratio:.2f} above 0.7'}")
goal("G3", "hidden offload faster than copies on the compute stream",
     hidden["real_time"] < naive["real_time"] if hidden and naive else None)
if missing:
    print(f"\nrows missing from the benchmark output: {', '.join(sorted(set(missing)))}")
PY
phase "done"
