"""Running one capability handler the same way everywhere (harness, perception node): validated
arguments, known failures keep their category, nothing raises."""

from __future__ import annotations

import inspect
import time
import traceback
from typing import Any

from captain_ros.core.args import ArgumentError, no_extra
from captain_ros.core.contract import CallFailure, CallResult, FailureCategory
from captain_ros.harness.backend import BackendError


def _check_text(kwargs: dict[str, Any]) -> None:
    """Every string in the arguments (names included, at any depth) must be text that can go on the wire:
    JSON may carry lone surrogates ("\\udc00") that no UTF-8 string field (a receipt, a marker label)
    can hold. Iterative: JSON nests as deep as its parser allows."""
    stack: list[tuple[str, Any]] = [(f"the argument name {k!r}", k) for k in kwargs] + list(kwargs.items())
    while stack:
        name, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ArgumentError(
                    f"{name} holds a lone surrogate {value[exc.start]!r} at index {exc.start}: not Unicode text"
                ) from None
        elif isinstance(value, dict):
            stack += [(f"a key of {name}", k) for k in value] + [(f"{name}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, list | tuple):
            stack += [(f"{name}[{i}]", v) for i, v in enumerate(value)]


def dispatch(capability: str, kwargs: dict[str, Any], handler: Any, known: list[str]) -> CallResult:
    """Run one capability handler; never raises. Known failures keep their category, anything else
    is reported as an internal backend_error with a short traceback in the diagnostics."""
    t0 = time.monotonic()
    try:
        if handler is None:
            raise ArgumentError(f"unknown capability {capability!r}; this server offers: {', '.join(sorted(known))}")
        no_extra(capability, kwargs, set(inspect.signature(handler).parameters))
        _check_text(kwargs)
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
