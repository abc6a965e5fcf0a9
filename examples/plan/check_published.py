#!/usr/bin/env python3
"""Runs `plan --published --json` and checks its rows: every key the issues name, every strategy
for each model and machine, numbers that are numbers, the published experiment's host bytes
(145.1 GiB for DeepSeek-V3 at micro-batch 8, from the slot sizes alone), and what the model of
issue 24 puts in the numbers:
- without latency hiding the collectives are exposed too (on the compute stream);
- full remat recomputes the forward a backward needs (DeepSeek-V3: all of it but the shared
  expert's down projection and the residual add, so above 95% of the forward);
- the offload rows rematerialize the dispatch and the experts' outputs (their recompute is most
  of full remat's), and attention's two outputs are one recompute charge;
- the on-device row (the offload policy with its tensors kept) fits fewer micro-batches than
  offload with latency hiding, and not the study's micro-batch 8 on GB200;
- a deep prefetch window costs device memory: the pipelined row's peak is above the
  latency-hidden one's, which is above the row without latency hiding;
- a step's parts never exceed it."""
import json
import subprocess
import sys

PARTS = ["forward_ms", "backward_ms", "recompute_ms", "exposed_copy_ms", "exposed_collective_ms"]
KEYS = {"model", "hardware", "microbatch", "strategy", "step_ms", "tflops_per_device", "device_peak_gib",
        "activation_peak_gib", "host_gib", "fits", "largest_microbatch", *PARTS}
STRATEGIES = {"keep-all", "full-remat", "on-device", "offload-naive", "offload-lhs", "offload-lhs-pipelined", "planner"}


def main():
    out = subprocess.run([sys.argv[1], "--published", "--json"], check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    problems = []
    groups = {}
    for r in rows:
        if set(r) != KEYS:
            problems.append(f"row keys {sorted(r)} are not {sorted(KEYS)}")
            continue
        groups.setdefault((r["model"], r["hardware"]), {})[r["strategy"]] = r
        for k in ("step_ms", "tflops_per_device", "device_peak_gib", "activation_peak_gib", "host_gib", *PARTS):
            if not isinstance(r[k], (int, float)) or r[k] < 0:
                problems.append(f"{r['model']} {r['strategy']}: {k} = {r[k]!r}")
        if not isinstance(r["fits"], bool):
            problems.append(f"{r['model']} {r['strategy']}: fits = {r['fits']!r}")
        if r["device_peak_gib"] < r["activation_peak_gib"]:
            problems.append(f"{r['model']} {r['strategy']}: the device peak is below the activation peak")
        if sum(r[k] for k in PARTS) > r["step_ms"] * (1 + 1e-9):
            problems.append(f"{r['model']} {r['strategy']}: its parts exceed its step")
    if len(groups) < 2:
        problems.append(f"only {len(groups)} model/hardware groups")
    for g, s in groups.items():
        if set(s) != STRATEGIES:
            problems.append(f"{g}: strategies {sorted(s)}, want {sorted(STRATEGIES)}")
            continue
        naive, lhs, pipe, remat, dev = (s[k] for k in ("offload-naive", "offload-lhs", "offload-lhs-pipelined", "full-remat", "on-device"))
        if not naive["exposed_collective_ms"] > 10 * max(lhs["exposed_collective_ms"], 1):
            problems.append(f"{g}: offload-naive's collectives are not exposed ({naive['exposed_collective_ms']} ms)")
        if not naive["step_ms"] > lhs["step_ms"]:
            problems.append(f"{g}: offload without latency hiding is not slower than with it")
        if not pipe["device_peak_gib"] > lhs["device_peak_gib"] > naive["device_peak_gib"]:
            problems.append(f"{g}: device peaks pipelined {pipe['device_peak_gib']}, lhs {lhs['device_peak_gib']}, "
                            f"naive {naive['device_peak_gib']} are not in the order the prefetch windows give")
        if not dev["largest_microbatch"] < lhs["largest_microbatch"]:
            problems.append(f"{g}: on-device fits micro-batch {dev['largest_microbatch']}, offload-lhs {lhs['largest_microbatch']}")
        if not (dev["recompute_ms"] == naive["recompute_ms"] or abs(dev["recompute_ms"] / naive["recompute_ms"] - 1) < 1e-3):
            problems.append(f"{g}: on-device recomputes {dev['recompute_ms']} ms, the offload rows {naive['recompute_ms']}")
        if g[0].startswith("DeepSeek"):
            if not remat["recompute_ms"] > 0.95 * remat["forward_ms"]:
                problems.append(f"{g}: full remat recomputes {remat['recompute_ms']} ms of a {remat['forward_ms']} ms forward")
            if not 0.5 * remat["recompute_ms"] < lhs["recompute_ms"] < remat["recompute_ms"]:
                problems.append(f"{g}: offload-lhs recomputes {lhs['recompute_ms']} ms beside full remat's {remat['recompute_ms']}")
    ds = groups.get(next((g for g in groups if g[0].startswith("DeepSeek") and g[1].startswith("GB200")), None), {})
    lhs = ds.get("offload-lhs")
    if not lhs or abs(lhs["host_gib"] - 145.1) > 0.1:
        problems.append(f"DeepSeek-V3 offload-lhs on GB200: host {lhs['host_gib'] if lhs else None} GiB, want 145.1")
    dev = ds.get("on-device")
    if not dev or dev["fits"] or dev["largest_microbatch"] < 1:
        problems.append(f"DeepSeek-V3 on-device on GB200 should fit a smaller micro-batch but not 8: {dev}")
    if lhs and not lhs["fits"]:
        problems.append("DeepSeek-V3 offload-lhs on GB200 does not fit micro-batch 8")
    for p in problems:
        print("check_published:", p, file=sys.stderr)
    print(f"check_published: {len(rows)} rows, {len(groups)} groups, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
