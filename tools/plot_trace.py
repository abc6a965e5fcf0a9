#!/usr/bin/env python3
"""Draws a tide Chrome trace (written with --trace FILE) as a PNG: one lane per stream with
each op as a bar, waits hatched, and the device (and host) bytes live below.

usage: plot_trace.py TRACE.json OUT.png [--title TEXT]"""
import argparse, json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"forward": "#4C72B0", "recompute": "#8172B2", "advance": "#CCB974", "backward": "#55A868",
          "offload": "#DD8452", "prefetch": "#C44E52", "gather": "#937860", "collective": "#937860", "wait": "#DDDDDD"}
SAME_AS = {"regather": "gather", "reduce": "collective"}  # one colour, one legend entry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    with open(a.trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    title = a.title or next((e["args"]["name"] for e in events if e.get("name") == "process_name"), "tide")
    fig, (ax, mem) = plt.subplots(2, 1, figsize=(14, 6), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for e in events:
        if e.get("ph") != "X":
            continue
        y = len(lanes) - 1 - e["tid"]
        cat = SAME_AS.get(e.get("cat", ""), e.get("cat", ""))
        ax.broken_barh([(e["ts"] / 1000, e["dur"] / 1000)], (y - 0.4, 0.8), facecolors=COLORS.get(cat, "#999999"),
                       edgecolor="white" if cat != "wait" else "#999999", linewidth=0.3,
                       hatch="//" if cat == "wait" else None)
    ax.set_yticks([len(lanes) - 1 - t for t in lanes], [lanes[t] for t in lanes])
    ax.set_title(title)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, COLORS.keys(), ncol=len(COLORS), loc="upper center", bbox_to_anchor=(0.5, -0.02), fontsize=8,
              frameon=False)
    for name, color in (("device bytes", "#4C72B0"), ("host bytes", "#DD8452")):
        pts = [(e["ts"] / 1000, e["args"]["live"] / 2**20) for e in events if e.get("ph") == "C" and e["name"] == name]
        if pts:
            xs, ys = zip(*pts)
            mem.step(xs, ys, where="post", color=color, label=name + " live")
    predicted = doc.get("otherData", {}).get("predicted_device_bytes")
    if predicted:
        mem.axhline(predicted / 2**20, color="#4C72B0", linestyle="--", linewidth=0.8, label="predicted device peak")
    mem.set_ylabel("MiB")
    mem.set_xlabel("ms")
    mem.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
