"""A notebook-style walk-through: a pyarrow table, written to Parquet, into Bigtable and
Pub/Sub from a datafusion-python session, on local emulators, read back with Google's clients.

    pip install ./python google-cloud-pubsub google-cloud-bigtable
    python python/examples/parquet_to_sinks.py

Each block is one notebook cell.
"""

import json
import tempfile

import datafusion
import pyarrow as pa
import pyarrow.parquet as pq

import gcp_sql

# %% Start the emulators (Pub/Sub, Bigtable, Cloud Tasks) on free ports; this process's
# PUBSUB_EMULATOR_HOST, BIGTABLE_EMULATOR_HOST and CLOUD_TASKS_EMULATOR_HOST point at them.
with gcp_sql.emulators() as env:
    print(env)

    # %% Some data: a pyarrow table, saved as Parquet.
    n = 10_000
    clicks = pa.table(
        {
            "user_id": pa.array([i % 500 for i in range(n)], pa.int64()),
            "url": pa.array([f"https://example.com/page/{i % 37}" for i in range(n)]),
            "ts": pa.array(range(n), pa.int64()),
        }
    )
    path = tempfile.mkdtemp() + "/clicks.parquet"
    pq.write_table(clicks, path)

    # %% A session with the sinks.
    ctx = datafusion.SessionContext()
    gcp_sql.register(ctx)
    ctx.register_parquet("clicks_file", path)

    # %% Pub/Sub: a subscription first (the emulator keeps messages only for subscriptions
    # that exist when they are published), then one message per row.
    from google.cloud import pubsub_v1

    topic, sub = "projects/demo/topics/clicks", "projects/demo/subscriptions/clicks"
    pubsub_v1.PublisherClient().create_topic(name=topic)
    subscriber = pubsub_v1.SubscriberClient()
    subscriber.create_subscription(name=sub, topic=topic)

    ctx.sql(
        f"CREATE EXTERNAL TABLE clicks (user_id BIGINT, url VARCHAR, ts BIGINT) "
        f"STORED AS PUBSUB LOCATION '{topic}' OPTIONS ('batch_element_count_threshold' '500')"
    )
    print(ctx.sql("INSERT INTO clicks SELECT * FROM clicks_file").collect()[0])
    pulled = subscriber.pull(subscription=sub, max_messages=3, timeout=10)
    for m in pulled.received_messages:
        print(json.loads(m.message.data))

    # %% Bigtable: the latest click of each user, one row per user, in a table the sink
    # creates (auto_create_table).
    ctx.sql(
        "CREATE EXTERNAL TABLE latest (user_id BIGINT, url VARCHAR, ts BIGINT) "
        "STORED AS BIGTABLE LOCATION 'projects/demo/instances/main/tables/latest' "
        "OPTIONS ('row_key' 'user_id', 'auto_create_table' 'true')"
    )
    print(ctx.sql(
        "INSERT INTO latest SELECT user_id, last_value(url ORDER BY ts), max(ts) "
        "FROM clicks_file GROUP BY user_id"
    ).collect()[0])

    from google.cloud import bigtable

    table = bigtable.Client(project="demo", admin=True).instance("main").table("latest")
    for row in list(table.read_rows(limit=3)):
        print(row.row_key, {q.decode(): c[0].value for q, c in row.cells["cf"].items()})

    # %% The same without SQL: a typed sink table over the pyarrow table's schema.
    ctx.register_table(
        "clicks_typed", gcp_sql.pubsub_sink(clicks.schema, topic=topic, batch_element_count_threshold=1000)
    )
    ctx.from_arrow(clicks, name="clicks_mem")
    print(ctx.sql("INSERT INTO clicks_typed SELECT * FROM clicks_mem").collect()[0])

    # %% A bad option fails at once, naming it.
    try:
        gcp_sql.pubsub_sink(clicks.schema, topic=topic, max_in_flight_mesages=10)
    except gcp_sql.GcpSqlError as e:
        print("GcpSqlError:", e)
