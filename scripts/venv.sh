#!/usr/bin/env bash
# The Python venv with PyPI's packages (python/requirements-venv.txt: torch 2.x,
# numpy, pytest and pip's build tools), made with Debian's python3 once per
# machine and kept: PyPI's Linux torch is a CUDA build of several GB. It is
# brought up to date only when the requirements file changes.
#   FLASHGRAD_VENV  where it lives (default ~/.cache/flashgrad/venv)
# Prints the venv's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FLASHGRAD_VENV:-$HOME/.cache/flashgrad/venv}"
req=python/requirements-venv.txt
stamp="$venv/.flashgrad-requirements"
if [ ! -x "$venv/bin/python" ]; then
  echo "flashgrad venv: creating $venv" >&2
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
fi
if ! cmp -s "$req" "$stamp"; then
  echo "flashgrad venv: installing $req (torch from PyPI is several GB the first time)" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -r "$req" >&2
  cp "$req" "$stamp"
fi
echo "$venv"
