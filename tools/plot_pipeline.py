#!/usr/bin/env python3
"""Draws a pipeline step from its stages' Chrome traces (pipeline_parallel --trace PREFIX writes
PREFIX.stage<s>.json) as a PNG: per stage, its compute, offload (d2h), prefetch (h2d) and
boundary (comm) lanes, each op a bar (each stage's first layer's forward and backward labelled with its micro-batch),
the gaps where a lane waits. The stages start the traced
step after a barrier; each trace's clock starts at its own step start (microseconds apart).

usage: plot_pipeline.py PREFIX OUT.png [--title TEXT]"""
import argparse, glob, json, re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"forward": "#4C72B0", "recompute": "#8172B2", "backward": "#55A868", "turn": "#000000",
          "offload": "#DD8452", "prefetch": "#C44E52", "send": "#937860", "receive": "#CCB974"}
LANES = ["compute", "d2h", "h2d", "comm"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("prefix")
    ap.add_argument("out")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    files = sorted(glob.glob(a.prefix + ".stage*.json"), key=lambda f: int(re.search(r"stage(\d+)\.json$", f).group(1)))
    if not files:
        raise SystemExit(f"plot_pipeline.py: no {a.prefix}.stage*.json")
    rows = len(files) * (len(LANES) + 1)
    fig, ax = plt.subplots(figsize=(15, 0.32 * rows + 1.5))
    ticks, labels = [], []
    for s, path in enumerate(files):
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
        for k, lane in enumerate(LANES):
            y = rows - 1 - (s * (len(LANES) + 1) + k)
            ticks.append(y)
            labels.append(f"stage {s} {lane}")
            for e in events:
                if e.get("ph") != "X" or names.get(e["tid"]) != lane or e.get("cat") == "wait":
                    continue  # waits left out: the gaps are where a lane waits
                cat = e.get("cat", "")
                x, w = e["ts"] / 1000, e["dur"] / 1000
                ax.broken_barh([(x, w)], (y - 0.4, 0.8), facecolors=COLORS.get(cat, "#999999"),
                               edgecolor="white" if cat != "wait" else "#999999", linewidth=0.3,
                               hatch="//" if cat == "wait" else None)
                m = re.search(r" mb(\d+)$", e.get("name", ""))
                if m and cat in ("forward", "backward") and e["name"].startswith(("forward L0 ", "backward L0 ")):
                    ax.text(x + w / 2, y, m.group(1), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_xlabel("ms from the step's start")
    ax.set_title(a.title or "pipeline step")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, COLORS.keys(), ncol=len(COLORS), loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
