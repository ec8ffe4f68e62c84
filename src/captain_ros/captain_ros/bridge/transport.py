"""Ship episode records from rollout hosts to the trainer over ZeroMQ, losing nothing and storing nothing twice.

A `Shipper` on each rollout host reads its local `EpisodeStore` (the outbox) and streams every record that the
trainer has not acknowledged, each preceded by the image blobs it references, to the trainer's `Receiver`,
which checks each message and writes it into its own `EpisodeStore`.

Why it cannot lose or duplicate a record:
  * The receiver acknowledges a message only after the store's transaction committed (WAL, synchronous=FULL),
    and the shipper marks a record acknowledged in its outbox (`mark_acked`, itself a committed transaction)
    only after that acknowledgement arrives. Whoever is killed at whatever instant, an acknowledged record is on
    the trainer's disk, and an unacknowledged one is still in the outbox and will be sent again.
  * Anything unacknowledged is retransmitted after `ack_timeout_s`, at once after a reconnect, and from the
    outbox when a shipper restarts. Retransmission makes duplicates; the receiver makes them harmless: a record
    id is a unique key, an exact duplicate is acknowledged again without being stored, and the same id with
    different content is refused as a conflict.
  * Every message carries the SHA-256 and size of its payload, which the receiver recomputes, then validates
    the record against the schema; anything malformed, truncated or altered is refused with a reason and never
    stored. A record whose referenced images the receiver lacks is refused as `missing_blob` and the shipper
    sends those blobs again first (this is what happens after the trainer moves to a fresh store).
  * A full trainer disk (`StoreFull`) is refused as `store_full`: the shipper keeps the records, holds all
    sending and retries with exponential backoff, and says so loudly on both sides.

Why these sockets: DEALER (one per shipper process) -> ROUTER (the receiver) is asynchronous request/reply, so
a shipper keeps `window` messages in flight instead of waiting out one round trip per record. That window is
the backpressure: the shipper reads no further from its outbox until acknowledgements come back. Below it the
high-water marks are set explicitly on both sockets (`hwm`), and the shipper's socket queues only to a live
connection (ZMQ_IMMEDIATE), so while the trainer is down nothing piles up in memory: the outbox is the queue.
ZeroMQ heartbeats notice a peer that vanished without closing its TCP connection (a dead host).

Frames (protocol "captain/1"; every header is a JSON object):
  request  [b"captain/1", b"record", {episode_id, kind, index, sha256, size}, canonical payload JSON]
           [b"captain/1", b"blob",   {sha256, media_type, size},                blob bytes]
  reply    [b"captain/1", b"ack" | b"nack", {items: [record id | "blob:<sha256>"], code, reason, missing}]
Nack codes: malformed, conflict (both final: the shipper parks the item until it restarts), store_full,
store_error, missing_blob, internal (all retried).

The receiver binds loopback unless told otherwise (`allow_remote`); a shipper connects anywhere (TCP across
hosts). `python -m captain_ros.bridge.transport receive|ship ...` runs either side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import random
import signal
import socket
import sqlite3
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from captain_ros.bridge.schema import Record, SchemaError, from_wire, record_id, sha256
from captain_ros.bridge.services import free_port
from captain_ros.bridge.store import IMAGE_REF, EpisodeStore, RecordConflict, StoreError, StoreFull

log = logging.getLogger(__name__)

PROTOCOL = b"captain/1"
RECORD, BLOB, ACK, NACK = b"record", b"blob", b"ack", b"nack"

# nack codes
MALFORMED = "malformed"  # bad frames, header, size, digest, JSON or schema: never stored
CONFLICT = "conflict"  # a different record with this id is stored: refused
STORE_FULL = "store_full"  # the trainer's disk or quota is full: retry later
STORE_ERROR = "store_error"  # another store failure (I/O, locked): retry later
MISSING_BLOB = "missing_blob"  # the record references images the receiver lacks: send them first
INTERNAL = "internal"  # a bug in the receiver (logged with a traceback): retry later
FINAL_CODES = (MALFORMED, CONFLICT)
NACK_CODES = (MALFORMED, CONFLICT, STORE_FULL, STORE_ERROR, MISSING_BLOB, INTERNAL)

LOOPBACK_HOSTS = ("localhost", "::1", "lo")
ACK_FLUSH_S = 0.05  # the shipper records acknowledgements in its outbox at least this often


@dataclass(frozen=True)
class TransportConfig:
    """Settings shared by both ends (each uses the ones that concern it)."""

    endpoint: str = field(
        default="tcp://127.0.0.1:5557",
        metadata={"help": "ZeroMQ endpoint: the receiver binds it, the shipper connects to it"},
    )
    allow_remote: bool = field(
        default=False,
        metadata={"help": "let the receiver bind a non-loopback interface (accept records from other hosts)"},
    )
    window: int = field(default=64, metadata={"help": "shipper: most messages in flight without an ack"})
    hwm: int = field(default=1000, metadata={"help": "ZeroMQ send and receive high-water marks, in messages"})
    ack_timeout_s: float = field(default=5.0, metadata={"help": "shipper: resend a message unacknowledged this long"})
    backoff_initial_s: float = field(
        default=0.5, metadata={"help": "shipper: first wait after a store_full/store_error nack (doubles each time)"}
    )
    backoff_max_s: float = field(default=30.0, metadata={"help": "shipper: longest wait between retries"})
    poll_interval_s: float = field(default=0.2, metadata={"help": "shipper: how often an idle outbox is re-read"})
    linger_s: float = field(default=1.0, metadata={"help": "how long closing a socket may wait to flush it"})
    heartbeat_ivl_s: float = field(default=1.0, metadata={"help": "ZeroMQ heartbeat interval on the connection"})
    heartbeat_timeout_s: float = field(
        default=10.0, metadata={"help": "drop (and re-establish) a connection whose peer is silent this long"}
    )
    reconnect_ivl_max_s: float = field(default=2.0, metadata={"help": "shipper: longest wait between reconnects"})
    max_message_bytes: int = field(
        default=256 * 2**20, metadata={"help": "largest message part accepted or sent, in bytes"}
    )
    name: str = field(default="", metadata={"help": "shipper name in logs; '' = <hostname>-<pid>"})


class TransportError(RuntimeError):
    """The transport could not start (bad endpoint, address in use)."""


def check_bind_endpoint(endpoint: str, allow_remote: bool) -> str:
    """Refuse a receiver endpoint that would listen beyond this host unless `allow_remote` says so."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc", "inproc"):
        raise ValueError(f"endpoint {endpoint!r} is not tcp://HOST:PORT, ipc://PATH or inproc://NAME")
    if scheme != "tcp":
        return endpoint
    host, _, port = rest.rpartition(":")
    if not host or not (port == "*" or port.isdigit()):
        raise ValueError(f"endpoint {endpoint!r} needs a host and a port, e.g. tcp://127.0.0.1:5557")
    host = host.strip("[]")
    if not (host in LOOPBACK_HOSTS or host.startswith("127.")) and not allow_remote:
        raise ValueError(
            f"binding {endpoint} would accept records from other hosts; the receiver binds loopback by default. "
            "Pass --allow-remote (TransportConfig(allow_remote=True)) to listen there on purpose."
        )
    return endpoint


