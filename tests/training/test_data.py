"""SFT examples from bridge episodes: prompts equal the gate's rendering, response masks cover exactly the assistant
turn, turn weights (CaPtain Eq. 2), VQA rows at 0.5, mark_point pixel masking, and packing without cross-document
leakage. `build_store` (also used by test_gate and test_sft) writes agent-shaped episodes through the bridge."""

from __future__ import annotations

import io
import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captain_ros.bridge.schema import Record
from captain_ros.bridge.store import EpisodeReader, EpisodeStore
from captain_ros_training import data
from captain_ros_training.data import IGNORE, MASK_TEXT, DataConfig, Example
from captain_ros_training.gate import GateReport, render_prompt_ids
from captain_ros_training.tiny import GENERATION_TEMPLATE, tiny_tokenizer, tool_module

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
    examples = data.sft_examples(tokenizer, reader, ["ep-policy"], DataConfig(whole_episodes=False), gate)
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


# ------------------------------------------------------------------------------------------------ whole trajectories
class Edited:
    """An EpisodeReader whose loaded episodes pass through `edit` (a compaction, another outcome, a truncation)."""

    def __init__(self, reader, edit):
        self.reader, self.edit = reader, edit

    def load(self, episode_id):
        import copy

        episode = copy.deepcopy(self.reader.load(episode_id))
        self.edit(episode)
        return episode

    def restore_messages(self, messages):
        return self.reader.restore_messages(messages)

    def episode_ids(self):
        return self.reader.episode_ids()


def first_requests(n):
    def edit(episode):
        episode.requests = episode.requests[:n]

    return edit


def compact_from_request_4(episode):
    """From request 4 on, the history lacks request 2's turn and its tool reply (as a context compaction does)."""
    for request in episode.requests[3:]:
        del request.model_call["messages"][len(HEAD) + 2 : len(HEAD) + 4]


def targets_of(example):
    return [i for i, m in zip(example.input_ids, example.response_mask, strict=True) if m]


NO_MASK = DataConfig(mark_point_mask_prob=0.0)
PER_REQUEST = DataConfig(mark_point_mask_prob=0.0, whole_episodes=False)


def test_a_growing_three_request_episode_is_one_example_with_every_turn_as_target(store, tokenizer):
    reader, sent = store
    three = Edited(reader, first_requests(3))  # the expert's first three turns: all weight 1, images in the history
    stats = data.TrajectoryStats()
    (whole,) = data.sft_examples(tokenizer, three, ["ep-expert"], NO_MASK, stats=stats)
    per_request = data.sft_examples(tokenizer, three, ["ep-expert"], PER_REQUEST)
    assert [ex.request for ex in per_request] == [1, 2, 3]
    assert (stats.whole, stats.segmented, stats.segments, stats.prompt_mismatches) == (1, 0, 1, 0)
    assert stats.requests == {data.TARGET: 3}
    assert whole.source == "trajectory" and [s.request for s in whole.spans] == [1, 2, 3]
    for span, single, messages in zip(whole.spans, per_request, sent["ep-expert"], strict=False):
        # the tokens before each span are the request's gated prompt ids; the span is what it answered
        gated = render_prompt_ids(tokenizer, reader.restore_messages(messages), TOOLS)
        assert whole.input_ids[: span.start] == gated == single.input_ids[: single.prompt_len]
        assert whole.input_ids[span.start : span.end] == targets_of(single)
    # the targets are exactly the three turns' tokens, and the example is the last request's example
    assert targets_of(whole) == [t for ex in per_request for t in targets_of(ex)]
    assert whole.input_ids == per_request[-1].input_ids and whole.prompt_len == whole.spans[0].start
    assert whole.token_weights == [1.0 if m else 0.0 for m in whole.response_mask]


