#!/usr/bin/env python3
"""Compiles every ```cpp block of the given Markdown files with the given compiler, so that
the docs show code that compiles. A block with an #include is a whole translation unit; any
other block is a fragment, compiled inside a function after #include <tide/tide.hpp>. With g++ or
clang++, -Wall -Wextra -Werror: the idioms the docs show compile warning-free.

usage: check_docs.py [--separate] "COMPILER ARGS" INCLUDE_DIR FILE.md...

--separate: compile with TIDE_SEPARATE_COMPILATION defined (include/tide/core/config.hpp): the same
API, its definitions left to the library, so a syntax check takes a third of the time. The suite
checks the docs header-only with g++ and in separate compilation with clang++.

A compiler without -fsyntax-only (nvcc) gets "-c -o /dev/null" instead when it contains "nvcc"."""
import pathlib, re, subprocess, sys, tempfile

args = sys.argv[1:]
separate = args[:1] == ["--separate"]
compiler, include, *docs = args[1:] if separate else args
defines = ["-DTIDE_SEPARATE_COMPILATION"] if separate else []
# Clang before 17 lacks class template argument deduction for aggregates (C++20, P1816), which
# `tide::hooks{.after_backward = h}` uses: such blocks are reported as skipped there, by name.
version = subprocess.run([*compiler.split(), "--version"], capture_output=True, text=True).stdout
clang = re.search(r"clang version (\d+)", version)
no_aggregate_ctad = bool(clang) and int(clang.group(1)) < 17
failed = total = skipped = 0
for doc in map(pathlib.Path, docs):
    for i, block in enumerate(re.findall(r"```cpp\n(.*?)```", doc.read_text(), re.S)):
        total += 1
        if no_aggregate_ctad and re.search(r"tide::hooks(\s+const)?(\s+\w+)?\s*\{", block):
            skipped += 1
            print(f"skip {doc.name} block {i + 1}: tide::hooks{{...}} needs aggregate CTAD (Clang 17 or later)")
            continue
        src = block if "#include" in block else "#include <tide/tide.hpp>\nvoid snippet() {\n" + block + "\n}\n"
        nvcc = "nvcc" in compiler
        with tempfile.NamedTemporaryFile("w", suffix=".cu" if nvcc else ".cpp", delete=False) as f:
            f.write(src)
        only = ["-c", "-o", "/dev/null"] if nvcc else ["-fsyntax-only"]
        # The idioms compile warning-free (nvcc: no -Wextra on .cu files). A fragment's variables
        # are often only declared to be shown: unused ones are the harness's, not the idiom's.
        warn = [] if nvcc else ["-Wall", "-Wextra", "-Werror"]
        if not nvcc and "#include" not in block:
            warn += ["-Wno-unused-variable", "-Wno-unused-but-set-variable", "-Wno-unused-parameter",
                     "-Wno-unused-local-typedefs", "-Wno-unused-lambda-capture", "-Wno-unused-value"]
        r = subprocess.run([*compiler.split(), "-std=c++20", *defines, *only, *warn, "-I", include, f.name],
                           capture_output=True, text=True)
        pathlib.Path(f.name).unlink()
        if r.returncode:
            failed += 1
            print(f"FAIL {doc.name} block {i + 1}:\n{src}\n{r.stderr[:3000]}")
        else:
            print(f"ok   {doc.name} block {i + 1}")
print(f"{total - failed - skipped} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
