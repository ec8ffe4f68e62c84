"""Exports of the episode store: rosbag2 (MCAP) bags read back by two independent decoders (rosbags' own
reader and the `mcap` package with `mcap_ros2`'s decoder), and Parquet tables read back with pyarrow."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from captain_ros.bridge import export
from captain_ros.bridge.schema import Record
from captain_ros.bridge.store import EpisodeStore
from captain_ros.cli import export_cli
from captain_ros.core import robot
from captain_ros.twin.privileged_state import FEATURE_NAMES

PANDA = robot.default_profile()  # the twin's arm

REQUESTS = 3
WALL_TIME_S = 40.0
# request -> labels of the images shown after it, as the agent labels them: camera (perception handle)
CAMERAS = {1: ["head (h1)"], 2: ["head (h2)", "wrist (h2)"], 3: ["wrist (h3)"]}


def png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def snapshot(ep: int, t: int) -> dict:
    features = {name: round(ep * 100 + t + i / 64, 6) for i, name in enumerate(FEATURE_NAMES)}
    return {
        "sim_time_s": 1.5 * t,
        "features": features,
        "object_poses": {"red_cube": {"position_m": [0.5, 0.0, 0.02 * t], "quat_wxyz": [1.0, 0.0, 0.0, 0.0]}},
        "joint_positions": {},
        "goals_satisfied": [t == REQUESTS],
        "success": t == REQUESTS,
        "subgoals_reached": ["grasp"] if t > 1 else [],
        "robot": {
            "arm_joint_names": list(PANDA.arm_joints),
            "arm_q_rad": [round(0.1 * j + 0.01 * t + ep, 4) for j in range(7)],
            "jaw_opening_m": 0.08 - 0.02 * t,
        },
    }


def calls(t: int) -> list[dict]:
    out = [
        {
            "capability": "get_robot_state",
            "arguments": {},
            "success": True,
            "executed": True,
            "failure_category": None,
            "message": "",
            "receipt": f"get_robot_state: tcp at request {t}",
            "physical": False,
        },
        {
            "capability": "move_to",
            "arguments": {"position": [0.5, 0.0, 0.1 * t]},
            "success": t != 2,
            "executed": True,
            "failure_category": None if t != 2 else "collision",
            "message": "" if t != 2 else "would hit the table",
            "receipt": f"move_to: request {t} " + ("reached" if t != 2 else "NOT executed (collision)"),
            "physical": True,
        },
    ]
    return out if t != 3 else out[:1]  # 2, 2, 1 calls


def model_call(ep: int, t: int, image_refs: list[dict], started_s: float) -> dict:
    code = f"state = get_robot_state()\nmove_to(position=[0.5, 0.0, {0.1 * t:.1f}])"
    prompt = [5000 + i for i in range(40 + t)]
    return {
        "messages": [
            {"role": "system", "content": "You control a Panda arm."},
            {"role": "user", "content": [{"type": "text", "text": "put the cube in the bowl"}, *image_refs]},
        ],
        "tools": [{"type": "function", "function": {"name": "run_code", "parameters": {}}}],
        "sampling": {"model": "qwen-test", "temperature": 1.0, "top_p": 1.0, "max_tokens": 512, "seed": ep},
        "prompt_token_ids": prompt,
        "token_ids": [7, 8, 9, 10 + t],
        "logprobs": [-0.5, -0.25, -0.125, -1.0],
        "response": {
            "content": f"Request {t}: moving.",
            "tool_calls": [
                {
                    "id": f"call_{t}",
                    "type": "function",
                    "function": {"name": "run_code", "arguments": json.dumps({"code": code})},
                }
            ],
            "finish_reason": "tool_calls",
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": 4},
            "model": "qwen-test",
        },
        "policy_version": 3,
        "timing": {"received_unix_s": started_s + 0.001, "upstream_s": 0.7, "total_s": 0.72, "proxy_s": 0.02},
        "status": "ok",
    }


def build_store(path: Path) -> dict:
    """Two complete episodes (3 requests each, images, receipts) recorded an hour ago on a worker and shipped
    now, plus one open episode (1 request, no end). Returns what the checks compare against."""
    truth: dict = {"episodes": {}, "blobs": {}}
    with EpisodeStore(path) as store:
        for ep, (eid, outcome, valid) in enumerate([("ep-a", "success", True), ("ep-b", "failure", False)]):
            base_s = time.time() - 3600 + 100 * ep
            start = {
                "task": "put_red_cube_in_bowl",
                "family": "pick_place",
                "start_id": f"s{ep}",
                "split": "train",
                "attempt": ep,
                "group_id": "put_red_cube_in_bowl/s0",
                "policy_version": 3,
                "policy": "qwen-test",
                "worker": "w0",
                "host": "sim-host",
                "instruction": "put the red cube in the bowl",
                "budgets": {"requests": 10, "physical_actions": 20, "wall_time_s": 300.0},
            }
            if ep == 0:  # the recorder stamps its own times; older or other writers may not
                start["started_unix_s"] = base_s + 5
            store.append(Record(eid, "episode_start", 0, start))
            steps = {}
            for t in range(1, REQUESTS + 1):
                started_s = base_s + 10 * t
                shown = []
                for k, label in enumerate(CAMERAS[t]):
                    data = png(1000 * ep + 10 * t + k)
                    sha = store.put_blob(data, "image/png")
                    truth["blobs"][sha] = data
                    shown.append({"label": label, "sha256": sha, "media_type": "image/png"})
                # the policy sees request t-1's images in request t's prompt
                refs = [
                    {"type": "image_ref", "sha256": s["sha256"], "media_type": "image/png"}
                    for s in steps.get(t - 1, {}).get("images", [])
                ]
                store.append(Record(eid, "model_call", t, model_call(ep, t, refs, started_s)))
                step = {
                    "snapshot": snapshot(ep, t),
                    "calls": calls(t),
                    "images": shown,
                    "timing": {
                        "started_unix_s": started_s,
                        "total_s": 3.0,
                        "generation_s": 0.8,
                        "physical_s": 2.0,
                        "overhead_s": 0.15,
                        "snapshot_s": 0.05,
                    },
                    "costs": {
                        "excess_actions": 0,
                        "failed_actions": 1.0 if t == 2 else 0.0,
                        "post_success": 0.0,
                        "total": 1.0 if t == 2 else 0.0,
                    },
                    "solved_before": False,
                }
                store.append(Record(eid, "step", t, step))
                steps[t] = step
            end = {
                "outcome": outcome,
                "host_success": outcome == "success",
                "finished": True,
                "requests": REQUESTS,
                "actions": 3,
                "wall_time_s": WALL_TIME_S,
                "reason": "finish() accepted" if valid else "collision",
                "reward": 1.0 if valid else -0.5,
                "subgoal_reward": 0.5,
                "return": 0.9,
                "valid": valid,
                "invalid_reason": None if valid else "twin fault",
                "first_solved_request": 3 if valid else None,
            }
            if ep == 0:
                end["ended_unix_s"] = base_s + 5 + WALL_TIME_S
            store.append(Record(eid, "episode_end", 0, end))
            truth["episodes"][eid] = {"start": start, "steps": steps, "end": end}
        # an episode still running (or whose worker died): one request, no end
        open_start = {**start, "start_id": "s9", "attempt": 9, "started_unix_s": time.time()}
        store.append(Record("ep-open", "episode_start", 0, open_start))
        t0 = time.time()
        step = {
            "snapshot": snapshot(9, 1),
            "calls": calls(1),
            "images": [],
            "timing": {"started_unix_s": t0, "total_s": 2.0, "generation_s": 0.5, "physical_s": 1.0},
            "costs": {"excess_actions": 0, "failed_actions": 0, "post_success": 0, "total": 0},
            "solved_before": False,
        }
        store.append(Record("ep-open", "model_call", 1, model_call(9, 1, [], t0)))
        store.append(Record("ep-open", "step", 1, step))
        truth["episodes"]["ep-open"] = {"start": open_start, "steps": {1: step}, "end": None}
    return truth


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("store") / "episodes.sqlite"
    return path, build_store(path)


@pytest.fixture(scope="module")
def bag(store, tmp_path_factory) -> Path:
    path, _ = store
    return export.export_mcap(path, "ep-a", tmp_path_factory.mktemp("bags"))


EXPECTED_TOPICS = {
    "/captain/episode": ("std_msgs/msg/String", 2),
    "/joint_states": ("sensor_msgs/msg/JointState", REQUESTS),
    "/captain/privileged": ("std_msgs/msg/String", REQUESTS),
    "/captain/model_calls": ("std_msgs/msg/String", REQUESTS),
    "/captain/receipts": ("std_msgs/msg/String", 5),
    "/captain/camera/head/image/compressed": ("sensor_msgs/msg/CompressedImage", 2),
    "/captain/camera/wrist/image/compressed": ("sensor_msgs/msg/CompressedImage", 2),
}


def read_rosbags(path: Path) -> list[tuple[str, str, int, object]]:
    from rosbags.highlevel import AnyReader

    with AnyReader([path]) as reader:  # uses the definitions embedded in the bag, no default typestore
        return [(c.topic, c.msgtype, ns, reader.deserialize(raw, c.msgtype)) for c, ns, raw in reader.messages()]


def read_mcap(path: Path) -> list[tuple[str, str, int, object]]:
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory

    (file,) = path.glob("*.mcap")
    with file.open("rb") as f:
        reader = make_reader(f, validate_crcs=True, decoder_factories=[DecoderFactory()])
        return [(ch.topic, sc.name, m.log_time, msg) for sc, ch, m, msg in reader.iter_decoded_messages()]


def stamp_ns(msg) -> int:
    return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec


def ns(unix_s: float) -> int:
    return round(unix_s * 1e9)


@pytest.mark.parametrize("reader", [read_rosbags, read_mcap], ids=["rosbags", "mcap_ros2"])
def test_bag_decodes_to_the_stored_episode(store, bag, reader):
    _, truth = store
    ep = truth["episodes"]["ep-a"]
    messages = reader(bag)

    by_topic: dict[str, list] = {}
    for topic, msgtype, log_ns, msg in messages:
        assert EXPECTED_TOPICS[topic][0] == msgtype
        by_topic.setdefault(topic, []).append((log_ns, msg))
    assert {t: len(v) for t, v in by_topic.items()} == {t: n for t, (_, n) in EXPECTED_TOPICS.items()}

    # one clock: strictly increasing over the whole bag in export order, start first and end last
    times = [log_ns for _, _, log_ns, _ in messages]
    assert times == sorted(times) and len(set(times)) == len(times)
    episode = by_topic["/captain/episode"]
    start, end = (json.loads(m.data) for _, m in episode)
    assert (start["event"], end["event"]) == ("start", "end")
    assert episode[0][0] == times[0] and episode[1][0] == times[-1]
    assert start["instruction"] == ep["start"]["instruction"] and start["budgets"] == ep["start"]["budgets"]
    assert end["outcome"] == "success" and end["reward"] == 1.0 and end["valid"] is True
    # stored an hour after it ran: the start and end at the worker's times the records carry
    assert (episode[0][0], episode[1][0]) == (ns(ep["start"]["started_unix_s"]), ns(ep["end"]["ended_unix_s"]))

    # joint states: the snapshot's arm joints plus both fingers at half the jaw, at the step's start time
    for t, (log_ns, msg) in enumerate(by_topic["/joint_states"], start=1):
        rob = ep["steps"][t]["snapshot"]["robot"]
        assert list(msg.name) == [*PANDA.arm_joints, *PANDA.finger_joints]
        assert list(msg.position) == [*rob["arm_q_rad"], rob["jaw_opening_m"] / 2, rob["jaw_opening_m"] / 2]
        assert log_ns == stamp_ns(msg) == ns(ep["steps"][t]["timing"]["started_unix_s"])

    # privileged snapshot, labelled TRAINING ONLY, with all 36 features
    for t, (_, msg) in enumerate(by_topic["/captain/privileged"], start=1):
        data = json.loads(msg.data)
        assert "TRAINING ONLY" in data["training_only"] and data["request"] == t
        assert data["features"] == ep["steps"][t]["snapshot"]["features"] and len(data["features"]) == 36

    # model calls: a summary with the tool-call code and token counts, never the prompt
    for t, (log_ns, msg) in enumerate(by_topic["/captain/model_calls"], start=1):
        data = json.loads(msg.data)
        assert data["request"] == t and data["policy_version"] == 3 and data["finish_reason"] == "tool_calls"
        assert data["tool_calls"][0]["code"].startswith("state = get_robot_state()")
        assert (data["prompt_tokens"], data["completion_tokens"]) == (40 + t, 4)
        assert data["sum_logprob"] == -1.875 and data["content"] == f"Request {t}: moving."
        assert "messages" not in data and "put the cube in the bowl" not in msg.data
        assert log_ns == ns(ep["steps"][t]["timing"]["started_unix_s"]) + ns(0.8)

    # receipts, in order, exactly as stored
    stored = [c["receipt"] for t in (1, 2, 3) for c in ep["steps"][t]["calls"]]
    assert [m.data for _, m in by_topic["/captain/receipts"]] == stored

    # images: the blob's bytes, in png format, in the camera's optical frame, at the end of the step
    for label in ("head", "wrist"):
        got = by_topic[f"/captain/camera/{label}/image/compressed"]
        want = [(t, im) for t in (1, 2, 3) for im in ep["steps"][t]["images"] if im["label"].startswith(label)]
        assert len(want) == 2
        for (log_ns, msg), (t, image) in zip(got, want, strict=True):
            assert bytes(msg.data) == truth["blobs"][image["sha256"]] and msg.format == "png"
            assert msg.header.frame_id == PANDA.camera_frames[label]
            assert log_ns == stamp_ns(msg) >= ns(ep["steps"][t]["timing"]["started_unix_s"]) + ns(3.0)
            assert Image.open(io.BytesIO(bytes(msg.data))).size == (8, 6)


def test_bag_metadata_lists_topics_counts_and_qos(bag):
    meta = yaml.safe_load((bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert meta["version"] == 9 and meta["storage_identifier"] == "mcap"
    assert meta["relative_file_paths"] == [f"{bag.name}.mcap"] and (bag / f"{bag.name}.mcap").is_file()
    topics = {t["topic_metadata"]["name"]: t for t in meta["topics_with_message_count"]}
    assert {name: (t["topic_metadata"]["type"], t["message_count"]) for name, t in topics.items()} == EXPECTED_TOPICS
    assert meta["message_count"] == sum(n for _, n in EXPECTED_TOPICS.values())
    for t in topics.values():
        assert t["topic_metadata"]["serialization_format"] == "cdr"
        assert t["topic_metadata"]["type_description_hash"].startswith("RIHS01_")
    (latched,) = topics["/captain/episode"]["topic_metadata"]["offered_qos_profiles"]
    assert (latched["durability"], latched["reliability"]) == ("transient_local", "reliable")
    assert meta["custom_data"]["captain_ros.episode_id"] == "ep-a"
    assert meta["custom_data"]["captain_ros.missing_images"] == "0"


def test_message_definitions_match_jazzy_and_kilted():
    """The bag embeds Jazzy's definitions; Kilted's hashes for the same types are identical, so either
    distribution's `ros2 bag play` accepts them."""
    from rosbags.typesys import Stores, get_typestore

    jazzy, kilted = get_typestore(Stores.ROS2_JAZZY), get_typestore(Stores.ROS2_KILTED)
    for msgtype in (export.STRING, export.JOINT_STATE, export.COMPRESSED_IMAGE):
        assert jazzy.hash_rihs01(msgtype) == kilted.hash_rihs01(msgtype)


