"""A pipeline rank that fails must not hang the job: run `pipeline_parallel` under mpirun with
--fail-rank 2 (every other rank must exit non-zero naming rank 2, within 30 s), with --stall-rank 2
and a short timeout (its neighbours time out naming it), with --longer-rank 2 (boundaries of
another size, refused by name) and with --kill-rank 2 (rank 2 killed by SIGKILL: the job must end,
non-zero, within 30 s).

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


def run(extra):
    t0 = time.monotonic()
    try:
        p = subprocess.run(base + extra, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, 60.0, ""
    return p.returncode, time.monotonic() - t0, p.stdout + p.stderr


rc, secs, out = run(["--fail-rank", "2"])
print(f"--fail-rank 2: exit {rc} after {secs:.1f} s\n{out}")
if rc is None or rc == 0 or secs > 30:
    failed.append(f"--fail-rank 2: exit {rc} after {secs:.1f} s (want non-zero within 30 s)")
for r in (0, 1, 3):
    line = next((l for l in out.splitlines() if l.startswith(f"pipeline_parallel: rank {r}:")), None)
    if line is None or not re.search(r"stage 2 \(rank 2\) failed or stopped answering", line):
        failed.append(f"rank {r} did not report that rank 2 failed: {line!r}")
if not any(l.startswith("pipeline_parallel: rank 2:") and "fails on purpose" in l for l in out.splitlines()):
    failed.append("rank 2 did not report its own error")

rc, secs, out = run(["--stall-rank", "2", "--timeout-ms", "1500"])
print(f"--stall-rank 2: exit {rc} after {secs:.1f} s\n{out}")
if rc is None or rc == 0 or secs > 30:
    failed.append(f"--stall-rank 2: exit {rc} after {secs:.1f} s (want non-zero within 30 s)")
if not re.search(r"timed out after 1500 ms waiting for .* stage 2 \(rank 2\)", out):
    failed.append("no rank reported timing out on rank 2")

rc, secs, out = run(["--longer-rank", "2"])
print(f"--longer-rank 2: exit {rc} after {secs:.1f} s\n{out}")
if rc is None or rc == 0 or secs > 30:
    failed.append(f"--longer-rank 2: exit {rc} after {secs:.1f} s (want non-zero within 30 s)")
if not re.search(r"stage [123] \(rank [123]\) sent (more than the )?\d+ bytes.*must agree on the carry's size", out):
    failed.append("no rank refused a boundary of another size by name")

rc, secs, out = run(["--kill-rank", "2"])
print(f"--kill-rank 2: exit {rc} after {secs:.1f} s\n{out[-2000:]}")
if rc is None or rc == 0 or secs > 30:
    failed.append(f"--kill-rank 2: exit {rc} after {secs:.1f} s (want non-zero within 30 s)")

for f in failed:
    print("FAILED:", f)
sys.exit(1 if failed else 0)
