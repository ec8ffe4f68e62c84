"""A vLLM OpenAI server on a policy folder, with the flags the stack needs, for the trainer's own runs
(captain_ros_training/sft_then_rl.py) and the tests that need a real policy server.

vLLM lives in its own environment (`.venv-vllm`, made by `make setup`; another with CAPTAIN_VLLM_PYTHON): it
pins its own torch and transformers. The server runs in a process group of its own, because vLLM runs its
engine in a child process and both must go when it is stopped.

The flags are the ones captain_ros.agent.policy_client relies on: hermes tool calls, the sampled distribution's
log-probabilities (`processed_logprobs`), eager mode (no CUDA graphs to capture on CPU). With `dev_mode`
(VLLM_SERVER_DEV_MODE=1) the server also offers the routes captain_ros_training.weight_sync uses to load new weights
without a restart.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from captain_ros.bridge.services import free_port, signal_group

REPO = Path(__file__).resolve().parents[3]  # a source checkout: src/captain_ros/captain_ros_training/serve.py


class ServerError(RuntimeError):
    """The server could not start, or exited while starting: the message ends with its log's tail."""


def vllm_python() -> Path:
    """The interpreter of the vLLM environment: $CAPTAIN_VLLM_PYTHON, else the checkout's .venv-vllm."""
    return Path(os.environ.get("CAPTAIN_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")


def vllm_env(dev_mode: bool = False, kv_cache_gib: int = 1) -> dict[str, str]:
    """This process's environment without what belongs to .venv (the ROS wheels' library path), offline."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH"}}
    env.pop("_ROS_WHEELS_BOOTSTRAP_COMPLETE", None)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib),  # GiB of KV cache (1: plenty for the tiny model's sequences)
        PATH=f"{vllm_python().parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def server_flags(dtype: str = "bfloat16", max_model_len: int = 8192) -> list[str]:
    return [
        "--dtype", dtype, "--max-model-len", str(max_model_len), "--enforce-eager",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--max-logprobs", "5", "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip


@dataclass
class PolicyServer:
    proc: subprocess.Popen
    root: str  # http://127.0.0.1:<port>
    model_dir: Path  # what it serves; also its model name
    log: Path  # its stdout and stderr
    python: Path  # the vLLM environment's interpreter (transformers, tokenizers) for checks beside the server
    name: str = "vLLM"  # what serves, for messages (captain_ros_training.hf_serve: "the transformers server")

    @property
    def base_url(self) -> str:
        """The OpenAI API root."""
        return f"{self.root}/v1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return "(no log)"
        with self.log.open(errors="replace") as fh:
            return "".join(collections.deque(fh, maxlen=lines))

    def wait_healthy(self, limit_s: float = 600.0) -> float:
        """Seconds until /health answered 200 (about 35 s on 2 cores); ServerError if it exits or takes longer
        than `limit_s`."""
        import httpx

        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None:
                raise ServerError(f"{self.name} exited with {self.proc.returncode} while starting:\n{self.tail()}")
            if time.monotonic() - t0 > limit_s:
                raise ServerError(f"{self.name} was not healthy after {limit_s:.0f} s:\n{self.tail()}")
            try:
                if httpx.get(f"{self.root}/health", timeout=5.0, trust_env=False).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)  # poll interval, not a wait for readiness

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL if it lingers; safe to call more than once."""
        if not signal_group(self.proc, signal.SIGTERM, 30.0):
            signal_group(self.proc, signal.SIGKILL, 10.0)


def model_argument(model_dir: str | Path) -> str:
    """The --model a server process is started with: a local folder as an absolute path (servers run in their
    log's folder, where a relative path names nothing and vLLM would take it for a hub id), anything else as given."""
    return str(Path(model_dir).resolve()) if Path(model_dir).exists() else str(model_dir)


def start_server(
    model_dir: str | Path,
    log: str | Path,
    *,
    dtype: str = "bfloat16",
    max_model_len: int = 8192,
    dev_mode: bool = False,
    kv_cache_gib: int = 1,
) -> PolicyServer:
    """Start vLLM on `model_dir` (not waited for: call `wait_healthy()`; starting early lets it boot while the
    caller does other work). ServerError when the vLLM environment is missing."""
    python = vllm_python()
    if not python.exists():
        raise ServerError(f"{python} does not exist: `make setup` builds .venv-vllm (or set CAPTAIN_VLLM_PYTHON)")
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model_argument(model_dir)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *server_flags(dtype, max_model_len)]
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=vllm_env(dev_mode, kv_cache_gib),
            cwd=log.parent,
            start_new_session=True,
        )
    return PolicyServer(proc, f"http://127.0.0.1:{port}", Path(model_dir), log, python)
