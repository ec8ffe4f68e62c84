"""SFT examples from recorded episodes, their turn weights, and sequence packing (CaPtain §3.2, Eq. 2; App. C).

Which episodes (`DataConfig.successful_only`, on by default): valid episodes whose `episode_end.host_success` is
true, i.e. the host judged the scene solved (outcome success or missed_finish; the critic's label and
bridge.evaluation's host rate read the same field); `strict_success` also needs outcome "success" (finish()
accepted). The others are counted (`TrajectoryStats.unsuccessful_skipped`) and never imitated.

Each request t has a prompt p_t (its restored messages rendered by captain_ros_training.gate.render_prompt_ids: the ids
the gate compared) and an assistant turn a_t (the tokens of the template's `{% generation %}` span: reasoning/content,
the `<tool_call>` blocks and the end token). Its assistant message is taken from the next request's history when
that history extends request t's messages with it (then it is exactly what later prompts show), else from the
recorded response. Two forms:
  * whole episodes (`whole_episodes`, the default; CaPtain trains on whole trajectories): while each p_{t+1}
    begins with p_t + a_t (the conversation only grows) the requests form one segment, and a segment is ONE
    example: its last request's messages plus that request's assistant message, rendered once with the assistant
    mask, ending at the last target's end token, with the loss on every assistant span at that request's weight
    (`token_weights`, `spans`). A span is used only if the example's tokens before it equal the request's gated
    prompt ids p_t and the span equals a_t, so each target token is conditioned on exactly the prompt the gate
    accepted; otherwise it stays context without a loss (counted in `prompt_mismatches`, with the reason).
    Where p_{t+1} does not extend p_t + a_t (context compaction rewrote the history, an observation was dropped,
    the tool schema changed) a new segment starts, so an episode gives one example per segment and one that never
    extends gives exactly the per-request examples. A request whose template raises, or whose own prompt + turn
    exceeds `max_trajectory_tokens`, is left out and ends its segment; as a segment's example is no longer than its last
    request's per-request example, this form loses no request that the per-request form keeps.
  * per request (`whole_episodes=False`, `episode_examples`): prompt p_t, target a_t; the older form.
A whole episode of T requests costs about the tokens of its last request instead of the sum over all T prompts.

Weights (CaPtain Eq. 2: w_t = 0 masks "repeated execution failures or recovery loops"), from the step records:
  * a turn fails when one of its robot calls failed (`step.calls[i].success` is false);
  * repeated failure: the turn's code is the previous turn's code (whitespace-normalised) and that turn
    failed: re-running a failed cell unchanged is not behaviour to imitate, whatever it returned;
  * recovery loop: a failing turn that is the `max_failure_streak`-th (default 3rd) or later consecutive
    failing turn; the turn that breaks the streak keeps w_t = 1 (the recovery is worth learning).
Row weights: an episode turn has weight 1, a visual-QA row 0.5 (`ROW_WEIGHTS`; no VQA data is recorded yet,
`vqa_example` builds one). A request the prompt gate rejected has weight 0. A request's weight is w_t x row x gate;
with `drop_zero_weight` a weight-0 turn carries no target (a weight-0 per-request example is left out).

Pixel masking (CaPtain §3.2 "Forcing the model to look", App. C): in the history, never in a target, the literal
u, v of each earlier `mark_point(...)` call are replaced by `<masked>` with probability 0.2, independently per call,
from an RNG seeded by (seed, episode, request or segment), so examples do not depend on build order. Per request,
the prompt's history is masked. In a whole-episode segment a history turn is also a target, so the segment's
conversation is masked once (one draw per call, the last turn excepted); a target turn whose own call was masked
is shown masked, as context only, and is supervised instead by an extra per-request example (source
"masked_turn") whose history gets its own draws. Every turn is then supervised once and sees each earlier call
masked with probability 0.2, as in the per-request form; the extras cost about 0.2 prompts per turn with a
mark_point call. Masking comes after the prompt check: a masked prompt differs from the gated ids by design.

Recovery examples (`recovery_per_episode`, off by default): per successful episode, that many requests drawn among
the imitated ones become an extra example each: the request's prompt, one failed turn, and the expert's call as the
only target (`recovery_example`). The failed turn, of a kind drawn per example, is the expert's call with one JSON
slip (`corrupt_tool_call`) and the episode loop's answer to a call it could not read, or the expert's call with its
cell broken so that it does not compile (`break_cell`) and the tool's compile error. The expert never slips, so its
episodes alone never show a student what to do after either (docs/student.md).

Packing: examples are placed first-fit into rows of at most `max_tokens`; `position_ids` restart at 0 for each
document, `doc_ids` name each token's document (padding is a document of its own), and `cu_seqlens` are the
document boundaries for varlen kernels. `block_causal_mask` turns doc ids into the additive 4D mask for
SDPA/eager attention, so no token attends across documents. Targets are shifted per document before packing,
so the last token of one document never predicts the first of the next. The 4D mask is O(row length^2): `collate`
builds it for one micro-batch, and `MicroBatches` keeps only the packed rows and collates a micro-batch when the
trainer indexes it, so no mask (no tensor at all) is held for the whole data set.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import lzma
import pickle
import random
import re
import traceback
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captain_ros_training.gate import (
    GateReport,
    RenderConfig,
    content_format,
    first_difference,
    render_prompt_ids,
    template_messages,
)

IGNORE = -100  # target id of positions without a loss (prompt, padding, the last token of a document)
ROW_WEIGHTS = {"turn": 1.0, "vqa": 0.5}  # CaPtain Eq. 2: visual-QA examples at weight 0.5
MASK_TEXT = "<masked>"
MARK_POINT_PIXEL_POSITIONS = (2, 3)  # mark_point(observation_handle, camera, u, v, ...)
MARK_POINT_PIXEL_KEYWORDS = ("u", "v")
# what became of a request (TrajectoryStats.requests)
TARGET, ZERO_WEIGHT, UNVERIFIED = "target", "zero_weight", "unverified"
RENDER_ERROR, TOO_LONG = "render_error", "too_long"


@dataclass(frozen=True)
class DataConfig:
    mark_point_mask_prob: float = 0.2  # CaPtain §3.2 / App. C
    max_failure_streak: int = 3  # the k-th consecutive failing turn and later ones get w_t = 0
    seed: int = 0  # of the mark_point masking
    drop_zero_weight: bool = True  # a w = 0 turn carries no target (a w = 0 per-request example is left out)
    whole_episodes: bool = True  # one example per segment where the history only grows (else one per request)
    successful_only: bool = True  # SFT imitates successful episodes only (valid, host_success)
    strict_success: bool = False  # and only those whose finish() was accepted (outcome "success")
    # a request whose own prompt + turn is longer is left out, ending its segment (0: no limit); so no whole-episode
    # example is longer (it is as long as its last request's per-request example)
    max_trajectory_tokens: int = 0
    # per successful episode, this many extra examples of recovering from an unreadable tool call or a cell that did
    # not compile (`recovery_example`)
    recovery_per_episode: int = 0
    render: RenderConfig = field(default_factory=RenderConfig)


@dataclass(frozen=True)
class Span:
    """One request's assistant turn inside an example: input_ids[start:end], with the loss at `weight`."""

    request: int
    start: int
    end: int
    weight: float


