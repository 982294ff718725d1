-- gcp-sql windows: count each user's clicks per minute of event time, from a Pub/Sub
-- subscription into Bigtable, exact after any kill without a state store (docs/pubsub.md,
-- "Windows"; ADR 0068).
--
-- Against local emulators (started and stopped by the tool):
--   rm -rf target/windows-demo-progress && cargo run --release -- --emulators -f sql/windows.sql
-- The progress marker lives in target/windows-demo-progress: a real pipeline keeps it for its
-- whole life. This demo publishes its input again on fresh emulators each time, so delete the
-- folder before running it again (else every window is already covered by the marker).

-- 1. Something to read: the quickstart's clicks as JSON messages, and one more click an hour
--    later, which moves the watermark past every minute of the first twelve.
CREATE EXTERNAL TABLE clicks_csv
STORED AS CSV
LOCATION 'sql/data/clicks.csv'
OPTIONS ('format.has_header' 'true');

CREATE TABLE clicks_topic (user_id BIGINT, url VARCHAR, ts TIMESTAMP)
WITH (
  connector = 'pubsub',
  topic = 'projects/demo/topics/windows-clicks',
  auto_create_topic = true
);

SELECT * FROM pubsub_subscribe('projects/demo/topics/windows-clicks', 'projects/demo/subscriptions/windows');

INSERT INTO clicks_topic SELECT user_id, url, ts FROM clicks_csv;
INSERT INTO clicks_topic VALUES (0, '/later', TIMESTAMP '2024-05-01T10:00:00');

-- 2. The subscription as a source with an event time: the `ts` of each click (without
--    event_time_field, the publish time is used). A window is emitted once the watermark (the
--    greatest event time read, across streams) passes its end plus allowed_lateness; a click
--    for a window already emitted is late and follows failure_policy.
CREATE TABLE clicks_in (user_id BIGINT, url VARCHAR, ts TIMESTAMP)
WITH (
  connector = 'pubsub',
  subscription = 'projects/demo/subscriptions/windows',
  format = 'json',
  event_time_field = 'ts',
  allowed_lateness = '30s',
  idle_timeout = '1s',
  progress_path = 'target/windows-demo-progress',
  progress_start = 'new',
  failure_policy = 'drop',
  stop_after_idle = '3s'
);

-- 3. The sink: one Bigtable row per user and minute; the cell version is the window's end, so
--    a window written again after a kill overwrites itself.
CREATE TABLE clicks_per_minute (row_key VARCHAR, views BIGINT, window_end TIMESTAMP)
WITH (
  connector = 'bigtable',
  table = 'projects/demo/instances/windows/tables/clicks_per_minute',
  row_key = 'row_key',
  column_family = 'c',
  timestamp_column = 'window_end',
  auto_create_table = true
);

-- 4. The pipeline. `tumble(INTERVAL '1 minute')` (Arroyo's) gives the window as a struct of its
--    start and end; DataFusion's date_bin(INTERVAL '1 minute', ts) works too. A message is
--    acknowledged once its window's rows are in Bigtable and the progress marker says so.
INSERT INTO clicks_per_minute
SELECT 'user-' || CAST(user_id AS VARCHAR) || '#' || to_char(w['start'], '%H:%M'), views, w['end']
FROM (
  SELECT user_id, tumble(INTERVAL '1 minute') AS w, count(*) AS views
  FROM clicks_in
  GROUP BY user_id, tumble(INTERVAL '1 minute')
);

-- 5. What landed, read back from the emulator.
SELECT row_key, value, timestamp
FROM bigtable_read('projects/demo/instances/windows/tables/clicks_per_minute', 100)
ORDER BY row_key;
