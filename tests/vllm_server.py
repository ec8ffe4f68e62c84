"""A real vLLM OpenAI server on the tiny Qwen2 model, started once per test session for the tests that ask
(the `vllm_server` fixture, registered in tests/conftest.py); `render` is transformers' rendering of a
conversation with the same model, run in .venv-vllm."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from captain_ros_training import serve

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ROOT / ".cache" / "tiny-qwen2"
START_LIMIT_S = 600.0  # about 35 s on 2 cores; generous for a loaded CI machine


def build_tiny_model(out: Path = TINY_MODEL) -> Path:
    """tools/make_tiny_model.py in .venv-vllm (a no-op when `out` holds the current recipe); skips the test
    when the vLLM environment is missing."""
    python = serve.vllm_python()
    if not python.exists():
        pytest.skip(f"{python} does not exist: `make setup` builds .venv-vllm (step 'vllm')")
    build = subprocess.run(
        [str(python), str(ROOT / "tools" / "make_tiny_model.py"), str(out)],
        capture_output=True,
        text=True,
        env=serve.vllm_env(),
        timeout=600,
    )
    assert build.returncode == 0, f"tools/make_tiny_model.py failed:\n{build.stdout}\n{build.stderr}"
    return out


def start_healthy(model_dir: Path, log: Path, **options) -> serve.PolicyServer:
    """captain_ros_training.serve.start_server, waited for; a server that cannot start fails the test with its log."""
    server = serve.start_server(model_dir, log, **options)
    try:
        server.wait_healthy(START_LIMIT_S)
    except serve.ServerError as exc:
        server.stop()
        pytest.fail(str(exc))
    except BaseException:  # the test's timeout or an interrupt: the server must not outlive the test
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory) -> Iterator[serve.PolicyServer]:
    """A real vLLM OpenAI server on the tiny Qwen2, for the whole session."""
    server = start_healthy(build_tiny_model(), tmp_path_factory.mktemp("vllm") / "server.log")
    try:
        yield server
    finally:
        server.stop()


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
