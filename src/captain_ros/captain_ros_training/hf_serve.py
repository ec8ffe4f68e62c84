"""A policy server without vLLM: the stack's subset of the OpenAI chat API over a batching engine.

For a GPU host that has torch and transformers but no vLLM, no fastapi and no network
(docs/gpu_host_without_network.md): `python -m captain_ros_training hf-serve --model DIR --port N` serves one local
model folder with the same answers captain_ros.agent.policy_client reads from vLLM (`--enable-auto-tool-choice
--tool-call-parser hermes --logprobs-mode processed_logprobs`), so episodes run and record unchanged:

- `GET /health` (200 once the model is loaded; 500 once the engine died), `GET /v1/models` (the folder path as given
  is the model name, with `max_model_len`);
- `POST /v1/chat/completions`, non-streaming, one choice: the prompt is the folder's chat template over `messages`
  and `tools` with the generation prompt, rendered by captain_ros_training.gate.render_prompt_ids (the gate's own
  rendering, so recorded `prompt_token_ids` pass the gate by construction) after what vLLM does to messages first: an
  assistant tool call's `function.arguments` JSON string becomes a dict (not JSON: {}), so the template's `tojson`
  renders it. The answer carries `prompt_token_ids`, `token_ids` (sampled, the stop token included, as vLLM) and one
  logprob per sampled token when asked; `<tool_call>` blocks become `tool_calls` as vLLM's hermes parser makes them.

Engines (`--engine`), each one background generation thread, so the requests of many concurrent episodes share each
forward pass; each HTTP handler thread renders its prompt, queues it and waits on its own event:

- `slots` (the default, captain_ros_training.slot_engine): a dense KV-cache slot per running request and one decode step
  for all of them, on captain_ros_training.fast's Qwen2 layers; Qwen2-family models. On an H100 it served 33 agent
  episodes at about 1,800 tokens/s where the engine below served 65 at 362.
- `cb`: transformers' continuous batching (`model.init_continuous_batching`, a paged KV cache with prefix sharing);
  any model transformers runs. A dispatcher thread hands finished outputs to the waiting handlers.

Sampling is `sample_rows` under both. transformers' own sampling cannot serve this alone: do_sample and the seed are
per manager, not per request, and its per-request temperature and top-p processors exist only when the manager's
config sets non-default values. So under `cb` the manager runs greedy with no logits processors and this module
replaces its sampling step (`ModelRunner._sample`, checked at start-up; transformers 5.24) with `sample_rows`, which
reads each row's request settings: temperature, top-k, top-p and seed per request, as vLLM: temperature below 1e-5
is greedy; sampled rows use the exponential race (argmax of p / q, q ~ Exp(1): a draw from p, vLLM's method), from a
per-request generator when the request has a seed, else from the server's (`--seed`). CUDA graphs, compile and async
double-buffering stay off: the sampler is Python per batch and reads the batch's request list. Attention under `cb`
(`--attn-implementation varlen`, the default): each request's new tokens attend to its own cached keys only
(`varlen_attention`: flash varlen on CUDA, checked at start-up). transformers' `sdpa` under continuous batching
masks one attention of all the batch's queries over all its requests' keys: on an H100 with 32 episodes of
2-6k-token contexts it generated about 8 tokens/s per request (260 in all) for this 0.5B model.

Logprobs: vLLM's `processed_logprobs`, the log-probability of the sampled token under the distribution it was drawn
from (logits / temperature, then top-k and top-p, renormalised); a greedy request gets the temperature-1 distribution,
as vLLM's greedy rows have. Stopping: the tokenizer's eos and the folder's generation_config eos ids, `max_tokens`,
or the context (`--max-model-len`): a prompt with no room for one token is refused (HTTP 400), a longer completion is
cut at the context with finish_reason "length". Request params the folder's generation_config would default in vLLM
(temperature, top_p, top_k) default the same here; its repetition_penalty / min_p are not applied (a warning says so).

New weights without a restart (`--weight-reload`, the slot engine): vLLM's dev-mode routes that
captain_ros_training.weight_sync drives, so RL rounds on a GPU host without vLLM sync the same way: `POST
/pause?mode=wait` (no request admitted, the running ones finish: none is decoded with two weight versions), `POST
/collective_rpc {"method": "reload_weights"}` (the folder's safetensors copied into the parameters in place, the
engine's fused copies refreshed, its self-check rerun on the new weights), `POST /reset_prefix_cache` (the slot
engine keeps no cache between requests), `POST /update_weight_version`, `GET /weight_info`, `POST /resume`. Without
the flag they answer 404, as vLLM's do without VLLM_SERVER_DEV_MODE.

Not served: streaming, n > 1, top_logprobs > 0, tool_choice "required" or named, `/v1/completions` (weight_sync's
optional probe): all refused with HTTP 400 or 404. Errors are
OpenAI-shaped `{"error": {"message"}}`: 400 for a bad request, 404 for an unknown route or model, 500 when the engine
failed or died (a request never waits longer than `--request-timeout-s`).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from captain_ros_training.gate import render_prompt_ids

# src/captain_ros: what the server's process (`python -m captain_ros_training hf-serve`) needs on sys.path
SRC = Path(__file__).resolve().parents[1]
GREEDY_EPS = 1e-5  # temperatures below this are greedy (vLLM's _SAMPLING_EPS)
NEG_LOGPROB = -9999.0  # what vLLM reports for a -inf logprob (JSON has no infinity)
THROUGHPUT_LOG_S = 30.0  # how often the engine logs its generation speed while it generates
ENGINES = ("slots", "cb")  # captain_ros_training.slot_engine (the default), transformers' continuous batching
TESTED_TRANSFORMERS = "5.24"  # the continuous-batching internals this module hooks were read in this version

log = logging.getLogger("hf_serve")


class RequestError(ValueError):
    """The request cannot be served as sent (HTTP `status`, 400 unless said)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class EngineError(RuntimeError):
    """The generation engine failed this request or is dead (HTTP 500)."""


