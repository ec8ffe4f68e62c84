"""The policy client against a real vLLM server (CPU build, .venv-vllm) serving the tiny Qwen2 model.

What training relies on: the prompt's token ids are exactly the chat template's rendering of the
conversation (so a trainer can re-render it), every sampled token comes with its id and one logprob, and the
logprobs are those of the sampling distribution (--logprobs-mode processed_logprobs).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from captain_ros.agent.policy_client import Completion, PolicyClient, PolicyConfig
from tests.vllm_server import render

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_python",
            "description": "Run one Python cell against the robot API; returns its output and receipts.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "End the episode.",
            "parameters": {"type": "object", "properties": {"note": {"type": "string"}}},
        },
    },
]
CONVERSATION = [
    {"role": "system", "content": "You control a Franka arm through Python. Call run_python with code."},
    {"role": "user", "content": "Put the red cube in the blue bowl."},
    {
        "role": "assistant",
        "content": "First I look at the scene.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {
                    "name": "run_python",
                    "arguments": json.dumps({"code": "obs = robot.observe()\nprint(obs)"}),
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "[observe] ok in 0.12 s; 2 cameras, 512x512"},
    {"role": "user", "content": "The cube is left of the bowl. Continue."},
]


@pytest.fixture(scope="module")
def client(vllm_server):
    with PolicyClient(PolicyConfig(base_url=vllm_server.base_url, max_tokens=12, seed=0)) as policy:
        yield policy


@pytest.fixture(scope="module")
def completion(client) -> Completion:
    """One sampled turn after the multi-turn conversation (the server's first request warms it up: ~15 s)."""
    return client.complete(CONVERSATION, TOOLS)


def test_health_names_the_served_tiny_model(client, vllm_server):
    assert client.health() == str(vllm_server.model_dir)


def test_a_completion_carries_prompt_ids_sampled_ids_and_one_logprob_per_sampled_token(completion):
    assert completion.prompt_token_ids and all(isinstance(t, int) for t in completion.prompt_token_ids)
    assert completion.token_ids and 1 <= len(completion.token_ids) <= 12
    assert completion.logprobs is not None and len(completion.logprobs) == len(completion.token_ids)
    assert all(lp <= 0.0 and math.isfinite(lp) for lp in completion.logprobs)
    assert completion.usage["prompt_tokens"] == len(completion.prompt_token_ids)
    assert completion.usage["completion_tokens"] == len(completion.token_ids)
    assert completion.finish_reason in {"stop", "length", "tool_calls"}
    assert all(0 <= t < 2048 for t in completion.prompt_token_ids + completion.token_ids)


def test_the_prompt_ids_are_the_chat_template_rendering_of_the_conversation(completion, vllm_server):
    expected = render(vllm_server, CONVERSATION, TOOLS)
    assert "<tool_call>" in expected["text"] and "<tool_response>" in expected["text"]
    assert expected["text"].endswith("<|im_start|>assistant\n")
    assert completion.prompt_token_ids == expected["ids"], expected["text"]


def test_the_logprobs_are_those_of_the_sampling_distribution_after_temperature(vllm_server):
    """Raw logprobs of the random tiny model are near log(1/2048) = -7.6 at any temperature; processed ones
    at a temperature of 0.02 are near 0: the server runs with --logprobs-mode processed_logprobs."""
    config = PolicyConfig(base_url=vllm_server.base_url, max_tokens=8, seed=0, extra_body={"ignore_eos": True})
    messages = [{"role": "user", "content": "Pick up the red cube."}]
    with PolicyClient(config) as hot, PolicyClient(replace(config, temperature=0.02)) as cold:
        warm_logprobs = hot.complete(messages, TOOLS).logprobs
        cold_logprobs = cold.complete(messages, TOOLS).logprobs
    assert len(warm_logprobs) == len(cold_logprobs) == 8
    assert sum(warm_logprobs) / 8 < -5.0, warm_logprobs
    assert min(cold_logprobs) > -1.0, cold_logprobs


def test_text_parts_render_like_a_plain_string(client):
    plain = [{"role": "user", "content": "Where is the cube?"}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "Where is the cube?"}]}]
    assert client.complete(parts, TOOLS).prompt_token_ids == client.complete(plain, TOOLS).prompt_token_ids


def test_the_agents_developer_message_is_its_own_turn_as_transformers_renders_it(client, vllm_server):
    """The agent sends TASK.md as a `developer` message after the system prompt (CaPtain App. A.1). The tiny
    template renders that role, so vLLM passes it through as its own turn (a template without it makes vLLM
    0.32 merge it into the system turn, and the prompt gate could not re-render it)."""
    messages = [
        {"role": "system", "content": "You move arms."},
        {"role": "developer", "content": "# TASK.md\nput the red cube in the black bowl"},
        {"role": "user", "content": "Begin."},
    ]
    expected = render(vllm_server, messages, TOOLS)
    assert "<|im_start|>developer\n# TASK.md" in expected["text"]
    assert client.complete(messages, TOOLS).prompt_token_ids == expected["ids"]
