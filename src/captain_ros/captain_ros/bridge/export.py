"""Exports of the episode store: rosbag2 bags (MCAP) to replay episodes in ROS tools, Parquet tables to analyse them.

The store (SQLite, `captain_ros.bridge.store`) stays the source of truth: it is the format that survives a crash
mid-write. These exports are read-only views written from it on demand; exporting the same store twice gives the
same messages and rows, so a bag or a table can always be thrown away and written again.

A bag is one rosbag2 directory per episode (`metadata.yaml` + `<episode_id>.mcap`, metadata version 9, CDR with
the ROS 2 Jazzy message definitions embedded; Jazzy and Kilted define these types identically), so `ros2 bag
info`, `ros2 bag play` and Foxglove open it. Topics (`<camera>` is an image label's leading word, "head" for
"head (h3)", so every image of one camera lands on one topic in that camera's optical frame):

  topic                                       type                              one message per
  /captain/episode                            std_msgs/msg/String (JSON)        episode_start and episode_end record
  /joint_states                               sensor_msgs/msg/JointState        step: the robot before the request
  /captain/privileged                         std_msgs/msg/String (JSON)        step: the snapshot, TRAINING ONLY
  /captain/model_calls                        std_msgs/msg/String (JSON)        model call: a summary, not the prompt
  /captain/receipts                           std_msgs/msg/String (text)        robot call that has a receipt
  /captain/camera/<camera>/image/compressed   sensor_msgs/msg/CompressedImage   image the policy saw after the step

`/joint_states` names the seven arm joints and both finger joints (each half the jaw opening), as the twin
node publishes them, so a robot_state_publisher fed the URDF poses the arm during replay. `/captain/episode` is
offered transient_local (a late subscriber still gets the start and the end).

Times (log time and header stamp, ns since the epoch): request t's snapshot messages at its step's
`timing.started_unix_s` (the proxy's `received_unix_s` if there is no step), its model call when the
completion came back (+ `generation_s`), its receipts right after that in call order (single calls are not
timed), its images at the end of the step (+ `total_s`). The start and the end at their records'
`started_unix_s` / `ended_unix_s` (the worker's clock, like the steps'), or when the store received them
if a record lacks its time; the start no later than the first request, the end no later than start +
`wall_time_s` (a store fed from another host receives records late). Every message is at least 1 ns after
the one before, so times are strictly increasing in export order whatever the recorded clocks did.

Parquet: `episodes.parquet` (one row per episode, status "complete" or "open"), `requests.parquet` (one row
per request, with the 36 critic features as `f_<name>`), `calls.parquet` (one row per robot call). The
schemas are explicit, so an empty or partial store exports the same columns with the same types.

    captain-ros export mcap --store runs/episodes.sqlite --out bags --all
    captain-ros export parquet --store runs/episodes.sqlite --out tables
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from captain_ros.bridge.store import EpisodeStore
from captain_ros.core import robot
from captain_ros.twin.features import FEATURE_NAMES

log = logging.getLogger(__name__)

BAG_VERSION = 9  # rosbag2 metadata version written by ROS 2 Jazzy and Kilted
TOPIC_EPISODE = "/captain/episode"
TOPIC_JOINT_STATES = "/joint_states"
TOPIC_PRIVILEGED = "/captain/privileged"
TOPIC_MODEL_CALLS = "/captain/model_calls"
TOPIC_RECEIPTS = "/captain/receipts"
STRING = "std_msgs/msg/String"
JOINT_STATE = "sensor_msgs/msg/JointState"
COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
TRAINING_ONLY = "TRAINING ONLY: privileged simulator state the policy never sees"


class ExportError(ValueError):
    """The export cannot be written as asked (no such store or episode, nothing to export, bad value)."""


def camera_name(label: str) -> str:
    """The camera an image label names: its leading word ("head (h3)" -> "head"), usable in a ROS name."""
    match = re.match(r"[A-Za-z0-9_]+", label.strip())
    name = match.group(0) if match else "unnamed"
    return f"cam_{name}" if name[0].isdigit() else name


def camera_topic(label: str) -> str:
    return f"/captain/camera/{camera_name(label)}/image/compressed"


# -------------------------------------------------------------------------------------------- reading the store
@dataclass
class _Episode:
    episode_id: str
    status: str  # "complete" or "open"
    start: dict[str, Any] | None
    end: dict[str, Any] | None
    start_stored_unix_s: float | None  # when the store received the start record
    end_stored_unix_s: float | None
    model_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def started_unix_s(self) -> float | None:
        """When the episode started: the worker's own time if the start record has it, else when it was stored."""
        own = _num((self.start or {}).get("started_unix_s"))
        return own if own is not None else self.start_stored_unix_s

    @property
    def ended_unix_s(self) -> float | None:
        own = _num((self.end or {}).get("ended_unix_s"))
        return own if own is not None else self.end_stored_unix_s

    @property
    def indices(self) -> list[int]:
        return sorted(set(self.model_calls) | set(self.steps))