# ------------------------------------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class ServeConfig:
    """What to serve and how; the command line's flags (`--help` explains each)."""

    model: str  # the model folder, as given: also the served model name
    host: str = "127.0.0.1"
    port: int = 8000
    max_model_len: int = 32768  # prompt + completion tokens per request at most
    dtype: str = "auto"  # auto (bfloat16 on CUDA, float32 on CPU) | bfloat16 | float16 | float32
    device: str = "auto"  # auto (cuda if available, else cpu) | cpu | cuda | cuda:N
    # slots (captain_ros_training.slot_engine; Qwen2 family) | cb (transformers' continuous batching)
    engine: str = "slots"
    attn_implementation: str = "varlen"  # cb only: or sdpa, paged|eager, flash_attention_2 (where the package exists)
    page_size_tokens: int = 256  # KV-cache page
    kv_cache_tokens: int | None = None  # None: free GPU memory on CUDA; on CPU 4 x max_model_len, >= 16 pages
    kv_cache_memory_fraction: float = 0.8  # of the free GPU memory after loading, for the cache (auto sizing)
    max_batch_tokens: int | None = None  # tokens per forward pass; None: transformers' default (8192)
    max_num_seqs: int = 256  # requests per forward pass at most
    cuda_graphs: bool = False  # slots only: decode steps replayed from CUDA graphs (captain_ros_training.slot_engine)
    prefix_sharing: bool = True  # reuse cached KV pages of a shared prompt prefix (multi-turn episodes)
    seed: int | None = None  # of the server's sampling generator (requests without their own seed)
    request_timeout_s: float = 3600.0  # a request waiting longer is cancelled and answered 500
    weight_reload: bool = False  # serve the weight-reload routes (module doc; the slot engine only)


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings (OpenAI / vLLM semantics)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


@dataclass
class Generated:
    """What the engine sampled for one request."""

    token_ids: list[int]
    logprobs: list[float]
    stopped: bool  # ended on a stop token (the last of token_ids), not on a length limit


# ------------------------------------------------------------------------------------------------ sampling
def sample_rows(logits: Any, params: list[SamplingParams], generators: list[Any], generator: Any) -> tuple[Any, Any]:
    """One token per row of `logits` ([rows, vocab], fp32) under each row's `params`, and its processed logprob.

    A sampled row draws from softmax(top-p(top-k(logits / temperature))) by the exponential race, its noise from the
    row's generator (a seeded request's own) or else from `generator`; a greedy row takes the argmax and reports the
    temperature-1 logprob. Returns (tokens int64 [rows], logprobs fp32 [rows])."""
    import torch

    vocab = logits.shape[1]
    device = logits.device
    greedy = [p.greedy for p in params]
    temps = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)], device=device)
    z = logits / temps.unsqueeze(1)
    top_k = [vocab if g or p.top_k <= 0 else min(p.top_k, vocab) for p, g in zip(params, greedy, strict=True)]
    if min(top_k) < vocab:
        kth = torch.topk(z, max(top_k), dim=-1).values  # [rows, max_k], descending
        index = torch.tensor(top_k, device=device).sub(1).clamp(max=kth.shape[1] - 1).unsqueeze(1)
        threshold = torch.where(torch.tensor(top_k, device=device) < vocab, kth.gather(1, index).squeeze(1), -math.inf)
        z = z.masked_fill(z < threshold.unsqueeze(1), -math.inf)
    top_p = [1.0 if g else p.top_p for p, g in zip(params, greedy, strict=True)]
    if min(top_p) < 1.0:
        sorted_z, order = torch.sort(z, dim=-1)  # ascending, as vLLM and transformers cut the nucleus
        cumulative = sorted_z.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1.0 - torch.tensor(top_p, device=device)).unsqueeze(1)
        drop[:, -1] = False  # the most likely token always stays
        z = z.masked_fill(drop.scatter(1, order, drop), -math.inf)
    logp = torch.log_softmax(z, dim=-1)
    tokens = logits.argmax(dim=-1)
    if not all(greedy):
        noise = torch.empty_like(logp).exponential_(generator=generator)
        for i, row_generator in enumerate(generators):
            if row_generator is not None and not greedy[i]:
                noise[i].exponential_(generator=row_generator)
        drawn = (logp - noise.clamp_min(1e-20).log()).argmax(dim=-1)
        tokens = torch.where(torch.tensor(greedy, device=device), tokens, drawn)
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens, torch.nan_to_num(chosen, nan=NEG_LOGPROB, neginf=NEG_LOGPROB)


