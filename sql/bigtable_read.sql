-- gcp-sql: read a Bigtable table back with SELECT. The clicks of a small CSV file are written
-- to Bigtable (row key: the user and the time of the click), then read back: every row, one
-- user's clicks (a row-key prefix), a time range of one user (a row range), a point read.
--
-- Against the local emulators (started and stopped by the tool):
--   cargo run --release -- --emulators -f sql/bigtable_read.sql

CREATE EXTERNAL TABLE clicks_csv
STORED AS CSV
LOCATION 'sql/data/clicks.csv'
OPTIONS ('format.has_header' 'true');

-- The same declaration writes and reads: the row key is 'user#time', the url a cell, the
-- click's time also the cell version (timestamp_column), read back from the version.
CREATE TABLE clicks_bt (user_id VARCHAR NOT NULL, at VARCHAR NOT NULL, url VARCHAR, ts TIMESTAMP)
WITH (
  connector = 'bigtable',
  table = 'projects/demo/instances/reading/tables/clicks',
  row_key = 'user_id, at',
  timestamp_column = 'ts',
  auto_create_table = true
);

INSERT INTO clicks_bt
SELECT CAST(user_id AS VARCHAR), CAST(ts AS VARCHAR) AS at, url, ts FROM clicks_csv;

-- Every row (a full scan, split into partitions by the table's sampled row keys).
SELECT count(*) AS clicks FROM clicks_bt;

-- One user's clicks: the leading key part is a prefix ('101#'), read as one row range.
SELECT user_id, at, url, ts FROM clicks_bt WHERE user_id = '101' ORDER BY at;

-- One user's clicks in a time range: a range under the prefix; the LIMIT is sent to Bigtable.
SELECT at AS clicked_at, url FROM clicks_bt
WHERE user_id = '101' AND at >= '2024-05-01T09:05' AND at < '2024-05-01T09:10'
ORDER BY at LIMIT 5;

-- What is read: the row ranges, the column filter and the partitions.
EXPLAIN SELECT url FROM clicks_bt WHERE user_id IN ('100', '102');
