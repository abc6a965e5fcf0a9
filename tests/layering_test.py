#!/usr/bin/env python3
"""The include graph points down only, each outside dependency stays where it belongs, and public
headers stay small (at most 450 lines: their implementation lives under detail/).

- Levels: a header under include/tide/<folder>/ includes tide headers of its own folder or of a
  lower level, never of a higher one. The levels are read from docs/design.md's "Include graph"
  table (one place: the docs and this test cannot disagree).
- Backends: a backend (backends/<name>/) includes no other backend; backends implement the backend
  concept (executor/backend.hpp, executor/arena_pool.hpp) without driving the executor; nothing
  outside backends/cuda/ and collectives/nccl.hpp includes a CUDA backend header.
- System headers: CUDA (the runtime, CCCL, cuBLAS, NVTX) only in backends/cuda/ and
  collectives/nccl.hpp; NCCL only in collectives/nccl.hpp; MPI only in collectives/mpi.hpp;
  nlohmann/json only in io/; no threads or locks in core/.
- Quoted includes are resolved against the including file and checked the same way.
- tools/tide-plan is built from the library alone: it includes <tide/...>, the standard library and
  its own files, nothing of examples/.

usage: layering_test.py INCLUDE_DIR [DESIGN_MD [TIDE_PLAN_DIR]]

First proves on a made-up tree that it finds each kind of violation; then checks the real tree and
names every offending include."""
import pathlib, re, sys, tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
LEVEL_ROW = re.compile(r'^\|\s*(\d+)\s*\|\s*`([a-z_]+)/`\s*\|', re.M)
# What backends may take from the executor folder: the concept they implement and the arena pool.
BACKEND_MAY_USE = {"executor/backend.hpp", "executor/arena_pool.hpp"}
CUDA_PLACES = ("backends/cuda/", "collectives/nccl.hpp")
# System headers and where they may appear (a prefix of the including header's path).
SYSTEM_RULES = [
    (re.compile(r"^(cuda_runtime|cuda_runtime_api|cuda|cuda_fp16|cuda_bf16|cublas.*|cufile)\.h$|^(cuda|cub|thrust|nvtx3)/"),
     CUDA_PLACES, "CUDA belongs to backends/cuda/ and collectives/nccl.hpp"),
    (re.compile(r"^nccl(_net)?\.h$"), ("collectives/nccl.hpp",), "NCCL belongs to collectives/nccl.hpp"),
    (re.compile(r"^mpi\.h$"), ("collectives/mpi.hpp",), "MPI belongs to collectives/mpi.hpp"),
    (re.compile(r"^nlohmann/"), ("io/",), "nlohmann/json belongs to io/"),
    (re.compile(r"^liburing\.h$"), ("storage/",), "liburing belongs to storage/"),
]
MAX_PUBLIC_LINES = 450
THREADS = re.compile(r"^(thread|mutex|shared_mutex|condition_variable|future|barrier|latch|semaphore|stop_token)$")


def levels_from(design_md: pathlib.Path):
    text = design_md.read_text()
    table = text[text.index("## Include graph"):]
    levels = {folder: int(level) for level, folder in LEVEL_ROW.findall(table)}
    if len(levels) < 3:
        raise SystemExit(f"{design_md}: no level table found under '## Include graph'")
    return levels


def tide_target(h: pathlib.Path, root: pathlib.Path, kind: str, name: str):
    """The path under include/tide/ a tide include names, or None for a system header."""
    if kind == "<":
        return name[len("tide/"):] if name.startswith("tide/") else None
    resolved = (h.parent / name).resolve()
    try:
        return resolved.relative_to(root.resolve()).as_posix()
    except ValueError:
        return "../" + name  # outside include/tide: always wrong for a public header


