"""The prompt gate (issue 12; ARCHITECTURE "Prompt gate"; AgenticRoboRL's recording-proxy check).

A policy sample is only worth training on if the trainer sees the same tokens the server sampled from. The
server rendered the recorded messages with its chat template; the trainer renders them with the student's. Any
difference (another template revision, a tool schema re-ordered, a whitespace change, a special token the
tokenizer splits differently) silently shifts every log-probability of the sample. So each recorded request is
re-rendered here (`add_generation_prompt=True`, with its recorded `tools`) and compared token by token with its
`prompt_token_ids`: equal gives weight 1, different gives weight 0 and a report naming the episode, the request
and the first differing position, with the tokens around it on both sides.

Requests recorded without token ids (the scripted expert's endpoint returns `prompt_token_ids: null`) cannot be
gated: they are counted as `not_gateable` and keep `not_gateable_weight` (1 by default), because SFT renders
expert data from its messages (captain_ros_training.data) and has no recorded ids to disagree with. The gate therefore
only decides about recorded policy samples; RL needs their recorded ids and logprobs anyway.

`render_prompt_ids` is the one rendering of a prompt; captain_ros_training.data uses it too, so SFT prompts are
exactly the ids the gate compared.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MATCH, MISMATCH, RENDER_ERROR, NOT_GATEABLE = "match", "mismatch", "render_error", "not_gateable"
# a template that loops over message content takes OpenAI content parts; otherwise content is one string
_LOOPS_OVER_CONTENT = re.compile(r"for\s+\w+\s+in\s+\w+\s*(\.content|\[\s*['\"]content['\"]\s*\])")


@dataclass(frozen=True)
class RenderConfig:
    """How messages reach the chat template, as vLLM passes them.

    vLLM gives a template that treats `content` as a string the text parts joined by newlines ("string"
    format) and a template that iterates over parts the parts themselves ("openai"); "auto" decides from the
    template source the way vLLM does. A text-only template cannot show images: they become `image_text`."""

    content_format: str = "auto"  # "auto" | "string" | "openai"
    image_text: str = "[image]"


@dataclass(frozen=True)
class GateConfig:
    render: RenderConfig = RenderConfig()
    not_gateable_weight: float = 1.0  # requests without recorded ids (expert data): rendered from messages
    context_tokens: int = 4  # decoded tokens shown on each side of a first difference
    max_examples: int = 20  # mismatches / ungateable requests kept in the report (all are counted)


@dataclass(frozen=True)
class Mismatch:
    """Where a recorded prompt and its re-rendering first disagree."""

    episode_id: str
    request: int
    position: int  # first differing token index (== the shorter length when one is a prefix of the other)
    recorded_len: int
    rendered_len: int
    recorded_context: tuple[str, ...]  # decoded tokens [position - k, position + k] of the recorded ids
    rendered_context: tuple[str, ...]  # the same window of the re-rendered ids
    error: str = ""  # the template's exception when rendering failed (position -1)

    def __str__(self) -> str:
        where = f"{self.episode_id} request {self.request}"
        if self.error:
            return f"{where}: the template failed: {self.error}"
        return (
            f"{where}: first difference at token {self.position} (recorded {self.recorded_len} tokens, "
            f"rendered {self.rendered_len})\n  recorded: {' | '.join(map(repr, self.recorded_context))}\n"
            f"  rendered: {' | '.join(map(repr, self.rendered_context))}"
        )


@dataclass
class GateReport:
    """Counts, per-request weights and the first few mismatches of one gate pass."""

    passed: int = 0
    failed: int = 0  # mismatches and render errors
    not_gateable: int = 0
    weights: dict[tuple[str, int], float] = field(default_factory=dict)
    status: dict[tuple[str, int], str] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)
    ungateable: list[tuple[str, int, str]] = field(default_factory=list)  # (episode, request, reason)

    @property
    def checked(self) -> int:
        return self.passed + self.failed

    def add(self, episode_id: str, request: int, result: GateResult, max_examples: int = 20) -> None:
        key = (episode_id, request)
        self.weights[key], self.status[key] = result.weight, result.status
        if result.status == MATCH:
            self.passed += 1
        elif result.status == NOT_GATEABLE:
            self.not_gateable += 1
            if len(self.ungateable) < max_examples:
                self.ungateable.append((episode_id, request, result.reason))
        else:
            self.failed += 1
            if result.mismatch is not None and len(self.mismatches) < max_examples:
                self.mismatches.append(result.mismatch)

    def weight(self, episode_id: str, request: int, default: float = 1.0) -> float:
        return self.weights.get((episode_id, request), default)

    def __str__(self) -> str:
        lines = [
            f"prompt gate: {self.checked} gated, {self.passed} match, {self.failed} rejected (weight 0), "
            f"{self.not_gateable} not gateable (no recorded token ids)"
        ]
        lines += [str(m) for m in self.mismatches]
        if self.ungateable:
            eid, t, reason = self.ungateable[0]
            lines.append(f"not gateable, e.g. {eid} request {t}: {reason}")
        return "\n".join(lines)


def content_format(tokenizer: Any, config: RenderConfig = RenderConfig()) -> str:
    """ "string" or "openai": how the template reads `content` (vLLM's detection, by the template source)."""
    if config.content_format != "auto":
        return config.content_format
    template = tokenizer.chat_template or ""
    return "openai" if _LOOPS_OVER_CONTENT.search(template) else "string"


def template_messages(messages: list[dict], fmt: str, image_text: str = "[image]") -> list[dict]:
    """Messages in the form the template takes: for the "string" format, list content becomes its text parts
    joined by newlines (images as `image_text`), as vLLM joins them."""
    if fmt == "openai":
        return messages
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            texts = [p.get("text", "") if p.get("type") == "text" else image_text for p in content]
            out.append({**message, "content": "\n".join(texts)})
        else:
            out.append(message)
    return out


def render_prompt_ids(
    tokenizer: Any, messages: list[dict], tools: list[dict] | None, config: RenderConfig = RenderConfig()
) -> list[int]:
    """The prompt the student sees: messages and tools through its chat template, with the generation prompt."""
    fmt = content_format(tokenizer, config)
    ids = tokenizer.apply_chat_template(
        template_messages(messages, fmt, config.image_text),
        tools=tools or None,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    return list(ids)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; the shorter length if one is a prefix of the other; None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_context(tokenizer: Any, ids: list[int], position: int, width: int) -> tuple[str, ...]:
    """Each token of ids[position - width : position + width + 1] decoded on its own."""
    window = ids[max(0, position - width) : position + width + 1]
    return tuple(tokenizer.decode([i]) for i in window)


@dataclass(frozen=True)
class GateResult:
    """The gate's decision about one request."""

    status: str  # MATCH | MISMATCH | RENDER_ERROR | NOT_GATEABLE
    weight: float
    mismatch: Mismatch | None = None
    reason: str = ""


def gate_request(
    tokenizer: Any,
    episode_id: str,
    request: int,
    model_call: dict | None,
    messages: list[dict] | None,
    *,
    config: GateConfig = GateConfig(),
) -> GateResult:
    """Gate one request; `messages` are its restored recorded messages (EpisodeReader.restore_messages)."""
    recorded = (model_call or {}).get("prompt_token_ids")
    if model_call is None or messages is None:
        return GateResult(NOT_GATEABLE, config.not_gateable_weight, reason="no model_call record")
    if not recorded:
        reason = "no prompt_token_ids recorded (e.g. scripted expert)"
        return GateResult(NOT_GATEABLE, config.not_gateable_weight, reason=reason)
    try:
        rendered = render_prompt_ids(tokenizer, messages, model_call.get("tools"), config.render)
    except Exception as exc:  # the template raised (unknown role, bad content): the sample cannot be trusted
        error = f"{type(exc).__name__}: {exc}"
        return GateResult(RENDER_ERROR, 0.0, Mismatch(episode_id, request, -1, len(recorded), 0, (), (), error), error)
    position = first_difference(recorded, rendered)
    if position is None:
        return GateResult(MATCH, 1.0)
    k = config.context_tokens
    mismatch = Mismatch(
        episode_id,
        request,
        position,
        len(recorded),
        len(rendered),
        token_context(tokenizer, recorded, position, k),
        token_context(tokenizer, rendered, position, k),
    )
    return GateResult(MISMATCH, 0.0, mismatch, f"first difference at token {position}")


def gate_episodes(
    tokenizer: Any, reader: Any, episode_ids: Iterable[str] | None = None, config: GateConfig = GateConfig()
) -> GateReport:
    """Gate every request of the given (default: all complete, valid) episodes of an EpisodeReader."""
    report = GateReport()
    for eid in reader.episode_ids() if episode_ids is None else episode_ids:
        episode = reader.load(eid)
        for req in episode.requests:
            call = req.model_call
            messages = reader.restore_messages(call["messages"]) if call and call.get("messages") else None
            report.add(
                eid,
                req.index,
                gate_request(tokenizer, eid, req.index, call, messages, config=config),
                config.max_examples,
            )
    return report
