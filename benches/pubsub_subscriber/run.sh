#!/usr/bin/env bash
# The side-by-side of docs/benchmarks.md, "Reading a subscription: the source against Google's
# Rust subscriber": the same backlog, from the same server, drained by
#
#   gcp-sql-ppN   the gcp-sql source (parallel_pull_count = N) in `INSERT INTO t SELECT data FROM
#                 src`, where t is a Pub/Sub sink pointed at `gcp-sql serve-null --service pubsub`
#   google-N      Google's Rust subscriber (google-cloud-pubsub), N streams on one client,
#                 acking every message
#
# for each N of --streams. The server is either
#
#   --server null      (default) `gcp-sql serve-null --service pubsub-subscribe`: every
#                      subscription name has its own in-memory backlog of --messages messages of
#                      200 bytes, streamed as fast as the reader's flow control allows, so the
#                      server is not the bottleneck and the readers' own ceilings show
#   --server emulator  the Pub/Sub emulator of the Google Cloud CLI (about 2,000 messages a
#                      second a stream, whoever reads): each round publishes --messages messages
#                      of ~200 bytes (JSON text) to a fresh topic with one subscription per reader
#
# Each round runs the readers one after the other (the order rotates from round to round), each
# under /usr/bin/time -v. Every reader stops after --idle-ms without a message; its time is its
# wall time less that idle wait (see the docs). One RUN line per reader and round (messages/s,
# client CPU per message, peak RSS, peak anonymous RSS, the server's CPU), then one MEDIAN line per
# reader. The peak RSS counts the pages of the program's own file the kernel mapped; the peak
# anonymous RSS (`RssAnon` of /proc/PID/status, sampled every 50 ms) is its heap, stacks and
# relocated data alone.
#
#   benches/pubsub_subscriber/run.sh [--server null|emulator] [--debug] [--no-build] [--messages N]
#                                    [--rounds R] [--idle-ms MS] [--streams "1 2 8"]
#
# Defaults: the null server, release build, 200,000 messages (40,000 with the emulator), 3 rounds,
# 2,000 ms idle (3,000 with the emulator), streams "1 2 8" ("1 2" with the emulator). --no-build
# uses the binaries already in ${CARGO_TARGET_DIR:-target}/{release,debug}.
#
# From a fresh checkout: it builds both programs (release unless --debug) into
# ${CARGO_TARGET_DIR:-target}, starts the server (the emulator: PUBSUB_EMULATOR_BIN, default the
# Google Cloud CLI's) and the null Publish server on free ports, and stops them at the end. Logs go
# to ${CARGO_TARGET_DIR:-target}/bench-subscriber/.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
profile=release
server=null
messages=""
rounds=3
idle_ms=""
skip_build=0
streams=""
while [ $# -gt 0 ]; do
    case "$1" in
        --server) server="$2"; shift ;;
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
case "$server" in
    null) : "${messages:=200000}" "${idle_ms:=2000}" "${streams:=1 2 8}" ;;
    emulator) : "${messages:=40000}" "${idle_ms:=3000}" "${streams:=1 2}" ;;
    *) echo "--server is null or emulator, not $server" >&2; exit 2 ;;
esac

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

# The server readers drain, and the PID whose CPU time is the server's.
if [ "$server" = emulator ]; then
    emu_port="$(free_port)"
    "$emulator_bin" --host=127.0.0.1 --port="$emu_port" >"$logs/emulator.log" 2>&1 &
    pids+=($!)
    emu="127.0.0.1:$emu_port"
    for _ in $(seq 1 120); do
        curl -sf "http://$emu/v1/projects/bench/topics" >/dev/null 2>&1 && break
        sleep 0.5
    done
    curl -sf "http://$emu/v1/projects/bench/topics" >/dev/null || { echo "the emulator did not start: $logs/emulator.log" >&2; exit 1; }
    server_pid="$(pgrep -f "port=$emu_port" | while read -r p; do [ "$(cat /proc/"$p"/comm)" = java ] && echo "$p"; done | head -1)"
else
    "$gcp_sql" serve-null --service pubsub-subscribe --port 0 --messages "$messages" \
        --message-size 200 --report-interval 0s >"$logs/serve-subscribe.log" 2>&1 &
    server_pid=$!
    pids+=($!)
    for _ in $(seq 1 50); do
        grep -q '^listening on' "$logs/serve-subscribe.log" 2>/dev/null && break
        sleep 0.1
    done
    emu="$(sed -n 's/^listening on \([0-9.:]*\) .*/\1/p' "$logs/serve-subscribe.log")"
    [ -n "$emu" ] || { echo "the subscription server did not start: $logs/serve-subscribe.log" >&2; exit 1; }
fi

# The peak of `RssAnon` (KiB) of the program /usr/bin/time (PID $1) runs, sampled every 50 ms
# until it exits. Pure shell reads, so the sampling costs the measured machine little.
anon_peak() {
    local parent=$1 child="" peak=0 key value _
    while kill -0 "$parent" 2>/dev/null; do
        [ -n "$child" ] || child="$(pgrep -P "$parent" | head -1 || true)"
        if [ -n "$child" ] && [ -r "/proc/$child/status" ]; then
            while read -r key value _; do
                if [ "$key" = RssAnon: ]; then
                    [ "$value" -gt "$peak" ] && peak=$value
                    break
                fi
            done <"/proc/$child/status" 2>/dev/null || true
        fi
        sleep 0.05
    done
    echo "$peak"
}

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
echo "# profile=$profile server=$server messages=$messages rounds=$rounds idle_ms=$idle_ms streams=\"$streams\" subscriptions=$emu null=$null server_pid=$server_pid load=\"$(cut -d' ' -f1-3 /proc/loadavg)\"" | tee -a "$results"