def test_failed_and_gate_rejected_turns_weigh_zero_inside_the_episode(store, tokenizer):
    reader, _ = store
    gate = GateReport(weights={("ep-policy", 2): 0.0})  # the gate rejected request 2's prompt
    keep = DataConfig(mark_point_mask_prob=0.0, drop_zero_weight=False)
    (whole,) = data.sft_examples(tokenizer, reader, ["ep-policy"], keep, gate)
    # request 3 re-runs request 2's failed cell (w = 0), request 2 is gate-rejected
    assert [(s.request, s.weight) for s in whole.spans] == [(1, 1.0), (2, 0.0), (3, 0.0), (4, 1.0), (5, 1.0)]
    (row,), _ = data.pack_examples([whole], 100_000)
    weighted = {s.request: s.end - s.start for s in whole.spans if s.weight > 0}
    assert sum(w > 0 for w in row.token_weights) == sum(weighted.values())  # the loss denominator
    # by default the weight-0 turns are context only: no target at all
    stats = data.TrajectoryStats()
    (dropped,) = data.sft_examples(tokenizer, reader, ["ep-policy"], NO_MASK, gate, stats=stats)
    assert [s.request for s in dropped.spans] == [1, 4, 5] and dropped.input_ids == whole.input_ids
    assert dropped.response_tokens == sum(weighted.values())
    assert stats.requests == {data.TARGET: 3, data.ZERO_WEIGHT: 2}
    (expert,) = data.sft_examples(tokenizer, reader, ["ep-expert"], keep)
    assert [s.weight for s in expert.spans] == [1, 1, 1, 0, 1, 1]  # request 4: the third failure in a row


def test_the_whole_episode_loss_equals_the_per_request_losses(store, tokenizer):
    """Eq. 2 is unchanged: each span's tokens see exactly their request's prompt, so the one-document loss and
    gradients equal those of the per-request examples, for a fraction of the tokens."""
    from captain_ros_training import sft
    from captain_ros_training.sft import SFTConfig
    from captain_ros_training.tiny import tiny_model

    reader, _ = store
    (whole,) = data.sft_examples(tokenizer, reader, ["ep-expert"], NO_MASK)
    singles = data.sft_examples(tokenizer, reader, ["ep-expert"], PER_REQUEST)
    assert len(singles) == 5 and len(whole.input_ids) < sum(len(ex.input_ids) for ex in singles) / 2
    one = [data.collate(data.pack_examples([whole], 100_000)[0], 0)]
    many = [data.collate(data.pack_examples([ex], 100_000)[0], 0) for ex in singles]
    denominator = sft.token_denominator(one)
    assert denominator == sft.token_denominator(many) == sum(ex.response_tokens for ex in singles)
    model, config = tiny_model(), SFTConfig()
    results = []
    for batches in (one, many):
        model.zero_grad(set_to_none=True)
        loss = sum(sft.micro_batch_loss(model, b, denominator, config) for b in batches)
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_one, grads_one), (loss_many, grads_many) = results
    assert loss_one == pytest.approx(loss_many, rel=1e-5)
    for name, grad in grads_one.items():
        torch.testing.assert_close(grad, grads_many[name], atol=1e-6, rtol=1e-4, msg=name)


def test_a_history_that_stops_growing_is_cut_into_segments(store, tokenizer):
    reader, _ = store
    compacted = Edited(reader, compact_from_request_4)
    stats = data.TrajectoryStats()
    keep = DataConfig(mark_point_mask_prob=0.0, drop_zero_weight=False)
    first, second = data.sft_examples(tokenizer, compacted, ["ep-policy"], keep, stats=stats)
    assert (stats.whole, stats.segmented, stats.segments) == (0, 1, 2)
    assert [s.request for s in first.spans] == [1, 2, 3] and [s.request for s in second.spans] == [4, 5]
    singles = {ex.request: ex for ex in data.sft_examples(tokenizer, compacted, ["ep-policy"], PER_REQUEST)}
    assert sorted(singles) == [1, 2, 4, 5]  # 3 re-runs a failed cell
    # every weighted turn is supervised once, on exactly its per-request tokens and prompt
    for example in (first, second):
        for span in example.spans:
            if span.weight > 0:
                single = singles[span.request]
                assert example.input_ids[: span.start] == single.input_ids[: single.prompt_len]
                assert example.input_ids[span.start : span.end] == targets_of(single)
    assert second.input_ids == singles[5].input_ids  # the compacted segment starts from request 4's own prompt
    # the split points, on token ids: the run continues while the prompt begins with the previous prompt + turn
    turn = lambda index, prompt, answer: data.Turn(index, [], {}, None, prompt, answer, 1.0)  # noqa: E731
    turns = [turn(1, [1, 2], [3]), turn(2, [1, 2, 3, 4], [5]), turn(3, [1, 9], [6]), None, turn(5, [7], [8])]
    assert [[t.index for t in s] for s in data.split_segments(turns)] == [[1, 2], [3], [5]]