# ------------------------------------------------------------------------------------------------ engine
class Throughput:
    """Tokens sampled, requests finished and the largest batch since the last log line (the operator's view of
    whether concurrent episodes are batched, and how fast); both engines keep one."""

    def __init__(self) -> None:
        self._reset(time.monotonic())

    def _reset(self, now: float) -> None:
        self.tokens, self.requests, self.largest_batch, self.since = 0, 0, 0, now

    def sampled(self, rows: int) -> None:
        self.tokens += rows
        self.largest_batch = max(self.largest_batch, rows)

    def log(self, every_s: float | None = None) -> None:
        """One line every `every_s` (THROUGHPUT_LOG_S) while tokens are sampled; the counts start again."""
        now = time.monotonic()
        if now - self.since < (THROUGHPUT_LOG_S if every_s is None else every_s):
            return
        if self.tokens:
            log.info(
                "sampled %d tokens in %.0f s (%.0f tokens/s), %d requests finished, at most %d requests per forward "
                "pass", self.tokens, now - self.since, self.tokens / (now - self.since), self.requests,
                self.largest_batch,
            )  # fmt: skip
        self._reset(now)


@dataclass
class _Pending:
    params: SamplingParams
    generator: Any  # a seeded request's own torch.Generator, else None
    eos_ids: frozenset[int]
    done: threading.Event = field(default_factory=threading.Event)
    output: Any = None  # transformers' GenerationOutput
    error: str | None = None


