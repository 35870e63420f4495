#!/usr/bin/env bash
# Installs what flashgrad needs on Debian 12 (apt packages, only those missing),
# then the Python venv with PyPI torch 2.x (scripts/venv.sh).
set -euo pipefail
packages=(build-essential cmake pkg-config libgtest-dev libbenchmark-dev libdlpack-dev
          libopenblas-dev python3-matplotlib python3-numpy
          python3-dev python3-venv pybind11-dev python3-torch python3-pytest
          libdnnl-dev libjemalloc2 libopenmpi-dev openmpi-bin python3-mpi4py libblis-dev)
# The roofline's small-GEMM comparison; Debian builds libxsmm for amd64 only.
# scripts/cross_arm64.sh: the portable path built for aarch64, its tests under qemu-user.
if [ "$(dpkg --print-architecture)" = amd64 ]; then packages+=(libxsmm-dev g++-aarch64-linux-gnu qemu-user); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "flashgrad setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The Python venv with PyPI's packages (torch 2.x and pip's build tools), kept
# across runs in ~/.cache/flashgrad/venv (scripts/venv.sh).
bash "$(dirname "$0")/venv.sh" > /dev/null
