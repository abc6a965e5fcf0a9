"""A pipeline rank that fails must not hang the job: run `pipeline_parallel` under mpirun with
--fail-rank 2 (every other rank must exit non-zero naming rank 2, within 30 s), with --stall-rank 2
and a short timeout (its neighbours time out naming it), with --longer-rank 2 (boundaries of
another size, refused by name), with hostile partitions (refused by name on every rank; interleaved
ones too), with a failing rank of an interleaved ring, and with --kill-rank 2 (rank 2 killed by SIGKILL: the job must end, non-zero, within 30 s).

    python3 check_failures.py MPIRUN PIPELINE_PARALLEL
"""
import re
import subprocess
import sys
import time

mpirun, exe = sys.argv[1], sys.argv[2]
base = [mpirun, "--oversubscribe", "-np", "4", exe, "--pp-schedule", "1f1b", "--micro-batches", "4", "--policy",
        "offload-all", "--steps", "3"]
failed = []


def run(extra, tail=None, order="1f1b"):
    """Runs the job with `extra` (and the stage order `order`), prints its output, and notes a
    failure unless it ended non-zero within 30 s; returns the output."""
    name = " ".join(extra[:2])
    t0 = time.monotonic()
    try:
        p = subprocess.run([order if a == "1f1b" else a for a in base] + extra, capture_output=True, text=True, timeout=60)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        rc, out = None, ""
    secs = time.monotonic() - t0
    print(f"{name}: exit {rc} after {secs:.1f} s\n{out[-tail:] if tail else out}")
    if rc is None or rc == 0 or secs > 30:
        failed.append(f"{name}: exit {rc} after {secs:.1f} s (want non-zero within 30 s)")
    return out


out = run(["--fail-rank", "2"])
for r in (0, 1, 3):
    line = next((l for l in out.splitlines() if l.startswith(f"pipeline_parallel: rank {r}:")), None)
    if line is None or not re.search(r"stage 2 \(rank 2\) failed or stopped answering", line):
        failed.append(f"rank {r} did not report that rank 2 failed: {line!r}")
if not any(l.startswith("pipeline_parallel: rank 2:") and "fails on purpose" in l for l in out.splitlines()):
    failed.append("rank 2 did not report its own error")

out = run(["--stall-rank", "2", "--timeout-ms", "1500"])
if not re.search(r"timed out after 1500 ms waiting for .* stage 2 \(rank 2\)", out):
    failed.append("no rank reported timing out on rank 2")

out = run(["--longer-rank", "2"])
if not re.search(r"stage [123] \(rank [123]\) sent (more than the )?\d+ bytes.*must agree on the carry's size", out):
    failed.append("no rank refused a boundary of another size by name")

# Hostile partitions: every rank refuses them, naming what is wrong.
for extra, want in ((["--partition", "1,2,2"], r"stage_partition::layers has 3 entries for 4 stages"),
                    (["--partition", "1,2,0,1"], r"stage 2 gets no layer"),
                    (["--partition", "1,2,2,1", "--layers", "8"], r"gives 6 layers to its stages, but the model has 8"),
                    (["--partition", "1,x,2,1"], r"--partition: 'x' is not a layer count")):
    out = run(extra)
    for r in range(4):
        if not any(l.startswith(f"pipeline_parallel: rank {r}:") and re.search(want, l) for l in out.splitlines()):
            failed.append(f"{' '.join(extra)}: rank {r} did not say /{want}/")

# Interleaved: the partition lists a count per chunk of each stage (4 stages x 2 chunks).
for extra, want in ((["--partition", "1,2,2,1"], r"stage_partition::layers has 4 entries for 8 stages"),
                    (["--partition", "1,2,2,2,2,0,2,1"], r"stage 5 gets no layer"),
                    (["--virtual-stages", "300"], r"virtual_stages is above tide::max_virtual_stages")):
    out = run(extra, order="interleaved")
    for r in range(4):
        if not any(l.startswith(f"pipeline_parallel: rank {r}:") and re.search(want, l) for l in out.splitlines()):
            failed.append(f"interleaved {' '.join(extra)}: rank {r} did not say /{want}/")
out = run(["--virtual-stages", "2"])
if "--virtual-stages needs --pp-schedule interleaved" not in out:
    failed.append("--virtual-stages without interleaving was not refused by name")
out = run(["--fail-rank", "1"], order="interleaved")
for r in (0, 2, 3):
    line = next((l for l in out.splitlines() if l.startswith(f"pipeline_parallel: rank {r}:")), None)
    if line is None or not re.search(r"stage 1 \(rank 1\) failed or stopped answering", line):
        failed.append(f"interleaved: rank {r} did not report that rank 1 failed: {line!r}")

run(["--kill-rank", "2"], tail=2000)

for f in failed:
    print("FAILED:", f)
sys.exit(1 if failed else 0)
