#!/usr/bin/env python3
"""Every CUDA error that driver_types.h documents as leaving the process unusable ("must be
terminated") is one that tide::is_sticky reports. Usage: sticky_errors.py DRIVER_TYPES_H CUDA_ERROR_HPP"""
import re, sys

header, ours = (open(p).read() for p in sys.argv[1:3])
# Each enumerator with the doc comment just before it.
documented = re.findall(r"/\*\*((?:(?!\*/).)*)\*/\s*(cudaError\w+)\s*=", header, re.S)
sticky = {name for doc, name in documented if re.search(r"must[\s*]+be[\s*]+terminated", doc)}
if not sticky:
    sys.exit("found no error documented as 'must be terminated': has the header's format changed?")
body = ours[ours.index("constexpr bool is_sticky"):ours.index("struct cuda_error")]
listed = set(re.findall(r"case (cudaError\w+):", body))
missing = sorted(sticky - listed)
for name in sorted(sticky):
    print(("ok      " if name in listed else "MISSING ") + name)
if missing:
    sys.exit(f"tide::is_sticky misses {', '.join(missing)}")
print(f"{len(sticky)} documented sticky errors, all listed")
