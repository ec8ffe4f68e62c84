"""The chat history of one episode and how it stays inside the model's context (CaPtain App. A.1):
the task context (system prompt, TASK.md) is sent verbatim in every request; a cell's output is cut to
a token budget and at most `max_receipt_lines` receipts; at most `max_images_per_cell` images are
attached per cell and only the `max_images_kept` most recent stay; when the next prompt would pass
`compaction_at_tokens`, the oldest turns are replaced by one notice that lists the commands they ran
and warns that the scene may have changed. Variables live in the Python session, so they survive.

Token counts are estimated from characters until the server reports a measured prompt length; the
estimate is then scaled by the ratio measured/estimated of the last request.
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field

import numpy as np

from captain_ros.core.config import AgentConfig

IMAGE_TOKENS = 330  # a 512x512 image in a Qwen2.5-VL-class vision encoder (28-px patches, 2x2 merged)


def image_part(rgb: np.ndarray) -> dict:
    """An OpenAI `image_url` content part holding the image as a PNG data URL."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgb, dtype=np.uint8)).save(buffer, format="PNG")
    return {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()},
    }


def cut_text(text: str, max_chars: int) -> str:
    """Keep the head and the tail of `text` within `max_chars`, saying how much was cut."""
    if len(text) <= max_chars:
        return text
    head, tail = max_chars * 2 // 3, max_chars // 3
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


@dataclass
class Turn:
    """One request's reply and what came back: the assistant message, one tool message per tool call,
    and an optional user message carrying the images of the cells."""

    request_index: int
    assistant: dict
    replies: list[dict] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)  # the robot calls the turn ran, for compaction
    fenced_code: str = ""  # the cell taken from a fenced code block of a reply without a tool call
    unread_tool_call: str = ""  # why the reply's <tool_call> block was not read (policy_client.unread_tool_call)

    def messages(self) -> list[dict]:
        return [self.assistant, *self.replies]


class Context:
    def __init__(self, system_prompt: str, task_md: str, config: AgentConfig, instruction: str = ""):
        """The head sent in every request: the system prompt, TASK.md as a developer message (CaPtain App.
        A.1), and the instruction as the user's turn (chat templates expect one)."""
        self.config = config
        self.head = [{"role": "system", "content": system_prompt}, {"role": "developer", "content": task_md}]
        if instruction:
            self.head.append(
                {"role": "user", "content": f"{instruction}\n(TASK.md has the API and how the scene is judged.)"}
            )
        self.turns: list[Turn] = []
        self.compacted: list[Turn] = []  # removed from the prompt, in order
        self._scale = 1.0  # measured / estimated prompt tokens of the last request

    # ------------------------------------------------------------------------------ building
    def add(self, turn: Turn) -> None:
        self.turns.append(turn)
        self._drop_old_images()

    def messages(self) -> list[dict]:
        notice = [self._notice()] if self.compacted else []
        return [*self.head, *notice, *(m for t in self.turns for m in t.messages())]

    def _notice(self) -> dict:
        first, last = self.compacted[0].request_index, self.compacted[-1].request_index
        commands = [c for t in self.compacted for c in t.commands]
        shown = commands[-60:]
        listed = "\n".join(f"- {c}" for c in shown) or "- (no robot calls)"
        more = f"\n(and {len(commands) - len(shown)} earlier calls)" if len(commands) > len(shown) else ""
        return {
            "role": "user",
            "content": (
                f"[compacted] Requests {first}-{last} were removed to fit the context. They ran these robot "
                f"calls:\n{listed}{more}\nThe scene may have changed since then: observe again before you rely "
                "on earlier measurements. Variables and functions in the Python session are intact."
            ),
        }

    def _drop_old_images(self) -> None:
        """Keep the `max_images_kept` most recent images; older ones become a one-line note."""
        kept = 0
        for turn in reversed(self.turns):
            for message in turn.replies:
                content = message.get("content")
                if not isinstance(content, list):
                    continue
                for i in range(len(content) - 1, -1, -1):
                    if content[i].get("type") != "image_url":
                        continue
                    kept += 1
                    if kept > self.config.max_images_kept:
                        content[i] = {"type": "text", "text": "[an older image was removed; observe again to see]"}

    # ------------------------------------------------------------------------------ size
    def estimate_tokens(self, messages: list[dict] | None = None) -> int:
        chars, images = 0, 0
        for m in self.messages() if messages is None else messages:
            content = m.get("content")
            if isinstance(content, list):
                for part in content:
                    if part.get("type") == "image_url":
                        images += 1
                    else:
                        chars += len(part.get("text", ""))
            else:
                chars += len(content or "")
            chars += len(json.dumps(m.get("tool_calls", ""))) + 8  # role markers and call framing
        return round((chars / self.config.chars_per_token + images * IMAGE_TOKENS) * self._scale)

    def measured(self, messages: list[dict], prompt_tokens: int | None) -> None:
        """Calibrate the estimate with the prompt length the server measured for `messages`."""
        if prompt_tokens:
            self._scale = 1.0
            self._scale = max(0.25, prompt_tokens / max(1, self.estimate_tokens(messages)))

    def compact_if_needed(self) -> bool:
        """Move the oldest turns into the compaction notice until the prompt fits; keeps the task context
        and the `keep_recent_turns` most recent turns verbatim. True when something was compacted."""
        changed = False
        while (
            len(self.turns) > self.config.keep_recent_turns
            and self.estimate_tokens() > self.config.compaction_at_tokens
        ):
            self.compacted.append(self.turns.pop(0))
            changed = True
        return changed