class Engine:
    """transformers' continuous-batching manager on a loaded model, with `sample_rows` as its sampling step."""

    def __init__(self, model: Any, eos_ids: list[int], config: ServeConfig) -> None:
        import torch
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        self.model, self.eos_ids, self.config = model, list(eos_ids), config
        self.device = model.device
        self.generator = torch.Generator(device=self.device)
        if config.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(config.seed)
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._dead: str | None = None
        self.largest_batch = 0  # most requests that sampled a token in one forward pass (batching at work)
        self._throughput = Throughput()
        kv_tokens = config.kv_cache_tokens
        if kv_tokens is None and self.device.type == "cpu":
            # transformers would take a share of the machine's RAM; a request holds one page at least
            kv_tokens = max(4 * config.max_model_len, 16 * config.page_size_tokens)
        cb = ContinuousBatchingConfig(
            page_size=config.page_size_tokens,
            num_blocks=None if kv_tokens is None else math.ceil(kv_tokens / config.page_size_tokens),
            max_batch_tokens=config.max_batch_tokens,
            max_memory_percent=config.kv_cache_memory_fraction,
            max_requests_per_batch=config.max_num_seqs,
            allow_block_sharing=config.prefix_sharing,
            use_async_batching=False,  # the sampler reads the batch being computed
            use_cuda_graph=False,  # the sampler is Python per batch: nothing to capture
            return_logprobs=True,
            auto_switch_to_flash=False,  # an offline host cannot fetch kernels; --attn-implementation picks flash
            seed=config.seed,
        )
        # greedy with no logits processors: the raw fp32 logits reach the sampling step, which is ours
        generation = GenerationConfig(do_sample=False, eos_token_id=self.eos_ids, max_new_tokens=config.max_model_len)
        self.manager = model.init_continuous_batching(generation_config=generation, continuous_batching_config=cb)
        self.manager.warmup()  # builds the batch processor now, so its sampling step can be replaced before start
        processor = self.manager.batch_processor
        runner = getattr(processor, "model_runner", None)
        if runner is None or not callable(getattr(runner, "_sample", None)) or processor.use_async_batching:
            import transformers

            raise RuntimeError(
                f"transformers {transformers.__version__}'s continuous batching has no ModelRunner._sample to replace "
                f"(this module was written against {TESTED_TRANSFORMERS}): use that version"
            )
        self._io = processor.inputs_and_outputs
        runner._sample = self._sample
        self.cache_tokens = processor.cache.max_tokens_read
        if self.cache_tokens < config.max_model_len:
            raise RuntimeError(
                f"the KV cache holds {self.cache_tokens} tokens, fewer than --max-model-len {config.max_model_len}: "
                "lower --max-model-len or give the cache more (--kv-cache-tokens / --kv-cache-memory-fraction)"
            )
        with torch.inference_mode():
            self.manager.start()  # the generation thread runs in the caller's inference mode
        self._dispatcher = threading.Thread(target=self._dispatch, name="hf_serve-dispatch", daemon=True)
        self._dispatcher.start()

    # the generation thread's sampling step (replaces ModelRunner._sample)
    def _sample(self, scores: Any, output_ids: Any) -> None:
        import torch

        ids = [f.state.request_id for f in self._io.requests_in_batch if f.has_new_token]
        if not ids:
            return
        # rows are the requests that predict a token, in batch order (transformers' logits_indices)
        pending = [self._pending.get(i) for i in ids]
        params = [p.params if p else SamplingParams(temperature=0.0) for p in pending]
        generators = [p.generator if p else None for p in pending]
        tokens, logprobs = sample_rows(scores[0, : len(ids)], params, generators, self.generator)
        self.largest_batch = max(self.largest_batch, len(ids))
        self._throughput.sampled(len(ids))
        output_ids[0, : len(ids)].copy_(tokens)
        output_ids[1, : len(ids)].copy_(logprobs.float().view(dtype=torch.int32))

    def _dispatch(self) -> None:
        """Hand finished outputs to their waiting requests; fail them all once the generation thread is gone."""
        while True:
            self._log_throughput()
            output = self.manager.get_result(timeout=1.0)  # a blocking get; None on timeout or a dead loop
            if output is not None:
                if output.is_finished():
                    self._throughput.requests += 1
                    with self._lock:
                        pending = self._pending.pop(output.request_id, None)
                    if pending is not None:
                        pending.output = output
                        pending.done.set()
                continue
            if not self.manager.is_running():
                self._die(self._death_reason())
                return

    def _log_throughput(self, every_s: float | None = None) -> None:
        self._throughput.log(every_s)

    def _death_reason(self) -> str:
        fatal = self.manager.background_thread_status.fatal_error
        if fatal is None:
            return "the generation thread ended"
        return f"the generation thread died: {type(fatal).__name__}: {fatal}"

    def _die(self, reason: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = reason
                log.error("engine: %s", reason)
            pending, self._pending = self._pending, {}
        for p in pending.values():
            p.error = reason
            p.done.set()

    def failure(self) -> str | None:
        """Why the engine cannot serve (it died), or None."""
        if self._dead is None and not self.manager.is_running():
            self._die(self._death_reason())
        return self._dead

    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generated:
        """Queue one request and wait for it; EngineError when it failed, the engine died or it took too long."""
        import torch

        generator = None
        if params.seed is not None and not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed)
        request_id = f"req-{uuid.uuid4().hex}"
        pending = _Pending(params, generator, frozenset(self.eos_ids))
        with self._lock:
            if self._dead is not None:
                raise EngineError(self._dead)
            self._pending[request_id] = pending  # before queueing: the sampler looks it up
        queued = self.manager.add_request(
            list(prompt_ids), request_id=request_id, max_new_tokens=max_new_tokens, eos_token_id=self.eos_ids
        )
        if queued is None:
            with self._lock:
                self._pending.pop(request_id, None)
            raise EngineError(self.failure() or "the engine refused the request (it is stopping)")
        deadline = time.monotonic() + self.config.request_timeout_s
        while not pending.done.wait(timeout=1.0):  # the tick notices a dead engine even if the dispatcher did not
            if self.failure() is not None or time.monotonic() > deadline:
                with self._lock:
                    self._pending.pop(request_id, None)
                self.manager.cancel_request(request_id)
                raise EngineError(self.failure() or f"no result after {self.config.request_timeout_s:g} s")
        if pending.error is not None:
            raise EngineError(pending.error)
        output = pending.output
        if output.error is not None:
            raise EngineError(f"generation failed: {output.error}")
        tokens = list(output.generated_tokens)
        logprobs = [float(x) for x in output.logprobs]
        if len(logprobs) != len(tokens):
            raise EngineError(f"{len(logprobs)} logprobs for {len(tokens)} sampled tokens")
        return Generated(tokens, logprobs, bool(tokens) and tokens[-1] in pending.eos_ids)

    def close(self) -> None:
        """Stop the generation thread; requests still waiting are answered 500."""
        with self._lock:
            self._dead = self._dead or "the server is stopping"
        if self.manager.is_running():
            self.manager.stop(block=True, timeout=30.0, hard_stop=True)
        self._die(self._dead)
        log.info("engine stopped; at most %d requests sampled in one forward pass", self.largest_batch)


