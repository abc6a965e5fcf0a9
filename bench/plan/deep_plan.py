#!/usr/bin/env python3
"""Planning depth (issue 42, item 4): a deep model file through tide-plan.

Writes a model file of LAYERS identical layers of one 8-slot type (an input slot and seven
others; costs as FLOPs and bytes, so every layer costs the same on the hardware preset), runs
`tide-plan --model-file ... --json` on it and prints the CPU seconds (user + system), the peak
resident set, the plan's step, the lower bound and the gap between them, and how many layers were
planned as groups. The budgets are H100's at 100,000 layers (80 GiB less 8 GiB resident; the
preset's pinnable host memory) and scaled with the depth below it: at every size the device holds
14% of the activations and the host budget 40%, so keep, offload and remat all take part. Below
2,500 layers (20,000 decisions) tide-plan plans every layer: the same model at 2,000 layers is the
ungrouped planner's reference gap.

    bench/plan/deep_plan.py build/tide-plan                 # 100,000 layers
    bench/plan/deep_plan.py build/tide-plan --layers 2000 --layers 3000 --layers 10000 --layers 100000 --goal
    bench/plan/deep_plan.py build/tide-plan --interleaved --layers 2000 --layers 100000 --goal

--interleaved (issue 54): dense and MoE layers alternating, two types of different slots and costs
(the MoE layer's expert activations twice the dense MLP's, its forward 1.5 times the dense one's),
the same budgets (so smaller shares of its larger activations); grouping plans such a stack by blocks of two layers.

--goal: exit 1 when the largest run takes over 10 s of CPU or 1 GiB (the issue's goal).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

MIB = 1 << 20
# At 100,000 layers: H100's 80 GiB less 8 GiB resident, the preset's pinnable host bytes (GiB).
DEVICE_GIB = 66.51
HOST_GIB = 186.26
GIB_FLOP = 1 << 30


def model(layers, interleaved=False):
    def slot(name, mib16, flops16=None, read16=None, inp=False):
        s = {"name": name, "bytes": mib16 * MIB // 16}
        if inp:
            s["input"] = True
        else:
            s["recompute_flops"] = flops16 * GIB_FLOP // 16
            s["recompute_bytes"] = read16 * MIB // 16
        return s
    dense = {
        "name": "block",
        "slots": [slot("layer_input", 4, inp=True), slot("attn_norm", 4, 0, 8), slot("qkv", 12, 12, 16),
                  slot("attn_out", 4, 16, 24), slot("mlp_norm", 4, 0, 8), slot("mlp_up", 16, 16, 20),
                  slot("mlp_act", 16, 0, 32), slot("mlp_down_in", 16, 0, 32)],
        "cost": {"forward_flops": 4 * GIB_FLOP, "forward_bytes": 10 * MIB},
    }
    if interleaved:
        moe = {
            "name": "moe",
            "slots": [slot("layer_input", 4, inp=True), slot("attn_norm", 4, 0, 8), slot("qkv", 12, 12, 16),
                      slot("attn_out", 4, 16, 24), slot("moe_norm", 4, 0, 8), slot("router", 1, 1, 4),
                      slot("expert_up", 32, 24, 40), slot("expert_act", 32, 0, 64), slot("expert_down_in", 32, 0, 64)],
            "cost": {"forward_flops": 6 * GIB_FLOP, "forward_bytes": 16 * MIB},
        }
        return {
            "name": f"deep: {layers} layers, dense and MoE alternating",
            "precision": "bf16",
            "resident_bytes": 8 << 30,
            "layer_types": [dense, moe],
            "layers": [{"type": "moe" if i % 2 else "block"} for i in range(layers)],
        }
    return {
        "name": f"deep: {layers} layers of one 8-slot block",
        "precision": "bf16",
        "resident_bytes": 8 << 30,
        "layer_types": [dense],
        "layers": [{"type": "block", "count": layers}],
    }


def decisions(layers, interleaved):
    return (layers // 2) * 8 + (layers - layers // 2) * 9 if interleaved else 8 * layers


def run(tide_plan, layers, hardware, interleaved=False):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "deep.json")
        with open(path, "w") as f:
            json.dump(model(layers, interleaved), f)
        # The budgets scaled with the depth: every size holds the same shares of its activations.
        share = layers / 100000
        cmd = [tide_plan, "--model-file", path, "--hardware", hardware, "--max-decisions", str(decisions(layers, interleaved)), "--json", "--quiet",
               "--device-memory", f"{8 + DEVICE_GIB * share:.6f}", "--host-budget", f"{HOST_GIB * share:.6f}"]
        proc = subprocess.run(cmd, capture_output=True)
        if proc.returncode != 0:
            sys.exit(f"deep_plan: {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode()}")
        return json.loads(proc.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tide_plan")
    ap.add_argument("--layers", type=int, action="append", help="layers (repeatable; default 100000)")
    ap.add_argument("--hardware", default="h100")
    ap.add_argument("--interleaved", action="store_true", help="dense and MoE layers alternating (two types)")
    ap.add_argument("--goal", action="store_true", help="exit 1 when the largest run is over 10 s of CPU or 1 GiB")
    a = ap.parse_args()
    sizes = sorted(a.layers or [100000])
    print(f"{'layers':>8} {'decisions':>10} {'cpu s':>7} {'peak RSS':>10} {'step ms':>10} {'bound ms':>10} {'gap':>7} {'grouped':>8}")
    last = None
    for n in sizes:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        j = run(a.tide_plan, n, a.hardware, a.interleaved)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        rss_mib = after.ru_maxrss / 1024  # the largest child so far (Linux: KiB): sizes run smallest first
        p = j["plan"]
        print(f"{n:>8} {decisions(n, a.interleaved):>10} {cpu:>7.2f} {rss_mib:>7.0f} MiB {p['step_us'] / 1e3:>10.2f} {p['lower_bound_ms']:>10.2f} "
              f"{100 * p['gap_to_bound']:>6.2f}% {p.get('grouped_layers', 0):>8}")
        last = (cpu, rss_mib)
    if a.goal and last and (last[0] > 10 or last[1] > 1024):
        print(f"deep_plan: over the goal (10 s of CPU, 1 GiB): {last[0]:.2f} s, {last[1]:.0f} MiB")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
