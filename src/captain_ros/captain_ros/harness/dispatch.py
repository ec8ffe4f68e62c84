"""Running one capability handler the same way everywhere (harness, perception node): validated
arguments, known failures keep their category, nothing raises."""

from __future__ import annotations

import inspect
import time
import traceback
from typing import Any

from captain_ros.core.contract import CallFailure, CallResult, FailureCategory
from captain_ros.harness.args import ArgumentError, no_extra
from captain_ros.harness.backend import BackendError


def dispatch(capability: str, kwargs: dict[str, Any], handler: Any, known: list[str]) -> CallResult:
    """Run one capability handler; never raises. Known failures keep their category, anything else
    is reported as an internal backend_error with a short traceback in the diagnostics."""
    t0 = time.monotonic()
    try:
        if handler is None:
            raise ArgumentError(f"unknown capability {capability!r}; this server offers: {', '.join(sorted(known))}")
        no_extra(capability, kwargs, set(inspect.signature(handler).parameters))
        result = handler(**kwargs)
    except CallFailure as exc:
        result = CallResult.fail(capability, exc.category, str(exc))
    except BackendError as exc:
        result = CallResult.fail(capability, FailureCategory.BACKEND_ERROR, str(exc))
    except Exception as exc:
        result = CallResult.fail(
            capability,
            FailureCategory.BACKEND_ERROR,
            f"internal error {type(exc).__name__}: {exc}",
            diagnostics={"traceback": traceback.format_exc(limit=5)},
        )
    result.duration_s = time.monotonic() - t0
    return result