def violations(root: pathlib.Path, levels: dict):
    out = []
    for h in sorted(root.rglob("*.hpp")):
        rel = h.relative_to(root).as_posix()
        folder = rel.split("/")[0]
        if folder not in levels:  # the umbrella header tide.hpp includes everything
            continue
        for kind, name in INCLUDE.findall(h.read_text()):
            target = tide_target(h, root, kind, name)
            shown = f"{kind}{name}{'>' if kind == '<' else chr(34)}"
            if target is None:  # a system header
                for pattern, places, why in SYSTEM_RULES:
                    if pattern.search(name) and not rel.startswith(places):
                        out.append(f"{rel}: includes {shown}: {why}")
                # The one exception: the name table (core/name.hpp) interns run-time names behind a
                # mutex held for a hash look-up, never around user work.
                if folder == "core" and THREADS.match(name) and not (rel == "core/detail/intern.hpp" and name == "mutex"):
                    out.append(f"{rel}: includes {shown}: core/ starts no thread and takes no lock")
                continue
            tfolder = target.split("/")[0]
            if tfolder not in levels:
                out.append(f"{rel}: includes {shown}, which is not in a known folder")
                continue
            if levels[tfolder] > levels[folder]:
                out.append(f"{rel}: includes {shown}, a folder above its own "
                           f"({tfolder} is level {levels[tfolder]}, {folder} level {levels[folder]})")
            if folder == "backends" and tfolder == "executor" and target not in BACKEND_MAY_USE:
                out.append(f"{rel}: includes {shown}: a backend implements executor/backend.hpp "
                           "and does not drive the executor")
            if folder == "backends" and tfolder == "backends" and target.split("/")[1] != rel.split("/")[1]:
                out.append(f"{rel}: includes {shown}: a backend includes no other backend")
            if target.startswith("backends/cuda/") and not rel.startswith(CUDA_PLACES):
                out.append(f"{rel}: includes {shown}: only the CUDA backend and the NCCL adapter use it")
    return out


def tool_violations(tool: pathlib.Path):
    out = []
    for f in sorted(list(tool.glob("*.cpp")) + list(tool.glob("*.hpp"))):
        for kind, name in INCLUDE.findall(f.read_text()):
            if kind == '"' and not (f.parent / name).resolve().is_relative_to(tool.resolve()):
                out.append(f"{f.name}: includes \"{name}\": tide-plan is built from the library and its own files")
            if kind == "<" and "example" in name:
                out.append(f"{f.name}: includes <{name}>: tide-plan is built from the library and its own files")
    return out


def self_test():
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d) / "tide"
        files = {
            "core/a.hpp": "#include <tide/core/b.hpp>\n#include <vector>\n",
            "core/b.hpp": "#include <tide/plan/p.hpp>\n",
            "core/c.hpp": "#include <mutex>\n",
            "backends/x/y.hpp": "#include <tide/executor/backend.hpp>\n#include <tide/executor/executor.hpp>\n",
            "backends/host/h.hpp": '#include "../cuda/k.hpp"\n',
            "backends/cuda/k.hpp": "#include <cuda_runtime_api.h>\n",
            "backends/sim/s.hpp": "#include <cuda/stream_ref>\n",
            "executor/backend.hpp": "", "executor/executor.hpp": "#include <tide/core/a.hpp>\n",
            "plan/p.hpp": "#include <tide/backends/x/y.hpp>\n#include <nlohmann/json.hpp>\n",
            "io/j.hpp": "#include <nlohmann/json.hpp>\n#include <tide/plan/p.hpp>\n",
        }
        for f, text in files.items():
            (root / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).write_text(text)
        levels = {"core": 0, "executor": 2, "backends": 3, "plan": 5, "io": 6}
        v = violations(root, levels)
        expect = ["backends/host/h.hpp", "backends/host/h.hpp", "backends/sim/s.hpp", "backends/x/y.hpp",
                  "core/b.hpp", "core/c.hpp", "plan/p.hpp"]
        assert [x.split(":")[0] for x in v] == expect, v
        assert "a backend includes no other backend" in v[0] and "only the CUDA backend" in v[1], v
        assert "CUDA belongs" in v[2] and "no thread" in v[5] and "nlohmann/json belongs to io/" in v[6], v
        tool = pathlib.Path(d) / "tool"
        tool.mkdir()
        (tool / "main.cpp").write_text('#include "args.hpp"\n#include "../examples/common/example.hpp"\n')
        (tool / "args.hpp").write_text("#include <tide/plan/p.hpp>\n")
        t = tool_violations(tool)
        assert len(t) == 1 and "examples" in t[0], t


self_test()
include = pathlib.Path(sys.argv[1])
source = include.parent
design = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else source / "docs" / "design.md"
tool = pathlib.Path(sys.argv[3]) if len(sys.argv) > 3 else source / "tools" / "tide-plan"
found = violations(include / "tide", levels_from(design)) + tool_violations(tool)
# Public headers read as API: at most 450 lines each, their implementation under detail/ (issue 41).
for h in sorted((include / "tide").rglob("*.hpp")):
    if "detail" not in h.parts and (n := len(h.read_text().splitlines())) > MAX_PUBLIC_LINES:
        found.append(f"{h.relative_to(include)}: {n} lines, over {MAX_PUBLIC_LINES} for a public header (move its implementation to detail/)")
for v in found:
    print(v)
print(f"{len(found)} layering violation(s)")
sys.exit(1 if found else 0)
