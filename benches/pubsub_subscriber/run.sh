#!/usr/bin/env bash
# The side-by-side of docs/benchmarks.md, "Reading a subscription: the source against Google's
# Rust subscriber": the same backlog, on the same Pub/Sub emulator, drained by
#
#   gcp-sql-pp1   the gcp-sql source (parallel_pull_count = 1) in `INSERT INTO t SELECT data FROM
#                 src`, where t is a Pub/Sub sink pointed at `gcp-sql serve-null --service pubsub`
#   gcp-sql-pp2   the same with parallel_pull_count = 2
#   google-1      Google's Rust subscriber (google-cloud-pubsub), one stream, acking every message
#   google-2      the same with two streams on one client
#
# Each round publishes --messages messages of ~200 bytes (JSON text) to a fresh topic that already
# has one subscription per reader, then runs the four readers one after the other (the order
# rotates from round to round), each under /usr/bin/time -v. Every reader stops after
# --idle-ms without a message; its time is its wall time less that idle wait (see the
# docs). One RUN line per reader and round, then one MEDIAN line per reader.
#
#   benches/pubsub_subscriber/run.sh [--debug] [--no-build] [--messages N] [--rounds R] [--idle-ms MS]
#                                    [--streams "1 2"]
#
# Defaults: release build, 40,000 messages, 3 rounds, 3,000 ms idle (the emulator delivers about
# 2,000 messages a second a stream, so a one-stream reader takes ~20 s a round). --no-build uses
# the binaries already in ${CARGO_TARGET_DIR:-target}/{release,debug}. --streams lists the stream
# counts to compare: each N gives a gcp-sql-ppN and a google-N reader (default "1 2").
#
# From a fresh checkout: it builds both programs (release unless --debug) into
# ${CARGO_TARGET_DIR:-target}, starts the emulator (PUBSUB_EMULATOR_BIN, default the Google
# Cloud CLI's) and the null server on free ports, and stops both at the end. Logs go to
# ${CARGO_TARGET_DIR:-target}/bench-subscriber/.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
profile=release
messages=40000
rounds=3
idle_ms=3000
skip_build=0
streams="1 2"
while [ $# -gt 0 ]; do
    case "$1" in
        --debug) profile=debug ;;
        --messages) messages="$2"; shift ;;
        --rounds) rounds="$2"; shift ;;
        --idle-ms) idle_ms="$2"; shift ;;
        --no-build) skip_build=1 ;;
        --streams) streams="$2"; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done

target="${CARGO_TARGET_DIR:-$root/target}"
export CARGO_TARGET_DIR="$target"
build_flag=()
[ "$profile" = release ] && build_flag=(--release)
if [ "$skip_build" = 0 ]; then
    cargo build "${build_flag[@]}" --manifest-path "$root/Cargo.toml" --bin gcp-sql
    cargo build "${build_flag[@]}" --manifest-path "$root/benches/pubsub_subscriber/Cargo.toml"
fi
gcp_sql="$target/$profile/gcp-sql"
google="$target/$profile/gcp-sql-google-subscriber"
emulator_bin="${PUBSUB_EMULATOR_BIN:-/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator}"
logs="$target/bench-subscriber"
mkdir -p "$logs"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# The emulator, and the PID of its JVM (for its CPU time).
emu_port="$(free_port)"
"$emulator_bin" --host=127.0.0.1 --port="$emu_port" >"$logs/emulator.log" 2>&1 &
pids+=($!)
emu="127.0.0.1:$emu_port"
for _ in $(seq 1 120); do
    curl -sf "http://$emu/v1/projects/bench/topics" >/dev/null 2>&1 && break
    sleep 0.5
done
curl -sf "http://$emu/v1/projects/bench/topics" >/dev/null || { echo "the emulator did not start: $logs/emulator.log" >&2; exit 1; }
jvm_pid="$(pgrep -f "port=$emu_port" | while read -r p; do [ "$(cat /proc/"$p"/comm)" = java ] && echo "$p"; done | head -1)"

# CPU seconds (user + system) of a process so far.
cpu_of() {
    awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$1/stat"
}

# The null Pub/Sub server the pipeline's sink writes to.
"$gcp_sql" serve-null --service pubsub --port 0 >"$logs/serve-null.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do
    grep -q '^listening on' "$logs/serve-null.log" 2>/dev/null && break
    sleep 0.1
done
null="$(sed -n 's/^listening on \([0-9.:]*\) .*/\1/p' "$logs/serve-null.log")"
[ -n "$null" ] || { echo "the null server did not start: $logs/serve-null.log" >&2; exit 1; }

rest() { # METHOD PATH [JSON]
    curl -sf -X "$1" -H 'content-type: application/json' ${3:+-d "$3"} "http://$emu/v1/$2" >/dev/null
}

readers=()
for n in $streams; do
    readers+=("gcp-sql-pp$n" "google-$n")
done
idle_s="$(awk -v ms="$idle_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
results="$logs/results.txt"
: >"$results"
echo "# profile=$profile messages=$messages rounds=$rounds idle_ms=$idle_ms emulator=$emu null=$null jvm=$jvm_pid" | tee -a "$results"