def test_the_episode_form_keeps_every_request_that_fits_the_token_limit(store, tokenizer):
    reader, _ = store
    singles = data.sft_examples(tokenizer, reader, ["ep-policy"], PER_REQUEST)
    limit = len(singles[-2].input_ids)  # request 4 fits, request 5 (the longest) does not
    stats = data.TrajectoryStats()
    (whole,) = data.sft_examples(
        tokenizer, reader, ["ep-policy"], replace(NO_MASK, max_trajectory_tokens=limit), stats=stats
    )
    assert [s.request for s in whole.spans] == [1, 2, 4] and len(whole.input_ids) == limit
    assert (stats.whole, stats.segmented) == (0, 1)  # one example, but not of every request
    assert stats.too_long == stats.requests[data.TOO_LONG] == 1 and "max_trajectory_tokens" in stats.problems[0][2]


def test_spans_whose_prompt_differs_from_the_gated_ids_are_not_used(store, tokenizer):
    reader, _ = store
    # a template that writes the whole conversation differently from a prompt: the gate (which renders prompts)
    # accepts every request, but no span of the one-document rendering follows its gated prompt ids
    odd = tiny_tokenizer(
        chat_template="{%- if not add_generation_prompt %}{{- 'FULL ' }}{%- endif %}" + GENERATION_TEMPLATE
    )
    stats = data.TrajectoryStats()
    assert data.sft_examples(odd, reader, ["ep-policy"], NO_MASK, stats=stats) == []
    assert stats.prompt_mismatches == 5 and stats.requests == {data.UNVERIFIED: 5}
    assert stats.problems[0][:2] == ("ep-policy", 1) and "gated prompt ids at token 0" in stats.problems[0][2]
    assert "5 spans not matching their gated prompt" in str(stats)
    # the per-request form renders each prompt on its own and is not affected
    assert len(data.sft_examples(odd, reader, ["ep-policy"], PER_REQUEST)) == 4


def test_only_successful_episodes_are_imitated(store, tokenizer):
    reader, _ = store

    def ended(**end):
        return Edited(reader, lambda episode: episode.end.update(end))

    false_finish = ended(outcome="false_finish", host_success=False, reward=-0.3)
    stats = data.TrajectoryStats()
    assert data.sft_examples(tokenizer, false_finish, ["ep-policy", "ep-expert"], NO_MASK, stats=stats) == []
    assert (stats.episodes, stats.unsuccessful_skipped) == (2, 2)
    assert len(data.sft_examples(tokenizer, false_finish, ["ep-policy"], replace(NO_MASK, successful_only=False))) == 1
    # host success is what counts: a missed finish (solved, no finish()) is kept unless strict_success
    missed = ended(outcome="missed_finish", host_success=True, finished=False, reward=0.25)
    assert len(data.sft_examples(tokenizer, missed, ["ep-policy"], NO_MASK)) == 1
    assert data.sft_examples(tokenizer, missed, ["ep-policy"], replace(NO_MASK, strict_success=True)) == []
    invalid = ended(valid=False, invalid_reason="abandoned: worker died")
    assert data.sft_examples(tokenizer, invalid, ["ep-policy"], NO_MASK) == []
    assert data.successful({"valid": True, "host_success": None}) is False  # no label: not a success


