#!/usr/bin/env bash
# Installs a flashgrad build tree into a fresh prefix, then builds and runs
# consumers against it: a CMake project (find_package) and, with pkg-config,
# the same C program compiled by hand.
#   check_install.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$(realpath "$1")
work=$2
src=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
mkdir -p "$work"
work=$(realpath "$work")
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
cmake -S "$src" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" > "$work/consumer.log"
cmake --build "$work/consumer" >> "$work/consumer.log"
"$work/consumer/consumer_cpp"
"$work/consumer/consumer_c"
[ ! -x "$work/consumer/consumer_mpi" ] || "$work/consumer/consumer_mpi"
pc=$(find "$prefix" -name flashgrad.pc -print -quit)
export PKG_CONFIG_PATH=$(dirname "$pc")
cc -std=c99 "$src/consumer.c" $(pkg-config --cflags --libs flashgrad) -Wl,-rpath,"$(pkg-config --variable=libdir flashgrad)" \
   -o "$work/consumer_pkgconfig"
"$work/consumer_pkgconfig"
# Nothing of the build tree or the Python package may leak into the install.
if find "$prefix" -name '_flashgrad*' | grep -q .; then echo "check_install: the Python module was installed"; exit 1; fi
echo "check_install: installed tree OK ($(find "$prefix" -type f | wc -l) files)"
