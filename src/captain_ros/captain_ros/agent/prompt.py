"""What every request carries besides the history: the system prompt, the task's TASK.md (a developer
message) and the single tool `python`. SFT data, RL rollouts and test time share exactly this format
(CaPtain §3.1, Appendix A.1), so everything here is generated from one source: the capability table
and the handlers' own signatures.
"""

from __future__ import annotations

import inspect
from functools import cache

from captain_ros.core.config import BudgetConfig
from captain_ros.core.contract import CAPABILITIES, FAILURE_DESCRIPTIONS

SYSTEM_PROMPT = """\
You control a real robot arm (or its exact simulated twin) by writing Python. Each reply may call the \
tool `python` once with a cell of code; the cell runs in a persistent Python session (variables and \
functions survive across cells) where `robot` is already imported. Every `robot.<capability>(...)` call \
returns a dict {success, executed, failure_category, message, value, diagnostics, budget} and never \
raises; a one-line receipt of every call is appended to the cell's output. Print what you need to see. \
Start with a short line of reasoning, then the code. Look before you move, measure what you touch, \
react to receipts (a contact stop or an empty grasp is information, not a reason to repeat the same \
command), and verify the scene with perception after your last motion. Call finish(note) only when the \
task is done: a completion gate checks that your last physical action was followed by a scene \
measurement. The session has numpy, scipy and Pillow; it has no network and no file system outside its \
working folder."""

PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run one cell of Python in the persistent session (the `robot` client is imported).",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the Python cell to run"}},
            "required": ["code"],
        },
    },
}
TOOLS = [PYTHON_TOOL]

FRAMES = """\
- `base` (the arm's base link): x forward, y left, z up, metres; the table top is z = 0. Every pose the API \
takes or returns is in this frame unless a call says otherwise.
- `tcp`: the tool centre point between the finger pads; z points along the fingers (down when \
yaw_deg is used), the jaw closes along y.
- `hand`, `flange`: the gripper mount; `head_camera`, `wrist_camera`: optical frames (z forward, \
x right, y down). `transform_pose` converts between all of them."""


def _handlers() -> dict[str, object]:
    from captain_ros.harness.harness import Harness
    from captain_ros.perception.perception import Perception

    return {c.name: getattr(Harness, f"_{c.name}", None) or getattr(Perception, f"_{c.name}") for c in CAPABILITIES}


@cache
def parameters() -> dict[str, tuple[str, ...]]:
    """Each capability's parameter names in order (positional arguments bind to these)."""
    return {
        name: tuple(p for p in inspect.signature(handler).parameters if p != "self")
        for name, handler in _handlers().items()
    }


def _signature(handler: object) -> str:
    parts, keyword_only = [], False
    for p in list(inspect.signature(handler).parameters.values())[1:]:
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            parts.append("*")
            keyword_only = True
        parts.append(p.name if p.default is p.empty or p.default is None else f"{p.name}={p.default!r}")
    return ", ".join(parts)


@cache
def api_reference() -> str:
    """The policy-facing API: one line per capability (• = physical action, counted in the budget)."""
    from captain_ros.core.args import POSE_HELP  # with the handlers: MuJoCo; the tool schema above needs neither

    handlers = _handlers()
    lines = []
    for group in ("perception", "measurement", "motion", "planning", "state", "episode"):
        lines.append(f"### {group}")
        for c in (c for c in CAPABILITIES if c.group == group):
            call = "finish" if c.name == "finish" else f"robot.{c.name}"
            lines.append(f"- `{call}({_signature(handlers[c.name])})`{' •' if c.physical else ''}: {c.summary}")
    lines.append(f"\nPoses: {POSE_HELP}.")
    lines.append("\nFailure categories (`failure_category`):")
    lines += [f"- `{cat.value}`: {text}" for cat, text in FAILURE_DESCRIPTIONS.items()]
    return "\n".join(lines)


def task_md(instruction: str, criteria: list[str], budgets: BudgetConfig) -> str:
    """TASK.md: the instruction, what the final scene is judged by, budgets, frames and the API.
    `criteria`: the host's success criteria in words with their tolerances (TaskSpec.success_criteria);
    empty on a real arm without a scorer (an operator judges the scene)."""
    judged = "\n".join(f"- {line}" for line in criteria) or "- an operator judges the final scene"
    return f"""# TASK.md

## Instruction
{instruction}

## How the final scene is judged (after finish)
{judged}

## Budgets
{budgets.requests} requests, {budgets.physical_actions} physical actions (•), {budgets.wall_time_s:.0f} s. \
The episode ends when one is spent.

## Frames
{FRAMES}

## API
{api_reference()}
"""
