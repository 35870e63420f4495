#!/usr/bin/env bash
# The test command: set-up, Release build, then the whole suite under ctest
# (the Python suite on Debian's torch 1.13 among it), the Python suite again
# on PyPI's torch 2.x in a venv after `pip install .`, the sanitizer runs and
# the aarch64 cross build under qemu-user.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
bash scripts/test_python.sh
bash scripts/sanitize.sh
bash scripts/cross_arm64.sh
