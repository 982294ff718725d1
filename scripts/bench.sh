#!/usr/bin/env bash
# Runs the sink benchmarks of docs/benchmarks.md and keeps their output.
#
#   scripts/bench.sh            # W1, W1-K, W2 (Bigtable) and W3 (Cloud Tasks) against their null
#                               # servers, with their ceilings, and W1's CPU split into stages
#   scripts/bench.sh all        # also the emulator runs and the two memory runs (long)
#   scripts/bench.sh mem        # the memory bound: 200 B, 2 KB and 1 MB messages at 16 and
#                               # 64 MiB of max_in_flight_bytes (docs/benchmarks.md#the-memory-bound)
#
#   BENCH_PROFILE=dev scripts/bench.sh mem   # the same with the dev build (no release build
#                                            # needed; RSS follows the held bytes, CPU does not)
#
# Output goes to stdout and to target/bench/<date>.log. Only loopback addresses are used.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-quick}"
out_dir="target/bench"
mkdir -p "$out_dir"
log="$out_dir/$(date -u +%Y%m%dT%H%M%SZ).log"

if [[ "${BENCH_PROFILE:-release}" == "dev" ]]; then
  cargo build --example bench
  bin="target/debug/examples/bench"
else
  cargo build --release --example bench
  bin="target/release/examples/bench"
fi

# The memory bound: messages above the default 1,000-byte request threshold go one per call.
mem_matrix() {
  local c="--workload mem-1k --batch-bytes 1000"
  "$bin" --workload w1 --target null --rows 100000 --max-in-flight-messages 1000   # the floor
  "$bin" $c --row-bytes 200 --rows 300000
  "$bin" $c --row-bytes 200 --rows 100000 --max-in-flight-bytes 16777216
  "$bin" $c --row-bytes 2000 --rows 200000
  "$bin" $c --row-bytes 2000 --rows 20000 --max-in-flight-bytes 16777216
  "$bin" $c --row-bytes 1000000 --rows 400 --sql-batch-rows 8 --latency 2s
  "$bin" $c --row-bytes 1000000 --rows 200 --sql-batch-rows 8 --latency 2s --max-in-flight-bytes 16777216
}

{
  echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(free -g | awk '/Mem:/ {print $2 " GiB"}'), profile ${BENCH_PROFILE:-release}"
  if [[ "$mode" == "mem" ]]; then
    mem_matrix
    exit 0
  fi
  "$bin" --workload w1 --target null-and-ceiling
  "$bin" --workload w1 --target stages
  "$bin" --workload w1k --target null
  "$bin" --workload w2 --target null-and-ceiling
  "$bin" --workload w3 --target null-and-ceiling
  if [[ "$mode" == "all" ]]; then
    "$bin" --workload w1 --target emulator
    "$bin" --workload w1k --target emulator
    "$bin" --workload mem-1k --target null
    "$bin" --workload mem-10x --target null
  fi
} 2>&1 | tee "$log"
echo "log: $log"
