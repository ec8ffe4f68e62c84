"""A real vLLM OpenAI server on the tiny Qwen2 model, started once per test session for the tests that ask
(the `vllm_server` fixture, registered in tests/conftest.py); `render` is transformers' rendering of a
conversation with the same model, run in .venv-vllm."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
VLLM_VENV = ROOT / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
TINY_MODEL = ROOT / ".cache" / "tiny-qwen2"
START_LIMIT_S = 600.0  # about 35 s on 2 cores; generous for a loaded CI machine
# The flags the stack expects (captain_ros.agent.policy_client's docstring says why).
SERVER_FLAGS = [
    "--dtype",
    "bfloat16",
    "--max-model-len",
    "8192",  # the agent's system prompt and TASK.md alone are ~3k tokens of the tiny tokenizer
    "--enforce-eager",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--max-logprobs",
    "5",
    "--logprobs-mode",
    "processed_logprobs",
]


@dataclass(frozen=True)
class VllmServer:
    base_url: str  # the OpenAI API root, .../v1
    model_dir: Path  # what it serves; also its model name
    python: Path  # .venv-vllm's interpreter (transformers, tokenizers) for checks beside the server
    log: Path  # the server's stdout and stderr


def vllm_env() -> dict[str, str]:
    """The test process's environment without what belongs to .venv (the ROS wheels' library path), offline."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH"}}
    env.pop("_ROS_WHEELS_BOOTSTRAP_COMPLETE", None)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache: plenty for 8,192-token sequences of this model
        PATH=f"{VLLM_VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(log: Path, lines: int = 40) -> str:
    if not log.exists():
        return "(no log)"
    with log.open(errors="replace") as fh:
        return "".join(collections.deque(fh, maxlen=lines))


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (it runs its engine in a child process), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory) -> Iterator[VllmServer]:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"{VLLM_VENV} does not exist: `make setup` builds it (step 'vllm')")
    env = vllm_env()
    build = subprocess.run(
        [str(VLLM_PYTHON), str(ROOT / "tools" / "make_tiny_model.py"), str(TINY_MODEL)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert build.returncode == 0, f"tools/make_tiny_model.py failed:\n{build.stdout}\n{build.stderr}"

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    port = _free_port()
    cmd = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(TINY_MODEL),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *SERVER_FLAGS,
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent, start_new_session=True
        )
    try:
        t0 = time.monotonic()
        health = f"http://127.0.0.1:{port}/health"
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"the vLLM server exited with {proc.returncode} while starting:\n{' '.join(cmd)}\n{_tail(log)}"
                )
            if time.monotonic() - t0 > START_LIMIT_S:
                pytest.fail(
                    f"the vLLM server was not healthy after {START_LIMIT_S:.0f} s:\n{' '.join(cmd)}\n{_tail(log)}"
                )
            try:
                if httpx.get(health, timeout=5.0, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)  # poll interval, not a wait for readiness
        yield VllmServer(base_url=f"http://127.0.0.1:{port}/v1", model_dir=TINY_MODEL, python=VLLM_PYTHON, log=log)
    finally:
        _stop(proc)


# Runs in .venv-vllm: transformers is not in .venv.
RENDER = """
import json, sys
from transformers import AutoTokenizer
req = json.load(sys.stdin)
tok = AutoTokenizer.from_pretrained(req["model_dir"])
kw = dict(tools=req["tools"] or None, add_generation_prompt=True)
ids = tok.apply_chat_template(req["messages"], tokenize=True, return_dict=False, **kw)
print(json.dumps({"ids": list(ids), "text": tok.apply_chat_template(req["messages"], tokenize=False, **kw)}))
"""


def render(server, messages: list[dict], tools: list[dict]) -> dict:
    """transformers' apply_chat_template of the tiny model, in .venv-vllm: {"ids": [...], "text": "..."}."""
    request = json.dumps({"model_dir": str(server.model_dir), "messages": messages, "tools": tools})
    done = subprocess.run(
        [str(server.python), "-c", RENDER], input=request, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
