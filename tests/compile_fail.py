#!/usr/bin/env python3
"""Compile-fail tests: each snippet must fail to compile with the message of each of its leading
'// expect:' lines (several: all of them)."""
import pathlib, subprocess, sys

compiler, include, *snippets = sys.argv[1:]
failed = 0
for path in map(pathlib.Path, snippets):
    lines = path.read_text().splitlines()
    expects = [l.removeprefix("// expect:").strip() for l in lines if l.startswith("// expect:")]
    r = subprocess.run([*compiler.split(), "-std=c++20", "-fsyntax-only", "-I", include, str(path)],
                       capture_output=True, text=True)
    missing = [e for e in expects if e not in r.stderr]
    if r.returncode == 0:
        print(f"FAIL {path.name}: compiled, expected an error containing '{expects[0]}'")
        failed += 1
    elif missing:
        print(f"FAIL {path.name}: the error does not say '{missing[0]}':\n{r.stderr[:3000]}")
        failed += 1
    else:
        print(f"ok   {path.name}: {' / '.join(expects)}")
print(f"{len(snippets) - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
