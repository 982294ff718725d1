#!/usr/bin/env bash
# Soak run of a subscription pipeline through the gcp-sql binary (docs/benchmarks.md, "Soak: a
# subscription pipeline"): does the source's memory stay flat over many millions of messages?
#
# The null StreamingPull server (`serve-null --service pubsub-subscribe`) holds a backlog of
# MESSAGES; gcp-sql reads it and writes every row to a null server for DURATION_S seconds, then
# gets SIGTERM (a graceful stop: everything read is delivered and acknowledged). Every
# INTERVAL_S the script prints the tool's anonymous and whole resident memory and how many
# messages the subscription had acknowledged (the publish side's running total for `plain`).
#
#   plain     INSERT INTO a Pub/Sub sink (null Publish server) SELECT data FROM the subscription
#   windowed  one-minute tumbling counts over the publish time (1 ms apart) per key id % 10,
#             into a null Bigtable server; its progress marker is a local file
#
# usage: scripts/source_soak.sh [plain|windowed] [DURATION_S] [GCP_SQL_BINARY] [MESSAGES] [INTERVAL_S]
#   defaults: plain 600 target/release/gcp-sql 100000000 30
set -euo pipefail
MODE=${1:-plain}; DURATION=${2:-600}; BIN=${3:-target/release/gcp-sql}
MESSAGES=${4:-100000000}; INTERVAL=${5:-30}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

start_null() { # name service [flags...]: prints the address once it listens
    local name=$1; shift
    "$BIN" serve-null --port 0 "$@" >"$WORK/$name.out" 2>&1 &
    for _ in $(seq 100); do
        local addr
        addr=$(sed -n 's/^listening on \([0-9.:]*\) .*/\1/p' "$WORK/$name.out")
        [[ -n "$addr" ]] && { echo "$addr"; return; }
        sleep 0.1
    done
    echo "the null $name server did not start" >&2; cat "$WORK/$name.out" >&2; exit 1
}

SUB=$(start_null subscribe --service pubsub-subscribe --messages "$MESSAGES" --message-size 100 \
    --publish-time-step 1ms --report-interval 0s)
SUBSCRIPTION=projects/soak/subscriptions/$MODE
case $MODE in
plain)
    OUT=$(start_null publish --service pubsub --report-interval 0s)
    SQL="CREATE TABLE src (data BYTEA) WITH (connector = 'pubsub', subscription = '$SUBSCRIPTION', emulator_host = '$SUB', format = 'raw');
CREATE TABLE out (data BYTEA) WITH (connector = 'pubsub', topic = 'projects/soak/topics/out', emulator_host = '$OUT', format = 'raw');
INSERT INTO out SELECT data FROM src;"
    ;;
windowed)
    OUT=$(start_null bigtable --service bigtable --report-interval 0s)
    SQL="CREATE TABLE src (id BIGINT, body VARCHAR, pt TIMESTAMP) WITH (connector = 'pubsub', subscription = '$SUBSCRIPTION', emulator_host = '$SUB', format = 'json', publish_time_column = 'pt', progress_path = '$WORK/progress', progress_start = 'new');
CREATE TABLE out (k VARCHAR, n BIGINT) WITH (connector = 'bigtable', table = 'projects/soak/instances/i/tables/t', emulator_host = '$OUT', row_key = 'k');
INSERT INTO out SELECT CAST(id % 10 AS VARCHAR) AS k, count(*) AS n FROM src GROUP BY CAST(id % 10 AS VARCHAR), date_bin(INTERVAL '1 minute', pt);"
    ;;
*) echo "usage: $0 [plain|windowed] [DURATION_S] [GCP_SQL_BINARY] [MESSAGES] [INTERVAL_S]" >&2; exit 2 ;;
esac
echo "$SQL" >"$WORK/pipeline.sql"
# The tool's metrics endpoint gives the source's acknowledgements as it goes.
METRICS=127.0.0.1:$((20000 + RANDOM % 20000))
HOME=$WORK "$BIN" --metrics-addr "$METRICS" -f "$WORK/pipeline.sql" >"$WORK/tool.out" 2>"$WORK/tool.err" &
TOOL=$!

metric() { # the sum of a metric's series on the tool's endpoint
    curl -s "http://$METRICS/metrics" 2>/dev/null | awk -v m="$1" '$1 ~ "^" m "([{]|$)" {s += $NF} END {printf "%d", s}'
}
mem() { awk '/^RssAnon|^VmRSS/ {printf "%s %.1f MiB  ", $1, $2 / 1024}' "/proc/$TOOL/status"; }
echo "mode=$MODE messages=$MESSAGES duration=${DURATION}s binary=$BIN"
start=$SECONDS
while ((SECONDS - start < DURATION)) && kill -0 "$TOOL" 2>/dev/null; do
    sleep "$INTERVAL"
    kill -0 "$TOOL" 2>/dev/null || break
    printf 't=%4ds  %s acknowledged=%s held=%s\n' "$((SECONDS - start))" "$(mem)" \
        "$(metric gcp_sql_source_messages_acknowledged_total)" "$(metric gcp_sql_source_held_messages)"
done
awk '/^VmHWM/ {printf "peak: %s %.1f MiB\n", $1, $2 / 1024}' "/proc/$TOOL/status" 2>/dev/null || true
kill -TERM "$TOOL" 2>/dev/null || true
wait "$TOOL" || echo "gcp-sql exit code: $?"
grep -E '^Source:|^Sink:|Stopped on request|^Error' "$WORK/tool.err" || tail -20 "$WORK/tool.err"
