"""The context manager: compaction keeps the task context and recent turns verbatim and lists what the
removed turns ran; images are capped; token estimates follow the server's measured prompt lengths."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from captain_ros.agent.context import Context, Turn, cut_text, image_part
from captain_ros.agent.episode import bind_arguments
from captain_ros.agent.prompt import TOOLS, api_reference, parameters, task_md
from captain_ros.core.config import AgentConfig, load_config
from captain_ros.core.contract import CAPABILITIES


def turn(i: int, text_chars: int = 400, images: int = 0) -> Turn:
    code = f"robot.move_to(pose={{'position': [0.4, 0.0, {0.1 + i / 100:.2f}], 'yaw_deg': 0}})"
    t = Turn(
        i,
        {
            "role": "assistant",
            "content": f"step {i}",
            "tool_calls": [{"id": f"c{i}", "function": {"name": "python", "arguments": code}}],
        },
    )
    t.replies.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i} " + "x" * text_chars})
    if images:
        parts = [{"type": "text", "text": "Images"}] + [
            image_part(np.zeros((8, 8, 3), np.uint8)) for _ in range(images)
        ]
        t.replies.append({"role": "user", "content": parts})
    t.commands.append(f"move_to: target_reached (turn {i})")
    return t


def test_compaction_keeps_the_task_context_and_recent_turns_and_lists_what_was_removed():
    config = AgentConfig(compaction_at_tokens=1500, max_new_tokens=100, keep_recent_turns=3, chars_per_token=4.0)
    context = Context("SYSTEM", "TASK", config)
    for i in range(1, 21):
        context.add(turn(i))
        context.compact_if_needed()
    messages = context.messages()
    assert messages[0] == {"role": "system", "content": "SYSTEM"} and messages[1]["content"] == "TASK"
    notice = messages[2]["content"]
    assert notice.startswith("[compacted] Requests 1-") and "scene may have changed" in notice
    assert "move_to: target_reached (turn 1)" in notice  # the removed turns' commands are listed
    kept = [m for m in messages if m["role"] == "assistant"]
    assert len(kept) >= 3 and kept[-1]["content"] == "step 20"  # recent turns verbatim
    assert context.estimate_tokens() <= 1500
    removed = len(context.compacted)
    assert f"Requests 1-{removed} " in notice and removed + len(context.turns) == 20


def test_recent_turns_are_never_compacted_even_when_alone_they_exceed_the_limit():
    config = AgentConfig(compaction_at_tokens=100, max_new_tokens=100, keep_recent_turns=2)
    context = Context("S", "T", config)
    for i in range(3):
        context.add(turn(i, text_chars=5000))
    assert context.compact_if_needed() and len(context.turns) == 2


def test_only_the_most_recent_images_are_kept():
    context = Context("S", "T", AgentConfig(max_images_kept=12))
    for i in range(5):
        context.add(turn(i, images=4))
    images = [
        p
        for m in context.messages()
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]
    assert len(images) == 12
    first = next(m for m in context.messages() if isinstance(m.get("content"), list))
    assert all(p["type"] == "text" for p in first["content"])  # the oldest turn's images became notes
    assert images[0]["image_url"]["url"].startswith("data:image/png;base64,")


def test_token_estimates_follow_the_measured_prompt_length():
    context = Context("S" * 350, "T" * 350, AgentConfig(chars_per_token=3.5))
    messages = context.messages()
    before = context.estimate_tokens()
    context.measured(messages, before * 2)
    assert abs(context.estimate_tokens() - before * 2) <= 2


def test_cut_text_keeps_head_and_tail():
    text = "A" * 1000 + "B" * 1000
    cut = cut_text(text, 300)
    assert cut.startswith("A" * 200) and cut.endswith("B" * 100) and "1700 characters cut" in cut
    assert cut_text("short", 300) == "short"


def test_task_md_carries_instruction_tolerances_budgets_frames_and_every_capability():
    budgets = load_config().budgets
    doc = task_md("put the red cube in the black bowl", ["the red cube is inside the black bowl: 5 mm"], budgets)
    assert "## Instruction\nput the red cube in the black bowl" in doc
    assert "inside the black bowl: 5 mm" in doc and "60 requests, 150 physical actions" in doc
    assert "`base` (the arm's base link)" in doc
    for capability in CAPABILITIES:
        assert f"{capability.name}(" in api_reference()
    assert "`robot.move_to(pose, gripper, *, mode='guarded'" in doc and "• :" not in doc
    assert TOOLS[0]["function"]["name"] == "python"


def test_positional_robot_arguments_bind_to_the_capability_parameters():
    assert parameters()["segment"] == ("text", "camera", "observation_handle")
    assert bind_arguments("segment", ["red cube"], {"camera": "wrist"}) == {"text": "red cube", "camera": "wrist"}
    for args, kwargs, error in ((["a", "b", "c", "d"], {}, "at most 3"), (["red cube"], {"text": "x"}, "multiple")):
        try:
            bind_arguments("segment", args, kwargs)
        except TypeError as exc:
            assert error in str(exc)
        else:
            raise AssertionError("no TypeError")


def test_the_agent_section_of_harness_yaml_is_the_dataclass_default():
    """config/harness.yaml states every agent setting; the file and the code agree."""
    assert load_config().agent == AgentConfig()
    assert replace(load_config().budgets).rl_selectable_actions == 120
