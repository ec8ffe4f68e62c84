"""The tiny Qwen2 and its tokenizer: the generation-marked template renders exactly the text of the tool's template
(which the vLLM tests serve), and its assistant mask covers exactly what the assistant generates."""

from __future__ import annotations

import json

import pytest
import torch

from captain_ros_training.tiny import GENERATION_TEMPLATE, TinyModelConfig, tiny_model, tiny_tokenizer, tool_module

TOOLS = [{"type": "function", "function": {"name": "python", "parameters": {"type": "object"}}}]
CODE = json.dumps({"code": "print(1)"})
CALL = {"id": "c1", "type": "function", "function": {"name": "python", "arguments": CODE}}
DICT_CALL = {"function": {"name": "finish", "arguments": {"note": "done"}}}
# every branch of the template: system + developer, assistant with content and two calls, consecutive tool
# replies, assistant with null content and one call (arguments as a dict), plain assistant text
CONVERSATION = [
    {"role": "system", "content": "S"},
    {"role": "developer", "content": "D"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "think", "tool_calls": [CALL, CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    {"role": "tool", "tool_call_id": "c1", "content": "ok2"},
    {"role": "user", "content": "look"},
    {"role": "assistant", "content": None, "tool_calls": [DICT_CALL]},
    {"role": "tool", "content": "r"},
    {"role": "assistant", "content": "done"},
]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize("tools", [TOOLS, None])
@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("start", [0, 2])  # with and without a system message
def test_the_generation_template_renders_the_tools_text_exactly(tok, tools, generation_prompt, start):
    served = tiny_tokenizer(chat_template=tool_module().CHAT_TEMPLATE)
    kwargs = {"tools": tools, "add_generation_prompt": generation_prompt, "tokenize": False}
    ours = tok.apply_chat_template(CONVERSATION[start:], **kwargs)
    assert ours == served.apply_chat_template(CONVERSATION[start:], **kwargs)
    assert "{% generation %}" not in tool_module().CHAT_TEMPLATE and "generation %}" in GENERATION_TEMPLATE


def test_the_assistant_mask_covers_exactly_the_generated_text(tok):
    out = tok.apply_chat_template(CONVERSATION, tools=TOOLS, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    spans, current = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            current.append(i)
        elif current:
            spans.append(tok.decode(current))
            current = []
    block = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    finish = '<tool_call>\n{"name": "finish", "arguments": {"note": "done"}}\n</tool_call>'
    assert spans == [f"think\n{block}\n{block}<|im_end|>", f"{finish}<|im_end|>", "done<|im_end|>"]
    # what precedes each span is the generation prompt, the newline after it is not generated
    text = tok.decode(ids)
    assert text.count("<|im_start|>assistant\n") == 3 and text.endswith("done<|im_end|>\n")


def test_unknown_roles_are_an_error_not_silently_dropped(tok):
    with pytest.raises(Exception, match="unsupported message role 'critic'"):
        tok.apply_chat_template([{"role": "critic", "content": "x"}], tokenize=False)


def test_tokenizer_copies_are_independent(tok):
    other = tiny_tokenizer(chat_template="{{ 'x' }}")
    assert tok.chat_template == GENERATION_TEMPLATE and other.chat_template == "{{ 'x' }}"
    assert len(tok) == tool_module().VOCAB_SIZE == 2048
    assert tok.encode("<|im_start|>system\n", add_special_tokens=False) == other.encode(
        "<|im_start|>system\n", add_special_tokens=False
    )


def test_the_tiny_model_is_a_seeded_qwen2_that_leaves_the_global_rng_alone(tok):
    torch.manual_seed(5)
    expected_next = torch.rand(1)
    torch.manual_seed(5)
    a = tiny_model()
    assert torch.equal(torch.rand(1), expected_next)
    b, c = tiny_model(), tiny_model(TinyModelConfig(seed=1))
    assert type(a).__name__ == "Qwen2ForCausalLM" and a.dtype == torch.float32
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))
    assert a.config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    ids = torch.tensor([tok.encode("print(1)", add_special_tokens=False)])
    with torch.no_grad():
        assert a(ids).logits.shape == (1, ids.shape[1], 2048)


def test_a_saved_student_reloads_with_the_same_token_ids(tok, tmp_path):
    """What a policy server loads (AutoTokenizer on the saved folder: transformers picks Qwen2Tokenizer, with
    Qwen2's digit-by-digit split and NFC) tokenizes exactly as the trainer's in-memory tokenizer; before the
    tool trained with Qwen2's pre-tokenizer, every number split differently and the prompt gate refused all."""
    from transformers import AutoTokenizer

    tiny_model().save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    served = AutoTokenizer.from_pretrained(tmp_path)
    text = 'robot.move_to(x=0.45, y=-0.123) # 17 tries, café Ω\n<tool_call>{"code": "print(2*3)"}</tool_call>'
    assert served(text).input_ids == tok(text).input_ids
    messages = [{"role": "system", "content": "budget 60 requests"}, {"role": "user", "content": "open drawer 3"}]
    assert served.apply_chat_template(messages, tokenize=False) == tok.apply_chat_template(messages, tokenize=False)
    assert len(served) == len(tok) == tool_module().VOCAB_SIZE