def _open_store(store_path: str | Path) -> EpisodeStore:
    path = Path(store_path)
    if not path.is_file():
        raise ExportError(f"no episode store at {path}: pass the SQLite file the rollouts wrote (nothing was created)")
    return EpisodeStore(path)


def _index_rows(store: EpisodeStore) -> dict[str, dict[str, Any]]:
    return {row["episode_id"]: row for row in store.episodes()}


def _load(store: EpisodeStore, row: dict[str, Any]) -> _Episode:
    ep = _Episode(row["episode_id"], row["status"], None, None, row["started_unix_s"], row["ended_unix_s"])
    for rec in store.records(ep.episode_id):
        if rec.kind == "episode_start":
            ep.start = rec.payload
        elif rec.kind == "episode_end":
            ep.end = rec.payload
        elif rec.kind == "model_call":
            ep.model_calls[rec.index] = rec.payload
        elif rec.kind == "step":
            ep.steps[rec.index] = rec.payload
    return ep


def _find(rows: dict[str, dict[str, Any]], episode_id: str, store_path: Path) -> dict[str, Any]:
    if episode_id in rows:
        return rows[episode_id]
    if not rows:
        raise ExportError(f"{store_path} holds no episodes: nothing to export (is this the store the rollouts wrote?)")
    known = sorted(rows)
    shown = ", ".join(known[:5]) + (f", ... ({len(known)} in all)" if len(known) > 5 else "")
    raise ExportError(f"episode {episode_id!r} is not in {store_path}; it holds {shown}")


def _num(value: Any) -> float | None:
    """A finite number from a payload field, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _json(value: Any) -> str:
    """Compact JSON, ASCII only (a std_msgs/String must be valid UTF-8 whatever the payload holds)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else _json(value)
    return text.encode("utf-8", "replace").decode("utf-8")


def _tool_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The assistant's tool calls as {id, name, code} (or {id, name, arguments} when there is no code field)."""
    out = []
    for call in response.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        fn = call.get("function") or {}
        args = fn.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            parsed = args
        item = {"id": call.get("id"), "name": fn.get("name")}
        if isinstance(parsed, dict) and isinstance(parsed.get("code"), str):
            item["code"] = parsed["code"]
        else:
            item["arguments"] = args
        out.append(item)
    return out


def _token_counts(call: dict[str, Any]) -> tuple[int | None, int | None]:
    usage = (call.get("response") or {}).get("usage") or {}
    prompt, completion = call.get("prompt_token_ids"), call.get("token_ids")
    return (
        len(prompt) if isinstance(prompt, list) else usage.get("prompt_tokens"),
        len(completion) if isinstance(completion, list) else usage.get("completion_tokens"),
    )


def model_call_summary(episode_id: str, index: int, call: dict[str, Any], step: dict[str, Any] | None) -> dict:
    """What /captain/model_calls carries for one request: the reply, its tool-call code, token counts and
    timing; the prompt (messages, tools) stays in the store."""
    response = call.get("response") or {}
    sampling = call.get("sampling") or {}
    prompt_tokens, completion_tokens = _token_counts(call)
    logprobs = call.get("logprobs")
    return {
        "episode_id": episode_id,
        "request": index,
        "status": call.get("status"),
        "error": call.get("error"),
        "policy_version": call.get("policy_version"),
        "model": response.get("model") or sampling.get("model"),
        "content": response.get("content"),
        "tool_calls": _tool_calls(response),
        "finish_reason": response.get("finish_reason"),
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "sum_logprob": math.fsum(logprobs) if isinstance(logprobs, list) and logprobs else None,
        "n_messages": len(call.get("messages") or []),
        "sampling": {k: sampling.get(k) for k in ("temperature", "top_p", "max_tokens", "seed")},
        "timing": call.get("timing"),
        "generation_s": ((step or {}).get("timing") or {}).get("generation_s"),
    }


