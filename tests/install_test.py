#!/usr/bin/env python3
"""Installs tide into a scratch DESTDIR, then builds tests/consumer/main.cpp against the installed
headers: with the flags from the installed pkg-config file, and with CMake through the installed
package (find_package) and through the source tree (add_subdirectory), header-only and with
-DTIDE_SEPARATE_COMPILATION=ON (tide's compiled library linked); checks `pkg-config
--cflags tide-cuda` when the build has the CUDA backend.

With nlohmann/json (environment TIDE_JSON: system when pkg-config found it, other, or none), also
the installed tide-plan and, for system, pkg-config tide-json and the CMake target tide::json.

usage: install_test.py BUILD_DIR SOURCE_ROOT WORK_DIR COMPILER..."""
import os, pathlib, shutil, subprocess, sys

build, src, work, *cxx = sys.argv[1:]
json_kind = os.environ.get("TIDE_JSON", "none")
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
def pkg(*what):
    return subprocess.run(["pkg-config", *what, "tide"], env=env, capture_output=True, text=True, check=True).stdout.split()
cflags, libs = pkg("--cflags"), pkg("--libs")  # libraries after the sources that use them (liburing)
flags = cflags + libs
exe = work / "consumer"
r = subprocess.run([*cxx, *cflags, str(pathlib.Path(src) / "tests" / "consumer" / "main.cpp"), "-o", str(exe), *libs],
                   capture_output=True, text=True)
if r.returncode:
    sys.exit(f"building against the installed tide failed ({' '.join(flags)}):\n{r.stderr[:3000]}")
r = subprocess.run([str(exe)], capture_output=True, text=True)
print(r.stdout, end="")
if r.returncode:
    sys.exit("the program built against the installed tide failed")
print(f"installed: {headers[0].parent.relative_to(dest)}, {pcs[0].relative_to(dest)}; pkg-config flags: {' '.join(flags)}")

# pkg-config tide-cuda, where the build has the CUDA backend.
cuda_pcs = list(dest.rglob("tide-cuda.pc"))
if cuda_pcs:
    r = subprocess.run(["pkg-config", "--cflags", "--libs", "tide-cuda"], env=env, capture_output=True, text=True)
    if r.returncode or "cccl" not in r.stdout or "-lcudart" not in r.stdout:
        sys.exit(f"pkg-config tide-cuda: {r.stdout}{r.stderr}")
    print(f"pkg-config tide-cuda: {r.stdout.strip()}")

# pkg-config tide-json, where the build found the system's nlohmann/json.
if json_kind == "system":
    r = subprocess.run(["pkg-config", "--cflags", "--libs", "tide-json"], env=env, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"pkg-config tide-json: {r.stdout}{r.stderr}")
    print(f"pkg-config tide-json: {r.stdout.strip()}")

# CMake: find_package against the install, and add_subdirectory of the source tree.
cmake = shutil.which("cmake")
if not cmake:
    sys.exit("cmake not found (tools/install-deps.sh installs it)")
configs = list(dest.rglob("tideConfig.cmake"))
if len(configs) != 1 or not list(dest.rglob("tideConfigVersion.cmake")):
    sys.exit(f"expected tideConfig.cmake and tideConfigVersion.cmake under {dest}, found {configs}")
prefix = configs[0].parents[3]  # PREFIX/lib[/triplet]/cmake/tide/tideConfig.cmake
while not (prefix / "include" / "tide").is_dir() and prefix != dest:
    prefix = prefix.parent
consumer = pathlib.Path(src) / "tests" / "cmake_consumer"
cxx_env = dict(os.environ, CXX=cxx[0])
source_dir = f"-DTIDE_SOURCE_DIR={pathlib.Path(src).resolve()}"
# The source tree twice: header-only, and in separate compilation (tide::tide links tide_compiled).
for name, extra in (("find_package", [f"-DCMAKE_PREFIX_PATH={prefix}"]), ("add_subdirectory", [source_dir]),
                    ("add_subdirectory_separate", [source_dir, "-DTIDE_SEPARATE_COMPILATION=ON"])):
    b = work / f"cmake_{name}"
    for cmd in ([cmake, "-S", str(consumer), "-B", str(b), *extra], [cmake, "--build", str(b)]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=cxx_env)
        if r.returncode:
            sys.exit(f"CMake ({name}): {' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    if name.endswith("separate") and not list(b.rglob("libtide_compiled.a")):
        sys.exit("CMake: -DTIDE_SEPARATE_COMPILATION=ON built no libtide_compiled.a")
    if json_kind == "system" and not (b / "consumer_json").exists():
        sys.exit("CMake: tide::json was not defined although nlohmann_json is installed")
    for exe in ("consumer", "consumer_cuda", "consumer_json"):
        if (b / exe).exists():
            r = subprocess.run([str(b / exe)], capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"CMake ({name}): {exe} failed: {r.stdout}{r.stderr}")
            print(f"cmake {name}: {r.stdout.strip()}")

# The version file (Meson writes it without a cmake program): the versions and ranges
# find_package accepts and refuses (pre-1.0: the same minor version, not older).
version = (pathlib.Path(src) / "meson.build").read_text().split("version: '", 1)[1].split("'", 1)[0]
major, minor, patch = (int(x) for x in version.split("."))
probe = work / "cmake_version_probe"
shutil.rmtree(probe, ignore_errors=True)
probe.mkdir()
cases = [(f"{major}.{minor}", True), (version, True), ("", True), (f"{major}.{minor}...{major}.{minor + 1}", True),
         (f"{major}.{minor}...<{major}.{minor + 1}", True), (f"{major}.{minor + 1}", False), (f"{major}.{minor}.{patch + 1}", False),
         (f"{major + 1}.0", False)]
if minor > 0:  # an older minor version, alone and as a range's lower end
    cases += [(f"{major}.{minor - 1}", False), (f"{major}.{minor - 1}...<{major}.{minor + 1}", False)]
for asked, found in cases:
    # One build directory for all (the compiler is detected once); tide's targets need CXX.
    (probe / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.19)\nproject(probe CXX)\n"
                                          f"find_package(tide {asked} QUIET)\nmessage(STATUS \"tide found: ${{tide_FOUND}}\")\n")
    b = probe / "build"
    r = subprocess.run([cmake, "-S", str(probe), "-B", str(b), f"-DCMAKE_PREFIX_PATH={prefix}"], capture_output=True, text=True,
                       env=cxx_env)
    got = "tide found: 1" in r.stdout
    if r.returncode or got != found:
        sys.exit(f"CMake: find_package(tide {asked}) against tide {version} {'found' if got else 'did not find'} it:\n{r.stdout}{r.stderr}")
print(f"cmake version file: tide {version} accepted and refused as SameMinorVersion")

# tide-plan and tide-plot-trace, installed side by side; the installed tide-plan runs.
if json_kind == "none":
    sys.exit(0)
plans = list(dest.rglob("bin/tide-plan"))
if len(plans) != 1 or not (plans[0].parent / "tide-plot-trace").exists():
    sys.exit(f"expected bin/tide-plan and bin/tide-plot-trace under {dest}, found {plans}")
r = subprocess.run([str(plans[0]), "--help"], capture_output=True, text=True)
if r.returncode or "--policy-out" not in r.stdout:
    sys.exit(f"the installed tide-plan --help failed: {r.stdout}{r.stderr}")
print(f"installed: {plans[0].relative_to(dest)} and tide-plot-trace")
