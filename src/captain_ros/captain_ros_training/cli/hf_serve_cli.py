"""`python -m captain_ros_training hf-serve --model DIR [--port N] ...`: serve a local model folder with the chat
completions subset the stack uses (captain_ros_training.hf_serve), offline."""

from __future__ import annotations

import argparse
import logging
import os

from captain_ros_training import hf_serve


def parse_args(argv: list[str] | None = None) -> hf_serve.ServeConfig:
    d = hf_serve.ServeConfig(model="")
    p = argparse.ArgumentParser(
        prog="python -m captain_ros_training hf-serve",
        description="Serve a local model folder with the OpenAI chat-completions subset the captain_ros stack uses "
        "(prompt/sampled token ids, processed logprobs, hermes tool calls), on transformers' continuous batching: a "
        "stand-in for vLLM where vLLM is not installed. Offline; runs on CUDA or (slowly) CPU.",
    )
    p.add_argument("--model", required=True, help="the model folder (config, weights, tokenizer); also the model name")
    p.add_argument("--host", default=d.host, help=f"address to bind (default {d.host})")
    p.add_argument("--port", type=int, default=d.port, help=f"port to bind (default {d.port})")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=d.max_model_len,
        help=f"prompt + completion tokens per request at most (default {d.max_model_len}); a prompt with "
        "no room for a token is refused with HTTP 400, a completion is cut there (finish_reason length)",
    )
    p.add_argument(
        "--dtype",
        default=d.dtype,
        choices=["auto", "bfloat16", "float16", "float32"],
        help="weights and activations (default auto: bfloat16 on CUDA, float32 on CPU)",
    )
    p.add_argument("--device", default=d.device, help="auto (cuda if available, else cpu), cpu, cuda or cuda:N")
    p.add_argument(
        "--engine",
        default=d.engine,
        choices=hf_serve.ENGINES,
        help="slots (default: one dense KV-cache slot per request, all running requests decoded in one step; "
        "Qwen2-family models; captain_ros_training.slot_engine) or cb (transformers' continuous batching: any model, "
        "slower on hosts without flash-attn)",
    )
    p.add_argument(
        "--attn-implementation",
        default=d.attn_implementation,
        help="varlen (default: each request attends to its own cache; flash varlen on CUDA), sdpa (transformers' "
        "masked attention over the whole batch), paged|eager, or flash_attention_2 where flash-attn is installed",
    )
    p.add_argument("--page-size", type=int, default=d.page_size_tokens, help="tokens per KV-cache page (default 256)")
    p.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=None,
        help="KV-cache capacity in tokens (default: from free GPU memory on CUDA; on CPU 4 x max-model-len, "
        "16 pages at least); it must hold one max-model-len request, and each request holds one page at least",
    )
    p.add_argument(
        "--kv-cache-memory-fraction",
        type=float,
        default=d.kv_cache_memory_fraction,
        help="share of the free GPU memory after loading that automatic cache sizing may use (default 0.8)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=None,
        help="tokens per forward pass, prefill chunks included (default: transformers' 8192)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=d.max_num_seqs,
        help=f"requests per forward pass at most (default {d.max_num_seqs})",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="slots engine on CUDA: replay each decode step from a CUDA graph (one per bucket of requests and context "
        "length, captured on first use) instead of launching its kernels from Python",
    )
    p.add_argument("--no-prefix-sharing", action="store_true", help="do not reuse KV pages of shared prompt prefixes")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampler for requests without their own seed")
    p.add_argument(
        "--request-timeout-s",
        type=float,
        default=d.request_timeout_s,
        help="a request still waiting after this many seconds is cancelled and answered 500",
    )
    p.add_argument(
        "--weight-reload",
        action="store_true",
        help="serve the routes captain_ros_training.weight_sync uses to load new weights without a restart (/pause, "
        "/collective_rpc reload_weights, /update_weight_version, /weight_info, /resume; slots engine), as vLLM "
        "does with VLLM_SERVER_DEV_MODE=1",
    )
    p.add_argument("--log-level", default="INFO", help="logging level (DEBUG logs every HTTP request)")  # fmt: skip
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return hf_serve.ServeConfig(
        model=a.model,
        host=a.host,
        port=a.port,
        max_model_len=a.max_model_len,
        dtype=a.dtype,
        device=a.device,
        engine=a.engine,
        attn_implementation=a.attn_implementation,
        page_size_tokens=a.page_size,
        kv_cache_tokens=a.kv_cache_tokens,
        kv_cache_memory_fraction=a.kv_cache_memory_fraction,
        max_batch_tokens=a.max_batch_tokens,
        max_num_seqs=a.max_num_seqs,
        cuda_graphs=a.cuda_graphs,
        prefix_sharing=not a.no_prefix_sharing,
        seed=a.seed,
        request_timeout_s=a.request_timeout_s,
        weight_reload=a.weight_reload,
    )


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    hf_serve.serve(parse_args(argv))
    return 0
