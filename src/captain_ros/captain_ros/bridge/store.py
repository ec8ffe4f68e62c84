"""The episode store: append-only, crash-safe, one SQLite file (schema in docs/episode_schema.md).

Why SQLite: every record is acknowledged only after its transaction commits with `synchronous=FULL`
in WAL mode, so a `kill -9` (or a power cut) at any instant leaves every acknowledged record readable
and nothing half-written: SQLite's atomic commit is the most tested crash-safety code there is, where a
home-made framed log would need its own torn-write recovery. Record ids are unique keys, so a replayed
duplicate is detected in the same transaction that would store it; a full disk fails the transaction
(nothing partial remains) and is reported as `StoreFull`. Several processes on one host (the recording
proxy, rollout workers, the shipper) write one store safely. Records are never updated or deleted;
the `episodes` table is an index maintained in the same transactions. Images are blobs keyed by their
SHA-256 and stored once. MCAP (ROS replay) and Parquet (analysis) are exports of this store
(captain_ros.bridge.export): both are formats for reading, not for surviving a crash mid-write.

`EpisodeReader` is the one reader the trainer uses.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captain_ros.bridge.schema import SCHEMA_VERSION, Record, SchemaError, record_id, sha256

COMPRESS_ABOVE_BYTES = 2048
BUSY_TIMEOUT_S = 60.0

_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    episode_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    idx INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    encoding TEXT NOT NULL,
    payload BLOB NOT NULL,
    stored_unix_s REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_episode ON records(episode_id, kind, idx);
CREATE TABLE IF NOT EXISTS blobs(
    sha256 TEXT PRIMARY KEY,
    media_type TEXT NOT NULL,
    size INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS episodes(
    episode_id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    task TEXT, start_id TEXT, attempt INTEGER, group_id TEXT, policy_version INTEGER, worker TEXT,
    outcome TEXT, reward REAL, valid INTEGER, requests INTEGER,
    started_unix_s REAL, ended_unix_s REAL
);
CREATE TABLE IF NOT EXISTS acked(item TEXT PRIMARY KEY);
"""


class StoreError(RuntimeError):
    """The store could not write or read (I/O error, locked too long, wrong schema version)."""


class StoreFull(StoreError):
    """The disk or quota is full: the record was not stored (nothing partial remains)."""


class RecordConflict(StoreError):
    """A record with this id exists with different content: refused (records are never overwritten)."""


def _error(exc: sqlite3.Error, what: str) -> StoreError:
    text = str(exc)
    if "full" in text.lower() or getattr(exc, "sqlite_errorcode", None) == 13:  # SQLITE_FULL
        return StoreFull(f"{what}: the disk or quota is full ({text}); nothing was stored")
    return StoreError(f"{what}: {text}")


def _encode_payload(data: bytes) -> tuple[str, bytes]:
    if len(data) > COMPRESS_ABOVE_BYTES:
        return "json+zlib", zlib.compress(data, 1)
    return "json", data


def _decode_payload(encoding: str, blob: bytes) -> bytes:
    if encoding == "json+zlib":
        return zlib.decompress(blob)
    if encoding == "json":
        return bytes(blob)
    raise StoreError(f"unknown payload encoding {encoding!r}")


