"""The agent node over DDS: whole episodes through the twin, motion and perception nodes, its status topic
and heartbeat, and a motion node that restarts mid-episode (an infrastructure failure, never a task
outcome; the next episode runs once the node is back).

The policy is tests/scripted_policy.py, a scripted server in this process."""

from __future__ import annotations

import json

import pytest
from std_msgs.msg import Empty

from captain_interfaces.msg import EpisodeStatus
from tests.scripted_policy import ScriptedPolicy

from .helpers import (
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
EPISODE_LIMIT_S = 300.0  # a loaded 2-core machine; an episode here is a few seconds of robot time


MOVE = "print(robot.move_to(pose={'position': [0.45, 0.0, 0.3], 'yaw_deg': 0})['success'])"
CHECK_AND_FINISH = "print(robot.observe()['success'])\nprint(finish('looked again')['success'])"


def start_motion():
    return launch_motion_node(("watchdog", False))


@pytest.fixture(scope="module")
def stack():
    with node_processes() as nodes:
        nodes["twin"] = launch_twin(TASK, START, real_time_factor=1.0, camera_rate_hz=5.0)
        nodes["perception"] = launch_perception_node()
        nodes["motion"] = start_motion()
        yield nodes


def start_agent(policy: ScriptedPolicy, runs, episodes: int):
    return launch_node(
        "agent_node",
        ("llm_base_url", policy.url),
        ("task", TASK),
        ("start_id", START),
        ("episodes", episodes),
        ("runs_dir", str(runs)),
        ("send_images", False),
        ("use_sim_time", True),
    )


def watch(node) -> tuple[list[EpisodeStatus], list[Empty]]:
    statuses: list[EpisodeStatus] = []
    beats: list[Empty] = []
    node.create_subscription(EpisodeStatus, "/agent/status", statuses.append, 50)
    node.create_subscription(Empty, "/agent/heartbeat", beats.append, 50)
    return statuses, beats


def finished(proc, lines, what: str) -> int:
    wait_for(lambda: proc.poll() is not None, EPISODE_LIMIT_S, f"{what}:\n{''.join(lines[-60:])}")
    return proc.returncode


def test_the_agent_node_runs_an_episode_through_the_harness_nodes(stack, client_node, tmp_path):
    policy = ScriptedPolicy(
        lambda n: ["r = robot.observe()\nprint(r['success'])", MOVE, CHECK_AND_FINISH][min(n, 3) - 1]
    )
    statuses, beats = watch(client_node)
    agent, lines = start_agent(policy, tmp_path, episodes=1)
    try:
        assert finished(agent, lines, "the episode") == 0, "".join(lines[-60:])
    finally:
        stop(agent)
        policy.close()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary) == 1 and summary[0]["outcome"] == "false_finish", summary  # moved, checked, not solved
    assert summary[0]["requests"] == 3 and summary[0]["actions"] == 1 and summary[0]["host_success"] is False
    text = "".join(lines)
    assert "--- request 1" in text and "observe: obs-" in text and "finish: accepted" in text
    assert "1 valid episodes: host success 0/1, strict success 0/1" in text
    wait_for(lambda: any(s.state == EpisodeStatus.STATE_FINISHED for s in statuses), 30, "the final status")
    final = next(s for s in reversed(statuses) if s.state == EpisodeStatus.STATE_FINISHED)
    assert final.outcome == EpisodeStatus.OUTCOME_FALSE_FINISH and final.budget.requests_used == 3
    assert any(s.state == EpisodeStatus.STATE_RUNNING for s in statuses) and beats


def test_a_motion_node_restarting_mid_episode_is_an_infrastructure_failure(stack, client_node, tmp_path):
    """Request 1 holds the arm for 20 s; the motion node is stopped meanwhile and started again. The episode
    ends as an infrastructure failure (not a task outcome), and the next episode runs on the new node. Each
    episode's cells count from its own first request: however many the first one used before its link was lost
    (the stopping node may answer the hold, canceled), the second moves, then checks and finishes."""

    def script(episode: int, k: int) -> str:
        cells = (
            [MOVE, CHECK_AND_FINISH] if episode > 1 else ["print(robot.hold(duration_s=20.0))", MOVE, CHECK_AND_FINISH]
        )
        return cells[min(k, len(cells)) - 1]

    policy = ScriptedPolicy(script, per_episode=True)
    statuses, _ = watch(client_node)
    agent, lines = start_agent(policy, tmp_path, episodes=2)
    try:
        assert policy.asked[1].wait(EPISODE_LIMIT_S), "".join(lines[-60:])
        wait_for(lambda: any(s.request_index == 1 for s in statuses), 60, "the agent to report request 1")
        motion, _ = stack["motion"]
        stop(motion)
        stack["motion"] = start_motion()
        code = finished(agent, lines, "two episodes")
    finally:
        stop(agent)
        policy.close()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [e["outcome"] for e in summary] == ["infrastructure_failure", "false_finish"], summary
    # the stopping node may still answer the hold (the twin may run its 20 s ahead of the stop on a busy host);
    # then a later call finds it gone, finds it not yet back, or finds the new node: each a lost link to it
    reason = summary[0]["reason"]
    assert summary[0]["host_success"] is None, summary
    assert reason.startswith("harness link lost during ") and ("/harness/" in reason or "motion node" in reason), reason
    assert code == 1  # an infrastructure failure ended an episode: the run says so
    assert stack["twin"][0].poll() is None  # the twin (the arm) is still up