def test_open_episode_and_all(store, tmp_path):
    path, truth = store
    paths = export.export_mcap_all(path, tmp_path / "all")
    assert sorted(p.name for p in paths) == ["ep-a", "ep-b", "ep-open"]
    messages = read_mcap(tmp_path / "all" / "ep-open")
    episode = [json.loads(m.data) for topic, _, _, m in messages if topic == "/captain/episode"]
    assert [e["event"] for e in episode] == ["start"]  # no end record yet
    assert sum(topic == "/joint_states" for topic, *_ in messages) == 1
    assert [p.name for p in export.export_mcap_all(path, tmp_path / "valid", valid_only=True)] == ["ep-a"]

    # ep-b's records carry no times of their own and were stored an hour after it ran: its start goes just
    # before request 1 and its end at start + wall time, not an hour later
    episode = [n for topic, _, n, _ in read_mcap(tmp_path / "all" / "ep-b") if topic == "/captain/episode"]
    assert episode[0] == ns(truth["episodes"]["ep-b"]["steps"][1]["timing"]["started_unix_s"]) - 1
    assert abs(episode[1] - episode[0] - WALL_TIME_S * 1e9) < 1e3

    # an existing bag is never overwritten by accident; with overwrite it is replaced by the same content
    with pytest.raises(export.ExportError, match="exists already"):
        export.export_mcap(path, "ep-b", tmp_path / "all")
    again = export.export_mcap(path, "ep-b", tmp_path / "all", overwrite=True)
    assert [(t, n) for t, _, n, _ in read_rosbags(again)] == [
        (t, n) for t, _, n, _ in read_rosbags({p.name: p for p in paths}["ep-b"])
    ]