@dataclass
class Example:
    """One supervised row: `input_ids` = prompt + response(s), `response_mask` True on the target tokens."""

    input_ids: list[int]
    response_mask: list[bool]
    weight: float  # turn weight x row weight x gate weight (a trajectory: its largest span weight)
    prompt_len: int  # tokens before the first target
    row_type: str = "turn"
    episode_id: str = ""
    request: int = 0  # the (last) request it answers
    source: str = ""  # "next_request" | "response" (the turn's origin) | "vqa" | "trajectory" | "masked_turn"
    masked_points: int = 0  # mark_point calls whose pixels were masked in the history
    token_weights: list[float] | None = None  # per token (a trajectory's spans differ); None: `weight` everywhere
    spans: list[Span] = field(default_factory=list)  # a trajectory's target spans, in order

    @property
    def response_tokens(self) -> int:
        return sum(self.response_mask)

    def token_weight(self, i: int) -> float:
        """The loss weight of token i (when it is a target)."""
        return self.weight if self.token_weights is None else self.token_weights[i]


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


def example_rng(seed: int, episode_id: str, request: int | str) -> random.Random:
    """An RNG that depends only on (seed, episode, request or segment): examples do not depend on build order."""
    return random.Random(f"{seed}/{episode_id}/{request}")


# ------------------------------------------------------------------------------------------------ tokenisation
class NoGenerationMarks(ValueError):
    """The chat template marks no assistant tokens: no response mask can be built."""


