"""The episode loop on the in-process twin with the real sandbox: budgets, the completion gate, outcome
accounting, malformed replies, crashing cells and infrastructure faults.

The policy here is a scripted stand-in for the language model (a fake of the external server, which
`test_vllm.py` exercises for real); some of its cells use ground-truth object positions, only to
reach a solved scene quickly so that outcome accounting can be tested."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from captain_ros.agent.episode import EpisodeRunner, Outcome
from captain_ros.agent.link import LinkError
from captain_ros.agent.policy_client import PolicyClient, PolicyConfig, unread_tool_call
from captain_ros.agent.sandbox import Sandbox, SandboxLimits, _python_dirs
from captain_ros.core.config import load_config
from captain_ros.worlds.twin.link import InProcessLink

TASK, START = "put_red_cube_in_bowl", "put_red_cube_in_bowl/official/0"


@dataclass
class Reply:
    content: str
    tool_calls: list = field(default_factory=list)
    latency_s: float = 0.0
    usage: dict = field(default_factory=dict)
    finish_reason: str = "stop"


def cell(code: str, call_id: str = "call-1") -> Reply:
    return Reply(
        "next step",
        [{"id": call_id, "type": "function", "function": {"name": "python", "arguments": json.dumps({"code": code})}}],
    )


class Scripted:
    """Replies from a list (the last one repeats); records every prompt it was sent."""

    def __init__(self, replies):
        self.replies, self.prompts = list(replies), []

    def complete(self, messages, tools, headers=None):
        self.prompts.append(messages)
        reply = self.replies[min(len(self.prompts) - 1, len(self.replies) - 1)]
        if isinstance(reply, Exception):
            raise reply
        return reply(self) if callable(reply) else reply


def sandbox_factory(scratch: Path, on_call, allowed):
    box = Sandbox(scratch, on_call, allowed, SandboxLimits(cell_timeout_s=60.0))
    box.start()
    return box


@pytest.fixture(scope="module")
def link():
    return InProcessLink(load_config())


class CellLog:
    """A recorder that keeps what each request's cells did (the step record's `cells`)."""

    def __init__(self):
        self.cells: dict[int, list[dict]] = {}

    def started(self, start):
        pass

    def before_request(self, index):
        pass

    def after_request(self, index, timing, calls, images, cells):
        self.cells[index] = cells

    def ended(self, result):
        pass


def run(link, policy, tmp_path, config=None, clock=None, *, recorder=None, **budgets):
    config = config or load_config()
    if budgets:
        config = replace(config, budgets=replace(config.budgets, **budgets))
    kwargs = {"clock": clock} if clock else {}
    runner = EpisodeRunner(link, policy, config, sandbox_factory=sandbox_factory, runs_dir=tmp_path, **kwargs)
    runner.recorder = recorder
    return runner.run(TASK, START)


def tool_texts(policy: Scripted) -> list[str]:
    """The tool and user messages the policy saw in its last prompt, after the task context."""
    replies = [m for m in policy.prompts[-1][3:] if m["role"] != "assistant"]
    return [m["content"] if isinstance(m["content"], str) else str(m["content"]) for m in replies]


def transcript(result) -> list[dict]:
    return [json.loads(line) for line in (Path(result.transcript_dir) / "transcript.jsonl").read_text().splitlines()]


def solve_cells(link) -> list[Reply]:
    """Pick and place with ground-truth positions (test shortcut), ending with the jaw open above the bowl."""
    reader = link.twin.reader
    cube, bowl = reader.position("red_cube"), reader.position("black_bowl")

    def pose(p, dz):
        return {"position": [float(p[0]), float(p[1]), float(p[2] + dz)], "yaw_deg": 0}

    steps = [
        f"robot.move_to(pose={pose(cube, 0.12)})\nrobot.move_to(pose={pose(cube, 0.0225)})\n"
        "robot.move_to(gripper='close')",
        f"robot.move_to(pose={pose(cube, 0.15)}, mode='manipulation')\n"
        f"robot.move_to(pose={pose(bowl, 0.15)}, mode='manipulation')\nrobot.move_to(pose={pose(bowl, 0.06)})",
        "robot.release()\nrobot.move_to(gripper='open')\nrobot.recover(distance_m=0.05)",
    ]
    return [cell(code) for code in steps]


# ------------------------------------------------------------------------------------ outcomes
def test_a_solved_scene_and_an_accepted_finish_is_strict_success(link, tmp_path):
    link.reset(TASK, START, "any", "setup")
    policy = Scripted([*solve_cells(link), cell("r = robot.observe()\nprint(r['success'])\nfinish('cube in bowl')")])
    result = run(link, policy, tmp_path)
    assert result.outcome is Outcome.SUCCESS and result.host_success and result.finished, result.reason
    assert result.requests == 4 and result.actions == 9
    records = transcript(result)
    assert records[0]["type"] == "start" and records[-1]["type"] == "end"
    assert records[-1]["outcome"] == "success"
    assert sum(r["type"] == "call" for r in records) == 11  # 9 motions, observe, finish
    assert "## Outcome" in (Path(result.transcript_dir) / "transcript.md").read_text()


def test_finish_on_an_unsolved_scene_is_a_false_finish_and_the_gate_wants_a_measurement(link, tmp_path):
    policy = Scripted(
        [
            cell("robot.move_to(pose={'position': [0.45, 0.0, 0.3], 'yaw_deg': 0})\nprint(finish('done?'))"),
            cell("robot.get_robot_state()\nprint(finish('done?'))"),  # robot state alone does not verify
            cell("robot.observe()\nfinish('done')"),
        ]
    )
    result = run(link, policy, tmp_path)
    assert result.outcome is Outcome.FALSE_FINISH and result.host_success is False
    first, second = tool_texts(policy)[0], tool_texts(policy)[1]
    assert "gate_rejected" in first and "verify the scene" in first
    assert "gate_rejected" in second
    assert result.requests == 3


def test_solved_without_finish_is_stopped_as_a_missed_finish(link, tmp_path):
    link.reset(TASK, START, "any", "setup")
    policy = Scripted([*solve_cells(link), cell("print(robot.gripper_state()['value'])")])
    config = load_config()
    config = replace(config, agent=replace(config.agent, missed_finish_requests=3))
    result = run(link, policy, tmp_path, config=config)
    assert result.outcome is Outcome.MISSED_FINISH and result.host_success and not result.finished
    assert result.requests == 3 + 3 - 1  # solved after request 3; held before requests 4, 5 and 6: stopped at 6


# ------------------------------------------------------------------------------------ budgets
def test_the_request_budget_ends_the_episode(link, tmp_path):
    policy = Scripted([cell("print(robot.get_robot_state()['success'])")])
    result = run(link, policy, tmp_path, requests=3)
    assert result.outcome is Outcome.BUDGET_EXHAUSTED and result.requests == 3 and "requests" in result.reason


class _Stopper(CellLog):
    """A recorder with the RL rollouts' early-stop hook: a verdict before request `at`, or a hook that raises."""

    def __init__(self, at, verdict=None, error=None):
        super().__init__()
        self.at, self.verdict, self.error = at, verdict, error

    def stop_early(self, index):
        if index == self.at and self.error is not None:
            raise self.error
        return self.verdict if index == self.at else None


