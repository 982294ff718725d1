-- gcp-sql quickstart: read a small CSV file of page clicks and write every row to the three
-- sinks (Pub/Sub messages, Bigtable cells, Cloud Tasks tasks), then read back what landed in each.
--
-- Against local emulators (started and stopped by the tool):
--   cargo run --release -- --emulators -f sql/quickstart.sql
-- Paths are relative to the directory the tool runs in (the repository root here).

-- 1. A source: any file DataFusion reads (CSV, Parquet, JSON, Avro; local, gs://, s3://, https://).
CREATE EXTERNAL TABLE clicks_csv
STORED AS CSV
LOCATION 'sql/data/clicks.csv'
OPTIONS ('format.has_header' 'true');

SELECT * FROM clicks_csv ORDER BY ts;

-- 2. A sink: a Pub/Sub topic. Each row becomes one message (the row as JSON by default).
CREATE TABLE clicks (user_id BIGINT, url VARCHAR, ts TIMESTAMP)
WITH (
  connector = 'pubsub',
  topic = 'projects/demo/topics/clicks',
  auto_create_topic = true
);

-- 3. Look at what lands: a subscription only receives messages published after it exists, so
--    subscribe first (pubsub_subscribe and pubsub_pull talk to the emulator only).
SELECT * FROM pubsub_subscribe('projects/demo/topics/clicks', 'projects/demo/subscriptions/quickstart');

-- 4. Write: the statement returns once every row is acknowledged by Pub/Sub, with the count.
INSERT INTO clicks SELECT user_id, url, ts FROM clicks_csv;

-- 5. What landed: one JSON message per row.
SELECT data FROM pubsub_pull('projects/demo/subscriptions/quickstart', 100);

-- 6. Messages with attributes and ordering keys: the url becomes an attribute, each user's clicks
--    share an ordering key (published in order, one batch per key at a time), the payload is
--    the rest of the row.
CREATE TABLE clicks_by_user (ordering_key VARCHAR, url VARCHAR, user_id BIGINT, ts TIMESTAMP)
WITH (
  connector = 'pubsub',
  topic = 'projects/demo/topics/clicks-by-user',
  auto_create_topic = true,
  attribute_columns = 'url',
  enable_message_ordering = true
);

SELECT * FROM pubsub_subscribe('projects/demo/topics/clicks-by-user', 'projects/demo/subscriptions/by-user');

INSERT INTO clicks_by_user
SELECT 'user-' || CAST(user_id AS VARCHAR), url, user_id, ts FROM clicks_csv ORDER BY ts;

SELECT ordering_key, attributes, data
FROM pubsub_pull('projects/demo/subscriptions/by-user', 100)
ORDER BY ordering_key;

-- 7. The same clicks as Bigtable rows: one row per user, the url as a cell of family 'c' with
--    one version per click (the click time is the cell version, so re-running this is
--    idempotent: the same versions are written again).
CREATE TABLE clicks_bt (user_id BIGINT, ts TIMESTAMP, url VARCHAR)
WITH (
  connector = 'bigtable',
  table = 'projects/demo/instances/quickstart/tables/clicks',
  row_key = 'user_id',
  column_family = 'c',
  timestamp_column = 'ts',
  auto_create_table = true
);

INSERT INTO clicks_bt SELECT user_id, ts, url FROM clicks_csv;

-- 8. What landed: one cell per click (5 rows of 4 versions each), read back from the emulator
--    (bigtable_read is emulator only; against Google Cloud use `cbt read`).
SELECT row_key, family, qualifier, value, timestamp
FROM bigtable_read('projects/demo/instances/quickstart/tables/clicks', 100)
ORDER BY row_key, timestamp;

-- 9. The same clicks as Cloud Tasks tasks: one HTTP POST per click, the row as its JSON body,
--    with per-row headers from a MAP(VARCHAR, VARCHAR) column (filled with map([keys], [values]);
--    make_map(k, v, ...) and MAP {k: v} work too). The Cloud Tasks sink never creates a queue,
--    and the emulator starts with none: create one (emulator only). It is paused, so the
--    emulator keeps every task listed instead of calling its URL at once.
SELECT * FROM cloud_tasks_create_queue('projects/demo/locations/local/queues/clicks');

CREATE TABLE click_tasks (user_id BIGINT, page VARCHAR, ts TIMESTAMP, request_headers MAP(VARCHAR, VARCHAR))
WITH (
  connector = 'cloud_tasks',
  queue = 'projects/demo/locations/local/queues/clicks',
  url = 'http://localhost:8080/clicks',
  headers_column = 'request_headers',
  max_tasks_per_second = 500
);

INSERT INTO click_tasks
SELECT user_id, url, ts, map(['X-User'], [CAST(user_id AS VARCHAR)]) FROM clicks_csv;

-- 10. What landed: one task per click, listed from the paused queue, with its X-User header.
SELECT http_method, url, headers, body
FROM cloud_tasks_list('projects/demo/locations/local/queues/clicks', 100)
ORDER BY body;
