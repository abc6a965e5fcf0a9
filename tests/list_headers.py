#!/usr/bin/env python3
"""Lists tide's public headers (relative to include/), one per line: not those under a detail/
folder, which are the public headers' implementation and are compiled through them (checking
each alone cost CI about 25 s of wall time for 50 headers).

--host: those g++ compiles with no other dependency; --cuda: those that need the CUDA toolkit;
--mpi: those that need MPI; --json: those that need nlohmann/json."""
import pathlib, sys

root = pathlib.Path(sys.argv[1])
groups = {"--cuda": ("tide/backends/cuda/", "tide/collectives/nccl"), "--mpi": ("tide/collectives/mpi",),
          "--json": ("tide/io/",)}
headers = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.hpp") if "detail" not in p.parts)
kind = sys.argv[2] if len(sys.argv) > 2 else "--host"
special = tuple(p for g in groups.values() for p in g)
if kind == "--host":
    chosen = [h for h in headers if not h.startswith(special)]
else:
    chosen = [h for h in headers if h.startswith(groups[kind])]
print("\n".join(chosen))