def test_parquet_tables(store, tmp_path):
    path, truth = store
    files = export.export_parquet(path, tmp_path / "tables")
    assert set(files) == {"episodes", "requests", "calls"}
    episodes, requests, calls_t = (pq.read_table(files[n]) for n in ("episodes", "requests", "calls"))

    assert episodes.schema == export.EPISODES_SCHEMA and requests.schema == export.REQUESTS_SCHEMA
    assert calls_t.schema == export.CALLS_SCHEMA
    assert episodes.schema.field("reward").type == pa.float64()
    assert episodes.schema.field("attempt").type == pa.int64()
    assert requests.schema.field("solved_before").type == pa.bool_()
    assert all(requests.schema.field(f"f_{n}").type == pa.float64() for n in FEATURE_NAMES)

    rows = {r["episode_id"]: r for r in episodes.to_pylist()}
    assert episodes.num_rows == 3
    assert rows["ep-open"]["status"] == "open" and rows["ep-open"]["outcome"] is None
    assert rows["ep-open"]["reward"] is None and rows["ep-open"]["recorded_steps"] == 1
    assert rows["ep-a"]["status"] == "complete" and rows["ep-a"]["valid"] is True and rows["ep-a"]["reward"] == 1.0
    assert rows["ep-b"]["valid"] is False and rows["ep-b"]["first_solved_request"] is None
    assert rows["ep-a"]["budget_wall_time_s"] == 300.0 and rows["ep-a"]["family"] == "pick_place"
    assert rows["ep-a"]["abandoned"] is False and rows["ep-open"]["abandoned"] is None
    assert rows["ep-a"]["started_unix_s"] == truth["episodes"]["ep-a"]["start"]["started_unix_s"]
    assert rows["ep-a"]["start_stored_unix_s"] > rows["ep-a"]["started_unix_s"] + 3000  # shipped an hour later
    assert rows["ep-b"]["started_unix_s"] == rows["ep-b"]["start_stored_unix_s"]  # no time of its own

    assert requests.num_rows == 2 * REQUESTS + 1
    req = {(r["episode_id"], r["index"]): r for r in requests.to_pylist()}
    for eid in ("ep-a", "ep-b", "ep-open"):
        for t, step in truth["episodes"][eid]["steps"].items():
            r = req[(eid, t)]
            assert {name: r[f"f_{name}"] for name in FEATURE_NAMES} == step["snapshot"]["features"]
            assert (r["prompt_tokens"], r["completion_tokens"]) == (40 + t, 4)
            assert r["n_calls"] == len(step["calls"]) and r["n_images"] == len(step["images"])
            assert r["generation_s"] == step["timing"]["generation_s"] and r["proxy_upstream_s"] == 0.7
            assert r["cost_total"] == step["costs"]["total"] and r["solved_before"] is False
    assert req[("ep-a", 2)]["n_failed_calls"] == 1 and req[("ep-a", 2)]["n_physical_calls"] == 1
    assert json.loads(req[("ep-a", 2)]["image_labels"]) == ["head (h2)", "wrist (h2)"]
    assert req[("ep-open", 1)]["overhead_s"] is None  # a field the step did not record stays null

    assert calls_t.num_rows == 2 * 5 + 2
    failed = [c for c in calls_t.to_pylist() if c["success"] is False]
    assert [(c["episode_id"], c["request"], c["call"]) for c in failed] == [("ep-a", 2, 1), ("ep-b", 2, 1)]
    assert failed[0]["failure_category"] == "collision" and json.loads(failed[0]["arguments"]) == {
        "position": [0.5, 0.0, 0.2]
    }
    assert failed[0]["receipt"] == "move_to: request 2 NOT executed (collision)"


