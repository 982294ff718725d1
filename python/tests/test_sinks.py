"""The sinks from a datafusion-python session, against the real emulators, read back with
Google's Python clients."""

from __future__ import annotations

import _thread
import json
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gcp_sql
from stopping import when_writing


def parquet_of(tmp_path, n):
    path = tmp_path / "clicks.parquet"
    table = pa.table(
        {
            "user_id": pa.array(range(n), pa.int64()),
            "url": pa.array([f"https://example.com/{i}" for i in range(n)]),
        }
    )
    pq.write_table(table, path)
    return str(path)


def count_of(result):
    batches = result if isinstance(result, list) else [result]
    return sum(
        sum(v.as_py() for v in b.column(0)) for b in batches if b.num_rows
    )


def test_create_external_table_pubsub_insert_from_parquet(ctx, pubsub, unique, tmp_path):
    topic, sub = pubsub.topic_with_subscription(f"clicks-{unique}")
    ctx.register_parquet("clicks_file", parquet_of(tmp_path, 250))
    ctx.sql(
        f"CREATE EXTERNAL TABLE clicks (user_id BIGINT, url VARCHAR) STORED AS PUBSUB "
        f"LOCATION '{topic}' OPTIONS ('batch_element_count_threshold' '50')"
    ).collect()
    result = ctx.sql("INSERT INTO clicks SELECT user_id, url FROM clicks_file").collect()
    assert count_of(result) == 250
    messages = pubsub.pull_all(sub, 250)
    rows = sorted(json.loads(m.data)["user_id"] for m in messages)
    assert rows == list(range(250))
    assert json.loads(messages[0].data)["url"].startswith("https://example.com/")


def test_bigtable_with_grouping_routes_every_row(ctx, bigtable, unique, tmp_path):
    table, name = bigtable.table(f"events-{unique}")
    ctx.register_parquet("clicks_file", parquet_of(tmp_path, 120))
    ctx.sql(
        f"CREATE EXTERNAL TABLE events (user_id BIGINT, url VARCHAR) STORED AS BIGTABLE "
        f"LOCATION '{name}' OPTIONS ('row_key' 'user_id')"
    ).collect()
    # An aggregate in the input: the host's optimizer plans it, the sink routes the keys.
    result = ctx.sql(
        "INSERT INTO events SELECT user_id % 40, max(url) FROM clicks_file GROUP BY user_id % 40"
    ).collect()
    assert count_of(result) == 40
    rows = {r.row_key.decode(): r for r in table.read_rows()}
    assert sorted(rows, key=int) == [str(i) for i in range(40)]
    cell = rows["7"].cells["cf"][b"url"][0].value.decode()
    assert cell == max(f"https://example.com/{i}" for i in range(120) if i % 40 == 7)


def test_cloud_tasks_insert_values(ctx, cloud_tasks, unique):
    queue = cloud_tasks.queue(f"jobs-{unique}")
    ctx.sql(
        f"CREATE EXTERNAL TABLE jobs (job VARCHAR) STORED AS CLOUD_TASKS LOCATION '{queue}' "
        "OPTIONS ('url' 'http://127.0.0.1:9/run')"
    ).collect()
    result = ctx.sql("INSERT INTO jobs VALUES ('a'), ('b'), ('c')").collect()
    assert count_of(result) == 3
    tasks = cloud_tasks.tasks(queue)
    bodies = sorted(json.loads(t.http_request.body)["job"] for t in tasks)
    assert bodies == ["a", "b", "c"]


def test_an_invalid_option_names_it(ctx):
    with pytest.raises(Exception) as raised:
        ctx.sql(
            "CREATE EXTERNAL TABLE t (data VARCHAR) STORED AS PUBSUB "
            "LOCATION 'projects/p/topics/t' OPTIONS ('max_in_flight_mesages' '10')"
        ).collect()
    assert "did you mean 'max_in_flight_messages'" in str(raised.value)
    own = gcp_sql.error_from(raised.value)
    assert isinstance(own, gcp_sql.GcpSqlError)
    assert own.acknowledged is None


def test_typed_constructor_checks_options_at_construction():
    schema = pa.schema([("data", pa.string())])
    with pytest.raises(gcp_sql.GcpSqlError) as raised:
        gcp_sql.pubsub_sink(schema, topic="projects/p/topics/t", max_in_flight_messages=0)
    assert "max_in_flight_messages" in str(raised.value)
    with pytest.raises(gcp_sql.GcpSqlError) as raised:
        gcp_sql.bigtable_sink(schema, table="projects/p/instances/i/tables/t", row_kee="data")
    assert "row_kee" in str(raised.value) and "row_key" in str(raised.value)
    with pytest.raises(gcp_sql.GcpSqlError) as raised:
        gcp_sql.cloud_tasks_sink(schema, queue="projects/p/locations/l/queues/q")
    assert "url" in str(raised.value)


