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
import threading
from typing import Any, Iterator

from . import _native
from ._native import GcpSqlError, SinkTable

__all__ = [
    "GcpSqlError",
    "SinkTable",
    "register",
    "sql",
    "error_from",
    "pubsub_sink",
    "cloud_tasks_sink",
    "bigtable_sink",
    "emulators",
    "stop",
    "rearm",
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

    Ctrl-C while an INSERT writes to a sink stops it as the ``gcp-sql`` tool does: the first
    drains it (no more input is read, everything admitted is delivered) and the statement
    returns its count; a second aborts it; a third gives up waiting and raises
    ``KeyboardInterrupt``.
    """
    result = None
    for statement in _native.native_statements(text):
        try:
            result = _run(ctx, statement)
        except GcpSqlError:
            raise
        except Exception as exc:  # datafusion raises its own exception types
            own = _native.error_from(exc)
            if own is None:
                raise
            raise own from exc
    return result


def _run(ctx: Any, statement: str) -> Any:
    """One statement, in a worker thread, so that Ctrl-C reaches this thread as a stop
    request instead of dropping the statement in the middle."""
    outcome: dict[str, Any] = {}
    # An Event, not Thread.join: a join that Ctrl-C interrupts may mark a running thread as
    # ended (CPython 3.11).
    done = threading.Event()

    def work() -> None:
        try:
            outcome["result"] = ctx.sql(statement).to_arrow_table()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=work, name="gcp_sql statement", daemon=True)
    worker.start()
    interrupts = 0
    try:
        while not done.is_set():
            try:
                done.wait(0.1)
            except KeyboardInterrupt:
                interrupts += 1
                if interrupts == 1 and _native.running_writers() == 0:
                    raise  # no sink is writing: nothing to drain
                if interrupts >= 3:
                    raise
                _native.stop("drain" if interrupts == 1 else "abort")
    finally:
        if interrupts:
            _native.rearm()
    if "error" in outcome:
        # Without the worker's frames: one of them holds the statement's DataFrame, whose repr
        # runs the query, so a tool that prints a traceback's locals (pytest, an error
        # reporter) would run the failed INSERT again, with no stop to end it.
        raise outcome["error"].with_traceback(None)
    return outcome["result"]


def stop(abort: bool = False) -> None:
    """Asks every INSERT into a sink running in this process to stop: drain it (read no more
    input, deliver what was admitted; it then returns its count), or with ``abort=True`` stop
    it at once. INSERTs started later stop as well until ``rearm()``."""
    _native.stop("abort" if abort else "drain")


def rearm() -> None:
    """Clears a ``stop()`` request for the INSERTs that start from now on."""
    _native.rearm()


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
