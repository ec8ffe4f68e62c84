"""Fixtures of the workspace tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .nodes import NodeProcess


@pytest.fixture
def node_processes() -> Iterator[list[NodeProcess]]:
    """Append started nodes here; whatever is still running at the end is stopped."""
    started: list[NodeProcess] = []
    yield started
    for node in started:
        node.stop()
