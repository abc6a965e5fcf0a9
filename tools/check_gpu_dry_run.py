#!/usr/bin/env python3
"""Runs the GPU check's dry run as CI must (issue 38) and checks what it printed and kept.

usage: check_gpu_dry_run.py BUILD_DIR RESULTS_DIR [WRAPPER...]
  WRAPPER: a command the check runs under (tools/offline-gpu-machine.sh: no network, no Debian
  GoogleTest or Google Benchmark). BUILD_DIR must not exist yet: the first run walks a fresh clone's
  path; the runs with a simulated failing phase then reuse it (--reuse-build).

Checks, each of which fails CI when it comes back:
  - a fresh, offline configure and build of exactly what the test phase runs, and the CUDA suite
    passes (its GPU tests skip): items 1-3;
  - phases in the order numbers-first (preflight, build, benchmarks, build-tests, cuda-tests,
    transformer, sanitizer), each under `timeout -k`: item 4;
  - the table read from a cut benchmark file, saying so, and the missing row named: item 5;
  - the results directory holds at most eight files, among them summary.txt, check.log,
    gpu_bench.json and phases.log; the versions are printed again after the summary; the commit
    passed in is the one reported; a "not verified on this machine" list: item 7;
  - a simulated failure in each phase that runs (preflight, build, benchmarks, build-tests,
    cuda-tests, sanitizer, and transformer where the twin was built) still ends in the summary
    and the table, and exit 1."""
import os
import pathlib
import re
import subprocess
import sys
import time

build, results = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wrapper = sys.argv[3:]
root = pathlib.Path(__file__).resolve().parent.parent
failures = []


def check(ok, what, detail=""):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)
        if detail:
            print(detail[-6000:])


def dry_run(*args):
    t0 = time.time()
    p = subprocess.run(wrapper + ["bash", str(root / "bench/gpu/check.sh"), "--dry-run", *args],
                       capture_output=True, text=True, cwd=root)
    print(f"check.sh --dry-run {' '.join(args)}: exit {p.returncode} in {time.time() - t0:.0f} s")
    return p.returncode, p.stdout + p.stderr


if build.exists():
    sys.exit(f"check_gpu_dry_run.py: {build} exists; the first run must be a fresh build directory")
rc, out = dry_run("--results", str(results), "--commit", "commit-passed-in", str(build))
check(rc == 0, "the dry run in a fresh build directory passes", out)
order = ["dependencies", "preflight", "build", "benchmarks", "build-tests", "cuda-tests", "transformer", "sanitizer"]
starts = [out.find(f"\n== {p} (") for p in order]
check(all(s >= 0 for s in starts) and starts == sorted(starts), "phases run numbers first: " + ", ".join(order), out)
summary = out[out.find("\n== summary"):]
check("\n== summary" in out and "commit: commit-passed-in" in summary and "GPU: none (dry run)" in summary,
      "the versions and the commit passed in are printed again after the summary")
check("== not verified on this machine" in summary and "dry run" in summary.split("== not verified on this machine")[-1],
      "a list of what was not verified, and why")
check("the run ended while writing it" in summary and "h2d_tide/268435456" in summary,
      "the table reads a cut benchmark file, says so and names the missing row")
check(re.search(r"^  cuda-tests .*OK", out, re.M) is not None, "the CUDA suite ran (its GPU tests skip)")
check("NCCL" in out and ("Google Benchmark programs" in out or "tide" in out), "Meson's summary is shown")
files = sorted(p.name for p in results.iterdir()) if results.is_dir() else []
check(len(files) <= 8 and {"summary.txt", "check.log", "gpu_bench.json", "phases.log"} <= set(files),
      f"the results directory holds the summary, the log, the rows and the phase logs, at most 8 files: {files}")
if "summary.txt" in files:
    text = (results / "summary.txt").read_text()
    check("== table" in text and "goals" in text and "commit: commit-passed-in" in text, "summary.txt has the table and the versions")
check(subprocess.run(["grep", "-q", "timeout -k", str(root / "bench/gpu/check.sh")]).returncode == 0,
      "every phase's timeout escalates to SIGKILL")

phases = ["preflight", "build", "benchmarks", "build-tests", "cuda-tests", "sanitizer"]
if (build / "examples/transformer/transformer_cuda").exists():
    phases.append("transformer")  # without OpenBLAS there is no twin, and its phase is a SKIP saying so
else:
    print("the transformer's CUDA twin was not built (no OpenBLAS): its phase's simulated failure is not run")
for phase in phases:
    rc, out = dry_run("--reuse-build", "--simulate-failure", phase, str(build))
    summary = out[out.find("\n== summary"):]
    check(rc == 1 and re.search(rf"^  {phase} .*FAIL", summary, re.M) is not None and "== table" in summary
          and "goals" in summary and "commit:" in summary,
          f"a failing {phase} phase still ends in the summary and the table, and exit 1", out)

if failures:
    sys.exit(f"the GPU check's dry run: {len(failures)} check(s) failed")
print("the GPU check's dry run: all checks passed")