def test_an_early_stop_ends_the_episode_before_its_request_and_a_broken_hook_is_infrastructure(link, tmp_path):
    policy = Scripted([cell("print(robot.get_robot_state()['success'])")])
    result = run(link, policy, tmp_path, recorder=_Stopper(3, "V < 0.02 five times"), requests=10)
    assert result.outcome is Outcome.BUDGET_EXHAUSTED and result.requests == 2
    assert "stopped early before request 3: V < 0.02 five times" in result.reason
    policy = Scripted([cell("print(robot.get_robot_state()['success'])")])
    result = run(link, policy, tmp_path, recorder=_Stopper(2, error=ValueError("critic file truncated")), requests=10)
    assert result.outcome is Outcome.INFRASTRUCTURE and not result.valid
    assert "recording failed (stop_early): ValueError: critic file truncated" in result.reason


def test_the_action_budget_refuses_motions_and_ends_the_episode(link, tmp_path):
    moves = (
        "for z in (0.30, 0.32, 0.34):\n"
        "    print(robot.move_to(pose={'position': [0.45, 0.0, z], 'yaw_deg': 0})['failure_category'])"
    )
    policy = Scripted([cell(moves)])
    result = run(link, policy, tmp_path, physical_actions=2)
    assert result.outcome is Outcome.BUDGET_EXHAUSTED and result.actions == 2 and result.requests == 1
    record = next(r for r in transcript(result) if r["type"] == "request")
    assert "budget_exhausted" in record["replies"][0]["content"]


