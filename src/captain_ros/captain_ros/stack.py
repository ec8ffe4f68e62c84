"""The main job without a ROS install: bring up the same ROS graph `agent.launch.py` starts (twin node,
motion and perception nodes, the scripted-expert policy server unless a policy URL is given, and the
agent node), from the same config files, as separate processes on an isolated DDS domain; run the
episodes with the agent's live view on this terminal; print the summary; stop everything.

Each node's log goes to <runs_dir>/logs/<node>.log; the agent writes transcripts and summary.json.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from captain_ros.core.domains import claim_ros_domain, fast_dds_profile_env
from captain_ros.paths import config_path

EXPERT_READY_TIMEOUT_S = 120.0


def interrupt(proc: subprocess.Popen, grace_s: float) -> None:
    """Stop a node process as Ctrl-C would (its shutdown runs: a motion node holds the arm), killing it if it has
    not ended `grace_s` later."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass(frozen=True)
class RunOptions:
    tasks: str = "put_red_cube_in_bowl,stack_red_on_blue,open_drawer"
    start_id: str = ""
    split: str = "eval"
    episodes: int = 3
    policy_url: str = ""  # "" = start the scripted expert
    model: str = ""
    runs_dir: Path = Path("runs")
    real_time_factor: float = 1.0
    send_images: bool = True
    domain_id: int = 0  # 0 = pick one in 101..200 (away from the tests' 1..100)


def _executable(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    return str(found) if found.exists() else (shutil.which(name) or name)


def start_ready(
    argv: list[str], env: dict[str, str], log: Path, what: str, timeout_s: float = EXPERT_READY_TIMEOUT_S
) -> tuple[subprocess.Popen, str]:
    """Start a service that prints `READY <url>` on stdout once it listens (its stderr goes to `log`); returns
    the process and the URL. Raises RuntimeError naming the log if it exits or stays silent."""
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, start_new_session=True
    )
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            if line.startswith("READY ") and not ready.is_set():
                found.append(line.split()[1])
                ready.set()
        ready.set()  # stdout closed: the process ended

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(timeout_s) or not found:
        proc.kill()
        raise RuntimeError(f"the {what} did not start; see {log}")
    return proc, found[0].rstrip("/")


# The perception node's wall-clock stream limits against the twin (production for real cameras: 2 s, 1 s and
# 0.5 s). Its use_sim_time would judge them on /clock instead, but /clock at 100 Hz woke its executor so often that
# the node took a whole core. The waits end on the message's arrival; these are only their caps.
TWIN_PERCEPTION_LIMITS = (("stale_after_s", 30.0), ("pair_wait_s", 10.0), ("tf_wait_s", 10.0))


def start_expert(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """The scripted-expert policy server on a free loopback port; returns the process and its /v1 URL."""
    argv = [sys.executable, "-m", "captain_ros.cli", "expert-server", "--host", "127.0.0.1", "--port", "0"]
    proc, url = start_ready(argv, env, log, "expert server")
    return proc, url.removesuffix("/v1") + "/v1"


class Stack:
    def __init__(self, options: RunOptions):
        self.o = options
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.run_dir = Path(options.runs_dir) / stamp
        self.logs = self.run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ)
        self.env.setdefault("MUJOCO_GL", "egl")
        self.env["ROS_DOMAIN_ID"] = str(options.domain_id or claim_ros_domain(101, 200))
        self.env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        self.env.update(fast_dds_profile_env(self.env))
        self.env.setdefault("ROS_HOME", str(self.run_dir / "ros_home"))
        self.procs: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, args: list[str], *, to_terminal: bool = False) -> subprocess.Popen:
        log = None if to_terminal else (self.logs / f"{name}.log").open("w")
        proc = subprocess.Popen(
            args,
            env=self.env,
            stdout=None if to_terminal else log,
            stderr=subprocess.STDOUT if log else None,
            start_new_session=True,  # Ctrl-C reaches us; we stop the children in order
            text=True,
        )
        self.procs[name] = proc
        return proc

    def _node(self, executable: str, *params: tuple[str, object], params_file: Path | None = None) -> list[str]:
        args = [_executable(executable), "--ros-args"]
        if params_file is not None:
            args += ["--params-file", str(params_file)]
        for key, value in params:
            args += ["-p", f"{key}:={value}"]
        return args

    def run(self) -> int:
        o = self.o
        first_task = o.tasks.split(",")[0].strip()
        print(f"captain_ros: run {self.run_dir} (ROS_DOMAIN_ID {self.env['ROS_DOMAIN_ID']}; node logs in {self.logs})")
        try:
            url = o.policy_url
            if not url:
                self.procs["expert"], url = start_expert(self.env, self.logs / "expert.log")
            print(f"captain_ros: policy {url}{' (scripted expert)' if not o.policy_url else ''}")
            self._start(
                "twin",
                self._node(
                    "twin_node",
                    ("task", first_task),
                    ("split", o.split),
                    ("real_time_factor", float(o.real_time_factor)),
                    params_file=config_path("twin.yaml"),
                ),
            )
            self._start("motion", self._node("motion_node", ("use_sim_time", "true")))
            # the twin's images on a busy host come late in wall time, not never (the motion node's lockstep limit)
            self._start("perception", self._node("perception_node", *TWIN_PERCEPTION_LIMITS))
            agent = self._start(
                "agent",
                self._node(
                    "agent_node",
                    ("llm_base_url", url),
                    ("model", json.dumps(o.model)),
                    ("task", o.tasks),
                    ("start_id", json.dumps(o.start_id)),
                    ("split", o.split),
                    ("episodes", int(o.episodes)),
                    ("runs_dir", str(self.run_dir)),
                    ("send_images", str(o.send_images).lower()),
                    ("use_sim_time", "true"),
                ),
                to_terminal=True,
            )
            while agent.poll() is None:
                dead = [n for n, p in self.procs.items() if n != "agent" and p.poll() is not None]
                if dead:
                    print(f"captain_ros: {', '.join(dead)} exited early; see {self.logs}", file=sys.stderr)
                    return 1
                time.sleep(0.5)
            return agent.returncode
        except KeyboardInterrupt:
            print("\ncaptain_ros: interrupted; stopping the stack (the arm holds)", file=sys.stderr)
            return 130
        finally:
            self.stop()

    def stop(self) -> None:
        """Agent first (its heartbeat stops, the watchdog holds the arm), then the harness, then the twin."""
        for name in ("agent", "expert", "perception", "motion", "twin"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            interrupt(proc, grace_s=10.0)