# -------------------------------------------------------------------------------------------- rosbag2 / MCAP
@cache
def typestore():
    """The ROS 2 Jazzy message definitions (those used here are the same on Kilted)."""
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_JAZZY)


class _Bag:
    """A rosbag2 writer that keeps one message clock strictly increasing and builds the messages."""

    def __init__(self, writer, episode_id: str):
        from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

        self.writer, self.ts = writer, typestore()
        self.profile = robot.default_profile()  # the episode's robot (camera frames), from its snapshots
        self.last_ns = 0
        self.connections: dict[str, Any] = {}
        never = QosTime(0, 0)  # 0 = the RMW default: no deadline, lifespan or lease
        latched = Qos(
            QosHistory.KEEP_LAST, 2, QosReliability.RELIABLE, QosDurability.TRANSIENT_LOCAL,
            never, never, QosLiveliness.AUTOMATIC, never, False,
        )  # fmt: skip
        self.add(TOPIC_EPISODE, STRING, (latched,))
        for topic, msgtype in (
            (TOPIC_JOINT_STATES, JOINT_STATE),
            (TOPIC_PRIVILEGED, STRING),
            (TOPIC_MODEL_CALLS, STRING),
            (TOPIC_RECEIPTS, STRING),
        ):
            self.add(topic, msgtype)
        writer.set_custom_data("captain_ros.episode_id", episode_id)
        writer.set_custom_data("captain_ros.source", "captain_ros.bridge.export from the episode store")

    def add(self, topic: str, msgtype: str, qos=()) -> None:
        self.connections[topic] = self.writer.add_connection(
            topic, msgtype, typestore=self.ts, offered_qos_profiles=qos
        )

    def at(self, ns: int | None) -> int:
        """The next message time: `ns`, but at least 1 ns after the previous message."""
        self.last_ns = max(ns or 0, self.last_ns + 1)
        return self.last_ns

    def _header(self, ns: int, frame_id: str = ""):
        t = self.ts.types
        return t["std_msgs/msg/Header"](
            stamp=t["builtin_interfaces/msg/Time"](sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000),
            frame_id=frame_id,
        )

    def _write(self, topic: str, msgtype: str, ns: int, msg) -> None:
        self.writer.write(self.connections[topic], ns, self.ts.serialize_cdr(msg, msgtype))

    def string(self, topic: str, ns: int, text: str) -> None:
        self._write(topic, STRING, ns, self.ts.types[STRING](data=_text(text)))

    def joint_state(self, ns: int, names: list[str], positions: list[float]) -> None:
        msg = self.ts.types[JOINT_STATE](
            header=self._header(ns),
            name=names,
            position=np.asarray(positions, dtype=np.float64),
            velocity=np.zeros(0, dtype=np.float64),
            effort=np.zeros(0, dtype=np.float64),
        )
        self._write(TOPIC_JOINT_STATES, JOINT_STATE, ns, msg)

    def image(self, label: str, ns: int, data: bytes, media_type: str) -> None:
        topic = camera_topic(label)
        if topic not in self.connections:
            self.add(topic, COMPRESSED_IMAGE)
        msg = self.ts.types[COMPRESSED_IMAGE](
            header=self._header(ns, self.profile.camera_frames.get(camera_name(label), "")),
            format=media_type.rsplit("/", maxsplit=1)[-1],  # "png" for image/png, "jpeg" for image/jpeg
            data=np.frombuffer(data, dtype=np.uint8),
        )
        self._write(topic, COMPRESSED_IMAGE, ns, msg)


def snapshot_profile(snapshot: dict[str, Any]) -> robot.RobotProfile:
    """The robot profile a snapshot names (records before profiles existed: the default, the Panda twin)."""
    name = (snapshot.get("robot") or {}).get("profile") if isinstance(snapshot.get("robot"), dict) else None
    try:
        return robot.load_profile(name) if isinstance(name, str) and name else robot.default_profile()
    except robot.ProfileError:
        return robot.default_profile()


