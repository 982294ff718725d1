from contextlib import AbstractContextManager
from typing import Any

import pyarrow

class GcpSqlError(Exception):
    """A sink's error: a bad option or column, or a failed INSERT."""

    acknowledged: int | None
    """Rows the service acknowledged before a failed INSERT ended (None: not an INSERT)."""
    not_delivered: int | None
    """Admitted rows neither acknowledged, dropped, dead-lettered, nor refused."""
    dead_lettered: int | None
    """Rows stored in the dead-letter destination."""

class SinkTable:
    """A sink table for ``SessionContext.register_table``."""

    @property
    def connector(self) -> str: ...
    def __datafusion_table_provider__(self, session: Any) -> object: ...

def register(ctx: Any) -> None: ...
def sql(ctx: Any, text: str) -> pyarrow.Table | None: ...
def error_from(exception: BaseException) -> GcpSqlError | None: ...
def pubsub_sink(schema: pyarrow.Schema, topic: str | None = None, **options: Any) -> SinkTable: ...
def cloud_tasks_sink(
    schema: pyarrow.Schema, queue: str | None = None, **options: Any
) -> SinkTable: ...
def bigtable_sink(schema: pyarrow.Schema, table: str | None = None, **options: Any) -> SinkTable: ...
def emulators() -> AbstractContextManager[dict[str, str]]: ...
