#!/usr/bin/env python3
"""The JSON Schemas in docs/ and the reader in <tide/io/json.hpp> give the same verdict on the
same documents: each case below is checked against its schema and read by tests/io/read_file,
and both verdicts must be the expected one. Rules a JSON Schema cannot state (names checked
against the stack, unique names, ranges whose ends depend on each other, powers of two) are
marked reader-only: the schema accepts, the reader rejects, and the schema's description says so.

usage: schema_test.py READ_FILE SOURCE_ROOT WORK_DIR"""
import copy, json, pathlib, shutil, subprocess, sys

import jsonschema

read_file, src, work = sys.argv[1:]
src, work = pathlib.Path(src), pathlib.Path(work)
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
schemas = {k: json.loads((src / "docs" / f"{k}.schema.json").read_text()) for k in ("policy", "model", "calibration")}
model_file = src / "docs" / "examples" / "model.json"
model = json.loads(model_file.read_text())
TYPE = {"name": "blk", "slots": [{"name": "x", "bytes": 8, "input": True}, {"name": "h", "bytes": 64, "recompute_us": 1}],
        "cost": {"forward_us": 2, "backward_us": 4}}
CAL = {"layers": [{"forward_us": 1, "backward_us": 2}], "link": {"d2h": {"bytes_per_second": 1e9}, "h2d": {"bytes_per_second": 1e9}}}


def m(**kw):
    d = {"layer_types": [copy.deepcopy(TYPE)], "layers": [{"type": "blk", "count": 3}]}
    d.update(kw)
    return d


def with_type(**kw):
    t = copy.deepcopy(TYPE)
    t.update(kw)
    return m(layer_types=[t])


def with_slot(i, **kw):
    t = copy.deepcopy(TYPE)
    t["slots"][i].update(kw)
    for k in [k for k, v in kw.items() if v is None]:
        del t["slots"][i][k]
    return m(layer_types=[t])