def test_the_wall_time_budget_follows_the_episode_clock(link, tmp_path):
    """A clock that advances 100 s per reading (an accelerated ROS clock) ends a 250 s episode early."""
    now = [0.0]

    def clock():
        now[0] += 100.0
        return now[0]

    policy = Scripted([cell("x = 1")])
    result = run(link, policy, tmp_path, clock=clock, wall_time_s=250.0)
    assert result.outcome is Outcome.BUDGET_EXHAUSTED and "wall time" in result.reason
    assert result.requests < 5


# ------------------------------------------------------------------------------------ bad replies
def test_a_reply_with_no_tool_call_ends_the_episode(link, tmp_path):
    """CaPtain's loop ends when a reply contains no tool call (normally right after finish()); an unsolved scene
    is then a failure, not a spent budget, and nothing is asked again."""
    policy = Scripted([cell("print(robot.get_robot_state()['success'])"), Reply("I cannot do this task.")])
    result = run(link, policy, tmp_path, requests=10)
    assert result.outcome is Outcome.FAILURE and result.valid and "no tool call" in result.reason
    assert result.requests == 2 and len(policy.prompts) == 2 and not result.finished


def test_a_tool_call_block_the_server_could_not_read_is_explained_and_the_episode_goes_on(link, tmp_path):
    """vLLM's hermes parser hands a reply back as plain content when its <tool_call> block is not JSON (here the
    Python-style escape \' a student wrote inside a string). It tried to call the tool: the model is told the JSON
    error and where, nothing runs, the request counts, and a reply without any tool call still ends the episode."""
    slip = '<tool_call>\n{"name": "python", "arguments": {"code": "print(\\\'hi\\\')"}}\n</tool_call>'
    cut = Reply('<tool_call>\n{"name": "python", "arguments": {"code": "print(1)', finish_reason="length")
    policy = Scripted([Reply("I look.\n" + slip), cut, cell("print('ok')"), Reply("Nothing more to do.")])
    result = run(link, policy, tmp_path, requests=10)
    assert result.requests == 4 and "no tool call" in result.reason
    first, second = policy.prompts[1][-1], policy.prompts[2][-1]
    assert first["role"] == "user" and first["content"].startswith("Your tool call could not be read, so nothing ran")
    assert "Invalid \\escape" in first["content"] and "print(\\'hi" in first["content"]
    assert "a JSON string knows only the escapes" in first["content"]
    assert "token limit inside its tool call" in second["content"]
    requests = [r for r in transcript(result) if r["type"] == "request"]
    assert [r["request"] for r in requests] == [1, 2, 3, 4]
    assert not [r for r in transcript(result) if r["type"] == "call"]  # nothing ran before the well-formed cell


def test_unread_tool_call_names_the_first_bad_block_and_ignores_replies_without_one():
    good = '<tool_call>{"name": "python", "arguments": {"code": "x"}}</tool_call>'
    assert unread_tool_call("plain text, no block") is None
    assert unread_tool_call(good) == "the server did not read the tool call"
    assert "not JSON: Expecting" in unread_tool_call(good + "<tool_call>{name: 1}</tool_call>")
    assert unread_tool_call('<tool_call>["python"]</tool_call>').startswith('the tool call is not {"name"')
    unclosed = '<tool_call>{"name": "python", "arguments": {"code": "x'
    assert "not JSON: Unterminated string" in unread_tool_call(unclosed)
    assert "token limit" in unread_tool_call(unclosed, "length")


