#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. the main build, with NDEBUG defined: every host test, the examples, the compile-fail and consumer tests, the
#      MPI tests (2 and 4 ranks; the CUDA suite is left to step 5, which builds it from scratch);
#   2. the host tests again under ThreadSanitizer, in separate compilation (tide's library linked:
#      the suite runs header-only in 1 and compiled in 2 and 3);
#   3. and under AddressSanitizer + UndefinedBehaviorSanitizer, in separate compilation (with the
#      2-stage MPI pipeline runs, suite pipeline), where the
#      benchmark programs are compiled too (not run: no test runs them);
#   4. the fuzzers (libFuzzer with clang, ASan + UBSan): the schedule fuzzer 45 s and the file
#      readers' and tide-plan's command line 30 s, each from its seed corpus, and the saved
#      regression inputs replayed;
#   5. the GPU check script in dry-run mode (bench/gpu/check.sh --dry-run: its configure, build,
#      device probe, CUDA suite, table and goals, everything but the GPU) in a fresh build directory,
#      offline and without Debian's GoogleTest and Google Benchmark, then with simulated failing
#      phases (the summary and the table must still appear): tools/check_gpu_dry_run.py; then, in
#      that build, every CUDA header compiled on its own with nvcc and the docs' CUDA code. The
#      CUDA suite's GPU tests exit 77 without a GPU and count as skipped.
# Usage: tools/test.sh [main|tsan|asan|fuzz|gpucheck ...]   (default: all five)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
export PATH="$PATH:/usr/local/cuda/bin"
jobs=$(nproc)
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(main tsan asan fuzz gpucheck)

setup() {  # dir, options...
  local dir=$1
  shift
  if [ -f "$dir/build.ninja" ]; then meson setup --reconfigure "$dir" "$@" >/dev/null
  else meson setup "$dir" "$@" >/dev/null; fi
}

