"""Stopping a running INSERT from a test (the stop tests of test_sinks.py and
test_sources.py), with a bound that turns a missed stop into a failure instead of a hang."""

from __future__ import annotations

import threading
import time
from typing import Callable

import gcp_sql

# How long a stopped INSERT may take to return before the test calls it a hang: a drain
# delivers only what was admitted (a few thousand rows), so this is a liveness bound, far from
# any speed. Without it a missed stop writes 50,000,000 rows into the emulator, which runs out
# of heap and leaves the suite waiting.
STOP_BOUND_S = 120


def when_writing(
    action: Callable[[], None],
    returned: threading.Event,
    ready: Callable[[], bool] | None = None,
) -> list[str]:
    """Runs `action` once the INSERT writes (a second after its writers started, or, with
    `ready`, once that says so); if the statement has not returned (`returned` is set)
    `STOP_BOUND_S` after it, aborts it and returns what was seen, so the test fails naming the
    hang instead of waiting for it."""
    hung: list[str] = []

    def wait_then_act():
        while gcp_sql._native.running_writers() == 0:
            time.sleep(0.05)
        if ready is None:
            time.sleep(1.0)
        else:
            while not ready():
                time.sleep(0.05)
        action()
        if not returned.wait(STOP_BOUND_S):
            hung.append(
                f"the INSERT had not returned {STOP_BOUND_S} s after the stop "
                f"({gcp_sql._native.running_writers()} writer(s) running); aborted"
            )
            gcp_sql.stop(abort=True)

    threading.Thread(target=wait_then_act, daemon=True).start()
    return hung