def _joints(snapshot: dict[str, Any]) -> tuple[list[str], list[float]] | None:
    """Arm joints plus the fingers (each its share of the jaw opening, as the twin publishes them)."""
    rob = snapshot.get("robot")
    if not isinstance(rob, dict) or not isinstance(rob.get("arm_q_rad"), list):
        return None
    profile = snapshot_profile(snapshot)
    q = [float(v) for v in rob["arm_q_rad"]]
    names = list(rob.get("arm_joint_names") or profile.arm_joints[: len(q)])
    jaw = _num(rob.get("jaw_opening_m"))
    fingers = list(rob.get("finger_joint_names") or profile.finger_joints)
    if jaw is not None and fingers and profile.has_gripper:  # each joint at the profile's position for the opening
        names, q = [*names, *fingers], [*q, *([profile.finger_joint_position(jaw)] * len(fingers))]
    return names, q


def _request_start_s(call: dict[str, Any] | None, step: dict[str, Any] | None) -> float | None:
    started = _num(((step or {}).get("timing") or {}).get("started_unix_s"))
    return started if started is not None else _num(((call or {}).get("timing") or {}).get("received_unix_s"))


def _ns(unix_s: float | None) -> int | None:
    return None if unix_s is None else round(unix_s * 1e9)


def _after(t0_ns: int | None, dt_s: float | None) -> int | None:
    return t0_ns + round(dt_s * 1e9) if t0_ns is not None and dt_s is not None else None


def _write_request(bag: _Bag, store: EpisodeStore, ep: _Episode, index: int) -> int:
    """Request `index`'s messages in time order; returns how many of its images had no blob in the store."""
    call, step = ep.model_calls.get(index), ep.steps.get(index)
    timing = (step or {}).get("timing") or {}
    t0 = _ns(_request_start_s(call, step))
    if step is not None:
        ns = bag.at(t0)
        snapshot = step.get("snapshot") or {}
        bag.profile = snapshot_profile(snapshot)
        joints = _joints(snapshot)
        if joints:
            bag.joint_state(ns, *joints)
        note = {"training_only": TRAINING_ONLY, "episode_id": ep.episode_id, "request": index}
        bag.string(TOPIC_PRIVILEGED, bag.at(None), _json({**note, **snapshot}))
    generation_s = _num(timing.get("generation_s"))
    if generation_s is None:
        generation_s = _num(((call or {}).get("timing") or {}).get("total_s"))
    replied_ns = _after(t0, generation_s)
    if call is not None:
        summary = model_call_summary(ep.episode_id, index, call, step)
        bag.string(TOPIC_MODEL_CALLS, bag.at(replied_ns), _json(summary))
    if step is None:
        return 0
    for robot_call in step.get("calls") or []:  # the first right after the reply, the rest 1 ns apart in order
        receipt = robot_call.get("receipt") if isinstance(robot_call, dict) else None
        if receipt:
            bag.string(TOPIC_RECEIPTS, bag.at(replied_ns), _text(receipt))
    shown_ns, missing = _after(t0, _num(timing.get("total_s"))), 0
    for image in step.get("images") or []:  # at the end of the step, 1 ns apart
        try:
            data, media_type = store.blob(image["sha256"])
        except KeyError:
            missing += 1
            log.warning("episode %s request %d: image %s has no blob in the store", ep.episode_id, index, image)
            continue
        bag.image(str(image.get("label", "camera")), bag.at(shown_ns), data, image.get("media_type") or media_type)
    return missing


def _write_episode(bag: _Bag, store: EpisodeStore, ep: _Episode) -> int:
    """All of one episode's messages in time order; returns how many images had no blob in the store."""
    starts = [_ns(_request_start_s(ep.model_calls.get(i), ep.steps.get(i))) for i in ep.indices]
    starts = [s for s in starts if s is not None]
    start_ns = _ns(ep.started_unix_s)
    if starts and (start_ns is None or start_ns >= starts[0]):
        start_ns = starts[0] - 1  # the start came before the first request, whenever the store received it
    if ep.start is not None:
        record = {"event": "start", "episode_id": ep.episode_id, **ep.start}
        bag.string(TOPIC_EPISODE, bag.at(start_ns), _json(record))
    missing = sum(_write_request(bag, store, ep, index) for index in ep.indices)
    if ep.end is not None:
        end_ns, by_wall_ns = _ns(ep.ended_unix_s), _after(start_ns, _num(ep.end.get("wall_time_s")))
        if end_ns is not None and by_wall_ns is not None:
            end_ns = min(end_ns, by_wall_ns)
        record = {"event": "end", "episode_id": ep.episode_id, **ep.end}
        bag.string(TOPIC_EPISODE, bag.at(end_ns), _json(record))
    return missing


