#!/usr/bin/env python3
"""tide's streams are non-blocking: they do not wait for the legacy default stream. A
`cudaMemset` (which runs on the legacy stream) in the CUDA examples and benchmarks must be followed
by a `cudaDeviceSynchronize()` within ten lines, or be a `cudaMemsetAsync` on the stream that
uses the memory; otherwise a step may read memory the memset is still writing (issue 27, item
10: the adjoint twin zeroed its gradient and carry this way).

usage: legacy_stream_test.py SOURCE_ROOT"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
problems = []
files = [p for d in ("examples", "bench") for p in (root / d).rglob("*") if p.suffix in (".cu", ".cuh", ".hpp", ".cpp")]
for path in files:
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        code = line.split("//")[0]
        if not re.search(r"\bcudaMemset\s*\(", code):
            continue
        after = "\n".join(l.split("//")[0] for l in lines[i:i + 10])
        if "cudaDeviceSynchronize()" not in after:
            problems.append(f"{path.relative_to(root)}:{i + 1}: cudaMemset on the legacy stream without a "
                            f"cudaDeviceSynchronize() after it: use cudaMemsetAsync on the stream that uses the memory")
for p in problems:
    print(p)
print(f"legacy_stream: {len(files)} files, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
