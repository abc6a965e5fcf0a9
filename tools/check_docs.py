#!/usr/bin/env python3
"""Compiles every ```cpp block of the given Markdown files with the given compiler, so that
the docs show code that compiles. A block with an #include is a whole translation unit; any
other block is a fragment, compiled inside a function after #include <tide/tide.hpp>.

usage: check_docs.py "COMPILER ARGS" INCLUDE_DIR FILE.md...

A compiler without -fsyntax-only (nvcc) gets "-c -o /dev/null" instead when it contains "nvcc"."""
import pathlib, re, subprocess, sys, tempfile

compiler, include, *docs = sys.argv[1:]
failed = total = 0
for doc in map(pathlib.Path, docs):
    for i, block in enumerate(re.findall(r"```cpp\n(.*?)```", doc.read_text(), re.S)):
        total += 1
        src = block if "#include" in block else "#include <tide/tide.hpp>\nvoid snippet() {\n" + block + "\n}\n"
        nvcc = "nvcc" in compiler
        with tempfile.NamedTemporaryFile("w", suffix=".cu" if nvcc else ".cpp", delete=False) as f:
            f.write(src)
        only = ["-c", "-o", "/dev/null"] if nvcc else ["-fsyntax-only"]
        r = subprocess.run([*compiler.split(), "-std=c++20", *only, "-I", include, f.name],
                           capture_output=True, text=True)
        pathlib.Path(f.name).unlink()
        if r.returncode:
            failed += 1
            print(f"FAIL {doc.name} block {i + 1}:\n{src}\n{r.stderr[:3000]}")
        else:
            print(f"ok   {doc.name} block {i + 1}")
print(f"{total - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
