#!/usr/bin/env python3
"""The build outputs the tests of a configured build need, leaving out the tests of the given
suites: what `ninja` must build before `meson test --no-rebuild --no-suite ...` runs them, so that
a build whose configuration skips suites (the sanitizer builds) does not compile their programs.

usage: test_targets.py BUILD_DIR [SUITE...]   (prints one output path per line, relative to BUILD_DIR)
       test_targets.py BUILD_DIR --only SUITE [--except SUITE]... [--benchmarks]
With --only, the tests of that suite instead, less those of the --except suites (and with
--benchmarks, the suite's benchmarks too): what bench/gpu/check.sh builds before it runs
`meson test --suite cuda --no-suite compile --no-rebuild` and the GPU benchmarks, so that the build
and the test phase cannot disagree.
       test_targets.py BUILD_DIR --all-except-suite SUITE [--no-benchmarks]
Every target built by default, less what only the tests and benchmarks of SUITE need and less every
target with CUDA sources: what CI's main build compiles, since the GPU check's own build (which CI
runs from scratch) compiles the CUDA suite. With --no-benchmarks, less what only benchmarks need
too (CI compiles the benchmark programs in its ASan build, in separate compilation: a third of the
time; `test_targets.py BUILD_DIR ... --benchmarks` lists them there).

A test needs the targets Meson lists as its dependencies and any built file named on its command
line (a script's program argument). Custom targets (generated files: copies, configured sources)
are always built: a program may find one beside itself (tide-plan runs tide-plot-trace), and they
cost nothing to make."""
import json, pathlib, subprocess, sys

build = pathlib.Path(sys.argv[1]).resolve()
args = sys.argv[2:]
with_benchmarks = "--benchmarks" in args
no_benchmarks = "--no-benchmarks" in args
all_except = None
only = set()
skipped = set()
i = 0
while i < len(args):
    if args[i] in ("--only", "--except"):
        if i + 1 >= len(args):
            sys.exit(f"test_targets.py: {args[i]} needs a suite")
        (only if args[i] == "--only" else skipped).add(args[i + 1])
        i += 2
    elif args[i] == "--all-except-suite":
        if i + 1 >= len(args):
            sys.exit("test_targets.py: --all-except-suite needs a suite")
        all_except = args[i + 1]
        i += 2
        continue
    elif args[i] in ("--benchmarks", "--no-benchmarks"):
        i += 1
    elif args[i].startswith("--"):
        sys.exit(f"test_targets.py: unknown option {args[i]}")
    else:
        skipped.add(args[i])
        i += 1


def introspect(what):
    return json.loads(subprocess.run(["meson", "introspect", what, str(build)], check=True,
                                     capture_output=True, text=True).stdout)


targets = introspect("--targets")
by_id = {t["id"]: t for t in targets}
by_file = {pathlib.Path(f).resolve(): t for t in targets for f in t["filename"]}
def needed(runs, keep):
    """The targets the runs for which keep(suites) holds name as dependencies or on their command lines."""
    need = {}
    for test in runs:
        suites = {s.split(":", 1)[-1] for s in test["suite"]}
        if not keep(suites):
            continue
        for dep in test.get("depends", []):
            if dep in by_id:
                need[dep] = by_id[dep]
        for arg in test["cmd"] + test.get("env", {}).get("PATH", "").split(":"):
            p = pathlib.Path(arg)
            p = (p if p.is_absolute() else build / p).resolve()
            if p in by_file:
                need[by_file[p]["id"]] = by_file[p]
    return need


need = {t["id"]: t for t in targets if t["type"] == "custom"}
if all_except is not None:
    tests, benches = introspect("--tests"), introspect("--benchmarks")
    runs = tests + benches
    theirs = needed(runs, lambda s: all_except in s)
    others = needed(tests if no_benchmarks else runs, lambda s: all_except not in s)
    if no_benchmarks:  # what only benchmarks need counts as "theirs"
        theirs.update(needed(benches, lambda s: True))
    for t in targets:
        cuda = any(src.get("language") == "cuda" for src in t["target_sources"])
        if t["build_by_default"] and not cuda and not (t["id"] in theirs and t["id"] not in others):
            need[t["id"]] = t
else:
    runs = introspect("--tests") + (introspect("--benchmarks") if with_benchmarks else [])
    need.update(needed(runs, lambda s: not ((only and not s & only) or s & skipped)))
for t in need.values():
    for f in t["filename"]:
        print(pathlib.Path(f).resolve().relative_to(build))
