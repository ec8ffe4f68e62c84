"""DAgger labels: the student's own episodes on training starts, each state where it left the expert's path labelled
with the scripted expert's next cell (Ross et al., 2011: train on the states the learner visits, with the
expert's action as the target).

Why: a student trained on the expert's episodes alone has only seen the expert's states. Once it slips (a cell that
does not compile, a call that is not JSON, a cell of its own invention) it is somewhere the data never went, and
the fine-tuned 0.5B student then re-sent the same broken cell until its request budget ran out (docs/student.md,
"The third SFT"). The expert is a policy over the conversation alone (agent.expert: it reads the cells' step lines,
`status:` and `result:` lines and errors), so it answers any of the student's states: after a cell that raised it
re-observes and plans the goal again, after a verified scene it finishes.

`dagger_examples` turns one student episode into per-request examples: the prompt is the student's own request as
recorded (its history, its slips), the target the expert's reply (`expert_server.completion`: the cell as one
`python` tool call, the reasoning as comment lines, the form the expert's episodes have). A state is labelled only
where the student's reply differs from the expert's in code (comments and blank lines aside): where it already did
what the expert does, the expert's own episodes teach it. At most `per_episode` states per episode, the first ones
where it left the path (the slip, then what followed it). Nothing here reads the simulator: the labels come from
the conversation, as the expert's own cells do.

Only training starts (`python -m captain_ros_training student-eval run --split train`) may be labelled: the held-out
evaluation's starts never enter training; `dagger_examples` refuses an episode of the eval split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from captain_ros_training.data import ROW_WEIGHTS, Example, assistant_turn, build_example, cell_code

_COMMENT = re.compile(r"^\s*#")


class NotATrainingEpisode(ValueError):
    """An episode of the held-out split (or of no split) offered for labelling."""


@dataclass
class DaggerStats:
    episodes: int = 0
    states: int = 0  # requests looked at
    agreed: int = 0  # the student's code was the expert's: no label needed
    expert_done: int = 0  # the expert had nothing more to do (finish accepted, or it gave up)
    too_long: int = 0  # prompt + label longer than max_tokens
    capped: int = 0  # deviations past per_episode
    examples: int = 0
    skipped_episodes: list[str] = field(default_factory=list)  # not labelled, with why

    def __str__(self) -> str:
        return (
            f"DAgger: {self.episodes} student episodes, {self.states} states; {self.examples} labelled, "
            f"{self.agreed} where the student did as the expert, {self.expert_done} where the expert was done, "
            f"{self.too_long} too long, {self.capped} past the per-episode cap"
            + (f"; skipped: {', '.join(self.skipped_episodes[:5])}" if self.skipped_episodes else "")
        )


def code_lines(message: dict | None) -> list[str]:
    """The code a reply's tool calls carry, without comment lines, blank lines and trailing spaces: what the cell
    does, not how it narrates it."""
    return [line.rstrip() for line in cell_code(message).splitlines() if line.strip() and not _COMMENT.match(line)]


def expert_label(expert: Any, messages: list[dict]) -> dict | None:
    """The expert's reply to `messages` as the assistant message its episodes record; None when it has nothing more
    to do (its finish was accepted, or it gave up: it never declares a false success)."""
    from captain_ros.agent.expert_server import completion

    choice = completion(expert, messages)["choices"][0]
    message = choice["message"]
    if not message.get("tool_calls"):
        return None
    return {"role": "assistant", "content": message.get("content") or "", "tool_calls": message["tool_calls"]}


def dagger_examples(
    tokenizer: Any,
    reader: Any,
    episode: Any,
    *,
    expert: Any,
    per_episode: int = 4,
    max_tokens: int = 0,
    render: Any = None,
    stats: DaggerStats | None = None,
) -> list[Example]:
    """Up to `per_episode` examples of one student episode (module doc): its first requests whose reply differs from
    the expert's, each with the expert's reply as the only target. `max_tokens` (0: no limit) leaves out longer
    ones; `render` is the data config's RenderConfig (the chat template's settings)."""
    stats = stats if stats is not None else DaggerStats()
    split = (episode.start or {}).get("split")
    if split != "train":
        raise NotATrainingEpisode(
            f"episode {episode.episode_id} is of split {split!r}: only the student's episodes on training starts are "
            "labelled (the held-out starts never enter training)"
        )
    stats.episodes += 1
    requests = [r for r in episode.requests if r.model_call and r.model_call.get("messages")]
    examples: list[Example] = []
    for position, req in enumerate(requests):
        stats.states += 1
        messages = req.model_call["messages"]
        label = expert_label(expert, messages)
        if label is None:
            stats.expert_done += 1
            continue
        student, _ = assistant_turn(requests, position, messages)
        if code_lines(student) == code_lines(label) and not (student.get("content") or "").strip():
            stats.agreed += 1
            continue
        if len(examples) == per_episode:
            stats.capped += 1
            continue
        kwargs = {"render": render} if render is not None else {}
        example = build_example(
            tokenizer, reader.restore_messages(messages), label, req.model_call.get("tools"),
            weight=ROW_WEIGHTS["turn"], episode_id=episode.episode_id, request=req.index, source="dagger", **kwargs,
        )  # fmt: skip
        if max_tokens and len(example.input_ids) > max_tokens:
            stats.too_long += 1
            continue
        examples.append(example)
    stats.examples += len(examples)
    return examples


def store_dagger_examples(
    tokenizer: Any, store: Any, *, per_episode: int = 4, max_tokens: int = 0, render: Any = None,
    stats: DaggerStats | None = None,
) -> list[Example]:  # fmt: skip
    """`dagger_examples` over every episode of a student store that has requests: complete and valid ones, and those
    a host's time cut short (their states are the student's all the same); not those ended invalid (an
    infrastructure failure)."""
    from captain_ros.agent.expert import ScriptedExpert
    from captain_ros.bridge.store import EpisodeReader

    stats = stats if stats is not None else DaggerStats()
    expert = ScriptedExpert()
    reader = EpisodeReader(store)
    examples: list[Example] = []
    try:
        for row in reader.store.episodes():
            if row["status"] == "complete" and not row["valid"]:
                stats.skipped_episodes.append(f"{row['episode_id']} (invalid)")
                continue
            episode = reader.load(row["episode_id"])
            examples += dagger_examples(
                tokenizer, reader, episode, expert=expert, per_episode=per_episode, max_tokens=max_tokens,
                render=render, stats=stats,
            )  # fmt: skip
    finally:
        reader.close()
    return examples


__all__ = [
    "DaggerStats",
    "NotATrainingEpisode",
    "code_lines",
    "dagger_examples",
    "expert_label",
    "store_dagger_examples",
]
