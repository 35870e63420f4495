#!/usr/bin/env bash
# Reliability checks (docs/reliability.md): an ASan+UBSan build, the test
# suite on one ISA path under it (the one the library picks, forced with
# FLASHGRAD_ISA for test_kernels, which otherwise checks every path; the
# ISA-independent tests run once), then a bounded run of the C ABI
# differential fuzzer.
#   SANITIZE_BUILD_DIR  build tree (default build-asan)
#   FUZZ_SEEDS          fuzz draws (default 600, about 40 s)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${SANITIZE_BUILD_DIR:-build-asan}"
seeds="${FUZZ_SEEDS:-600}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHGRAD_SANITIZE="address;undefined" \
  -DFLASHGRAD_BUILD_FUZZ=ON -DFLASHGRAD_BUILD_PYTHON=OFF -DFLASHGRAD_BUILD_TOOLS=OFF -DFLASHGRAD_BUILD_BENCH=OFF \
  > /dev/null
cmake --build "$build" -j "$(nproc)"

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# The path the library picks here (the Release build's tool says which).
isa=$("${BUILD_DIR:-build}/tools/flashgrad" info 2>/dev/null | awk '/^isa in use:/ {print $4}')
[ -n "$isa" ] || isa=scalar
others=$(printf '%s\n' scalar avx2 avx512 avx512bf16 amx | grep -vx "$isa" | paste -sd'|')
echo "sanitize: ASan+UBSan suite on the $isa path"
status=0
FLASHGRAD_ISA="$isa" ctest --test-dir "$build" --output-on-failure -j "$(nproc)" -E "\\.(${others})\$" -LE mpi || status=1
# OpenMPI keeps allocations of its own until exit (in libopen-pal and its
# plugins); the ring tests run with leak detection off, every other check on.
echo "sanitize: the MPI ring tests under ASan+UBSan (leak detection off)"
ASAN_OPTIONS="${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0}" \
  ctest --test-dir "$build" --output-on-failure -L mpi || status=1
echo "sanitize: C ABI fuzz, $seeds seeded draws"
"$build/fuzz/fuzz_c_abi_seeds" 0 "$seeds" || status=1
exit $status