def _bag_dir(out_dir: Path, episode_id: str, overwrite: bool) -> Path:
    if episode_id in (".", "..") or "\0" in episode_id:
        raise ExportError(f"episode id {episode_id!r} cannot name a bag folder")
    path = out_dir / episode_id
    if path.exists():
        if not overwrite:
            raise ExportError(f"{path} exists already: delete it or export with overwrite (--overwrite)")
        if any(path.iterdir()) and not (path / "metadata.yaml").is_file():
            raise ExportError(f"{path} exists and is not a rosbag2 bag (no metadata.yaml): not deleting it")
        shutil.rmtree(path)
    return path


def _export_bag(store: EpisodeStore, row: dict[str, Any], out_dir: Path, overwrite: bool) -> Path:
    from rosbags.rosbag2 import StoragePlugin, Writer

    ep = _load(store, row)
    path = _bag_dir(out_dir, ep.episode_id, overwrite)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with Writer(path, version=BAG_VERSION, storage_plugin=StoragePlugin.MCAP) as writer:
            bag = _Bag(writer, ep.episode_id)
            missing = _write_episode(bag, store, ep)
            writer.set_custom_data("captain_ros.status", ep.status)
            writer.set_custom_data("captain_ros.missing_images", str(missing))
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)  # never leave a half-written bag behind
        raise
    return path


