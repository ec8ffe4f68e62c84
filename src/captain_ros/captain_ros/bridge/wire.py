"""The wire between rollout hosts and the trainer: how episode records travel over ZeroMQ, losing nothing and
storing nothing twice (protocol "captain/1"), the settings both ends share, and the frames they exchange.

A `Shipper` (captain_ros.bridge.shipper) on each rollout host reads its local `EpisodeStore` (the outbox) and
streams every record that the trainer has not acknowledged, each preceded by the image blobs it references, to the
trainer's `Receiver` (captain_ros.bridge.receiver), which checks each message and writes it into its own
`EpisodeStore`.

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
hosts). `captain-ros transport receive|ship ...` runs either side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import zmq

from captain_ros.bridge.schema import Record
from captain_ros.bridge.store import IMAGE_REF

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


def configure_socket(sock: zmq.Socket, config: TransportConfig) -> None:
    """The options both ends set on their socket: high-water marks, linger, heartbeats, largest message."""
    sock.setsockopt(zmq.SNDHWM, config.hwm)
    sock.setsockopt(zmq.RCVHWM, config.hwm)
    sock.setsockopt(zmq.LINGER, int(config.linger_s * 1000))
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(config.heartbeat_ivl_s * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(config.heartbeat_timeout_s * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TTL, int(config.heartbeat_timeout_s * 1000))
    sock.setsockopt(zmq.MAXMSGSIZE, config.max_message_bytes)
