#!/usr/bin/env python3
"""Builds tests/consumer, a separate Meson project that vendors tide through subprojects/ and a
wrap with [provide], and runs its test: header-only (the default), then in separate compilation
(-Dtide:separate_compilation=true: tide's library built in the subproject and linked).
Usage: consumer_test.py SOURCE_ROOT WORK_DIR"""
import pathlib, shutil, subprocess, sys

src, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
shutil.copytree(src / "tests" / "consumer", work)
vendored = work / "subprojects" / "tide"
vendored.mkdir(parents=True)
for f in ("meson.build", "meson_options.txt"):
    shutil.copy(src / f, vendored / f)
shutil.copytree(src / "include", vendored / "include")
shutil.copytree(src / "src", vendored / "src")
for build, option in (("build", "false"), ("build-separate", "true")):
    for cmd in (["meson", "setup", build, "-Dtide:cuda=disabled", f"-Dtide:separate_compilation={option}"],
                ["meson", "compile", "-C", build], ["meson", "test", "-C", build, "--print-errorlogs"]):
        r = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        print(r.stdout[-2000:], r.stderr[-2000:])
        if r.returncode != 0:
            print(f"FAILED: {' '.join(cmd)}")
            sys.exit(1)
    if option == "true" and not list((work / build).rglob("libtide.a")):
        print(f"FAILED: separate compilation built no libtide.a in {build}")
        sys.exit(1)
print("consumer project built tide as a subproject, header-only and in separate compilation, and passed")