for round in $(seq 1 "$rounds"); do
    topic="projects/bench/topics/backlog-$round"
    rest PUT "${topic}" "{}"
    for reader in "${readers[@]}"; do
        rest PUT "projects/bench/subscriptions/drain-$reader-$round" "{\"topic\":\"$topic\",\"ackDeadlineSeconds\":60}"
    done
    # The backlog: ~200-byte JSON messages from generate_series, published by gcp-sql's sink.
    cat >"$logs/publish.sql" <<SQL
CREATE TABLE backlog (data VARCHAR) WITH (
  connector = 'pubsub', topic = '$topic', emulator_host = '$emu', format = 'raw',
  batch_element_count_threshold = 1000, max_in_flight_messages = 10000);
INSERT INTO backlog
SELECT '{"id":' || CAST(value AS VARCHAR) || ',"user_id":"user-' || CAST(value % 100000 AS VARCHAR)
       || '","event":"page_view","url":"https://example.com/catalog/item/' || CAST(value AS VARCHAR)
       || '?ref=bench","pad":"' || repeat('x', 80) || '"}'
FROM generate_series(1, $messages);
SQL
    "$gcp_sql" -f "$logs/publish.sql" >"$logs/publish-$round.log" 2>&1
    # Rotate the order of the readers from round to round.
    shift_by=$(( (round - 1) % ${#readers[@]} ))
    order=("${readers[@]:$shift_by}" "${readers[@]:0:$shift_by}")
    for reader in "${order[@]}"; do
        sub="projects/bench/subscriptions/drain-$reader-$round"
        log="$logs/$reader-$round.log"
        emu_cpu_before="$(cpu_of "$jvm_pid")"
        case "$reader" in
            gcp-sql-pp*)
                pp="${reader#gcp-sql-pp}"
                cat >"$logs/$reader.sql" <<SQL
CREATE TABLE src (data BYTEA) WITH (
  connector = 'pubsub', subscription = '$sub', emulator_host = '$emu', format = 'raw',
  parallel_pull_count = $pp, stop_after_idle = '${idle_ms}ms');
CREATE TABLE t (data BYTEA) WITH (
  connector = 'pubsub', topic = 'projects/bench/topics/null', emulator_host = '$null',
  format = 'raw');
INSERT INTO t SELECT data FROM src;
SQL
                /usr/bin/time -v "$gcp_sql" -f "$logs/$reader.sql" >"$log" 2>&1
                read_n="$(sed -n 's/^Source: \([0-9]*\) message(s) read, \([0-9]*\) acknowledged, \([0-9]*\) nacked.*/\1 \2 \3/p' "$log")"
                acked="$(echo "$read_n" | awk '{ print $2 }')"
                wall="$(grep 'row(s) fetched' "$log" | tail -1 | sed 's/.*Elapsed \([0-9.]*\) seconds.*/\1/')"
                ;;
            google-*)
                streams="${reader#google-}"
                /usr/bin/time -v "$google" --host "$emu" --subscription "$sub" --streams "$streams" \
                    --stop-after-idle "$idle_ms" >"$log" 2>&1
                read_n="$(sed -n 's/^RESULT .* messages=\([0-9]*\) .*/\1 \1 0/p' "$log")"
                acked="$(echo "$read_n" | awk '{ print $2 }')"
                wall="$(sed -n 's/^RESULT .* wall_s=\([0-9.]*\) .*/\1/p' "$log")"
                ;;
        esac
        emu_cpu="$(awk -v a="$emu_cpu_before" -v b="$(cpu_of "$jvm_pid")" 'BEGIN { printf "%.2f", b - a }')"
        rss_kb="$(sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$log")"
        user="$(sed -n 's/.*User time (seconds): \([0-9.]*\).*/\1/p' "$log")"
        sys="$(sed -n 's/.*System time (seconds): \([0-9.]*\).*/\1/p' "$log")"
        awk -v reader="$reader" -v round="$round" -v rn="$read_n" -v acked="$acked" -v wall="$wall" \
            -v idle="$idle_s" -v rss="$rss_kb" -v user="$user" -v sys="$sys" -v emu_cpu="$emu_cpu" 'BEGIN {
            secs = wall - idle
            split(rn, n, " ")
            printf "RUN reader=%s round=%d read=%s acked=%s nacked=%s seconds=%.3f messages_per_s=%.0f peak_rss_mib=%.1f client_cpu_s=%.2f emulator_cpu_s=%s\n",
                reader, round, n[1], n[2], n[3], secs, acked / secs, rss / 1024, user + sys, emu_cpu
        }' | tee -a "$results"
        [ "$acked" = "$messages" ] || echo "WARNING: $reader acknowledged $acked of $messages messages (see $log)" | tee -a "$results"
        rest DELETE "$sub" || true
    done
    rest DELETE "$topic" || true
done

# The median of each reader's rates and of its peak RSS (the lower middle run for an even count).
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
for reader in "${readers[@]}"; do
    runs="$(grep -c "^RUN reader=$reader " "$results" || true)"
    [ "$runs" -gt 0 ] || continue
    rate="$(grep "^RUN reader=$reader " "$results" | sed 's/.*messages_per_s=\([0-9]*\).*/\1/' | median)"
    rss="$(grep "^RUN reader=$reader " "$results" | sed 's/.*peak_rss_mib=\([0-9.]*\).*/\1/' | median)"
    echo "MEDIAN reader=$reader runs=$runs messages_per_s=$rate peak_rss_mib=$rss" | tee -a "$results"
done
