"""SFT examples from bridge episodes: prompts equal the gate's rendering, response masks cover exactly the assistant
turn, turn weights (CaPtain Eq. 2), VQA rows at 0.5, mark_point pixel masking, and packing without cross-document
leakage. `build_store` (also used by test_gate and test_sft) writes agent-shaped episodes through the bridge."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captain_ros.bridge.schema import Record
from captain_ros.bridge.store import EpisodeReader, EpisodeStore
from training import data
from training.data import IGNORE, MASK_TEXT, DataConfig, Example
from training.gate import GateReport, render_prompt_ids
from training.tiny import tiny_tokenizer, tool_module

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run a cell of Python on the robot session.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    }
]
HEAD = [
    {"role": "system", "content": "You control a Franka arm through Python."},
    {"role": "developer", "content": "# TASK.md\nrobot.mark_point(handle, camera, u, v) marks a pixel."},
    {"role": "user", "content": "Put the red cube in the bowl.\n(TASK.md has the API and how the scene is judged.)"},
]
# per episode: (turn code, its robot calls succeed?) -- request T is the finish turn
EPISODES = {
    "ep-policy": [
        ("obs = robot.observe()\np = robot.mark_point(obs.handle, 'head', .75, .421, label='cube')", True),
        ("r = robot.move_to(p, mode='guarded')\nprint(r.ok)", False),
        ("r = robot.move_to(p, mode='guarded')\nprint(r.ok)", False),  # repeats a failed cell: w = 0
        ("q = robot.mark_point(obs.handle, camera='wrist', u=0.5, v=-0.25)\nrobot.move_to(q)", True),
        ("robot.finish(note='done')", True),
    ],
    "ep-expert": [
        ("obs = robot.observe()\np = robot.mark_point(obs.handle, 'head', 0.61, 0.33)", True),
        ("robot.move_to(p)", False),
        ("robot.recover(distance_m=0.05)", False),
        ("robot.move_to(p, speed_mps=0.1)", False),  # third failing turn in a row: recovery loop, w = 0
        ("robot.move_to(p, speed_mps=0.05)", True),
        ("robot.finish(note='done')", True),
    ],
}


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (4, 6, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def assistant(t: int, code: str) -> dict:
    call = {
        "id": f"call_{t}",
        "type": "function",
        "function": {"name": "python", "arguments": json.dumps({"code": code})},
    }
    return {"role": "assistant", "content": f"Request {t}: I run the next cell.", "tool_calls": [call]}


def build_store(path: Path, recorded_template: str | None = None) -> dict:
    """Two complete, valid episodes. "ep-policy" carries prompt_token_ids rendered by `recorded_template` (the
    tool's template by default, as the vLLM server renders them) and text-only messages; "ep-expert" has null ids
    (scripted expert) and image parts in its history. Returns {episode_id: [messages sent at request t]}."""
    tokenizer = tiny_tokenizer(chat_template=recorded_template or tool_module().CHAT_TEMPLATE)
    sent: dict[str, list[list[dict]]] = {}
    with EpisodeStore(path) as store:
        for ep, (eid, turns) in enumerate(EPISODES.items()):
            policy = eid == "ep-policy"
            start = {
                "task": "put_red_cube_in_bowl",
                "family": "pick_place",
                "start_id": f"s{ep}",
                "split": "train",
                "attempt": 0,
                "group_id": f"put_red_cube_in_bowl/s{ep}",
                "policy_version": 1,
                "policy": "tiny" if policy else "expert",
                "worker": "w0",
                "host": "test",
                "instruction": "put the red cube in the bowl",
            }
            store.append(Record(eid, "episode_start", 0, start))
            history = [dict(m) for m in HEAD]
            sent[eid] = []
            for t, (code, ok) in enumerate(turns, start=1):
                messages = [dict(m) for m in history]
                sent[eid].append(messages)
                reply = assistant(t, code)
                ids = None
                if policy:
                    ids = tokenizer.apply_chat_template(
                        messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
                    )
                call = {
                    "messages": messages,
                    "tools": TOOLS,
                    "sampling": {"model": "tiny", "temperature": 1.0, "seed": 0},
                    "prompt_token_ids": list(ids) if ids is not None else None,
                    "token_ids": [5, 6] if policy else None,
                    "logprobs": [-0.5, -0.25] if policy else None,
                    "response": {
                        "content": reply["content"],
                        "tool_calls": reply["tool_calls"],
                        "finish_reason": "tool_calls",
                    },
                    "policy_version": 1,
                    "timing": {"received_unix_s": 0.0, "upstream_s": 0.1, "total_s": 0.1, "proxy_s": 0.0},
                    "status": "ok",
                }
                store.append(Record(eid, "model_call", t, call))
                robot_call = {"capability": "move_to", "arguments": {}, "success": ok, "executed": True,
                              "failure_category": None if ok else "unreachable", "message": "", "receipt": "r",
                              "physical": True}  # fmt: skip
                step = {"snapshot": {}, "calls": [robot_call], "images": [], "timing": {},
                        "costs": {"total": 0.0}, "solved_before": False}  # fmt: skip
                store.append(Record(eid, "step", t, step))
                history += [reply, {"role": "tool", "tool_call_id": f"call_{t}", "content": f"[python] ok={ok}"}]
                if not policy:  # the expert's episodes show images after each cell
                    sha = store.put_blob(png(10 * ep + t), "image/png")
                    ref = {"type": "image_ref", "sha256": sha, "media_type": "image/png"}
                    history.append({"role": "user", "content": [{"type": "text", "text": "Images: head"}, ref]})
            end = {"outcome": "success", "reward": 1.0, "valid": True, "requests": len(turns), "actions": 3,
                   "reason": "finish() accepted", "host_success": True, "finished": True}  # fmt: skip
            store.append(Record(eid, "episode_end", 0, end))
    return sent


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("episodes") / "episodes.sqlite"
    sent = build_store(path)
    reader = EpisodeReader(path)
    yield reader, sent
    reader.close()


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


# ------------------------------------------------------------------------------------------------ turn weights
def test_turn_weights_zero_repeated_failures_and_the_kth_consecutive_failure():
    codes = ["a = 1", "a = 1  ", "b", "c", "d", "e", "e"]
    failed = [True, True, False, True, True, True, False]
    # t0 fails (streak 1); t1 repeats t0's failed code -> 0; t2 ok; t3, t4 streak 1, 2; t5 streak 3 -> 0;
    # t6 repeats t5's failed code (it succeeded, but re-running a failed cell unchanged is not imitated) -> 0
    assert data.turn_weights(codes, failed, max_failure_streak=3) == [1, 0, 1, 1, 1, 0, 0]
    assert data.turn_weights(codes, failed, max_failure_streak=2) == [1, 0, 1, 1, 0, 0, 0]
    assert data.turn_weights(["x", "x"], [False, False]) == [1, 1]  # repeating a successful cell is fine


def test_failed_turn_and_cell_code():
    assert data.failed_turn({"calls": [{"success": True}, {"success": False}]})
    assert not data.failed_turn({"calls": [{"success": True}]})
    assert not data.failed_turn({"calls": []}) and not data.failed_turn(None)
    message = assistant(1, "print(1)")
    message["tool_calls"].append({"function": {"name": "python", "arguments": {"code": "print(2)"}}})
    assert data.cell_code(message) == "print(1)\nprint(2)"
    assert data.cell_code({"role": "assistant", "content": "no call"}) == ""


# ------------------------------------------------------------------------------------------------ mark_point masking
def test_mark_point_pixels_are_replaced_positionally_and_by_keyword():
    code = (
        "p = robot.mark_point(h, 'head', .75, .421, label='cube')\n"
        "q = robot.mark_point(h, camera='wrist', u=0.5, v=-0.25)\n"
        "w = robot.mark_point(h, 'head', u_var, 0.3)  # a variable is not a copied literal\n"
        "robot.point('head', 0.1, 0.2)"
    )
    masked, n = data.mask_code_points(code, random.Random(0), prob=1.0)
    assert n == 3
    assert masked == (
        f"p = robot.mark_point(h, 'head', {MASK_TEXT}, {MASK_TEXT}, label='cube')\n"
        f"q = robot.mark_point(h, camera='wrist', u={MASK_TEXT}, v={MASK_TEXT})\n"
        f"w = robot.mark_point(h, 'head', u_var, {MASK_TEXT})  # a variable is not a copied literal\n"
        "robot.point('head', 0.1, 0.2)"
    )
    assert data.mask_code_points(code, random.Random(0), prob=0.0) == (code, 0)
    assert data.mask_code_points("mark_point(h, 'head', 0.1", random.Random(0), 1.0)[1] == 0  # not Python: kept


def test_mark_point_masking_rate_is_about_point_two_with_a_fixed_seed():
    code = "\n".join(f"p{i} = robot.mark_point(h, 'head', 0.{i + 1}, 0.5)" for i in range(10))
    rng = random.Random(1234)
    masked = sum(data.mask_code_points(code, rng, 0.2)[1] for _ in range(400))
    # 4,000 Bernoulli(0.2) draws: sd 0.0063; the seed fixes the value, the band says what it should be
    assert abs(masked / 4000 - 0.2) < 0.02, masked / 4000


def test_masking_touches_only_earlier_turns_never_the_target(store, tokenizer):
    reader, _ = store
    config = DataConfig(mark_point_mask_prob=1.0)
    examples = {ex.request: ex for ex in data.episode_examples(tokenizer, reader, "ep-policy", config)}
    for t, ex in examples.items():
        prompt = tokenizer.decode(ex.input_ids[: ex.prompt_len])
        response = tokenizer.decode(ex.input_ids[ex.prompt_len :])
        assert MASK_TEXT not in response
        # request 1 has no history; request 4 answers with mark_point literals that stay in its target
        assert (MASK_TEXT in prompt) == (t > 1), t
    assert "u=0.5, v=-0.25" in tokenizer.decode(examples[4].input_ids[examples[4].prompt_len :])
    assert examples[5].masked_points == 2  # the mark_point calls of turns 1 and 4
    # the draws depend only on (seed, episode, request): rebuilding gives the same examples
    again = {ex.request: ex for ex in data.episode_examples(tokenizer, reader, "ep-policy", config)}
    assert all(again[t].input_ids == ex.input_ids for t, ex in examples.items())


# ------------------------------------------------------------------------------------------------ examples
def test_prompt_ids_equal_the_gate_rendering_and_the_mask_covers_exactly_the_turn(store, tokenizer):
    reader, sent = store
    config = DataConfig(mark_point_mask_prob=0.0, drop_zero_weight=False)
    examples = data.episode_examples(tokenizer, reader, "ep-policy", config)
    assert [ex.request for ex in examples] == [1, 2, 3, 4, 5]
    for ex, messages in zip(examples, sent["ep-policy"], strict=True):
        call = reader.load("ep-policy").requests[ex.request - 1].model_call
        assert ex.input_ids[: ex.prompt_len] == render_prompt_ids(tokenizer, messages, TOOLS)
        assert ex.input_ids[: ex.prompt_len] == call["prompt_token_ids"]  # what the "server" rendered
        code = EPISODES["ep-policy"][ex.request - 1][0]
        expected = (
            f"Request {ex.request}: I run the next cell.\n<tool_call>\n"
            f'{{"name": "python", "arguments": {json.dumps({"code": code})}}}\n</tool_call><|im_end|>'
        )
        response = [i for i, m in zip(ex.input_ids, ex.response_mask, strict=True) if m]
        assert tokenizer.decode(response) == expected
        assert ex.response_mask == [False] * ex.prompt_len + [True] * len(response)
        assert ex.input_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert [ex.source for ex in examples] == ["next_request"] * 4 + ["response"]
    # the prompt of request t+1 starts with request t's full example (minus the end-of-turn newline)
    assert examples[1].input_ids[: len(examples[0].input_ids)] == examples[0].input_ids


def test_expert_examples_render_images_as_text_and_carry_turn_weights(store, tokenizer):
    reader, _ = store
    kept = data.episode_examples(tokenizer, reader, "ep-expert", DataConfig(mark_point_mask_prob=0.0))
    assert [ex.request for ex in kept] == [1, 2, 3, 5, 6]  # request 4 is the third failure in a row
    everything = data.episode_examples(tokenizer, reader, "ep-expert", DataConfig(drop_zero_weight=False))
    assert [ex.weight for ex in everything] == [1, 1, 1, 0, 1, 1]
    assert "Images: head\n[image]" in tokenizer.decode(kept[1].input_ids[: kept[1].prompt_len])
    policy = data.episode_examples(tokenizer, reader, "ep-policy", DataConfig(drop_zero_weight=False))
    assert [ex.weight for ex in policy] == [1, 1, 0, 1, 1]  # request 3 repeats request 2's failed cell


def test_gate_rejection_zeroes_a_request_and_vqa_rows_weigh_half(store, tokenizer):
    reader, _ = store
    gate = GateReport(weights={("ep-policy", 2): 0.0, ("ep-policy", 4): 1.0})
    examples = data.sft_examples(tokenizer, reader, ["ep-policy"], DataConfig(), gate)
    assert [ex.request for ex in examples] == [1, 4, 5]  # 2: gate, 3: repeated failure
    vqa = data.vqa_example(
        tokenizer, [{"role": "user", "content": "Which object is left of the bowl?"}], "The red cube."
    )
    assert vqa.row_type == "vqa" and vqa.weight == 0.5
    assert tokenizer.decode(vqa.input_ids[vqa.prompt_len :]) == "The red cube.<|im_end|>"
    assert data.ROW_WEIGHTS == {"turn": 1.0, "vqa": 0.5}


def test_a_template_without_generation_marks_is_refused(tokenizer):
    plain = tiny_tokenizer(chat_template=tool_module().CHAT_TEMPLATE)
    with pytest.raises(ValueError, match="generation"):
        data.build_example(plain, HEAD, {"role": "assistant", "content": "hi"}, None, weight=1.0)


# ------------------------------------------------------------------------------------------------ packing
def make_example(n: int, prompt: int, weight: float = 1.0, start: int = 10) -> Example:
    return Example(list(range(start, start + n)), [i >= prompt for i in range(n)], weight, prompt)


def test_packing_restarts_positions_and_shifts_targets_inside_documents():
    examples = [make_example(4, 2, start=10), make_example(3, 1, 0.5, start=20), make_example(6, 3, start=30)]
    rows, too_long = data.pack_examples([*examples, make_example(9, 1)], max_tokens=8)
    assert too_long == [3]
    assert [r.examples for r in rows] == [[0, 1], [2]]  # first fit: 4 + 3 <= 8, 6 does not fit after them
    row = rows[0]
    assert row.input_ids == [10, 11, 12, 13, 20, 21, 22]
    assert row.position_ids == [0, 1, 2, 3, 0, 1, 2]
    assert row.doc_ids == [0, 0, 0, 0, 1, 1, 1]
    assert row.cu_seqlens == [0, 4, 7]
    # position i predicts token i+1 when that is a response token; never across the document boundary
    assert row.targets == [IGNORE, 12, 13, IGNORE, 21, 22, IGNORE]
    assert row.token_weights == [0.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.0]


def test_collate_pads_as_its_own_document_and_builds_the_block_causal_mask():
    rows, _ = data.pack_examples([make_example(2, 1), make_example(1, 0, start=50), make_example(3, 1)], 3)
    batch = data.collate(rows, pad_id=0)
    assert batch["input_ids"].tolist() == [[10, 11, 50], [10, 11, 12]]
    assert batch["doc_ids"].tolist() == [[0, 0, 1], [0, 0, 0]]
    assert batch["cu_seqlens"].tolist() == [0, 2, 3, 6] and batch["max_seqlen"] == 3
    batch = data.collate(rows[:1], pad_id=0, length=5)
    assert batch["position_ids"].tolist() == [[0, 1, 0, 0, 1]]
    assert batch["doc_ids"].tolist() == [[0, 0, 1, -1, -1]]
    assert batch["targets"].tolist() == [[11, IGNORE, IGNORE, IGNORE, IGNORE]]
    allowed = batch["attention_mask"][0, 0] == 0
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 0, 1, 0],
            [0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)
    assert batch["attention_mask"].shape == (1, 1, 5, 5)
    assert float(batch["attention_mask"].min()) == torch.finfo(torch.float32).min
