"""agent_node: the code-as-policy episode loop (captain_ros.agent) as a ROS 2 node.

It reaches the harness only through the harness nodes' interfaces:
  /harness/call, /perception/call         captain_interfaces/srv/HarnessCall   every robot call of a cell
  /harness/new_episode, /harness/gate     std_srvs/Trigger                     fresh budgets; gate read-back
  /perception/get_observation             captain_interfaces/srv/GetObservation  images attached to requests
  /twin/reset                             captain_interfaces/srv/ResetEpisode    with the twin only (use_twin)
  /twin/training_only/privileged_snapshot captain_interfaces/srv/GetPrivilegedSnapshot  the host's score, with
                                          the twin only; never shown to the policy
and publishes
  /agent/status      captain_interfaces/msg/EpisodeStatus   progress for operators (rviz, ros2 topic echo)
  /agent/heartbeat   std_msgs/Empty                         while the episode loop is alive (the motion
                                                            node's watchdog holds the arm when it stops)

It runs `episodes` episodes, prints a live view and a summary table, writes each episode's transcript
and `summary.json` under `runs_dir`, and exits (exit code 0 when every episode ran, 1 when an
infrastructure failure ended one). Budgets and the settle time follow this node's clock: with
`use_sim_time` (the twin) an episode means the same at any real-time factor.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.duration import Duration
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from std_msgs.msg import Empty
from std_srvs.srv import Trigger

from captain_interfaces.msg import EpisodeStatus
from captain_interfaces.srv import GetObservation, GetPrivilegedSnapshot, HarnessCall, ResetEpisode
from captain_ros.agent.link import EpisodeStart, HarnessLink, LinkError, Score
from captain_ros.core.clock import ForwardClock
from captain_ros.core.config import load_config
from captain_ros.core.contract import CAPABILITY_BY_NAME, PHYSICAL_CAPABILITIES
from captain_ros.paths import config_path
from captain_ros.ros.convert import budget_to_msg, call_result_from_msg
from captain_ros.ros.guard import GuardedNode
from captain_ros.ros.spin import close, init, request_stop, spin_until_stopped, stopping

PERCEPTION_GROUPS = ("perception", "measurement")
STOP_WAIT_S = 30.0  # how long Ctrl-C waits for the running episode to end and be written
GATE_VERIFY_OBJECTION = "verify the scene"


class RosLink(HarnessLink):
    """The harness through its ROS services; waits on futures, and gives up with LinkError as soon as the
    server goes away (a restarted node) or `call_timeout_s` passes."""

    def __init__(self, node: Node, *, use_twin: bool, call_timeout_s: float, gate_sync_s: float):
        self.node, self.use_twin = node, use_twin
        self.call_timeout_s, self.gate_sync_s = call_timeout_s, gate_sync_s
        group = ReentrantCallbackGroup()
        client = lambda kind, name: node.create_client(kind, name, callback_group=group)  # noqa: E731
        self.harness = client(HarnessCall, "/harness/call")
        self.perception = client(HarnessCall, "/perception/call")
        self.new_episode = client(Trigger, "/harness/new_episode")
        self.gate = client(Trigger, "/harness/gate")
        self.observation = client(GetObservation, "/perception/get_observation")
        self.reset_client = client(ResetEpisode, "/twin/reset") if use_twin else None
        self.snapshot = client(GetPrivilegedSnapshot, "/twin/training_only/privileged_snapshot") if use_twin else None
        self.episode_id = ""
        self.harness_episode = ""
        self.instruction = ""
        self._verified_since_motion = False

    def _call(self, client, request, what: str, timeout_s: float | None = None):
        limit = self.call_timeout_s if timeout_s is None else timeout_s
        if not client.wait_for_service(timeout_sec=limit):
            raise LinkError(f"{client.srv_name} is not available ({what}): its node is down or not started yet")
        done = threading.Event()
        future = client.call_async(request)
        future.add_done_callback(lambda _f: done.set())
        deadline = time.monotonic() + limit
        while not done.wait(0.2):
            if stopping():
                client.remove_pending_request(future)
                raise LinkError(f"the agent node is stopping (Ctrl-C or SIGTERM) during {what}")
            if not client.service_is_ready():
                client.remove_pending_request(future)
                raise LinkError(f"{client.srv_name} went away during {what} (its node stopped or restarted)")
            if time.monotonic() > deadline:
                client.remove_pending_request(future)
                raise LinkError(f"no answer from {client.srv_name} within {limit:.0f} s ({what})")
        if future.exception() is not None:
            raise LinkError(f"{client.srv_name} failed during {what}: {future.exception()}")
        return future.result()

    # ------------------------------------------------------------------------------ HarnessLink
    def reset(self, task: str, start_id: str | None, split: str, episode_id: str) -> EpisodeStart:
        from captain_ros.agent.prompt import task_md

        self.episode_id = episode_id
        start = EpisodeStart(episode_id, task, start_id or "", self.instruction or task)
        if self.use_twin:
            request = ResetEpisode.Request(task=task, start_id=start_id or "", split=split, episode_id=episode_id)
            response = self._call(self.reset_client, request, f"reset to {task}", timeout_s=120.0)
            if not response.success:
                raise ValueError(f"the twin refused the reset: {response.message}")
            start = EpisodeStart(
                response.episode_id, task, response.start_id, response.instruction, task_md=response.task_md
            )
        answer = self._call(self.new_episode, Trigger.Request(), "new episode", timeout_s=120.0)
        if not answer.success:
            raise LinkError(f"the motion node refused a new episode: {answer.message}")
        self.harness_episode = answer.message  # the motion node's episode: its budgets and the gate's record
        if not start.task_md:
            start.task_md = task_md(start.instruction, [], load_config().budgets)
        self._verified_since_motion = False
        self.physical_s = 0.0
        return start

    def call(self, capability: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        known = CAPABILITY_BY_NAME.get(capability)
        to_perception = known is not None and known.group in PERCEPTION_GROUPS
        if capability == "finish" and self._verified_since_motion:
            self._await_gate()
        try:
            args_json = json.dumps(kwargs, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise LinkError(f"the arguments of {capability} cannot be sent: {exc}") from None
        request = HarnessCall.Request(capability=capability, args_json=args_json, episode_id=self.episode_id)
        response = self._call(self.perception if to_perception else self.harness, request, capability)
        result = call_result_from_msg(response.result)
        if not to_perception and result.episode_id and result.episode_id != self.harness_episode:
            raise LinkError(
                f"the motion node answered {capability} for harness episode {result.episode_id}, not "
                f"{self.harness_episode}: it restarted mid-episode, and its budgets and the gate's record are gone"
            )
        out = {**result.to_dict(), "capability": result.capability, "receipt": result.receipt}
        if capability in PHYSICAL_CAPABILITIES and result.executed:
            self.physical_s += float((out.get("value") or {}).get("duration_s") or 0.0)
            self._verified_since_motion = False
        elif to_perception and result.success:
            self._verified_since_motion = True
        return out

    def _await_gate(self) -> None:
        """The perception node's receipts reach the motion node's gate on a topic: before finish, wait (on
        answers, bounded by gate_sync_s) until the gate has seen this agent's latest measurement."""
        deadline = time.monotonic() + self.gate_sync_s
        while time.monotonic() < deadline:
            answer = self._call(self.gate, Trigger.Request(), "gate read-back", timeout_s=10.0)
            if answer.success or GATE_VERIFY_OBJECTION not in answer.message:
                return
            time.sleep(0.05)

    def images(self, handle: str) -> list[tuple[str, np.ndarray]]:
        request = GetObservation.Request(handle=handle, include_depth=False)
        response = self._call(self.observation, request, f"images of {handle}", timeout_s=30.0)
        if not response.result.success:
            raise LinkError(response.result.message)
        obs = response.observation
        out = []
        for name, image in zip(obs.cameras, obs.color, strict=False):
            rgb = np.frombuffer(bytes(image.data), dtype=np.uint8).reshape(image.height, image.width, 3)
            out.append((name, rgb))
        return out

    def score(self) -> Score | None:
        if not self.use_twin:
            return None
        response = self._call(self.snapshot, GetPrivilegedSnapshot.Request(), "host score", timeout_s=30.0)
        if not response.success:
            raise LinkError(f"the twin could not score the scene: {response.message}")
        return Score(bool(response.snapshot.task_success), list(response.snapshot.subgoals_reached))

    def settle(self, seconds: float) -> None:
        self.node.get_clock().sleep_for(Duration(seconds=seconds))