class EpisodeStore:
    """One store file. Every write is its own committed transaction; `append` returns only once durable."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA_SQL)
            self._db.execute(
                "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            (version,) = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.Error as exc:
            raise _error(exc, f"cannot open the episode store {self.path}") from exc
        if int(version) != SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {version}; this code reads version {SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> EpisodeStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------- writes
    def _transaction(self, what: str, fn):
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = fn()
                self._db.execute("COMMIT")
                return out
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise _error(exc, what) from exc

    def append(self, record: Record, digest: str | None = None) -> bool:
        """Store a record durably. True: stored now; False: this exact record was already stored (a
        duplicate). Raises SchemaError (malformed), RecordConflict, StoreFull or StoreError."""
        data, computed = record.encode()
        if digest is not None and digest != computed:
            raise SchemaError(f"record {record.id}: digest mismatch")
        encoding, blob = _encode_payload(data)

        def write() -> bool:
            row = self._db.execute("SELECT sha256 FROM records WHERE id=?", (record.id,)).fetchone()
            if row is not None:
                if row[0] == computed:
                    return False
                raise RecordConflict(
                    f"record {record.id} already stored with different content ({row[0][:12]} vs {computed[:12]})"
                )
            self._db.execute(
                "INSERT INTO records(id, episode_id, kind, idx, sha256, encoding, payload, stored_unix_s)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (record.id, record.episode_id, record.kind, record.index, computed, encoding, blob, time.time()),
            )
            self._index(record)
            return True

        return self._transaction(f"storing {record.id}", write)

    def _index(self, record: Record) -> None:
        p, eid = record.payload, record.episode_id
        self._db.execute("INSERT OR IGNORE INTO episodes(episode_id, status) VALUES (?, 'open')", (eid,))
        if record.kind == "episode_start":
            self._db.execute(
                "UPDATE episodes SET task=?, start_id=?, attempt=?, group_id=?, policy_version=?, worker=?,"
                " started_unix_s=? WHERE episode_id=?",
                (p["task"], p["start_id"], p["attempt"], p["group_id"], p["policy_version"], p["worker"], time.time())
                + (eid,),
            )
        elif record.kind == "episode_end":
            self._db.execute(
                "UPDATE episodes SET status='complete', outcome=?, reward=?, valid=?, requests=?, ended_unix_s=?"
                " WHERE episode_id=?",
                (p["outcome"], float(p["reward"]), int(p["valid"]), p["requests"], time.time(), eid),
            )

    def put_blob(self, data: bytes, media_type: str, digest: str | None = None) -> str:
        """Store bytes once under their SHA-256 (returned); `digest`, if given, must match the content."""
        computed = sha256(data)
        if digest is not None and digest != computed:
            raise SchemaError(f"blob digest mismatch (sent {digest[:12]}, content {computed[:12]})")

        def write() -> str:
            self._db.execute(
                "INSERT OR IGNORE INTO blobs(sha256, media_type, size, data) VALUES (?, ?, ?, ?)",
                (computed, media_type, len(data), data),
            )
            return computed

        return self._transaction(f"storing blob {computed[:12]}", write)

    def abandon(self, episode_id: str, reason: str) -> bool:
        """Close an episode that will never end normally (its worker, twin or proxy died) as an invalid
        infrastructure failure. Appends an episode_end; False if the episode had already ended."""
        row = self._db.execute("SELECT status FROM episodes WHERE episode_id=?", (episode_id,)).fetchone()
        if row is not None and row[0] == "complete":
            return False
        requests = self._db.execute(
            "SELECT COUNT(*) FROM records WHERE episode_id=? AND kind='step'", (episode_id,)
        ).fetchone()[0]
        end = {
            "outcome": "infrastructure_failure",
            "reward": 0.0,
            "valid": False,
            "requests": int(requests),
            "actions": 0,
            "reason": f"abandoned: {reason}",
            "invalid_reason": f"abandoned: {reason}",
            "abandoned": True,
        }
        try:
            return self.append(Record(episode_id, "episode_end", 0, end))
        except RecordConflict:
            return False  # it ended between the check and the write

    # ---------------------------------------------------------------------------------------- outbox
    def unacked(self, after_seq: int = 0, limit: int = 256) -> list[tuple[int, Record, str]]:
        """(seq, record, digest) of stored records the receiver has not acknowledged, in append order."""
        rows = self._db.execute(
            "SELECT seq, episode_id, kind, idx, sha256, encoding, payload FROM records"
            " WHERE seq > ? AND id NOT IN (SELECT item FROM acked) ORDER BY seq LIMIT ?",
            (after_seq, limit),
        ).fetchall()
        out = []
        for seq, eid, kind, idx, digest, encoding, blob in rows:
            payload = json.loads(_decode_payload(encoding, blob))
            out.append((seq, Record(eid, kind, idx, payload), digest))
        return out

    def mark_acked(self, items: list[str]) -> None:
        """Remember that the receiver durably holds these records (ids) or blobs ('blob:<sha256>')."""
        self._transaction(
            "recording acknowledgements",
            lambda: self._db.executemany("INSERT OR IGNORE INTO acked(item) VALUES (?)", [(i,) for i in items]),
        )

    def is_acked(self, item: str) -> bool:
        return self._db.execute("SELECT 1 FROM acked WHERE item=?", (item,)).fetchone() is not None

    # ---------------------------------------------------------------------------------------- reads
    def record(self, episode_id: str, kind: str, index: int = 0, verify: bool = True) -> Record | None:
        row = self._db.execute(
            "SELECT sha256, encoding, payload FROM records WHERE id=?", (record_id(episode_id, kind, index),)
        ).fetchone()
        if row is None:
            return None
        return Record(episode_id, kind, index, self._payload(row, verify))

    def record_ids(self, episode_id: str, kind: str) -> set[int]:
        """The indices of an episode's stored records of one kind."""
        rows = self._db.execute("SELECT idx FROM records WHERE episode_id=? AND kind=?", (episode_id, kind))
        return {idx for (idx,) in rows.fetchall()}

    def records(self, episode_id: str, verify: bool = True) -> list[Record]:
        rows = self._db.execute(
            "SELECT kind, idx, sha256, encoding, payload FROM records WHERE episode_id=? ORDER BY seq", (episode_id,)
        ).fetchall()
        return [Record(episode_id, kind, idx, self._payload(row, verify)) for kind, idx, *row in rows]

    @staticmethod
    def _payload(row, verify: bool) -> dict[str, Any]:
        digest, encoding, blob = row
        data = _decode_payload(encoding, blob)
        if verify and sha256(data) != digest:
            raise StoreError(f"stored record content does not match its digest {digest[:12]}: the file is damaged")
        return json.loads(data)

    def blob(self, digest: str) -> tuple[bytes, str]:
        row = self._db.execute("SELECT data, media_type FROM blobs WHERE sha256=?", (digest,)).fetchone()
        if row is None:
            raise KeyError(f"no blob {digest[:12]} in {self.path}")
        return bytes(row[0]), row[1]

    def has_blob(self, digest: str) -> bool:
        return self._db.execute("SELECT 1 FROM blobs WHERE sha256=?", (digest,)).fetchone() is not None

    def episodes(self, status: str | None = None, valid: bool | None = None) -> list[dict[str, Any]]:
        """Index rows (dicts), oldest first; status 'open' (no episode_end yet) or 'complete'."""
        sql, args = "SELECT * FROM episodes WHERE 1=1", []
        if status is not None:
            sql, args = sql + " AND status=?", [*args, status]
        if valid is not None:
            sql, args = sql + " AND valid=?", [*args, int(valid)]
        cur = self._db.execute(sql + " ORDER BY started_unix_s, episode_id", args)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def counts(self) -> dict[str, int]:
        q = self._db.execute
        return {
            "records": q("SELECT COUNT(*) FROM records").fetchone()[0],
            "blobs": q("SELECT COUNT(*) FROM blobs").fetchone()[0],
            "episodes": q("SELECT COUNT(*) FROM episodes").fetchone()[0],
            "complete": q("SELECT COUNT(*) FROM episodes WHERE status='complete'").fetchone()[0],
        }


