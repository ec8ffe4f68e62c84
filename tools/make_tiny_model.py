#!/usr/bin/env python3
"""Build a tiny Qwen2 chat model from a config, for serving with vLLM in tests: no download, no hub.

  tokenizer  byte-level BPE (2,048 tokens) trained here on a corpus generated in code that looks like
             the agent's traffic: Python cells on the `robot.` API, call receipts, English instructions,
             tool calls and ChatML framing
  template   Qwen2.5's ChatML chat template: `tools` in the system turn, assistant `tool_calls` rendered as
             <tool_call>{"name": ..., "arguments": ...}</tool_call> (vLLM's `hermes` tool parser reads them
             back), tool replies as <tool_response> blocks in a user turn, `developer` turns (TASK.md) as their
             own turn; an unknown role is an error, not silently dropped as in Qwen's own template
  model      Qwen2ForCausalLM, hidden 256, 4 heads of 64, 2 KV heads, 2 layers, random init from a fixed seed

The weights are random: the model emits noise, but through exactly the code paths of a real Qwen2.
Deterministic (same seed, same files) and idempotent: a complete folder built with the same recipe is
left alone; anything else there is rebuilt. Run it with .venv-vllm/bin/python (torch, transformers,
tokenizers); `make setup` builds that venv.

Usage: .venv-vllm/bin/python tools/make_tiny_model.py [OUT] [--seed N] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / ".cache" / "tiny-qwen2"
RECIPE_VERSION = 3  # bump when the output changes, so cached folders are rebuilt
# Qwen2's pre-tokenization (digits one by one) and NFC: transformers loads a saved qwen2 folder as
# Qwen2Tokenizer, which applies these whatever tokenizer.json says, so the tokenizer trained here must too
# (else the trainer's in-memory tokenizer and the served one split numbers differently)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
VOCAB_SIZE = 2048
CORPUS_DOCS = 3000
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not special: they must survive `skip_special_tokens` so the hermes tool parser sees them.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
MODEL_CONFIG = {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}
COMPLETE = ".complete"  # written last: holds the recipe key the folder was built with

# Qwen2.5's template, with three changes: a neutral default system prompt, string `arguments` (OpenAI form)
# rendered as they are, and an error for roles it does not know. transformers sets trim_blocks.
CHAT_TEMPLATE = r"""{%- if tools %}
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
    {%- if (message.role == "user") or (message.role == "developer") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
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
"""  # noqa: E501 (Qwen's template, kept as it is)

# ------------------------------------------------------------------------------------------------ corpus
OBJECTS = ["red cube", "blue bowl", "green block", "yellow mug", "white plate", "black marker", "orange ball"]
PLACES = ["on the table", "in the bowl", "on the plate", "next to the mug", "at the left edge", "in the bin"]
VERBS = ["Pick up", "Move", "Place", "Push", "Stack", "Grasp", "Lift", "Put"]
CAPABILITIES = [
    "observe",
    "segment",
    "select_detection",
    "point",
    "measure_image_points",
    "move_to",
    "hold",
    "recover",
    "release",
    "preview_motion",
    "check_motion",
    "get_robot_state",
    "gripper_state",
    "robot_geometry",
    "transform_pose",
    "finish",
]
WORDS = (  # noqa: SIM905 (a word list reads better as prose)
    "the robot arm gripper camera table object scene pose frame target position orientation depth image point "
    "cloud detection mask segment observe grasp release lift lower approach retreat align rotate open close "
    "slowly carefully first then after before while until again because so if not only left right front back "
    "above below near far inside outside edge corner center top bottom side surface height width distance "
    "force contact torque wrist joint limit speed velocity trajectory plan check preview motion collision "
    "reachable workspace budget episode finish task goal success failure error retry recover hold stop wait "
    "measure compare track select mark identity evidence pixel millimeter meter second newton degree radian "
    "should must can will did does was is are has have it this that these those what where which when how "
    "try use keep move place put push pull stack pick turn slide tilt flip insert remove count report "
    "small large heavy light round flat tall short thin thick soft hard red blue green yellow white black"
).split()
FAILURES = ["", "unreachable", "contact_stop", "not_found", "no_depth", "workspace_limit", "timeout", "force_limit"]


def _num(rng: random.Random, lo: float, hi: float, digits: int = 3) -> str:
    return f"{rng.uniform(lo, hi):.{digits}f}"


def _code(rng: random.Random) -> str:
    obj = rng.choice(OBJECTS)
    x, y, z = _num(rng, 0.3, 0.7), _num(rng, -0.3, 0.3), _num(rng, 0.02, 0.3)
    lines = [
        "obs = robot.observe()",
        f'dets = robot.segment(obs, "{obj}")',
        "if not dets.ok:",
        '    print("not found:", dets.message)',
        "target = dets.value[0]",
        f"pose = robot.transform_pose([{x}, {y}, {z}], frame='base')",
        f"r = robot.check_motion(pose, speed_mps={_num(rng, 0.05, 0.3, 2)})",
        f"r = robot.move_to(pose, mode='guarded', force_limit_n={rng.randint(5, 40)})",
        "print(r.ok, r.failure, r.duration_s)",
        f"robot.release(opening_m={_num(rng, 0.01, 0.08)})",
        f"robot.hold(duration_s={_num(rng, 0.2, 2.0, 1)})",
        "state = robot.get_robot_state()",
        "print(state.value['tcp_pose'], state.value['wrist_force_n'])",
        f"for i in range({rng.randint(2, 6)}):",
        f"    robot.recover(distance_m={_num(rng, 0.01, 0.1, 2)})",
        "robot.finish(note='done')",
    ]
    rng.shuffle(lines)
    return "\n".join(lines[: rng.randint(3, len(lines))])


def _receipt(rng: random.Random) -> str:
    failure = rng.choice(FAILURES)
    cap = rng.choice(CAPABILITIES)
    body = {
        "capability": cap,
        "ok": failure == "",
        "failure": failure,
        "duration_s": round(rng.uniform(0.01, 4.0), 3),
        "message": "" if not failure else f"{cap}: {failure.replace('_', ' ')} at step {rng.randint(1, 40)}",
    }
    if rng.random() < 0.5:
        return json.dumps(body)
    ok = "ok" if body["ok"] else f"FAILED ({failure})"
    return f"[{cap}] {ok} in {body['duration_s']} s; tcp error {_num(rng, 0, 0.01, 4)} m"


def _instruction(rng: random.Random) -> str:
    words = [rng.choice(VERBS), "the", rng.choice(OBJECTS), rng.choice(PLACES)]
    extra = rng.choice(
        ["", " Be careful.", " Then report what you did.", " Do not touch the mug.", " Use the wrist camera."]
    )
    return " ".join(words) + "." + extra


def _prose(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(1, 4)):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        sentences.append(" ".join(words).capitalize() + rng.choice([".", ".", "?", "!", ":"]))
    return " ".join(sentences)


def _inflected(rng: random.Random) -> str:
    """Words with suffixes and capitals: with Qwen2's digit-by-digit split, numbers no longer fill the
    vocabulary, so word pieces have to."""
    suffixes = ["", "s", "ed", "ing", "er", "ly", "ment", "able", "ness", "ful", "est", "ion"]
    words = []
    for _ in range(rng.randint(6, 18)):
        word = rng.choice(WORDS) + rng.choice(suffixes)
        words.append(rng.choice([word, word, word.capitalize(), word.upper()]))
    return " ".join(words) + "."


def _tool_call(rng: random.Random) -> str:
    args = {"code": _code(rng)} if rng.random() < 0.7 else {"note": _instruction(rng)}
    name = "run_python" if "code" in args else "finish"
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def corpus(seed: int, docs: int = CORPUS_DOCS) -> list[str]:
    """Deterministic training text in the shape of the agent's conversations."""
    rng = random.Random(seed)
    makers = [_code, _receipt, _instruction, _prose, _tool_call, _inflected]
    out = []
    for _ in range(docs):
        parts = [rng.choice(makers)(rng) for _ in range(rng.randint(1, 4))]
        role = rng.choice(["system", "user", "assistant"])
        out.append(f"<|im_start|>{role}\n" + "\n".join(parts) + "<|im_end|>\n")
    return out


# ------------------------------------------------------------------------------------------------ build
def recipe_key(seed: int) -> str:
    """What the folder's content depends on: a folder built with another recipe is rebuilt."""
    recipe = {
        "version": RECIPE_VERSION,
        "seed": seed,
        "vocab": VOCAB_SIZE,
        "docs": CORPUS_DOCS,
        "config": MODEL_CONFIG,
        "template": CHAT_TEMPLATE,
        "special": SPECIAL_TOKENS,
        "tool": TOOL_TOKENS,
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def is_complete(out: Path, seed: int) -> bool:
    marker = out / COMPLETE
    return marker.is_file() and marker.read_text().strip() == recipe_key(seed)


def train_tokenizer(seed: int):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TOOL_TOKENS),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    if len(fast) != VOCAB_SIZE:
        raise RuntimeError(f"the tokenizer has {len(fast)} tokens, expected {VOCAB_SIZE}: enlarge the corpus")
    return fast


def build(out: Path, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = train_tokenizer(seed)
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
        torch_dtype="bfloat16",
        **MODEL_CONFIG,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as tmp:
        stage = Path(tmp) / "model"
        model.save_pretrained(stage)
        tokenizer.save_pretrained(stage)
        (stage / COMPLETE).write_text(recipe_key(seed) + "\n")
        if out.exists():
            shutil.rmtree(out)
        try:
            stage.rename(out)  # whole or not at all: a half-written folder never carries the marker
        except OSError:
            if not is_complete(out, seed):  # else another process built the same model at the same time
                raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "out", nargs="?", type=Path, default=DEFAULT_OUT, help=f"model folder to write (default: {DEFAULT_OUT})"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the corpus and the weights (default: 0)")
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete folder is there")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    if not args.force and is_complete(out, args.seed):
        print(f"[tiny-model] {out} is complete; nothing to do")
        return 0
    if out.is_dir() and any(out.iterdir()) and not (out / "config.json").is_file():
        print(f"[tiny-model] ERROR: {out} holds something that is not a model: choose another folder", file=sys.stderr)
        return 1
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        print(
            f"[tiny-model] ERROR: {exc}. Run this with .venv-vllm/bin/python (`make setup` builds it).",
            file=sys.stderr,
        )
        return 1
    build(out, args.seed)
    print(f"[tiny-model] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
