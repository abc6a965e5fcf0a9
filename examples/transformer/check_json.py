#!/usr/bin/env python3
"""Runs the transformer demo with --json and checks its keys and invariants: every run has the
keys docs and scripts read, the checksums agree with the model trained without tide, and the
largest-micro-batch list names every policy."""
import json
import subprocess
import sys

RUN_KEYS = {"policy", "step_ms", "tokens_per_s", "device_peak_bytes", "measured_device_peak_bytes", "host_bytes",
            "exposed_ms", "overlap", "loss_first", "loss_last", "checksum"}
POLICIES = {"keep-all", "full-remat", "llama-qkv-naive", "llama-qkv-lhs", "deepseek-naive", "deepseek-lhs",
            "deepseek-lhs-pipelined"}


def main():
    p = subprocess.run([sys.argv[1]] + sys.argv[2:] + ["--json"], capture_output=True, text=True, timeout=600)
    problems = []
    if p.returncode != 0:
        problems.append(f"exit status {p.returncode}: {p.stderr.strip()}")
    d = json.loads(p.stdout)
    runs = d["runs"]
    names = {r["policy"] for r in runs}
    if not POLICIES <= names:
        problems.append(f"policies {sorted(names)} lack {sorted(POLICIES - names)}")
    for r in runs:
        if set(r) != RUN_KEYS:
            problems.append(f"{r.get('policy')}: keys {sorted(r)}")
        elif r["checksum"] != d["reference_checksum"]:
            problems.append(f"{r['policy']}: checksum {r['checksum']} is not the model's {d['reference_checksum']}")
    fits = d["largest_microbatch"]
    if {f["policy"] for f in fits} != names or any(set(f) != {"policy", "microbatch", "tokens_per_s"} for f in fits):
        problems.append(f"largest_microbatch rows: {fits}")
    if not (d["checksums_equal"] and d["loss_decreased"]):
        problems.append("checksums_equal or loss_decreased is false")
    for x in problems:
        print("check_json:", x, file=sys.stderr)
    print(f"check_json: {len(runs)} runs, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
