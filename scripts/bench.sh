#!/usr/bin/env bash
# The benchmark suite in one command: set-up, Release build, then
# `flashgrad bench --sweep` (docs/performance.md), which writes
# out/sweep/sweep.md, sweep.json and sweep_{time,memory,ratio}.png.
# Extra arguments go to the sweep, e.g. --max-seqlen 4096 or --no-torch.
# It takes about 17 minutes on 2 cores; other jobs on the machine inflate the
# times (the report records the load average).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
"${BUILD_DIR:-build}/tools/flashgrad" bench --sweep --out out/sweep "$@"
