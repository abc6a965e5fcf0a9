#!/usr/bin/env python3
"""The include graph points down only: a header under include/tide/<folder>/ includes tide headers
of its own folder or of a lower level, never of a higher one; and backends implement the backend
concept (executor/backend.hpp, executor/arena_pool.hpp) without driving the executor itself.
docs/design.md shows the graph.

usage: layering_test.py INCLUDE_DIR

First proves on a made-up tree that it finds an upward include and a backend that includes the
executor; then checks the real tree and names every offending include."""
import pathlib, re, sys, tempfile

LEVELS = {"core": 0, "trace": 1, "executor": 2, "backends": 3, "collectives": 4, "plan": 5, "io": 6}
# What backends may take from the executor folder: the concept they implement and the arena pool.
BACKEND_MAY_USE = {"executor/backend.hpp", "executor/arena_pool.hpp"}
INCLUDE = re.compile(r'^\s*#\s*include\s*<tide/([^>]+)>', re.M)


def violations(root: pathlib.Path):
    out = []
    for h in sorted(root.rglob("*.hpp")):
        rel = h.relative_to(root).as_posix()
        folder = rel.split("/")[0]
        if folder not in LEVELS:  # the umbrella header tide.hpp includes everything
            continue
        for target in INCLUDE.findall(h.read_text()):
            tfolder = target.split("/")[0]
            if tfolder not in LEVELS:
                out.append(f"{rel}: includes <tide/{target}>, which is not in a known folder")
            elif LEVELS[tfolder] > LEVELS[folder]:
                out.append(f"{rel}: includes <tide/{target}>, a folder above its own "
                           f"({tfolder} is level {LEVELS[tfolder]}, {folder} level {LEVELS[folder]})")
            elif folder == "backends" and tfolder == "executor" and target not in BACKEND_MAY_USE:
                out.append(f"{rel}: includes <tide/{target}>: a backend implements executor/backend.hpp "
                           "and does not drive the executor")
    return out


def self_test():
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        for f, text in {"core/a.hpp": "#include <tide/core/b.hpp>\n",
                        "core/b.hpp": "#include <tide/plan/p.hpp>\n",
                        "backends/x/y.hpp": "#include <tide/executor/backend.hpp>\n#include <tide/executor/executor.hpp>\n",
                        "executor/backend.hpp": "", "executor/executor.hpp": "#include <tide/core/a.hpp>\n",
                        "plan/p.hpp": "#include <tide/backends/x/y.hpp>\n"}.items():
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_text(text)
        v = violations(root)
        assert len(v) == 2 and "backends/x/y.hpp" in v[0] and "core/b.hpp" in v[1], v


self_test()
found = violations(pathlib.Path(sys.argv[1]) / "tide")
for v in found:
    print(v)
print(f"{len(found)} upward include(s)")
sys.exit(1 if found else 0)