def test_empty_store_exports_the_same_columns(tmp_path):
    EpisodeStore(tmp_path / "empty.sqlite").close()
    files = export.export_parquet(tmp_path / "empty.sqlite", tmp_path / "tables")
    for name, schema in (("episodes", export.EPISODES_SCHEMA), ("requests", export.REQUESTS_SCHEMA)):
        table = pq.read_table(files[name])
        assert table.num_rows == 0 and table.schema == schema


def test_bad_values_are_named(tmp_path):
    with EpisodeStore(tmp_path / "s.sqlite") as s:
        s.append(
            Record(
                "e1",
                "episode_start",
                0,
                {
                    "task": "t",
                    "start_id": "0",
                    "attempt": 0,
                    "group_id": "g",
                    "policy_version": 1,
                    "worker": "w",
                    "budgets": {"requests": "ten"},
                },
            )
        )
    with pytest.raises(export.ExportError, match=r"episode e1 field 'budget_requests': 'ten'"):
        export.export_parquet(tmp_path / "s.sqlite", tmp_path / "out")


def test_image_without_blob_is_skipped_and_counted(tmp_path):
    with EpisodeStore(tmp_path / "s.sqlite") as s:
        start = {"task": "t", "start_id": "0", "attempt": 0, "group_id": "g", "policy_version": 1, "worker": "w"}
        s.append(Record("e1", "episode_start", 0, start))
        image = {"label": "head", "sha256": "0" * 64, "media_type": "image/png"}
        step = {"snapshot": snapshot(0, 1), "calls": [], "images": [image], "timing": {}, "costs": {}}
        s.append(Record("e1", "step", 1, {**step, "solved_before": False}))
    path = export.export_mcap(tmp_path / "s.sqlite", "e1", tmp_path / "bags")
    meta = yaml.safe_load((path / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert meta["custom_data"]["captain_ros.missing_images"] == "1"
    assert [topic for topic, *_ in read_mcap(path)] == ["/captain/episode", "/joint_states", "/captain/privileged"]


def test_command_line(store, tmp_path, capsys):
    path, _ = store
    assert export_cli.main(["mcap", "--store", str(path), "--out", str(tmp_path / "b"), "--episode", "ep-a"]) == 0
    assert (tmp_path / "b" / "ep-a" / "metadata.yaml").is_file()

    assert export_cli.main(["mcap", "--store", str(path), "--out", str(tmp_path / "b"), "--episode", "nope"]) == 1
    err = capsys.readouterr().err
    assert "episode 'nope' is not in" in err and "ep-a" in err

    assert export_cli.main(["mcap", "--store", str(path), "--out", str(tmp_path / "c"), "--all"]) == 0
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["ep-a", "ep-b", "ep-open"]
    assert "bags" in capsys.readouterr().err  # the progress bar

    assert export_cli.main(["parquet", "--store", str(path), "--out", str(tmp_path / "t")]) == 0
    assert "requests" in capsys.readouterr().out

    EpisodeStore(tmp_path / "empty.sqlite").close()
    for command in (["mcap", "--all"], ["parquet"]):
        assert export_cli.main([*command, "--store", str(tmp_path / "empty.sqlite"), "--out", str(tmp_path / "e")]) == 1
        assert "holds no episodes" in capsys.readouterr().err
    assert export_cli.main(["parquet", "--store", str(tmp_path / "missing.sqlite"), "--out", str(tmp_path / "e")]) == 1
    assert "no episode store at" in capsys.readouterr().err and not (tmp_path / "missing.sqlite").exists()
