-- gcp-sql streaming quickstart: an INSERT that runs for as long as its input is open, with a
-- flush point every second, and what arrived read back at the end.
--
-- Terminal 1 (the tool, on local emulators it starts and stops):
--   mkfifo /tmp/gcp-sql-clicks.csv
--   cargo run --release -- --emulators -f sql/streaming.sql
-- Terminal 2 (the input: one line every 0.2 s; the INSERT ends when this command ends):
--   for i in $(seq 1 50); do echo "$i,user-$((i % 5)),/page/$i"; sleep 0.2; done > /tmp/gcp-sql-clicks.csv
--
-- Messages are published while the lines arrive; stderr shows one line per flush point when it
-- is not a terminal, or the live bar with the last flush point. Ctrl-C (or SIGTERM) in terminal
-- 1 stops the INSERT gracefully instead: no more input is read, what was read is delivered, and
-- the statements after it are not run. A second Ctrl-C aborts. See docs/streaming.md.

-- 1. An unbounded CSV source emits a batch once it holds `batch_size` rows: for a trickle of
--    lines, set a small one before the table is declared.
SET datafusion.execution.batch_size = 1;

CREATE UNBOUNDED EXTERNAL TABLE clicks_in (id BIGINT, user_id VARCHAR, url VARCHAR)
STORED AS CSV
LOCATION '/tmp/gcp-sql-clicks.csv'
OPTIONS ('format.has_header' 'false');

-- 2. The sink, with a flush point every second (every row read until then is resolved, idle
--    topics are released, and the point is reported).
CREATE TABLE live_clicks (id BIGINT, user_id VARCHAR, url VARCHAR)
WITH (
  connector = 'pubsub',
  topic = 'projects/demo/topics/live-clicks',
  auto_create_topic = true,
  batch_delay_threshold = '10ms',
  flush_interval = '1s'
);

SELECT * FROM pubsub_subscribe('projects/demo/topics/live-clicks', 'projects/demo/subscriptions/live-clicks');

-- 3. Runs until the input ends (or a stop): the count is every line read.
INSERT INTO live_clicks SELECT id, user_id, url FROM clicks_in;

-- 4. What arrived.
SELECT data FROM pubsub_pull('projects/demo/subscriptions/live-clicks', 100);
