-- gcp-sql quickstart: read a small CSV file of page clicks and publish every row to Pub/Sub.
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

-- 3. Write: the statement returns once every row is acknowledged by Pub/Sub.
INSERT INTO clicks SELECT user_id, url, ts FROM clicks_csv;