# -------------------------------------------------------------------------------------------- reader
IMAGE_REF = "image_ref"  # a message content part standing for an image blob: {"type", "sha256", "media_type"}


@dataclass
class RequestData:
    """Request t of an episode: the proxy's model call and the twin's step (either may be missing if the
    episode was cut short)."""

    index: int
    model_call: dict[str, Any] | None
    step: dict[str, Any] | None

    @property
    def post_success(self) -> bool:
        """The scene was already solved before this request. AgenticRoboRL's post-success filter drops such requests
        from policy gradients; CaPtain keeps them (their costs, App. E, reach the policy through them)."""
        return bool(self.step and self.step.get("solved_before"))


@dataclass
class Episode:
    episode_id: str
    start: dict[str, Any]
    end: dict[str, Any] | None
    requests: list[RequestData] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.end is not None

    @property
    def valid(self) -> bool:
        return bool(self.end and self.end.get("valid"))


class EpisodeReader:
    """What the trainer reads: complete, valid episodes with their requests joined by index, and the
    exact messages of each model call restored (image references replaced by the stored images)."""

    def __init__(self, path: str | Path):
        self.store = EpisodeStore(path)

    def close(self) -> None:
        self.store.close()

    def episode_ids(self, valid_only: bool = True, min_policy_version: int | None = None) -> list[str]:
        rows = self.store.episodes(status="complete", valid=True if valid_only else None)
        if min_policy_version is not None:
            rows = [r for r in rows if (r["policy_version"] or 0) >= min_policy_version]
        return [r["episode_id"] for r in rows]

    def load(self, episode_id: str) -> Episode:
        start, end = None, None
        calls: dict[int, dict] = {}
        steps: dict[int, dict] = {}
        for rec in self.store.records(episode_id):
            if rec.kind == "episode_start":
                start = rec.payload
            elif rec.kind == "episode_end":
                end = rec.payload
            elif rec.kind == "model_call":
                calls[rec.index] = rec.payload
            else:
                steps[rec.index] = rec.payload
        if start is None:
            raise StoreError(f"episode {episode_id} has no episode_start record")
        indices = sorted(set(calls) | set(steps))
        return Episode(episode_id, start, end, [RequestData(i, calls.get(i), steps.get(i)) for i in indices])

    def episodes(self, valid_only: bool = True) -> Iterator[Episode]:
        for eid in self.episode_ids(valid_only):
            yield self.load(eid)

    def restore_messages(self, messages: list[dict]) -> list[dict]:
        """The messages exactly as the agent sent them: image references become data URLs again."""
        return [self._restore(m) for m in messages]

    def _restore(self, message: dict) -> dict:
        content = message.get("content")
        if not isinstance(content, list):
            return message
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == IMAGE_REF:
                data, media_type = self.store.blob(part["sha256"])
                url = f"data:{media_type};base64,{base64.b64encode(data).decode()}"
                parts.append({"type": "image_url", "image_url": {"url": url, **part.get("extra", {})}})
            else:
                parts.append(part)
        return {**message, "content": parts}
