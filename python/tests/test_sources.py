"""A Pub/Sub subscription read from a datafusion-python session: both declaration forms,
EXPLAIN, a pipeline into a Bigtable sink (run with stop_after_idle, and stopped with Ctrl-C),
and the forms the package refuses up front; published and read back with Google's Python
clients against the real emulators."""

from __future__ import annotations

import _thread
import json
import threading
import time

import pyarrow as pa
import pytest

import gcp_sql
from stopping import when_writing

# How long the Ctrl-C test waits for the messages not acknowledged to come back.
REDELIVERY_BOUND_S = 300


def _source(ctx, name, sub, options=""):
    gcp_sql.sql(
        ctx,
        f"CREATE TABLE {name} (id VARCHAR, n BIGINT) WITH (connector = 'pubsub', "
        f"subscription = '{sub}'{options})",
    )


def _bigtable_sink(ctx, name, table):
    gcp_sql.sql(
        ctx,
        f"CREATE TABLE {name} (id VARCHAR, n BIGINT) WITH (connector = 'bigtable', "
        f"table = '{table}', row_key = 'id')",
    )


def _rows(n):
    return [{"id": f"k{i:05}", "n": i} for i in range(n)]


def _landed(table):
    """Row key -> the `n` cell (8 bytes, big-endian) of every row of a Bigtable table."""
    return {
        r.row_key.decode(): int.from_bytes(r.cells["cf"][b"n"][0].value, "big")
        for r in table.read_rows()
    }


def _refused(ctx, statement):
    with pytest.raises(Exception) as raised:
        gcp_sql.sql(ctx, statement)
    text = str(raised.value)
    assert "bug in DataFusion" not in text, text
    return text


def test_both_declaration_forms_read_a_subscription(ctx, pubsub, unique):
    topic, sub = pubsub.topic_with_subscription(f"forms-{unique}")
    pubsub.publish_json(topic, _rows(3))
    # The WITH form through gcp_sql.sql, the native form straight through datafusion-python.
    _source(ctx, "with_form", sub, ", stop_after_idle = '2s'")
    ctx.sql(
        f"CREATE UNBOUNDED EXTERNAL TABLE native_form (id VARCHAR, n BIGINT) STORED AS PUBSUB "
        f"LOCATION '{sub}' OPTIONS ('stop_after_idle' '2s')"
    ).collect()
    # A plain SELECT runs in the host, the scan on the package's side: the rows handed over
    # count as delivered, so the messages are acknowledged.
    got = ctx.sql("SELECT id, n FROM native_form").to_arrow_table()
    assert sorted(got.column("n").to_pylist()) == [0, 1, 2]
    assert pubsub.is_empty(sub)
    # The WITH form's table reads the same subscription: nothing is left.
    assert gcp_sql.sql(ctx, "SELECT id FROM with_form").num_rows == 0


def test_explain_shows_the_pipeline_that_will_run(ctx, pubsub, bigtable, unique):
    _, sub = pubsub.topic_with_subscription(f"explain-{unique}")
    _, name = bigtable.table(f"explain-{unique}")
    _source(ctx, "src", sub)
    _bigtable_sink(ctx, "bt", name)
    plan = gcp_sql.sql(ctx, "EXPLAIN INSERT INTO bt SELECT id, n FROM src WHERE n > 0")
    physical = "\n".join(
        p for t, p in zip(plan.column("plan_type").to_pylist(), plan.column("plan").to_pylist())
        if t == "physical_plan"
    )
    # The crate's own plan: writers fed one source partition each through a filter that hands
    # each batch on (docs/pubsub.md, ADR 0051), not the host's GcpSqlInsertExec.
    for node in ("SinkCountExec", "SinkWriterExec", "BatchFilterExec", "PubSubSourceExec"):
        assert node in physical, physical
    assert "GcpSqlInsertExec" not in physical, physical
    assert gcp_sql.last_report(ctx) is None  # nothing ran


def test_a_subscription_into_bigtable_with_stop_after_idle(ctx, pubsub, bigtable, unique):
    topic, sub = pubsub.topic_with_subscription(f"pipe-{unique}")
    table, name = bigtable.table(f"pipe-{unique}")
    pubsub.publish_json(topic, _rows(200))
    _source(ctx, "src", sub, ", stop_after_idle = '2s'")
    _bigtable_sink(ctx, "bt", name)
    result = gcp_sql.sql(ctx, "INSERT INTO bt SELECT id, n * 10 FROM src WHERE n % 2 = 0")
    assert result.column("count").to_pylist() == [100]
    assert _landed(table) == {f"k{i:05}": i * 10 for i in range(0, 200, 2)}
    report = gcp_sql.last_report(ctx)
    # Every message acknowledged: its row landed, or the filter dropped it.
    assert report["source_messages_read"] == 200, report
    assert report["source_messages_acked"] == 200, report
    assert report["source_messages_nacked"] == 0, report
    assert report["records_acked"] == 100, report
    assert pubsub.is_empty(sub)


