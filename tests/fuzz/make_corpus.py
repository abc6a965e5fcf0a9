#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_schedule (tests/fuzz/corpus/) in its input format.

The format is read front to back by `decode` in fuzz_schedule.cpp; these helpers mirror it.
Usage: make_corpus.py [OUT_DIR]   (default: the corpus folder next to this script)
"""
import os
import sys

SLOTS = ["a", "b", "c", "d", "e", "f", "input", "zz_unknown"]
KEEP, OFFLOAD, REMAT, SPILL = 0, 1, 2, 3


def size(n):
    """A size in 1 .. 32768 (the small encoding)."""
    assert 1 <= n <= 32768
    return bytes([(n - 1) >> 8, (n - 1) & 0xFF])


def index(n):
    """A small index (< 16), all_layers (None), or ("end", k): tide::from_end(k)."""
    if isinstance(n, tuple) and n[0] == "end":
        return bytes([0xF5, n[1]])
    if isinstance(n, tuple) and n[0] == "raw":  # ("raw", byte, ...): index()'s encoding as it is
        return bytes(n[1:])
    return bytes([0xF0]) if n is None else bytes([n])


def encode(types, layers, rules=(), staging=2, dalign=0, halign=1, guard=0, share=True, hiding=True,
           prefetch=1, chunk=0, inflight=2, before=False, after=False, allow_unused=True, regather=False,
           overlap=True):
    """types: [[(slot name, bytes)]]; layers: type index per layer; rules: (where, [names], first,
    last or None, min_bytes); dalign/halign: entries of the alignment table."""
    out = bytearray([len(types) - 1])
    for t in types:
        out.append(len(t) - 1)
        for name, n in t:
            out.append(SLOTS.index(name))
            out += size(n)
    out.append(len(layers))
    out += bytes(layers)
    out.append(len(rules) | (0x80 if allow_unused else 0))
    for where, names, first, last, min_bytes in rules:
        out += bytes([where, len(names)] + [SLOTS.index(n) for n in names])
        out += index(first)
        out += b"\x00" if last is None else b"\x01" + index(last)
        out += b"\x00" if min_bytes == 0 else b"\x01" + size(min_bytes)
    out += index(staging) + bytes([dalign, halign])
    out += b"\x00" if guard == 0 else b"\x01" + size(guard)
    out += bytes([int(share), 0 if hiding else 1])
    out += index(prefetch)
    out += b"\x00" if chunk == 0 else b"\x01" + size(chunk)
    out += index(inflight) + bytes([int(before) | int(after) << 1 | int(regather) << 2 | int(not overlap) << 3])
    return bytes(out)


SEEDS = {
    "keep_all": encode([[("a", 4097), ("b", 256)]], [0] * 4),
    "offload_chunked": encode([[("a", 4097), ("b", 3000)]], [0] * 5, [(OFFLOAD, ["b"], 0, None, 0)], chunk=700),
    "remat_offload_two_types": encode(
        [[("a", 1000), ("b", 3000), ("c", 17)], [("d", 5000), ("a", 1)]], [0, 1, 0, 0, 1, 1, 0, 1],
        [(REMAT, ["c", "d"], 1, 6, 0), (OFFLOAD, [], 2, None, 100)], staging=3, guard=16, prefetch=2, inflight=1,
        before=True, after=True),
    "chain_input_offloaded": encode(
        [[("input", 2048), ("a", 512), ("b", 33)], [("c", 100), ("input", 96)]], [0, 0, 1, 0, 1, 1],
        [(OFFLOAD, ["input"], 0, None, 0), (REMAT, ["a", "c"], 0, None, 0)], dalign=2, halign=5, guard=3,
        share=False, chunk=256),
    "collectives_not_overlapped": encode(
        [[("a", 1000), ("b", 3000)]], [0] * 4, [(OFFLOAD, ["b"], 0, None, 0), (REMAT, ["a"], 1, None, 0)],
        before=True, after=True, regather=True, overlap=False, hiding=False, prefetch=0, staging=1, inflight=1),
    "spill_chunked_with_remat": encode(
        [[("input", 5000), ("a", 3000), ("b", 700)]], [0] * 6,
        [(SPILL, ["input", "a"], 0, None, 0), (REMAT, ["b"], 2, None, 0)], chunk=1024, prefetch=2, guard=8),
    "spill_naive_one_buffer": encode([[("a", 9000), ("b", 100)]], [0] * 4, [(SPILL, [], 1, None, 0)],
                                     hiding=False, prefetch=0, staging=1, inflight=1),
    "naive_pipeline": encode([[("a", 300), ("b", 7000)]], [0] * 3, [(OFFLOAD, ["b", "a"], 1, None, 0)],
                             hiding=False, prefetch=0, staging=1, inflight=1),
    # Bytes after the composition edit the built program (fuzz_schedule.cpp, `mutate`): what
    # (0: drop a wait, 1: move a copy, 2: resize a copy, 3: move a slot, 4: restream a copy),
    # pick (2 bytes), delta (signed byte), scale (power of two), and a selector byte.
    "edit_drop_wait": encode([[("a", 4097), ("b", 3000)]], [0] * 5, [(OFFLOAD, ["b"], 0, None, 0)])
    + bytes([0, 3, 0, 1, 0, 0]),
    "edit_move_copy": encode([[("a", 1000), ("b", 3000)]], [0] * 3, [(OFFLOAD, ["b"], 0, None, 0)], chunk=1000)
    + bytes([1, 2, 0, 0xFF, 6, 1]),
    "rejected_unknown_slot": encode([[("a", 8)]], [0, 0], [(OFFLOAD, ["zz_unknown"], 0, None, 0)]),
    "rule_ranges_and_min_bytes": encode(
        [[("a", 64), ("b", 4096), ("c", 1)]], [0] * 7,
        [(KEEP, ["a"], 3, 4, 0), (OFFLOAD, [], 0, 7, 1000), (REMAT, ["c"], 5, None, 0)], allow_unused=False),
    "rule_ranges_from_end": encode(
        [[("a", 64), ("b", 4096)]], [0] * 6,
        [(OFFLOAD, ["b"], ("end", 2), None, 0), (REMAT, ["a"], 1, ("end", 1), 0)], allow_unused=False),
    # Issue 40: an index that was once the code for "two from the end" (all_layers - 2), and
    # 3,500,000,000: indices past what a rule may name, refused by name, never a count.
    "rule_index_once_from_end": encode(
        [[("a", 64), ("b", 4096)]], [0] * 6, [(OFFLOAD, ["b"], ("raw", 0xF4, 2), None, 0)], allow_unused=True),
    "rule_index_3_5e9": encode(
        [[("a", 64), ("b", 4096)]], [0] * 6,
        [(OFFLOAD, ["b"], ("raw", 0xFF) + tuple((3_500_000_000).to_bytes(4, "little")), None, 0)], allow_unused=True),
}

if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out_dir, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
