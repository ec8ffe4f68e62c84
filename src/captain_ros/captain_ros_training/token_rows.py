"""Output rows the base model never trained, and fitting them to a fine-tuned model's hidden states.

Qwen2.5-Coder-0.5B-Instruct's lm_head rows for `<tool_call>` (151657) and `</tool_call>` (151658) are the same
vector as its 271 padding rows past the tokenizer (ids 151665-151935, which no text ever produces) and as about
6,000 other rows: cosine 0.999998 with their mean. The base was never trained to write those tokens. A LoRA SFT
leaves lm_head frozen, so no hidden state can make `<tool_call>` likelier than the thousands of rows that share
its vector: after the SFT of docs/student.md the fine-tuned student gave it 0.0002 where the expert's episodes
write it (NLL 8.4 in the training context itself, every other target token near 0), and sampled a random rare
token there instead (`กรุงเทพ`, `裛`, ...), so vLLM parsed no tool call and every episode ended after one request.

`untrained_rows` finds such rows among the tokens the SFT targets: rows with at least 16 twins (cosine > 0.9999,
norm within 1%); a trained row has none. `fit_rows` then fits just those rows, the rest of the model frozen:
the exact cross-entropy of every target position of the SFT examples, as a function of the k free rows, is

    loss_i = logaddexp(lse_rest_i, logsumexp_k(h_i . r_k)) - (h_i . r_{y_i} if y_i is free else z_i)

where h_i is the final hidden state (lm_head's input), lse_rest_i the log-sum-exp of the frozen rows' logits and
z_i the target's frozen logit. h, lse_rest and z are computed once (one forward pass per example, no gradient),
then Adam fits the k x d free parameters in seconds. Every other target position is in the objective, so a fitted
row is pushed up where its token is the target and down everywhere else. It is a second stage after a LoRA SFT
that trained only attention and MLPs; training those rows inside the SFT (peft's `trainable_token_indices`) is the
one-stage alternative on a GPU host.

    python -m captain_ros_training token-rows fit --model runs/student/sft/merged --examples .cache/sft_data.pkl.xz \\
        --out runs/student/sft/model     # a copy with the fitted rows, token_rows.json, token_rows.npz
    python -m captain_ros_training token-rows apply --model MERGED --rows token_rows.npz --out OUT   # again, no fit
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captain_ros_training.data import IGNORE, tokenizer_fingerprint

COSINE_UNTRAINED = 0.9999  # rows this close (in direction, and in norm within 1%) are twins
NORM_TOLERANCE = 0.01
MIN_TWINS = 16  # a row with this many twins was never trained
# the fitted rows alone: ids [k], rows [k, d] (bf16 values as float32: exact). Not .safetensors: vLLM loads every
# *.safetensors of a model folder as a checkpoint shard
ROWS_FILE = "token_rows.npz"


@dataclass(frozen=True)
class FitConfig:
    examples: int = 8  # SFT examples whose first `prefix_tokens` feed the fit (one forward pass each)
    prefix_tokens: int = 6144  # enough for the expert's first cell (3.3k tokens) to end with its markers
    steps: int = 2000  # Adam steps on the cached hidden states
    learning_rate: float = 1e-2
    held_out: int = 2  # of `examples`, the last ones are only evaluated (the fit never sees them)


def untrained_rows(weight: torch.Tensor, candidates: list[int], min_twins: int = MIN_TWINS) -> list[int]:
    """The candidate ids whose rows of `weight` [V, d] have at least `min_twins` twins: other rows with cosine >
    0.9999 and a norm within 1%. Training makes rows distinct; an untrained row shares its initial vector with
    every other untrained one (in the student, with the padding rows past the tokenizer and ~6,000 more)."""
    w = weight.detach().float()
    norms = w.norm(dim=1).clamp(min=1e-12)
    unit = w / norms[:, None]
    out = []
    for i in sorted(set(candidates)):
        cos = unit @ unit[i]
        twins = (cos > COSINE_UNTRAINED) & ((norms / norms[i] - 1.0).abs() < NORM_TOLERANCE)
        if int(twins.sum()) - 1 >= min_twins:
            out.append(i)
    return out


@torch.no_grad()
def collect(model: Any, examples: list[Any], prefix_tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(final hidden states at the target positions [n, d] fp32, their targets [n]) of each example's prefix."""
    out = []
    for n, e in enumerate(examples, 1):
        t0 = time.perf_counter()
        ids = e.input_ids[:prefix_tokens]
        mask = e.response_mask[:prefix_tokens]
        targets = torch.tensor([ids[i + 1] if mask[i + 1] else IGNORE for i in range(len(ids) - 1)] + [IGNORE])
        hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0].float()
        keep = targets != IGNORE
        out.append((hidden[keep], targets[keep]))
        print(f"  example {n}/{len(examples)}: {len(ids)} tokens in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


@torch.no_grad()
def frozen_terms(weight: torch.Tensor, hidden: torch.Tensor, targets: torch.Tensor, free: list[int], chunk: int = 512):
    """Per position: the log-sum-exp of the frozen rows' logits, and the target's logit (from the frozen row; the
    free rows' are recomputed by the fit)."""
    w = weight.float()
    keep = torch.ones(w.shape[0], dtype=torch.bool)
    keep[free] = False
    lse, z = [], []
    for start in range(0, hidden.shape[0], chunk):
        logits = hidden[start : start + chunk] @ w.T
        z.append(logits.gather(1, targets[start : start + chunk, None])[:, 0])
        lse.append(torch.logsumexp(logits[:, keep], dim=1))
    return torch.cat(lse), torch.cat(z)


def row_loss(rows: torch.Tensor, data: dict, free: list[int]) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy of all target positions with the free rows `rows` [k, d]; and the free targets' share."""
    free_logits = data["hidden"] @ rows.T  # [n, k]
    lse = torch.logaddexp(data["lse_rest"], torch.logsumexp(free_logits, dim=1))
    slot = data["slot"]  # index into `free` of each target, -1 if frozen
    target = torch.where(slot >= 0, free_logits.gather(1, slot.clamp(min=0)[:, None])[:, 0], data["z"])
    nll = lse - target
    on_free = slot >= 0
    stats = {
        "nll_all": nll.mean().item(),
        "nll_free_targets": nll[on_free].mean().item() if on_free.any() else float("nan"),
        "nll_other_targets": nll[~on_free].mean().item(),
        "free_targets": int(on_free.sum()),
        "positions": int(nll.numel()),
    }
    return nll.mean(), stats


def prepare(weight: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor]], free: list[int]) -> dict:
    hidden = torch.cat([h for h, _ in parts])
    targets = torch.cat([t for _, t in parts])
    lse_rest, z = frozen_terms(weight, hidden, targets, free)
    slot = torch.full_like(targets, -1)
    for k, i in enumerate(free):
        slot[targets == i] = k
    return {"hidden": hidden, "lse_rest": lse_rest, "z": z, "slot": slot}