def test_ctrl_c_drains_a_pipeline_and_the_rest_is_redelivered(ctx, pubsub, bigtable, unique):
    n = 5000
    topic, sub = pubsub.topic_with_subscription(f"ctrlc-{unique}")
    table, name = bigtable.table(f"ctrlc-{unique}")
    pubsub.publish_json(topic, _rows(n))
    # Small leases: messages held when the drain comes and not delivered go back soon.
    _source(ctx, "src", sub, ", max_outstanding_messages = 10, ack_deadline = '10s'")
    _bigtable_sink(ctx, "bt", name)
    returned = threading.Event()
    hung = when_writing(
        _thread.interrupt_main, returned, ready=lambda: bool(list(table.read_rows(limit=1)))
    )
    try:
        result = gcp_sql.sql(ctx, "INSERT INTO bt SELECT id, n FROM src")
    except Exception as exc:
        assert not hung, f"{hung}: {exc}"
        raise
    finally:
        returned.set()
        if hung:
            gcp_sql.rearm()
    count = result.column("count").to_pylist()[0]
    report = gcp_sql.last_report(ctx)
    acked = report["source_messages_acked"]
    landed = _landed(table)
    assert 0 < count <= n and len(landed) == count, (count, len(landed))
    assert 0 < acked <= n, report
    # What was not acknowledged is delivered again (nacked, or never read): every message is
    # either acknowledged or in the subscription, and each acknowledged one landed. The bound
    # is for liveness only: the emulator has taken over 120 s to hand back some messages.
    again, deadline = set(), time.monotonic() + REDELIVERY_BOUND_S
    while len(again) < n - acked and time.monotonic() < deadline:
        again |= {m.message.data for m in pubsub.pull_once(sub)}
    again = {json.loads(data)["id"] for data in again}
    assert len(again) == n - acked, (len(again), n, report)
    assert again.isdisjoint(landed)
    acknowledged = {r["id"] for r in _rows(n)} - again
    assert acknowledged <= set(landed), sorted(acknowledged - set(landed))[:5]
    assert all(landed[k] == int(k[1:]) for k in landed)


def test_an_insert_from_a_subscription_through_the_host_is_refused_up_front(
    ctx, pubsub, bigtable, unique
):
    topic, sub = pubsub.topic_with_subscription(f"refused-{unique}")
    _, name = bigtable.table(f"refused-{unique}")
    pubsub.publish_json(topic, _rows(3))
    _source(ctx, "src", sub, ", stop_after_idle = '1s'")
    _bigtable_sink(ctx, "bt", name)
    schema = pa.schema([("id", pa.string()), ("n", pa.int64())])
    ctx.register_table("typed", gcp_sql.bigtable_sink(schema, table=name, row_key="id"))
    for run in (
        # datafusion-python plans it: its nodes between the source and the sink are opaque.
        lambda: ctx.sql("INSERT INTO bt SELECT id, n FROM src").collect(),
        # A table the package's session does not have (registered in the host only).
        lambda: gcp_sql.sql(ctx, "INSERT INTO typed SELECT id, n FROM src"),
    ):
        with pytest.raises(Exception) as raised:
            run()
        text = str(raised.value)
        assert "gcp_sql (the Python package)" in text, text
        assert "gcp_sql.sql(ctx" in text and "CREATE" in text, text
        assert "bug in DataFusion" not in text, text
    # Refused at planning: nothing was read.
    assert len(pubsub.pull_all(sub, 3)) == 3


def test_the_refused_source_forms_name_the_fix(ctx, pubsub, unique):
    _, sub = pubsub.topic_with_subscription(f"forms-refused-{unique}")
    text = _refused(
        ctx, "CREATE TABLE s (id VARCHAR) WITH (connector = 'pubsub', type = 'source')"
    )
    assert "names no subscription" in text and "subscription = '...'" in text, text
    # An aggregate over a source cannot keep the acknowledgement promise: refused by the crate
    # when the INSERT is planned, before anything is read.
    _source(ctx, "src", sub)
    gcp_sql.sql(
        ctx,
        "CREATE TABLE agg (id VARCHAR, n BIGINT) WITH (connector = 'bigtable', "
        "table = 'projects/demo/instances/main/tables/none', row_key = 'id')",
    )
    text = _refused(ctx, "INSERT INTO agg SELECT id, max(n) FROM src GROUP BY id")
    assert "land the rows in a table first" in text, text
