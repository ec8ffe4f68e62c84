"""Small waiting helpers for DDS tests (tests never judge timing; these only bound waits)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def result_of(future, timeout_s: float = 10.0):
    wait_for(future.done, timeout_s, "a future")
    return future.result()
