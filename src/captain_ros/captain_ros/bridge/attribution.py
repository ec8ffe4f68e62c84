"""Which episode and request a chat completion belongs to, from the agent's X-Captain-* headers.

The agent sends `X-Captain-Episode: <episode_id>` and `X-Captain-Request: <t>` (t from 1). A request without
them is served and recorded as request 1 of its own episode `unattributed-<uuid>` (so a plain OpenAI client works
through the recording proxy; the trainer never reads those, as they have no episode_start), or refused with HTTP
400 when the proxy runs with `--require-episode` (what rollouts should use: a forgotten header is a bug).
"""

from __future__ import annotations

import uuid
from http import HTTPStatus
from typing import Any

from captain_ros.bridge.completions import ProxyError

EPISODE_HEADER = "X-Captain-Episode"
REQUEST_HEADER = "X-Captain-Request"


def attribution(headers: Any, require: bool) -> tuple[str, int, bool]:
    """(episode_id, t, attributed) from the X-Captain-* headers; ProxyError(400) when malformed or required."""
    episode, request = headers.get(EPISODE_HEADER), headers.get(REQUEST_HEADER)
    if episode is None and request is None:
        if require:
            raise ProxyError(
                HTTPStatus.BAD_REQUEST,
                f"this recording proxy runs with --require-episode: send headers {EPISODE_HEADER}: <episode_id> "
                f"and {REQUEST_HEADER}: <request number from 1> with every chat completion",
                "invalid_request_error",
            )
        return f"unattributed-{uuid.uuid4().hex}", 1, False
    if episode is None or request is None:
        missing = EPISODE_HEADER if episode is None else REQUEST_HEADER
        raise ProxyError(
            HTTPStatus.BAD_REQUEST,
            f"header {missing} is missing: send both X-Captain headers or neither",
            "invalid_request_error",
        )
    episode = episode.strip()
    if not episode or "/" in episode:
        raise ProxyError(
            HTTPStatus.BAD_REQUEST,
            f"{EPISODE_HEADER} must be a non-empty id without '/', got {episode!r}",
            "invalid_request_error",
        )
    try:
        t = int(request.strip())
    except ValueError:
        t = 0
    if t < 1:
        raise ProxyError(
            HTTPStatus.BAD_REQUEST,
            f"{REQUEST_HEADER} must be the request number, an integer from 1; got {request!r}",
            "invalid_request_error",
        )
    return episode, t, True