# ------------------------------------------------------------------------------------------------ the API
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def parse_hermes(text: str) -> tuple[str | None, list[dict]]:
    """vLLM's hermes tool parser: each `<tool_call>` block (the last may be unclosed) is JSON {"name", "arguments"};
    content is the text before the first block (None if empty). Any block that does not parse leaves the whole text
    as content and no calls."""
    if "<tool_call>" not in text:
        return text, []
    try:
        calls = []
        for closed, open_tail in _TOOL_CALL.findall(text):
            call = json.loads(closed or open_tail)
            name = call["name"]
            if not isinstance(name, str):
                raise TypeError("the tool name is not a string")
            arguments = json.dumps(call["arguments"], ensure_ascii=False)
            function = {"name": name, "arguments": arguments}
            calls.append({"id": f"call_{uuid.uuid4().hex}", "type": "function", "function": function})
    except (ValueError, KeyError, TypeError):
        return text, []
    content = text[: text.find("<tool_call>")]
    return content or None, calls


def template_ready(messages: list[dict]) -> list[dict]:
    """Messages as vLLM hands them to the chat template: an assistant tool call's JSON-string `arguments` parsed to a
    dict (not JSON, or not an object: {}), so the template renders it with `tojson`; nothing else changes."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not isinstance(calls, list):
            out.append(message)
            continue
        if not calls:
            out.append({k: v for k, v in message.items() if k != "tool_calls"})
            continue
        fixed = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                raise RequestError("assistant tool_calls entries must be objects with a 'function' object")
            raw = function.get("arguments")
            if isinstance(raw, str) and raw:
                try:
                    raw = json.loads(raw)
                except json.JSONDecodeError:
                    raw = {}
            fixed.append({**call, "function": {**function, "arguments": raw if isinstance(raw, dict) else {}}})
        out.append({**message, "tool_calls": fixed})
    return out


def _number(body: dict, key: str, default: float, low: float, high: float, *, open_low: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise RequestError(f"{key} must be a number")
    if value < low or value > high or (open_low and value == low):
        raise RequestError(f"{key} must be in {'(' if open_low else '['}{low:g}, {high:g}], got {value}")
    return float(value)


def _integer(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise RequestError(f"{key} must be an integer")
    return value


class ChatAPI:
    """The OpenAI chat-completions subset on a tokenizer and an engine (`generate`, `failure`); HTTP-free."""

    def __init__(
        self, name: str, tokenizer: Any, engine: Any, max_model_len: int, defaults: dict | None = None, *,
        weight_reload: bool = False,
    ):  # fmt: skip
        self.name, self.tokenizer, self.engine, self.max_model_len = name, tokenizer, engine, max_model_len
        self.defaults = defaults or {}  # temperature / top_p / top_k of the folder's generation_config, as vLLM
        self._tokenizer_lock = threading.Lock()  # a fast tokenizer is not safe to share between threads
        self.root = str(Path(name).resolve())  # the served folder: where weight_sync writes new weights
        self.weight_reload = weight_reload
        self.weight_version = "0"
        self._reload_lock = threading.Lock()

    def models(self) -> dict:
        entry = {"id": self.name, "object": "model", "owned_by": "hf_serve", "max_model_len": self.max_model_len,
                 "root": self.root}  # fmt: skip
        return {"object": "list", "data": [entry]}

    # ------------------------------------------------------------------------------ weight reloading (module doc)
    def dev(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> dict:
        """One weight-reload route; RequestError 404 without --weight-reload, 400 for what it does not do."""
        if not self.weight_reload:
            raise RequestError(f"no route {method} {path}: start the server with --weight-reload", 404)
        if not all(hasattr(self.engine, name) for name in ("hold", "resume", "reload_weights")):
            raise RequestError("weight reloading needs the slot engine (--engine slots)")
        if (method, path) == ("GET", "/weight_info"):
            return {"weight_version": self.weight_version}
        if (method, path) == ("POST", "/pause"):
            mode = (query.get("mode") or ["wait"])[0]
            if mode != "wait":
                raise RequestError(f"pause mode {mode!r}: this server pauses with mode=wait only")
            self.engine.hold(float((query.get("timeout") or [600])[0]))
            return {"status": "paused"}
        if (method, path) == ("POST", "/resume"):
            self.engine.resume()
            return {"status": "resumed"}
        if (method, path) == ("POST", "/collective_rpc"):
            if not isinstance(body, dict) or body.get("method") != "reload_weights":
                raise RequestError('this server runs {"method": "reload_weights"} only')
            return {"results": [self.reload_weights()]}
        if (method, path) == ("POST", "/reset_prefix_cache"):
            return {"success": True}  # the slot engine keeps no KV cache between requests
        if (method, path) == ("POST", "/update_weight_version"):
            version = body.get("new_version") if isinstance(body, dict) else None
            if not isinstance(version, str | int) or isinstance(version, bool):
                raise RequestError('give {"new_version": "<version>"}')
            self.weight_version = str(version)
            return {"weight_version": self.weight_version}
        raise RequestError(f"no route {method} {path}", 404)

    def reload_weights(self) -> dict:
        """The served folder's safetensors into the engine (while paused): what was loaded, and the self-check."""
        from safetensors.torch import load_file

        files = sorted(Path(self.root).glob("*.safetensors"))
        if not files:
            raise RequestError(f"{self.root} holds no .safetensors file to reload", 500)
        with self._reload_lock:
            t0 = time.monotonic()
            state: dict[str, Any] = {}
            for f in files:
                state.update(load_file(str(f)))
            error = self.engine.reload_weights(state)
        log.info("reloaded %d tensors from %s in %.1f s (self-check %.2g)", len(state), self.root,
                 time.monotonic() - t0, error)  # fmt: skip
        return {"tensors": len(state), "files": [f.name for f in files], "self_check_error": error}

    def _params(self, body: dict) -> SamplingParams:
        temperature = _number(body, "temperature", self.defaults.get("temperature", 1.0), 0.0, 100.0)
        top_p = _number(body, "top_p", self.defaults.get("top_p", 1.0), 0.0, 1.0, open_low=True)
        top_k = _integer(body, "top_k")
        top_k = self.defaults.get("top_k", 0) if top_k is None else top_k
        if top_k < -1:
            raise RequestError(f"top_k must be -1 or 0 (off) or positive, got {top_k}")
        return SamplingParams(temperature, top_p, max(0, top_k), _integer(body, "seed"))

    def _request(self, body: Any) -> tuple[list[dict], list[dict] | None, bool, int | None, SamplingParams]:
        """The request's messages, tools, whether to parse tool calls, max_tokens and sampling; RequestError."""
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        if body.get("model") not in (None, self.name):
            raise RequestError(f"The model `{body['model']}` does not exist (this server serves {self.name!r})", 404)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError("messages must be a non-empty list of message objects")
        if any(not isinstance(m.get("role"), str) for m in messages):
            raise RequestError("every message needs a string 'role'")
        tools = body.get("tools") or None
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
            raise RequestError("tools must be a list of tool objects")
        tool_choice = body.get("tool_choice")
        unsupported = {
            "tool_choice": tool_choice not in (None, "auto", "none"),  # "required" / named choices
            "stream": bool(body.get("stream")),
            "n": body.get("n") not in (None, 1),
            "top_logprobs": body.get("top_logprobs") not in (None, 0),  # only the sampled token's logprob
        }
        for key, refused in unsupported.items():
            if refused:
                raise RequestError(
                    f"{key}={body[key]!r} is not supported by this server (captain_ros_training.hf_serve)"
                )
        max_tokens = _integer(body, "max_completion_tokens")
        max_tokens = _integer(body, "max_tokens") if max_tokens is None else max_tokens
        if max_tokens is not None and max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {max_tokens}")
        return messages, tools, bool(tools) and tool_choice != "none", max_tokens, self._params(body)

    def complete(self, body: Any) -> dict:
        """One chat completion for a request body; RequestError (400/404) or EngineError (500)."""
        messages, tools, parse_tools, max_tokens, params = self._request(body)
        with self._tokenizer_lock:
            try:
                prompt = render_prompt_ids(self.tokenizer, template_ready(messages), tools)
            except RequestError:
                raise
            except Exception as exc:  # the template raised: unknown role, bad content
                message = f"the chat template cannot render these messages: {type(exc).__name__}: {exc}"
                raise RequestError(message) from exc
        room = self.max_model_len - len(prompt)
        if room < 1:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt contains "
                f"{len(prompt)} input tokens, which leaves no room for output tokens. Please reduce the length of the "
                "input prompt."
            )
        t0 = time.monotonic()
        out = self.engine.generate(prompt, room if max_tokens is None else min(max_tokens, room), params)
        text_ids = out.token_ids[:-1] if out.stopped else out.token_ids  # the stop token is not text (vLLM)
        with self._tokenizer_lock:
            # vLLM's hermes parser keeps special tokens (tool tags may be special in some models)
            text = self.tokenizer.decode(text_ids, skip_special_tokens=not parse_tools)
            pieces = self.tokenizer.batch_decode([[t] for t in out.token_ids]) if body.get("logprobs") else None
        content, calls = parse_hermes(text) if parse_tools else (text, [])
        finish = "tool_calls" if calls else ("stop" if out.stopped else "length")
        logprobs = None
        if pieces is not None:
            entries = zip(pieces, out.logprobs, strict=True)
            logprobs = {"content": [{"token": t, "logprob": x, "bytes": None, "top_logprobs": []} for t, x in entries]}
        ids = bool(body.get("return_token_ids"))
        n_prompt, n_out = len(prompt), len(out.token_ids)
        log.info(
            "completion: %d prompt + %d sampled tokens, %s, %.2f s", n_prompt, n_out, finish, time.monotonic() - t0
        )
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": content, "tool_calls": calls},
            "logprobs": logprobs,
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": list(out.token_ids) if ids else None,
        }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [choice],
            "prompt_token_ids": prompt if ids else None,
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
        }