def test_typed_constructor_writes_a_pyarrow_table(ctx, pubsub, bigtable, unique):
    topic, sub = pubsub.topic_with_subscription(f"typed-{unique}")
    table, name = bigtable.table(f"typed-{unique}")
    data = pa.table({"id": pa.array(["a", "b", "c", "d"]), "n": pa.array([1, 2, 3, 4], pa.int64())})
    ctx.register_table("ps", gcp_sql.pubsub_sink(data.schema, topic=topic, auto_create_topic=True))
    ctx.register_table("bt", gcp_sql.bigtable_sink(data.schema, table=name, row_key="id"))
    ctx.from_arrow(data, name="src")
    assert count_of(ctx.sql("INSERT INTO ps SELECT * FROM src").collect()) == 4
    assert count_of(ctx.sql("INSERT INTO bt SELECT * FROM src").collect()) == 4
    assert sorted(json.loads(m.data)["n"] for m in pubsub.pull_all(sub, 4)) == [1, 2, 3, 4]
    cells = {r.row_key.decode(): r.cells["cf"][b"n"][0].value for r in table.read_rows()}
    assert sorted(cells) == ["a", "b", "c", "d"]


def _failed_insert(ctx, unique, table):
    """Two rows into a topic that does not exist and may not be created: the statement
    fails, nothing lands. Returns the error `gcp_sql.sql` raised."""
    gcp_sql.sql(
        ctx,
        f"CREATE TABLE {table} (data VARCHAR) WITH (connector = 'pubsub', "
        f"topic = 'projects/demo/topics/missing-{unique}')",
    )
    with pytest.raises(gcp_sql.GcpSqlError) as raised:
        gcp_sql.sql(ctx, f"INSERT INTO {table} VALUES ('a'), ('b')")
    return raised.value


def test_a_failed_insert_carries_its_counts(ctx, unique):
    err = _failed_insert(ctx, unique, "gone")
    assert f"missing-{unique}" in str(err)
    assert err.acknowledged == 0
    assert err.not_delivered == 2
    assert err.dead_lettered == 0


def test_a_failed_insert_keeps_no_dataframe_in_its_traceback(ctx, unique):
    # A DataFrame's repr runs its query: a traceback printer that shows locals (pytest, an
    # error reporter) must not find the failed INSERT's DataFrame in any frame of the error or
    # of the errors it chains.
    import datafusion

    seen, holders = set(), []
    error = _failed_insert(ctx, unique, "gone2")
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if any(isinstance(v, datafusion.DataFrame) for v in frame.f_locals.values()):
                holders.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
    assert not holders, holders


def test_sql_runs_the_with_form(ctx, pubsub, unique):
    topic, sub = pubsub.topic_with_subscription(f"with-{unique}")
    result = gcp_sql.sql(
        ctx,
        f"CREATE TABLE w (id BIGINT, note VARCHAR) WITH (connector = 'pubsub', topic = '{topic}');"
        "INSERT INTO w VALUES (1, 'x'), (2, 'y');",
    )
    assert result.column("count").to_pylist() == [2]
    assert sorted(json.loads(m.data)["id"] for m in pubsub.pull_all(sub, 2)) == [1, 2]
    with pytest.raises(gcp_sql.GcpSqlError) as raised:
        gcp_sql.sql(ctx, "CREATE TABLE v (a INT) WITH (topic = 'projects/p/topics/t')")
    assert str(raised.value).startswith("missing option 'connector'")


def test_dataframe_write_table_reaches_the_sink(ctx, pubsub, unique):
    topic, sub = pubsub.topic_with_subscription(f"df-{unique}")
    schema = pa.schema([("id", pa.int64())])
    ctx.register_table("sinkdf", gcp_sql.pubsub_sink(schema, topic=topic))
    df = ctx.from_pydict({"id": [5, 6, 7]})
    df.write_table("sinkdf")
    assert sorted(json.loads(m.data)["id"] for m in pubsub.pull_all(sub, 3)) == [5, 6, 7]


