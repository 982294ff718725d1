-- gcp-sql changelog: apply a stream of insert / update / delete events (Debezium's c / u / r / d
-- codes too) to a Bigtable table that always holds each key's latest row, and keep counters
-- and first-seen rows with the other write modes (docs/bigtable.md, "Write modes and
-- changelogs").
--
-- Against a local emulator (started and stopped by the tool):
--   cargo run --release -- --emulators -f sql/bigtable_changelog.sql

-- 1. The changelog sink: `op` says what each event is; under replace_row every event leaves its
--    row exactly as the event says (a delete removes it), at the event's version.
CREATE TABLE customers (op VARCHAR, id VARCHAR, name VARCHAR, tier VARCHAR, ts BIGINT)
WITH (
  connector = 'bigtable',
  table = 'projects/demo/instances/changelog/tables/customers',
  row_key = 'id',
  op_column = 'op',
  write_mode = 'replace_row',
  timestamp_column = 'ts',
  auto_create_table = true
);

-- 2. The events, in order. A delete needs only its key.
CREATE VIEW events (op, id, name, tier, ts) AS VALUES
  ('c', 'c-1', 'Ada',    'silver', 1700000000000000),
  ('c', 'c-2', 'Brian',  'silver', 1700000001000000),
  ('u', 'c-1', 'Ada L.', 'gold',   1700000002000000),
  ('c', 'c-3', 'Chen',   NULL,     1700000003000000),
  ('d', 'c-2', NULL,     NULL,     NULL),
  ('r', 'c-4', 'Dana',   'silver', 1700000004000000),
  ('u', 'c-3', 'Chen',   'bronze', 1700000005000000),
  ('d', 'c-4', NULL,     NULL,     NULL),
  ('c', 'c-4', 'Dana',   'gold',   1700000007000000);

INSERT INTO customers SELECT * FROM events;

-- 3. The same events delivered again (as a redelivery after a crash would): the table ends the
--    same, one version per cell.
INSERT INTO customers SELECT * FROM events;

SELECT row_key, qualifier, value, timestamp
FROM bigtable_read('projects/demo/instances/changelog/tables/customers')
ORDER BY row_key, qualifier;

-- 4. Counters: each row adds to 64-bit counters (ReadModifyWriteRow). Not idempotent: a
--    redelivery would count again.
CREATE TABLE visits (id VARCHAR, visits BIGINT)
WITH (
  connector = 'bigtable',
  table = 'projects/demo/instances/changelog/tables/visits',
  row_key = 'id',
  write_mode = 'increment',
  auto_create_table = true
);

INSERT INTO visits VALUES ('c-1', 1), ('c-3', 1), ('c-1', 1), ('c-1', 2);

-- Every increment writes a new version; the newest is the counter (8 bytes, big-endian).
SELECT row_key, first_value(encode(value_bytes, 'hex') ORDER BY timestamp DESC) AS visits_hex
FROM bigtable_read('projects/demo/instances/changelog/tables/visits')
GROUP BY row_key
ORDER BY row_key;

-- 5. First seen: a row is written only when its key has no cell yet (CheckAndMutateRow).
CREATE TABLE first_seen (id VARCHAR, source VARCHAR)
WITH (
  connector = 'bigtable',
  table = 'projects/demo/instances/changelog/tables/first_seen',
  row_key = 'id',
  write_mode = 'insert_if_absent',
  auto_create_table = true
);

INSERT INTO first_seen VALUES ('c-1', 'web'), ('c-2', 'app'), ('c-1', 'app');
INSERT INTO first_seen VALUES ('c-2', 'import');

SELECT row_key, value AS first_source
FROM bigtable_read('projects/demo/instances/changelog/tables/first_seen')
ORDER BY row_key;
