"""tools/carry.py: split, carry, put back together, with every damage named by its part folder and the remedy."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("carry", ROOT / "tools" / "carry.py")
carry = importlib.util.module_from_spec(spec)
sys.modules["carry"] = carry  # dataclasses look their module up there
spec.loader.exec_module(carry)

LIMIT_MIB = 0.25  # tiny folders, so that a 500 kB file spans several of them and the tests stay fast
LIMIT = int(LIMIT_MIB * carry.MIB)


def make_inputs(root: Path) -> list[Path]:
    """A folder of wheels (small, packed first) and a model folder with one file larger than a part."""
    rng = random.Random(7)
    wheels = root / "wheels"
    model = root / "model"
    (model / "sub").mkdir(parents=True)
    wheels.mkdir()
    (wheels / "gguf-0.19.0-py3-none-any.whl").write_bytes(rng.randbytes(20_000))
    (model / "config.json").write_text('{"hidden_size": 64}\n')
    (model / "model.safetensors").write_bytes(rng.randbytes(500_000))  # about 0.48 MiB: over the limit
    (model / "empty").write_bytes(b"")
    (model / "sub" / "tokenizer.json").write_bytes(rng.randbytes(3_000))
    run = model / "run.sh"
    run.write_text("#!/bin/sh\necho hi\n")
    run.chmod(0o755)
    return [wheels, model]


def files_under(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and carry.STATE_DIR not in p.parts
    }


@pytest.fixture
def packed(tmp_path, capsys):
    """Inputs under src/, packed into out/ as t-partNN: (out, manifest, src)."""
    src = tmp_path / "src"
    inputs = make_inputs(src)
    out = tmp_path / "out"
    rc = carry.main(["pack", *map(str, inputs), "--out", str(out), "--max-mib", str(LIMIT_MIB), "--name", "t", "-q"])
    assert rc == 0
    capsys.readouterr()
    manifest = json.loads((out / "t-part01" / carry.MANIFEST).read_text())
    assert len(manifest["parts"]) >= 3, "the test needs a file spread over several parts"
    return out, manifest, src


def run(capsys, *argv: str) -> tuple[int, str]:
    rc = carry.main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def part_of(manifest: dict, path: str) -> list[str]:
    entry = next(f for f in manifest["files"] if f["path"] == path)
    return sorted({p["folder"] for p in entry["pieces"]})


def first_piece(out: Path, manifest: dict, path: str) -> tuple[Path, dict]:
    entry = next(f for f in manifest["files"] if f["path"] == path)
    piece = entry["pieces"][1]  # a middle piece of the large file
    return out / piece["folder"] / carry.PIECES / piece["piece"], piece


def leftovers(dest: Path) -> list[str]:
    return [p.name for p in dest.rglob("*carry-tmp*")]


# ---------------------------------------------------------------------------------------------- pack, round trip
def test_round_trip_keeps_every_folder_under_the_limit_and_every_byte(packed, tmp_path, capsys):
    out, manifest, src = packed
    parts = sorted(p for p in out.iterdir() if p.is_dir())
    assert [p.name for p in parts] == [f"t-part{i:02d}" for i in range(1, len(parts) + 1)]
    for part in parts:
        assert sum(f.stat().st_size for f in part.rglob("*") if f.is_file()) <= LIMIT, part.name
        assert (part / carry.MANIFEST).read_text() == (parts[0] / carry.MANIFEST).read_text()
        assert (part / carry.TOOL).read_bytes() == (ROOT / "tools" / "carry.py").read_bytes()
    big = next(f for f in manifest["files"] if f["path"] == "model/model.safetensors")
    assert len(big["pieces"]) >= 2 and sum(p["size"] for p in big["pieces"]) == 500_000
    assert {f["path"] for f in manifest["files"]} == {
        "wheels/gguf-0.19.0-py3-none-any.whl",
        "model/config.json",
        "model/empty",
        "model/model.safetensors",
        "model/run.sh",
        "model/sub/tokenizer.json",
    }
    assert all(len(f["sha256"]) == 64 for f in manifest["files"])

    rc, text = run(capsys, "unpack", str(out), "--to", str(tmp_path / "dest"))
    assert rc == 0, text
    assert files_under(tmp_path / "dest") == files_under(src)
    assert os.access(tmp_path / "dest" / "model" / "run.sh", os.X_OK)
    assert "done (unpack" in text and leftovers(tmp_path / "dest") == []

    rc, text = run(capsys, "verify", str(out), "--all")
    assert rc == 0 and "every size and sha256 matches" in text, text


def test_pack_prints_the_table_and_the_commands_for_the_other_side(tmp_path, capsys):
    inputs = make_inputs(tmp_path / "src")
    rc, text = run(capsys, "pack", *map(str, inputs), "--out", str(tmp_path / "o"), "--max-mib", str(LIMIT_MIB))
    assert rc == 0
    assert "carry-part01" in text and "model/model.safetensors" in text
    assert "python3 /tmp/carry/carry-part01/carry.py unpack /tmp/carry --to DEST" in text
    rc, text = run(capsys, "pack", str(inputs[0]), "--out", str(tmp_path / "o"), "--name", "carry")
    assert rc == 1 and "already holds carry-part01" in text and "--force" in text


def test_the_copy_in_a_part_folder_runs_on_its_own(packed, tmp_path):
    out, _, src = packed
    tool = out / "t-part01" / carry.TOOL
    proc = subprocess.run(
        [sys.executable, str(tool), "unpack", str(out), "--to", str(tmp_path / "there")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert files_under(tmp_path / "there") == files_under(src)


# ------------------------------------------------------------------------------------------ parts over several calls
def test_parts_arriving_in_two_batches(packed, tmp_path, capsys):
    out, manifest, src = packed
    folders = [p["folder"] for p in manifest["parts"]]
    n = len(folders)
    arrive, dest = tmp_path / "arrive", tmp_path / "dest"
    first = folders[:1]
    for f in first:
        shutil.copytree(out / f, arrive / f)

    rc, text = run(capsys, "unpack", str(arrive), "--to", str(dest))
    assert rc == carry.EXIT_INCOMPLETE, text
    for i in range(2, n + 1):
        assert f"part {i:02d} of {n:02d} (t-part{i:02d}) is missing: copy it again (into {arrive})" in text
    ready = [f["path"] for f in manifest["files"] if set(part_of(manifest, f["path"])) <= set(first)]
    waiting = [f["path"] for f in manifest["files"] if f["path"] not in ready]
    assert "wheels/gguf-0.19.0-py3-none-any.whl" in ready and "model/model.safetensors" in waiting
    assert all((dest / p).read_bytes() == (src / p).read_bytes() for p in ready)
    assert not any((dest / p).exists() for p in waiting) and leftovers(dest) == []

    for f in folders[1:]:
        shutil.copytree(out / f, arrive / f)
    rc, text = run(capsys, "unpack", str(arrive), "--to", str(dest))
    assert rc == 0, text
    assert f"{len(waiting)} assembled, {len(ready)} already there and checked" in text
    assert files_under(dest) == files_under(src)


def test_second_unpack_skips_finished_files_and_redoes_a_changed_one(packed, tmp_path, capsys):
    out, manifest, src = packed
    dest = tmp_path / "dest"
    assert run(capsys, "unpack", str(out), "--to", str(dest))[0] == 0
    stamps = {p: p.stat().st_mtime_ns for p in dest.rglob("*") if p.is_file()}

    rc, text = run(capsys, "unpack", str(out), "--to", str(dest))
    assert rc == 0 and f"0 assembled, {len(manifest['files'])} already there and checked" in text, text
    assert {p: p.stat().st_mtime_ns for p in dest.rglob("*") if p.is_file() and carry.STATE_DIR not in p.parts} == {
        p: t for p, t in stamps.items() if carry.STATE_DIR not in p.parts
    }

    (dest / "model" / "model.safetensors").write_bytes(b"cut short")  # changed since: checked and put back
    rc, text = run(capsys, "unpack", str(out), "--to", str(dest))
    assert rc == 0 and "ok  model/model.safetensors" in text and "1 assembled" in text, text
    assert files_under(dest) == files_under(src)


# ---------------------------------------------------------------------------------------------- damage, named
def test_a_missing_part_is_named_with_the_folder_to_copy_again(packed, tmp_path, capsys):
    out, manifest, _ = packed
    n = len(manifest["parts"])
    shutil.rmtree(out / "t-part02")
    rc, text = run(capsys, "unpack", str(out), "--to", str(tmp_path / "dest"))
    assert rc == carry.EXIT_INCOMPLETE
    assert f"part 02 of {n:02d} (t-part02) is missing: copy it again (into {out}) and rerun" in text
    assert "model/model.safetensors" in text and "INCOMPLETE" in text
    assert not (tmp_path / "dest" / "model" / "model.safetensors").exists()

    rc, text = run(capsys, "verify", str(out))  # the folders here are fine; the absent one is listed
    assert rc == 0 and "not here, not checked: t-part02" in text, text
    rc, text = run(capsys, "verify", str(out), "--all")
    assert rc == carry.EXIT_INCOMPLETE and f"part 02 of {n:02d} (t-part02) is missing: copy it again" in text


def test_a_truncated_piece_gives_expected_and_found_bytes(packed, tmp_path, capsys):
    out, manifest, _ = packed
    path, piece = first_piece(out, manifest, "model/model.safetensors")
    path.write_bytes(path.read_bytes()[:1000])
    dest = tmp_path / "dest"
    rc, text = run(capsys, "unpack", str(out), "--to", str(dest))
    assert rc == carry.EXIT_DAMAGED
    folder = piece["folder"]
    assert f"{folder}: piece {piece['piece']} of model/model.safetensors" in text
    assert f"is truncated: {piece['size']:,} bytes expected, 1,000 found: copy {folder} again" in text
    assert not (dest / "model" / "model.safetensors").exists() and leftovers(dest) == []
    assert (dest / "model" / "config.json").exists(), "the undamaged files are unpacked"

    rc, text = run(capsys, "verify", str(out))
    assert rc == carry.EXIT_DAMAGED and f"is truncated: {piece['size']:,} bytes expected" in text


def test_a_flipped_byte_is_a_wrong_sha256_and_nothing_lands_under_the_final_name(packed, tmp_path, capsys):
    out, manifest, src = packed
    path, piece = first_piece(out, manifest, "model/model.safetensors")
    folder = piece["folder"]
    shutil.copytree(out / folder, tmp_path / "good-copy")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    dest = tmp_path / "dest"
    rc, text = run(capsys, "unpack", str(out), "--to", str(dest))
    assert rc == carry.EXIT_DAMAGED
    assert f"{folder}: piece {piece['piece']} of model/model.safetensors has the wrong sha256" in text
    assert f"copy {folder} again" in text and "FAILED" in text
    assert not (dest / "model" / "model.safetensors").exists() and leftovers(dest) == []

    rc, text = run(capsys, "verify", str(out))
    assert rc == carry.EXIT_DAMAGED and f"{folder}: piece {piece['piece']}" in text and "wrong sha256" in text

    shutil.rmtree(out / folder)  # the remedy: that folder copied again
    shutil.copytree(tmp_path / "good-copy", out / folder)
    rc, text = run(capsys, "unpack", str(out), "--to", str(dest))
    assert rc == 0 and "ok  model/model.safetensors" in text, text
    assert files_under(dest) == files_under(src)


def test_a_damaged_manifest_copy_is_named_and_another_copy_serves(packed, tmp_path, capsys):
    out, _, src = packed
    manifest = out / "t-part02" / carry.MANIFEST
    manifest.write_text(manifest.read_text().replace('"size": ', '"size":  1', 1))
    rc, text = run(capsys, "unpack", str(out), "--to", str(tmp_path / "dest"))
    assert rc == 0, text
    assert f"t-part02/{carry.MANIFEST} is damaged" in text and "copy t-part02 again" in text
    assert files_under(tmp_path / "dest") == files_under(src)


def test_two_packs_of_one_name_in_one_place_are_refused(packed, tmp_path, capsys):
    out, _, src = packed
    other = tmp_path / "other"
    assert run(capsys, "pack", str(src / "model" / "config.json"), "--out", str(other), "--name", "t")[0] == 0
    shutil.copytree(other / "t-part01", tmp_path / "mixed" / "t-part01")
    shutil.copytree(out / "t-part02", tmp_path / "mixed" / "t-part02")
    rc, text = run(capsys, "unpack", str(tmp_path / "mixed"), "--to", str(tmp_path / "dest"))
    assert rc == 1 and "different packs named 't'" in text and "remove the old ones" in text


# ---------------------------------------------------------------------------------------------- the project
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_project_is_the_committed_tree_with_its_commit(tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "code.py").write_text("print('committed')\n")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "."], [*ident, "commit", "-q", "-m", "the first commit"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=env, capture_output=True)
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, env=env, capture_output=True, text=True
    ).stdout.strip()
    (repo / "src" / "code.py").write_text("print('not committed')\n")

    rc, text = run(capsys, "pack", "--project", "--repo", str(repo), "--out", str(tmp_path / "out"))
    assert rc == 0, text
    assert f"project: commit {commit[:12]} (the first commit)" in text and "1 tracked files have uncommitted" in text
    dest = tmp_path / "dest"
    rc, text = run(capsys, "unpack", str(tmp_path / "out"), "--to", str(dest))
    assert rc == 0, text
    assert (dest / "captain_ros" / "src" / "code.py").read_text() == "print('committed')\n"
    assert (dest / "captain_ros" / carry.COMMIT_NOTE).read_text().split()[0] == commit
    rc, text = run(capsys, "unpack", str(tmp_path / "out"), "--to", str(dest))
    assert rc == 0 and "unpacked into" not in text, "a second unpack leaves the tree alone"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_project_defaults_to_the_repository_the_tool_is_in(tmp_path, capsys):
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "pyproject.toml", "tools/carry.py"], capture_output=True, text=True
    ).stdout.split()
    assert "pyproject.toml" in tracked, "the tests run inside the project's git repository"
    rc, text = run(capsys, "pack", "--project", "--out", str(tmp_path / "out"), "-q")
    assert rc == 0, text
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    manifest = json.loads((tmp_path / "out" / "project-part01" / carry.MANIFEST).read_text())
    assert manifest["project"]["commit"] == head and "project: commit" in text
    rc, text = run(capsys, "unpack", str(tmp_path / "out"), "--to", str(tmp_path / "dest"), "-q")
    assert rc == 0, text
    unpacked = tmp_path / "dest" / "captain_ros"
    committed = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:pyproject.toml"], capture_output=True).stdout
    assert (unpacked / "pyproject.toml").read_bytes() == committed
    assert not (unpacked / ".venv").exists() and not (unpacked / ".git").exists()


# ---------------------------------------------------------------------------------------------- flat: coming back
FLAT_MIB = 0.01  # 10,485 bytes a part file


def make_adapter(root: Path) -> tuple[Path, Path]:
    rng = random.Random(11)
    adapter = root / "sft" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"r": 32, "lora_alpha": 64}\n')
    (adapter / "adapter_model.safetensors").write_bytes(rng.randbytes(35_000))  # over three part files
    run_json = root / "sft" / "sft_run.json"
    run_json.write_text('{"tokens_per_second": 1234.5}\n')
    return adapter, run_json


@pytest.fixture
def flat(tmp_path, capsys):
    """A LoRA adapter and its run record packed flat into back/: (back, manifest, src)."""
    src = tmp_path / "src"
    adapter, run_json = make_adapter(src)
    back = tmp_path / "back"
    rc, text = run(
        capsys, "pack", str(adapter), str(run_json), "--out", str(back), "--max-mib", str(FLAT_MIB), "--flat",
        "--name", "adapter",
    )  # fmt: skip
    assert rc == 0, text
    assert "python3 tools/carry.py unpack FOLDER --to DEST" in text
    manifest = json.loads((back / f"adapter{carry.FLAT_MANIFEST}").read_text())
    return back, manifest, src / "sft"


def test_flat_writes_files_under_the_limit_directly_in_out_and_round_trips(flat, tmp_path, capsys):
    back, manifest, src = flat
    names = sorted(p.name for p in back.iterdir())
    n = len(manifest["parts"])
    assert n >= 4
    assert names == [f"adapter-part{i:02d}" for i in range(1, n + 1)] + [f"adapter{carry.FLAT_MANIFEST}"]
    assert all(p.is_file() and p.stat().st_size <= int(FLAT_MIB * carry.MIB) for p in back.iterdir())

    for p in back.iterdir():  # brought back read-only, as the device tool hands files over
        p.chmod(0o444)
    rc, text = run(capsys, "verify", str(back), "--all")
    assert rc == 0 and "every size and sha256 matches" in text, text
    dest = tmp_path / "runs" / "student" / "sft"
    rc, text = run(capsys, "unpack", str(back), "--to", str(dest))
    assert rc == 0, text
    assert files_under(dest) == files_under(src)
    rc, text = run(capsys, "unpack", str(back / f"adapter{carry.FLAT_MANIFEST}"), "--to", str(dest))
    assert rc == 0 and f"0 assembled, {len(manifest['files'])} already there" in text, text


def test_flat_damage_is_named_by_its_part_file(flat, tmp_path, capsys):
    back, manifest, _ = flat
    n = len(manifest["parts"])
    (back / "adapter-part02").unlink()
    part3 = back / "adapter-part03"
    part3.write_bytes(part3.read_bytes()[:100])
    part4 = back / "adapter-part04"
    data = bytearray(part4.read_bytes())
    data[5] ^= 0x80
    part4.write_bytes(bytes(data))
    dest = tmp_path / "dest"
    rc, text = run(capsys, "unpack", str(back), "--to", str(dest))
    assert rc == carry.EXIT_DAMAGED, text
    assert f"part 02 of {n:02d} (adapter-part02) is missing: copy it again" in text
    size3 = next(p["bytes"] for p in manifest["parts"] if p["folder"] == "adapter-part03")
    assert f"adapter-part03 is truncated: {size3:,} bytes expected, 100 found: copy adapter-part03 again" in text
    assert not (dest / "adapter" / "adapter_model.safetensors").exists() and leftovers(dest) == []
    assert (dest / "adapter" / "adapter_config.json").exists(), "files whose parts are whole are unpacked"

    rc, text = run(capsys, "verify", str(back))  # the hashes of what is here: the flipped byte too
    assert rc == carry.EXIT_DAMAGED, text
    assert "not here, not checked: adapter-part02" in text and "adapter-part03 is truncated" in text
    assert "adapter-part04: piece" in text and "has the wrong sha256" in text and "copy adapter-part04 again" in text