def test_malformed_replies_are_explained_and_the_episode_goes_on(link, tmp_path):
    bad_json = Reply("x", [{"id": "a", "type": "function", "function": {"name": "python", "arguments": "{code: 1"}}])
    wrong_tool = Reply("x", [{"id": "b", "type": "function", "function": {"name": "bash", "arguments": "{}"}}])
    no_code = Reply("x", [{"id": "c", "type": "function", "function": {"name": "python", "arguments": "{}"}}])
    policy = Scripted(
        [
            bad_json,
            wrong_tool,
            no_code,
            Reply("I think the task is done."),  # no tool call
            cell("move the arm to the cube, then close the gripper"),
            cell("raise RuntimeError('my bug')"),
            cell("import os\nos._exit(3)"),
            cell("print(y)"),  # the session restarted: y is gone
            cell("robot.segment('red cube', 'head', 'obs-999')"),  # positional arguments, unknown handle
            cell("robot.move_to(pose={'position': [float('nan'), 0, 0.3], 'yaw_deg': 0})"),
        ]
    )
    config = load_config()
    config = replace(config, agent=replace(config.agent, end_on_no_tool_call=False))  # asked again instead
    log = CellLog()
    result = run(link, policy, tmp_path, config=config, recorder=log, requests=10)
    texts = tool_texts(policy)
    assert "not valid JSON" in texts[0]
    assert "unknown tool 'bash'" in texts[1]
    assert "needs a non-empty string argument `code`" in texts[2]
    assert "no tool call" in texts[3]
    assert "SyntaxError" in texts[4]
    assert "RuntimeError: my bug" in texts[5]
    assert "restarted" in texts[6]
    assert "NameError" in texts[7]
    assert "segment: FAILED" in texts[8] and "obs-999" in texts[8]
    assert result.outcome is Outcome.BUDGET_EXHAUSTED and result.requests == 10
    assert result.actions == 0  # the NaN pose moved nothing (refused before the action counted)
    # what the step records keep of each cell: how the reply carried it, its status, the error's last line
    statuses = [[(c["source"], c["status"]) for c in log.cells[t]] for t in range(1, 11)]
    assert statuses == [
        [("tool_call", "not_run")],
        [("tool_call", "not_run")],
        [("tool_call", "not_run")],
        [],  # no tool call, no fenced block: no cell
        [("tool_call", "error")],
        [("tool_call", "error")],
        [("tool_call", "crashed")],
        [("tool_call", "error")],
        [("tool_call", "ok")],  # the robot call failed; the cell did not raise
        [("tool_call", "ok")],
    ]
    assert log.cells[1][0]["error"].startswith("the tool arguments are not valid JSON")
    assert log.cells[2][0]["error"].startswith("unknown tool 'bash'")
    assert log.cells[5][0]["error"].startswith("SyntaxError")
    assert log.cells[6][0]["error"] == "RuntimeError: my bug"
    assert log.cells[8][0]["error"] == "NameError: name 'y' is not defined"


# ------------------------------------------------------------------------------------ infrastructure
def test_a_dead_policy_server_is_an_infrastructure_failure(link, tmp_path):
    client = PolicyClient(PolicyConfig(base_url="http://127.0.0.1:9/v1", max_retries=1, backoff_s=0.01))
    result = run(link, client, tmp_path)
    assert result.outcome is Outcome.INFRASTRUCTURE and not result.valid and "policy server" in result.reason
    assert result.host_success is None and result.requests == 0


class _Broken(InProcessLink):
    def call(self, capability, kwargs):
        if capability == "move_to":
            raise LinkError("/harness/call went away (its node stopped or restarted)")
        return super().call(capability, kwargs)


def test_a_lost_harness_link_mid_episode_is_an_infrastructure_failure(tmp_path):
    policy = Scripted([cell("print(robot.move_to(pose={'position': [0.45, 0.0, 0.3], 'yaw_deg': 0})['message'])")])
    result = run(_Broken(load_config()), policy, tmp_path)
    assert result.outcome is Outcome.INFRASTRUCTURE and "went away" in result.reason and result.requests == 1