def fit_rows(weight: torch.Tensor, train: dict, free: list[int], config: FitConfig) -> torch.Tensor:
    """Adam on the free rows (initialised from their current values) over the cached training positions."""
    rows = weight[free].float().clone().requires_grad_(True)
    optimizer = torch.optim.Adam([rows], lr=config.learning_rate)
    for _ in range(config.steps):
        optimizer.zero_grad()
        loss, _ = row_loss(rows, train, free)
        loss.backward()
        optimizer.step()
    return rows.detach()


@dataclass
class FitReport:
    free_ids: list[int]
    free_tokens: list[str]
    examples_fit: int
    examples_held_out: int
    before: dict
    after: dict
    held_out_before: dict
    held_out_after: dict
    seconds: float
    config: dict


def _write_with_rows(model: Any, model_dir: Path, out: Path, ids: list[int], rows: torch.Tensor) -> Path:
    """`model_dir` copied to `out`.partial with lm_head's rows `ids` replaced (bf16), and the rows alone in
    ROWS_FILE (what `apply` puts back into a merged folder). The caller renames it to `out` when complete."""
    weight = model.get_output_embeddings().weight
    with torch.no_grad():
        weight[ids] = rows.to(weight.dtype)
    partial = out.with_name(out.name + ".partial")  # renamed when complete: no half-written folder under `out`
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(model_dir, partial)
    model.to(torch.bfloat16).save_pretrained(partial)
    saved = weight[ids].detach().to(torch.bfloat16).float().numpy()
    np.savez(partial / ROWS_FILE, ids=np.array(ids, dtype=np.int64), rows=saved)
    return partial