def test_mark_point_masking_in_an_episode_never_touches_a_target(store, tokenizer):
    reader, _ = store
    config = DataConfig(mark_point_mask_prob=1.0)
    stats = data.TrajectoryStats()
    examples = data.sft_examples(tokenizer, reader, ["ep-policy"], config, stats=stats)
    whole, *extras = examples
    # turns 1 and 4 call mark_point: masked in the episode's history, they are supervised by their own examples
    assert whole.source == "trajectory" and [s.request for s in whole.spans] == [2, 5]
    assert [(ex.source, ex.request, ex.masked_points) for ex in extras] == [
        ("masked_turn", 1, 0),
        ("masked_turn", 4, 1),
    ]
    assert whole.masked_points == 2 and tokenizer.decode(whole.input_ids).count(MASK_TEXT) == 4  # u and v, twice
    singles = {ex.request: ex for ex in data.sft_examples(tokenizer, reader, ["ep-policy"], PER_REQUEST)}
    for example in examples:
        assert MASK_TEXT not in tokenizer.decode(targets_of(example))
    for span in whole.spans:  # the unmasked turns keep exactly their tokens
        assert whole.input_ids[span.start : span.end] == targets_of(singles[span.request])
    for extra in extras:
        assert targets_of(extra) == targets_of(singles[extra.request])
    assert "u=0.5, v=-0.25" in tokenizer.decode(targets_of(extras[1]))
    assert MASK_TEXT in tokenizer.decode(extras[1].input_ids[: extras[1].prompt_len])
    assert (stats.masked_turn_examples, stats.masked_points) == (2, 3)
    # every weighted turn is supervised exactly once; the draws do not depend on build order
    assert sorted([s.request for s in whole.spans] + [ex.request for ex in extras]) == [1, 2, 4, 5]
    again = data.sft_examples(tokenizer, reader, ["ep-policy"], config)
    assert [ex.input_ids for ex in again] == [ex.input_ids for ex in examples]
    # without masking there are no extra examples
    assert [ex.source for ex in data.sft_examples(tokenizer, reader, ["ep-policy"], NO_MASK)] == ["trajectory"]


def test_whole_episodes_cost_the_tokens_of_their_last_request(store, tokenizer):
    reader, _ = store
    whole = data.sft_examples(tokenizer, reader, None, NO_MASK)
    singles = data.sft_examples(tokenizer, reader, None, replace(PER_REQUEST, drop_zero_weight=False))
    last = {ex.episode_id: len(ex.input_ids) for ex in singles}  # the last request of each episode, in order
    assert [len(ex.input_ids) for ex in whole] == [last["ep-policy"], last["ep-expert"]]
    assert sum(len(ex.input_ids) for ex in singles) > 2.5 * sum(last.values())


def test_micro_batches_are_collated_when_used_never_all_at_once(monkeypatch):
    from captain_ros_training.sft import SFTConfig, train_sft
    from captain_ros_training.tiny import tiny_model

    rows = [data.PackedRow() for _ in range(5)]
    for k, row in enumerate(rows):
        row.add(Example([1, 2, 3 + k], [False, True, True], 1.0, 1), k)
    calls = []
    real = data.collate
    monkeypatch.setattr(data, "collate", lambda r, pad, **kw: calls.append(len(r)) or real(r, pad, **kw))
    batches = data.MicroBatches(rows, 2, pad_id=0)
    assert len(batches) == 3 and calls == []  # nothing collated, no mask built, up front
    assert not any(isinstance(v, torch.Tensor) for v in vars(batches).values())  # the data set holds rows only
    assert batches[2]["input_ids"].shape == (1, 3) and batches[-1]["attention_mask"].shape == (1, 1, 3, 3)
    assert batches[0]["input_ids"].shape == (2, 3)
    assert calls == [1, 1, 2]
    with pytest.raises(IndexError):
        batches[3]
    # the trainer collates one micro-batch per use: 2 steps x 2 accumulated micro-batches
    calls.clear()
    config = SFTConfig(max_steps=2, grad_accum_steps=2, shuffle=False, progress=False)
    train_sft(tiny_model(), batches, config)
    assert calls == [2, 2, 1, 2]


