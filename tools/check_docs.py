#!/usr/bin/env python3
"""Compiles every ```cpp block of the given Markdown files with the given compiler, so that
the docs show code that compiles. A block with an #include is a whole translation unit; any
other block is a fragment, compiled inside a function after #include <tide/tide.hpp>. With g++ or
clang++, -Wall -Wextra -Werror: the idioms the docs show compile warning-free.

usage: check_docs.py [--separate] [--jobs N] "COMPILER ARGS" INCLUDE_DIR FILE.md...

--separate: compile with TIDE_SEPARATE_COMPILATION defined (include/tide/core/config.hpp): the same
API, its definitions left to the library, so a syntax check takes a third of the time. The suite
checks the docs in separate compilation with g++ and header-only with clang++.

A compiler without -fsyntax-only (nvcc) gets "-c -o /dev/null" instead when it contains "nvcc".

--jobs N: check N blocks at a time (default 1: the suite runs other tests beside this one; 0: one
per CPU).

With clang++, <tide/tide.hpp> is precompiled once, with the blocks' options, and a block that
begins with `#include <tide/tide.hpp>` (every fragment, most whole blocks) gets it by -include-pch
instead of parsing the umbrella again; a block that begins otherwise parses its headers as a
user's compile would. Not with g++: GCC 12 loses `#pragma GCC diagnostic` state in a precompiled
header, so it would report warnings that tide's headers silence."""
import concurrent.futures, os, pathlib, re, subprocess, sys, tempfile

args = sys.argv[1:]
separate, jobs = False, 1
while args[:1] and args[0].startswith("--"):  # the options, in any order, before the compiler
    if args[0] == "--separate":
        separate, args = True, args[1:]
    elif args[0] == "--jobs" and len(args) > 1 and args[1].isdigit():
        jobs, args = int(args[1]), args[2:]
    else:
        sys.exit(f"check_docs.py: unknown option or bad value: {' '.join(args[:2])}\n{__doc__}")
if len(args) < 3:
    sys.exit(f"check_docs.py: needs a compiler, an include directory and at least one file\n{__doc__}")
compiler, include, *docs = args
defines = ["-DTIDE_SEPARATE_COMPILATION"] if separate else []
# Clang before 17 lacks class template argument deduction for aggregates (C++20, P1816), which
# `tide::hooks{.after_backward = h}` uses: such blocks are reported as skipped there, by name.
version = subprocess.run([*compiler.split(), "--version"], capture_output=True, text=True).stdout
clang = re.search(r"clang version (\d+)", version)
no_aggregate_ctad = bool(clang) and int(clang.group(1)) < 17
nvcc = "nvcc" in compiler
umbrella = "#include <tide/tide.hpp>"
pch_dir = tempfile.TemporaryDirectory()
pch = []
if clang:
    out = pathlib.Path(pch_dir.name) / "tide.hpp.pch"
    # Precompiled from a file that includes it (the umbrella itself would be a main file with
    # #pragma once), with the blocks' options, warnings too, so that one in tide's headers still
    # fails the check.
    wrapper = pathlib.Path(pch_dir.name) / "umbrella.hpp"
    wrapper.write_text(umbrella + "\n")
    r = subprocess.run([*compiler.split(), "-std=c++20", *defines, "-Wall", "-Wextra", "-Werror", "-x", "c++-header",
                        "-I", include, str(wrapper), "-o", str(out)], capture_output=True, text=True)
    if r.returncode:
        print(f"FAIL precompiling <tide/tide.hpp>:\n{r.stderr[:3000]}")
        sys.exit(1)
    pch = ["-include-pch", str(out)]

def check(src, fragment):
    """The compiler's exit status and messages for one block's translation unit."""
    with tempfile.NamedTemporaryFile("w", suffix=".cu" if nvcc else ".cpp", delete=False) as f:
        f.write(src)
    only = ["-c", "-o", "/dev/null"] if nvcc else ["-fsyntax-only"]
    # The idioms compile warning-free (nvcc: no -Wextra on .cu files). A fragment's variables
    # are often only declared to be shown: unused ones are the harness's, not the idiom's.
    warn = [] if nvcc else ["-Wall", "-Wextra", "-Werror"]
    if not nvcc and fragment:
        warn += ["-Wno-unused-variable", "-Wno-unused-but-set-variable", "-Wno-unused-parameter",
                 "-Wno-unused-local-typedefs", "-Wno-unused-lambda-capture", "-Wno-unused-value"]
    # The precompiled umbrella is included ahead of the text: only where the text begins with it.
    first = pch if src.startswith(umbrella + "\n") else []
    r = subprocess.run([*compiler.split(), "-std=c++20", *defines, *only, *warn, *first, "-I", include, f.name],
                       capture_output=True, text=True)
    pathlib.Path(f.name).unlink()
    return r.returncode, r.stderr


failed = total = skipped = 0
blocks = []  # (name, source, fragment)
for doc in map(pathlib.Path, docs):
    for i, block in enumerate(re.findall(r"```cpp\n(.*?)```", doc.read_text(), re.S)):
        total += 1
        name = f"{doc.name} block {i + 1}"
        if no_aggregate_ctad and re.search(r"tide::hooks(\s+const)?(\s+\w+)?\s*\{", block):
            skipped += 1
            print(f"skip {name}: tide::hooks{{...}} needs aggregate CTAD (Clang 17 or later)")
            continue
        fragment = "#include" not in block
        src = umbrella + "\nvoid snippet() {\n" + block + "\n}\n" if fragment else block
        blocks.append((name, src, fragment))
with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
    results = pool.map(lambda b: check(b[1], b[2]), blocks)
    for (name, src, _), (rc, err) in zip(blocks, results):
        if rc:
            failed += 1
            print(f"FAIL {name}:\n{src}\n{err[:3000]}")
        else:
            print(f"ok   {name}")
print(f"{total - failed - skipped} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
