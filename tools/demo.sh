#!/usr/bin/env bash
# The main demo: builds tide's examples (installing Meson and friends if missing) and trains the
# 16-layer CPU network under keep-all, remat and offload, then under a device budget. Extra
# arguments go to the demo (--json, --trace FILE, --layers N, ...). With --trace FILE it also
# draws FILE.png when matplotlib is available.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
if [ -f build-demo/build.ninja ]; then meson setup --reconfigure build-demo >/dev/null
else meson setup build-demo -Dbuildtype=release -Dcuda=disabled -Dtests=false -Dbenchmarks=false >/dev/null; fi
ninja -C build-demo examples/mlp/mlp >/dev/null
build-demo/examples/mlp/mlp "$@"
trace=""
prev=""
for a in "$@"; do
  [ "$prev" = "--trace" ] && trace="$a"
  prev="$a"
done
if [ -n "$trace" ]; then
  python3 -c "import matplotlib" 2>/dev/null || python3 -m pip install -q matplotlib >/dev/null 2>&1 || true
  python3 tools/plot_trace.py "$trace" "$trace.png" && echo "timeline drawn: $trace.png" || true
fi
