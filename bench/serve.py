"""captain_ros_training.hf_serve's generation speed with concurrent requests: its engines and attentions.

  .venv/bin/python bench/serve.py                  # the student if `make setup` built it, else the tiny model
  python bench/serve.py --requests 32 --prompt-tokens 4096 --new-tokens 256     # e.g. on a GPU host

Three servers: the slot engine (captain_ros_training.slot_engine, hf_serve's default), and transformers' continuous
batching (captain_ros_training.hf_serve.Engine, `--engine cb`) with varlen attention (its default) and with
transformers' sdpa; on a CUDA device a fourth, the slot engine with its decode steps replayed from CUDA graphs
(`--cuda-graphs`). Each gets a fresh engine in this process and the same
`--requests` requests, queued together: distinct prompts of `--prompt-tokens` tokens (random ids), `--new-tokens`
sampled tokens each at temperature 1 (no stop token can end one early: every request samples exactly that many, so
all do the same work). Reported: sampled tokens per second over the whole batch (prefill included), per request, and
the ratio to cb with sdpa. Under continuous batching transformers' sdpa runs one masked attention of all the batch's
queries over all its requests' keys; varlen attends each request to its own cache; the slot engine keeps each
request's keys in a dense slot and decodes all running requests in one step, with no per-token host work.

Writes bench/results/serve.json: tokens_per_s_sdpa, tokens_per_s_varlen, tokens_per_s_slots, varlen_speedup and
slots_speedup (both over cb with sdpa), on CUDA tokens_per_s_graphs and graphs_speedup (over the eager slot engine),
the setting, the model, the device and the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src" / "captain_ros"))


def _model_folder(out: Path, given: Path | None) -> tuple[Path, str]:
    """`given`, else the student's folder if it is built, else a tiny Qwen2 saved into `out`."""
    from captain_ros_training.student import default_folder, folder_is_current

    if given is not None:
        return given, str(given)
    if folder_is_current(default_folder()):
        return default_folder(), "qwen2.5-coder-0.5b-instruct (the student)"
    from captain_ros_training.tiny import tiny_model, tiny_tokenizer

    tiny_model().save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out, "tiny Qwen2 (captain_ros_training.tiny; `make setup` builds the student)"


# engine, attention; "graphs" is the slot engine with --cuda-graphs (CUDA only)
SERVERS = {
    "sdpa": ("cb", "sdpa"),
    "varlen": ("cb", "varlen"),
    "slots": ("slots", "varlen"),
    "graphs": ("slots", "varlen"),
}
LABELS = {"slots": "slots", "graphs": "slots, CUDA graphs"}  # in the table; the others: engine and attention


def _run(folder: Path, name: str, args: argparse.Namespace) -> dict:
    import torch

    from captain_ros_training import hf_serve

    engine_name, attn = SERVERS[name]
    config = hf_serve.ServeConfig(
        model=str(folder), device=args.device, max_model_len=args.prompt_tokens + args.new_tokens + 8,
        engine=engine_name, attn_implementation=attn, seed=0, max_num_seqs=max(args.requests, 1),
        cuda_graphs=name == "graphs",
    )  # fmt: skip
    if engine_name == "slots" and hf_serve.resolve_device(args.device) == "cpu":
        config = dataclasses.replace(config, kv_cache_tokens=args.requests * config.max_model_len)  # a slot each
    model, tokenizer, _, _ = hf_serve.load(config)
    if engine_name == "slots":
        from captain_ros_training.slot_engine import SlotEngine

        engine = SlotEngine(model, [], config)  # no stop ids: every request samples --new-tokens
    else:
        engine = hf_serve.Engine(model, [], config)
    gen = torch.Generator().manual_seed(0)
    vocab = min(len(tokenizer), model.config.vocab_size)
    prompts = [torch.randint(0, vocab, (args.prompt_tokens,), generator=gen).tolist() for _ in range(args.requests)]
    params = hf_serve.SamplingParams(temperature=1.0)
    done: list = [None] * args.requests
    try:
        engine.generate(prompts[0][:16], 4, params)  # warm-up: kernels, allocator
        start = threading.Barrier(args.requests + 1)

        def one(i: int) -> None:
            start.wait()
            done[i] = engine.generate(prompts[i], args.new_tokens, params)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(args.requests)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall_s = time.perf_counter() - t0
    finally:
        engine.close()
    tokens = sum(len(d.token_ids) for d in done)
    if tokens != args.requests * args.new_tokens:
        raise RuntimeError(f"{name}: {tokens} tokens sampled, {args.requests * args.new_tokens} asked for")
    return {"tokens": tokens, "wall_s": wall_s, "tokens_per_s": tokens / wall_s, "device": str(model.device)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=8, help="concurrent requests (default 8)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="prompt length of each (default 512)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens sampled by each (default 32)")
    parser.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda")
    parser.add_argument("--model", type=Path, default=None, help="a model folder (default: the student, else tiny)")
    args = parser.parse_args(argv)
    for name in ("requests", "prompt_tokens", "new_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder, model_name = _model_folder(Path(tmp) / "tiny", args.model)
        from captain_ros_training.hf_serve import resolve_device

        cuda = resolve_device(args.device).startswith("cuda")
        runs = {name: _run(folder, name, args) for name in SERVERS if cuda or name != "graphs"}
    base = runs["sdpa"]["tokens_per_s"]
    print_table(
        f"hf_serve: {args.requests} requests of {args.prompt_tokens} prompt tokens, {args.new_tokens} sampled each "
        f"({model_name}, {runs['sdpa']['device']})",
        ["server", "wall s", "tokens/s", "tokens/s per request", "vs cb sdpa"],
        [
            [LABELS.get(name, " ".join(SERVERS[name])), f"{r['wall_s']:.1f}",
             f"{r['tokens_per_s']:.1f}", f"{r['tokens_per_s'] / args.requests:.2f}", f"{r['tokens_per_s'] / base:.2f}x"]
            for name, r in runs.items()
        ],
    )  # fmt: skip
    write_results(
        "serve",
        {
            "tokens_per_s_sdpa": base,
            "tokens_per_s_varlen": runs["varlen"]["tokens_per_s"],
            "tokens_per_s_slots": runs["slots"]["tokens_per_s"],
            "varlen_speedup": runs["varlen"]["tokens_per_s"] / base,
            "slots_speedup": runs["slots"]["tokens_per_s"] / base,
            **(
                {
                    "tokens_per_s_graphs": runs["graphs"]["tokens_per_s"],
                    "graphs_speedup": runs["graphs"]["tokens_per_s"] / runs["slots"]["tokens_per_s"],
                }
                if "graphs" in runs
                else {}
            ),
        },
        {
            "requests": args.requests,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "model": model_name,
            "device": runs["sdpa"]["device"],
            "runs": runs,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
