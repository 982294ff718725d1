"""An INSERT's ORDER BY per key from a datafusion-python session (docs/adr/0056), and the null
servers of gcp_sql.testing that python/bench uses."""

from __future__ import annotations

import datafusion
import pyarrow as pa
import pytest

import gcp_sql
from gcp_sql.testing import null_server

KEYS = 50
VERSIONS = 40


def count_of(batches):
    return sum(sum(v.as_py() for v in b.column(0)) for b in batches if b.num_rows)


def eight_partitions():
    # More partitions than keys need: the host spreads its input over all of them.
    ctx = datafusion.SessionContext(datafusion.SessionConfig().with_target_partitions(8))
    gcp_sql.register(ctx)
    return ctx


def newest_versions(table):
    """Row key -> the value of the newest cell of column `version` (a BIGINT, big-endian)."""
    newest = {}
    for row in table.read_rows():
        cells = row.cells["cf"][b"version"]
        cell = max(cells, key=lambda c: c.timestamp)
        newest[row.row_key.decode()] = int.from_bytes(cell.value, "big", signed=True)
    return newest


@pytest.mark.parametrize("order_by", ["version", "version * 2 + 1"])
def test_order_by_reaches_each_keys_writer_in_order(emulator_env, bigtable, unique, order_by):
    # Every key is written VERSIONS times, generated from the highest version down; the ORDER BY
    # puts its highest version last, so the newest cell of each row holds VERSIONS - 1 only when
    # a key's rows reach its writer in the ORDER BY's order (Bigtable keeps the write applied
    # last). The host's optimizer drops the sort: the writers must restore it. By a column, the
    # writers sort by their own copy of it; by an expression, by the host's (through the FFI).
    ctx = eight_partitions()
    table, name = bigtable.table(f"lastwins-{unique}")
    ctx.sql(
        f"CREATE EXTERNAL TABLE lastwins (id VARCHAR, version BIGINT) STORED AS BIGTABLE "
        f"LOCATION '{name}' OPTIONS ('row_key' 'id', 'batch_element_count_threshold' '7')"
    ).collect()
    select = (
        f"SELECT concat('k', CAST(value % {KEYS} AS VARCHAR)) AS id, "
        f"{VERSIONS - 1} - value / {KEYS} AS version "
        f"FROM generate_series(0, {KEYS * VERSIONS - 1}) ORDER BY {order_by}"
    )
    result = ctx.sql(f"INSERT INTO lastwins {select}").collect()
    assert count_of(result) == KEYS * VERSIONS
    newest = newest_versions(table)
    assert len(newest) == KEYS
    behind = {k: v for k, v in newest.items() if v != VERSIONS - 1}
    assert not behind, f"{len(behind)} of {KEYS} rows kept an earlier row: {sorted(behind.items())[:5]}"


def test_null_server_counts_what_a_sink_sends():
    data = pa.table({"id": pa.array(range(300), pa.int64())})
    with null_server("pubsub") as server:
        assert server.service == "pubsub"
        assert server.addr.startswith("127.0.0.1:")
        ctx = datafusion.SessionContext()
        ctx.register_table(
            "sink",
            gcp_sql.pubsub_sink(data.schema, topic="projects/p/topics/counted", emulator_host=server.addr),
        )
        ctx.from_arrow(data, name="src")
        assert count_of(ctx.sql("INSERT INTO sink SELECT * FROM src").collect()) == 300
        totals = server.totals()
        assert totals["records"] == 300
        assert totals["requests"] >= 1


def test_null_server_names_an_unknown_service():
    with pytest.raises(ValueError) as raised:
        with null_server("pubsubb"):
            pass
    assert "pubsubb" in str(raised.value) and "pubsub" in str(raised.value)
