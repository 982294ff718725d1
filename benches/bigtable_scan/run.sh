#!/usr/bin/env bash
# The scan benchmark of docs/benchmarks.md, "Reading Bigtable on the null ReadRows server": the
# same table, from the same server, read whole by
#
#   ceiling   examples/read_rows_ceiling in `bytes` mode: two ReadRows streams split at the
#             server's samples, each response taken as the bytes received and dropped
#   gcp-sql   `SELECT count(*), sum(visits), count(name) FROM big`: a scan of every column
#             (two partitions from SampleRowKeys), its time as the shell prints it ("Elapsed")
#   python    Google's Python client (google-cloud-bigtable), `table.read_rows()` with the
#             latest version of every cell, every row and cell counted
#             (scripts/bigtable_read_python.py), when --python names a Python that has it
#
# The server is either
#
#   --server null      (default) `gcp-sql serve-null --service bigtable-read --rows N`: every
#                      table holds the same N canned rows (key, cf:name, cf:visits), sent in
#                      responses of up to 1 MiB as fast as HTTP/2 lets the reader take them
#   --server emulator  the Bigtable emulator of the Google Cloud CLI (cbtemulator), into which
#                      the gcp-sql sink first writes the same N rows (same keys and cells)
#
# Each round runs the three readers one after the other (the order rotates from round to round);
# one RUN line per reader and round (rows/s), then one MEDIAN line per reader. gcp-sql's answer
# is checked against the rows written (count and sum), so a fast wrong scan fails the run.
#
#   benches/bigtable_scan/run.sh [--server null|emulator] [--rows N] [--rounds R] [--no-build]
#                                [--python PATH] [--partitions P]
#
# --partitions P runs gcp-sql's scan with `datafusion.execution.target_partitions = P` (up to P
# streams) and the ceiling reader with P streams; without it both use 2, the scan's default on
# this two-core machine.
#
# Defaults: the null server, 1,000,000 rows, 3 rounds, release builds in
# ${CARGO_TARGET_DIR:-target}/release (--no-build uses the ones already there). Logs go to
# ${CARGO_TARGET_DIR:-target}/bench-scan/.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
server=null
rows=1000000
rounds=3
skip_build=0
python=""
partitions=""
while [ $# -gt 0 ]; do
    case "$1" in
        --server) server="$2"; shift ;;
        --rows) rows="$2"; shift ;;
        --rounds) rounds="$2"; shift ;;
        --no-build) skip_build=1 ;;
        --python) python="$2"; shift ;;
        --partitions) partitions="$2"; shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
case "$server" in null|emulator) ;; *) echo "--server is null or emulator" >&2; exit 2 ;; esac

target="${CARGO_TARGET_DIR:-$root/target}"
bin="$target/release"
logs="$target/bench-scan"
mkdir -p "$logs"
if [ "$skip_build" = 0 ]; then
    (cd "$root" && cargo build --release --bin gcp-sql --example read_rows_ceiling)
fi
gcp_sql="$bin/gcp-sql"
ceiling="$bin/examples/read_rows_ceiling"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port="$(free_port)"
host="127.0.0.1:$port"
instance="projects/bench/instances/scan"
table="$instance/tables/big"

if [ "$server" = null ]; then
    "$gcp_sql" serve-null --service bigtable-read --rows "$rows" --port "$port" \
        --report-interval 0s >"$logs/server.log" 2>&1 &
    pids+=($!)
else
    emulator="${GCP_SQL_BIGTABLE_EMULATOR_BIN:-/usr/lib/google-cloud-sdk/platform/bigtable-emulator/cbtemulator}"
    "$emulator" -host 127.0.0.1 -port "$port" >"$logs/server.log" 2>&1 &
    pids+=($!)
fi
for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
done

declare_sql="CREATE TABLE big (k VARCHAR NOT NULL, visits BIGINT, name VARCHAR) WITH (
  connector = 'bigtable', emulator_host = '$host', instance = '$instance', table = 'big',
  row_key = 'k', column_family = 'cf', auto_create_table = 'true');"
if [ "$server" = emulator ]; then
    echo "writing $rows rows into the emulator with the sink"
    "$gcp_sql" -c "$declare_sql INSERT INTO big SELECT 'user-' || lpad(CAST(v AS VARCHAR), 7, '0'),
      v * 10, 'name-' || CAST(v AS VARCHAR) FROM generate_series(0, $rows - 1) AS t(v)" \
        >"$logs/write.log" 2>&1
    tail -n 2 "$logs/write.log"
fi
expected_sum=$(( 10 * rows * (rows - 1) / 2 ))
set_partitions=""
[ -n "$partitions" ] && set_partitions="SET datafusion.execution.target_partitions = $partitions; "

run_ceiling() {
    "$ceiling" "$host" "$table" "${partitions:-2}" bytes | tee -a "$logs/ceiling.log" \
        | awk -v n="$rows" '{ for (i = 1; i <= NF; i++) if ($i ~ /^seconds=/) { split($i, s, "="); printf "%.0f\n", n / s[2] } }'
}
run_gcp_sql() {
    local out
    out="$("$gcp_sql" -c "$set_partitions$declare_sql SELECT count(*) AS n, sum(visits) AS s, count(name) AS names FROM big" 2>&1)"
    echo "$out" >>"$logs/gcp-sql.log"
    if ! echo "$out" | grep -q "| $rows *| $expected_sum *| $rows *|"; then
        echo "gcp-sql did not read $rows rows with sum $expected_sum:" >&2
        echo "$out" >&2
        exit 1
    fi
    echo "$out" | awk -v n="$rows" '/row\(s\) fetched/ { t = $(NF - 1) } END { printf "%.0f\n", n / t }'
}
run_python() {
    BIGTABLE_EMULATOR_HOST="$host" "$python" "$root/scripts/bigtable_read_python.py" "$table" \
        2>>"$logs/python.err" | tee -a "$logs/python.log" \
        | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^rows_per_s=/) { split($i, s, "="); print s[2] } }'
}

readers=(ceiling gcp_sql)
[ -n "$python" ] && readers+=(python)
declare -A results
echo "server=$server rows=$rows rounds=$rounds partitions=${partitions:-default} load: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
    n=${#readers[@]}
    for i in $(seq 0 $((n - 1))); do
        reader="${readers[$(((i + round - 1) % n))]}"
        rate="$("run_$reader")"
        echo "RUN round=$round reader=$reader rows_per_s=$rate"
        results[$reader]="${results[$reader]:-} $rate"
    done
done
for reader in "${readers[@]}"; do
    # shellcheck disable=SC2086
    echo "MEDIAN reader=$reader rows_per_s=$(printf '%s\n' ${results[$reader]} | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }') runs:${results[$reader]}"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