def apply_rows(model_dir: Path, rows_file: Path, out: Path) -> Path:
    """A copy of `model_dir` (e.g. the adapter merged into the student) with the lm_head rows of `rows_file` (a
    ROWS_FILE written by `fit`) put in place: the fitted student again, without fitting."""
    from transformers import AutoModelForCausalLM

    with np.load(rows_file) as saved:
        ids, rows = [int(i) for i in saved["ids"]], torch.from_numpy(saved["rows"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    if max(ids) >= model.get_output_embeddings().weight.shape[0]:
        raise SystemExit(f"{rows_file} holds rows {ids}; {model_dir}'s lm_head has fewer")
    partial = _write_with_rows(model, model_dir, out, ids, rows)
    shutil.rmtree(out, ignore_errors=True)
    partial.replace(out)
    return out


def fit_folder(model_dir: Path, examples_file: Path, out: Path, config: FitConfig = FitConfig()) -> FitReport:
    """Copy `model_dir` to `out` with the untrained rows its SFT targets fitted (`fit_rows`); token_rows.json
    records which rows, and the NLL before and after on fitted and held-out examples."""
    import lzma
    import pickle

    from transformers import AutoModelForCausalLM

    from captain_ros_training.student import check_model_folder

    t0 = time.perf_counter()
    tokenizer = check_model_folder(model_dir)
    with lzma.open(examples_file, "rb") as f:  # captain_ros_training.data.save_sft_data's file (made here, by us)
        record = pickle.load(f)
    if record.get("tokenizer") != tokenizer_fingerprint(tokenizer):
        raise SystemExit(f"{examples_file} was built with another tokenizer than {model_dir}'s: rebuild it (sft-data)")
    examples = record["examples"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    weight = model.get_output_embeddings().weight
    targeted = sorted({t for e in examples for t, m in zip(e.input_ids, e.response_mask, strict=True) if m})
    free = untrained_rows(weight, targeted)
    if not free:
        raise SystemExit(f"{model_dir}: every token its SFT targets has a trained output row; nothing to fit")
    n_fit = config.examples - config.held_out
    if n_fit < 1 or len(examples) < config.examples:
        raise SystemExit(
            f"need {config.examples} examples with {config.held_out} held out; the file has {len(examples)}"
        )
    chosen = examples[: config.examples]
    print(f"fitting {len(free)} untrained rows {free} on {n_fit} examples (+{config.held_out} held out)", flush=True)
    parts = collect(model, chosen, config.prefix_tokens)
    train = prepare(weight.detach(), parts[:n_fit], free)
    held = prepare(weight.detach(), parts[n_fit:], free)
    start_rows = weight.detach()[free].float()
    before, held_before = row_loss(start_rows, train, free)[1], row_loss(start_rows, held, free)[1]
    rows = fit_rows(weight.detach(), train, free, config)
    after, held_after = row_loss(rows, train, free)[1], row_loss(rows, held, free)[1]
    partial = _write_with_rows(model, model_dir, out, free, rows)
    report = FitReport(
        free_ids=free,
        free_tokens=tokenizer.convert_ids_to_tokens(free),
        examples_fit=n_fit,
        examples_held_out=config.held_out,
        before=before,
        after=after,
        held_out_before=held_before,
        held_out_after=held_after,
        seconds=time.perf_counter() - t0,
        config=asdict(config),
    )
    (partial / "token_rows.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.replace(out)
    return report


if __name__ == "__main__":  # the command moved: say where rather than exit 0 having done nothing
    raise SystemExit("this command is now `python -m captain_ros_training token-rows`")
