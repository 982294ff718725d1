#!/usr/bin/env bash
# Throughput of a windowed pipeline against the same pipeline without the window (issue 33,
# docs/benchmarks.md "Windowed against unwindowed"): both read MESSAGES messages from the null
# StreamingPull server (publish times 1 ms apart, so one-minute windows over the publish time
# close as the backlog is read) into the null Bigtable server, ROUNDS times, interleaved. Each
# run reads its own subscription; a run ends 3 s after its last message (stop_after_idle), which
# is subtracted. Prints one line per run and each side's median.
#
# usage: scripts/windows_throughput.sh [MESSAGES] [ROUNDS] [GCP_SQL_BINARY]
set -eu
N=${1:-200000}; ROUNDS=${2:-3}; BIN=${3:-target/debug/gcp-sql}
WORK=$(mktemp -d)
trap 'kill $SUB $BT 2>/dev/null; rm -rf "$WORK"' EXIT
"$BIN" serve-null --service pubsub-subscribe --messages "$N" --message-size 100 \
    --publish-time-step 1ms --port 18861 --report-interval 0s > "$WORK/sub.log" 2>&1 &
SUB=$!
"$BIN" serve-null --service bigtable --port 18862 --report-interval 0s > "$WORK/bt.log" 2>&1 &
BT=$!
sleep 1
run() { # side round
    local side=$1 round=$2 sub="projects/p/subscriptions/$1-$2"
    local query
    if [[ $side == windowed ]]; then
        query="SELECT k, n FROM (SELECT CAST(id % 10 AS VARCHAR) AS k, date_bin(INTERVAL '1 minute', pt) AS w, count(*) AS n FROM clicks GROUP BY CAST(id % 10 AS VARCHAR), date_bin(INTERVAL '1 minute', pt))"
    else
        query="SELECT CAST(id % 10 AS VARCHAR) AS k, CAST(1 AS BIGINT) AS n FROM clicks"
    fi
    cat > "$WORK/$side-$round.sql" <<SQL
CREATE TABLE clicks (id BIGINT, body VARCHAR, pt TIMESTAMP) WITH (connector = 'pubsub', subscription = '$sub', emulator_host = '127.0.0.1:18861', format = 'json', publish_time_column = 'pt', progress_path = '$WORK/progress', progress_start = 'new', stop_after_idle = '3s');
CREATE TABLE out (k VARCHAR, n BIGINT) WITH (connector = 'bigtable', table = 'projects/p/instances/i/tables/t', emulator_host = '127.0.0.1:18862', row_key = 'k');
INSERT INTO out $query;
SQL
    local start end
    start=$(date +%s.%N)
    HOME=$WORK "$BIN" -f "$WORK/$side-$round.sql" > "$WORK/$side-$round.log" 2>&1
    end=$(date +%s.%N)
    python3 -c "import sys; s=float(sys.argv[2])-float(sys.argv[1])-3; print(f'RUN side=$side round=$round seconds={s:.2f} messages_per_s={$N/s:.0f}')" "$start" "$end"
    grep -h '^Source:' "$WORK/$side-$round.log" | sed 's/^/    /' >&2
}
for r in $(seq 1 "$ROUNDS"); do
    run plain "$r"
    run windowed "$r"
done | tee "$WORK/runs.txt"
python3 - "$WORK/runs.txt" <<'PY'
import statistics, sys
rates = {}
for line in open(sys.argv[1]):
    f = dict(kv.split("=") for kv in line.split()[1:])
    rates.setdefault(f["side"], []).append(float(f["messages_per_s"]))
for side, r in rates.items():
    print(f"{side}: median {statistics.median(r):.0f} messages/s over {len(r)} runs ({min(r):.0f}-{max(r):.0f})")
if "plain" in rates and "windowed" in rates:
    print(f"windowed / plain: {statistics.median(rates['windowed']) / statistics.median(rates['plain']):.2f}")
PY
