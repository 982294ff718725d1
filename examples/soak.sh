#!/usr/bin/env bash
# Soak run of a streaming INSERT through the gcp-sql binary (docs/benchmarks.md, "Soak"):
# a generator writes CSV lines at a steady rate into a FIFO for DURATION seconds; gcp-sql reads
# it as an UNBOUNDED external table and publishes to the null Pub/Sub server with a flush point
# every second; at the end the tool gets SIGTERM (a graceful stop) and the script prints rows
# written, rows acknowledged (the tool's summary), messages received (the null server's total)
# and the tool's peak RSS at minute 1 and at the end.
#
# Usage: examples/soak.sh [GCP_SQL_BINARY] [DURATION_S] [ROWS_PER_S]
#   defaults: target/release/gcp-sql, 600 s, 2000 rows/s
set -euo pipefail

BIN=${1:-target/release/gcp-sql}
DURATION=${2:-600}
RATE=${3:-2000}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

mkfifo "$WORK/lines.csv"
"$BIN" serve-null --port 0 --report-interval 0s >"$WORK/null.out" 2>&1 &
NULL_PID=$!
for _ in $(seq 100); do
    PORT=$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/null.out")
    [[ -n "$PORT" ]] && break
    sleep 0.1
done
[[ -n "$PORT" ]] || { echo "the null server did not start"; cat "$WORK/null.out"; exit 1; }

"$BIN" \
    -c "SET datafusion.execution.batch_size = ${BATCH_SIZE:-1}" \
    -c "CREATE UNBOUNDED EXTERNAL TABLE lines (id BIGINT, user_id VARCHAR, event VARCHAR) STORED AS CSV LOCATION '$WORK/lines.csv' OPTIONS ('format.has_header' 'false')" \
    -c "CREATE TABLE events (id BIGINT, user_id VARCHAR, event VARCHAR) WITH (connector = 'pubsub', emulator_host = '127.0.0.1:$PORT', topic = 'projects/soak/topics/events', flush_interval = '1s')" \
    -c "INSERT INTO events SELECT id, user_id, event FROM lines" \
    >"$WORK/tool.out" 2>"$WORK/tool.err" &
TOOL_PID=$!

# The generator: RATE lines per second, in ten bursts a second, for DURATION seconds.
python3 - "$WORK/lines.csv" "$DURATION" "$RATE" >"$WORK/written" <<'PY' &
import sys, time
path, duration, rate = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
per_tick = max(1, rate // 10)
n = 0
start = time.monotonic()
with open(path, "w", buffering=1 << 16) as fifo:
    tick = 0
    while time.monotonic() - start < duration:
        for _ in range(per_tick):
            n += 1
            fifo.write(f"{n},user-{n % 1000},page_view\n")
        fifo.flush()
        tick += 1
        delay = start + tick / 10 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    # The FIFO is kept open: the tool is stopped by SIGTERM, not by the end of its input.
    print(n, flush=True)
    time.sleep(3600)
PY
GEN_PID=$!

rss() { awk '/^VmHWM|^VmRSS/ {printf "%s %d MiB  ", $1, $2 / 1024}' "/proc/$TOOL_PID/status"; }
sleep 60
echo "minute 1:  $(rss)"
while [[ ! -s "$WORK/written" ]]; do sleep 1; done
sleep 3
echo "at the end: $(rss)"
kill -TERM "$TOOL_PID"
wait "$TOOL_PID" || echo "gcp-sql exit code: $?"
kill "$GEN_PID" 2>/dev/null || true
kill -INT "$NULL_PID"
wait "$NULL_PID" || true

echo "rows written:      $(cat "$WORK/written")"
grep -E '^Sink:|Stopped on request|^Error' "$WORK/tool.err" || true
echo "flush points:      $(grep -c 'flush point' "$WORK/tool.err")"
grep '^total:' "$WORK/null.out"