def export_mcap(store_path: str | Path, episode_id: str, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write one episode as a rosbag2 bag `out_dir/<episode_id>/` (metadata.yaml + one .mcap); returns it."""
    store = _open_store(store_path)
    try:
        row = _find(_index_rows(store), episode_id, store.path)
        return _export_bag(store, row, Path(out_dir), overwrite)
    finally:
        store.close()


def export_mcap_all(
    store_path: str | Path,
    out_dir: str | Path,
    valid_only: bool = False,
    overwrite: bool = False,
    progress: bool = False,
) -> list[Path]:
    """Write every episode (open ones too; with `valid_only` only complete, valid ones) as a bag under `out_dir`."""
    from tqdm import tqdm

    store = _open_store(store_path)
    try:
        rows = _index_rows(store)
        if not rows:
            raise ExportError(f"{store.path} holds no episodes: nothing to export")
        chosen = [r for r in rows.values() if not valid_only or (r["status"] == "complete" and r["valid"])]
        return [
            _export_bag(store, row, Path(out_dir), overwrite)
            for row in tqdm(chosen, desc="bags", unit="episode", disable=not progress)
        ]
    finally:
        store.close()


# -------------------------------------------------------------------------------------------- Parquet
def _schema(*columns: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(name, typ, nullable=True) for name, typ in columns])


STR, I64, F64, BOOL = pa.string(), pa.int64(), pa.float64(), pa.bool_()
EPISODES_SCHEMA = _schema(
    ("episode_id", STR),
    ("status", STR),  # "complete" (has an episode_end) or "open"
    # episode_start
    ("task", STR),
    ("family", STR),
    ("start_id", STR),
    ("split", STR),
    ("attempt", I64),
    ("group_id", STR),
    ("policy_version", I64),
    ("policy", STR),
    ("worker", STR),
    ("host", STR),
    ("instruction", STR),
    ("budget_requests", I64),
    ("budget_physical_actions", I64),
    ("budget_wall_time_s", F64),
    ("started_unix_s", F64),  # the start record's started_unix_s (worker clock), else when it was stored
    ("start_stored_unix_s", F64),  # when this store received the start record
    # episode_end
    ("outcome", STR),
    ("host_success", BOOL),
    ("finished", BOOL),
    ("requests", I64),
    ("actions", I64),
    ("wall_time_s", F64),
    ("reason", STR),
    ("reward", F64),
    ("subgoal_reward", F64),
    ("return", F64),
    ("valid", BOOL),
    ("invalid_reason", STR),
    ("first_solved_request", I64),
    ("abandoned", BOOL),
    ("costs_total", F64),
    ("rungs_reached", I64),
    ("rungs", I64),
    ("ended_unix_s", F64),  # the end record's ended_unix_s (worker clock), else when it was stored
    ("end_stored_unix_s", F64),  # when this store received the end record
    # what the store holds
    ("recorded_model_calls", I64),
    ("recorded_steps", I64),
)
REQUESTS_SCHEMA = _schema(
    ("episode_id", STR),
    ("index", I64),  # the request number t, from 1
    ("task", STR),
    ("family", STR),
    ("policy_version", I64),
    ("has_model_call", BOOL),
    ("has_step", BOOL),
    ("model_status", STR),
    ("model", STR),
    ("prompt_tokens", I64),
    ("completion_tokens", I64),
    ("sum_logprob", F64),
    ("finish_reason", STR),
    ("n_tool_calls", I64),
    ("proxy_received_unix_s", F64),
    ("proxy_upstream_s", F64),
    ("proxy_total_s", F64),
    ("proxy_s", F64),
    ("started_unix_s", F64),
    ("total_s", F64),
    ("generation_s", F64),
    ("physical_s", F64),
    ("overhead_s", F64),
    ("snapshot_s", F64),
    ("cost_excess_actions", F64),
    ("cost_failed_actions", F64),
    ("cost_post_success", F64),
    ("cost_total", F64),
    ("solved_before", BOOL),
    ("n_calls", I64),
    ("n_physical_calls", I64),
    ("n_failed_calls", I64),
    ("n_images", I64),
    ("image_labels", STR),  # JSON list of the labels of the images shown after the request
    ("sim_time_s", F64),
    ("scene_success", BOOL),
    *((f"f_{name}", F64) for name in FEATURE_NAMES),  # the 36 critic features before the request (TRAINING ONLY)
)
CALLS_SCHEMA = _schema(
    ("episode_id", STR),
    ("request", I64),
    ("call", I64),  # position of the call within the request, from 0
    ("capability", STR),
    ("success", BOOL),
    ("executed", BOOL),
    ("physical", BOOL),
    ("failure_category", STR),
    ("message", STR),
    ("receipt", STR),
    ("arguments", STR),  # JSON
)


def _cell(value: Any, typ: pa.DataType, where: str) -> Any:
    """`value` as the column's type; a value that does not fit is an error naming where it came from."""
    if value is None:
        return None
    if typ == BOOL:
        if isinstance(value, bool):
            return value
    elif typ == I64:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif typ == F64:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif typ == STR:
        return _text(value)
    raise ExportError(f"{where}: {value!r} does not fit the column type {typ}; the record is malformed")


def _table(schema: pa.Schema, rows: list[tuple[str, dict[str, Any]]]) -> pa.Table:
    columns = {
        f.name: [_cell(row.get(f.name), f.type, f"{where} field {f.name!r}") for where, row in rows] for f in schema
    }
    return pa.Table.from_pydict(columns, schema=schema)


def _episode_row(ep: _Episode) -> dict[str, Any]:
    start, end = ep.start or {}, ep.end or {}
    budgets = start.get("budgets") or {}
    return {
        "episode_id": ep.episode_id,
        "status": ep.status,
        **{k: start.get(k) for k in ("task", "family", "start_id", "split", "attempt", "group_id", "policy_version")},
        **{k: start.get(k) for k in ("policy", "worker", "host", "instruction")},
        "budget_requests": budgets.get("requests"),
        "budget_physical_actions": budgets.get("physical_actions"),
        "budget_wall_time_s": budgets.get("wall_time_s"),
        "started_unix_s": ep.started_unix_s,
        "start_stored_unix_s": ep.start_stored_unix_s,
        **{k: end.get(k) for k in ("outcome", "host_success", "finished", "requests", "actions", "wall_time_s")},
        **{k: end.get(k) for k in ("reason", "reward", "subgoal_reward", "return", "valid", "invalid_reason")},
        "first_solved_request": end.get("first_solved_request"),
        "abandoned": end.get("abandoned", False) if ep.end is not None else None,
        **{k: end.get(k) for k in ("costs_total", "rungs_reached", "rungs")},
        "ended_unix_s": ep.ended_unix_s,
        "end_stored_unix_s": ep.end_stored_unix_s,
        "recorded_model_calls": len(ep.model_calls),
        "recorded_steps": len(ep.steps),
    }


def _request_row(ep: _Episode, index: int) -> dict[str, Any]:
    start, call, step = ep.start or {}, ep.model_calls.get(index), ep.steps.get(index)
    row: dict[str, Any] = {
        "episode_id": ep.episode_id,
        "index": index,
        "task": start.get("task"),
        "family": start.get("family"),
        "policy_version": (call or start).get("policy_version"),
        "has_model_call": call is not None,
        "has_step": step is not None,
    }
    if call is not None:
        summary = model_call_summary(ep.episode_id, index, call, step)
        timing = call.get("timing") or {}
        row |= {k: summary[k] for k in ("model", "prompt_tokens", "completion_tokens", "sum_logprob", "finish_reason")}
        row |= {
            "model_status": summary["status"],
            "n_tool_calls": len(summary["tool_calls"]),
            "proxy_received_unix_s": timing.get("received_unix_s"),
            "proxy_upstream_s": timing.get("upstream_s"),
            "proxy_total_s": timing.get("total_s"),
            "proxy_s": timing.get("proxy_s"),
        }
    if step is not None:
        timing, costs = step.get("timing") or {}, step.get("costs") or {}
        calls = [c for c in step.get("calls") or [] if isinstance(c, dict)]
        snapshot = step.get("snapshot") or {}
        features = snapshot.get("features") or {}
        row |= {k: timing.get(k) for k in ("started_unix_s", "total_s", "generation_s", "physical_s", "overhead_s")}
        row |= {f"cost_{k}": costs.get(k) for k in ("excess_actions", "failed_actions", "post_success", "total")}
        row |= {
            "snapshot_s": timing.get("snapshot_s"),
            "solved_before": step.get("solved_before"),
            "n_calls": len(calls),
            "n_physical_calls": sum(bool(c.get("physical")) for c in calls),
            "n_failed_calls": sum(c.get("success") is False for c in calls),
            "n_images": len(step.get("images") or []),
            "image_labels": [im.get("label") for im in step.get("images") or [] if isinstance(im, dict)],
            "sim_time_s": snapshot.get("sim_time_s"),
            "scene_success": snapshot.get("success"),
            **{f"f_{name}": features.get(name) for name in FEATURE_NAMES},
        }
    return row


def _call_rows(ep: _Episode, index: int) -> list[dict[str, Any]]:
    step = ep.steps.get(index) or {}
    rows = []
    for position, call in enumerate(step.get("calls") or []):
        if not isinstance(call, dict):
            continue
        row = {k: call.get(k) for k in ("capability", "success", "executed", "physical", "failure_category")}
        arguments = call.get("arguments")
        row |= {
            "episode_id": ep.episode_id,
            "request": index,
            "call": position,
            "message": call.get("message"),
            "receipt": call.get("receipt"),
            "arguments": None if arguments is None else _json(arguments),
        }
        rows.append(row)
    return rows


def parquet_tables(store_path: str | Path) -> dict[str, pa.Table]:
    """The three analysis tables ("episodes", "requests", "calls") of a store, in memory."""
    store = _open_store(store_path)
    episodes: list[tuple[str, dict]] = []
    requests: list[tuple[str, dict]] = []
    calls: list[tuple[str, dict]] = []
    try:
        for row in store.episodes():
            ep = _load(store, row)
            episodes.append((f"episode {ep.episode_id}", _episode_row(ep)))
            for index in ep.indices:
                where = f"episode {ep.episode_id} request {index}"
                requests.append((where, _request_row(ep, index)))
                calls.extend((f"{where} call {r['call']}", r) for r in _call_rows(ep, index))
    finally:
        store.close()
    return {
        "episodes": _table(EPISODES_SCHEMA, episodes),
        "requests": _table(REQUESTS_SCHEMA, requests),
        "calls": _table(CALLS_SCHEMA, calls),
    }


def export_parquet(store_path: str | Path, out_dir: str | Path) -> dict[str, Path]:
    """Write episodes.parquet, requests.parquet and calls.parquet under `out_dir`; returns {name: path}. Each
    file is written whole and then renamed into place, so a reader never sees half a table."""
    out = Path(out_dir)
    tables = parquet_tables(store_path)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, table in tables.items():
        path = out / f"{name}.parquet"
        tmp = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, tmp)
        tmp.replace(path)
        paths[name] = path
    return paths


def require_episodes(store_path: Path) -> None:
    """An ExportError unless the store at `store_path` holds at least one episode."""
    store = _open_store(store_path)
    try:
        if not store.counts()["episodes"]:
            raise ExportError(f"{store_path} holds no episodes: nothing to export (is this the store rollouts wrote?)")
    finally:
        store.close()
