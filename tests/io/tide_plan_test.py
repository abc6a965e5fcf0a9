#!/usr/bin/env python3
"""tide-plan, as a user runs it: presets and model files, the text and JSON tables, the plan as a
policy file (valid against docs/policy.schema.json, and read back as the same plan), as C++ types
(compiled), as a Chrome trace and PNG; a calibration file written by tide::calibrate; the progress
line; and bad input, each with a message naming it and exit code 2.

usage: tide_plan_test.py TIDE_PLAN CALIBRATE_HOST SOURCE_ROOT WORK_DIR COMPILER..."""
import json, os, pathlib, shutil, subprocess, sys

try:
    import jsonschema
except ImportError:
    sys.exit("python3's jsonschema is missing (tools/install-deps.sh installs it)")

tide_plan, calibrate_host, src, work, *cxx = sys.argv[1:]
src, work = pathlib.Path(src), pathlib.Path(work)
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
schemas = {k: json.loads((src / "docs" / f"{k}.schema.json").read_text()) for k in ("policy", "model", "calibration")}
for s in schemas.values():
    jsonschema.Draft202012Validator.check_schema(s)
failures = []


def run(*args, env=None, want=0):
    r = subprocess.run([tide_plan, *map(str, args)], capture_output=True, text=True, env=env, timeout=240)
    if r.returncode != want:
        failures.append(f"tide-plan {' '.join(map(str, args))}: exit {r.returncode}, want {want}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def check(cond, what):
    if not cond:
        failures.append(what)


def valid(doc, kind, what):
    try:
        jsonschema.validate(doc, schemas[kind])
    except jsonschema.ValidationError as e:
        failures.append(f"{what} is not a valid {kind} file: {e.message} at {list(e.absolute_path)}")


KEYS = ["keep-all", "full-remat", "offload-naive", "offload-lhs", "offload-lhs-pipelined", "planner"]

# --help documents every flag the usage line lists.
h = run("--help").stdout
usage = next(l for l in h.splitlines() if l.startswith("usage:"))
for flag in [w.strip("[]") for w in usage.split() if w.startswith("[--")]:
    check(f"  {flag} " in h or f"  {flag}\n" in h, f"--help does not document {flag}")
check("Exit status" in h and "deepseek-v3" in h and "gb200" in h, "--help lacks the presets or the exit status")

# A preset: the published DeepSeek-V3 setup on GB200 (FSDP 128, EP 64, micro-batch 8).
preset = ["--model", "deepseek-v3", "--hardware", "gb200", "--micro-batch", "8", "--gpus", "128", "--fsdp", "128", "--ep", "64"]
r = run(*preset, "--json", "--quiet", "--policy-out", work / "ds.json", "--cpp", work / "ds.hpp")
doc = json.loads(r.stdout or "{}")
check([row["key"] for row in doc.get("rows", [])] == KEYS, f"deepseek rows: {[row.get('key') for row in doc.get('rows', [])]}")
rows = {row["key"]: row for row in doc.get("rows", [])}
if rows:
    check(rows["planner"]["fits"] and rows["planner"]["device_bytes"] <= doc["resident_bytes"] + doc["device_budget_bytes"],
          "the planner's row does not fit its budget")
    check(not rows["keep-all"]["fits"], "keep-all should not fit DeepSeek-V3 at micro-batch 8")
    fitting = [row["step_us"] for row in doc["rows"] if row["fits"] and row["key"] != "planner"]
    check(rows["planner"]["step_us"] <= min(fitting) * (1 + 1e-9), "the planner is slower than a row that fits")
    valid(doc["plan"]["policy"], "policy", "--json's plan.policy")
policy = json.loads((work / "ds.json").read_text())
valid(policy, "policy", "--policy-out")
check(policy == doc.get("plan", {}).get("policy"), "--policy-out differs from --json's plan.policy")

# The policy file read back (--policy) is the same plan: its row equals the planner's.
r = run(*preset, "--json", "--quiet", "--policy", work / "ds.json")
back = {row["key"]: row for row in json.loads(r.stdout or "{}").get("rows", [])}
if "policy-file" in back and rows:
    for k in ("step_us", "activation_bytes", "host_bytes", "device_bytes"):
        check(back["policy-file"][k] == rows["planner"][k], f"policy file read back: {k} {back['policy-file'][k]} != {rows['planner'][k]}")
else:
    failures.append("--policy gave no policy-file row")

# --cpp compiles, and its strategy has the policy file's rules.
tu = work / "cpp_check.cpp"
tu.write_text(f'#include <tide/tide.hpp>\n#include "{work / "ds.hpp"}"\n'
              f"static_assert(tide_plan::spec().policy.rules.size() == {len(policy['rules'])});\n"
              f"static_assert(tide_plan::spec().pipeline.prefetch_distance == {policy['pipeline']['prefetch_distance']});\n"
              "int main() {}\n")
c = subprocess.run([*cxx, "-std=c++20", "-fsyntax-only", f"-I{src / 'include'}", str(tu)], capture_output=True, text=True)
check(c.returncode == 0, f"--cpp output does not compile:\n{c.stderr[:3000]}")

# The text table, and the trace: a Chrome trace and, with matplotlib, a PNG.
r = run("--model", "llama-3.1-405b", "--hardware", "gb200", "--micro-batch", "2", "--gpus", "128", "--fsdp", "128", "--fp8",
        "--trace", work / "llama.json")
for name in ["keep all", "full remat", "offload, copies on compute", "offload, latency hiding", "offload, chunked", "planner"]:
    check(name in r.stdout, f"the text table lacks '{name}':\n{r.stdout}")
trace = json.loads((work / "llama.json").read_text()) if (work / "llama.json").exists() else {}
check(len(trace.get("traceEvents", [])) > 100, "--trace wrote no Chrome trace")
try:
    import matplotlib  # noqa: F401
    png = work / "llama.json.png"
    check(png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "--trace wrote no PNG although matplotlib is installed")
except ImportError:
    check("no PNG" in r.stderr, "without matplotlib --trace should say why there is no PNG")

# A model file (the documented one), valid against its schema.
model = src / "docs" / "examples" / "model.json"
valid(json.loads(model.read_text()), "model", "docs/examples/model.json")
r = run("--model-file", model, "--hardware", "h100", "--device-memory", "22", "--json", "--quiet")
doc = json.loads(r.stdout or "{}")
check(doc.get("layers") == 24 and doc.get("resident_bytes") == 20 << 30, f"model file: {doc.get('layers')} layers")
plan_rows = [row for row in doc.get("rows", []) if row["key"] == "planner"]
check(len(plan_rows) == 1 and plan_rows[0]["activation_bytes"] <= doc["device_budget_bytes"], "model file: the plan does not fit")

# A calibration file written by tide::calibrate, giving a model file's costs.
c = subprocess.run([calibrate_host, str(work)], capture_output=True, text=True, timeout=120)
check(c.returncode == 0, f"calibrate_host failed: {c.stdout}{c.stderr}")
if c.returncode == 0:
    valid(json.loads((work / "calibration.json").read_text()), "calibration", "calibrate_host's calibration file")
    valid(json.loads((work / "model.json").read_text()), "model", "calibrate_host's model file")
    r = run("--model-file", work / "model.json", "--calibration", work / "calibration.json", "--device-memory", "0.004")
    check("layer costs from the calibration file" in r.stdout, f"the calibration's costs were not used:\n{r.stdout}")
    check("planner" in r.stdout, r.stdout)

# The progress line, for plans over a second (the threshold lowered to show it here).
r = run(*preset, "--json", env=dict(os.environ, TIDE_PLAN_PROGRESS_AFTER="0"))
check("tide-plan: planning" in r.stderr and "planned in" in r.stderr, f"no progress line: {r.stderr!r}")
r = run(*preset, "--json", "--quiet", env=dict(os.environ, TIDE_PLAN_PROGRESS_AFTER="0"))
check("planning" not in r.stderr, "--quiet still printed progress")

# The policy files the docs show are valid, and read as DeepSeek-V3's policies.
import re
for doc_file in (src / "README.md", src / "docs" / "planning.md"):
    for i, block in enumerate(re.findall(r"```json\n(.*?)```", doc_file.read_text(), re.S)):
        f = work / f"doc_policy_{doc_file.stem}_{i}.json"
        f.write_text(block)
        valid(json.loads(block), "policy", f"{doc_file.name}'s JSON block {i}")
        r = run(*preset, "--quiet", "--policy", f)
        check("policy file" in r.stdout, f"{doc_file.name}'s JSON block {i} was not evaluated:\n{r.stdout}{r.stderr}")

# Bad input: a message naming what is wrong, exit code 2, nothing written.
bad = work / "bad"
bad.mkdir()
(bad / "malformed.json").write_text('{"layer_types": [')
(bad / "unknown_key.json").write_text(json.dumps({"layer_types": [{"name": "b", "slots": [{"name": "a", "bytes": 8, "inptu": True}]}],
                                                  "layers": [{"type": "b"}]}))
(bad / "policy.json").write_text(json.dumps({"rules": [{"action": "offload", "slots": ["q_lantent"]}]}))
cases = [
    (["--model", "gpt-5"], "unknown model preset 'gpt-5' (the presets: deepseek-v3, llama-3.1-405b"),
    (["--model", "deepseek-v3", "--hardware", "tpu"], "unknown hardware preset 'tpu'"),
    (["--model-file", bad / "malformed.json"], "malformed JSON at byte"),
    (["--model-file", bad / "unknown_key.json"], "/layer_types/0/slots/0/inptu: unknown key 'inptu'"),
    (["--model-file", bad / "missing.json"], "cannot open the file"),
    (["--model-file", model, "--policy", bad / "policy.json"], "/rules/0/slots/0: unknown slot 'q_lantent'"),
    (["--model", "deepseek-v3", "--calibration", bad / "malformed.json"], "calibration file"),
    (["--model-file", model, "--hardware", "h100", "--device-memory", "20.5", "--host-budget", "0.001", "--quiet",
      "--policy-out", bad / "never.json"], "no schedule fits"),
    (["--model", "llama-3.1-405b", "--hardware", "h100"], "nothing is left for activations"),
    (["--model", "deepseek-v3", "--offload", "qkv_typo"], "--offload: unknown slot 'qkv_typo'"),
    (["--model", "deepseek-v3", "--micro-batch", "0"], "must be at least 1"),
    (["--model", "deepseek-v3", "--seq", "12x"], "cannot use '12x'"),
    (["--model", "deepseek-v3", "--model-file", model], "give one of --model NAME and --model-file FILE"),
    (["--model-file", model, "--micro-batch", "4"], "describe a preset"),
    (["--frobnicate"], "unknown argument '--frobnicate'"),
    ([], "give one of --model NAME and --model-file FILE"),
]
for args, says in cases:
    r = run(*args, want=2)
    check(says in r.stderr, f"tide-plan {' '.join(map(str, args))}: stderr lacks {says!r}:\n{r.stderr}")
    check("Traceback" not in r.stderr and "terminate called" not in r.stderr, f"tide-plan {args}: crashed:\n{r.stderr}")
check(not (bad / "never.json").exists(), "a failed plan wrote its policy file")

for f in failures:
    print("FAIL:", f)
print(f"tide-plan: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