def render_conversation(
    tokenizer: Any, messages: list[dict], tools: list[dict] | None, render: RenderConfig = RenderConfig()
) -> tuple[list[int], list[tuple[int, int]]]:
    """A conversation through the chat template once: (ids, [start, end) of each assistant span in order), the
    spans being the template's `{% generation %}` parts (content/reasoning, tool calls, end token)."""
    fmt = content_format(tokenizer, render)
    full = tokenizer.apply_chat_template(
        template_messages(messages, fmt, render.image_text),
        tools=tools or None,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids, mask = list(full["input_ids"]), [bool(m) for m in full["assistant_masks"]]
    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    ends = [i + 1 for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]
    if not starts and any(m.get("role") == "assistant" for m in messages):
        raise NoGenerationMarks("the chat template marks no assistant tokens: it needs {% generation %} blocks")
    return ids, list(zip(starts, ends, strict=True))


def response_ids(
    tokenizer: Any, prompt_messages: list[dict], assistant: dict, tools: list[dict] | None, render: RenderConfig
) -> list[int]:
    """The ids of the assistant turn: the tokens in the template's generation span, i.e. content/reasoning,
    tool-call code and the end token (not the newline the template writes after it)."""
    ids, spans = render_conversation(tokenizer, [*prompt_messages, assistant], tools, render)
    start, end = spans[-1]
    return ids[start:end]


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


def request_weights(
    episode_id: str, requests: Sequence[Any], config: DataConfig = DataConfig(), gate: GateReport | None = None
) -> list[float]:
    """Each request's weight: w_t (Eq. 2) x the turn row weight x the gate's weight (0 if rejected)."""
    turns = [assistant_turn(requests, i, r.model_call["messages"]) for i, r in enumerate(requests)]
    w = turn_weights(
        [cell_code(message) for message, _ in turns], [failed_turn(r.step) for r in requests], config.max_failure_streak
    )
    return [
        w_t * ROW_WEIGHTS["turn"] * (gate.weight(episode_id, r.index) if gate else 1.0)
        for r, w_t in zip(requests, w, strict=True)
    ]


def episode_examples(
    tokenizer: Any,
    reader: Any,
    episode_id: str,
    config: DataConfig = DataConfig(),
    gate: GateReport | None = None,
    *,
    stats: TrajectoryStats | None = None,
) -> list[Example]:
    """One example per request of an episode (the per-request form), weighted by w_t (Eq. 2) and the gate (weight
    0 if rejected). Every episode it is given, successful or not: `sft_examples` applies the filters."""
    episode = reader.load(episode_id)
    requests = [r for r in episode.requests if r.model_call and r.model_call.get("messages")]
    turns = [assistant_turn(requests, i, r.model_call["messages"]) for i, r in enumerate(requests)]
    weights = request_weights(episode_id, requests, config, gate)
    examples = []
    for req, (assistant, source), weight in zip(requests, turns, weights, strict=True):
        if weight == 0.0 and config.drop_zero_weight:
            if stats is not None:
                stats.request(episode_id, req.index, ZERO_WEIGHT)
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
        if stats is not None:
            stats.request(episode_id, req.index, TARGET if weight > 0 else ZERO_WEIGHT)
            stats.masked_points += masked
        examples.append(example)
    return examples


# ------------------------------------------------------------------------------------------------ whole episodes
@dataclass
class TrajectoryStats:
    """How an SFT data set was built (module doc): episodes used and skipped, segments, each request's fate
    (`requests`: TARGET, ZERO_WEIGHT, UNVERIFIED, RENDER_ERROR, TOO_LONG) and the first few problems."""

    episodes: int = 0
    unsuccessful_skipped: int = 0
    whole: int = 0  # episodes that became one example of every request (their history only grows)
    segmented: int = 0  # episodes cut into segments (the history stopped growing, or a request was left out)
    per_request: int = 0  # episodes built per request (DataConfig.whole_episodes off)
    segments: int = 0  # examples of the episode form
    prompt_mismatches: int = 0  # spans left out: not preceded by the gated prompt ids, or not the request's turn
    too_long: int = 0  # requests left out: their own prompt + turn exceed max_trajectory_tokens
    masked_turn_examples: int = 0  # per-request examples of target turns that were masked in their segment
    recovery_examples: int = 0  # examples of recovering from a failed turn (DataConfig.recovery_per_episode)
    # the student's own states labelled by the expert (captain_ros_training.dagger; sft-data --dagger)
    dagger_examples: int = 0
    mask_skipped: int = 0  # segments left unmasked: their assistant messages and spans could not be matched
    masked_points: int = 0  # mark_point calls masked, over all examples
    requests: Counter = field(default_factory=Counter)
    problems: list[tuple[str, int, str]] = field(default_factory=list)  # (episode, request, why), the first few
    max_problems: int = 20

    def request(self, episode_id: str, request: int, status: str, why: str = "") -> None:
        self.requests[status] += 1
        if why and len(self.problems) < self.max_problems:
            self.problems.append((episode_id, request, why))

    def __str__(self) -> str:
        requests = ", ".join(f"{n} {status}" for status, n in sorted(self.requests.items())) or "none"
        lines = [
            f"SFT data: {self.episodes} episodes, {self.unsuccessful_skipped} unsuccessful left out; {self.whole} "
            f"whole, {self.segmented} cut into segments, {self.per_request} per request ({self.segments} segment "
            f"examples, {self.masked_turn_examples} masked-turn examples, {self.recovery_examples} recovery examples"
            f"{f', {self.dagger_examples} DAgger examples' if self.dagger_examples else ''})",
            f"  requests: {requests}; {self.prompt_mismatches} spans not matching their gated prompt or turn left "
            f"out; {self.masked_points} mark_point calls masked, {self.mask_skipped} segments left unmasked",
        ]
        lines += [f"  {eid} request {t}: {why}" for eid, t, why in self.problems]
        return "\n".join(lines)


@dataclass
class Turn:
    """One request, rendered for the episode form: its restored messages, tools and assistant message, its prompt
    ids (the gate's rendering, p_t) and its turn's ids (the generation span, a_t), and its weight."""

    index: int
    messages: list[dict]
    assistant: dict
    tools: list[dict] | None
    prompt: list[int]
    turn: list[int]
    weight: float


def render_turns(
    tokenizer: Any,
    reader: Any,
    episode_id: str,
    requests: Sequence[Any],
    *,
    weights: Sequence[float],
    config: DataConfig,
    stats: TrajectoryStats,
) -> list[Turn | None]:
    """Each request as a Turn, or None (counted) when its template raised or its own prompt + turn exceed
    `max_trajectory_tokens`."""
    out: list[Turn | None] = []
    for position, (req, weight) in enumerate(zip(requests, weights, strict=True)):
        messages = reader.restore_messages(req.model_call["messages"])
        assistant = reader.restore_messages([assistant_turn(requests, position, req.model_call["messages"])[0]])[0]
        tools = req.model_call.get("tools")
        try:
            prompt = render_prompt_ids(tokenizer, messages, tools, config.render)
            turn = response_ids(tokenizer, messages, assistant, tools, config.render)
        except NoGenerationMarks:
            raise
        except Exception as exc:  # the template raised: this request cannot be trained on (the gate rejects it too)
            stats.request(episode_id, req.index, RENDER_ERROR, f"the template failed: {type(exc).__name__}: {exc}")
            out.append(None)
            continue
        if 0 < config.max_trajectory_tokens < len(prompt) + len(turn):
            why = f"{len(prompt) + len(turn)} tokens > max_trajectory_tokens {config.max_trajectory_tokens}"
            stats.too_long += 1
            stats.request(episode_id, req.index, TOO_LONG, why)
            out.append(None)
            continue
        out.append(Turn(req.index, messages, assistant, tools, prompt, turn, weight))
    return out


def split_segments(turns: Sequence[Turn | None]) -> list[list[Turn]]:
    """Maximal runs of consecutive turns each of whose prompt begins with the previous prompt + turn (the history
    only grows); a None (a request left out) ends a run."""
    segments: list[list[Turn]] = []
    current: list[Turn] = []
    for turn in turns:
        if current and (turn is None or turn.prompt[: len(current[-1].prompt) + len(current[-1].turn)]
                        != current[-1].prompt + current[-1].turn):  # fmt: skip
            segments.append(current)
            current = []
        if turn is not None:
            current.append(turn)
    if current:
        segments.append(current)
    return segments


def masked_turn_example(tokenizer: Any, episode_id: str, turn: Turn, config: DataConfig) -> Example:
    """The per-request example of a turn masked in its segment (module doc): its history with its own draws."""
    rng = example_rng(config.seed, episode_id, turn.index)
    prompt, masked = mask_mark_points(turn.messages, rng, config.mark_point_mask_prob)
    example = build_example(
        tokenizer, prompt, turn.assistant, turn.tools, weight=turn.weight, render=config.render,
        episode_id=episode_id, request=turn.index, source="masked_turn",
    )  # fmt: skip
    example.masked_points = masked
    return example


def verified_targets(
    episode_id: str,
    segment: Sequence[Turn],
    ids: list[int],
    spans: list[tuple[int, int]],
    *,
    config: DataConfig,
    stats: TrajectoryStats,
) -> dict[int, Turn]:
    """{span index: the request it answers} for each request whose span may carry a loss: the example's tokens
    before the span are the request's gated prompt ids and the span is its turn (else UNVERIFIED, counted)."""
    span_at = {start: k for k, (start, _) in enumerate(spans)}
    targets: dict[int, Turn] = {}
    for turn in segment:
        k, n = span_at.get(len(turn.prompt)), len(turn.prompt)
        why = ""
        if ids[:n] != turn.prompt:
            at = first_difference(ids[:n], turn.prompt)
            why = f"the episode example differs from the request's gated prompt ids at token {at}"
        elif k is None or ids[spans[k][0] : spans[k][1]] != turn.turn:
            why = "the episode example's assistant span after the prompt is not the request's turn"
        if why:
            stats.prompt_mismatches += 1
            stats.request(episode_id, turn.index, UNVERIFIED, why)
        elif turn.weight == 0.0 and config.drop_zero_weight:
            stats.request(episode_id, turn.index, ZERO_WEIGHT)
        else:
            targets[k] = turn
    return targets


def mask_segment(
    tokenizer: Any,
    episode_id: str,
    segment: Sequence[Turn],
    rendered: tuple[list[int], list[tuple[int, int]]],
    *,
    targets: dict[int, Turn],
    config: DataConfig,
    stats: TrajectoryStats,
) -> tuple[list[int], list[tuple[int, int]], int, list[Example]]:
    """The segment's mark_point masking (module doc): (ids, spans, calls masked, per-request examples of the
    target turns whose own code was masked); those turns and any span the masking changed leave `targets`."""
    ids, spans = rendered
    last = segment[-1]
    messages = [*last.messages, last.assistant]
    rng = example_rng(config.seed, episode_id, f"segment/{segment[0].index}-{last.index}")
    masked, n = mask_mark_points(messages[:-1], rng, config.mark_point_mask_prob)
    if not n:
        return ids, spans, 0, []
    before = [m for m in messages[:-1] if m.get("role") == "assistant"]
    after = [m for m in masked if m.get("role") == "assistant"]
    changed = {k for k, (a, b) in enumerate(zip(before, after, strict=True)) if a != b}
    masked_ids, masked_spans = render_conversation(tokenizer, [*masked, messages[-1]], last.tools, config.render)
    if len(spans) != len(before) + 1 or len(masked_spans) != len(spans):
        stats.mask_skipped += 1  # the spans cannot be matched to the messages: the segment stays unmasked
        return ids, spans, 0, []
    extras = []
    for k in sorted(targets):
        (a, b), (c, d) = spans[k], masked_spans[k]
        if k in changed:  # its own code was masked: supervised by a per-request example instead
            extras.append(masked_turn_example(tokenizer, episode_id, targets.pop(k), config))
        elif masked_ids[c:d] != ids[a:b]:
            stats.prompt_mismatches += 1
            stats.request(episode_id, targets.pop(k).index, UNVERIFIED, "masking another turn changed its tokens")
    return masked_ids, masked_spans, n, extras


def segment_examples(
    tokenizer: Any, episode_id: str, segment: Sequence[Turn], config: DataConfig, stats: TrajectoryStats
) -> list[Example]:
    """A segment's example: the last request's messages and turn rendered once, the loss on every verified span
    at its request's weight; then the per-request examples of target turns its mark_point masking hid."""
    last = segment[-1]
    ids, spans = render_conversation(tokenizer, [*last.messages, last.assistant], last.tools, config.render)
    targets = verified_targets(episode_id, segment, ids, spans, config=config, stats=stats)
    masked_points, extras = 0, []
    if targets and config.mark_point_mask_prob > 0:
        ids, spans, masked_points, extras = mask_segment(
            tokenizer, episode_id, segment, (ids, spans), targets=targets, config=config, stats=stats
        )
    examples = []
    if targets:
        order = sorted(targets)
        end = spans[order[-1]][1]  # up to the last target's end token (not the newline after it)
        response, token_weights, kept = [False] * end, [0.0] * end, []
        for k in order:
            (a, b), turn = spans[k], targets[k]
            response[a:b] = [True] * (b - a)
            token_weights[a:b] = [turn.weight] * (b - a)
            kept.append(Span(turn.index, a, b, turn.weight))
            stats.request(episode_id, turn.index, TARGET if turn.weight > 0 else ZERO_WEIGHT)
        examples.append(
            Example(
                input_ids=ids[:end],
                response_mask=response,
                weight=max(s.weight for s in kept),
                prompt_len=spans[order[0]][0],
                episode_id=episode_id,
                request=kept[-1].request,
                source="trajectory",
                masked_points=masked_points,
                token_weights=token_weights,
                spans=kept,
            )
        )
        stats.segments += 1
    for extra in extras:
        stats.request(episode_id, extra.request, TARGET if extra.weight > 0 else ZERO_WEIGHT)
        stats.masked_points += extra.masked_points
    stats.masked_points += masked_points
    stats.masked_turn_examples += len(extras)
    return examples + extras


def trajectory_examples(
    tokenizer: Any,
    reader: Any,
    episode: Any,
    config: DataConfig = DataConfig(),
    gate: GateReport | None = None,
    *,
    stats: TrajectoryStats | None = None,
) -> list[Example]:
    """The episode form (module doc) of one loaded episode: one example per segment where the history only grows,
    in request order, each followed by the per-request examples of its masked target turns."""
    stats = stats if stats is not None else TrajectoryStats()
    eid = episode.episode_id
    requests = [r for r in episode.requests if r.model_call and r.model_call.get("messages")]
    weights = request_weights(eid, requests, config, gate)
    turns = render_turns(tokenizer, reader, eid, requests, weights=weights, config=config, stats=stats)
    segments = split_segments(turns)
    if len(segments) == 1 and None not in turns:
        stats.whole += 1
    elif segments:
        stats.segmented += 1
    return [ex for segment in segments for ex in segment_examples(tokenizer, eid, segment, config, stats)]


def successful(end: dict | None, strict: bool = False) -> bool:
    """A valid episode whose scene the host judged solved (host_success; the critic's label too), and with
    `strict` also finished (outcome "success": finish() accepted)."""
    end = end or {}
    ok = bool(end.get("valid")) and end.get("host_success") is True
    return ok and (not strict or end.get("outcome") == "success")


def sft_examples(
    tokenizer: Any,
    reader: Any,
    episode_ids: Iterable[str] | None = None,
    config: DataConfig = DataConfig(),
    gate: GateReport | None = None,
    *,
    stats: TrajectoryStats | None = None,
) -> list[Example]:
    """All examples of the given (default: every complete, valid) episodes, in episode order: successful ones only
    (`successful_only`), in the episode form (`whole_episodes`) or per request. `stats` counts what happened."""
    stats = stats if stats is not None else TrajectoryStats()
    examples: list[Example] = []
    for eid in reader.episode_ids() if episode_ids is None else episode_ids:
        stats.episodes += 1
        episode = reader.load(eid)
        if config.successful_only and not successful(episode.end, config.strict_success):
            stats.unsuccessful_skipped += 1
            continue
        if config.whole_episodes:
            examples += trajectory_examples(tokenizer, reader, episode, config, gate, stats=stats)
        else:
            stats.per_request += 1
            examples += episode_examples(tokenizer, reader, eid, config, gate, stats=stats)
        if config.recovery_per_episode:
            extra = recovery_examples(tokenizer, reader, episode, config, gate)
            stats.recovery_examples += len(extra)
            examples += extra
    return examples


# ------------------------------------------------------------------------------------------ recovery examples
BUDGET_LINE = re.compile(r"\[budget\] requests (\d+)/(\d+), physical actions (\d+)/(\d+), time (\d+)/(\d+) s")


def corrupt_tool_call(code: str, rng: random.Random) -> str | None:
    """The hermes text of a `python` tool call of `code` (`<tool_call>` JSON `</tool_call>`) with one slip of the
    kind a small student makes inside the JSON string, where the code's quotes must be escaped: a single quote
    written `\\'` (not a JSON escape) or a double quote left bare (it ends the string). None when the code has
    neither quote. The text does not parse: vLLM's hermes parser (and hf_serve's) hands it back as content."""
    text = json.dumps({"name": "python", "arguments": {"code": code}}, ensure_ascii=False)
    places = [("'", i) for i, ch in enumerate(text) if ch == "'"]
    places += [('"', m.start()) for m in re.finditer(r'(?<!\\)\\"', text)]
    while places:
        quote, i = places.pop(rng.randrange(len(places)))
        bad = text[:i] + "\\'" + text[i + 1 :] if quote == "'" else text[:i] + text[i + 1 :]
        try:
            json.loads(bad)
        except json.JSONDecodeError:
            return f"<tool_call>\n{bad}\n</tool_call>"
    return None


def break_cell(code: str, index: int, rng: random.Random) -> tuple[str, str] | None:
    """The cell with one slip that stops it compiling, of the kinds the fine-tuned students' cells raised
    SyntaxError on (their most common error): a line's last closing bracket dropped, a string's closing quote
    dropped, or a line indented one space further; and the error the sandbox reports for it as cell `index` of the
    session (sandbox_child.run_cell: nothing runs, the compile error is the whole report). None when no line of
    the cell takes such a slip."""
    lines = code.split("\n")
    places = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    rng.shuffle(places)
    for i in places:
        line = lines[i]
        kinds = ["indent"]
        if any(ch in line for ch in ")]}"):
            kinds.append("bracket")
        if line.count('"') >= 2 or line.count("'") >= 2:
            kinds.append("quote")
        kind = rng.choice(kinds)
        if kind == "bracket":
            j = max(line.rfind(ch) for ch in ")]}")
        elif kind == "quote":
            j = max(line.rfind('"'), line.rfind("'"))
        bad_line = " " + line if kind == "indent" else line[:j] + line[j + 1 :]
        bad = "\n".join([*lines[:i], bad_line, *lines[i + 1 :]])
        try:
            ast.parse(bad, f"<cell {index}>", "exec")
        except SyntaxError as exc:
            return bad, "".join(traceback.format_exception_only(type(exc), exc))
    return None


def _budget_after(messages: Sequence[dict], limits: tuple[str, str, str] | None) -> str:
    """The budget line the loop would write after one more request that ran nothing: the latest line in
    `messages` with one request more, else (the first request) one from the episode's `limits`; '' if unknown."""
    for message in reversed(messages):
        content = message.get("content")
        found = BUDGET_LINE.findall(content) if isinstance(content, str) else []
        if found:
            used, limit, actions, actions_limit, time_s, time_limit = found[-1]
            return (
                f"[budget] requests {int(used) + 1}/{limit}, physical actions {actions}/{actions_limit}, time "
                f"{time_s}/{time_limit} s"
            )
    if limits is None:
        return ""
    return f"[budget] requests 1/{limits[0]}, physical actions 0/{limits[1]}, time 0/{limits[2]} s"


RECOVERY_KINDS = ("unread_call", "syntax_error")


def _cells_run(request: Any) -> int:
    """The cells a request ran: as its step recorded them, else one per tool call of its reply."""
    cells = (request.step or {}).get("cells")
    if cells is not None:
        return len(cells)
    return len(((request.model_call or {}).get("response") or {}).get("tool_calls") or [])


def recovery_example(
    tokenizer: Any,
    reader: Any,
    episode_id: str,
    requests: Sequence[Any],
    position: int,
    *,
    config: DataConfig,
    limits: tuple[str, str, str] | None,
    rng: random.Random,
    kind: str = "unread_call",
) -> Example | None:
    """Request `position` of an expert episode as a recovery from a slip, with the expert's own turn as the only
    target, after its prompt and one failed turn of `kind`:
      * "unread_call": an assistant reply whose tool call is the expert's with one JSON slip (`corrupt_tool_call`;
        its text before the block kept), then the loop's answer to an unreadable call (policy_client.unread_feedback
        with the budget line it would show);
      * "syntax_error": the expert's call with its cell broken so that it does not compile (`break_cell`), then the
        tool's answer: the compile error and the budget line (episode.py's cell report; nothing ran, so the scene
        and the session are as before and the expert's cell is still the right next one).
    The students this trains never saw either in the expert's episodes and, at temperature 1, answered in their own
    words or with more broken cells (docs/student.md). None when the turn is not one `python` call, or its code
    takes no such slip. `limits`: the episode's budget limits (requests, actions, seconds), for a first request's
    budget line."""
    from captain_ros.agent.context import cut_text
    from captain_ros.agent.policy_client import unread_feedback, unread_tool_call

    req = requests[position]
    prompt = reader.restore_messages(req.model_call["messages"])
    assistant, _ = assistant_turn(requests, position, req.model_call["messages"])
    calls = assistant.get("tool_calls") or []
    code = cell_code(assistant)
    if len(calls) != 1 or (calls[0].get("function") or {}).get("name") != "python" or not code:
        return None
    budget = _budget_after(prompt, limits)
    if kind == "unread_call":
        block = corrupt_tool_call(code, rng)
        if block is None:
            return None
        text = assistant.get("content") or ""
        slipped = {"role": "assistant", "content": f"{text}\n{block}" if text else block}
        reason = unread_tool_call(slipped["content"], "stop")
        if reason is None:  # corrupt_tool_call guarantees a block that does not parse
            raise AssertionError(f"{episode_id} request {req.index}: the corrupted call parsed")
        failed = [slipped, {"role": "user", "content": unread_feedback(reason, budget)}]
    elif kind == "syntax_error":
        index = 1 + sum(_cells_run(r) for r in requests[:position])  # the session's number for the cell
        broken = break_cell(code, index, rng)
        if broken is None:
            return None
        bad, error = broken
        call = {**calls[0], "function": {**calls[0]["function"], "arguments": json.dumps({"code": bad})}}
        report = "\n".join(p for p in (f"[error] (error)\n{cut_text(error, 3000)}", budget) if p)
        failed = [{**assistant, "tool_calls": [call]}, {"role": "tool", "tool_call_id": call["id"], "content": report}]
    else:
        raise ValueError(f"unknown recovery kind {kind!r}; one of {', '.join(RECOVERY_KINDS)}")
    history, masked = mask_mark_points([*prompt, *failed], rng, config.mark_point_mask_prob)
    example = build_example(
        tokenizer, history, reader.restore_messages([assistant])[0], req.model_call.get("tools"),
        weight=ROW_WEIGHTS["turn"], render=config.render, episode_id=episode_id, request=req.index,
        source=f"recovery_{kind}",
    )  # fmt: skip
    example.masked_points = masked
    return example


def recovery_examples(
    tokenizer: Any, reader: Any, episode: Any, config: DataConfig, gate: GateReport | None = None
) -> list[Example]:
    """`config.recovery_per_episode` recovery examples of one episode (`recovery_example`), at requests drawn
    (seeded by the episode) among those with weight > 0, each of a kind drawn among RECOVERY_KINDS; fewer when
    fewer turns qualify."""
    eid = episode.episode_id
    requests = [r for r in episode.requests if r.model_call and r.model_call.get("messages")]
    weights = request_weights(eid, requests, config, gate)
    rng = example_rng(config.seed, eid, "recovery")
    limits = None
    for r in requests:
        for message in r.model_call["messages"]:
            content = message.get("content")
            found = BUDGET_LINE.findall(content) if isinstance(content, str) else []
            if found:
                limits = (found[-1][1], found[-1][3], found[-1][5])
                break
        if limits:
            break
    positions = [i for i, w in enumerate(weights) if w > 0]
    rng.shuffle(positions)
    examples = []
    for i in positions:
        if len(examples) == config.recovery_per_episode:
            break
        kind = rng.choice(RECOVERY_KINDS)
        example = recovery_example(
            tokenizer, reader, eid, requests, i, config=config, limits=limits, rng=rng, kind=kind
        )
        if example is not None:
            examples.append(example)
    return examples


# ------------------------------------------------------------------------------------------- SFT data files
SFT_DATA_FORMAT = 1


class SFTDataMismatch(ValueError):
    """An SFT data file built for another tokenizer, data configuration or format."""


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 over what decides the examples' ids: the vocabulary, the added tokens (how the chat markers encode:
    a tokenizer that cuts `<tool_call>` into pieces has the same vocabulary), the chat template, and the ids of a
    probe that holds every added token."""
    added = {
        i: (t.content, t.special, t.single_word, t.lstrip, t.rstrip, t.normalized)
        for i, t in tokenizer.added_tokens_decoder.items()
    }
    probe = "def f(x):\n    return x  # \u00e9\n" + " ".join(t for t, *_ in added.values())
    parts = (
        sorted(tokenizer.get_vocab().items()),
        sorted(added.items()),
        tokenizer.chat_template or "",
        tokenizer.encode(probe, add_special_tokens=False),
    )
    return hashlib.sha256(json.dumps(parts, separators=(",", ":"), default=str).encode()).hexdigest()


def save_sft_data(
    path: Any,
    tokenizer: Any,
    config: DataConfig,
    *,
    source: str,
    gate: Any,
    stats: TrajectoryStats,
    examples: list[Example],
) -> Path:
    """Write the examples `sft_examples` built (with the gate's summary and the stats) as one file, lzma-compressed,
    so a GPU host trains on them without re-rendering the store (`python -m captain_ros_training rl sft-data`). Written
    under a temporary name and renamed: an interrupted write leaves no file. Missing folders of `path` are made."""
    path = Path(path)
    record = {
        "format": SFT_DATA_FORMAT,
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "config": repr(config),
        "source": source,
        "gate": str(gate),
        "stats": stats,
        "examples": examples,
    }
    path.parent.mkdir(parents=True, exist_ok=True)  # `--out` may name a folder not made yet
    tmp = path.with_name(path.name + ".tmp")
    with lzma.open(tmp, "wb", preset=6) as f:
        pickle.dump(record, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)
    return path


class _DataUnpickler(pickle.Unpickler):
    """Reads files written before the trainer's package was renamed (`training` -> `captain_ros_training`): their
    classes (Example, Span, TrajectoryStats, ...) are looked up under the package's name now."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "training" or module.startswith("training."):
            module = "captain_ros_training" + module[len("training") :]
        return super().find_class(module, name)


def load_sft_data(path: Any, tokenizer: Any, config: DataConfig) -> dict[str, Any]:
    """A file of `save_sft_data` (a pickle: read only files you made), refused unless it was built for this
    tokenizer (`tokenizer_fingerprint`) and this data configuration. Returns its record (source, gate, stats,
    examples)."""
    with lzma.open(path, "rb") as f:
        record = _DataUnpickler(f).load()
    if not isinstance(record, dict) or record.get("format") != SFT_DATA_FORMAT:
        raise SFTDataMismatch(f"{path} is not an SFT data file of format {SFT_DATA_FORMAT}")
    if record["tokenizer"] != tokenizer_fingerprint(tokenizer):
        raise SFTDataMismatch(
            f"{path} was built with another tokenizer (vocabulary, added tokens or chat template differ): rebuild "
            "it with this model's folder"
        )
    if record["config"] != repr(config):
        raise SFTDataMismatch(
            f"{path} was built with {record['config']}, not {config!r}: rebuild it with these options"
        )
    return record


class MicroBatches(Sequence):
    """Packed rows grouped `rows_per_batch` at a time, each group collated only when it is used: the O(L^2)
    attention masks of a data set never sit in memory together (the object holds the rows, no tensor)."""

    def __init__(self, rows: Sequence[PackedRow], rows_per_batch: int, pad_id: int, mask: bool = True):
        if rows_per_batch < 1:
            raise ValueError("rows_per_batch must be at least 1")
        self.rows, self.n, self.pad_id, self.mask = list(rows), rows_per_batch, pad_id, mask

    def __len__(self) -> int:
        return (len(self.rows) + self.n - 1) // self.n

    def __getitem__(self, index: int) -> dict[str, Any]:  # type: ignore[override]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        return collate(self.rows[index * self.n : (index + 1) * self.n], self.pad_id, mask=self.mask)


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
            self.token_weights.append(example.token_weight(i + 1) if target else 0.0)
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