for c in "${configs[@]}"; do
  echo "=== tide tests: $c"
  case $c in
    main)
      # NDEBUG defined (as in a release build): the sanitizer builds below run without it, so the
      # suite is proven both ways (the executor's debug checks default to off under NDEBUG).
      # -O1 and line tables only (-g1): half the compile time of -O2 -g (json_test.cpp: 31 s
      # against 62 s here), while backtraces and sanitizer reports still name file and line. The
      # ThreadSanitizer build below is the -O2 one.
      setup build-test/main -Dcuda=auto -Dbenchmarks=true -Db_ndebug=true -Ddebug=false -Doptimization=1 -Dcpp_args=-g1
      # Everything but the CUDA suite's programs and the CUDA objects: the GPU check's dry run
      # (gpucheck, below) compiles and runs those in a build of its own, from scratch, as on a GPU
      # machine; compiling them here too would double the CUDA compile (issue 38). Nor the
      # benchmark programs, which no test runs: the ASan build compiles them (below), in separate
      # compilation (executor_bench.cpp: 4 CPU s there, 11 here).
      mapfile -t main_targets < <(python3 tools/test_targets.py build-test/main --all-except-suite cuda --no-benchmarks)
      ninja -C build-test/main -j "$jobs" "${main_targets[@]}"
      meson test -C build-test/main --no-rebuild --print-errorlogs --num-processes "$jobs" --no-suite cuda
      ;;
    tsan | asan)
      san=thread
      opt=2
      # ASan + UBSan at -O0: it compiles four times faster than at -O2 and its tests stay short;
      # TSan keeps -O2, since its tests are the slow part.
      libopt=inherit
      # ...but tide's library (where the planner, the sim and the executor's step machinery run)
      # at -O1: at -O0 the planner's tests ran 2.4 to 4 times longer (tide_plan 126 s against 53).
      [ "$c" = asan ] && san=address,undefined && opt=0 && libopt=1
      # Host tests only; fewer random stress cases, since sanitizers run them ~10x slower; no
      # timing goals (calibration accuracy), since sanitizers distort timing; no exhaustive
      # sweeps (suite slow: the checkpointing proofs).
      # Separate compilation (-Dseparate_compilation=true, include/tide/core/config.hpp): the
      # suite runs in both modes, header-only in the main build and compiled here, where tide's
      # library is compiled once instead of in every test program.
      benchmarks=false
      [ "$c" = asan ] && benchmarks=true  # compiled here only, not run (no test runs them)
      # MPI under ASan only: the 2-stage pipeline runs (suite pipeline); the other MPI runs
      # (suite mpi) are the main build's.
      mpi=disabled
      [ "$c" = asan ] && mpi=auto
      setup "build-test/$c" -Dcuda=disabled -Dmpi=$mpi -Dbenchmarks=$benchmarks -Db_sanitize="$san" -Db_lundef=false \
        -Doptimization="$opt" -Ddebug=false -Dcpp_args=-g1 -Dstress_cases=60 -Dseparate_compilation=true \
        -Dlibrary_optimization="$libopt"
      # ThreadSanitizer skips the tests that start no thread (suite single_thread); both skip the
      # runs another test repeats with another output (suite repeat). Only the programs of the
      # tests that run are built (tools/test_targets.py): about 3 minutes of compiling fewer.
      suites=(compile mpi consumer timing slow repeat)
      [ "$c" = tsan ] && suites+=(single_thread)
      skip=()
      for s in "${suites[@]}"; do skip+=(--no-suite "$s"); done
      with=()
      [ "$benchmarks" = true ] && with=(--benchmarks)
      mapfile -t needed < <(python3 tools/test_targets.py "build-test/$c" "${suites[@]}" ${with[@]+"${with[@]}"})
      [ ${#needed[@]} -gt 0 ] || { echo "tools/test.sh: no test programs found for $c" >&2; exit 1; }
      ninja -C "build-test/$c" -j "$jobs" "${needed[@]}"
      meson test -C "build-test/$c" --no-rebuild --print-errorlogs --num-processes "$jobs" "${skip[@]}"
      ;;
    fuzz)
      # libFuzzer comes with clang (Debian: clang and libclang-rt-14-dev); the sanitizers are set
      # on the fuzz target itself, so b_sanitize stays off. Only the fuzz suite is built and run.
      if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
          clang++ -x c++ -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
        sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q clang libclang-rt-dev >/dev/null
      fi
      CXX=clang++ CC=clang setup build-test/fuzz -Dfuzz=true -Dcuda=disabled -Dmpi=disabled -Dbenchmarks=false \
        -Dexamples=false -Db_sanitize=none
      targets=(tests/fuzz/fuzz_schedule tests/fuzz/fuzz_stages tests/fuzz/fuzz_stage_schedule)
      # The file readers' fuzzer needs nlohmann/json (tools/install-deps.sh installs it).
      grep -q '^build tests/fuzz/fuzz_files:' build-test/fuzz/build.ninja && targets+=(tests/fuzz/fuzz_files)
      ninja -C build-test/fuzz -j "$jobs" "${targets[@]}"
      meson test -C build-test/fuzz --no-rebuild --print-errorlogs --num-processes "$jobs" --suite fuzz
      ;;
    gpucheck)
      # Not a Meson suite: its one result goes where the closing line finds it. Walked as its user
      # walks it (issue 38): a fresh build directory, nothing reused, offline and without Debian's
      # GoogleTest and Google Benchmark (tools/offline-gpu-machine.sh), one try.
      mkdir -p build-test/gpucheck
      rm -f build-test/gpucheck/result.json
      if command -v nvcc >/dev/null; then
        dir=build-test/gpucheck/build
        results=build-test/gpucheck/results
        rm -rf "$dir" "$results"
        # CMake hidden too: tide's setup needs no cmake program (a bare CUDA image may have none).
        offline=(env OFFLINE_NO_CMAKE=1 tools/offline-gpu-machine.sh)
        if [ "$(id -u)" -ne 0 ] || ! unshare -m -n true 2>/dev/null; then
          # CI must walk the GPU machine's path; elsewhere the dry run still runs, online, and says so.
          [ "${CI:-}" = true ] && { echo "tools/test.sh: CI cannot make the offline namespace (needs root and unshare)" >&2; exit 1; }
          echo "tools/test.sh: cannot make an offline namespace here (needs root and unshare): the dry run runs online" >&2
          offline=()
        fi
        python3 tools/check_gpu_dry_run.py "$dir" "$results" "${offline[@]}"
        # The CUDA checks that need no GPU and that the GPU check leaves to CI (the main build
        # compiles no CUDA): every CUDA header on its own with nvcc, the docs' CUDA code, the
        # sticky-error list, in the check's own build.
        ninja -C "$dir" -j "$jobs" tests/cuda/libself_contained_cuda_headers.a
        meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$jobs" --logbase ci-cuda-compile docs_cuda sticky_errors
        echo '{"name": "gpu_check_dry_run", "result": "OK"}' >build-test/gpucheck/result.json
      else
        echo "no nvcc: the GPU check's dry run is skipped"
        echo '{"name": "gpu_check_dry_run", "result": "SKIP"}' >build-test/gpucheck/result.json
      fi
      ;;
    *) echo "unknown configuration '$c' (main, tsan, asan, fuzz, gpucheck)" >&2; exit 2 ;;
  esac
done

# One closing line over every configuration run (from Meson's JSON test logs).
python3 - "${configs[@]}" <<'PY'
import json, sys
counts = {"OK": 0, "FAIL": 0, "SKIP": 0}
for c in sys.argv[1:]:
    logs = [f"build-test/{c}/meson-logs/testlog.json"]
    if c == "gpucheck":  # the dry run's verdict, and the CUDA tests it and CI ran in its build
        logs = ["build-test/gpucheck/result.json"] + [f"build-test/gpucheck/build/meson-logs/{n}.json"
                                                      for n in ("gpu-check", "ci-cuda-compile")]
    for log in logs:
        try:
            f = open(log)
        except FileNotFoundError:
            continue  # no nvcc: no CUDA tests ran
        with f:
            for line in f:
                r = json.loads(line)["result"]
                key = "OK" if r in ("OK", "EXPECTEDFAIL") else "SKIP" if r == "SKIP" else "FAIL"
                counts[key] += 1
print(f"tide: {counts['OK']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
PY