# (kind, name, document, schema accepts, reader accepts)
cases = [
    ("policy", "empty", {}, True, True),
    ("policy", "the docs' example", {"rules": [{"action": "offload", "slots": ["qkv", "mlp_up"], "layers": [0, 24]}],
                                     "pipeline": {"latency_hiding": True, "prefetch_distance": 2}}, True, True),
    ("policy", "$schema at the root", {"$schema": "policy.schema.json"}, True, True),
    ("policy", "$schema nested", {"pipeline": {"$schema": "x"}}, False, False),
    ("policy", "open range", {"rules": [{"action": "remat", "layers": [3, None]}]}, True, True),
    ("policy", "the last two layers", {"rules": [{"action": "remat", "layers": [-2, None]}]}, True, True),
    ("policy", "all but the first and the last", {"rules": [{"action": "remat", "layers": [1, -1]}]}, True, True),
    ("policy", "from the end, too far", {"rules": [{"action": "remat", "layers": [-1073741825, None]}]}, False, False),
    ("policy", "index in the from-end range", {"rules": [{"action": "remat", "layers": [3221225471, None]}]}, False, False),
    ("policy", "reader-only: empty from the end", {"rules": [{"action": "remat", "layers": [-1, -2]}]}, True, False),
    ("policy", "unknown key", {"pipeline": {"prefetch_distanc": 2}}, False, False),
    ("policy", "unknown action", {"rules": [{"action": "drop"}]}, False, False),
    ("policy", "0.3 keys", {"rules": [{"where": "offload", "slots": ["qkv"], "first_layer": 1, "last_layer": -1}]}, True, True),
    ("policy", "0.3 keys, open end", {"rules": [{"where": "remat", "first_layer": -2, "last_layer": None}]}, True, True),
    ("policy", "no where", {"rules": [{"slots": ["qkv"]}]}, False, False),
    ("policy", "where and its 0.2 spelling", {"rules": [{"where": "keep", "action": "keep"}]}, False, False),
    ("policy", "a range in both spellings", {"rules": [{"where": "keep", "first_layer": 1, "layers": [1, 2]}]}, False, False),
    ("policy", "a reversal action in both spellings",
     {"checkpoints": {"device_snapshots": 2, "reversal": [{"op": "free", "snapshot": 0, "slot": 0}]}}, False, False),
    ("policy", "no action", {"rules": [{"slots": ["qkv"]}]}, False, False),
    ("policy", "empty slot list", {"rules": [{"action": "keep", "slots": []}]}, False, False),
    ("policy", "one-entry range", {"rules": [{"action": "keep", "layers": [1]}]}, False, False),
    ("policy", "negative distance", {"pipeline": {"prefetch_distance": -1}}, False, False),
    ("policy", "fractional distance", {"pipeline": {"prefetch_distance": 1.5}}, False, False),
    ("policy", "distance past u32", {"pipeline": {"prefetch_distance": 4294967296}}, False, False),
    ("policy", "whole float distance", {"pipeline": {"prefetch_distance": 2.0}}, True, True),
    # 0 is read as written: the builder refuses it where an offload runs with latency hiding.
    ("policy", "no offloads in flight", {"pipeline": {"max_offloads_in_flight": 0}}, True, True),
    ("policy", "string boolean", {"pipeline": {"latency_hiding": "yes"}}, False, False),
    ("policy", "zero snapshots", {"checkpoints": {"device_snapshots": 0}}, False, False),
    ("policy", "every snapshot", {"checkpoints": {"device_snapshots": "every"}}, True, True),
    ("policy", "other snapshot word", {"checkpoints": {"device_snapshots": "all"}}, False, False),
    ("policy", "reversal with whole floats", {"checkpoints": {"reversal": [{"op": "advance", "state": 0.0, "to": 1e1}]}}, True, True),
    ("policy", "reversal op unknown", {"checkpoints": {"reversal": [{"op": "jump"}]}}, False, False),
    ("policy", "reversal below -1", {"checkpoints": {"reversal": [{"op": "free", "slot": -2}]}}, False, False),
    ("policy", "reader-only: unknown slot", {"rules": [{"action": "offload", "slots": ["qkv_typo"]}]}, True, False),
    ("policy", "reader-only: empty range", {"rules": [{"action": "remat", "layers": [5, 2]}]}, True, False),
    ("policy", "reader-only: alignment not a power of two", {"buffers": {"device_alignment": 100}}, True, False),
    ("model", "the docs' example", model, True, True),
    ("model", "times", m(), True, True),
    ("model", "a run with its own cost", m(layers=[{"type": "blk", "cost": {"forward_us": 5, "backward_us": 9}}]), True, True),
    ("model", "work", with_type(slots=[{"name": "x", "bytes": 8}], cost={"forward_flops": 1e9, "forward_bytes": 1e6}), True, True),
    ("model", "no cost", with_type(slots=[{"name": "x", "bytes": 8}], cost=None), True, True),
    ("model", "carry", m(carry={"name": "u", "bytes": 16}), True, True),
    ("model", "independent layers", m(independent_layers=True), True, True),
    ("model", "independent layers not a boolean", m(independent_layers=1), False, False),
    ("model", "mixed units: flops and backward_us", with_type(slots=[{"name": "x", "bytes": 8}], cost={"forward_flops": 1, "backward_us": 2}), False, False),
    ("model", "mixed units: times and backward_flops", with_type(cost={"forward_us": 1, "backward_us": 2, "backward_flops": 3}), False, False),
    ("model", "work without forward_flops", with_type(slots=[{"name": "x", "bytes": 8}], cost={"backward_flops": 3}), False, False),
    ("model", "time without backward_us", with_type(cost={"forward_us": 1}), False, False),
    ("model", "recompute_bytes with recompute_us", with_slot(1, recompute_bytes=5), False, False),
    ("model", "recompute_bytes alone", with_slot(1, recompute_us=None, recompute_bytes=5), False, False),
    ("model", "recompute_us and recompute_flops", with_slot(1, recompute_flops=5), False, False),
    ("model", "zero bytes", with_slot(1, bytes=0), False, False),
    ("model", "bytes past 2^62", with_slot(1, bytes=2**64 - 1), False, False),
    ("model", "unknown slot key", with_slot(1, inptu=True), False, False),
    ("model", "no layers", m(layers=[]), False, False),
    ("model", "count zero", m(layers=[{"type": "blk", "count": 0}]), False, False),
    ("model", "count past 100000", m(layers=[{"type": "blk", "count": 100001}]), False, False),
    ("model", "carry of zero bytes", m(carry={"name": "u", "bytes": 0}), False, False),
    ("model", "$schema nested", with_slot(0, **{"$schema": "x"}), False, False),
    ("model", "negative flops", with_type(slots=[{"name": "x", "bytes": 8}], cost={"forward_flops": -1}), False, False),
    ("model", "unknown precision", m(precision="fp4"), False, False),
    ("model", "reader-only: unknown layer type", m(layers=[{"type": "blc"}]), True, False),
    ("model", "reader-only: duplicate slot", with_type(slots=[{"name": "x", "bytes": 8}, {"name": "x", "bytes": 8}], cost=None), True, False),
    ("model", "reader-only: some slots costed", with_type(slots=[{"name": "a", "bytes": 8, "recompute_us": 1}, {"name": "b", "bytes": 8}]), True, False),
    ("model", "reader-only: 100001 layers in all", m(layers=[{"type": "blk", "count": 60000}, {"type": "blk", "count": 40001}]), True, False),
    ("calibration", "minimal", CAL, True, True),
    ("calibration", "unpaced link", {**CAL, "link": {"d2h": {"bytes_per_second": 0}, "h2d": {"bytes_per_second": 0}}}, True, True),
    ("calibration", "negative bandwidth", {**CAL, "link": {"d2h": {"bytes_per_second": -1}, "h2d": {"bytes_per_second": 1}}}, False, False),
    ("calibration", "no layers", {**CAL, "layers": []}, False, False),
    ("calibration", "negative time", {**CAL, "layers": [{"forward_us": -1, "backward_us": 2}]}, False, False),
    ("calibration", "null time", {**CAL, "layers": [{"forward_us": None, "backward_us": 2}]}, False, False),
    ("calibration", "no link", {"layers": CAL["layers"]}, False, False),
]
# "no cost": drop the key the helper set to None.
for c in cases:
    for t in c[2].get("layer_types", []) if isinstance(c[2], dict) else []:
        if t.get("cost", 0) is None:
            del t["cost"]

failures = []
for i, (kind, name, doc, schema_ok, reader_ok) in enumerate(cases):
    f = work / f"case{i}.json"
    f.write_text(json.dumps(doc))
    try:
        jsonschema.validate(doc, schemas[kind])
        got_schema = True
    except jsonschema.ValidationError:
        got_schema = False
    args = [read_file, kind, str(f)] + ([str(model_file)] if kind == "policy" else [])
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode not in (0, 2):
        failures.append(f"{kind} '{name}': read_file exited {r.returncode}: {r.stderr}")
        continue
    got_reader = r.returncode == 0
    if got_schema != schema_ok:
        failures.append(f"{kind} '{name}': the schema {'accepts' if got_schema else 'rejects'} it")
    if got_reader != reader_ok:
        failures.append(f"{kind} '{name}': the reader {'accepts' if got_reader else 'rejects'} it {r.stderr.strip()}")
    if not got_reader and kind + " file" not in r.stderr:
        failures.append(f"{kind} '{name}': the error does not name the document: {r.stderr}")
for f in failures:
    print("FAIL:", f)
print(f"{len(cases)} documents, {len(failures)} disagreement(s)")
sys.exit(1 if failures else 0)
