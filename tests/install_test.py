#!/usr/bin/env python3
"""Installs tide into a scratch DESTDIR, then builds tests/consumer/main.cpp against the installed
headers with the flags from the installed pkg-config file.

usage: install_test.py BUILD_DIR SOURCE_ROOT WORK_DIR COMPILER..."""
import os, pathlib, shutil, subprocess, sys

build, src, work, *cxx = sys.argv[1:]
work = pathlib.Path(work)
shutil.rmtree(work, ignore_errors=True)
dest = work / "dest"
r = subprocess.run(["meson", "install", "-C", build, "--no-rebuild", "--destdir", str(dest)], capture_output=True, text=True)
if r.returncode:
    sys.exit(f"meson install failed:\n{r.stdout}\n{r.stderr}")
pcs = list(dest.rglob("tide.pc"))
headers = list(dest.rglob("include/tide/tide.hpp"))
if len(pcs) != 1 or len(headers) != 1:
    sys.exit(f"expected one tide.pc and one tide/tide.hpp under {dest}, found {pcs} and {headers}")
env = dict(os.environ, PKG_CONFIG_PATH=str(pcs[0].parent), PKG_CONFIG_SYSROOT_DIR=str(dest))
flags = subprocess.run(["pkg-config", "--cflags", "--libs", "tide"], env=env, capture_output=True, text=True, check=True).stdout.split()
exe = work / "consumer"
r = subprocess.run([*cxx, *flags, str(pathlib.Path(src) / "tests" / "consumer" / "main.cpp"), "-o", str(exe)],
                   capture_output=True, text=True)
if r.returncode:
    sys.exit(f"building against the installed tide failed ({' '.join(flags)}):\n{r.stderr[:3000]}")
r = subprocess.run([str(exe)], capture_output=True, text=True)
print(r.stdout, end="")
if r.returncode:
    sys.exit("the program built against the installed tide failed")
print(f"installed: {headers[0].parent.relative_to(dest)}, {pcs[0].relative_to(dest)}; pkg-config flags: {' '.join(flags)}")
