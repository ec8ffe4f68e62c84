"""SFT examples from recorded episodes, their turn weights, and sequence packing (CaPtain §3.2, Eq. 2; App. C).

One example per request t of a valid episode: the prompt is the restored messages request t sent (rendered with
training.gate.render_prompt_ids, so its ids are the ones the gate compared), the target is the assistant turn
that answered it: reasoning/content, the `<tool_call>` code blocks and the end token, i.e. the tokens inside the
template's `{% generation %}` span. The assistant message is taken from the next request's messages when that
request's history extends this prompt with it (then it is exactly what later prompts show), else from the
recorded response (content + tool_calls).

Turn weights w_t (CaPtain Eq. 2: 0 masks "repeated execution failures or recovery loops"), from the step records:
  * a turn fails when one of its robot calls failed (`step.calls[i].success` is false);
  * repeated failure: the turn's code is the previous turn's code (whitespace-normalised) and that turn
    failed: re-running a failed cell unchanged is not behaviour to imitate, whatever it returned;
  * recovery loop: a failing turn that is the `max_failure_streak`-th (default 3rd) or later consecutive
    failing turn; the turn that breaks the streak keeps w_t = 1 (the recovery is worth learning).
Row weights: an episode turn has weight 1, a visual-QA row 0.5 (`ROW_WEIGHTS`; no VQA data is recorded yet,
`vqa_example` builds one). A request the prompt gate rejected has weight 0.

Pixel masking (CaPtain §3.2 "Forcing the model to look", App. C): in the history of a prompt (never in the
target), the literal u, v of each earlier `mark_point(...)` call are replaced by `<masked>` with probability 0.2,
independently per call, from an RNG seeded by (seed, episode, request), so an example is the same whatever order
it is built in. A masked prompt no longer equals the gated ids: that is the augmentation, applied after the gate.

Packing: examples are placed first-fit into rows of at most `max_tokens`; `position_ids` restart at 0 for each
document, `doc_ids` name each token's document (padding is a document of its own), and `cu_seqlens` are the
document boundaries for varlen kernels. `block_causal_mask` turns doc ids into the additive 4D mask for
SDPA/eager attention, so no token attends across documents. Targets are shifted per document before packing,
so the last token of one document never predicts the first of the next.
"""

from __future__ import annotations

import ast
import itertools
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from training.gate import GateReport, RenderConfig, content_format, render_prompt_ids, template_messages

IGNORE = -100  # target id of positions without a loss (prompt, padding, the last token of a document)
ROW_WEIGHTS = {"turn": 1.0, "vqa": 0.5}  # CaPtain Eq. 2: visual-QA examples at weight 0.5
MASK_TEXT = "<masked>"
MARK_POINT_PIXEL_POSITIONS = (2, 3)  # mark_point(observation_handle, camera, u, v, ...)
MARK_POINT_PIXEL_KEYWORDS = ("u", "v")


@dataclass(frozen=True)
class DataConfig:
    mark_point_mask_prob: float = 0.2  # CaPtain §3.2 / App. C
    max_failure_streak: int = 3  # the k-th consecutive failing turn and later ones get w_t = 0
    seed: int = 0  # of the mark_point masking
    drop_zero_weight: bool = True  # w = 0 examples contribute nothing: leave them out of the batches
    render: RenderConfig = field(default_factory=RenderConfig)


@dataclass
class Example:
    """One supervised row: `input_ids` = prompt + response, `response_mask` True on the response tokens."""

    input_ids: list[int]
    response_mask: list[bool]
    weight: float  # turn weight x row weight x gate weight
    prompt_len: int
    row_type: str = "turn"
    episode_id: str = ""
    request: int = 0
    source: str = ""  # where the assistant turn came from: "next_request" | "response" | "vqa"
    masked_points: int = 0  # mark_point calls whose pixels were masked in the prompt

    @property
    def response_tokens(self) -> int:
        return sum(self.response_mask)


# ------------------------------------------------------------------------------------------------ turn weights
def cell_code(message: dict | None) -> str:
    """The code of an assistant message's tool calls (each call's `code` argument), joined."""
    if not message:
        return ""
    parts = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        raw = function.get("arguments")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            args = raw
        parts.append(args.get("code", json.dumps(args)) if isinstance(args, dict) else str(args))
    return "\n".join(parts)


