"""Fixtures of the recording proxy's tests (test_proxy, test_completions, test_sse, test_images,
test_attribution): the fake upstream, the proxy in front of it, an HTTP client and readers of the proxy's store;
and of the transport's (test_transport, test_shipper, test_receiver): child processes, a receiver in a thread, a bare
client of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from captain_ros.bridge.proxy import ProxyConfig, start_proxy
from captain_ros.bridge.services import free_port
from captain_ros.bridge.store import EpisodeReader
from tests.captain_ros.bridge.fake_vllm import DEADLINE_S, FakeVllm
from tests.captain_ros.bridge.transport_helpers import Client, Processes, ReceiverThread, config


@pytest.fixture
def fake():
    upstream = FakeVllm()
    try:
        yield upstream
    finally:
        upstream.close()


@pytest.fixture
def store_path(tmp_path) -> Path:
    return tmp_path / "episodes.sqlite"


@pytest.fixture
def proxy(fake, store_path):
    handle = start_proxy(ProxyConfig(upstream_url=fake.base_url, store_path=str(store_path), policy_version=2))
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture
def http():
    with httpx.Client(trust_env=False, timeout=DEADLINE_S) as client:
        yield client


@pytest.fixture
def reader(store_path):
    def open_reader() -> EpisodeReader:
        opened.append(EpisodeReader(store_path))
        return opened[-1]

    opened: list[EpisodeReader] = []
    yield open_reader
    for r in opened:
        r.close()


# ------------------------------------------------------------------------------------------------ transport
@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    p = Processes(tmp_path)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[ReceiverThread]:
    r = ReceiverThread(tmp_path / "inbox.sqlite", config(free_port()))
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def client(receiver: ReceiverThread) -> Iterator[Client]:
    c = Client(receiver.receiver.endpoint)
    try:
        yield c
    finally:
        c.close()
