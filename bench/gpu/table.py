#!/usr/bin/env python3
"""The GPU check's table and goals, from gpu_bench's rows (JSON Lines, one case a line, written as
each case ends: bench/gpu/harness.hpp).

usage: table.py GPU_BENCH_JSON [--expect NAMES_FILE]

Reads whatever a run left: a missing file or no rows gives a table of "not measured" cells; a last
line cut short (the run was killed mid-write) is skipped and said; a row carrying "error" is shown
with its error. --expect names the cases the program defines (gpu_bench --list), so that a row that
never came is listed by name. Exits 0 whatever it read: the check's verdict is its phases'."""
import json
import sys


def read_rows(path):
    """The rows, and notes on what the file lacked."""
    rows, notes = {}, []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
    except OSError as e:
        return rows, [f"no benchmark output ({e.strerror}: {path})"]
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            last = all(not l.strip() for l in lines[n:])
            notes.append(f"line {n} of {path} is not JSON" + (" (the run ended while writing it: its row is lost)" if last else ""))
            continue
        if isinstance(r, dict) and isinstance(r.get("name"), str):
            rows[r["name"]] = r
    return rows, notes


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows, notes = read_rows(sys.argv[1])
    expected = []
    if "--expect" in sys.argv:
        with open(sys.argv[sys.argv.index("--expect") + 1]) as f:
            expected = [l.strip() for l in f if l.strip()]
    failed = {k: r["error"] for k, r in rows.items() if "error" in r}
    runs = {k: r for k, r in rows.items() if "error" not in r}
    missing = []

    def get(name):
        r = runs.get(name)
        if r is None and name not in failed:
            missing.append(name)
        return r

    def field(row, name, default=None):
        return row.get(name, default) if row else default

    empty = get("step_empty")
    empty_us = field(empty, "us")
    print("copy bandwidth, pinned (GB/s)         size    raw   tide  tide/raw  net/raw")
    net_ratios, gross_ratios = [], []
    for d in ("d2h", "h2d"):
        for mib in (1, 16, 64, 256):
            n = mib << 20
            r, t = get(f"{d}_raw/{n}"), get(f"{d}_tide/{n}")
            if r and t and "bytes_per_second" in r and "bytes_per_second" in t:
                rb, tb = r["bytes_per_second"] / 1e9, t["bytes_per_second"] / 1e9
                net = ""
                if empty_us is not None and t.get("us", 0) > empty_us:
                    nb = n / ((t["us"] - empty_us) * 1e-6) / 1e9
                    net = f"{100 * nb / rb:7.1f}%"
                    if mib >= 16:
                        net_ratios.append(nb / rb)
                print(f"  {d}                             {mib:5d} MiB {rb:6.1f} {tb:6.1f}  {100 * tb / rb:6.1f}%  {net:>7s}")
                if mib >= 16:
                    gross_ratios.append(tb / rb)
            else:
                print(f"  {d}                             {mib:5d} MiB   (not measured)")
    print("  tide's fixed cost per step (no op): " + (f"{empty_us:.1f} us" if empty_us is not None else "not measured") +
          "; a tide copy row pays it once, a bare cudaMemcpyAsync does not (net/raw: the copy without it)")

    steps = {}
    for title, prefix in (("16 layers, width 1024, 4096 tokens", "step_"), ("wide: 8 layers, width 8192, 1024 tokens", "step_wide_")):
        print(f"\nstep time ({title})".ljust(52) + " ms     vs keep-all  device MiB  host MiB")
        keep_ms = field(get(prefix + "keep_all"), "real_time")
        names = ("keep_all", "remat", "offload_on_compute", "offload_hidden", "offload_hidden_default_priority",
                 "offload_hidden_chunked") if prefix == "step_" else ("keep_all", "offload_on_compute", "offload_hidden")
        for short in names:
            name = prefix + short
            b = get(name)
            if name in failed:
                print(f"  {name:46s}   (failed: {failed[name]})")
                continue
            if not b or "real_time" not in b:
                print(f"  {name:46s}   (not measured)")
                continue
            ms = b["real_time"]
            steps[name] = b
            rel = f"{100 * (ms / keep_ms - 1):+7.1f}%" if keep_ms else "      ?"
            print(f"  {b.get('label', name):46s} {ms:8.2f}  {rel}  {field(b, 'device_MiB', 0):9.0f} {field(b, 'host_MiB', 0):9.0f}")

    print("\nlargest batch under the keep-all budget         tokens")
    for name in ("max_batch_keep_all", "max_batch_remat", "max_batch_offload_hidden"):
        b = get(name)
        if b and "max_batch" in b:
            print(f"  {b.get('label', name):46s} {int(b['max_batch']):6d}   (budget {field(b, 'budget_MiB', 0):.0f} MiB)")
        else:
            print(f"  {name:46s}   " + (f"(failed: {failed[name]})" if name in failed else "(not measured)"))

    # Copy/compute ratio per phase: offloads can hide only behind the forward, prefetches only behind
    # the backward. Each phase's copies (the hidden offload's host bytes at the measured 16 MiB tide
    # bandwidth of its direction) against that phase's compute, taken as 1/3 and 2/3 of keep-all's
    # step (one GEMM per layer forward, two backward: an estimate from the GEMM count, not a timing).
    bw = {d: runs[f"{d}_tide/16777216"]["bytes_per_second"] for d in ("d2h", "h2d")
          if "bytes_per_second" in runs.get(f"{d}_tide/16777216", {})}

    def phase_ratios(prefix):
        hidden, keep = steps.get(prefix + "offload_hidden"), steps.get(prefix + "keep_all")
        if not hidden or not keep or len(bw) < 2:
            return None
        host = field(hidden, "host_MiB", 0) * (1 << 20)
        keep_ms = keep["real_time"]
        return (1e3 * host / bw["d2h"]) / (keep_ms / 3), (1e3 * host / bw["h2d"]) / (2 * keep_ms / 3)

    def goal(name, text, ok):
        print(f"  {name} {'met' if ok else 'missed' if ok is not None else 'not measured'}: {text}")

    print()
    ratios_by_case = {}
    for title, prefix in (("16 layers, width 1024", "step_"), ("wide", "step_wide_")):
        r = phase_ratios(prefix)
        ratios_by_case[prefix] = r
        print(f"copy/compute ratio ({title}): " + ("not measured" if r is None else f"forward {r[0]:.2f}, backward {r[1]:.2f}"))
    print("\ngoals")
    goal("G1", "tide copies, net of the fixed per-step cost, >= 95% of raw bandwidth at >= 16 MiB" +
         (f" (lowest {100 * min(net_ratios):.1f}%; with it, {100 * min(gross_ratios):.1f}%)" if net_ratios else ""),
         min(net_ratios) >= 0.95 if net_ratios else None)
    asserted = False
    for title, prefix in (("16 layers, width 1024", "step_"), ("wide", "step_wide_")):
        r, hidden, keep = ratios_by_case[prefix], steps.get(prefix + "offload_hidden"), steps.get(prefix + "keep_all")
        if r is not None and max(r) <= 0.7:
            asserted = True
            goal("G2", f"hidden offload within 3% of keep-all ({title}, copy/compute forward {r[0]:.2f}, backward {r[1]:.2f}: "
                       f"{100 * (hidden['real_time'] / keep['real_time'] - 1):+.1f}%)", hidden["real_time"] <= 1.03 * keep["real_time"])
        else:
            print(f"  G2 not asserted ({title}): copy/compute " + ("unknown" if r is None else f"{max(r):.2f} above 0.7"))
    if not asserted:
        print("  G2 not measured: no case where the copies can hide")
    for title, prefix in (("16 layers, width 1024", "step_"), ("wide", "step_wide_")):
        hidden, naive = steps.get(prefix + "offload_hidden"), steps.get(prefix + "offload_on_compute")
        goal("G3", f"hidden offload faster than copies on the compute stream ({title})",
             hidden["real_time"] < naive["real_time"] if hidden and naive else None)

    never = [n for n in expected if n not in rows]
    missing = sorted(set(missing) | set(never))
    if missing:
        print(f"\nrows missing from the benchmark output: {', '.join(missing)}")
    for name, why in sorted(failed.items()):
        print(f"row {name} failed: {why}")
    for n in notes:
        print(f"note: {n}")


if __name__ == "__main__":
    main()