def normalise_code(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines() if line.strip())


def failed_turn(step: dict | None) -> bool:
    """A turn failed when one of its robot calls failed (the step record's calls)."""
    return bool(step) and any(not c.get("success", True) for c in step.get("calls") or [])


def turn_weights(codes: Sequence[str], failed: Sequence[bool], max_failure_streak: int = 3) -> list[float]:
    """CaPtain Eq. 2 w_t per turn (0 for repeated failures and recovery loops, else 1); see the module doc."""
    weights, streak = [], 0
    for t, (code, fail) in enumerate(zip(codes, failed, strict=True)):
        streak = streak + 1 if fail else 0
        repeated = (
            t > 0 and failed[t - 1] and bool(code.strip()) and normalise_code(code) == normalise_code(codes[t - 1])
        )
        loop = fail and streak >= max_failure_streak
        weights.append(0.0 if repeated or loop else 1.0)
    return weights


# ------------------------------------------------------------------------------------------------ mark_point masking
def _is_number(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool)


def mark_point_pixel_spans(code: str) -> list[list[tuple[int, int]]]:
    """Per mark_point call, the character spans of its literal pixel arguments (u, v) in `code`."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    line_starts, offset = [], 0
    for line in code.splitlines(keepends=True):
        line_starts.append(offset)
        offset += len(line)

    def char_index(lineno: int, col_bytes: int) -> int:  # ast columns are UTF-8 byte offsets
        line = code.splitlines(keepends=True)[lineno - 1]
        return line_starts[lineno - 1] + len(line.encode()[:col_bytes].decode(errors="ignore"))

    calls = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name != "mark_point":
            continue
        args = [node.args[i] for i in MARK_POINT_PIXEL_POSITIONS if i < len(node.args)]
        args += [k.value for k in node.keywords if k.arg in MARK_POINT_PIXEL_KEYWORDS]
        spans = [
            (char_index(a.lineno, a.col_offset), char_index(a.end_lineno, a.end_col_offset))
            for a in args
            if _is_number(a)
        ]
        if spans:
            calls.append(sorted(spans))
    return sorted(calls)


def mask_code_points(code: str, rng: random.Random, prob: float) -> tuple[str, int]:
    """`code` with each mark_point call's literal pixels replaced by MASK_TEXT with probability `prob`
    (one draw per call, in source order). Returns (code, calls masked)."""
    chosen = [spans for spans in mark_point_pixel_spans(code) if rng.random() < prob]
    spans = sorted((s for call in chosen for s in call), reverse=True)
    for start, end in spans:
        code = code[:start] + MASK_TEXT + code[end:]
    return code, len(chosen)


def mask_mark_points(messages: list[dict], rng: random.Random, prob: float) -> tuple[list[dict], int]:
    """CaPtain §3.2: earlier mark_point pixel coordinates in the history masked with probability `prob`.
    Only assistant tool-call code is touched; messages are copied, never changed in place."""
    out, masked = [], 0
    for message in messages:
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            out.append(message)
            continue
        calls = []
        for original in message["tool_calls"]:
            call, function = original, original.get("function", original)
            raw = function.get("arguments")
            args = json.loads(raw) if isinstance(raw, str) else raw
            if isinstance(args, dict) and isinstance(args.get("code"), str):
                code, n = mask_code_points(args["code"], rng, prob)
                if n:
                    masked += n
                    args = {**args, "code": code}
                    new_args = json.dumps(args) if isinstance(raw, str) else args
                    function = {**function, "arguments": new_args}
                    call = {**call, "function": function} if "function" in call else function
            calls.append(call)
        out.append({**message, "tool_calls": calls})
    return out, masked


def example_rng(seed: int, episode_id: str, request: int) -> random.Random:
    """An RNG that depends only on (seed, episode, request): examples do not depend on build order."""
    return random.Random(f"{seed}/{episode_id}/{request}")


# ------------------------------------------------------------------------------------------------ tokenisation
def response_ids(
    tokenizer: Any, prompt_messages: list[dict], assistant: dict, tools: list[dict] | None, render: RenderConfig
) -> list[int]:
    """The ids of the assistant turn: the tokens in the template's generation span, i.e. content/reasoning,
    tool-call code and the end token (not the newline the template writes after it)."""
    fmt = content_format(tokenizer, render)
    full = tokenizer.apply_chat_template(
        template_messages([*prompt_messages, assistant], fmt, render.image_text),
        tools=tools or None,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids, mask = list(full["input_ids"]), list(full["assistant_masks"])
    last = max((i for i, m in enumerate(mask) if m), default=-1)
    if last < 0:
        raise ValueError("the chat template marks no assistant tokens: it needs {% generation %} blocks")
    first = last
    while first > 0 and mask[first - 1]:
        first -= 1
    return ids[first : last + 1]


def build_example(
    tokenizer: Any,
    prompt_messages: list[dict],
    assistant: dict,
    tools: list[dict] | None,
    *,
    weight: float,
    render: RenderConfig = RenderConfig(),
    **meta: Any,
) -> Example:
    """prompt ids (== the gate's rendering of `prompt_messages`) + the assistant turn's generated ids."""
    prompt = render_prompt_ids(tokenizer, prompt_messages, tools, render)
    response = response_ids(tokenizer, prompt_messages, assistant, tools, render)
    return Example(
        input_ids=prompt + response,
        response_mask=[False] * len(prompt) + [True] * len(response),
        weight=weight,
        prompt_len=len(prompt),
        **meta,
    )


def vqa_example(
    tokenizer: Any,
    messages: list[dict],
    answer: str,
    tools: list[dict] | None = None,
    render: RenderConfig = RenderConfig(),
) -> Example:
    """A visual-QA row (CaPtain Eq. 2: weight 0.5): `messages` ask, `answer` is the supervised reply."""
    assistant = {"role": "assistant", "content": answer}
    return build_example(
        tokenizer, messages, assistant, tools, weight=ROW_WEIGHTS["vqa"], render=render, row_type="vqa", source="vqa"
    )


def assistant_turn(requests: Sequence[Any], position: int, prompt: list[dict]) -> tuple[dict, str]:
    """The assistant message answering requests[position]: from the next request's history when it extends
    `prompt` with an assistant message, else from the recorded response."""
    if position + 1 < len(requests):
        nxt = (requests[position + 1].model_call or {}).get("messages") or []
        if len(nxt) > len(prompt) and nxt[: len(prompt)] == prompt and nxt[len(prompt)].get("role") == "assistant":
            return nxt[len(prompt)], "next_request"
    response = requests[position].model_call.get("response") or {}
    message: dict[str, Any] = {"role": "assistant", "content": response.get("content") or ""}
    if response.get("tool_calls"):
        message["tool_calls"] = response["tool_calls"]
    return message, "response"


def episode_examples(
    tokenizer: Any, reader: Any, episode_id: str, config: DataConfig = DataConfig(), gate: GateReport | None = None
) -> list[Example]:
    """One example per request of an episode, weighted by w_t (Eq. 2) and the gate (weight 0 if rejected)."""
    episode = reader.load(episode_id)
    requests = [r for r in episode.requests if r.model_call and r.model_call.get("messages")]
    turns = [assistant_turn(requests, i, r.model_call["messages"]) for i, r in enumerate(requests)]
    weights = turn_weights(
        [cell_code(message) for message, _ in turns],
        [failed_turn(r.step) for r in requests],
        config.max_failure_streak,
    )
    examples = []
    for req, (assistant, source), w_t in zip(requests, turns, weights, strict=True):
        weight = w_t * ROW_WEIGHTS["turn"] * (gate.weight(episode_id, req.index) if gate else 1.0)
        if weight == 0.0 and config.drop_zero_weight:
            continue
        prompt = reader.restore_messages(req.model_call["messages"])
        rng = example_rng(config.seed, episode_id, req.index)
        prompt, masked = mask_mark_points(prompt, rng, config.mark_point_mask_prob)
        example = build_example(
            tokenizer,
            prompt,
            reader.restore_messages([assistant])[0],
            req.model_call.get("tools"),
            weight=weight,
            render=config.render,
            episode_id=episode_id,
            request=req.index,
            source=source,
        )
        example.masked_points = masked
        examples.append(example)
    return examples


def sft_examples(
    tokenizer: Any,
    reader: Any,
    episode_ids: Iterable[str] | None = None,
    config: DataConfig = DataConfig(),
    gate: GateReport | None = None,
) -> list[Example]:
    """All examples of the given (default: every complete, valid) episodes, in episode order."""
    ids = reader.episode_ids() if episode_ids is None else episode_ids
    return [ex for eid in ids for ex in episode_examples(tokenizer, reader, eid, config, gate)]


# ------------------------------------------------------------------------------------------------ packing
@dataclass
class PackedRow:
    """Several documents in one row; `targets[i]` is the id to predict at position i (or IGNORE)."""

    input_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    doc_ids: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    token_weights: list[float] = field(default_factory=list)
    examples: list[int] = field(default_factory=list)  # indices into the packed example list

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def cu_seqlens(self) -> list[int]:
        """Document boundaries [0, len_1, len_1 + len_2, ..., len(row)] (flash-attention varlen layout)."""
        bounds = [0] + [i for i in range(1, len(self.doc_ids)) if self.doc_ids[i] != self.doc_ids[i - 1]]
        return [*bounds, len(self.doc_ids)]

    def add(self, example: Example, index: int) -> None:
        n, doc = len(example.input_ids), len(self.examples)
        self.input_ids += example.input_ids
        self.position_ids += range(n)
        self.doc_ids += [doc] * n
        for i in range(n):  # shifted inside the document: the next token, if it is a response token
            target = i + 1 < n and example.response_mask[i + 1]
            self.targets.append(example.input_ids[i + 1] if target else IGNORE)
            self.token_weights.append(example.weight if target else 0.0)
        self.examples.append(index)


def pack_examples(examples: Sequence[Example], max_tokens: int) -> tuple[list[PackedRow], list[int]]:
    """First-fit packing in example order (deterministic). Returns (rows, indices of examples too long to fit)."""
    rows: list[PackedRow] = []
    too_long = []
    for index, example in enumerate(examples):
        n = len(example.input_ids)
        if n > max_tokens:
            too_long.append(index)
            continue
        row = next((r for r in rows if len(r) + n <= max_tokens), None)
        if row is None:
            row = PackedRow()
            rows.append(row)
        row.add(example, index)
    return rows, too_long


def collate(rows: Sequence[PackedRow], pad_id: int, length: int | None = None, mask: bool = True) -> dict[str, Any]:
    """Tensors of a micro-batch, padded to `length` (default: the longest row). Padding is its own document
    (doc id -1, positions from 0), so with either attention path it never mixes with real tokens.

    input_ids, position_ids, targets (IGNORE where no loss), token_weights (float), doc_ids, cu_seqlens (over the
    flattened batch, int32) and max_seqlen; `attention_mask` is the 4D additive block-causal mask when `mask`."""
    import torch

    length = length or max(len(r) for r in rows)
    ids, pos, docs, targets, weights, cu = [], [], [], [], [], [0]
    for r in rows:
        pad = length - len(r)
        if pad < 0:
            raise ValueError(f"a row of {len(r)} tokens does not fit length {length}")
        ids.append(r.input_ids + [pad_id] * pad)
        pos.append(r.position_ids + list(range(pad)))
        docs.append(r.doc_ids + [-1] * pad)
        targets.append(r.targets + [IGNORE] * pad)
        weights.append(r.token_weights + [0.0] * pad)
        seqlens = [b - a for a, b in itertools.pairwise(r.cu_seqlens)] + ([pad] if pad else [])
        for s in seqlens:
            cu.append(cu[-1] + s)
    doc_ids = torch.tensor(docs)
    batch = {
        "input_ids": torch.tensor(ids),
        "position_ids": torch.tensor(pos),
        "targets": torch.tensor(targets),
        "token_weights": torch.tensor(weights, dtype=torch.float32),
        "doc_ids": doc_ids,
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "max_seqlen": max(b - a for a, b in itertools.pairwise(cu)),
    }
    if mask:
        batch["attention_mask"] = block_causal_mask(doc_ids)
    return batch


def block_causal_mask(doc_ids: Any, dtype: Any = None) -> Any:
    """[B, 1, L, L] additive mask: 0 where query i may attend key j (same document, j <= i), the dtype's
    minimum elsewhere. Works for SDPA and eager attention; transformers passes a 4D mask through as it is."""
    import torch

    dtype = dtype or torch.float32
    length = doc_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=doc_ids.device).tril()
    allowed = (doc_ids[:, :, None] == doc_ids[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=dtype, device=doc_ids.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]
