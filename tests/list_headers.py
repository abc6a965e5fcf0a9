#!/usr/bin/env python3
"""Lists tide's public headers (relative to include/), one per line. --host: those g++ can compile; --cuda: the rest."""
import pathlib, sys

root = pathlib.Path(sys.argv[1])
cuda_only = ("tide/backends/cuda/", "tide/collectives/nccl")
headers = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.hpp"))
want_cuda = "--cuda" in sys.argv
print("\n".join(h for h in headers if h.startswith(cuda_only) == want_cuda))