def test_a_simulator_fault_is_an_infrastructure_failure(link, tmp_path):
    def fault(policy):
        link.twin.data.qpos[:] = float("nan")  # the simulation blows up under the next motion
        return cell("robot.move_to(pose={'position': [0.45, 0.0, 0.3], 'yaw_deg': 0})")

    policy = Scripted([fault])
    result = run(link, policy, tmp_path)
    assert result.outcome is Outcome.INFRASTRUCTURE and "backend" not in result.outcome.value
    assert result.host_success is None


# ------------------------------------------------------------------------------------ a hostile cell, bounded
def test_a_session_that_cannot_restart_ends_that_episode_only(link, tmp_path):
    """Any failure to start a session is a SandboxError: this episode is an infrastructure failure; the next runs."""
    from captain_ros.agent.sandbox import SandboxError

    class Failing:
        def __init__(self, box):
            self.box = box

        def run_cell(self, code):
            raise SandboxError("the sandbox cannot start: bwrap is gone")

        def close(self):
            self.box.close()

    failing = {"on": True}

    def factory(scratch, on_call, allowed):
        box = sandbox_factory(scratch, on_call, allowed)
        return Failing(box) if failing["on"] else box

    config = load_config()
    runner = EpisodeRunner(link, Scripted([cell("1 + 1")]), config, sandbox_factory=factory, runs_dir=tmp_path)
    first = runner.run(TASK, START)
    assert first.outcome is Outcome.INFRASTRUCTURE and "bwrap is gone" in first.reason
    failing["on"] = False
    runner.policy = Scripted([cell("1 + 1"), Reply("done")])
    second = runner.run(TASK, START)
    assert second.valid and second.requests == 2


def test_the_planted_scratch_link_escape_is_contained_through_the_episode_loop(link, tmp_path):
    """Issue 30's escape through EpisodeRunner + InProcessLink, with the sandbox as the agent node builds it."""
    policy = Scripted(
        [
            cell("import os; os.symlink('/', '/scratch/tmp'); os._exit(3)"),
            cell("import os; print('host root seen:', os.path.exists('/tmp/etc/hostname') or os.listdir('/tmp'))"),
            Reply("done"),
        ]
    )
    result = run(link, policy, tmp_path)
    texts = tool_texts(policy)
    assert "session was restarted" in texts[0]
    own = sorted({Path(d).parts[2] for d in _python_dirs(sys.executable) if Path(d).parts[:2] == ("/", "tmp")})
    assert f"host root seen: {own}" in texts[1]  # its own /tmp: empty, but for a venv bound there (a clone in /tmp)
    assert result.valid


def test_perception_calls_are_limited_per_request_and_observations_bounded(link, tmp_path):
    config = load_config()
    config = replace(config, budgets=replace(config.budgets, perception_calls_per_request=12))
    many = "results = [robot.observe() for _ in range(14)]\nprint([r['success'] for r in results].count(True))"
    policy = Scripted(
        [
            cell(many),
            cell("print(robot.segment('red cube', observation_handle='obs-1')['message'])"),
            Reply("done"),
        ]
    )
    result = run(link, policy, tmp_path, config=config)
    texts = tool_texts(policy)
    assert texts[0].startswith("12\n") and "at most 12 perception and measurement calls per request" in texts[0]
    assert "dropped obs-" in texts[0]  # the receipts say which observations went
    assert "obs-1 was dropped" in texts[2]  # the next request: a dropped handle is refused with why
    store = link.harness.perception.store
    assert len(store.all()) == config.perception.max_observations_kept
    assert result.valid


def test_a_call_with_arguments_too_deep_to_record_is_refused_and_the_transcript_stays_whole(link, tmp_path):
    policy = Scripted(
        [
            cell("d = x = {}\nfor _ in range(900):\n    x['a'] = {}\n    x = x['a']\nrobot.move_to(pose=d)"),
            cell("robot.get_robot_state()['success']"),
            Reply("done"),
        ]
    )
    result = run(link, policy, tmp_path)
    assert "nested more than" in tool_texts(policy)[0]
    records = transcript(result)
    assert [r["capability"] for r in records if r["type"] == "call"] == ["get_robot_state"]
    assert records[-1]["type"] == "end"


