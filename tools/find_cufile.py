#!/usr/bin/env python3
"""Prints where cuFile is (its include and lib directories and the library file, one per line),
or nothing: meson.build's GPUDirect Storage detection. Looks in the given CUDA toolkit, then in
the `nvidia-cufile` wheel: the Python packages, and the directory tools/install-deps.sh installs
it into (TIDE_CUFILE_DIR, default ~/.cache/tide/nvidia-cufile)."""
import glob
import os
import sys


def candidates(cuda_root):
    yield cuda_root
    yield os.path.join(cuda_root, "targets", "x86_64-linux")
    yield os.path.join(cuda_root, "targets", "sbsa-linux")
    cache = os.environ.get("TIDE_CUFILE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tide", "nvidia-cufile")
    roots = [cache] + list(sys.path)
    for r in roots:
        for sub in ("cu13", "cu12", "cufile"):
            yield os.path.join(r, "nvidia", sub)


def main():
    cuda_root = sys.argv[1] if len(sys.argv) > 1 else "/usr/local/cuda"
    for root in candidates(cuda_root):
        inc = os.path.join(root, "include")
        if not os.path.isfile(os.path.join(inc, "cufile.h")):
            continue
        for libdir in (os.path.join(root, "lib64"), os.path.join(root, "lib")):
            libs = sorted(glob.glob(os.path.join(libdir, "libcufile.so*")), key=len)
            libs = [l for l in libs if os.path.basename(l).startswith("libcufile.so")]
            if libs:
                print(inc)
                print(libdir)
                print(libs[0])
                return


main()