# ------------------------------------------------------------------------------------------------ HTTP
DEV_ROUTES = ("/weight_info", "/pause", "/resume", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version")


class HFServer(ThreadingHTTPServer):
    """One thread per connection; every request goes to `api` (the engine behind it batches them)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: ChatAPI) -> None:
        self.api = api
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: HFServer
    protocol_version = "HTTP/1.1"  # keep-alive: the policy client reuses its connection

    def _send(self, status: int, payload: dict | None) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        self._send(status, {"error": {"message": message, "type": kind, "code": status}})

    def _dev(self, method: str, body: Any) -> None:
        url = urlsplit(self.path)
        try:
            self._send(200, self.server.api.dev(method, url.path.rstrip("/"), parse_qs(url.query), body))
        except RequestError as exc:
            self._error(exc.status, str(exc))
        except EngineError as exc:
            self._error(500, f"engine failure: {exc}")
        except Exception as exc:  # a failed reload is reported, never a hung or dropped connection
            log.exception("weight route failed")
            self._error(500, f"{type(exc).__name__}: {exc}")

    def do_GET(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        api = self.server.api
        if path in DEV_ROUTES:
            self._dev("GET", None)
        elif path == "/health":
            failure = api.engine.failure()
            if failure is None:
                self._send(200, None)
            else:
                self._error(500, f"engine dead: {failure}")
        elif path == "/v1/models":
            self._send(200, api.models())
        else:
            self._error(404, f"no route GET {path} (this server has /health, /v1/models, /v1/chat/completions)")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path.rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        if path in DEV_ROUTES:
            try:
                body = json.loads(raw) if raw else None
            except ValueError as exc:
                self._error(400, f"the request body is not JSON: {exc}")
                return
            self._dev("POST", body)
            return
        if path != "/v1/chat/completions":
            self._error(404, f"no route POST {path} (this server has /v1/chat/completions)")
            return
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self._error(400, f"the request body is not JSON: {exc}")
            return
        try:
            self._send(200, self.server.api.complete(body))
        except RequestError as exc:
            self._error(exc.status, str(exc))
        except EngineError as exc:
            self._error(500, f"engine failure: {exc}")
        except Exception as exc:  # a bug here must not hang or drop the connection silently
            log.exception("request failed")
            self._error(500, f"{type(exc).__name__}: {exc}")

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)


# ------------------------------------------------------------------------------------------------ loading
def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


VARLEN_ATTENTION = "captain_flash_varlen"  # "flash" in the name: continuous batching then builds no mask
VARLEN_SELF_CHECK_TOLERANCE = 2e-2  # bf16 attention outputs of unit-variance inputs: rounding stays below 1e-2


def varlen_attention(  # noqa: PLR0917 (transformers' attention interface)
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    *,
    backend: str = "auto",
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention interface over captain_ros_training.fast.cached_attention: each request's queries attend
    to its own cached keys only (cu_seq_lens_q / cu_seq_lens_k from continuous batching), flash varlen on CUDA, one SDPA
    call per request elsewhere. transformers' `sdpa` under continuous batching instead runs one masked attention
    of every query of the batch over the keys of all its requests (a dense [queries, all keys] mask): its work
    grows with the square of the number of concurrent episodes."""
    from captain_ros_training.fast import cached_attention

    head_dim = query.shape[-1]
    if scaling is not None and not math.isclose(scaling, head_dim**-0.5, rel_tol=1e-6):
        raise ValueError(f"varlen attention computes softmax(q.k / sqrt(d)), this model scales by {scaling}")
    if sliding_window is not None or dropout:
        raise ValueError("varlen attention has no sliding window or dropout: serve with --attn-implementation sdpa")
    q = query[0].transpose(0, 1)  # [1, H, T, D] -> [T, H, D]
    k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)
    out = cached_attention(
        q, k, v, kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"], kwargs["max_length_q"], kwargs["max_length_k"],
        backend=backend,
    )  # fmt: skip
    return out[None], None  # [1, T, H, D], as transformers' flash attention returns


