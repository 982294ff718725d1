#!/usr/bin/env bash
# Peak memory of a windowed pipeline that holds every message of a subscription (issue 33,
# docs/benchmarks.md "Memory per held message"): the null StreamingPull server serves MESSAGES
# messages of 100 bytes, all with the server's start as publish time, so every row falls in one
# ten-minute window that never closes; the tool reads them all and holds them until
# stop_after_idle ends the run. Samples the tool's VmRSS / VmHWM once a second into rss-N.log
# in the current directory. Run it for 1000 (the baseline) and for 500000 messages.
#
# usage: scripts/windows_held_memory.sh MESSAGES PORTBASE [GCP_SQL_BINARY]
set -u
N=$1; P=$2; BIN=${3:-target/debug/gcp-sql}
DIR=$PWD
rm -rf prog-$N; mkdir -p prog-$N
$BIN serve-null --service pubsub-subscribe --messages $N --message-size 100 --port $P --report-interval 5s > sub-$N.log 2>&1 &
S1=$!
$BIN serve-null --service bigtable --port $((P+1)) --report-interval 0s > bt-$N.log 2>&1 &
S2=$!
sleep 1
cat > p-$N.sql <<SQL
CREATE TABLE clicks (id BIGINT, body VARCHAR, pt TIMESTAMP) WITH (connector = 'pubsub', subscription = 'projects/p/subscriptions/mem', emulator_host = '127.0.0.1:$P', format = 'json', publish_time_column = 'pt', progress_path = '$DIR/prog-$N', progress_start = 'new', stop_after_idle = '45s');
CREATE TABLE out (k VARCHAR, n BIGINT) WITH (connector = 'bigtable', table = 'projects/p/instances/i/tables/t', emulator_host = '127.0.0.1:$((P+1))', row_key = 'k');
INSERT INTO out SELECT k, n FROM (SELECT CAST(id % 10 AS VARCHAR) AS k, date_bin(INTERVAL '10 minutes', pt) AS w, count(*) AS n FROM clicks GROUP BY CAST(id % 10 AS VARCHAR), date_bin(INTERVAL '10 minutes', pt));
SQL
HOME=$DIR $BIN -q -f p-$N.sql > out-$N.log 2>&1 &
G=$!
peak=0
for i in $(seq 1 200); do
  sleep 1
  r=$(awk "/VmRSS/{r=\$2} /VmHWM/{h=\$2} END{print r\" hwm=\"h}" /proc/$G/status 2>/dev/null) || break
  [[ -z "$r" ]] && break
  echo "t=$i rss_kib=$r" >> rss-$N.log
done
awk '/VmHWM/{print "hwm_kib="$2}' /proc/$G/status 2>/dev/null >> rss-$N.log
wait $G
kill $S1 $S2
