"""The episode record schema, version 1 (documented for people in docs/episode_schema.md).

An episode is a set of records, each with a deterministic id `<episode_id>/<kind>/<index>`:

  episode_start  index 0   task, family, start id, attempt, group, policy version, worker (the rollout side)
  model_call     index t   one chat completion as the recording proxy saw it: exact messages (images
                           replaced by SHA-256 references to blobs), tools, sampling parameters,
                           prompt_token_ids, sampled token_ids, per-token logprobs, policy version, timing
  step           index t   the twin's privileged snapshot taken before request t (36 features + raw
                           poses; TRAINING ONLY), that request's robot calls and receipts, timing and the
                           App. E costs c_t, and whether the scene was already solved before it
  episode_end    index 0   the episode adapter's values: outcome, reward R_i (Eq. 7), validity, ...

A record's identity is its id; its content is the compact JSON of its payload (key order kept), checked
by SHA-256.
Storing a record whose id exists with the same digest is a no-op (a replayed duplicate); with a
different digest it is a conflict and is refused. ROS-free; no third-party imports.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1
KINDS = ("episode_start", "model_call", "step", "episode_end")

# required payload fields per kind, with their JSON types (extra fields are allowed and kept)
_NUMBER = (int, float)
REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    "episode_start": {
        "task": str,
        "start_id": str,
        "attempt": int,
        "group_id": str,
        "policy_version": int,
        "worker": str,
    },
    "model_call": {
        "messages": list,
        "tools": list,
        "sampling": dict,
        "prompt_token_ids": (list, type(None)),
        "token_ids": (list, type(None)),
        "logprobs": (list, type(None)),
        "policy_version": int,
        "timing": dict,
        "status": str,  # "ok" or "error" (then `error` says what the upstream did)
    },
    "step": {
        "snapshot": dict,
        "calls": list,
        "timing": dict,
        "costs": dict,
        "solved_before": bool,
    },
    "episode_end": {
        "outcome": str,
        "reward": _NUMBER,
        "valid": bool,
        "requests": int,
        "actions": int,
        "reason": str,
    },
}


class SchemaError(ValueError):
    """A record that does not follow the schema (malformed, truncated, wrong types or digest)."""


def record_id(episode_id: str, kind: str, index: int = 0) -> str:
    return f"{episode_id}/{kind}/{index}"


def canonical(payload: dict[str, Any]) -> bytes:
    """A record's bytes, which its digest is taken over: compact UTF-8 JSON, no NaN or infinity, keys in the
    payload's own order. The order is kept on purpose: chat templates write tool schemas and tool-call
    arguments with `tojson` in their key order, so the exact prompt can only be re-rendered from records that
    keep it. JSON read back keeps its order, so a record re-encoded after a round trip has the same bytes."""
    try:
        return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except ValueError as exc:
        raise SchemaError(f"payload is not finite JSON: {exc}") from None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Record:
    episode_id: str
    kind: str
    index: int
    payload: dict[str, Any]

    @property
    def id(self) -> str:
        return record_id(self.episode_id, self.kind, self.index)

    def encode(self) -> tuple[bytes, str]:
        """(canonical payload bytes, their SHA-256); raises SchemaError if the record is malformed."""
        validate(self)
        data = canonical(self.payload)
        return data, sha256(data)


def validate(record: Record) -> None:
    """Raise SchemaError naming the first thing wrong with the record."""
    if not isinstance(record.episode_id, str) or not record.episode_id or "/" in record.episode_id:
        raise SchemaError(f"episode_id must be a non-empty string without '/', got {record.episode_id!r}")
    if record.kind not in REQUIRED:
        raise SchemaError(f"unknown record kind {record.kind!r} (one of {', '.join(KINDS)})")
    if not isinstance(record.index, int) or isinstance(record.index, bool) or record.index < 0:
        raise SchemaError(f"{record.kind} index must be an integer >= 0, got {record.index!r}")
    if record.kind in ("model_call", "step") and record.index < 1:
        raise SchemaError(f"{record.kind} index is the request number, from 1; got {record.index}")
    if not isinstance(record.payload, dict):
        raise SchemaError(f"{record.kind} payload must be an object, got {type(record.payload).__name__}")
    for name, types in REQUIRED[record.kind].items():
        if name not in record.payload:
            raise SchemaError(f"{record.kind} {record.id}: missing field {name!r}")
        value = record.payload[name]
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            raise SchemaError(f"{record.kind} {record.id}: field {name!r} has type {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise SchemaError(f"{record.kind} {record.id}: field {name!r} is not finite")
    if record.kind == "model_call" and record.payload["status"] == "ok":
        ids, lps = record.payload["token_ids"], record.payload["logprobs"]
        if ids is not None and lps is not None and len(ids) != len(lps):
            raise SchemaError(f"model_call {record.id}: {len(ids)} token ids but {len(lps)} logprobs")


def from_wire(envelope: dict[str, Any]) -> tuple[Record, str]:
    """A record from its wire/JSON form {episode_id, kind, index, payload, sha256}; checks the digest."""
    try:
        record = Record(envelope["episode_id"], envelope["kind"], envelope["index"], envelope["payload"])
        claimed = envelope["sha256"]
    except (KeyError, TypeError) as exc:
        raise SchemaError(f"record envelope is missing {exc}") from None
    _, digest = record.encode()
    if digest != claimed:
        raise SchemaError(f"record {record.id}: digest mismatch (sent {str(claimed)[:12]}, content {digest[:12]})")
    return record, digest