def test_sql_reports_an_option_given_twice(ctx):
    with pytest.raises(gcp_sql.GcpSqlError) as raised:
        gcp_sql.sql(
            ctx,
            "CREATE EXTERNAL TABLE d (data VARCHAR) STORED AS PUBSUB LOCATION 'projects/p/topics/t' "
            "OPTIONS ('max_in_flight_messages' '10', 'format.max_in_flight_messages' '20')",
        )
    assert "option 'max_in_flight_messages' is given more than once" in str(raised.value)
    with pytest.raises(gcp_sql.GcpSqlError) as raised:
        gcp_sql.sql(ctx, "CREATE TABLE e (data VARCHAR) WITH (connector = 'pubsub', topic_column = 'data')")
    assert "names no topic" in str(raised.value)


def _long_insert(ctx, pubsub, unique, name):
    topic, sub = pubsub.topic_with_subscription(f"{name}-{unique}")
    ctx.sql(
        f"CREATE EXTERNAL TABLE {name} (id BIGINT) STORED AS PUBSUB LOCATION '{topic}'"
    ).collect()
    # Far more rows than a second of writing: the stop ends it.
    return sub, f"INSERT INTO {name} SELECT value AS id FROM generate_series(1, 50000000)"


def test_stop_drains_a_running_insert_with_its_count(ctx, pubsub, unique):
    sub, insert = _long_insert(ctx, pubsub, unique, "stopped")
    returned = threading.Event()
    hung = when_writing(gcp_sql.stop, returned)
    try:
        count = count_of(ctx.sql(insert).collect())
    except Exception as exc:
        assert not hung, f"{hung}: {exc}"
        raise
    finally:
        returned.set()
        gcp_sql.rearm()
    assert 0 < count < 50_000_000
    ids = {json.loads(m.data)["id"] for m in pubsub.pull_all(sub, count)}
    assert len(ids) == count
    # Re-armed: the next INSERT runs to its end.
    assert count_of(ctx.sql("INSERT INTO stopped VALUES (1), (2)").collect()) == 2


def test_ctrl_c_in_sql_drains_the_insert(ctx, pubsub, unique):
    sub, insert = _long_insert(ctx, pubsub, unique, "interrupted")
    returned = threading.Event()
    hung = when_writing(_thread.interrupt_main, returned)
    try:
        result = gcp_sql.sql(ctx, insert)
    except Exception as exc:
        assert not hung, f"{hung}: {exc}"
        raise
    finally:
        returned.set()
        if hung:  # the guard's abort stays armed; gcp_sql.sql re-arms its own stop
            gcp_sql.rearm()
    count = result.column("count").to_pylist()[0]
    assert 0 < count < 50_000_000
    ids = {json.loads(m.data)["id"] for m in pubsub.pull_all(sub, count)}
    assert len(ids) == count
    assert gcp_sql.sql(ctx, "INSERT INTO interrupted VALUES (1)").column("count").to_pylist() == [1]


def _scrape(address, path="/metrics"):
    """The status and body of one GET on the metrics endpoint."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def _series(body, name, label):
    """The value of the series `name` whose labels hold `label` (0 when there is none)."""
    for line in body.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_serve_metrics_counts_what_the_pubsub_client_reads_back(ctx, pubsub, unique, tmp_path):
    server = gcp_sql.serve_metrics("127.0.0.1:0")
    try:
        assert _scrape(server.address, "/healthz") == (200, "ok\n")
        topic, sub = pubsub.topic_with_subscription(f"metrics-{unique}")
        ctx.register_parquet("clicks_file", parquet_of(tmp_path, 300))
        table = f"clicks_{unique}"
        ctx.sql(
            f"CREATE EXTERNAL TABLE {table} (user_id BIGINT, url VARCHAR) STORED AS PUBSUB "
            f"LOCATION '{topic}'"
        ).collect()
        count = count_of(ctx.sql(f"INSERT INTO {table} SELECT * FROM clicks_file").collect())
        status, body = _scrape(server.address)
        assert status == 200
        label = f'table="{table}"'
        received = len(pubsub.pull_all(sub, 300))
        assert count == received == 300
        assert _series(body, "gcp_sql_sink_records_acknowledged_total", label) == received
        assert _series(body, "gcp_sql_sink_records_sent_total", label) == received
        assert _series(body, "gcp_sql_statement_running", label) == 0
    finally:
        server.stop()


def test_serve_metrics_refuses_a_bad_address_naming_it():
    with pytest.raises(gcp_sql.GcpSqlError, match="'address'"):
        gcp_sql.serve_metrics("9464")
