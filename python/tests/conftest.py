"""Fixtures: the real emulators (started once per session by gcp_sql.emulators()) and
Google's own Python clients pointed at them, to read back what the sinks wrote."""

from __future__ import annotations

import json
import os
import uuid

import datafusion
import grpc
import pytest

import gcp_sql

PROJECT = "demo"


@pytest.fixture(scope="session")
def emulator_env():
    with gcp_sql.emulators() as env:
        yield env


@pytest.fixture
def ctx(emulator_env):
    ctx = datafusion.SessionContext()
    gcp_sql.register(ctx)
    return ctx


@pytest.fixture
def unique():
    return uuid.uuid4().hex[:10]


@pytest.fixture
def pubsub(emulator_env):
    from google.cloud import pubsub_v1

    class PubSub:
        publisher = pubsub_v1.PublisherClient()
        subscriber = pubsub_v1.SubscriberClient()

        def topic_with_subscription(self, name):
            topic = f"projects/{PROJECT}/topics/{name}"
            sub = f"projects/{PROJECT}/subscriptions/{name}"
            self.publisher.create_topic(name=topic)
            self.subscriber.create_subscription(name=sub, topic=topic)
            return topic, sub

        def publish_json(self, topic, rows):
            """Publishes each row as one JSON message and waits until every one is published."""
            futures = [self.publisher.publish(topic, json.dumps(row).encode()) for row in rows]
            for future in futures:
                future.result()

        def is_empty(self, sub):
            """Whether one pull, waiting up to 10 s for a message, brings none (it acknowledges
            what it brings)."""
            return not self.pull_once(sub)

        def pull_once(self, sub):
            """One pull of up to 1,000 messages, acknowledged; its received messages."""
            resp = self.subscriber.pull(subscription=sub, max_messages=1000, timeout=10)
            if resp.received_messages:
                self.subscriber.acknowledge(
                    subscription=sub,
                    ack_ids=[m.ack_id for m in resp.received_messages],
                )
            return resp.received_messages

        def pull_all(self, sub, expected):
            """Pulls (and acknowledges) until `expected` messages came, or three pulls in a
            row brought none."""
            got, empty = [], 0
            while len(got) < expected and empty < 3:
                received = self.pull_once(sub)
                if not received:
                    empty += 1
                    continue
                empty = 0
                got.extend(m.message for m in received)
            return got

    return PubSub()


@pytest.fixture
def bigtable(emulator_env):
    from google.cloud import bigtable
    from google.cloud.bigtable import column_family

    client = bigtable.Client(project=PROJECT, admin=True)
    instance = client.instance("main")

    class Bigtable:
        def table(self, name, families=("cf",)):
            table = instance.table(name)
            table.create(column_families={f: column_family.MaxVersionsGCRule(1) for f in families})
            return table, f"projects/{PROJECT}/instances/main/tables/{name}"

    return Bigtable()


@pytest.fixture
def cloud_tasks(emulator_env):
    from google.cloud import tasks_v2
    from google.cloud.tasks_v2.services.cloud_tasks.transports import CloudTasksGrpcTransport

    host = os.environ["CLOUD_TASKS_EMULATOR_HOST"]
    client = tasks_v2.CloudTasksClient(
        transport=CloudTasksGrpcTransport(channel=grpc.insecure_channel(host))
    )

    class CloudTasks:
        def queue(self, name):
            parent = f"projects/{PROJECT}/locations/here"
            queue = f"{parent}/queues/{name}"
            client.create_queue(parent=parent, queue={"name": queue})
            # Paused, so that the emulator keeps the tasks (it calls a running queue's URLs).
            client.pause_queue(name=queue)
            return queue

        def tasks(self, queue):
            request = {"parent": queue, "response_view": tasks_v2.Task.View.FULL}
            return list(client.list_tasks(request=request))

    return CloudTasks()
