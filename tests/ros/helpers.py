"""Small waiting helpers for DDS tests (tests never judge timing; these only bound waits)."""

from __future__ import annotations

import subprocess
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


def stop(proc: subprocess.Popen) -> None:
    """Terminate a peer process, killing it if it does not exit in 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