def blob_refs(record: Record) -> list[str]:
    """SHA-256 of every image blob a record references (image_ref parts of model_call messages, step images)."""
    refs: list[str] = []
    payload = record.payload
    if record.kind == "model_call":
        for message in payload.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and part.get("type") == IMAGE_REF and isinstance(part.get("sha256"), str):
                        refs.append(part["sha256"])
    elif record.kind == "step":
        images = payload.get("images")
        for image in images if isinstance(images, list) else []:
            if isinstance(image, dict) and isinstance(image.get("sha256"), str):
                refs.append(image["sha256"])
    return list(dict.fromkeys(refs))


def record_frames(record: Record, data: bytes, digest: str) -> list[bytes]:
    header = {"episode_id": record.episode_id, "kind": record.kind, "index": record.index}
    header |= {"sha256": digest, "size": len(data)}
    return [PROTOCOL, RECORD, json.dumps(header).encode(), data]


def blob_frames(digest: str, data: bytes, media_type: str) -> list[bytes]:
    header = {"sha256": digest, "media_type": media_type, "size": len(data)}
    return [PROTOCOL, BLOB, json.dumps(header).encode(), data]


def blob_item(digest: str) -> str:
    return f"blob:{digest}"


def _configure(sock: zmq.Socket, config: TransportConfig) -> None:
    sock.setsockopt(zmq.SNDHWM, config.hwm)
    sock.setsockopt(zmq.RCVHWM, config.hwm)
    sock.setsockopt(zmq.LINGER, int(config.linger_s * 1000))
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(config.heartbeat_ivl_s * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(config.heartbeat_timeout_s * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TTL, int(config.heartbeat_timeout_s * 1000))
    sock.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)