# ------------------------------------------------------------------------------------------------ recovery examples
def test_a_corrupted_tool_call_is_what_the_hermes_parser_refuses_and_the_loop_explains():
    """Each slip (a `\\'` or a bare `"` inside the code string) leaves JSON that does not parse, so the server hands
    the reply back as content and the loop answers with unread_tool_call's reason; code without quotes has none."""
    import random

    from captain_ros.agent.policy_client import unread_tool_call
    from captain_ros_training.hf_serve import parse_hermes

    code = 'p = robot.find(\'red cube\')\nprint(f"at {p[\\"x\\"]}")'
    kinds = set()
    for seed in range(12):
        block = data.corrupt_tool_call(code, random.Random(seed))
        assert block.startswith("<tool_call>\n") and block.endswith("\n</tool_call>")
        with pytest.raises(json.JSONDecodeError):
            json.loads(block[len("<tool_call>\n") : -len("\n</tool_call>")])
        assert parse_hermes(block) == (block, [])  # read as plain content, no call
        reason = unread_tool_call(block, "stop")
        assert reason.startswith("the tool call is not JSON")
        kinds.add("escape" if "Invalid \\escape" in reason else "quote")
        # the slip is one character: the block equals the well-formed call but for it
        good = json.dumps({"name": "python", "arguments": {"code": code}}, ensure_ascii=False)
        body = block[len("<tool_call>\n") : -len("\n</tool_call>")]
        assert abs(len(body) - len(good)) == 1
    assert kinds == {"escape", "quote"}
    assert data.corrupt_tool_call("print(1)", random.Random(0)) is None


def test_a_broken_cell_does_not_compile_and_differs_from_the_cell_by_one_slip():
    import ast
    import random

    code = 'p = robot.find("red cube")\nif p:\n    print(f"at {p[\'x\']}")\n# a comment (never the broken line)'
    kinds = set()
    for seed in range(30):
        bad, error = data.break_cell(code, 3, random.Random(seed))
        with pytest.raises(SyntaxError):
            ast.parse(bad)
        assert error.startswith('  File "<cell 3>", line ') and error.endswith("\n")
        assert error.splitlines()[-1].startswith(("SyntaxError: ", "IndentationError: "))
        assert abs(len(bad) - len(code)) == 1 and bad.splitlines()[-1] == code.splitlines()[-1]
        kinds.add("indent" if len(bad) > len(code) else "dropped")
    assert kinds == {"indent", "dropped"}
    assert data.break_cell("# only a comment\n", 1, random.Random(0)) is None


def test_the_budget_line_after_an_unread_call_counts_one_request_more():
    line = "[budget] requests 3/16, physical actions 2/150, time 40/1080 s"
    messages = [{"role": "tool", "content": "[budget] requests 2/16, physical actions 1/150, time 9/1080 s"},
                {"role": "user", "content": [{"type": "text", "text": "Images"}]},
                {"role": "tool", "content": f"ok\n{line}"}]  # fmt: skip
    assert data._budget_after(messages, None) == "[budget] requests 4/16, physical actions 2/150, time 40/1080 s"
    assert data._budget_after(messages[1:2], ("16", "150", "1080")) == (
        "[budget] requests 1/16, physical actions 0/150, time 0/1080 s"
    )
    assert data._budget_after(messages[1:2], None) == ""


