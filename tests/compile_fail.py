#!/usr/bin/env python3
"""Compile-fail tests: each snippet must fail to compile with the message in its '// expect:' line."""
import pathlib, subprocess, sys

compiler, include, *snippets = sys.argv[1:]
failed = 0
for path in map(pathlib.Path, snippets):
    expect = path.read_text().splitlines()[0].removeprefix("// expect:").strip()
    r = subprocess.run([*compiler.split(), "-std=c++20", "-fsyntax-only", "-I", include, str(path)],
                       capture_output=True, text=True)
    if r.returncode == 0:
        print(f"FAIL {path.name}: compiled, expected an error containing '{expect}'")
        failed += 1
    elif expect not in r.stderr:
        print(f"FAIL {path.name}: the error does not say '{expect}':\n{r.stderr[:3000]}")
        failed += 1
    else:
        print(f"ok   {path.name}: {expect}")
print(f"{len(snippets) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