def use_varlen_attention(model: Any) -> None:
    """Switch a loaded model to `varlen_attention` (registered with transformers' AttentionInterface). Set on the
    config directly: set_attn_implementation would look for a flash-attn package for any name with "flash" in it.
    On CUDA, first checks this torch's flash varlen against the per-request reference (the causal mask must align
    bottom-right for queries over a cache) and keeps the reference backend where it does not."""
    import torch
    from transformers import AttentionInterface

    from captain_ros_training import fast

    backend = "sdpa"
    if model.device.type == "cuda" and fast.varlen_available():
        error = fast.cached_attention_self_check(model.device)
        if error <= VARLEN_SELF_CHECK_TOLERANCE:
            backend = "varlen"
            log.info("varlen attention: torch flash varlen (self-check: max difference %.2g)", error)
        else:
            log.warning(
                "varlen attention: torch %s's flash varlen differs from the reference by %.3g on cached requests: "
                "one SDPA call per request instead", torch.__version__, error,
            )  # fmt: skip
    else:
        log.info("varlen attention: one SDPA call per request (no flash varlen on %s)", model.device)
    AttentionInterface.register(VARLEN_ATTENTION, functools.partial(varlen_attention, backend=backend))
    model.config._attn_implementation = VARLEN_ATTENTION