# ================================================================================================ receiver
@dataclass
class _Reply:
    ok: bool
    items: list[str]
    code: str = ""
    reason: str = ""
    missing: list[str] = field(default_factory=list)


class Receiver:
    """The trainer side: validates each message, stores it, and acknowledges only what its store committed."""

    def __init__(self, store_path: str | Path, config: TransportConfig = TransportConfig()):
        check_bind_endpoint(config.endpoint, config.allow_remote)
        self.config = config
        self.store = EpisodeStore(store_path)
        self.endpoint = ""  # the bound endpoint (a tcp://...:* port resolved) once serving
        self._stats: dict[str, Any] = {
            "messages": 0,  # received
            "answered": 0,  # replied to (messages - answered = the one being handled, if any)
            "bytes": 0,
            "records_stored": 0,
            "records_duplicate": 0,
            "blobs_stored": 0,
            "blobs_duplicate": 0,
            **{code: 0 for code in NACK_CODES},
            "replies_undeliverable": 0,
            "last_nack": None,
        }

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        return dict(self._stats)

    def serve(self, stop: threading.Event, ready: Any = None) -> dict[str, Any]:
        """Receive until `stop` is set; `ready.set()` is called once bound. Returns the counters."""
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        try:
            _configure(sock, self.config)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished peer raises instead of vanishing
            try:
                sock.bind(self.config.endpoint)
            except zmq.ZMQError as exc:
                raise TransportError(
                    f"cannot bind {self.config.endpoint}: {exc}. Another receiver may be running there; "
                    "stop it or choose another port."
                ) from None
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            log.info("receiving on %s into %s", self.endpoint, self.store.path)
            if ready is not None:
                ready.set()
            while not stop.is_set():
                if not sock.poll(200, zmq.POLLIN):  # wake up to check `stop`
                    continue
                for _ in range(1000):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._handle(sock, frames)
        finally:
            sock.close(linger=int(self.config.linger_s * 1000))
            ctx.term()
        log.info("receiver stopped: %s", json.dumps(self.stats()))
        return self.stats()

    def _handle(self, sock: zmq.Socket, frames: list[bytes]) -> None:
        identity, body = frames[0], frames[1:]
        peer = identity.decode(errors="replace")
        self._stats["messages"] += 1
        self._stats["bytes"] += sum(len(f) for f in body)
        try:
            reply = self._process(body)
        except Exception as exc:  # never let one message take the receiver down
            log.exception("internal error handling a message from %s", peer)
            reply = _Reply(False, [], INTERNAL, f"receiver internal error: {type(exc).__name__}: {exc}")
        if not reply.ok:
            self._stats[reply.code] += 1
            self._stats["last_nack"] = {"peer": peer, "items": reply.items, "code": reply.code, "reason": reply.reason}
            level = logging.ERROR if reply.code in (STORE_FULL, STORE_ERROR, INTERNAL, CONFLICT) else logging.WARNING
            log.log(level, "refused %s from %s (%s): %s", reply.items or "a message", peer, reply.code, reply.reason)
        body_out = {"items": reply.items, "code": reply.code, "reason": reply.reason, "missing": reply.missing}
        try:
            sock.send_multipart(
                [identity, PROTOCOL, ACK if reply.ok else NACK, json.dumps(body_out).encode()], zmq.NOBLOCK
            )
        except zmq.ZMQError as exc:  # the shipper is gone or not reading; it will resend what it misses
            self._stats["replies_undeliverable"] += 1
            log.warning("could not reply to %s (%s); it will retransmit", peer, exc)
        self._stats["answered"] += 1

    def _process(self, body: list[bytes]) -> _Reply:  # noqa: PLR0911 - one early return per check
        if len(body) != 4:
            return _Reply(False, [], MALFORMED, f"expected 4 frames [protocol, kind, header, data], got {len(body)}")
        version, kind, raw_header, data = body
        if version != PROTOCOL:
            return _Reply(
                False,
                [],
                MALFORMED,
                f"protocol {version[:32]!r} is not {PROTOCOL!r}; run the same version on both ends",
            )
        try:
            header = json.loads(raw_header)
        except ValueError as exc:
            return _Reply(False, [], MALFORMED, f"the header is not valid JSON ({exc})")
        if not isinstance(header, dict):
            return _Reply(False, [], MALFORMED, f"the header must be a JSON object, got {type(header).__name__}")
        if kind == RECORD:
            return self._record(header, data)
        if kind == BLOB:
            return self._blob(header, data)
        return _Reply(False, [], MALFORMED, f"unknown message kind {kind[:32]!r} (expected b'record' or b'blob')")

    @staticmethod
    def _check_bytes(what: str, header: dict, data: bytes) -> str:
        """'' if the data has the size and digest the header claims, else the reason it does not."""
        size, claimed = header.get("size"), header.get("sha256")
        if not isinstance(size, int) or not isinstance(claimed, str):
            return f"{what}: the header needs an integer 'size' and a string 'sha256'"
        if len(data) != size:
            return f"{what}: payload is {len(data)} bytes but the header says {size}: truncated in transit"
        actual = sha256(data)
        if actual != claimed:
            return f"{what}: digest mismatch (header {claimed[:12]}, payload {actual[:12]}): altered in transit"
        return ""

    def _record(self, header: dict, data: bytes) -> _Reply:  # noqa: PLR0911 - one early return per check
        eid, kind, index = header.get("episode_id"), header.get("kind"), header.get("index")
        rid = record_id(eid, kind, index) if all(isinstance(v, str | int) for v in (eid, kind, index)) else ""
        items = [rid] if rid else []
        what = f"record {rid or '(unnamed)'}"
        if problem := self._check_bytes(what, header, data):
            return _Reply(False, items, MALFORMED, problem)
        try:
            payload = json.loads(data)
        except ValueError as exc:
            return _Reply(False, items, MALFORMED, f"{what}: payload is not valid JSON ({exc})")
        try:
            record, digest = from_wire({**header, "payload": payload})
        except SchemaError as exc:
            return _Reply(False, items, MALFORMED, f"{what}: {exc}")
        missing = [s for s in blob_refs(record) if not self.store.has_blob(s)]
        if missing:
            short = ", ".join(s[:12] for s in missing)
            reason = f"{what} references {len(missing)} image blob(s) this store lacks ({short}); send them first"
            return _Reply(False, items, MISSING_BLOB, reason, missing)
        try:
            stored = self.store.append(record, digest)
        except SchemaError as exc:
            return _Reply(False, items, MALFORMED, f"{what}: {exc}")
        except RecordConflict as exc:
            return _Reply(False, items, CONFLICT, f"{exc}; the stored record is kept")
        except StoreFull as exc:
            return _Reply(False, items, STORE_FULL, f"trainer store {self.store.path} is full: {exc}")
        except StoreError as exc:
            return _Reply(False, items, STORE_ERROR, str(exc))
        self._stats["records_stored" if stored else "records_duplicate"] += 1
        log.debug("%s %s", "stored" if stored else "duplicate of", rid)
        return _Reply(True, items)

    def _blob(self, header: dict, data: bytes) -> _Reply:
        claimed, media_type = header.get("sha256"), header.get("media_type")
        item = blob_item(claimed) if isinstance(claimed, str) else ""
        items = [item] if item else []
        what = f"blob {str(claimed)[:12]}"
        if problem := self._check_bytes(what, header, data):
            return _Reply(False, items, MALFORMED, problem)
        if not isinstance(media_type, str) or not media_type:
            return _Reply(False, items, MALFORMED, f"{what}: the header needs a 'media_type' such as image/png")
        existed = self.store.has_blob(claimed)
        try:
            self.store.put_blob(data, media_type, claimed)
        except SchemaError as exc:
            return _Reply(False, items, MALFORMED, f"{what}: {exc}")
        except StoreFull as exc:
            return _Reply(False, items, STORE_FULL, f"trainer store {self.store.path} is full: {exc}")
        except StoreError as exc:
            return _Reply(False, items, STORE_ERROR, str(exc))
        self._stats["blobs_duplicate" if existed else "blobs_stored"] += 1
        return _Reply(True, items)


