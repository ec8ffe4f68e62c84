"""The private wire between the harness (main venv) and the LIBERO server (.venv-libero).

One request, one reply, over a socket pair made by the client and inherited by the server. Frames are those of
`multiprocessing.connection` (length-prefixed); payloads are pickles of plain Python values in which every numpy
array travels as (dtype, shape, bytes), so the two venvs need not share a numpy release (numpy 1 and 2 pickle
arrays under different module names). Both ends are our own processes: nothing else can reach the socket.

A request is {"op": name, **arguments}; a reply {"ok": value} or {"error": message, "kind": category}, where
`kind` is "backend" (the simulator failed: infrastructure) or "argument" (the caller sent something the server
cannot use).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

_ARRAY = "__ndarray__"
PROTOCOL_VERSION = 1


def encode(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        return (_ARRAY, array.dtype.str, array.shape, array.tobytes())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(encode(v) for v in value)
    return value


def decode(value: Any) -> Any:
    if isinstance(value, tuple) and len(value) == 4 and value[0] == _ARRAY:
        _, dtype, shape, data = value
        return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(decode(v) for v in value)
    return value


def dumps(message: dict[str, Any]) -> bytes:
    return pickle.dumps(encode(message), protocol=5)


def loads(data: bytes) -> dict[str, Any]:
    message = pickle.loads(data)
    if not isinstance(message, dict):
        raise ValueError(f"a LIBERO protocol message is a dict, got {type(message).__name__}")
    return decode(message)