def test_recovery_examples_show_the_slip_and_the_loops_answer_and_supervise_only_the_experts_call(store, tokenizer):
    reader, _ = store
    plain = data.sft_examples(tokenizer, reader, config=DataConfig(mark_point_mask_prob=0.0))
    stats = data.TrajectoryStats()
    config = DataConfig(mark_point_mask_prob=0.0, recovery_per_episode=2)
    examples = data.sft_examples(tokenizer, reader, config=config, stats=stats)
    extra = [e for e in examples if e.source.startswith("recovery_")]
    assert [e for e in examples if not e.source.startswith("recovery_")] == plain  # the others unchanged
    assert stats.recovery_examples == len(extra) == 4  # 2 episodes x 2: each has weight-1 turns with quotes
    assert "4 recovery examples" in str(stats)
    for example in extra:
        episode = reader.load(example.episode_id)
        requests = [r for r in episode.requests if r.model_call and r.model_call.get("messages")]
        position = next(i for i, r in enumerate(requests) if r.index == example.request)
        weights = data.request_weights(example.episode_id, requests, config)
        assert weights[position] > 0  # never a turn the SFT would not imitate
        expert, _ = data.assistant_turn(requests, position, requests[position].model_call["messages"])
        target = [t for t, m in zip(example.input_ids, example.response_mask, strict=True) if m]
        prompt = reader.restore_messages(requests[position].model_call["messages"])
        assert target == data.response_ids(tokenizer, prompt, reader.restore_messages([expert])[0], TOOLS,
                                           config.render)  # fmt: skip
        assert example.prompt_len == len(example.input_ids) - len(target)  # one span, at the end
        text = tokenizer.decode(example.input_ids[: example.prompt_len])
        after = text.rsplit("<|im_start|>assistant", 2)[1]  # the failed turn and the answer to it
        if example.source == "recovery_unread_call":
            assert "Your tool call could not be read, so nothing ran: the tool call is not JSON" in after
        else:
            assert example.source == "recovery_syntax_error"
            assert '<tool_response>\n[error] (error)\n  File "<cell ' in after and "Error: " in after
        assert text.count("<tool_call>") >= 1 and expert["content"] in text
    again = data.sft_examples(tokenizer, reader, config=config)
    assert [e.input_ids for e in again if e.source.startswith("recovery_")] == [e.input_ids for e in extra]  # seeded


def test_a_syntax_error_recovery_shows_the_broken_cell_and_its_compile_error(store, tokenizer):
    """Both kinds of failed turn are built for the same request; the broken cell's report names the session's cell
    number (one cell per earlier request) and the budget after one more request."""
    import random

    reader, _ = store
    eid = reader.episode_ids()[0]
    requests = [r for r in reader.load(eid).requests if r.model_call and r.model_call.get("messages")]
    config = DataConfig(mark_point_mask_prob=0.0)
    limits = ("16", "150", "1080")
    shown = {}
    for kind in data.RECOVERY_KINDS:
        example = data.recovery_example(tokenizer, reader, eid, requests, 1, config=config, limits=limits,
                                        rng=random.Random(0), kind=kind)  # fmt: skip
        assert example.source == f"recovery_{kind}"
        shown[kind] = tokenizer.decode(example.input_ids[: example.prompt_len])
    assert 'File "<cell 2>"' in shown["syntax_error"] and "could not be read" not in shown["syntax_error"]
    # this test store's outputs have no budget line: the first request's, one request on
    syntax = shown["syntax_error"]
    assert "Error: " in syntax and "\n[budget] requests 1/16, physical actions 0/150" in syntax
    assert "could not be read" in shown["unread_call"]
    with pytest.raises(ValueError, match="unknown recovery kind"):
        data.recovery_example(tokenizer, reader, eid, requests, 1, config=config, limits=limits,
                              rng=random.Random(0), kind="other")  # fmt: skip


def test_a_broken_cells_error_is_the_one_the_real_sandbox_reports(tmp_path):
    """The compile error a syntax-error recovery example shows is the sandbox's own report for that cell, cell
    number included (a session's second cell here)."""
    import random

    from captain_ros.agent.sandbox import Sandbox

    code = 'r = robot.observe()\nif r["ok"]:\n    print(f"seen {r[\'value\']}")'
    with Sandbox(tmp_path / "scratch", lambda name, args, kwargs: {"ok": True, "value": 1}, ["observe"]) as sandbox:
        assert sandbox.run_cell("x = 1").status == "ok"
        for seed in range(4):
            bad, error = data.break_cell(code, 2 + seed, random.Random(seed))
            result = sandbox.run_cell(bad)
            assert result.status == "error" and result.error == error and not result.output