# ================================================================================================ shipper
@dataclass
class _Item:
    key: str  # record id or blob:<sha256>
    frames: list[bytes]
    due_at: float = 0.0  # monotonic time it is (re)sent; 0 = now
    attempts: int = 0
    missing_rounds: int = 0


class Shipper:
    """The rollout side: streams every unacknowledged record (and its blobs) from the outbox to a receiver."""

    def __init__(self, store_path: str | Path, config: TransportConfig = TransportConfig()):
        self.config = config
        self.store = EpisodeStore(store_path)
        self.name = config.name or f"{socket.gethostname()}-{os.getpid()}"
        self._inflight: dict[str, _Item] = {}  # taken from the outbox, not yet acknowledged; insertion = send order
        self._backlog: deque[tuple[int, Record, str]] = deque()
        self._scan_seq = 0  # highest outbox seq read so far
        self._next_scan_at = 0.0
        self._acked_blobs: set[str] = set()
        self._parked: dict[str, str] = {}  # refused for good (until a restart): item -> reason
        self._hold_until = 0.0  # no sends before this (the receiver's store is full or failing)
        self._backoff_s = config.backoff_initial_s
        self._connected_once = False
        self._unmarked: list[str] = []  # acknowledged, not yet marked in the outbox
        self._unmarked_since = 0.0
        self._stats: dict[str, Any] = {
            "records_acked": 0,
            "blobs_acked": 0,
            "sent": 0,
            "retransmits": 0,
            "nacks": 0,
            **{code: 0 for code in NACK_CODES},
            "parked": 0,
            "connects": 0,
            "disconnects": 0,
            "send_blocked": 0,
            "stale_replies": 0,
            "bad_replies": 0,
            "outbox_errors": 0,
            "in_flight": 0,
            "idle": False,
            "last_nack": None,
            "last_nack_by_code": {},
            "parked_items": {},
        }

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Shipper:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        out = dict(self._stats)
        out["in_flight"] = len(self._inflight)
        out["parked"] = len(self._parked)
        out["parked_items"] = dict(self._parked)
        return out

    def ship_until_idle(self, timeout_s: float = 600.0, stop: threading.Event | None = None) -> dict[str, Any]:
        """Ship until every record in the outbox is acknowledged (or refused for good), or `timeout_s` passed.
        The returned counters say which: `idle` is True only in the first case."""
        return self.run(stop, until_idle=True, timeout_s=timeout_s)

    def run(
        self, stop: threading.Event | None = None, *, until_idle: bool = False, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Ship records as they appear in the outbox until `stop` is set (or idle, with `until_idle`)."""
        stop = stop or threading.Event()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._stats["idle"] = False
        self._connected_once = False
        for item in self._inflight.values():  # left from an earlier run: nothing of it is on the new socket
            item.due_at = 0.0
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        monitor = None
        try:
            _configure(sock, self.config)
            sock.setsockopt(zmq.IMMEDIATE, 1)  # queue only to a live connection: the outbox is the queue
            sock.setsockopt(zmq.RECONNECT_IVL, 100)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(self.config.reconnect_ivl_max_s * 1000))
            sock.setsockopt(zmq.ROUTING_ID, f"{self.name}/{uuid.uuid4().hex[:8]}".encode())
            monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
            sock.connect(self.config.endpoint)
            log.info("shipper %s: shipping %s to %s", self.name, self.store.path, self.config.endpoint)
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while not stop.is_set():
                try:
                    self._fill()
                    blocked = self._send_due(sock)
                    self._flush_acks()
                    if until_idle and self._idle():
                        self._stats["idle"] = True
                        break
                except (StoreError, sqlite3.Error) as exc:  # the outbox is locked or failing: wait, then retry
                    self._stats["outbox_errors"] += 1
                    log.error("shipper %s: cannot read the outbox %s (%s); retrying", self.name, self.store.path, exc)
                    stop.wait(self.config.backoff_max_s)
                    continue
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    log.warning("shipper %s: not idle after %.0f s: %s", self.name, timeout_s, self._summary())
                    break
                events = dict(poller.poll(self._wait_s(now, blocked, deadline) * 1000))
                if monitor in events:
                    self._drain_monitor(monitor)
                if sock in events:
                    self._drain_replies(sock)
        finally:
            self._flush_acks(force=True)
            if monitor is not None:
                sock.disable_monitor()
                monitor.close(linger=0)
            sock.close(linger=0)  # anything unacknowledged stays in the outbox and is resent next time
            ctx.term()
        log.info("shipper %s stopped: %s", self.name, self._summary())
        return self.stats()

    def _summary(self) -> str:
        s = self.stats()
        keys = ("records_acked", "blobs_acked", "sent", "retransmits", "nacks", "store_full", "in_flight", "parked")
        return ", ".join(f"{k}={s[k]}" for k in keys)

    # ---------------------------------------------------------------------------------------- outbox
    def _fill(self) -> None:
        """Take records from the outbox while the window has room (the backpressure)."""
        while len(self._inflight) < self.config.window:
            if not self._backlog:
                now = time.monotonic()
                if now < self._next_scan_at:
                    return
                rows = self.store.unacked(after_seq=self._scan_seq, limit=max(self.config.window, 16))
                if not rows:
                    self._next_scan_at = now + self.config.poll_interval_s
                    return
                self._backlog.extend(rows)
                self._scan_seq = rows[-1][0]
            self._enqueue_record(*self._backlog.popleft())

    def _idle(self) -> bool:
        if self._inflight or self._backlog:
            return False
        self._flush_acks(force=True)
        return not self._unmarked and not self.store.unacked(after_seq=self._scan_seq, limit=1)

    def _park(self, key: str, reason: str) -> None:
        self._inflight.pop(key, None)
        self._parked[key] = reason
        log.error(
            "shipper %s: %s cannot be delivered: %s. It stays unacknowledged in the outbox and is tried again "
            "when the shipper restarts; fix the cause first.",
            self.name,
            key,
            reason,
        )

    def _enqueue_record(self, seq: int, record: Record, digest: str) -> None:
        try:
            data, computed = record.encode()
        except SchemaError as exc:
            self._park(record.id, f"the outbox record fails validation ({exc})")
            return
        if computed != digest:
            self._park(record.id, "the outbox record does not match its stored digest (the outbox file is damaged)")
            return
        for sha in blob_refs(record):
            if not self._enqueue_blob(sha):
                self._park(
                    record.id, f"it references image blob {sha[:12]}, which the outbox lacks or which was refused"
                )
                return
        self._add(record.id, record_frames(record, data, digest))

    def _enqueue_blob(self, sha: str, force: bool = False) -> bool:
        key = blob_item(sha)
        if key in self._parked:
            return False
        if key in self._inflight:
            return True
        if not force and (key in self._acked_blobs or self.store.is_acked(key)):
            return True
        try:
            data, media_type = self.store.blob(sha)
        except KeyError:
            return False
        self._add(key, blob_frames(sha, data, media_type))
        return key in self._inflight

    def _add(self, key: str, frames: list[bytes]) -> None:
        largest = max(len(f) for f in frames)
        if largest > self.config.max_message_bytes:
            self._park(key, f"it is {largest} bytes, over max_message_bytes={self.config.max_message_bytes}")
            return
        self._inflight[key] = _Item(key, frames)

    # ---------------------------------------------------------------------------------------- wire
    def _send_due(self, sock: zmq.Socket) -> bool:
        """Send every item whose time has come, in order; True if the socket would block."""
        now = time.monotonic()
        if now < self._hold_until:
            return False
        for item in list(self._inflight.values()):
            if item.due_at > now:
                continue
            try:
                sock.send_multipart(item.frames, zmq.NOBLOCK, copy=False)
            except zmq.Again:  # no live connection, or the high-water mark is reached
                self._stats["send_blocked"] += 1
                return True
            self._stats["sent"] += 1
            if item.attempts:
                self._stats["retransmits"] += 1
            item.attempts += 1
            item.due_at = now + self.config.ack_timeout_s
        return False

    def _wait_s(self, now: float, blocked: bool, deadline: float | None) -> float:
        waits = [self.config.poll_interval_s]
        if blocked:
            waits.append(0.05)
        if self._inflight:
            next_due = min(item.due_at for item in self._inflight.values())
            waits.append(max(next_due, self._hold_until) - now)
        if self._unmarked:
            waits.append(self._unmarked_since + ACK_FLUSH_S - now)
        if deadline is not None:
            waits.append(deadline - now)
        return max(0.0, min(waits))

    def _drain_monitor(self, monitor: zmq.Socket) -> None:
        while True:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] == zmq.EVENT_CONNECTED:
                self._stats["connects"] += 1
                if self._connected_once:
                    log.info(
                        "shipper %s: reconnected to %s; resending %d unacknowledged message(s)",
                        self.name,
                        self.config.endpoint,
                        len(self._inflight),
                    )
                    for item in self._inflight.values():  # whatever was on the old connection may be lost
                        if item.attempts:
                            item.due_at = 0.0
                self._connected_once = True
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._stats["disconnects"] += 1
                log.warning(
                    "shipper %s: lost the receiver at %s; %d message(s) unacknowledged, they are kept and resent",
                    self.name,
                    self.config.endpoint,
                    len(self._inflight),
                )

    def _drain_replies(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                if len(frames) != 3 or frames[0] != PROTOCOL or frames[1] not in (ACK, NACK):
                    raise ValueError(f"{len(frames)} frames starting {frames[:2]!r}")
                body = json.loads(frames[2])
                items = [str(i) for i in body.get("items") or []]
            except (ValueError, AttributeError, TypeError) as exc:
                self._stats["bad_replies"] += 1
                log.warning("shipper %s: ignoring an unreadable reply (%s)", self.name, exc)
                continue
            if frames[1] == ACK:
                current = [key for key in items if key in self._inflight]
                self._stats["stale_replies"] += len(items) - len(current)  # acks of resent copies
                self._acknowledge(current)
                continue
            self._stats["nacks"] += 1
            code, reason = str(body.get("code")), str(body.get("reason"))
            if not items:
                log.error("shipper %s: the receiver refused a message it could not attribute: %s", self.name, reason)
            for key in items:
                self._on_nack(key, code, reason, [str(s) for s in body.get("missing") or []])
        self._flush_acks()

    def _acknowledge(self, keys: list[str]) -> None:
        """The receiver holds these: free their window slots now, record them in the outbox in batches."""
        if not keys:
            return
        if not self._unmarked:
            self._unmarked_since = time.monotonic()
        for key in keys:
            del self._inflight[key]
            self._unmarked.append(key)
            if key.startswith("blob:"):
                self._acked_blobs.add(key)
        self._backoff_s = self.config.backoff_initial_s

    def _flush_acks(self, force: bool = False) -> None:
        """Mark acknowledged items in the outbox: one transaction per batch (each commit is an fsync). A crash
        before the flush only means those items are sent again and acknowledged as duplicates."""
        if not self._unmarked:
            return
        young = time.monotonic() - self._unmarked_since < ACK_FLUSH_S
        if not force and young and len(self._unmarked) < max(1, self.config.window // 2):
            return
        try:
            self.store.mark_acked(self._unmarked)
        except StoreError as exc:
            log.error("shipper %s: cannot record acknowledgements in the outbox (%s); retrying", self.name, exc)
            self._unmarked_since = time.monotonic()
            return
        blobs = sum(key.startswith("blob:") for key in self._unmarked)
        self._stats["blobs_acked"] += blobs
        self._stats["records_acked"] += len(self._unmarked) - blobs
        self._unmarked = []

    def _on_nack(self, key: str, code: str, reason: str, missing: list[str]) -> None:
        item = self._inflight.get(key)
        if item is None:
            self._stats["stale_replies"] += 1
            return
        self._stats[code if code in NACK_CODES else INTERNAL] += 1
        self._stats["last_nack"] = {"item": key, "code": code, "reason": reason}
        self._stats["last_nack_by_code"] = {**self._stats["last_nack_by_code"], code: self._stats["last_nack"]}
        now = time.monotonic()
        if code in FINAL_CODES:  # resending the same bytes cannot succeed
            self._park(key, f"the receiver refused it ({code}): {reason}")
        elif code != MISSING_BLOB:  # store_full, store_error, internal: the same message may succeed later
            if now >= self._hold_until:  # one backoff step per round of refusals, not per refused message
                self._hold_until = now + self._backoff_s * random.uniform(0.9, 1.1)
                self._backoff_s = min(2 * self._backoff_s, self.config.backoff_max_s)
                log.error(
                    "shipper %s: receiver refused %s (%s): %s. Kept in the outbox; pausing %.1f s before retrying.",
                    self.name,
                    key,
                    code,
                    reason,
                    self._hold_until - now,
                )
            item.due_at = self._hold_until
        else:
            # while the receiver's store is full this follows from a refused blob, already reported
            level = logging.INFO if now < self._hold_until else logging.WARNING
            log.log(level, "shipper %s: %s; resending the blobs", self.name, reason)
            del self._inflight[key]
            for sha in missing:
                self._acked_blobs.discard(blob_item(sha))
                if not self._enqueue_blob(sha, force=True):
                    self._park(key, f"the receiver lacks image blob {sha[:12]} and the outbox cannot supply it")
                    return
            item.missing_rounds += 1
            item.due_at = 0.0 if item.missing_rounds <= 3 else now + self._backoff_s
            self._inflight[key] = item  # after its blobs, so they arrive first


# ================================================================================================ measure
def _serve_in_process(store_path: str, config: TransportConfig, stop: Any, ready: Any) -> None:
    with Receiver(store_path, config) as receiver:
        receiver.serve(stop, ready)


def measure_throughput(n_records: int, payload_bytes: int, tmp_dir: str | Path) -> dict[str, float]:
    """Records/s and payload MB/s from a real shipper to a receiver process over loopback TCP, both stores on
    disk under `tmp_dir` (timed from the first send until the last record is acknowledged)."""
    tmp = Path(tmp_dir)
    outbox, inbox = tmp / "outbox.sqlite", tmp / "inbox.sqlite"
    rng = random.Random(0)
    total = 0
    with EpisodeStore(outbox) as store:
        for i in range(n_records):
            filler = rng.randbytes((payload_bytes + 1) // 2).hex()[:payload_bytes]  # compresses about 2:1
            step = {"snapshot": {"filler": filler}, "calls": [], "timing": {}, "costs": {}, "solved_before": False}
            record = Record(f"bench{i // 100}", "step", 1 + i % 100, step)
            total += len(record.encode()[0])
            store.append(record)
    config = TransportConfig(endpoint=f"tcp://127.0.0.1:{free_port()}")
    mp = multiprocessing.get_context("spawn")
    stop, ready = mp.Event(), mp.Event()
    proc = mp.Process(target=_serve_in_process, args=(str(inbox), config, stop, ready), daemon=True)
    proc.start()
    try:
        if not ready.wait(120):
            raise TransportError("the receiver process did not start within 120 s")
        with Shipper(outbox, config) as shipper:
            t0 = time.perf_counter()
            stats = shipper.ship_until_idle(timeout_s=3600)
            elapsed = time.perf_counter() - t0
        if not stats["idle"] or stats["records_acked"] != n_records:
            raise TransportError(f"throughput run did not deliver all {n_records} records: {stats}")
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return {
        "records_per_s": n_records / elapsed,
        "mb_per_s": total / elapsed / 1e6,
        "seconds": elapsed,
        "records": n_records,
        "payload_bytes": payload_bytes,
    }


# ================================================================================================ CLI
def _config_from(args: argparse.Namespace, endpoint: str) -> TransportConfig:
    overrides = {
        f.name: getattr(args, f.name) for f in fields(TransportConfig) if getattr(args, f.name, None) is not None
    }
    return replace(TransportConfig(), **overrides, endpoint=endpoint)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or SIGINT (a clean stop); the previous handlers are restored afterwards."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="captain-ros transport",
        description="Ship episode records from a rollout host's store to the trainer's store over ZeroMQ.",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG logs every record")
    sub = parser.add_subparsers(dest="command", required=True)
    receive = sub.add_parser("receive", help="serve a receiver that writes into --store until SIGTERM")
    receive.add_argument("--store", required=True, type=Path, help="the trainer's episode store (SQLite file)")
    receive.add_argument("--bind", default=TransportConfig.endpoint, help="endpoint to listen on (loopback default)")
    receive.add_argument("--allow-remote", action="store_true", default=None, help="allow a non-loopback --bind")
    ship = sub.add_parser("ship", help="stream --store's unacknowledged records to a receiver")
    ship.add_argument("--store", required=True, type=Path, help="the rollout host's episode store (the outbox)")
    ship.add_argument("--connect", default=TransportConfig.endpoint, help="the receiver's endpoint")
    ship.add_argument("--until-idle", action="store_true", help="exit once everything is acknowledged")
    ship.add_argument("--timeout-s", type=float, default=600.0, help="with --until-idle: give up after this long")
    ship.add_argument("--window", type=int, help="most messages in flight without an ack")
    ship.add_argument("--ack-timeout-s", type=float, help="resend a message unacknowledged this long")
    ship.add_argument("--backoff-max-s", type=float, help="longest wait between retries of a full store")
    ship.add_argument("--name", help="shipper name in logs")
    for p in (receive, ship):
        p.add_argument("--hwm", type=int, help="ZeroMQ high-water marks, in messages")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        with _stop_on_signals() as stop:
            return _receive(args, stop) if args.command == "receive" else _ship(args, stop)
    except (ValueError, TransportError, StoreError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _receive(args: argparse.Namespace, stop: threading.Event) -> int:
    with Receiver(args.store, _config_from(args, args.bind)) as receiver:
        stats = receiver.serve(stop)
    print(json.dumps({"command": "receive", "store": str(args.store), "endpoint": receiver.endpoint, **stats}))
    return 0


def _ship(args: argparse.Namespace, stop: threading.Event) -> int:
    with Shipper(args.store, _config_from(args, args.connect)) as shipper:
        stats = shipper.run(stop, until_idle=args.until_idle, timeout_s=args.timeout_s if args.until_idle else None)
    print(json.dumps({"command": "ship", "store": str(args.store), "endpoint": args.connect, **stats}))
    if args.until_idle and not stats["idle"] and not stop.is_set():
        print(
            f"error: not everything was acknowledged within {args.timeout_s} s: {stats['in_flight']} in flight",
            file=sys.stderr,
        )
        return 1
    if stats["parked"]:
        print(f"error: the receiver refused {stats['parked']} item(s) for good; see the log above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