for round in $(seq 1 "$rounds"); do
  topic="projects/bench/topics/backlog-$round"
  if [ "$server" = emulator ]; then
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
  fi
    # Rotate the order of the readers from round to round.
    shift_by=$(( (round - 1) % ${#readers[@]} ))
    order=("${readers[@]:$shift_by}" "${readers[@]:0:$shift_by}")
    for reader in "${order[@]}"; do
        sub="projects/bench/subscriptions/drain-$reader-$round"
        log="$logs/$reader-$round.log"
        emu_cpu_before="$(cpu_of "$server_pid")"
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
                /usr/bin/time -v "$gcp_sql" -f "$logs/$reader.sql" >"$log" 2>&1 &
                anon_kb="$(anon_peak $!)"
                wait $!
                read_n="$(sed -n 's/^Source: \([0-9]*\) message(s) read, \([0-9]*\) acknowledged, \([0-9]*\) nacked.*/\1 \2 \3/p' "$log")"
                acked="$(echo "$read_n" | awk '{ print $2 }')"
                wall="$(grep 'row(s) fetched' "$log" | tail -1 | sed 's/.*Elapsed \([0-9.]*\) seconds.*/\1/')"
                ;;
            google-*)
                n_streams="${reader#google-}"
                /usr/bin/time -v "$google" --host "$emu" --subscription "$sub" --streams "$n_streams" \
                    --stop-after-idle "$idle_ms" >"$log" 2>&1 &
                anon_kb="$(anon_peak $!)"
                wait $!
                read_n="$(sed -n 's/^RESULT .* messages=\([0-9]*\) .*/\1 \1 0/p' "$log")"
                acked="$(echo "$read_n" | awk '{ print $2 }')"
                wall="$(sed -n 's/^RESULT .* wall_s=\([0-9.]*\) .*/\1/p' "$log")"
                ;;
        esac
        emu_cpu="$(awk -v a="$emu_cpu_before" -v b="$(cpu_of "$server_pid")" 'BEGIN { printf "%.2f", b - a }')"
        rss_kb="$(sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$log")"
        user="$(sed -n 's/.*User time (seconds): \([0-9.]*\).*/\1/p' "$log")"
        sys="$(sed -n 's/.*System time (seconds): \([0-9.]*\).*/\1/p' "$log")"
        awk -v reader="$reader" -v round="$round" -v rn="$read_n" -v acked="$acked" -v wall="$wall" \
            -v idle="$idle_s" -v rss="$rss_kb" -v anon="$anon_kb" -v user="$user" -v sys="$sys" -v emu_cpu="$emu_cpu" 'BEGIN {
            secs = wall - idle
            split(rn, n, " ")
            printf "RUN reader=%s round=%d read=%s acked=%s nacked=%s seconds=%.3f messages_per_s=%.0f peak_rss_mib=%.1f peak_anon_mib=%.1f client_cpu_s=%.2f cpu_us_per_message=%.2f server_cpu_s=%s\n",
                reader, round, n[1], n[2], n[3], secs, acked / secs, rss / 1024, anon / 1024, user + sys, (user + sys) * 1e6 / (acked > 0 ? acked : 1), emu_cpu
        }' | tee -a "$results"
        [ "$acked" = "$messages" ] || echo "WARNING: $reader acknowledged $acked of $messages messages (see $log)" | tee -a "$results"
        [ "$server" = emulator ] && { rest DELETE "$sub" || true; }
    done
    [ "$server" = emulator ] && { rest DELETE "$topic" || true; }
done

# The median of each reader's rates and of its peak RSS (the lower middle run for an even count).
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
for reader in "${readers[@]}"; do
    runs="$(grep -c "^RUN reader=$reader " "$results" || true)"
    [ "$runs" -gt 0 ] || continue
    rate="$(grep "^RUN reader=$reader " "$results" | sed 's/.*messages_per_s=\([0-9]*\).*/\1/' | median)"
    rss="$(grep "^RUN reader=$reader " "$results" | sed 's/.*peak_rss_mib=\([0-9.]*\).*/\1/' | median)"
    cpu="$(grep "^RUN reader=$reader " "$results" | sed 's/.*cpu_us_per_message=\([0-9.]*\).*/\1/' | median)"
    anon="$(grep "^RUN reader=$reader " "$results" | sed 's/.*peak_anon_mib=\([0-9.]*\).*/\1/' | median)"
    spread="$(grep "^RUN reader=$reader " "$results" | sed 's/.*messages_per_s=\([0-9]*\).*/\1/' | sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo "-" hi }')"
    echo "MEDIAN reader=$reader runs=$runs messages_per_s=$rate range=$spread cpu_us_per_message=$cpu peak_rss_mib=$rss peak_anon_mib=$anon" | tee -a "$results"
done
