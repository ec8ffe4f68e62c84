"""The trainer side of the transport (captain_ros.bridge.wire): a `Receiver` checks each message (size, SHA-256,
schema, the images a record references), writes it into the trainer's `EpisodeStore`, and acknowledges only what
that store committed; anything else is refused with a nack code and a reason.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from captain_ros.bridge.schema import SchemaError, from_wire, record_id, sha256
from captain_ros.bridge.store import EpisodeStore, RecordConflict, StoreError, StoreFull
from captain_ros.bridge.wire import (
    ACK,
    BLOB,
    CONFLICT,
    INTERNAL,
    MALFORMED,
    MISSING_BLOB,
    NACK,
    NACK_CODES,
    PROTOCOL,
    RECORD,
    STORE_ERROR,
    STORE_FULL,
    TransportConfig,
    TransportError,
    blob_item,
    blob_refs,
    check_bind_endpoint,
    configure_socket,
)

log = logging.getLogger(__name__)


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
            configure_socket(sock, self.config)
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


def serve_receiver(store_path: str, config: TransportConfig, stop: Any, ready: Any) -> None:
    """Serve a receiver until `stop` is set (the target of a receiver process: bench/bridge.py)."""
    with Receiver(store_path, config) as receiver:
        receiver.serve(stop, ready)
