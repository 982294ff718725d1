"""1,000,000 rows of a pyarrow table into the null Publish and MutateRows servers: through
gcp_sql (a datafusion-python INSERT) and through Google's Python clients, against the same
server, one after the other. docs/benchmarks.md ("From Python") has the results.

    python python/bench/null_servers.py [--rows N]

starts both servers itself from the package (gcp_sql.testing.null_server: the crate's null
servers on the package's runtime, in this process), so a release build of the package alone
runs the whole benchmark. To measure against servers in another process instead (the numbers
in docs/benchmarks.md were taken that way first):

    gcp-sql serve-null --service pubsub --port 8093 &
    gcp-sql serve-null --service bigtable --port 8095 &
    python python/bench/null_servers.py --pubsub 127.0.0.1:8093 --bigtable 127.0.0.1:8095

With the servers in this process, `cpu_s` (this process's CPU time) includes theirs.

Rows as W1 and W2 of examples/bench.rs: Pub/Sub, about 200 bytes of JSON per row (gcp_sql
encodes the row; the Python client is given json.dumps of it, built in the timed loop as a
program would); Bigtable, a row key `row-N` and five 30-character cells in family `cf`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import time

import datafusion
import pyarrow as pa

import gcp_sql
from gcp_sql.testing import null_server


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def report(name: str, rows: int, started: float, cpu_started: float) -> float:
    seconds = time.perf_counter() - started
    print(
        f"RESULT {name}: rows={rows} seconds={seconds:.2f} rows_per_s={rows / seconds:,.0f} "
        f"cpu_s={cpu() - cpu_started:.1f}",
        flush=True,
    )
    return rows / seconds


def pubsub_table(n: int) -> pa.Table:
    ids = pa.array(range(1, n + 1), pa.int64())
    pad = "x" * 80
    return pa.table(
        {
            "id": ids,
            "user_id": pa.array([f"user-{i}" for i in range(1, n + 1)]),
            "event": pa.array(["page_view"] * n),
            "url": pa.array([f"https://example.com/catalog/item/{i}?ref=bench" for i in range(1, n + 1)]),
            "pad": pa.array([pad] * n),
        }
    )


def bigtable_table(n: int) -> pa.Table:
    cols = {"row_key": pa.array([f"row-{i}" for i in range(1, n + 1)])}
    for c in range(1, 6):
        cols[f"c{c}"] = pa.array([f"{c}" * 30] * n)
    return pa.table(cols)


def gcp_sql_insert(name: str, table: pa.Table, sink) -> float:
    ctx = datafusion.SessionContext()
    ctx.register_table("sink", sink)
    ctx.from_arrow(table, name="src")
    started, cpu_started = time.perf_counter(), cpu()
    count = ctx.sql("INSERT INTO sink SELECT * FROM src").collect()[0].column(0)[0].as_py()
    assert count == table.num_rows, count
    return report(name, table.num_rows, started, cpu_started)


def google_pubsub(host: str, table: pa.Table) -> float:
    os.environ["PUBSUB_EMULATOR_HOST"] = host
    from google.cloud import pubsub_v1

    publisher = pubsub_v1.PublisherClient()
    topic = "projects/bench/topics/bench"
    rows = table.to_pylist()
    started, cpu_started = time.perf_counter(), cpu()
    futures = [publisher.publish(topic, json.dumps(row).encode()) for row in rows]
    for f in futures:
        f.result()
    return report("google-cloud-pubsub", len(rows), started, cpu_started)


def google_bigtable(host: str, table: pa.Table) -> float:
    os.environ["BIGTABLE_EMULATOR_HOST"] = host
    from google.cloud import bigtable

    bt = bigtable.Client(project="bench", admin=True).instance("bench").table("bench")
    rows = table.to_pylist()
    started, cpu_started = time.perf_counter(), cpu()
    with bt.mutations_batcher() as batcher:
        for row in rows:
            r = bt.direct_row(row["row_key"])
            for c in range(1, 6):
                r.set_cell("cf", f"c{c}", row[f"c{c}"])
            batcher.mutate(r)
    return report("google-cloud-bigtable", len(rows), started, cpu_started)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--pubsub",
        help="HOST:PORT of `gcp-sql serve-null --service pubsub` (default: one started here)",
    )
    p.add_argument(
        "--bigtable",
        help="HOST:PORT of `gcp-sql serve-null --service bigtable` (default: one started here)",
    )
    p.add_argument("--rows", type=int, default=1_000_000)
    args = p.parse_args()

    with contextlib.ExitStack() as servers:
        for service in ("pubsub", "bigtable"):
            if getattr(args, service) is None:
                server = servers.enter_context(null_server(service))
                setattr(args, service, server.addr)
                print(f"null {service} server (in this process): {server.addr}", flush=True)
        run(args)


def run(args: argparse.Namespace) -> None:
    t = pubsub_table(args.rows)
    ours = gcp_sql_insert(
        "gcp_sql pubsub",
        t,
        gcp_sql.pubsub_sink(t.schema, topic="projects/bench/topics/bench", emulator_host=args.pubsub),
    )
    theirs = google_pubsub(args.pubsub, t)
    print(f"RATIO pubsub: {ours / theirs:.1f}x", flush=True)

    t = bigtable_table(args.rows)
    ours = gcp_sql_insert(
        "gcp_sql bigtable",
        t,
        gcp_sql.bigtable_sink(
            t.schema,
            table="projects/bench/instances/bench/tables/bench",
            row_key="row_key",
            emulator_host=args.bigtable,
        ),
    )
    theirs = google_bigtable(args.bigtable, t)
    print(f"RATIO bigtable: {ours / theirs:.1f}x", flush=True)


if __name__ == "__main__":
    main()
