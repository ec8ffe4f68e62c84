"""The rollout side of the transport (captain_ros.bridge.wire): a `Shipper` streams every record of its host's
`EpisodeStore` (the outbox) that the trainer has not acknowledged, each preceded by the image blobs it references,
keeps `window` messages in flight, resends what stays unacknowledged, backs off while the trainer's store is full,
and marks in the outbox what the receiver acknowledged.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import sqlite3
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from captain_ros.bridge.schema import Record, SchemaError
from captain_ros.bridge.store import EpisodeStore, StoreError
from captain_ros.bridge.wire import (
    ACK,
    FINAL_CODES,
    INTERNAL,
    MISSING_BLOB,
    NACK,
    NACK_CODES,
    PROTOCOL,
    TransportConfig,
    blob_frames,
    blob_item,
    blob_refs,
    configure_socket,
    record_frames,
)

log = logging.getLogger(__name__)

ACK_FLUSH_S = 0.05  # the shipper records acknowledgements in its outbox at least this often


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
            configure_socket(sock, self.config)
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
