#!/usr/bin/env bash
# The main demo: builds tide's examples (installing Meson, OpenBLAS and friends if missing) and
# trains a small decoder transformer (dense then mixture-of-experts layers) under the published
# experiment's policies: keep-all, full remat, Llama's QKV offload and DeepSeek's projection
# offload (copies on the compute stream, latency-hidden, pipelined) and the planner's choice,
# then, under a device budget, each policy at its best micro-batch by measured tokens per second
# (the planner's row tuned by measurement, tide::tune). Extra arguments go to the
# demo (--json, --trace FILE, --layers N, ...; --help lists them). With --trace FILE it also draws
# FILE.png when matplotlib is available. (The smallest example, a 16-layer MLP, is
# build-demo/examples/mlp/mlp.)
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
if [ -f build-demo/build.ninja ]; then meson setup --reconfigure build-demo >/dev/null
else meson setup build-demo -Dbuildtype=release -Dcuda=disabled -Dtests=false -Dbenchmarks=false >/dev/null; fi
if ! grep -q "examples/transformer/transformer:" build-demo/build.ninja; then
  echo "tools/demo.sh: the transformer demo needs OpenBLAS (Debian: libopenblas-dev), which Meson did not find" >&2
  exit 1
fi
ninja -C build-demo examples/transformer/transformer examples/mlp/mlp >/dev/null
OPENBLAS_NUM_THREADS=1 build-demo/examples/transformer/transformer "$@"
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
