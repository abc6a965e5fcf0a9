#!/usr/bin/env python3
"""Runs `plan --published --json` and checks its rows: every key the issue names, every strategy
for each model and machine, numbers that are numbers, and the published experiment's host bytes
(145.1 GiB for DeepSeek-V3 at micro-batch 8, from the slot sizes alone)."""
import json
import subprocess
import sys

KEYS = {"model", "hardware", "microbatch", "strategy", "step_ms", "tflops_per_device", "device_peak_gib",
        "activation_peak_gib", "host_gib", "fits", "largest_microbatch"}
STRATEGIES = {"keep-all", "full-remat", "offload-naive", "offload-lhs", "offload-lhs-pipelined", "planner"}


def main():
    out = subprocess.run([sys.argv[1], "--published", "--json"], check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    problems = []
    groups = {}
    for r in rows:
        if set(r) != KEYS:
            problems.append(f"row keys {sorted(r)} are not {sorted(KEYS)}")
            continue
        groups.setdefault((r["model"], r["hardware"]), set()).add(r["strategy"])
        for k in ("step_ms", "tflops_per_device", "device_peak_gib", "activation_peak_gib", "host_gib"):
            if not isinstance(r[k], (int, float)) or r[k] < 0:
                problems.append(f"{r['model']} {r['strategy']}: {k} = {r[k]!r}")
        if not isinstance(r["fits"], bool):
            problems.append(f"{r['model']} {r['strategy']}: fits = {r['fits']!r}")
        if r["device_peak_gib"] < r["activation_peak_gib"]:
            problems.append(f"{r['model']} {r['strategy']}: the device peak is below the activation peak")
    if len(groups) < 2:
        problems.append(f"only {len(groups)} model/hardware groups")
    for g, s in groups.items():
        if s != STRATEGIES:
            problems.append(f"{g}: strategies {sorted(s)}, want {sorted(STRATEGIES)}")
    ds = [r for r in rows if r["model"].startswith("DeepSeek") and r["hardware"].startswith("GB200")
          and r["strategy"] == "offload-lhs"]
    if len(ds) != 1 or abs(ds[0]["host_gib"] - 145.1) > 0.1:
        problems.append(f"DeepSeek-V3 offload-lhs on GB200: host {ds[0]['host_gib'] if ds else None} GiB, want 145.1")
    for p in problems:
        print("check_published:", p, file=sys.stderr)
    print(f"check_published: {len(rows)} rows, {len(groups)} groups, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
