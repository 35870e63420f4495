#!/usr/bin/env bash
# A long seeded run of the C ABI differential fuzzer, outside CI
# (docs/reliability.md): seeds [FIRST, FIRST + COUNT) in chunks, JOBS
# processes at once, a Release build. Prints a line per finished chunk with
# the running totals, keeps going after a failure, and lists every failing
# seed at the end; exits 1 if any draw failed.
#   scripts/fuzz_long.sh FIRST COUNT [JOBS]
#   BUILD_DIR   Release tree with FLASHGRAD_BUILD_FUZZ=ON (default build;
#               configured and built here if its fuzzer is missing)
#   CHUNK       seeds per chunk (default 2000)
#   LOG_DIR     where each chunk's output goes (default out/fuzz_long_FIRST)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: scripts/fuzz_long.sh FIRST COUNT [JOBS]" >&2
  exit 2
fi
first=$1 count=$2 jobs=${3:-$(nproc)}
build="${BUILD_DIR:-build}"
chunk="${CHUNK:-2000}"
logs="${LOG_DIR:-out/fuzz_long_$first}"
fuzz="$build/fuzz/fuzz_c_abi_seeds"
if [ ! -x "$fuzz" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFLASHGRAD_BUILD_FUZZ=ON > /dev/null
  cmake --build "$build" -j "$jobs" --target fuzz_c_abi_seeds
fi
mkdir -p "$logs"
end=$((first + count))
echo "fuzz_long: seeds [$first, $end), $jobs processes, chunks of $chunk, logs in $logs"
start_s=$(date +%s)

# One chunk: its seeds' output to a log of its own; its summary line on stdout.
run_chunk() {
  local s=$1 n=$2 log="$3/seeds_$1.log"
  "$4" "$s" "$n" > "$log" 2>&1 || true
  tail -n 1 "$log"
}
export -f run_chunk

totals() {  # sums the summary lines read on stdin: valid invalid failed
  awk '/^fuzz_c_abi_seeds: seeds/ {
         for (i = 1; i <= NF; ++i) {
           if ($(i + 1) ~ /^valid/) v += $i
           if ($(i + 1) ~ /^invalid/) inv += $i
           if ($(i + 1) ~ /^failed/) f += $i
         }
       }
       END { printf "%d %d %d\n", v, inv, f }'
}

done_chunks=0 nchunks=$(( (count + chunk - 1) / chunk ))
for ((s = first; s < end; s += chunk)); do
  n=$(( end - s < chunk ? end - s : chunk ))
  printf '%s %s\n' "$s" "$n"
done | xargs -P "$jobs" -n 2 bash -c 'run_chunk "$0" "$1" "'"$logs"'" "'"$fuzz"'"' |
  while read -r line; do
    done_chunks=$((done_chunks + 1))
    read -r v inv f < <(cat "$logs"/seeds_*.log | totals)
    echo "[$done_chunks/$nchunks chunks, $(( $(date +%s) - start_s )) s] valid $v, invalid $inv, failed $f | $line"
  done

read -r valid invalid failed < <(cat "$logs"/seeds_*.log | totals)
echo "fuzz_long: seeds [$first, $end): $valid valid, $invalid invalid, $failed failed in $(( $(date +%s) - start_s )) s"
if [ "$failed" -gt 0 ]; then
  echo "failing seeds:"
  grep -h '^FAIL seed' "$logs"/seeds_*.log | sort -t' ' -k3 -n
  exit 1
fi
