"""Latency at a low rate: gcp-sql (a FIFO read as an UNBOUNDED CSV table, INSERT into a Pub/Sub
topic) against Google's Python publisher at its default settings, both into the same Pub/Sub
emulator and measured by the same subscriber (docs/benchmarks.md, "Latency at low rates").

    python scripts/latency_low_rate.py [--bin target/release/gcp-sql] [--rate 200]
        [--seconds 20] [--runs 3] [--warmup 1] [-- extra sink options, e.g. batch_delay_threshold=1ms]

Each line carries its send time (wall clock, ns) and goes out on a fixed schedule of `rate`
lines a second (one at a time, not in bursts). For gcp-sql a generator writes the lines into a
FIFO that the tool reads (`SET datafusion.execution.batch_size = 1`, the sink at its defaults
plus any `key=value` given after `--`); for the Python publisher the same JSON objects are
published one by one with `PublisherClient().publish` (BatchSettings and PublisherOptions at
their defaults: max_messages 100, max_bytes 1,000,000, max_latency 10 ms). A subscriber in its
own process (streaming pull, `SubscriberClient.subscribe`, defaults) records receive time minus
send time for every message. The first `warmup` seconds of each run are left out (connection
set-up). Runs alternate between the two sides; each run prints p50/p90/p99/max in ms and the
machine's load average, and the end prints the medians over the runs.

Uses $PUBSUB_EMULATOR_HOST when it is set, else starts one with `gcp-sql emulators`.
Needs google-cloud-pubsub.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

PROJECT = "latency"


def percentile(values, p):
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def subscriber_main(subscription, expected, out_path, deadline_s):
    """Child process: streaming pull, one latency (ns) per message, written to out_path."""
    from google.cloud import pubsub_v1

    subscriber = pubsub_v1.SubscriberClient()
    lat = {}
    lock = threading.Lock()
    done = threading.Event()

    def callback(message):
        now = time.time_ns()
        body = json.loads(message.data)
        message.ack()
        with lock:
            lat[body["id"]] = now - body["sent"]
            if len(lat) >= expected:
                done.set()

    future = subscriber.subscribe(subscription, callback)
    print("ready", flush=True)
    done.wait(deadline_s)
    future.cancel()
    with open(out_path, "w") as f:
        json.dump(lat, f)


def schedule(rate, seconds, emit):
    """Calls emit(i, sent_ns) for i in 1..rate*seconds, one every 1/rate s on a fixed grid."""
    n = int(rate * seconds)
    start = time.monotonic()
    for i in range(1, n + 1):
        due = start + (i - 1) / rate
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        emit(i, time.time_ns())
    return n


PAD = "x" * 100


def line_json(i, sent):
    return json.dumps({"id": i, "sent": sent, "pad": PAD}, separators=(",", ":"))


def start_subscriber(admin_pub, admin_sub, topic, expected, tmp, deadline_s):
    sub = f"projects/{PROJECT}/subscriptions/s-{uuid.uuid4().hex[:8]}"
    admin_sub.create_subscription(name=sub, topic=topic)
    out = os.path.join(tmp, f"{sub.rsplit('/', 1)[1]}.json")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--subscriber", sub, str(expected), out, str(deadline_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # let the stream open
    return proc, out, sub


def finish_subscriber(proc, out, admin_sub, sub, warmup_ids):
    proc.wait()
    with open(out) as f:
        lat = {int(k): v for k, v in json.load(f).items()}
    admin_sub.delete_subscription(subscription=sub)
    kept = [v / 1e6 for k, v in lat.items() if k > warmup_ids]
    return kept, len(lat)


def run_gcp_sql(args, admin_pub, admin_sub, tmp, n_run):
    topic = f"projects/{PROJECT}/topics/g-{n_run}-{uuid.uuid4().hex[:6]}"
    admin_pub.create_topic(name=topic)
    n = int(args.rate * args.seconds)
    proc, out, sub = start_subscriber(admin_pub, admin_sub, topic, n, tmp, args.seconds + 30)
    fifo = os.path.join(tmp, f"lines-{n_run}.csv")
    os.mkfifo(fifo)
    extra = "".join(f", {k} = '{v}'" for k, v in (o.split("=", 1) for o in args.sink_options))
    env = dict(os.environ)
    tool = subprocess.Popen(
        [
            args.bin,
            "-c", "SET datafusion.execution.batch_size = 1",
            "-c", f"CREATE UNBOUNDED EXTERNAL TABLE lines (id BIGINT, sent BIGINT, pad VARCHAR) "
                  f"STORED AS CSV LOCATION '{fifo}' OPTIONS ('format.has_header' 'false')",
            "-c", f"CREATE TABLE out (id BIGINT, sent BIGINT, pad VARCHAR) WITH (connector = "
                  f"'pubsub', topic = '{topic}'{extra})",
            "-c", "INSERT INTO out SELECT id, sent, pad FROM lines",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(tmp, f"tool-{n_run}.err"), "w"),
        env=env,
    )
    with open(fifo, "w", buffering=1) as f:  # line-buffered: each line is its own write
        schedule(args.rate, args.seconds, lambda i, t: f.write(f"{i},{t},{PAD}\n"))
    rc = tool.wait()
    if rc != 0:
        print(open(os.path.join(tmp, f"tool-{n_run}.err")).read(), file=sys.stderr)
        raise SystemExit(f"gcp-sql exited with {rc}")
    return finish_subscriber(proc, out, admin_sub, sub, int(args.rate * args.warmup))


def run_python(args, admin_pub, admin_sub, tmp, n_run):
    from google.cloud import pubsub_v1

    topic = f"projects/{PROJECT}/topics/p-{n_run}-{uuid.uuid4().hex[:6]}"
    admin_pub.create_topic(name=topic)
    n = int(args.rate * args.seconds)
    proc, out, sub = start_subscriber(admin_pub, admin_sub, topic, n, tmp, args.seconds + 30)
    publisher = pubsub_v1.PublisherClient()  # default BatchSettings and PublisherOptions
    futures = []
    schedule(
        args.rate,
        args.seconds,
        lambda i, t: futures.append(publisher.publish(topic, line_json(i, t).encode())),
    )
    for fut in futures:
        fut.result()
    publisher.stop()
    return finish_subscriber(proc, out, admin_sub, sub, int(args.rate * args.warmup))


def start_emulator(bin_path):
    proc = subprocess.Popen([bin_path, "emulators"], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.match(r"export PUBSUB_EMULATOR_HOST=(\S+)", line.strip())
        if m:
            return proc, m.group(1)
    proc.terminate()
    raise SystemExit("the Pub/Sub emulator did not start")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--subscriber":
        subscriber_main(sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default="target/release/gcp-sql")
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=1)
    parser.add_argument("sink_options", nargs="*", help="key=value sink options for gcp-sql")
    args = parser.parse_args()

    emulator = None
    if not os.environ.get("PUBSUB_EMULATOR_HOST"):
        emulator, host = start_emulator(args.bin)
        os.environ["PUBSUB_EMULATOR_HOST"] = host
    print(f"emulator {os.environ['PUBSUB_EMULATOR_HOST']}, {args.bin}, {args.rate:g} lines/s "
          f"for {args.seconds:g} s, first {args.warmup:g} s left out, sink options "
          f"{args.sink_options or 'defaults'}")
    from google.cloud import pubsub_v1

    admin_pub = pubsub_v1.PublisherClient()
    admin_sub = pubsub_v1.SubscriberClient()
    results = {"gcp-sql": [], "python": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(1, args.runs + 1):
                for side, fn in (("gcp-sql", run_gcp_sql), ("python", run_python)):
                    load = os.getloadavg()
                    kept, got = fn(args, admin_pub, admin_sub, tmp, r)
                    p = [percentile(kept, q) for q in (50, 90, 99, 100)]
                    results[side].append(p)
                    print(f"run {r} {side:8} p50 {p[0]:6.2f}  p90 {p[1]:6.2f}  p99 {p[2]:6.2f}  "
                          f"max {p[3]:7.2f} ms  ({got} received, {len(kept)} measured; "
                          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})", flush=True)
    finally:
        if emulator:
            emulator.terminate()
            emulator.wait()
    for side, rows in results.items():
        med = [statistics.median(col) for col in zip(*rows)]
        print(f"median {side:8} p50 {med[0]:6.2f}  p90 {med[1]:6.2f}  p99 {med[2]:6.2f}  "
              f"max {med[3]:7.2f} ms")


if __name__ == "__main__":
    main()
