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

from captain_ros_training.chat_template import TOOL_TEMPLATE

ROOT = Path(__file__).resolve().parents[3]
TOOL_PATH = ROOT / "tools" / "make_tiny_model.py"

GENERATION_TEMPLATE = TOOL_TEMPLATE  # the chat template the student is served and trained with, too


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