def load(config: ServeConfig) -> tuple[Any, Any, list[int], dict]:
    """The folder's model (on its device, eval mode), tokenizer, stop ids and vLLM-style sampling defaults."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = Path(config.model)
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{folder} is not a model folder (no config.json); this server loads local folders only")
    device = resolve_device(config.device)
    dtype = config.dtype if config.dtype != "auto" else ("float32" if device == "cpu" else "bfloat16")
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if config.engine not in ENGINES:
        raise SystemExit(f"--engine must be one of {', '.join(ENGINES)}, not {config.engine!r}")
    varlen = config.engine == "cb" and config.attn_implementation == "varlen"
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        dtype=getattr(torch, dtype),
        attn_implementation="sdpa" if varlen or config.engine != "cb" else config.attn_implementation,
        device_map=device,
        local_files_only=True,
    ).eval()
    if varlen:
        use_varlen_attention(model)
    limit = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and config.max_model_len > limit:
        raise SystemExit(f"--max-model-len {config.max_model_len} exceeds the model's max_position_embeddings {limit}")
    eos: list[int] = []
    try:
        generation = GenerationConfig.from_pretrained(folder, local_files_only=True)
        diff = generation.to_diff_dict()
    except OSError:  # no generation_config.json
        generation, diff = None, {}
    for ids in (tokenizer.eos_token_id, generation.eos_token_id if generation else None):
        for i in ids if isinstance(ids, list) else [ids]:
            if isinstance(i, int) and i >= 0 and i not in eos:
                eos.append(i)
    if not eos:
        raise SystemExit(f"{folder}: neither the tokenizer nor generation_config names an eos token")
    defaults = {k: diff[k] for k in ("temperature", "top_p", "top_k") if diff.get(k) is not None}
    ignored = {k: diff[k] for k in ("repetition_penalty", "min_p", "presence_penalty") if diff.get(k) is not None}
    if ignored:
        log.warning("generation_config sets %s: vLLM would apply it by default, this server does not", ignored)
    log.info("loaded %s: %s on %s, stop ids %s, sampling defaults %s", folder, dtype, device, eos, defaults or "none")
    return model, tokenizer, eos, defaults


def serve(config: ServeConfig) -> None:
    """Load, start the engine, serve until SIGTERM / SIGINT, stop the engine."""
    t0 = time.monotonic()
    model, tokenizer, eos, defaults = load(config)
    if config.engine == "slots":
        from captain_ros_training.slot_engine import SlotEngine

        engine = SlotEngine(model, eos, config)
    else:
        engine = Engine(model, eos, config)
    if config.weight_reload and config.engine != "slots":
        raise SystemExit("--weight-reload needs the slot engine (--engine slots)")
    api = ChatAPI(config.model, tokenizer, engine, config.max_model_len, defaults, weight_reload=config.weight_reload)
    httpd = HFServer((config.host, config.port), api)
    log.info(
        "serving %s on http://%s:%d/v1 (max_model_len %d, KV cache %d tokens; ready after %.1f s)",
        config.model, config.host, httpd.server_address[1], config.max_model_len, engine.cache_tokens,
        time.monotonic() - t0,
    )  # fmt: skip

    def stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        httpd.serve_forever(poll_interval=0.5)
    finally:
        httpd.server_close()
        engine.close()


# ------------------------------------------------------------------------------------------------ launcher
def start_hf_server(
    model_dir: str | Path,
    log: str | Path,
    *,
    python: str | Path = sys.executable,
    device: str = "auto",
    max_model_len: int = 32768,
    dtype: str = "auto",
    extra_args: tuple[str, ...] = (),
) -> Any:
    """Start the server (`python -m captain_ros_training hf-serve`) on `model_dir` on a free port, in a process
    group of its own, output to `log` (not waited for: call `wait_healthy()`). Returns captain_ros_training.serve's
    PolicyServer, the vLLM launcher's handle, so callers treat both servers alike."""
    from captain_ros.bridge.services import free_port
    from captain_ros_training.serve import PolicyServer, model_argument

    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [
        str(python),
        "-m",
        "captain_ros_training",
        "hf-serve",
        "--model",
        model_argument(model_dir),
        "--host",
        "127.0.0.1",
    ]
    cmd += ["--port", str(port), "--max-model-len", str(max_model_len), "--dtype", dtype, "--device", device]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*cmd, *extra_args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log.parent,
            start_new_session=True,
        )
    return PolicyServer(
        proc, f"http://127.0.0.1:{port}", Path(model_dir), log, Path(python), name="the transformers server"
    )


if __name__ == "__main__":  # the command moved: say where rather than exit 0 having done nothing
    raise SystemExit("this command is now `python -m captain_ros_training hf-serve`")
