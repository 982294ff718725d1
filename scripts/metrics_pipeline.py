"""The metrics endpoint over a Pub/Sub -> Bigtable pipeline, checked with Google's Python clients
(docs/benchmarks.md, "Metrics endpoint overhead" and the pipeline scrape before it).

    python scripts/metrics_pipeline.py --gcp-sql target/debug/gcp-sql --messages 100000

Needs the emulators running with their variables exported (`eval "$(gcp-sql emulators | head -3)"`
in another terminal, or `gcp-sql emulators` and a copy of its export lines), and
google-cloud-pubsub and google-cloud-bigtable installed. It publishes the messages with the
Pub/Sub client, runs the pipeline in `gcp-sql --metrics-addr` (its shell, fed the statements on
stdin, stays up after the INSERT so that the endpoint can be scraped after the end), prints a
scrape taken in the middle of the run and one after it, and then what the Python clients read
back: the rows in Bigtable, and the messages left on the subscription once the ack deadline
has passed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid

from google.cloud import bigtable, pubsub_v1
from google.cloud.bigtable import column_family

PROJECT = "metrics"
INSTANCE = "main"
SINK = ["records_sent", "records_acknowledged", "bytes_sent", "in_flight_records", "send_rpcs"]
SOURCE = ["messages_received", "messages_acknowledged", "messages_nacked", "held_messages",
          "oldest_unacked_message_age_seconds", "lease_extensions"]


def scrape(port: int) -> dict[str, float]:
    """Every series of the pipeline's tables, by name (labels left out)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        body = answer.read().decode()
    values: dict[str, float] = {}
    for line in body.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name, rest = line.split("{", 1)
        if "_bucket" in name or "code=" in rest:
            continue
        if 'table="pipeline_in"' in rest or 'table="pipeline_bt"' in rest:
            values[name] = float(rest.rsplit(" ", 1)[1])
    return values


def show(title: str, values: dict[str, float]) -> None:
    print(f"== {title}")
    for prefix, names in (("gcp_sql_sink_", SINK), ("gcp_sql_source_", SOURCE)):
        for name in names:
            for key in (prefix + name + "_total", prefix + name):
                if key in values:
                    print(f"  {key} {values[key]:g}")
    print(f"  gcp_sql_statement_running {values.get('gcp_sql_statement_running', -1):g}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gcp-sql", default="target/debug/gcp-sql")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--port", type=int, default=9464)
    args = parser.parse_args()
    for var in ("PUBSUB_EMULATOR_HOST", "BIGTABLE_EMULATOR_HOST"):
        if var not in os.environ:
            sys.exit(f"{var} is not set: start the emulators (gcp-sql emulators) and export them")

    run = uuid.uuid4().hex[:8]
    topic = f"projects/{PROJECT}/topics/pipeline-{run}"
    subscription = f"projects/{PROJECT}/subscriptions/pipeline-{run}"
    table_id = f"pipeline-{run}"
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=subscription, topic=topic, ack_deadline_seconds=10)
    admin = bigtable.Client(project=PROJECT, admin=True)
    table = admin.instance(INSTANCE).table(table_id)
    table.create(column_families={"c": column_family.MaxVersionsGCRule(1)})

    started = time.time()
    futures = [publisher.publish(topic, json.dumps({"id": i}).encode())
               for i in range(args.messages)]
    for future in futures:
        future.result()
    print(f"published {args.messages} messages in {time.time() - started:.1f} s")

    statements = f"""
CREATE TABLE pipeline_in (id BIGINT) WITH (connector = 'pubsub', subscription = '{subscription}',
  format = 'json', parallel_pull_count = 2, stop_after_idle = '5s', ack_deadline = '10s');
CREATE TABLE pipeline_bt (id VARCHAR, v VARCHAR) WITH (connector = 'bigtable',
  table = 'projects/{PROJECT}/instances/{INSTANCE}/tables/{table_id}', row_key = 'id',
  column_family = 'c');
INSERT INTO pipeline_bt SELECT CAST(id AS VARCHAR), CAST(id * 2 AS VARCHAR) FROM pipeline_in;
"""
    tool = subprocess.Popen(
        [args.gcp_sql, "--metrics-addr", f"127.0.0.1:{args.port}"],
        stdin=subprocess.PIPE, text=True,
    )
    assert tool.stdin is not None
    tool.stdin.write(statements)
    tool.stdin.flush()
    started = time.time()
    middle = None
    while True:
        try:
            values = scrape(args.port)
        except OSError:
            time.sleep(0.1)
            continue
        acked = values.get("gcp_sql_sink_records_acknowledged_total", 0)
        if middle is None and args.messages * 0.3 <= acked <= args.messages * 0.7:
            middle = (time.time() - started, values)
        if values.get("gcp_sql_statement_running") == 0:
            break
        time.sleep(0.2)
    took = time.time() - started
    after = scrape(args.port)
    tool.stdin.close()
    tool.wait(timeout=60)
    if middle is not None:
        show(f"in the middle, {middle[0]:.1f} s into the run", middle[1])
    show(f"after the end ({took:.1f} s)", after)

    rows = sum(1 for _ in table.read_rows())
    time.sleep(12)  # past the ack deadline: anything unacknowledged is delivered again
    left = 0
    while True:
        answer = subscriber.pull(subscription=subscription, max_messages=1000, timeout=10)
        if not answer.received_messages:
            break
        left += len(answer.received_messages)
        subscriber.acknowledge(subscription=subscription,
                               ack_ids=[m.ack_id for m in answer.received_messages])
    print("== read back with Google's Python clients")
    print(f"  rows in Bigtable (google-cloud-bigtable read_rows): {rows}")
    print(f"  messages left on the subscription (google-cloud-pubsub pull): {left}")
    delivered = after.get("gcp_sql_sink_records_acknowledged_total")
    consumed = after.get("gcp_sql_source_messages_acknowledged_total")
    ok = delivered == rows == args.messages and consumed == args.messages and left == 0
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
