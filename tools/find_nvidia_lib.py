#!/usr/bin/env python3
"""Prints where an NVIDIA library is (its include directory, its lib directory and the library
file, one per line), or nothing: meson.build's detection of NCCL and cuFile, which really
searches (Meson's CUDA compiler's find_library returns -lNAME for any name, found or not).

usage: find_nvidia_lib.py nccl|cufile [CUDA_ROOT]

Looks, in order, in the CUDA toolkit (CUDA_ROOT and its targets/*-linux), the system's include and
lib directories (Debian's libnccl-dev), the directory tools/install-deps.sh installs the cuFile
wheel into (TIDE_CUFILE_DIR, default ~/.cache/tide/nvidia-cufile), and the Python packages' nvidia/
wheels (nvidia-nccl-cu13, nvidia-cufile: what a CUDA image with PyTorch carries). A candidate counts
only with both its header and a shared library (libNAME.so or libNAME.so.N) beside it. Setting
TIDE_NVIDIA_LIB_ROOTS (directories separated by ':') replaces the whole search: a test of "not
found" needs a search that cannot reach the machine's own copies."""
import glob
import os
import sys

HEADERS = {"nccl": "nccl.h", "cufile": "cufile.h"}
WHEEL_DIRS = {"nccl": ("nccl", "cu13", "cu12"), "cufile": ("cu13", "cu12", "cufile")}


def candidates(name, cuda_root):
    """Roots that may hold include/HEADER and lib[64]/libNAME.so*."""
    if "TIDE_NVIDIA_LIB_ROOTS" in os.environ:
        yield from (r for r in os.environ["TIDE_NVIDIA_LIB_ROOTS"].split(":") if r)
        return
    yield cuda_root
    for t in ("x86_64-linux", "sbsa-linux"):
        yield os.path.join(cuda_root, "targets", t)
    yield "/usr"
    yield "/usr/local"
    roots = []
    if name == "cufile":
        roots.append(os.environ.get("TIDE_CUFILE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tide", "nvidia-cufile"))
    roots += [p for p in sys.path if p]
    for r in roots:
        for sub in WHEEL_DIRS[name]:
            yield os.path.join(r, "nvidia", sub)


def lib_dirs(root):
    yield os.path.join(root, "lib64")
    yield os.path.join(root, "lib")
    yield os.path.join(root, "lib", "x86_64-linux-gnu")
    yield os.path.join(root, "lib", "aarch64-linux-gnu")


def find(name, cuda_root):
    for root in candidates(name, cuda_root):
        inc = os.path.join(root, "include")
        if not os.path.isfile(os.path.join(inc, HEADERS[name])):
            continue
        for libdir in lib_dirs(root):
            # libNAME.so first (the shortest name), else a versioned one (a wheel ships only libNAME.so.N).
            libs = sorted((l for l in glob.glob(os.path.join(libdir, f"lib{name}.so*"))
                           if os.path.basename(l).split(".so")[0] == f"lib{name}"), key=len)
            if libs:
                return inc, libdir, libs[0]
    return None


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in HEADERS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(HEADERS)} [CUDA_ROOT]")
    where = find(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "/usr/local/cuda")
    if where:
        print("\n".join(where))


if __name__ == "__main__":
    main()
