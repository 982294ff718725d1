"""Reads a whole Bigtable table on the emulator with Google's Python client and prints the
rows, cells, rows per second and its own CPU seconds: the baseline the scan benchmark of docs/benchmarks.md
compares `SELECT` with.

    BIGTABLE_EMULATOR_HOST=127.0.0.1:PORT python scripts/bigtable_read_python.py \
        projects/P/instances/I/tables/T

Needs `pip install google-cloud-bigtable`. It reads the latest version of every cell (the
same filter as the scan), one stream, as the client's `read_rows` does by default.
"""

import sys
import time

from google.cloud import bigtable
from google.cloud.bigtable import row_filters


def main() -> None:
    name = sys.argv[1]
    _, project, _, instance, _, table_id = name.split("/")
    client = bigtable.Client(project=project, admin=False)
    table = client.instance(instance).table(table_id)
    start = time.perf_counter()
    cpu = time.process_time()
    rows = cells = 0
    for row in table.read_rows(filter_=row_filters.CellsColumnLimitFilter(1)):
        rows += 1
        for columns in row.cells.values():
            for versions in columns.values():
                cells += len(versions)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    print(
        f"python: rows={rows} cells={cells} seconds={elapsed:.2f} rows_per_s={rows / elapsed:.0f} "
        f"cpu_seconds={cpu:.1f}"
    )


if __name__ == "__main__":
    main()
