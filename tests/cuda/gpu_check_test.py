#!/usr/bin/env python3
"""The GPU check's parts that can be proven without a GPU (bench/gpu/check.sh; issue 38):

1. the build phase and the test phase agree: tools/test_targets.py --only cuda --benchmarks lists
   every program the CUDA suite and the GPU benchmarks run, from Meson's own introspection;
2. the CUDA suite's GPU programs run one at a time (one GPU);
3. bench/gpu/table.py reads what a run cut short left: a last line cut mid-write is skipped and
   said, a failed row shows its error, a row that never came is named, a missing file is a table
   of "not measured" cells, never a traceback;
4. NCCL detection really searches: tools/find_nvidia_lib.py finds nothing where there is nothing,
   finds a wheel's libnccl.so.2, and Meson's summary says "NO: not found" when the search is empty,
   "not usable" when a header and library are there but do not link.

usage: gpu_check_test.py SOURCE_ROOT BUILD_DIR NVCC"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

root, build, nvcc = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def run(*cmd, env=None, cwd=None):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=cwd)


def introspect(what):
    return json.loads(run("meson", "introspect", what, build).stdout)


# 1. The build list covers the test list.
# What check.sh builds (build-tests: the suite, the twin among it, less the compile-only tests).
listed = set(run(sys.executable, root / "tools/test_targets.py", build, "--only", "cuda", "--except", "compile",
                 "--benchmarks").stdout.split())
outputs = {pathlib.Path(f).resolve() for t in introspect("--targets") for f in t["filename"]}
runs = [t for t in introspect("--tests") + introspect("--benchmarks")
        if any(s.split(":")[-1] == "cuda" for s in t["suite"]) and not any(s.split(":")[-1] == "compile" for s in t["suite"])]
check(len(runs) >= 5, f"the cuda suite has its tests and benchmarks ({len(runs)})")
for t in runs:
    for arg in t["cmd"]:
        p = pathlib.Path(arg)
        p = (p if p.is_absolute() else build / p).resolve()
        if p in outputs:
            rel = str(p.relative_to(build.resolve()))
            check(rel in listed, f"test {t['name']} runs {rel}, which the GPU check builds")
for must in ("tests/cuda/cuda_test", "tests/cuda/gpu_direct_test", "bench/gpu/gpu_bench", "examples/cuda_stack/cuda_stack"):
    check(must in listed, f"the GPU check builds {must}")

# 2. One GPU: its programs run one at a time.
gpu_programs = ("cuda_test", "gpu_direct_test", "cuda_stack", "data_parallel", "adjoint_cuda", "transformer_cuda")
for t in introspect("--tests"):
    if any(pathlib.Path(a).name in gpu_programs for a in t["cmd"][:1]):
        check(not t["is_parallel"], f"GPU test {t['name']} is not run in parallel with others")

# 3. The table, on what a run cut short leaves.
table = root / "bench/gpu/table.py"
with tempfile.TemporaryDirectory() as d:
    d = pathlib.Path(d)
    rows = [{"name": "d2h_raw/16777216", "us": 320.0, "bytes_per_second": 16777216 / 320e-6},
            {"name": "d2h_tide/16777216", "us": 345.0, "bytes_per_second": 16777216 / 345e-6},
            {"name": "step_empty", "us": 25.0},
            {"name": "step_keep_all", "real_time": 10.0, "device_MiB": 768, "host_MiB": 0},
            {"name": "step_remat", "error": "cudaMalloc failed: out of memory"}]
    text = "\n".join(json.dumps(r) for r in rows) + "\n" + '{"name": "step_offload_hid'
    (d / "cut.json").write_text(text)
    (d / "cases").write_text("\n".join([r["name"] for r in rows] + ["step_offload_hidden", "max_batch_keep_all"]) + "\n")
    r = run(sys.executable, table, d / "cut.json", "--expect", d / "cases")
    out = r.stdout
    check(r.returncode == 0 and "Traceback" not in r.stderr, "the table reads a cut file without failing")
    check("line 6 of" in out and "the run ended while writing it" in out, "the cut last line is said")
    check("step_offload_hidden" in out.split("rows missing from the benchmark output:")[-1], "a row that never came is named")
    check("row step_remat failed: cudaMalloc failed: out of memory" in out, "a failed row shows its error")
    check("25.0 us" in out and "92.8%" in out and "100.0%" in out, "the copy is shown beside tide's fixed per-step cost, net of it: " +
          next((l for l in out.splitlines() if "d2h" in l and "16 MiB" in l), "?"))
    r = run(sys.executable, table, d / "absent.json")
    check(r.returncode == 0 and "no benchmark output" in r.stdout and "G1 not measured" in r.stdout,
          "a missing file gives a table of unmeasured cells")

# 4. NCCL detection.
finder = root / "tools/find_nvidia_lib.py"
with tempfile.TemporaryDirectory() as d:
    d = pathlib.Path(d)
    env = dict(os.environ, TIDE_NVIDIA_LIB_ROOTS=str(d / "nothing"))
    r = run(sys.executable, finder, "nccl", "/usr/local/cuda", env=env)
    check(r.returncode == 0 and r.stdout == "", "find_nvidia_lib.py finds no NCCL where there is none")
    wheel = d / "site" / "nvidia" / "nccl"
    (wheel / "include").mkdir(parents=True)
    (wheel / "lib").mkdir()
    (wheel / "include" / "nccl.h").write_text("#error not a real nccl.h\n")
    (wheel / "lib" / "libnccl.so.2").write_text("not a library")
    env = dict(os.environ, TIDE_NVIDIA_LIB_ROOTS=str(wheel))
    r = run(sys.executable, finder, "nccl", env=env)
    check(r.stdout.split("\n")[2:3] == [str(wheel / "lib" / "libnccl.so.2")], "a wheel's libnccl.so.2 is found: " + repr(r.stdout))

    # Meson itself: tide configured with CUDA and an empty search, then with a fake NCCL.
    def configure(name, roots):
        env = dict(os.environ, TIDE_NVIDIA_LIB_ROOTS=roots, PATH=os.path.dirname(nvcc) + ":" + os.environ["PATH"])
        return run("meson", "setup", d / name, root, "-Dcuda=enabled", "-Dtests=false", "-Dexamples=false",
                   "-Dbenchmarks=false", "-Ddocs=disabled", "-Djson=disabled", "-Dmpi=disabled", "-Dcufile=disabled",
                   "-Dio_uring=disabled", "--wrap-mode=nodownload", env=env)
    r = configure("none", str(d / "nothing"))
    nccl_line = next((l for l in r.stdout.splitlines() if l.strip().startswith("NCCL")), "")
    check(r.returncode == 0 and "NO: not found" in nccl_line, f"meson's summary says NCCL was not found: {nccl_line!r}" +
          ("" if r.returncode == 0 else "\n" + r.stdout[-2000:]))
    r = configure("fake", str(wheel))
    nccl_line = next((l for l in r.stdout.splitlines() if l.strip().startswith("NCCL")), "")
    check(r.returncode == 0 and "NO: not usable" in nccl_line, f"a header and library that do not link are not NCCL: {nccl_line!r}")

if failures:
    sys.exit(f"{len(failures)} check(s) failed")
print("all checks passed")
