"""A tiny Qwen2 causal LM and its locally trained tokenizer, for tests and CPU runs: no download, no hub.

The tokenizer, its corpus and the ChatML template come from `tools/make_tiny_model.py`, the recipe the vLLM
tests serve, so ids recorded from that server and ids rendered here are the same ids. The one difference is
the template: `GENERATION_TEMPLATE` renders exactly the same text as the tool's `CHAT_TEMPLATE` (a test checks
every branch), but wraps what the assistant generates (content, `<tool_call>` blocks, `<|im_end|>`) in
`{% generation %}`, so `apply_chat_template(..., return_assistant_tokens_mask=True)` yields the response mask
SFT needs. Training the tokenizer takes about 2 s, so it is trained once per process and copied per call.
The model is smaller than the served one (hidden 64) so that a training step takes milliseconds on CPU.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
TOOL_PATH = ROOT / "tools" / "make_tiny_model.py"

# The tool's template (Qwen2.5 ChatML, tool-aware, `developer` role, error on unknown roles) with the assistant's
# generated part marked. transformers sets trim_blocks and lstrip_blocks; every tag strips on its left, so no
# template whitespace reaches the output and newlines are emitted explicitly. The text is identical to the
# tool's: 'assistant' + '\n' + content + '\n<tool_call>...' there is 'assistant\n' + content + '\n' +
# '<tool_call>...' here, which moves the first newline out of the generated span (it belongs to the generation
# prompt '<|im_start|>assistant\n').
GENERATION_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "assistant" %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
            {%- if message.tool_calls %}
                {%- if message.content %}
                    {{- message.content + '\n' }}
                {%- endif %}
                {%- for tool_call in message.tool_calls %}
                    {%- if tool_call.function is defined %}
                        {%- set tool_call = tool_call.function %}
                    {%- endif %}
                    {{- '<tool_call>\n{"name": "' }}
                    {{- tool_call.name }}
                    {{- '", "arguments": ' }}
                    {%- if tool_call.arguments is string %}
                        {{- tool_call.arguments }}
                    {%- else %}
                        {{- tool_call.arguments | tojson }}
                    {%- endif %}
                    {{- '}\n</tool_call>' }}
                    {%- if not loop.last %}
                        {{- '\n' }}
                    {%- endif %}
                {%- endfor %}
            {%- else %}
                {{- message.content }}
            {%- endif %}
            {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
    {%- elif (message.role == "user") or (message.role == "developer") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- elif not (message.role == "system" and loop.first) %}
        {{- raise_exception("unsupported message role '" + message.role + "': use system, developer, user, assistant or tool") }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501 (Qwen's template layout, kept as it is)


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny Qwen2 (vocabulary and tokenizer from the tool's recipe)."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    max_position_embeddings: int = 8192
    seed: int = 0  # weights
    tokenizer_seed: int = 0  # corpus of the tokenizer (the tool's --seed)
    attn_implementation: str = "sdpa"  # or "eager"


@functools.cache
def tool_module() -> ModuleType:
    """tools/make_tiny_model.py, imported by path (tools/ is not a package). Cached per process."""
    spec = importlib.util.spec_from_file_location("_captain_make_tiny_model", TOOL_PATH)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {TOOL_PATH}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _trained_tokenizer(seed: int) -> Any:
    return tool_module().train_tokenizer(seed)


def tiny_tokenizer(seed: int = 0, chat_template: str | None = None) -> Any:
    """The tool's tokenizer (trained once per process, ~2 s) with GENERATION_TEMPLATE, or `chat_template`.
    Each call returns an independent copy, so a test may alter its template freely."""
    tokenizer = copy.deepcopy(_trained_tokenizer(seed))
    tokenizer.chat_template = GENERATION_TEMPLATE if chat_template is None else chat_template
    return tokenizer


def tiny_model(config: TinyModelConfig = TinyModelConfig(), dtype: Any = None) -> Any:
    """A freshly initialised Qwen2ForCausalLM (fp32 unless `dtype`), the same weights for the same seed."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tool = tool_module()
    tokenizer = _trained_tokenizer(config.tokenizer_seed)
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    qwen = Qwen2Config(
        vocab_size=tool.VOCAB_SIZE,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=tool.MODEL_CONFIG["rope_theta"],
        rms_norm_eps=tool.MODEL_CONFIG["rms_norm_eps"],
        tie_word_embeddings=True,
        hidden_act="silu",
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
    )
    qwen._attn_implementation = config.attn_implementation
    devices = torch.random.fork_rng(devices=[])  # seeding must not disturb the caller's RNG stream
    with devices:
        torch.manual_seed(config.seed)
        model = Qwen2ForCausalLM(qwen)
    return model.to(dtype or torch.float32)
