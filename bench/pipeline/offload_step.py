#!/usr/bin/env python3
"""Pipeline offload benchmark: a 2-stage 1F1B step of examples/pipeline_parallel under keep-all and
offload-all, side by side in one run, with the host link paced as the demo paces it (the offloads
of a step take `--link-ratio` of the forward compute they hide behind).

    python3 bench/pipeline/offload_step.py BUILD_DIR [--repeats 5] [--steps 12] [--json]

Pacing: calibration runs (keep-all, unpaced; the median of three) measure stage 0's compute per step; forward is
taken as a third of it (backward twice the forward: an assumption, the transformer's ratio in
docs/performance.md); an offload-all run gives the bytes offloaded per step on stage 0. The link
then runs at bytes / (ratio x forward) each way. The step of the pipeline is its slowest stage's;
each policy's is the median of `--repeats` runs (each run's own median over its steps), the runs
alternating between the two policies.
"""
import argparse, json, os, shutil, statistics, subprocess, sys

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("--repeats", type=int, default=5)
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--micro-batches", type=int, default=8)
ap.add_argument("--width", type=int, default=128)
ap.add_argument("--layers-per-stage", type=int, default=4)
ap.add_argument("--link-ratio", type=float, default=0.7, help="0: copies unpaced, as fast as memcpy")
ap.add_argument("--json", action="store_true")
a = ap.parse_args()
exe = os.path.join(a.build, "examples", "pipeline_parallel", "pipeline_parallel")
mpirun = shutil.which("mpirun")
if not os.path.exists(exe) or not mpirun:
    sys.exit(f"offload_step.py: needs mpirun and {exe} (meson setup with MPI and OpenBLAS)")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OPENBLAS_NUM_THREADS="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def run(policy, gbps=0.0):
    cmd = [mpirun, "--oversubscribe", "-np", "2", exe, "--pp-schedule", "1f1b", "--micro-batches", str(a.micro_batches),
           "--policy", policy, "--steps", str(a.steps), "--width", str(a.width), "--layers-per-stage",
           str(a.layers_per_stage), "--link-gbps", repr(gbps), "--no-debug-checks", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        sys.exit(f"offload_step.py: {' '.join(cmd)} failed:\n{p.stdout}{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# The median of three calibration runs: one run's compute time varies by 10% on a shared VM, and
# the link's pace (how hard the offloads are to hide) with it.
forward_ms = statistics.median(run("keep-all")["stages"][0]["compute_ms"] for _ in range(3)) / 3
copied = run("offload-all")["stages"][0]["offloaded_bytes_per_step"]
gbps = copied / (a.link_ratio * forward_ms / 1e3) / 1e9 if a.link_ratio > 0 else 0.0  # 0: unpaced (memcpy speed)
rows = {"keep-all": [], "offload-all": []}
peaks = {}
for _ in range(a.repeats):
    for policy in rows:
        r = run(policy, gbps)
        rows[policy].append(max(s["step_ms"] for s in r["stages"]))
        peaks[policy] = r["stages"][0]["measured_device_peak_bytes"]
med = {k: statistics.median(v) for k, v in rows.items()}
out = {"stages": 2, "pp_schedule": "1f1b", "micro_batches": a.micro_batches, "link_gbps": gbps, "link_ratio": a.link_ratio,
       "forward_ms_stage0": forward_ms, "offloaded_bytes_per_step_stage0": copied,
       "step_ms": med, "runs_ms": rows, "stage0_device_peak_bytes": peaks,
       "offload_over_keep": med["offload-all"] / med["keep-all"]}
if a.json:
    print(json.dumps(out, indent=1))
else:
    print(f"2-stage 1F1B, {a.micro_batches} micro-batches, " +
          (f"link paced at {gbps:.3f} GB/s (offloads {a.link_ratio} of stage 0's forward, {forward_ms:.2f} ms)" if gbps
           else "copies unpaced"))
    print(f"{'policy':12} {'step ms (median)':>18} {'runs':>40} {'stage 0 peak':>14}")
    for k in rows:
        print(f"{k:12} {med[k]:18.2f} {' '.join(f'{x:.1f}' for x in rows[k]):>40} {peaks[k]:14}")
    print(f"offload-all / keep-all: {out['offload_over_keep']:.3f}")
