#!/usr/bin/env python3
"""The adjoint example's disk tier (--disk-snapshots K --disk-dir PATH), as a user runs it: the
gradient bitwise equal to store-all's, the disk snapshots used (fewer extra forward steps than
the two tiers alone), nothing left in the directory; and bad input (no directory, one that does
not exist or is a file, no host snapshot to stage through, store-all snapshots that leave the
disk nothing), each a message naming it, never a crash.

usage: check_disk.py ADJOINT WORK_DIR"""
import json, pathlib, shutil, subprocess, sys

exe, work = sys.argv[1], pathlib.Path(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


base = [exe, "--steps", "150", "--size", "48", "--snapshots", "3", "--host-snapshots", "1"]
r = subprocess.run([*base, "--disk-snapshots", "4", "--disk-dir", str(work), "--json", "--check"], capture_output=True, text=True, timeout=240)
check(r.returncode == 0, f"the disk run failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
try:
    doc = json.loads(r.stdout)
    runs = {x["strategy"].split(",")[0]: x for x in doc["runs"]}
    check(doc["gradients_bitwise_equal"], "gradients differ")
    three, two = runs.get("three tiers"), runs.get("two tiers")
    check(three is not None and two is not None, f"runs: {list(runs)}")
    if three and two:
        check(three["peak_disk_bytes"] > 0, f"the three-tier run wrote nothing to disk: {three}")
        check(three["gradient_checksum"] == runs["store all"]["gradient_checksum"], "the disk run's gradient is not store-all's")
        check(three["extra_forward_steps"] < two["extra_forward_steps"],
              f"disk snapshots did not cut the extra forward steps: {three['extra_forward_steps']} vs {two['extra_forward_steps']}")
    print(f"disk run: extra forward steps {three and three['extra_forward_steps']} (two tiers: {two and two['extra_forward_steps']})")
except (ValueError, KeyError) as e:
    check(False, f"the disk run's JSON: {e!r}\n{r.stdout[-2000:]}")
check(not any(work.iterdir()), f"files left in {work}: {list(work.iterdir())}")

for args, says in (
    (["--disk-snapshots", "2"], "--disk-snapshots needs --disk-dir PATH"),
    (["--disk-snapshots", "2", "--disk-dir", str(work / "no" / "such" / "dir")], str(work / "no" / "such" / "dir")),
    (["--disk-dir", str(work)], "--disk-dir without --disk-snapshots"),
    ([exe, "--steps", "150", "--snapshots", "3", "--disk-snapshots", "2", "--disk-dir", str(work)], "needs --host-snapshots >= 1"),
    # Issue 40: store-all snapshots dropped the disk tier without a word, and never looked at --disk-dir.
    ([exe, "--steps", "150", "--size", "48", "--snapshots", "150", "--host-snapshots", "1", "--disk-snapshots", "2", "--disk-dir", str(work)],
     "with --snapshots 150 >= --steps 150 (store all"),
    ([exe, "--steps", "150", "--size", "48", "--snapshots", "400", "--host-snapshots", "1", "--disk-snapshots", "2", "--disk-dir",
      str(work / "missing")], "--disk-snapshots 2 with --snapshots 400 >= --steps 150"),
    ([exe, "--steps", "150", "--size", "48", "--snapshots", "3", "--disk-snapshots", "2", "--host-snapshots", "1", "--disk-dir",
      str(work / "missing")], "--disk-dir " + str(work / "missing") + ": no such directory"),
    ([exe, "--steps", "150", "--size", "48", "--snapshots", "3", "--disk-snapshots", "2", "--host-snapshots", "1", "--disk-dir",
      str(pathlib.Path(__file__).resolve())], ": not a directory"),
):
    cmd = args if args[0] == exe else [*base, *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    check(r.returncode == 2 and says in r.stderr, f"{' '.join(cmd[1:])}: exit {r.returncode}, stderr lacks {says!r}:\n{r.stderr[-1500:]}")
    check("terminate called" not in r.stderr and "Traceback" not in r.stderr, f"{cmd}: crashed:\n{r.stderr}")

for f in failures:
    print("FAIL:", f)
print(f"adjoint disk tier: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
