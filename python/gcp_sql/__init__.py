"""Google Cloud Pub/Sub, Cloud Tasks and Bigtable as table sinks in a datafusion-python session.

    import datafusion, gcp_sql
    ctx = datafusion.SessionContext()
    gcp_sql.register(ctx)
    ctx.sql("CREATE EXTERNAL TABLE clicks (user_id BIGINT, url VARCHAR) STORED AS PUBSUB "
            "LOCATION 'projects/demo/topics/clicks' OPTIONS ('auto_create_topic' 'true')")
    ctx.sql("INSERT INTO clicks VALUES (1, 'https://example.com')").collect()

See docs/python.md of the gcp-sql repository.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from . import _native
from ._native import GcpSqlError

__all__ = [
    "GcpSqlError",
    "register",
    "sql",
    "error_from",
    "pubsub_sink",
    "cloud_tasks_sink",
    "bigtable_sink",
    "emulators",
]


def register(ctx: Any) -> None:
    """Installs ``STORED AS PUBSUB | CLOUD_TASKS | BIGTABLE`` into a ``datafusion.SessionContext``."""
    for factory in _native.factories():
        ctx.register_table_factory(factory.stored_as, factory)


def error_from(exception: BaseException) -> GcpSqlError | None:
    """The ``GcpSqlError`` (with its counts) behind an exception datafusion raised, if any.

    An error crosses DataFusion's FFI as text only; the sinks record theirs before it does.
    """
    return _native.error_from(exception)


def sql(ctx: Any, text: str) -> Any:
    """Runs every statement of ``text`` on ``ctx`` and returns the last one's result as a
    ``pyarrow.Table``.

    Accepts the ``CREATE TABLE ... WITH (connector = '...', ...)`` form besides DataFusion's
    own SQL, and raises a sink's failure as ``GcpSqlError`` (with the counts of a failed
    INSERT). ``register(ctx)`` must have been called.
    """
    result = None
    for statement in _native.native_statements(text):
        try:
            result = ctx.sql(statement).to_arrow_table()
        except GcpSqlError:
            raise
        except Exception as exc:  # datafusion raises its own exception types
            own = _native.error_from(exc)
            if own is None:
                raise
            raise own from exc
    return result


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _sink(connector: str, schema: Any, options: dict[str, Any]) -> Any:
    pairs = [(name, _text(value)) for name, value in options.items() if value is not None]
    return _native.sink_table(connector, schema, pairs)


def pubsub_sink(schema: Any, topic: str | None = None, **options: Any) -> Any:
    """A Pub/Sub sink table for ``ctx.register_table``; options as in ``WITH (...)``,
    checked now (a bad one raises ``GcpSqlError`` naming it)."""
    return _sink("pubsub", schema, {"topic": topic, **options})


def cloud_tasks_sink(schema: Any, queue: str | None = None, **options: Any) -> Any:
    """A Cloud Tasks sink table for ``ctx.register_table``; options as in ``WITH (...)``."""
    return _sink("cloud_tasks", schema, {"queue": queue, **options})


def bigtable_sink(schema: Any, table: str | None = None, **options: Any) -> Any:
    """A Bigtable sink table for ``ctx.register_table``; options as in ``WITH (...)``."""
    return _sink("bigtable", schema, {"table": table, **options})


@contextlib.contextmanager
def emulators() -> Iterator[dict[str, str]]:
    """Starts the Pub/Sub, Bigtable and Cloud Tasks emulators on free loopback ports, as
    ``gcp-sql --emulators`` does, points this process at them (``PUBSUB_EMULATOR_HOST``, ...)
    and yields those variables; on exit stops them and restores the environment."""
    running = _native.start_emulators()
    saved = {name: os.environ.get(name) for name, _ in running.env}
    try:
        for name, host in running.env:
            os.environ[name] = host
        yield dict(running.env)
    finally:
        running.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
