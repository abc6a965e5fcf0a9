#!/usr/bin/env python3
"""Compile-fail tests: each snippet must fail to compile with the message of each of its leading
'// expect:' lines (several: all of them).

Every snippet starts with #include <tide/tide.hpp>, so the umbrella header is precompiled once (in
a folder searched before include/, where GCC looks for tide/tide.hpp.gch) instead of parsed for
each snippet. Where that fails (another compiler, a read-only temporary folder) the snippets are
compiled without it: the result is the same, only slower. They are compiled in separate compilation
(TIDE_SEPARATE_COMPILATION, include/tide/core/config.hpp): the same templates and static_asserts,
without the definitions of the library's parts, which -fsyntax-only would otherwise instantiate for
every snippet (2 s each with g++ 12, header-only, against about half a second)."""
import pathlib, subprocess, sys, tempfile

compiler, include, *snippets = sys.argv[1:]
flags = ["-std=c++20", "-DTIDE_SEPARATE_COMPILATION"]
with tempfile.TemporaryDirectory(prefix="tide_compile_fail_") as tmp:
    pch_dir = pathlib.Path(tmp)
    (pch_dir / "tide").mkdir()
    pch = subprocess.run([*compiler.split(), *flags, "-x", "c++-header", "-I", include,
                          str(pathlib.Path(include) / "tide" / "tide.hpp"), "-o", str(pch_dir / "tide" / "tide.hpp.gch")],
                         capture_output=True, text=True)
    search = ["-I", str(pch_dir), "-I", include] if pch.returncode == 0 else ["-I", include]
    if pch.returncode != 0:
        print(f"note: no precompiled header ({pch.stderr.strip()[:200]}); compiling each snippet whole")
    failed = 0
    for path in map(pathlib.Path, snippets):
        lines = path.read_text().splitlines()
        expects = [l.removeprefix("// expect:").strip() for l in lines if l.startswith("// expect:")]
        r = subprocess.run([*compiler.split(), *flags, "-fsyntax-only", *search, str(path)], capture_output=True, text=True)
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
