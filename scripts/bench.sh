#!/usr/bin/env bash
# The benchmark suite in one command: set-up, Release build, then
# `flashgrad-lab sweep` (docs/performance.md), which writes
# out/sweep/sweep.md, sweep.json and sweep_{time,memory,ratio}.png.
# Extra arguments go to the sweep, e.g. --max-seqlen 4096 or --no-torch.
# It takes about 17 minutes on 2 cores; other jobs on the machine inflate the
# times (the report records the load average).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
lab="${BUILD_DIR:-build}/bench/flashgrad-lab"
if [ ! -x "$lab" ]; then
  echo "bench.sh: $lab was not built: the lab needs OpenBLAS (Debian: apt-get install libopenblas-dev)" >&2
  exit 1
fi
"$lab" sweep --out out/sweep "$@"
