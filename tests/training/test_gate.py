"""The prompt gate: recorded prompts re-rendered with the student's template; a deliberately altered template is
rejected with the right first differing position; requests without ids are reported as not gateable."""

from __future__ import annotations

import pytest

from captain_ros.bridge.store import EpisodeReader
from captain_ros_training import gate
from captain_ros_training.gate import GateConfig, RenderConfig
from captain_ros_training.tiny import GENERATION_TEMPLATE, tiny_tokenizer
from tests.training.test_data import EPISODES, HEAD, TOOLS, build_store

POLICY_REQUESTS = len(EPISODES["ep-policy"])
EXPERT_REQUESTS = len(EPISODES["ep-expert"])


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    path = tmp_path_factory.mktemp("gate") / "episodes.sqlite"
    build_store(path)  # ids recorded with the tool's template, as the vLLM server renders them
    r = EpisodeReader(path)
    yield r
    r.close()


def test_first_difference_by_hand():
    assert gate.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert gate.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert gate.first_difference([1, 2], [1, 2, 3]) == 2  # a prefix differs at the shorter length
    assert gate.first_difference([], [7]) == 0


def test_content_parts_are_joined_for_a_string_template_as_vllm_does():
    tok = tiny_tokenizer()
    assert gate.content_format(tok) == "string"
    openai = tiny_tokenizer(
        chat_template="{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}"
    )
    assert gate.content_format(openai) == "openai"
    parts = [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "data:"}},
        {"type": "text", "text": "b"},
    ]
    messages = [{"role": "user", "content": parts}, {"role": "user", "content": "plain"}]
    assert gate.template_messages(messages, "string") == [
        {"role": "user", "content": "a\n[image]\nb"},
        {"role": "user", "content": "plain"},
    ]
    assert gate.template_messages(messages, "openai") is messages


def test_the_gate_accepts_the_servers_own_rendering(reader):
    report = gate.gate_episodes(tiny_tokenizer(), reader)
    assert (report.passed, report.failed, report.not_gateable) == (POLICY_REQUESTS, 0, EXPERT_REQUESTS)
    assert all(report.weight("ep-policy", t) == 1.0 for t in range(1, POLICY_REQUESTS + 1))
    assert report.status[("ep-expert", 1)] == gate.NOT_GATEABLE
    # expert data is rendered from its messages by captain_ros_training.data
    assert report.weight("ep-expert", 1) == 1.0
    assert report.ungateable[0][:2] == ("ep-expert", 1) and "prompt_token_ids" in report.ungateable[0][2]
    text = str(report)
    assert f"{POLICY_REQUESTS} match, 0 rejected" in text and f"{EXPERT_REQUESTS} not gateable" in text
    strict = gate.gate_episodes(tiny_tokenizer(), reader, ["ep-expert"], GateConfig(not_gateable_weight=0.0))
    assert strict.weight("ep-expert", 2) == 0.0 and strict.checked == 0


def test_an_extra_space_in_the_system_header_is_rejected_at_token_two(reader):
    altered = GENERATION_TEMPLATE.replace("{{- '<|im_start|>system\\n' }}", "{{- '<|im_start|>system \\n' }}", 1)
    assert altered != GENERATION_TEMPLATE
    report = gate.gate_episodes(tiny_tokenizer(chat_template=altered), reader, ["ep-policy"])
    assert (report.passed, report.failed) == (0, POLICY_REQUESTS)
    assert all(report.weight("ep-policy", t) == 0.0 for t in range(1, POLICY_REQUESTS + 1))
    first = report.mismatches[0]
    # '<|im_start|>' 'system' '\n' recorded; '<|im_start|>' 'system' ' ' '\n' rendered: they part at token 2
    assert (first.episode_id, first.request, first.position) == ("ep-policy", 1, 2)
    assert first.rendered_len == first.recorded_len + 1
    assert first.recorded_context[:3] == ("<|im_start|>", "system", "\n")
    assert first.rendered_context[:4] == ("<|im_start|>", "system", " ", "\n")
    assert "ep-policy request 1: first difference at token 2" in str(report)


def test_a_change_deep_in_the_history_is_located_at_its_first_token(reader):
    tok = tiny_tokenizer()
    altered = GENERATION_TEMPLATE.replace("{{- '\\n<tool_response>\\n' }}", "{{- '\\n<tool_response>' }}", 1)
    assert altered != GENERATION_TEMPLATE
    report = gate.gate_episodes(tiny_tokenizer(chat_template=altered), reader, ["ep-policy"])
    assert report.passed == 1 and report.failed == POLICY_REQUESTS - 1  # request 1 has no tool reply yet
    first = report.mismatches[0]
    assert first.request == 2
    # by hand: the common text ends just after the first '<tool_response>'; its token count is the position
    recorded = reader.load("ep-policy").requests[1].model_call["prompt_token_ids"]
    text = tok.decode(recorded)
    prefix = text[: text.index("<tool_response>") + len("<tool_response>")]
    assert first.position == len(tok.encode(prefix, add_special_tokens=False))
    assert tok.decode([recorded[first.position]]) == "\n"


def test_truncated_ids_and_template_errors_get_weight_zero():
    tok = tiny_tokenizer()
    ids = gate.render_prompt_ids(tok, HEAD, TOOLS)
    call = {"messages": HEAD, "tools": TOOLS, "prompt_token_ids": ids[:-3]}
    result = gate.gate_request(tok, "e", 1, call, HEAD)
    assert (result.status, result.weight, result.mismatch.position) == (gate.MISMATCH, 0.0, len(ids) - 3)
    bad = [*HEAD, {"role": "critic", "content": "?"}]
    result = gate.gate_request(tok, "e", 2, {**call, "prompt_token_ids": ids}, bad)
    assert (result.status, result.weight) == (gate.RENDER_ERROR, 0.0)
    assert "unsupported message role 'critic'" in result.reason
    report = gate.GateReport()
    report.add("e", 2, result)
    assert report.failed == 1 and report.weight("e", 2) == 0.0 and "the template failed" in str(report)
    result = gate.gate_request(tok, "e", 3, None, None, config=GateConfig(not_gateable_weight=0.25))
    assert (result.status, result.weight) == (gate.NOT_GATEABLE, 0.25)


def test_render_config_openai_format_passes_parts_through():
    tok = tiny_tokenizer(
        chat_template="{% for m in messages %}{% for p in m['content'] %}[{{ p.text }}]{% endfor %}{% endfor %}"
    )
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    ids = gate.render_prompt_ids(tok, messages, None, RenderConfig())
    assert tok.decode(ids) == "[a][b]"
