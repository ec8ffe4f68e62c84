"""captain_ros_training.hf_serve's default engine: one preallocated KV-cache slot per running request, a decode step of
all of them at once, the decoder computed by captain_ros_training.fast's Qwen2 layer functions on the model's own
weights.

Why not transformers' continuous batching (hf_serve's `--engine cb`): on a host without the flash-attn package its
paged cache is read through Python-built index lists, every cached token of every request on every decode step
(`prepare_batch_tensors`: 13 ms at 48 requests of 2k tokens, 23 ms at 6k, on an H100's host CPU), plus one
index_select gather per layer; with 24-65 agent episodes of 4-15k-token contexts it generated 300-680 tokens/s on an
H100 for the 0.5B student. Here nothing per token is built on the host:

- The cache is dense: per layer a [slots, kv_heads, capacity, head_dim] key and value tensor, a request owning one
  slot (capacity = --max-model-len) from its prefill to its last token. Slots are handed out lowest first, so a decode
  step's batch is the view [:n] of the first n slots (free slots among them compute a dummy row that nothing reads).
- Prefill: the requests admitted together are packed into one forward ([tokens],
  captain_ros_training.fast.cached_attention: flash varlen on CUDA, per-request SDPA elsewhere), their keys written into
  their slots, and the last position of each sampled. No prefix caching: the 0.5B student prefills a 10k-token prompt in
  tens of milliseconds on a GPU.
- Decode: one token per running request, written at its own position; attention is one SDPA call over the batch's
  slots up to the longest running context, a boolean mask hiding each row's unwritten positions. The query heads
  that share a key head are that call's query positions ([n, kv_heads, groups, head_dim]), so grouped-query
  attention needs no repeated keys.
- Sampling is hf_serve's `sample_rows` (per-request temperature, top-k, top-p, seed; processed logprobs).
- CUDA graphs (`--cuda-graphs`, off by default): an eager decode step is about 1,300 small kernels whose launches
  from Python, not the GPU, set its time (16 ms at 1 to 10 requests on an H100 for the 0.5B student: 60 tokens/s per
  request, which is what an evaluation's last, longest episodes run at). With the flag a decode step is replayed
  from a graph captured once per bucket of rows (a power of two, at most the slots) and of attended length (a power
  of two times ALIGN_TOKENS, at most the capacity): the padded rows are free slots, written at position 0 and never
  read; a longer attended length only attends more masked positions. The start-up self-check then runs through
  the graphs too.

Exactness: the layer arithmetic is captain_ros_training.fast's (Qwen2 op for op: fp32 RMSNorm, the model's rotary
module), the same the SFT trains with; `self_check` compares prefill and decode log-probabilities with the transformers
forward of the same model at start-up and refuses to serve past `SELF_CHECK_TOLERANCE`. Qwen2-family models only
(captain_ros_training.fast.unsupported_reason); `--engine cb` serves anything transformers does.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.functional import linear, scaled_dot_product_attention

from captain_ros_training import fast, hf_serve

log = logging.getLogger("hf_serve")

ALIGN_TOKENS = 64  # context lengths of a decode step's attention are rounded up to this (aligned masks and kernels)
GRAPH_MIN_LENGTH = 512  # the shortest attended length a decode graph is captured for (`--cuda-graphs`)
# max |logprob difference| from the transformers forward in the same dtype. bf16 rounds coarsely on the check's
# random-token prompts: there the transformers bf16 forward itself is 0.60 from its fp32 forward (the fine-tuned 0.5B
# student, CPU), this engine 0.18 from the bf16 forward on CPU and 0.39 on an H100; a wrong position, mask or slot
# moves log-probabilities by several nats
SELF_CHECK_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 1.0, torch.float16: 0.5}
SELF_CHECK_TOKENS = (48, 4)  # prompt and decoded tokens of the start-up check
SELF_CHECK_MIN_PROB = 1e-4  # compared: the tokens the reference gives at least this probability


@dataclass
class Request:
    """One request's state from queueing to its answer."""

    prompt_ids: list[int]
    max_new_tokens: int
    params: Any  # hf_serve.SamplingParams
    generator: Any  # a seeded request's own torch.Generator, else None
    eos_ids: frozenset[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    slot: int = -1
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False
    error: str | None = None

    @property
    def finished(self) -> bool:
        return bool(self.tokens) and (self.tokens[-1] in self.eos_ids or len(self.tokens) >= self.max_new_tokens)


class SlotEngine:
    """hf_serve's engine interface (`generate`, `failure`, `close`, `cache_tokens`, `largest_batch`) on dense slots."""

    def __init__(self, model: Any, eos_ids: list[int], config: Any) -> None:
        reason = fast.unsupported_reason(model)
        if reason is not None:
            raise RuntimeError(f"the slot engine cannot serve this model ({reason}): serve it with --engine cb")
        self.model, self.eos_ids, self.config = model, frozenset(eos_ids), config
        self.device = model.device
        cfg = model.config
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.capacity = math.ceil(config.max_model_len / ALIGN_TOKENS) * ALIGN_TOKENS
        self.dtype = next(model.parameters()).dtype
        self.slots = self._slot_count()
        self.cache_tokens = self.slots * self.capacity
        shape = (self.slots, self.kv_heads, self.capacity, self.head_dim)
        core = model.get_decoder()
        self.core = core
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in core.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in core.layers]
        self.weights = [self._layer_weights(layer) for layer in core.layers]
        self.prefill_tokens = max(config.max_batch_tokens or 0, 16384)  # packed prompt tokens per prefill (or one)
        self.generator = torch.Generator(device=self.device)
        if config.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(config.seed)
        self.largest_batch = 0
        self._throughput = hf_serve.Throughput()
        self._queue: list[Request] = []
        self._running: dict[int, Request] = {}  # slot -> request
        self._free = list(range(self.slots))  # a heap: the lowest free slot first
        self._cv = threading.Condition()
        self._dead: str | None = None
        self._stopping = False
        self._paused = False
        self._holding = False  # hold(): no request admitted, the running ones finish (a weight reload waits for it)
        self._graphs: DecodeGraphs | None = None
        if getattr(config, "cuda_graphs", False):
            if self.device.type == "cuda":
                self._graphs = DecodeGraphs(self)
            else:
                log.warning("--cuda-graphs is for CUDA devices: decoding eagerly on %s", self.device)
        error = self.self_check()
        log.info(
            "slot engine: %d slots of %d tokens (%.1f GiB of KV cache), decode %s, self-check max |logprob difference| "
            "%.2g", self.slots, self.capacity,
            2 * len(self.keys) * self.keys[0].numel() * self.keys[0].element_size() / 2**30,
            "from CUDA graphs" if self._graphs else "eager", error,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._loop, name="hf_serve-slots", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------ set-up
    def _slot_count(self) -> int:
        """Slots: --kv-cache-tokens / capacity when given; on CUDA what the free memory's share holds; on CPU four.
        At most --max-num-seqs; at least one (else an error that says what to change)."""
        per_token = 2 * len(self.model.get_decoder().layers) * self.kv_heads * self.head_dim * self.dtype.itemsize
        tokens = self.config.kv_cache_tokens
        if tokens is None and self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            tokens = int(free * self.config.kv_cache_memory_fraction) // per_token
        elif tokens is None:
            tokens = 4 * self.capacity
        slots = min(self.config.max_num_seqs, tokens // self.capacity)
        if slots < 1:
            raise RuntimeError(
                f"the KV cache holds {tokens} tokens, fewer than one request of --max-model-len "
                f"{self.config.max_model_len}: lower --max-model-len or give the cache more (--kv-cache-tokens / "
                "--kv-cache-memory-fraction)"
            )
        return slots

    def _layer_weights(self, layer: Any) -> dict:
        a, mlp = layer.self_attn, layer.mlp
        biases = [fast._base(m).bias for m in (a.q_proj, a.k_proj, a.v_proj)]
        return {
            "norm_w": layer.input_layernorm.weight,
            "qkv_w": torch.cat([fast.linear_weight(m) for m in (a.q_proj, a.k_proj, a.v_proj)]).detach(),
            "qkv_b": torch.cat(biases).detach() if all(b is not None for b in biases) else None,
            "o_w": fast.linear_weight(a.o_proj).detach(),
            "post_norm_w": layer.post_attention_layernorm.weight,
            "gate_up_w": (fast.linear_weight(mlp.gate_proj).detach(), fast.linear_weight(mlp.up_proj).detach()),
            "down_w": fast.linear_weight(mlp.down_proj).detach(),
        }

    # ------------------------------------------------------------------------------------------ the decoder
    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.core.rotary_emb(x[None], positions[None])
        return cos[0, :, None, :], sin[0, :, None, :]  # [T, 1, D] against q/k [T, H, D]

    def _layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Any) -> torch.Tensor:
        """x [T, d] through every decoder layer; `attend(i, q, k, v)` stores layer i's keys and returns its
        attention output [T, H, D]. Returns the final-normed hidden states [T, d]."""
        for i, w in enumerate(self.weights):
            q, k, v = fast.attention_in(
                x, w["norm_w"], w["qkv_w"], qkv_b=w["qkv_b"], cos=cos, sin=sin, eps=self.eps, heads=self.heads,
                kv_heads=self.kv_heads, head_dim=self.head_dim,
            )  # fmt: skip
            x = fast.attention_out_mlp(
                x, attend(i, q, k, v), w["o_w"], norm_w=w["post_norm_w"], gate_up_w=w["gate_up_w"],
                down_w=w["down_w"], eps=self.eps,
            )  # fmt: skip
        return fast.rms_norm(x, self.core.norm.weight, self.eps)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return linear(hidden, self.model.get_output_embeddings().weight).float()

    def prefill(self, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Write the prompts' keys into their slots; the logits [len(prompts), vocab] (fp32) after each prompt."""
        lengths = [len(p) for p in prompts]
        cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=self.device)
        ids = torch.tensor(list(itertools.chain.from_iterable(prompts)), device=self.device)
        positions = torch.cat([torch.arange(n, device=self.device) for n in lengths])
        x = self.core.embed_tokens(ids)
        cos, sin = self._rope(x, positions)
        bounds = list(itertools.pairwise([0, *itertools.accumulate(lengths)]))

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            for slot, (a, b) in zip(slots, bounds, strict=True):
                self.keys[i][slot, :, : b - a] = k[a:b].transpose(0, 1)
                self.values[i][slot, :, : b - a] = v[a:b].transpose(0, 1)
            return fast.cached_attention(q, k, v, cu, cu, max(lengths), max(lengths))

        hidden = self._layers(x, cos, sin, attend)
        return self._logits(hidden[cu[1:].long() - 1])

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One step of slots 0..n-1 (n = len(tokens)): slot j's token `tokens[j]` at `positions[j]`; the logits
        [n, vocab] (fp32). Rows of free slots compute garbage that nothing reads."""
        length = min(self.capacity, math.ceil((int(positions.max()) + 1) / ALIGN_TOKENS) * ALIGN_TOKENS)
        if self._graphs is not None:
            return self._graphs.decode(tokens, positions, length)
        return self.decode_rows(tokens, positions, length)

    def decode_rows(self, tokens: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
        """`decode` with the attended length given (at least every position + 1): no host sync, fixed shapes for
        fixed (rows, length), so a CUDA graph can capture it."""
        n = tokens.shape[0]
        rows = torch.arange(n, device=self.device)
        visible = (torch.arange(length, device=self.device)[None, :] <= positions[:, None])[:, None, None, :]
        groups = self.heads // self.kv_heads
        x = self.core.embed_tokens(tokens)
        cos, sin = self._rope(x, positions)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            self.keys[i][rows, :, positions] = k
            self.values[i][rows, :, positions] = v
            out = scaled_dot_product_attention(
                q.view(n, self.kv_heads, groups, self.head_dim),  # a key head's query heads as its query positions
                self.keys[i][:n, :, :length],
                self.values[i][:n, :, :length],
                attn_mask=visible,
            )
            return out.reshape(n, self.heads, self.head_dim)

        return self._logits(self._layers(x, cos, sin, attend))

    @torch.inference_mode()
    def self_check(self) -> float:
        """The largest |log-probability difference| between this engine (prefill, then decode steps) and the
        transformers forward of the same model over the same tokens; RuntimeError past SELF_CHECK_TOLERANCE."""
        prompt_len, steps = SELF_CHECK_TOKENS
        gen = torch.Generator(device="cpu").manual_seed(0)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        ids = torch.randint(0, vocab, (prompt_len + steps,), generator=gen).tolist()
        slot = self.slots - 1  # a slot other than 0: the decode batch then carries free rows before it
        got = [self.prefill([slot], [ids[:prompt_len]])[0]]
        for t in range(steps):
            tokens = torch.zeros(slot + 1, dtype=torch.long, device=self.device)
            positions = torch.zeros(slot + 1, dtype=torch.long, device=self.device)
            tokens[slot], positions[slot] = ids[prompt_len + t], prompt_len + t
            got.append(self.decode(tokens, positions)[slot].clone())  # a graph's output is overwritten next step
        want = self.model(torch.tensor([ids], device=self.device)).logits[0, prompt_len - 1 :].float()
        want = want.log_softmax(-1)
        likely = want > math.log(SELF_CHECK_MIN_PROB)  # the tokens sampling can draw; bf16 rounds the far tail coarsely
        error = float((torch.stack(got).log_softmax(-1) - want).abs()[likely].max())
        tolerance = SELF_CHECK_TOLERANCE.get(self.dtype, 0.25)
        if not error <= tolerance:
            raise RuntimeError(
                f"the slot engine's log-probabilities differ from the transformers forward by {error:.3g} (more "
                f"than {tolerance:g}) on this {self.device} / torch {torch.__version__}: serve with --engine cb"
            )
        return error

    # ------------------------------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        try:
            with torch.inference_mode():
                while True:
                    with self._cv:
                        while not self._stopping and (
                            self._paused or (not self._running and (not self._queue or self._holding))
                        ):
                            self._cv.wait(timeout=1.0)
                        if self._stopping:
                            return
                        admitted = self._admit()
                    if admitted:
                        self._prefill(admitted)
                    if self._running:
                        self._step()
                    self._log_throughput()
        except BaseException as exc:
            self._die(f"the generation loop died: {type(exc).__name__}: {exc}")

    def _admit(self) -> list[Request]:
        """Queued requests into free slots, as many as one prefill takes (the caller holds the lock); none while
        held (`hold`)."""
        admitted, tokens = [], 0
        if self._holding:
            return admitted
        while self._queue and self._free:
            request = self._queue[0]
            if request.cancelled:
                self._queue.pop(0)
                continue
            if admitted and tokens + len(request.prompt_ids) > self.prefill_tokens:
                break
            self._queue.pop(0)
            request.slot = heapq.heappop(self._free)
            admitted.append(request)
            tokens += len(request.prompt_ids)
        return admitted

    def _prefill(self, admitted: list[Request]) -> None:
        logits = self.prefill([r.slot for r in admitted], [r.prompt_ids for r in admitted])
        for request in admitted:
            self._running[request.slot] = request
        self._sample(admitted, logits)

    def _step(self) -> None:
        n = max(self._running) + 1
        tokens = [0] * n
        positions = [0] * n
        for slot, request in self._running.items():
            tokens[slot] = request.tokens[-1]
            positions[slot] = len(request.prompt_ids) + len(request.tokens) - 1
        logits = self.decode(torch.tensor(tokens, device=self.device), torch.tensor(positions, device=self.device))
        running = sorted(self._running.items())
        self._sample([r for _, r in running], logits[[slot for slot, _ in running]])

    def _sample(self, requests: list[Request], logits: torch.Tensor) -> None:
        params = [r.params for r in requests]
        generators = [r.generator for r in requests]
        tokens, logprobs = hf_serve.sample_rows(logits, params, generators, self.generator)  # (tests replace it)
        self.largest_batch = max(self.largest_batch, len(requests))
        self._throughput.sampled(len(requests))
        for request, token, logprob in zip(requests, tokens.tolist(), logprobs.tolist(), strict=True):
            request.tokens.append(token)
            request.logprobs.append(logprob)
            if request.finished or request.cancelled:
                self._release(request)

    def _release(self, request: Request) -> None:
        with self._cv:
            self._running.pop(request.slot, None)
            heapq.heappush(self._free, request.slot)
            self._cv.notify_all()  # a hold() waits for the running requests to end
        if not request.cancelled:
            self._throughput.requests += 1
        request.done.set()

    def _log_throughput(self, every_s: float | None = None) -> None:
        self._throughput.log(every_s)

    def _die(self, reason: str) -> None:
        with self._cv:
            if self._dead is None:
                self._dead = reason
                log.error("engine: %s", reason)
            waiting = [*self._queue, *self._running.values()]
            self._queue.clear()
            self._running.clear()
            self._stopping = True
            self._cv.notify_all()
        for request in waiting:
            request.error = reason
            request.done.set()

    # ------------------------------------------------------------------------------------------ the interface
    @contextlib.contextmanager
    def pause(self) -> Any:
        """No step runs inside this block (requests still queue): those queued together are then admitted
        together. Yields the engine's condition, notified on every queued request."""
        with self._cv:
            self._paused = True
        try:
            yield self._cv
        finally:
            with self._cv:
                self._paused = False
                self._cv.notify_all()

    def hold(self, timeout_s: float) -> None:
        """Admit no request (new ones queue) and wait until the running ones have ended: vLLM's `/pause?mode=wait`,
        so that no request is ever decoded with two weight versions. hf_serve.EngineError if some still run after
        `timeout_s` (the hold is then lifted) or the engine died."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._holding = True
            while self._running and self._dead is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._holding = False
                    self._cv.notify_all()
                    raise hf_serve.EngineError(f"{len(self._running)} requests still running after {timeout_s:g} s")
                self._cv.wait(timeout=min(left, 1.0))
            if self._dead is not None:
                raise hf_serve.EngineError(self._dead)

    def resume(self) -> None:
        """Lift `hold`: the queued requests are admitted again."""
        with self._cv:
            self._holding = False
            self._cv.notify_all()

    def reload_weights(self, state: dict[str, torch.Tensor]) -> float:
        """A checkpoint's tensors copied into the served model's parameters in place (their storage, and so every
        CUDA graph captured over them, stays), the engine's fused copies (q/k/v, gate/up) refreshed in place, then
        the self-check against the transformers forward of the new weights; returns its error. Only while held
        with nothing running (hf_serve.EngineError otherwise). Every parameter must be in `state`, and nothing else
        (a tied head's `lm_head.weight` may be left out, as transformers writes it, or be the embedding's copy, as
        captain_ros_training.weight_sync writes it)."""
        with self._cv:
            if not self._holding or self._running:
                raise hf_serve.EngineError("weights are reloaded only while paused (/pause?mode=wait), nothing running")
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if getattr(self.model.config, "tie_word_embeddings", False):  # transformers' own checkpoints leave it out
            missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise hf_serve.EngineError(
                f"the checkpoint does not fit the served model: missing {sorted(missing)[:5]}, unexpected "
                f"{sorted(unexpected)[:5]}"
            )
        with torch.no_grad():
            for cached, layer in zip(self.weights, self.core.layers, strict=True):
                fresh = self._layer_weights(layer)
                for key in ("qkv_w", "qkv_b", "o_w", "down_w"):
                    if cached[key] is not None:
                        cached[key].copy_(fresh[key])
                for old, new in zip(cached["gate_up_w"], fresh["gate_up_w"], strict=True):
                    old.copy_(new)
        return self.self_check()

    def queued(self) -> int:
        """Requests waiting for a slot."""
        return len(self._queue)

    def failure(self) -> str | None:
        """Why the engine cannot serve (it died or stopped), or None."""
        if self._dead is None and not self._thread.is_alive():
            self._die("the generation loop ended")
        return self._dead

    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: Any) -> Any:
        """Queue one request and wait for it; hf_serve.EngineError when it failed, the engine died or it took too
        long (the request is then dropped at the loop's next step)."""
        generator = None
        if params.seed is not None and not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed)
        if len(prompt_ids) + max_new_tokens > self.capacity + 1:
            raise hf_serve.EngineError(f"{len(prompt_ids)} + {max_new_tokens} tokens exceed a slot of {self.capacity}")
        request = Request(list(prompt_ids), max_new_tokens, params, generator, self.eos_ids)
        with self._cv:
            if self._dead is not None:
                raise hf_serve.EngineError(self._dead)
            self._queue.append(request)
            self._cv.notify_all()
        deadline = time.monotonic() + self.config.request_timeout_s
        while not request.done.wait(timeout=1.0):
            if self.failure() is not None or time.monotonic() > deadline:
                request.cancelled = True  # the loop frees its slot at its next step
                raise hf_serve.EngineError(self.failure() or f"no result after {self.config.request_timeout_s:g} s")
        if request.error is not None:
            raise hf_serve.EngineError(request.error)
        stopped = request.tokens[-1] in self.eos_ids
        return hf_serve.Generated(list(request.tokens), list(request.logprobs), stopped)

    def close(self) -> None:
        """Stop the loop; requests still waiting are answered 500."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout=30.0)
        self._die(self._dead or "the server is stopping")
        log.info("engine stopped; at most %d requests sampled in one forward pass", self.largest_batch)


def graph_bucket(value: int, smallest: int, largest: int) -> int:
    """The bucket `value` falls in: the smallest power-of-two multiple of `smallest` that holds it, `largest` at
    most (and at least `value` when `value` > `largest`: the caller never asks past its capacity)."""
    bucket = smallest
    while bucket < value and bucket < largest:
        bucket *= 2
    return max(min(bucket, largest), value)


class DecodeGraphs:
    """The slot engine's decode step replayed from CUDA graphs, one captured per (rows, length) bucket on first use
    (module doc). Inputs are copied into static buffers; the padded rows are free slots (the engine's rows are its
    lowest slots, the running ones among them), decoded at position 0 and never read."""

    def __init__(self, engine: SlotEngine) -> None:
        self.engine = engine
        self.tokens = torch.zeros(engine.slots, dtype=torch.long, device=engine.device)
        self.positions = torch.zeros(engine.slots, dtype=torch.long, device=engine.device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
        """The engine's `decode_rows`, replayed; the logits are a view of the graph's output, valid until the next
        step."""
        n = tokens.shape[0]
        rows = graph_bucket(n, 1, self.engine.slots)
        length = graph_bucket(length, GRAPH_MIN_LENGTH, self.engine.capacity)
        self.tokens[:n].copy_(tokens)
        self.positions[:n].copy_(positions)
        self.tokens[n:rows].zero_()
        self.positions[n:rows].zero_()
        key = (rows, length)
        if key not in self.graphs:
            self.graphs[key] = self._capture(rows, length)
            log.info("slot engine: decode graph for %d rows and %d tokens captured (%d graphs)", *key, len(self.graphs))
        graph, logits = self.graphs[key]
        graph.replay()
        return logits[:n]

    def _capture(self, rows: int, length: int) -> tuple[Any, torch.Tensor]:
        tokens, positions = self.tokens[:rows], self.positions[:rows]
        side = torch.cuda.Stream(self.engine.device)
        side.wait_stream(torch.cuda.current_stream(self.engine.device))
        with torch.cuda.stream(side):  # warm-up off the capture: kernels chosen, workspaces allocated
            for _ in range(2):
                self.engine.decode_rows(tokens, positions, length)
        torch.cuda.current_stream(self.engine.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.engine.decode_rows(tokens, positions, length)
        return graph, logits
