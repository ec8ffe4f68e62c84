"""A twin episode followed entirely from published topics: /agent/status, /harness/receipts and /captain/markers
(the motion node's planned and executed sweeps, the operator_view node's text and contacts). The episode is
rebuilt from them alone (every request, every call's receipt, each sweep's plan before its path, the contact
and its force, the outcome) and compared with the agent's own transcript.

The policy is tests/scripted_policy.py: observe; move above a clear spot of the table and descend onto it
(a guarded motion that stops at first contact); lift, look again and finish (accepted, scene not solved)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from visualization_msgs.msg import Marker, MarkerArray

from captain_interfaces.msg import CallResult as CallResultMsg
from captain_interfaces.msg import EpisodeStatus
from captain_ros.core.contract import PHYSICAL_CAPABILITIES
from captain_ros.core.operator_markers import (
    NS_CONTACTS,
    NS_MOTIONS,
    NS_PLANNED,
    NS_RECEIPTS,
    NS_STATUS,
    OperatorViewConfig,
    receipt_line,
    receipts_text,
)
from captain_ros.ros.convert import call_result_from_msg
from tests.scripted_policy import ScriptedPolicy

from .helpers import (
    launch_module,
    launch_motion_node,
    launch_node,
    launch_perception_node,
    launch_twin,
    node_processes,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.ros, pytest.mark.slow]

TASK = "put_red_cube_in_bowl"
START = f"{TASK}/official/0"
EPISODE_LIMIT_S = 300.0  # a loaded 2-core machine; the episode is about 15 s of robot time
SPOT = [0.68, 0.02]  # clear table of this start (tests/captain_ros/ros/test_backends.py descends here too)
ABOVE, ON, LIFTED = [*SPOT, 0.08], [*SPOT, 0.0], [*SPOT, 0.2]
SCRIPT = [
    "print(robot.observe()['success'])",
    f"a = robot.move_to(pose={{'position': {ABOVE}, 'yaw_deg': 0}})\nprint(a['success'])\n"
    f"b = robot.move_to(pose={{'position': {ON}, 'yaw_deg': 0}}, speed_mps=0.05)\nprint(b['failure_category'])",
    f"print(robot.move_to(pose={{'position': {LIFTED}, 'yaw_deg': 0}})['success'])\n"
    "print(robot.observe()['success'])\nprint(finish('touched the table')['success'])",
]


@pytest.fixture(scope="module")
def stack():
    with node_processes() as nodes:
        nodes["twin"] = launch_twin(TASK, START, real_time_factor=1.0, camera_rate_hz=5.0)
        nodes["perception"] = launch_perception_node()
        nodes["motion"] = launch_motion_node(("watchdog", False))
        nodes["operator_view"] = launch_module("captain_ros.ros.operator_view", ("robot_profile", "panda_twin"))
        yield nodes


class Recorder:
    """Everything the topics carried, in arrival order (one topic's messages from one publisher arrive in the
    order they were published: the motion node's plan of a motion always before its executed path)."""

    def __init__(self, node):
        self.statuses: list[EpisodeStatus] = []
        self.receipts: list[CallResultMsg] = []
        self.markers: list[Marker] = []
        node.create_subscription(EpisodeStatus, "/agent/status", self.statuses.append, 100)
        node.create_subscription(CallResultMsg, "/harness/receipts", self.receipts.append, 100)
        node.create_subscription(MarkerArray, "/captain/markers", lambda m: self.markers.extend(m.markers), 500)

    def latest(self, ns: str, marker_id: int) -> Marker | None:
        return next((m for m in reversed(self.markers) if m.ns == ns and m.id == marker_id), None)

    def first_index(self, ns: str, marker_id: int) -> int:
        return next(i for i, m in enumerate(self.markers) if m.ns == ns and m.id == marker_id)


def xyz(p) -> np.ndarray:
    return np.array([p.x, p.y, p.z])


def transcript_calls(runs: Path) -> tuple[dict, list[dict]]:
    (summary,) = json.loads((runs / "summary.json").read_text())
    records = [json.loads(line) for line in (Path(summary["transcript_dir"]) / "transcript.jsonl").open()]
    return summary, [r for r in records if r["type"] == "call"]


def test_a_twin_episode_can_be_followed_entirely_from_published_topics(stack, client_node, tmp_path):
    seen = Recorder(client_node)
    wait_for(lambda: seen.latest(NS_STATUS, 0) is not None, 60, "the operator view's first markers")
    policy = ScriptedPolicy(lambda n: SCRIPT[min(n, len(SCRIPT)) - 1])
    agent, lines = launch_node(
        "agent_node",
        ("llm_base_url", policy.url),
        ("task", TASK),
        ("start_id", START),
        ("episodes", 1),
        ("runs_dir", str(tmp_path)),
        ("send_images", False),
        ("use_sim_time", True),
    )
    try:
        wait_for(lambda: agent.poll() is not None, EPISODE_LIMIT_S, "the episode:\n" + "".join(lines[-60:]))
        assert agent.returncode == 0, "".join(lines[-60:])
    finally:
        stop(agent)
        policy.close()
    summary, calls = transcript_calls(tmp_path)
    assert summary["outcome"] == "false_finish" and summary["requests"] == 3 and summary["actions"] == 3, summary

    # --- the episode's progress and outcome, from /agent/status
    wait_for(lambda: any(s.state == EpisodeStatus.STATE_FINISHED for s in seen.statuses), 30, "the final status")
    final = next(s for s in seen.statuses if s.state == EpisodeStatus.STATE_FINISHED)
    assert final.episode_id == summary["episode_id"] and final.task == TASK
    assert final.outcome == summary["outcome"] and final.request_index == summary["requests"]
    assert final.budget.actions_used == summary["actions"] and final.budget.requests_limit == 60
    running = [s for s in seen.statuses if s.state == EpisodeStatus.STATE_RUNNING]
    assert {s.request_index for s in running} >= {1, 2, 3}, "every request was announced"

    # --- every call, from /harness/receipts: the transcript's calls in the same order with the same receipts
    wait_for(lambda: len(seen.receipts) >= len(calls), 30, "every receipt")
    by_stamp = sorted(seen.receipts, key=lambda m: (m.header.stamp.sec, m.header.stamp.nanosec))  # two publishers
    receipts = [call_result_from_msg(m) for m in by_stamp]
    assert [(r.capability, r.receipt) for r in receipts] == [(c["capability"], c["result"]["receipt"]) for c in calls]
    assert [c["request"] for c in calls] == [1, 2, 2, 3, 3, 3]
    physical = [r for r in receipts if r.capability in PHYSICAL_CAPABILITIES and r.executed]
    assert len(physical) == summary["actions"]
    contact = physical[1]
    assert contact.failure_category.value == "contact_stop" and contact.value["stop_reason"] == "contact"

    # --- each sweep's plan before its executed path, from /captain/markers (both published by the motion node)
    targets = [ABOVE, ON, LIFTED]
    previous_end = None
    for result, target in zip(physical, targets, strict=True):
        motion_id = result.value["motion_id"]
        wait_for(lambda m=motion_id: seen.latest(NS_MOTIONS, m) is not None, 30, f"the path of motion {motion_id}")
        assert seen.first_index(NS_PLANNED, motion_id) < seen.first_index(NS_MOTIONS, motion_id)
        plan, path = seen.latest(NS_PLANNED, motion_id), seen.latest(NS_MOTIONS, motion_id)
        assert plan.type == Marker.LINE_STRIP and plan.header.frame_id == "panda_link0"
        np.testing.assert_allclose(xyz(plan.points[-1]), target, atol=0.001)  # planned to the asked target
        if previous_end is not None:  # from where the last motion left the TCP
            np.testing.assert_allclose(xyz(plan.points[0]), previous_end, atol=0.005)
        end = np.array(result.value["tcp_position_m"])
        np.testing.assert_allclose(xyz(path.points[-1]), end, atol=0.01)  # the executed path ends where it says
        previous_end = end
    assert contact.value["tcp_position_m"][2] > ON[2]  # the descent stopped on the table, short of its target

    # --- the operator view: status and receipts as text, the contact with its force
    def shows(ns: str, marker_id: int, *texts: str) -> bool:
        m = seen.latest(ns, marker_id)
        return m is not None and all(t in m.text for t in texts)

    outcome = f"outcome: {summary['outcome']}"
    wait_for(lambda: shows(NS_STATUS, 0, "request 3 of 60", "actions 3 of 150", outcome), 30, "the final status")
    last = receipt_line(receipts[-1])
    assert last.startswith("ok  finish: accepted")
    wait_for(lambda: shows(NS_RECEIPTS, 0, last), 30, "the last receipt")
    shown = OperatorViewConfig()  # the node's defaults: the latest 6 receipts, each cut to 96 characters
    expected = receipts_text(
        [receipt_line(r) for r in receipts[-shown.receipt_lines :]], len(calls), shown.receipt_chars
    )
    assert seen.latest(NS_RECEIPTS, 0).text == expected
    force = f"contact {contact.value['peak_force_n']:.1f} N motion {contact.value['motion_id']}"
    wait_for(lambda: shows(NS_CONTACTS, 2, force), 30, "the contact's label")
    sphere, arrow = seen.latest(NS_CONTACTS, 0), seen.latest(NS_CONTACTS, 1)
    assert sphere.type == Marker.SPHERE and sphere.header.frame_id == "panda_link0"
    np.testing.assert_allclose(xyz(sphere.pose.position), contact.value["tcp_position_m"], atol=1e-9)
    tail, head = xyz(arrow.points[0]), xyz(arrow.points[1])
    np.testing.assert_allclose(head, contact.value["tcp_position_m"], atol=1e-9)
    descent = seen.latest(NS_PLANNED, contact.value["motion_id"])
    planned = xyz(descent.points[-1]) - xyz(descent.points[0])
    pressed = head - tail
    assert pressed[2] < 0  # the hand pressed down, along its planned sweep:
    np.testing.assert_allclose(pressed / np.linalg.norm(pressed), planned / np.linalg.norm(planned), atol=1e-6)
    assert not [m for m in seen.markers if m.ns == NS_CONTACTS and m.id > 2], "one contact in this episode"