class AgentNode(GuardedNode, Node):
    def __init__(self, **node_options: Any):
        super().__init__("agent", **node_options)
        d = lambda text: ParameterDescriptor(description=text)  # noqa: E731
        self.declare_parameter(
            "llm_base_url", "http://127.0.0.1:8000/v1", d("OpenAI-compatible endpoint of the policy (vLLM, expert)")
        )
        self.declare_parameter("model", "", d("served model name; empty = the server's only model"))
        self.declare_parameter(
            "task",
            "put_red_cube_in_bowl",
            d("task name (config/tasks.yaml) with the twin, or a comma-separated list the episodes cycle through"),
        )
        self.declare_parameter(
            "instruction", "", d("real arm: the instruction given to the policy (default: the task parameter)")
        )
        self.declare_parameter("start_id", "", d("twin start-state id; empty = sample one from `split`"))
        self.declare_parameter("split", "any", d("start ids are drawn from: train | eval | any"))
        self.declare_parameter("episodes", 1, d("episodes to run, then exit"))
        self.declare_parameter("use_twin", True, d("reset and score through the twin's services (false on a real arm)"))
        self.declare_parameter("runs_dir", "runs", d("transcripts and summary.json are written here"))
        self.declare_parameter(
            "harness_config", str(config_path("harness.yaml")), d("budgets, agent context and gate settings")
        )
        self.declare_parameter(
            "safety_config", str(config_path("safety.yaml")), d("limits (read for the config check)")
        )
        self.declare_parameter("call_timeout_s", 180.0, d("longest wait for one harness call (motions included)"))
        self.declare_parameter(
            "startup_timeout_s", 300.0, d("longest wait for the harness (and twin) services to appear")
        )
        self.declare_parameter("gate_sync_s", 10.0, d("longest wait for the gate to see a measurement before finish"))
        self.declare_parameter("request_timeout_s", 600.0, d("longest wait for one chat completion"))
        self.declare_parameter("send_images", True, d("attach camera images to requests (false for text-only models)"))
        self.declare_parameter("live_display", True, d("print each request's code, receipts and budget"))
        self.p = p = {name: self.get_parameter(name).value for name in self._parameters}
        self.status_pub = self.create_publisher(EpisodeStatus, "/agent/status", 10)
        self.heartbeat_pub = self.create_publisher(Empty, "/agent/heartbeat", 10)
        self.link = RosLink(
            self, use_twin=p["use_twin"], call_timeout_s=p["call_timeout_s"], gate_sync_s=p["gate_sync_s"]
        )
        self.link.instruction = p["instruction"]
        self.results: list = []
        self.display = None  # the live view, set when the episodes start (live_display)
        self.status = EpisodeStatus(state=EpisodeStatus.STATE_IDLE)
        self._worker = threading.Thread(target=self._run, name="episodes", daemon=True)
        self.create_timer(0.1, self._beat)
        self.done = threading.Event()

    def _beat(self) -> None:
        if self._worker.is_alive():
            self.heartbeat_pub.publish(Empty())

    def start(self) -> None:
        self._worker.start()

    def stop_work(self) -> None:
        """Ctrl-C or SIGTERM (captain_ros.ros.spin): the running episode ends at its next harness call (a link
        error, recorded as such) and its transcript and the summary are written; waits STOP_WAIT_S at most (a
        chat completion in flight is not interrupted)."""
        if self._worker.is_alive() and not self.done.wait(STOP_WAIT_S):
            self.get_logger().error(f"the episode did not end within {STOP_WAIT_S:.0f} s of the stop; leaving it")

    def _on_event(self, kind: str, data: dict) -> None:
        s = self.status
        s.header.stamp = self.get_clock().now().to_msg()
        s.episode_id = data.get("episode_id", s.episode_id)
        s.budget = budget_to_msg(data["budget"])
        if kind == "start":
            s.instruction, s.state, s.request_index, s.outcome = (
                data["instruction"],
                EpisodeStatus.STATE_RUNNING,
                0,
                "",
            )
        elif kind == "reply":
            s.request_index = data["request"]
        elif kind == "output":
            s.last_receipt = data["text"].splitlines()[-2][:300] if data["text"].count("\n") else ""
        elif kind == "end":
            r = data["result"]
            s.state = EpisodeStatus.STATE_ABORTED if not r.valid else EpisodeStatus.STATE_FINISHED
            s.outcome = r.outcome.value
        self.status_pub.publish(s)
        if self.display is not None:
            self.display(kind, data)

    def _run(self) -> None:
        from dataclasses import replace

        from captain_ros.agent.display import LiveDisplay, summary_table
        from captain_ros.agent.episode import EpisodeRunner
        from captain_ros.agent.policy_client import PolicyClient, PolicyConfig
        from captain_ros.agent.sandbox import Sandbox, SandboxLimits

        p = self.p
        try:
            config = load_config(Path(p["safety_config"]), Path(p["harness_config"]))
            config = replace(
                config, agent=replace(config.agent, send_images=p["send_images"] and config.agent.send_images)
            )
            policy = PolicyClient(
                PolicyConfig(
                    base_url=p["llm_base_url"],
                    model=p["model"],
                    max_tokens=config.agent.max_new_tokens,
                    temperature=config.agent.temperature,
                    request_timeout_s=p["request_timeout_s"],
                )
            )
            self.display = LiveDisplay() if p["live_display"] else None
            limits = SandboxLimits(cell_timeout_s=config.agent.cell_timeout_s)
            if os.geteuid() == 0:
                self.get_logger().warning(
                    "the agent runs as root, so the model's code runs as host root inside its sandbox: run the "
                    "agent node as an unprivileged user (docs/deployment.md)"
                )

            def sandbox(scratch, on_call, allowed):
                box = Sandbox(scratch, on_call, allowed, limits)
                box.start()
                return box

            clock = ForwardClock(lambda: self.get_clock().now().nanoseconds * 1e-9)  # sim time with the twin
            runner = EpisodeRunner(
                self.link,
                policy,
                config,
                sandbox_factory=sandbox,
                runs_dir=Path(p["runs_dir"]),
                clock=clock,
                on_event=self._on_event,
            )
            self._await_services(p["startup_timeout_s"])
            tasks = [t.strip() for t in p["task"].split(",") if t.strip()]
            for i in range(int(p["episodes"])):
                if stopping():
                    break
                task = tasks[i % len(tasks)]
                self.status.task = task
                self.results.append(runner.run(task, p["start_id"] or None, p["split"]))
            print(summary_table(self.results), flush=True)
            runs = Path(p["runs_dir"])
            runs.mkdir(parents=True, exist_ok=True)
            (runs / "summary.json").write_text(json.dumps([r.summary() for r in self.results], indent=1))
        except Exception as exc:
            self.get_logger().fatal(f"the agent stopped: {type(exc).__name__}: {exc}")
            self.results.append(None)
        finally:
            self.done.set()
            request_stop()  # the episodes are over: the node exits

    def _await_services(self, timeout_s: float) -> None:
        link = self.link
        needed = [link.harness, link.perception, link.new_episode, link.gate, link.observation]
        needed += [link.reset_client, link.snapshot] if link.use_twin else []
        deadline = time.monotonic() + timeout_s
        for client in needed:
            if not client.wait_for_service(timeout_sec=max(0.0, deadline - time.monotonic())):
                raise LinkError(f"{client.srv_name} did not appear within {timeout_s:.0f} s: is the stack up?")
        self.get_logger().info("harness services are up")


def main(args: list[str] | None = None) -> None:
    init(args)
    node: AgentNode | None = None
    executor: MultiThreadedExecutor | None = None
    try:
        node = AgentNode()
        executor = MultiThreadedExecutor(num_threads=4)
        executor.add_node(node)
        node.start()
        spin_until_stopped(executor)
    except KeyboardInterrupt:
        pass
    finally:
        close(executor, node)
    ok = node is not None and node.done.is_set() and all(r is not None and r.valid for r in node.results)
    raise SystemExit(0 if ok else 1)
