-- gcp-sql pipeline: read a Pub/Sub subscription, reshape its rows in SQL, write them to Bigtable,
-- and acknowledge each message only once every row made from it is in Bigtable.
--
-- Against local emulators (started and stopped by the tool):
--   cargo run --release -- --emulators -f sql/pipeline.sql
-- Against Google Cloud, drop the publishing part (1-2) and point the subscription and the table
-- at real resources; without stop_after_idle the INSERT runs until Ctrl-C / SIGTERM, which stops
-- it gracefully (what was read is delivered and acknowledged).

-- 1. Something to read: the quickstart's clicks, published as JSON messages to a topic that has
--    a subscription (pubsub_subscribe talks to the emulator only).
CREATE EXTERNAL TABLE clicks_csv
STORED AS CSV
LOCATION 'sql/data/clicks.csv'
OPTIONS ('format.has_header' 'true');

CREATE TABLE clicks_topic (user_id BIGINT, url VARCHAR, ts TIMESTAMP)
WITH (
  connector = 'pubsub',
  topic = 'projects/demo/topics/pipeline-clicks',
  auto_create_topic = true
);

SELECT * FROM pubsub_subscribe('projects/demo/topics/pipeline-clicks', 'projects/demo/subscriptions/pipeline');

INSERT INTO clicks_topic SELECT user_id, url, ts FROM clicks_csv;

-- 2. The subscription as a table (a source): JSON payloads decoded into the declared columns,
--    the message's publish time in `published`. stop_after_idle ends the read once the
--    subscription has been empty for 3 s, so this script ends; a pipeline that runs for days
--    leaves it out.
CREATE TABLE clicks_in (user_id BIGINT, url VARCHAR, ts TIMESTAMP, published TIMESTAMP)
WITH (
  connector = 'pubsub',
  subscription = 'projects/demo/subscriptions/pipeline',
  format = 'json',
  publish_time_column = 'published',
  stop_after_idle = '3s'
);

-- 3. The sink: one Bigtable row per user, one cell version per click.
CREATE TABLE clicks_bt (user_key VARCHAR, page VARCHAR, ts TIMESTAMP)
WITH (
  connector = 'bigtable',
  table = 'projects/demo/instances/pipeline/tables/clicks',
  row_key = 'user_key',
  column_family = 'c',
  timestamp_column = 'ts',
  auto_create_table = true
);

-- 4. The pipeline: projections, casts, scalar functions and filters between a source and a sink
--    (an aggregate, a join or a sort is refused: their rows cannot be traced to messages). The
--    count is the rows Bigtable acknowledged; the summary names the messages read, acknowledged
--    and nacked.
INSERT INTO clicks_bt
SELECT 'user-' || CAST(user_id AS VARCHAR), upper(url), ts
FROM clicks_in
WHERE url <> '';

-- 5. What landed, read back from the emulator.
SELECT row_key, qualifier, value, timestamp
FROM bigtable_read('projects/demo/instances/pipeline/tables/clicks', 100)
ORDER BY row_key, timestamp;

-- 6. Nothing is left on the subscription: every message was acknowledged.
SELECT count(*) AS left_on_the_subscription
FROM pubsub_pull('projects/demo/subscriptions/pipeline', 100);
