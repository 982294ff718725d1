#!/usr/bin/env bash
# Runs the Pub/Sub sink benchmarks of docs/benchmarks.md and keeps their output.
#
#   scripts/bench.sh            # W1 and W1-K against the null server, with the ceiling, and
#                               # W1's CPU split into stages
#   scripts/bench.sh all        # also the emulator runs and the two memory runs (long)
#
# Output goes to stdout and to target/bench/<date>.log. Only loopback addresses are used.
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-quick}"
out_dir="target/bench"
mkdir -p "$out_dir"
log="$out_dir/$(date -u +%Y%m%dT%H%M%SZ).log"

cargo build --release --example bench_pubsub
bin="target/release/examples/bench_pubsub"

{
  echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(free -g | awk '/Mem:/ {print $2 " GiB"}')"
  "$bin" --workload w1 --target null-and-ceiling
  "$bin" --workload w1 --target stages
  "$bin" --workload w1k --target null
  if [[ "$mode" == "all" ]]; then
    "$bin" --workload w1 --target emulator
    "$bin" --workload w1k --target emulator
    "$bin" --workload mem-1k --target null
    "$bin" --workload mem-10x --target null
  fi
} 2>&1 | tee "$log"
echo "log: $log"
