"""Google Cloud Pub/Sub, Cloud Tasks and Bigtable as table sinks, and Pub/Sub subscriptions as
sources, in a datafusion-python session.

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
import weakref
from typing import Any, Callable, Iterator

from . import _native
from ._native import GcpSqlError, SinkTable

__all__ = [
    "GcpSqlError",
    "SinkTable",
    "register",
    "sql",
    "last_report",
    "error_from",
    "pubsub_sink",
    "cloud_tasks_sink",
    "bigtable_sink",
    "emulators",
    "stop",
    "rearm",
    "serve_metrics",
]


# The package's own session of each registered context (gcp_sql._native.Session): it holds
# the tables the factories declared for that context, and runs an INSERT that reads a
# subscription (docs/adr/0067).
_sessions: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def register(ctx: Any) -> None:
    """Installs ``STORED AS PUBSUB | CLOUD_TASKS | BIGTABLE`` (sinks, and Pub/Sub subscriptions
    as sources) into a ``datafusion.SessionContext``."""
    session = _native.Session()
    _sessions[ctx] = session
    for factory in session.factories():
        ctx.register_table_factory(factory.stored_as, factory)


def last_report(ctx: Any) -> dict[str, int] | None:
    """The report of the last INSERT that read a subscription ``gcp_sql.sql`` ran on ``ctx``
    (also when it failed): each metric summed over its plan, the sink's (``records_sent``,
    ``records_acked``, ``records_dropped``, ...) and the source's (``source_messages_read``,
    ``source_messages_acked``, ``source_messages_nacked``). ``None`` before the first."""
    session = _sessions.get(ctx)
    report = session.last_report() if session is not None else None
    return dict(report) if report is not None else None


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

    An INSERT that reads a subscription (and an ``EXPLAIN`` of one) is planned and run by the
    package itself, as the ``gcp-sql`` tool runs it, so that a message is acknowledged only
    after every row made from it landed; ``last_report(ctx)`` then has its counts.

    Ctrl-C while an INSERT writes to a sink stops it as the ``gcp-sql`` tool does: the first
    drains it (no more input is read, everything admitted is delivered; a subscription stops
    reading and acknowledges what landed) and the statement returns its count; a second
    aborts it; a third gives up waiting and raises ``KeyboardInterrupt``.
    """
    result = None
    session = _sessions.get(ctx)
    for statement in _native.native_statements(text):
        try:
            result = _run(_runner(ctx, session, statement))
        except GcpSqlError:
            raise
        except Exception as exc:  # datafusion raises its own exception types
            own = _native.error_from(exc)
            if own is None:
                raise
            raise own from exc
    return result


def _runner(ctx: Any, session: Any, statement: str) -> Callable[[], Any]:
    """How one statement runs: an INSERT that reads a subscription of this context in the
    package's session, anything else in ``ctx``."""
    tables = session.pipeline_tables(statement) if session is not None else None
    if tables is not None and all(ctx.table_exist(name) for name in tables):
        return lambda: _arrow(session.run(statement))
    return lambda: ctx.sql(statement).to_arrow_table()


def _arrow(columns: list[tuple[str, list[Any], bool]]) -> Any:
    import pyarrow

    return pyarrow.table(
        {
            name: pyarrow.array(values, pyarrow.uint64() if is_count else pyarrow.string())
            for name, values, is_count in columns
        }
    )


def _run(work_of: Callable[[], Any]) -> Any:
    """One statement, in a worker thread, so that Ctrl-C reaches this thread as a stop
    request instead of dropping the statement in the middle."""
    outcome: dict[str, Any] = {}
    # An Event, not Thread.join: a join that Ctrl-C interrupts may mark a running thread as
    # ended (CPython 3.11).
    done = threading.Event()

    def work() -> None:
        try:
            outcome["result"] = work_of()
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


def serve_metrics(address: str = "127.0.0.1:9464") -> Any:
    """Serves Prometheus metrics of every INSERT of this process at
    ``http://ADDRESS/metrics``, and ``/healthz`` and ``/readyz``, as ``gcp-sql --metrics-addr``
    does. ``address`` is ``HOST:PORT`` (port 0 picks a free one: read ``.address``); a bad or
    busy one raises ``GcpSqlError`` naming it. The endpoint runs until ``.stop()`` is called or
    the returned object is garbage-collected."""
    return _native.serve_metrics(address)


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
