#!/usr/bin/env bash
# The main job: set-up, Release build, then the demo (correctness check, then
# time and peak memory against naive attention as the sequence grows).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
"${BUILD_DIR:-build}/tools/flashgrad" demo "$@"