def test_the_transcript_writes_a_record_whatever_its_arguments(tmp_path):
    from captain_ros.agent.transcript import Transcript

    deep = x = {}
    for _ in range(5000):
        x["a"] = {}
        x = x["a"]
    t = Transcript(tmp_path)
    t.call(1, "move_to", {"pose": deep}, {"success": False, "message": "refused"})
    t.call(2, "hold", {}, {"success": True})
    records = [json.loads(line) for line in (tmp_path / "transcript.jsonl").read_text().splitlines()]
    assert [r["request"] for r in records] == [1, 2]
    assert "RecursionError" in records[0]["kwargs"]["unrecordable"]
    assert records[0]["result"] == {"success": False, "message": "refused"}


# ------------------------------------------------------------------------------------ a reply in a code block
def test_a_fenced_python_block_without_a_tool_call_runs_as_the_cell(link, tmp_path):
    """Small local models often answer with a ```python block and no tool call: the block runs as the cell, its output
    comes back as a user message (the form a chat template renders after a plain reply), the transcript says so."""
    policy = Scripted(
        [
            Reply(
                "I will look first.\n```python\nstate = robot.get_robot_state()\nprint('jaw', state['success'])\n```"
            ),
            Reply("Now the gate.\n```py\nprint(round(1.5 * 2))\n```\nand nothing else"),
            Reply("All done, no code here."),
        ]
    )
    result = run(link, policy, tmp_path)
    assert result.requests == 3 and result.reason == "the reply had no tool call: the episode ends"
    second_prompt = policy.prompts[1]
    assert second_prompt[-2]["role"] == "assistant" and "tool_calls" not in second_prompt[-2]
    assert second_prompt[-1]["role"] == "user" and second_prompt[-1]["content"].startswith(
        "[output of your python block]\njaw True"
    )
    assert policy.prompts[2][-1]["content"].startswith("[output of your python block]\n3\n")
    requests = [r for r in transcript(result) if r["type"] == "request"]
    assert requests[0]["fenced_code"] == "state = robot.get_robot_state()\nprint('jaw', state['success'])"
    assert [r["capability"] for r in transcript(result) if r["type"] == "call"] == ["get_robot_state"]
    assert requests[2]["fenced_code"] == ""


def test_fenced_python_picks_python_blocks_and_ignores_others():
    from captain_ros.agent.episode import fenced_python

    assert fenced_python("```python\na = 1\n```\ntext\n```py\nb = 2\n```") == "a = 1\n\nb = 2"
    assert fenced_python("```\nx = 3\n```") == "x = 3"
    assert fenced_python("```bash\nls\n```\n```\nx = 3\n```") == "x = 3"
    assert fenced_python("```json\n{}\n```") is None
    assert fenced_python("no code") is None and fenced_python("```python\n\n```") is None
    assert fenced_python("```python\nunclosed") is None


def test_a_fenced_block_can_be_turned_off(link, tmp_path):
    config = load_config()
    config = replace(config, agent=replace(config.agent, accept_fenced_code=False))
    policy = Scripted([Reply("```python\nprint(1)\n```")])
    result = run(link, policy, tmp_path, config=config)
    assert result.requests == 1 and "no tool call" in result.reason


def test_unread_tool_call_reasons_never_hold_the_markers():
    """The reason goes back to the model in a user message, where the template reads `<tool_call>` as its special
    token; a student echoing such a reason opened a new block. Not even the text quoted from the bad block holds one."""
    nested = '<tool_call>{"name": "python", "arguments": {"code": <tool_call>x}}</tool_call>'
    replies = [(nested, "stop"), ('<tool_call>{"name": "py', "length"), ("<tool_call>[1]</tool_call>", "stop")]
    for reply, finish in replies:
        reason = unread_tool_call(reply, finish)
        assert reason and "<tool_call>" not in reason and "</tool_call>" not in reason
