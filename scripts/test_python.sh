#!/usr/bin/env bash
# The Python package as a pip user gets it: `pip install .` into the venv
# (scripts/venv.sh, torch 2.x from PyPI), then the whole pytest suite against
# the installed package. (ctest's `python` test runs the same suite on
# Debian's torch 1.13 from the CMake build.) The build runs without pip's build
# isolation, in the venv itself, so that CMake sees jax and mlx there and builds
# flashgrad.jax's and flashgrad.mlx's extensions.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/venv.sh | tail -n 1)  # made by setup.sh; a no-op when current
py="$venv/bin/python"
echo "test_python: pip install . into $venv"
"$py" -m pip install -q --no-deps --no-build-isolation --force-reinstall -Cbuild-dir="${BUILD_DIR:-build}/pip" .
"$py" -c "import torch, flashgrad; print(f'test_python: torch {torch.__version__}, flashgrad {flashgrad.__version__} from {flashgrad.__file__}, isa {flashgrad.isa()}')"
"$py" -c "import flashgrad.jax, flashgrad.mlx, jax, mlx.core as mx; print(f'test_python: flashgrad.jax on jax {jax.__version__}, flashgrad.mlx on mlx {mx.__version__}')"
cd python/tests
PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -q -p no:cacheprovider .
