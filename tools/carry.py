#!/usr/bin/env python3
"""Carry large things (a model, wheels, the project) to a host without network, in folders under a size limit.

  pack     splits files and folders into OUT/<name>-part01/, -part02/, ... each at most --max-mib (pieces of
           large files split by bytes); every folder holds the manifest (carry-manifest.json: each file's path,
           size and sha256, each piece's folder, offset, size and sha256), a copy of this script and a README
  unpack   on the other side: checks each piece's size and sha256, puts the files back together under --to,
           checks each file's sha256; parts may arrive one at a time (rerun it as they come: finished files are
           skipped, nothing is half-written under its final name)
  verify   checks the pieces of the part folders present (size and sha256) without reassembling

  pack --flat writes part FILES instead of folders, directly in OUT (<name>-part01, ... each at most --max-mib,
  pieces concatenated) and one manifest file beside them (<name>.carry-manifest.json): for a channel that limits
  the size and number of files, e.g. bringing a LoRA adapter back in files of 15 MiB. unpack and verify take the
  folder those files are in.

Standard library only: it runs with any python3 (3.11 or newer) on either side; the project need not be installed.
Exit status: 0 done, 1 something is damaged or wrong (the message names it and what to do), 2 bad arguments,
3 incomplete (part folders missing: the message names them).

Examples:
  # here: the student model and a wheel the GPU host lacks, 60 MiB folders under .cache/carry
  python3 tools/carry.py pack .cache/student/qwen2.5-coder-0.5b-instruct .cache/gpu-wheels \\
      --out .cache/carry --name student
  python3 tools/carry.py pack --project --out .cache/carry          # the committed tree (git archive HEAD)
  python3 tools/carry.py verify .cache/carry                         # the pieces as written

  # there, after copying the folders (all at once or one at a time) into /tmp/carry:
  python3 /tmp/carry/student-part01/carry.py verify /tmp/carry/student-part03   # one folder just copied
  python3 /tmp/carry/student-part01/carry.py unpack /tmp/carry --to /tmp/work

  # back: an adapter as flat files of at most 15 MiB (there), put together here
  python3 tools/carry.py pack sft/adapter sft/sft_run.json --out $OUT/back --max-mib 15 --flat --name adapter
  python3 tools/carry.py unpack FOLDER_THE_FILES_CAME_INTO/back --to runs/student/sft
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

FORMAT = "captain_ros-carry/1"
MANIFEST = "carry-manifest.json"
FLAT_MANIFEST = ".carry-manifest.json"  # --flat: <name>.carry-manifest.json beside the part files
PART_FILE = "carry-part.json"
README = "README.txt"
TOOL = "carry.py"
PIECES = "pieces"
STATE_DIR = ".carry-state"  # under --to: which files were assembled and checked (for quick reruns)
PROJECT_FOLDER = "captain_ros"  # --project unpacks into DEST/captain_ros/
COMMIT_NOTE = ".carried-commit"  # in that folder: the commit it holds
SMALL_FILES = 2048  # room for carry-part.json and README.txt in each folder
CHUNK = 4 << 20
MIN_PIECE = 64 << 10  # a part with less room left than this starts the next file in a new part
MIB = 1 << 20
EXIT_DAMAGED, EXIT_USAGE, EXIT_INCOMPLETE = 1, 2, 3


class CarryError(Exception):
    """Something the user must fix; the message says what and how."""


# ---------------------------------------------------------------------------------------------- output
def say(msg: str = "") -> None:
    print(msg, flush=True)


def short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def mib(n: int) -> str:
    return f"{n / MIB:,.1f} MiB"


class Progress:
    """Bytes hashed or copied, shown on stderr when the work takes more than a moment (every 0.5 s on a terminal,
    every 5 s in a log)."""

    def __init__(self, what: str, total: int, quiet: bool = False) -> None:
        self.what, self.total, self.done, self.quiet = what, total, 0, quiet
        self.start = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.shown = False

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if not self.quiet and now - self.last >= (0.5 if self.tty else 5.0):
            self.last = now
            self._show(now, final=False)

    def finish(self) -> None:
        if self.shown:
            self._show(time.monotonic(), final=True)

    def _show(self, now: float, final: bool) -> None:
        rate = self.done / max(now - self.start, 1e-9) / MIB
        pct = 100.0 * self.done / self.total if self.total else 100.0
        line = f"  {self.what}: {mib(self.done)} of {mib(self.total)} ({pct:.0f}%), {rate:,.0f} MiB/s"
        end = "\n" if final or not self.tty else ""
        sys.stderr.write(("\r" if self.tty else "") + line + end)
        sys.stderr.flush()
        self.shown = True


def copy_range(src, size: int, hashes: list, out=None, progress: Progress | None = None) -> int:
    """Read up to `size` bytes from `src`, updating every hash (and writing to `out`); the bytes actually read."""
    buf = bytearray(min(CHUNK, max(size, 1)))
    view = memoryview(buf)
    left = size
    while left:
        n = src.readinto(view[: min(left, len(buf))])
        if not n:
            break
        chunk = view[:n]
        for h in hashes:
            h.update(chunk)
        if out is not None:
            out.write(chunk)
        if progress is not None:
            progress.add(n)
        left -= n
    return size - left


def sha256_file(path: Path, progress: Progress | None = None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        copy_range(f, path.stat().st_size, [h], progress=progress)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- pack
@dataclass
class Source:
    path: Path  # on disk here
    rel: str  # its path in the carry (and under --to there)
    size: int
    executable: bool
    sha256: str = ""


@dataclass
class Piece:
    index: int  # 1-based over the whole carry: its file name under pieces/
    part: int  # 1-based
    file: int  # index into the sources
    offset: int
    size: int
    sha256: str = ""
    at: int = 0  # --flat: where the piece starts in its part file

    @property
    def name(self) -> str:
        return f"{self.index:06d}"


def collect(paths: list[Path], out: Path) -> list[Source]:
    """The files to carry: a file as its name, a folder as its name and everything below it (links followed)."""
    sources: list[Source] = []
    seen: dict[str, Path] = {}
    out_real = out.resolve()

    def add(path: Path, rel: str) -> None:
        if rel in seen:
            raise CarryError(f"two inputs would both be '{rel}' in the carry ({seen[rel]} and {path}): rename one")
        try:
            st = path.stat()
        except OSError as exc:
            raise CarryError(f"{path}: cannot read it ({exc.strerror}); a broken link?") from exc
        seen[rel] = path
        sources.append(Source(path, rel, st.st_size, bool(st.st_mode & 0o111)))

    for given in paths:
        path = given.resolve()
        label = Path(os.path.abspath(given)).name or path.name  # a link's own name, not its target's
        if not path.exists():
            raise CarryError(f"{given}: no such file or folder")
        if path.is_file():
            add(path, label)
            continue
        if not path.is_dir():
            raise CarryError(f"{given}: neither a file nor a folder")
        if out_real == path or path in out_real.parents:
            raise CarryError(f"--out {out} is inside {given}, which is being packed: choose an --out outside it")
        visited = {path}
        for top, dirs, files in os.walk(path, followlinks=True):
            real = Path(top).resolve()
            keep = []
            for d in sorted(dirs):
                r = (real / d).resolve()
                if r not in visited and r != out_real:
                    visited.add(r)
                    keep.append(d)
            dirs[:] = keep
            for name in sorted(files):
                f = Path(top) / name
                add(f, PurePosixPath(label, Path(top).relative_to(path), name).as_posix())
    return sources


def plan(sources: list[Source], capacity: int) -> tuple[list[Piece], int]:
    """Fill parts of `capacity` bytes with the files in order, splitting a file where a part is full."""
    pieces: list[Piece] = []
    part, free = 1, capacity
    for fi, src in enumerate(sources):
        offset = 0
        while offset < src.size:
            rest = src.size - offset
            if free < rest and free < MIN_PIECE and free < capacity:  # no crumbs: begin the next part
                part, free = part + 1, capacity
            take = min(free, rest)
            pieces.append(Piece(len(pieces) + 1, part, fi, offset, take))
            offset += take
            free -= take
    return pieces, part


def folder_name(name: str, part: int, nparts: int) -> str:
    return f"{name}-part{part:0{max(2, len(str(nparts)))}d}"


def manifest_of(meta: dict, sources: list[Source], pieces: list[Piece], nparts: int) -> dict:
    by_file: dict[int, list[Piece]] = {}
    for p in pieces:
        by_file.setdefault(p.file, []).append(p)
    parts = [
        {
            "part": i,
            "folder": folder_name(meta["name"], i, nparts),
            "bytes": sum(p.size for p in pieces if p.part == i),
            "pieces": sum(1 for p in pieces if p.part == i),
        }
        for i in range(1, nparts + 1)
    ]
    files = [
        {
            "path": s.rel,
            "size": s.size,
            "sha256": s.sha256 or "0" * 64,
            "executable": s.executable,
            "pieces": [
                {
                    "piece": p.name,
                    "folder": folder_name(meta["name"], p.part, nparts),
                    "offset": p.offset,
                    "size": p.size,
                    "sha256": p.sha256 or "0" * 64,
                    **({"at": p.at} if meta.get("layout") == "flat" else {}),
                }
                for p in by_file.get(fi, [])
            ],
        }
        for fi, s in enumerate(sources)
    ]
    body = {**meta, "total_bytes": sum(s.size for s in sources), "parts": parts, "files": files}
    return {**body, "manifest_sha256": manifest_checksum(body)}


def manifest_checksum(body: dict) -> str:
    body = {k: v for k, v in body.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def render(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1) + "\n").encode()


def git(repo: Path, *args: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise CarryError("--project needs git on this side (git archive HEAD)") from exc
    if proc.returncode != 0:
        raise CarryError(f"git {' '.join(args)} in {repo} failed: {proc.stderr.strip()}")
    return proc.stdout


def project_archive(repo: Path, into: Path) -> tuple[Path, dict]:
    """`git archive HEAD` of the repository `repo` is in, as a tar file in `into`, and a note of its commit."""
    top = Path(git(repo, "rev-parse", "--show-toplevel").strip())
    commit = git(top, "rev-parse", "HEAD").strip()
    subject = git(top, "log", "-1", "--format=%s", "HEAD").strip()
    changed = git(top, "--no-optional-locks", "status", "--porcelain", "--untracked-files=no").splitlines()
    tar = into / f"{PROJECT_FOLDER}-{commit[:12]}.tar"
    git(top, "archive", "--format=tar", "-o", str(tar.absolute()), "HEAD")
    note = {
        "file": f"project/{tar.name}",
        "commit": commit,
        "subject": subject[:200],
        "folder": PROJECT_FOLDER,
        "uncommitted_changes": len(changed),
    }
    return tar, note


def part_readme(manifest: dict, part: int) -> bytes:
    nparts = len(manifest["parts"])
    first = manifest["parts"][0]["folder"]
    text = (
        f"Part {part:0{max(2, len(str(nparts)))}d} of {nparts} of the carry '{manifest['name']}' "
        f"(id {manifest['id']}, {manifest['total_bytes']:,} bytes in {len(manifest['files'])} files).\n"
        "Copy every part folder into one place (e.g. /tmp/carry/), then, with any python3 (3.11 or newer):\n"
        f"  python3 /tmp/carry/{first}/{TOOL} unpack /tmp/carry --to DEST\n"
        f"  python3 /tmp/carry/{first}/{TOOL} --help\n"
        f"{MANIFEST} lists every file and piece with its sha256.\n"
    )
    return text.encode()


def fit(meta: dict, sources: list[Source], overhead: int, max_bytes: int) -> tuple[list[Piece], int]:
    """Pieces and the number of parts such that every folder, with the manifest and the small files, stays within
    `max_bytes`. The manifest's size depends on the number of parts, which depends on the room it leaves. Flat part
    files hold pieces only: the manifest is a file of its own."""
    if meta.get("layout") == "flat":
        return plan(sources, max_bytes)
    reserve = overhead + 4096
    for _ in range(20):
        capacity = max_bytes - reserve
        if capacity <= 0:
            raise CarryError(
                f"--max-mib {max_bytes / MIB:g} leaves no room: every folder needs {reserve:,} bytes for the manifest, "
                f"{TOOL} and {README}"
            )
        pieces, nparts = plan(sources, capacity)
        need = overhead + len(render(manifest_of(meta, sources, pieces, nparts)))
        if need <= reserve:
            return pieces, nparts
        reserve = need + 1024
    raise CarryError("could not fit the manifest: raise --max-mib")  # pragma: no cover - settles in a few rounds


def write_parts(staging: list[Path], sources: list[Source], pieces: list[Piece], quiet: bool, flat: bool) -> None:
    """Copy the pieces into the staging folders (or, flat, append them to the staging part files), hashing every
    piece and every whole file on the way."""
    progress = Progress("copying and hashing", sum(s.size for s in sources), quiet)
    by_file: dict[int, list[Piece]] = {}
    for p in pieces:
        by_file.setdefault(p.file, []).append(p)
    for fi, src in enumerate(sources):
        whole = hashlib.sha256()
        with src.path.open("rb") as f:
            for p in by_file.get(fi, []):
                h = hashlib.sha256()
                if flat:
                    p.at = staging[p.part - 1].stat().st_size
                target = staging[p.part - 1] if flat else staging[p.part - 1] / PIECES / p.name
                with target.open("ab" if flat else "wb") as dst:
                    got = copy_range(f, p.size, [h, whole], dst, progress)
                if got != p.size:
                    raise CarryError(f"{src.path} got shorter while being packed: pack again when it is still")
                p.sha256 = h.hexdigest()
            if f.read(1):
                raise CarryError(f"{src.path} grew while being packed: pack again when it is still")
        src.sha256 = whole.hexdigest()
    progress.finish()


def earlier_parts(out: Path, name: str, force: bool) -> list[Path]:
    """Part folders or files of an earlier pack of the same name in `out` (refused unless --force replaces them)."""
    out.mkdir(parents=True, exist_ok=True)
    ours = re.compile(rf"^\.?{re.escape(name)}(-part\d+(\.tmp)?|{re.escape(FLAT_MANIFEST)})$")
    old = sorted(p for p in out.iterdir() if ours.match(p.name))
    if old and not force:
        raise CarryError(
            f"{out} already holds {', '.join(p.name for p in old)}: remove them, pass --force to replace them, "
            "or choose another --name or --out"
        )
    return old


def pack(args: argparse.Namespace) -> int:
    out: Path = args.out
    max_bytes = limit_of(args)
    sources = collect(args.paths, out)
    name = pack_name(args)
    old = earlier_parts(out, name, args.force)
    flat = args.flat
    tool = b"" if flat else Path(__file__).read_bytes()
    staging: list[Path] = []
    workdir = Path(tempfile.mkdtemp(prefix=".carry-work-", dir=out))
    try:
        project = add_project(args.repo, sources, workdir) if args.project else None
        meta = {
            "format": FORMAT,
            "id": uuid.uuid4().hex[:16],
            "name": name,
            "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "max_bytes": max_bytes,
            "layout": "flat" if flat else "folders",
            "project": project,
        }
        pieces, nparts = fit(meta, sources, len(tool) + SMALL_FILES, max_bytes)
        for old_path in old:
            remove(old_path)
        staging = [out / f".{folder_name(name, i, nparts)}.tmp" for i in range(1, nparts + 1)]
        for d in staging:
            remove(d)
            d.write_bytes(b"") if flat else (d / PIECES).mkdir(parents=True)
        write_parts(staging, sources, pieces, args.quiet, flat)
        manifest = manifest_of(meta, sources, pieces, nparts)
        finals = [out / folder_name(name, i, nparts) for i in range(1, nparts + 1)]
        if flat:
            body = render(manifest)
            if len(body) > max_bytes:
                raise CarryError(f"the manifest ({len(body):,} bytes) is over --max-mib {args.max_mib:g}: raise it")
        else:
            for i, d in enumerate(staging, start=1):
                fill_folder(d, manifest, i, tool)
                if folder_bytes(d) > max_bytes:  # pragma: no cover - fit() keeps every part under the limit
                    raise CarryError(f"internal error: {d.name} holds {folder_bytes(d):,} bytes, over {max_bytes:,}")
        for d, final in zip(staging, finals, strict=True):
            d.rename(final)
        staging = []
        if flat:  # last: a manifest beside the part files means they are whole
            tmp = out / f".{name}{FLAT_MANIFEST}.tmp"
            tmp.write_bytes(body)
            tmp.rename(out / f"{name}{FLAT_MANIFEST}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        for d in staging:
            remove(d)
    pack_summary(manifest, finals, args)
    return 0


def limit_of(args: argparse.Namespace) -> int:
    """--max-mib in bytes (fractions allowed), once the arguments make sense."""
    max_bytes = int(args.max_mib * MIB)
    if max_bytes <= 0:
        raise CarryError("--max-mib must be more than 0")
    if not args.paths and not args.project:
        raise CarryError("nothing to pack: give files or folders, or --project")
    return max_bytes


def pack_name(args: argparse.Namespace) -> str:
    """--name, else the one PATH's name, else 'carry' (several PATHs) or 'project' (--project alone)."""
    alone = Path(os.path.abspath(args.paths[0])).name if len(args.paths) == 1 else ""
    name = args.name or alone or ("carry" if args.paths else "project")
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    if not name:
        raise CarryError("--name must hold letters or digits")
    return name


def add_project(repo: Path, sources: list[Source], workdir: Path) -> dict:
    """The committed tree as one more source (a tar in `workdir`); its note for the manifest."""
    tar, project = project_archive(repo, workdir)
    if project["file"] in {s.rel for s in sources}:
        raise CarryError(f"an input is already named {project['file']}")
    sources.append(Source(tar, project["file"], tar.stat().st_size, False))
    return project


def fill_folder(d: Path, manifest: dict, part: int, tool: bytes) -> None:
    """The small files of a part folder: the manifest, this script, which part it is, a README."""
    (d / MANIFEST).write_bytes(render(manifest))
    (d / TOOL).write_bytes(tool)
    info = {"id": manifest["id"], "name": manifest["name"], "part": part, "of": len(manifest["parts"])}
    (d / PART_FILE).write_text(json.dumps(info) + "\n")
    (d / README).write_bytes(part_readme(manifest, part))


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def folder_bytes(folder: Path) -> int:
    """A part folder's bytes, or a flat part file's."""
    if folder.is_file():
        return folder.stat().st_size
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def pack_summary(manifest: dict, finals: list[Path], args: argparse.Namespace) -> None:
    total, project = manifest["total_bytes"], manifest["project"]
    files, flat = len(manifest["files"]), manifest.get("layout") == "flat"
    if flat:
        say(f"packed {files} files, {total:,} bytes ({mib(total)}), into {len(finals)} part files in {args.out}")
        say(
            f"(at most {args.max_mib:g} MiB each) and {manifest['name']}{FLAT_MANIFEST} (id {manifest['id']}): "
            f"{len(finals) + 1} files to bring over"
        )
    else:
        say(f"packed {files} files, {total:,} bytes ({mib(total)}), into {len(finals)} folders under {args.out}")
        say(f"(at most {args.max_mib:g} MiB each; {MANIFEST} (id {manifest['id']}) and {TOOL} are in every folder)")
    width = max(len(f.name) for f in finals)
    say(f"  {'part file' if flat else 'folder':<{width}}  {'size':>11}  {'pieces':>6}  files (whole or in part)")
    for final, part in zip(finals, manifest["parts"], strict=True):
        names = sorted({f["path"] for f in manifest["files"] for p in f["pieces"] if p["folder"] == final.name})
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
        say(f"  {final.name:<{width}}  {mib(folder_bytes(final)):>11}  {part['pieces']:>6}  {shown}")
    if project:
        say(f"project: commit {project['commit'][:12]} ({short(project['subject'])}) as {project['file']}")
        if project["uncommitted_changes"]:
            say(
                f"  note: {project['uncommitted_changes']} tracked files have uncommitted changes: the carry holds "
                "the committed tree of HEAD only"
            )
    say("")
    if flat:
        say(f"On the other side: copy these {len(finals) + 1} files into one folder FOLDER, then, in the project:")
        say(f"  python3 tools/{TOOL} verify FOLDER               # optional: check the copies")
        say(f"  python3 tools/{TOOL} unpack FOLDER --to DEST     # reassemble under DEST, every sha256 checked")
        return
    there = args.there.rstrip("/") or "/"
    first = f"{there}/{finals[0].name}/{TOOL}"
    say(f"On the other side: copy the folders into {there}/ (all at once or one at a time), then:")
    say(f"  python3 {first} verify {there}                # optional: check the copies")
    say(f"  python3 {first} unpack {there} --to DEST       # reassemble under DEST, every sha256 checked")
    if project:
        say(f"  (the project unpacks into DEST/{PROJECT_FOLDER}/)")


# ---------------------------------------------------------------------------------------------- reading parts
@dataclass
class Carry:
    """One pack as found on the receiving side: its manifest and the part folders present."""

    manifest: dict
    present: dict[int, Path] = field(default_factory=dict)  # part number -> folder

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def nparts(self) -> int:
        return len(self.manifest["parts"])

    def label(self, part: int) -> str:
        width = max(2, len(str(self.nparts)))
        return f"part {part:0{width}d} of {self.nparts:0{width}d}"

    def folder(self, part: int) -> str:
        return self.manifest["parts"][part - 1]["folder"]

    def part_of(self, piece: dict) -> int:
        return next(p["part"] for p in self.manifest["parts"] if p["folder"] == piece["folder"])

    @property
    def flat(self) -> bool:
        return self.manifest.get("layout") == "flat"

    def piece_path(self, piece: dict) -> Path:
        """The file holding the piece: its own file in a part folder, or (flat) the part file."""
        part = self.present[self.part_of(piece)]
        return part if self.flat else part / PIECES / piece["piece"]

    def read_piece(self, piece: dict, hashes: list, out=None, progress: Progress | None = None) -> int:
        with self.piece_path(piece).open("rb") as f:
            f.seek(piece.get("at", 0))
            return copy_range(f, piece["size"], hashes, out, progress)


def load_manifest(path: Path) -> dict:
    """The manifest, if it is intact and well-formed; CarryError naming the folder (or flat manifest) otherwise."""
    flat = path.name.endswith(FLAT_MANIFEST)
    where = path.name if flat else path.parent.name
    try:
        data = json.loads(path.read_text())
        ok = isinstance(data, dict) and data.get("format") == FORMAT
        ok = ok and data.get("manifest_sha256") == manifest_checksum(data)
    except (OSError, ValueError, TypeError):
        ok = False
    if not ok:
        shown = where if flat else f"{where}/{MANIFEST}"
        raise CarryError(f"{shown} is damaged (unreadable or its checksum does not match): copy {where} again")
    check_manifest(data, where)
    return data


def check_manifest(m: dict, where: str) -> None:
    """Paths stay under --to, pieces cover each file exactly once, folders are plain names."""
    where = where if where.endswith(FLAT_MANIFEST) else f"{where}/{MANIFEST}"
    folders = [p["folder"] for p in m["parts"]]
    for f in folders:
        if "/" in f or f in {"", ".", ".."}:
            raise CarryError(f"{where} names an odd part folder '{f}': pack again")
    for f in m["files"]:
        rel = PurePosixPath(f["path"])
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or rel.parts[0] == STATE_DIR:
            raise CarryError(f"{where} holds an unsafe path '{f['path']}': pack again")
        offset = 0
        for p in f["pieces"]:
            if p["offset"] != offset or p["folder"] not in folders or not re.fullmatch(r"\d{6,}", p["piece"]):
                raise CarryError(f"{where}: the pieces of {f['path']} do not fit together: pack again")
            offset += p["size"]
        if offset != f["size"]:
            raise CarryError(f"{where}: the pieces of {f['path']} do not add up to its size: pack again")


def find_parts(dirs: list[Path]) -> tuple[list[Path], list[Path]]:
    """Part folders (each DIR that is one, else the part folders directly inside it) and flat manifests (a DIR that
    is one, or those directly inside a DIR)."""
    found: list[Path] = []
    flat: list[Path] = []
    for d in dirs:
        if d.is_file() and d.name.endswith(FLAT_MANIFEST):
            flat.append(d)
            continue
        if not d.is_dir():
            raise CarryError(f"{d}: no such folder")
        if (d / MANIFEST).exists() or (d / PART_FILE).exists():
            found.append(d)
            continue
        inside = sorted(c for c in d.iterdir() if c.is_dir() and ((c / MANIFEST).exists() or (c / PART_FILE).exists()))
        manifests = sorted(c for c in d.iterdir() if c.is_file() and c.name.endswith(FLAT_MANIFEST))
        if not inside and not manifests:
            raise CarryError(
                f"{d}: no part folders here (a part folder holds {MANIFEST}) and no *{FLAT_MANIFEST}: give the "
                "folder the parts were copied into"
            )
        found += inside
        flat += manifests

    def unique(paths: list[Path]) -> list[Path]:
        seen: dict[Path, Path] = {}
        for f in paths:
            seen.setdefault(f.resolve(), f)
        return list(seen.values())

    return unique(found), unique(flat)


@dataclass
class Report:
    """What went wrong, each said with the part folder concerned and what to do."""

    damaged: list[str] = field(default_factory=list)  # exit status 1
    missing: list[str] = field(default_factory=list)  # part folders not here: exit status 3
    notes: list[str] = field(default_factory=list)  # said; no effect on the exit status

    def finish(self, what: str) -> int:
        for line in self.notes:
            print(f"carry: note: {line}", file=sys.stderr, flush=True)
        for line in dict.fromkeys(self.damaged + self.missing):
            print(f"carry: {line}", file=sys.stderr, flush=True)
        if self.damaged:
            say(f"FAILED ({what}): {len(set(self.damaged))} problem(s), each named above with what to do")
            return EXIT_DAMAGED
        if self.missing:
            say(f"INCOMPLETE ({what}): {len(self.missing)} part folder(s) missing, named above")
            return EXIT_INCOMPLETE
        say(f"done ({what})")
        return 0


def gather(dirs: list[Path]) -> tuple[list[Carry], Report]:
    """The carries whose part folders are in `dirs` (several packs may share a place), and what is wrong there."""
    report = Report()
    manifests: dict[str, dict] = {}
    damaged_manifests: dict[Path, str] = {}
    placed: dict[str, dict[int, Path]] = {}
    folders, flat = find_parts(dirs)
    gather_flat(flat, manifests, placed, report)
    for folder in folders:
        info = None
        try:
            info = json.loads((folder / PART_FILE).read_text())
            info = info if isinstance(info, dict) and {"id", "part"} <= info.keys() else None
        except (OSError, ValueError):
            pass
        manifest = None
        if (folder / MANIFEST).exists():
            try:
                manifest = load_manifest(folder / MANIFEST)
                manifests.setdefault(manifest["id"], manifest)
            except CarryError as exc:
                damaged_manifests[folder] = str(exc)
        carry_id = info["id"] if info else manifest["id"] if manifest else None
        part = info["part"] if info else None
        if part is None and manifest is not None:
            part = next((p["part"] for p in manifest["parts"] if p["folder"] == folder.name), None)
        if carry_id is None or part is None:
            report.damaged.append(
                damaged_manifests.pop(folder, f"{folder.name}: {PART_FILE} is unreadable: copy {folder.name} again")
            )
            continue
        placed.setdefault(carry_id, {}).setdefault(int(part), folder)
    carries = []
    for carry_id, present in placed.items():
        if carry_id not in manifests:
            names = ", ".join(sorted(f.name for f in present.values()))
            report.damaged.append(f"no intact {MANIFEST} in {names}: copy one of them again")
            continue
        carries.append(Carry(manifests[carry_id], dict(sorted(present.items()))))
    report.notes += damaged_manifests.values()  # another folder's copy of the manifest serves
    refuse_mixed(carries)
    return sorted(carries, key=lambda c: c.name), report


def gather_flat(paths: list[Path], manifests: dict, placed: dict, report: Report) -> None:
    """Flat manifests and the part files present beside them."""
    for path in paths:
        try:
            manifest = load_manifest(path)
        except CarryError as exc:
            report.damaged.append(str(exc))
            continue
        manifests.setdefault(manifest["id"], manifest)
        here = placed.setdefault(manifest["id"], {})
        for part in manifest["parts"]:
            if (path.parent / part["folder"]).is_file():
                here.setdefault(int(part["part"]), path.parent / part["folder"])


def refuse_mixed(carries: list[Carry]) -> None:
    """Parts of two packs of one name in one place: an old pack left behind; which is meant is not ours to guess."""
    by_name: dict[str, list[Carry]] = {}
    for c in carries:
        by_name.setdefault(c.name, []).append(c)
    for name, same in by_name.items():
        if len(same) > 1:
            listed = "; ".join(
                f"id {c.manifest['id']} packed {c.manifest['created']} ({', '.join(map(str, c.present.values()))})"
                for c in same
            )
            raise CarryError(
                f"parts of {len(same)} different packs named '{name}' are here: {listed}; remove the old ones"
            )


def piece_problem(carry: Carry, f: dict, p: dict) -> str | None:
    """A missing or wrong-sized piece (flat: part file), said with its part and the remedy; None when the size is
    right."""
    where = f"{p['folder']}: piece {p['piece']} of {f['path']} (bytes {p['offset']:,}-{p['offset'] + p['size'] - 1:,})"
    try:
        size = carry.piece_path(p).stat().st_size
    except OSError:
        return f"{where} is missing (the folder is incomplete): copy {p['folder']} again"
    if carry.flat:
        expected = carry.manifest["parts"][carry.part_of(p) - 1]["bytes"]
        if size != expected:
            state = "truncated" if size < expected else "too long"
            return f"{p['folder']} is {state}: {expected:,} bytes expected, {size:,} found: copy {p['folder']} again"
        return None
    if size < p["size"]:
        return f"{where} is truncated: {p['size']:,} bytes expected, {size:,} found: copy {p['folder']} again"
    if size > p["size"]:
        return f"{where} is too long: {p['size']:,} bytes expected, {size:,} found: copy {p['folder']} again"
    return None


def wrong_hash(f: dict, p: dict, got: str) -> str:
    return (
        f"{p['folder']}: piece {p['piece']} of {f['path']} has the wrong sha256 (expected {p['sha256'][:16]}..., "
        f"found {got[:16]}...): the copy is damaged: copy {p['folder']} again"
    )


def missing_lines(carry: Carry, missing: dict[int, list[str]], where: str) -> list[str]:
    lines = []
    for part in sorted(missing):
        files = missing[part]
        needed = ""
        if files:
            needed = f" (needed by {', '.join(files[:3])}{f' and {len(files) - 3} more' if len(files) > 3 else ''})"
        lines.append(
            f"{carry.label(part)} ({carry.folder(part)}) is missing: copy it again (into {where}) and rerun{needed}"
        )
    return lines


def place(dirs: list[Path]) -> str:
    """Where the part folders are copied to, for messages."""
    if len(dirs) == 1 and not ((dirs[0] / MANIFEST).exists() or (dirs[0] / PART_FILE).exists()):
        return str(dirs[0])
    parents = {str(d.parent) for d in dirs}
    return parents.pop() if len(parents) == 1 else "the same place as the others"


# ---------------------------------------------------------------------------------------------- verify
def verify(args: argparse.Namespace) -> int:
    carries, report = gather(args.dirs)
    for carry in carries:
        pieces = [(f, p) for f in carry.manifest["files"] for p in f["pieces"] if carry.part_of(p) in carry.present]
        total = sum(p["size"] for _, p in pieces)
        say(f"{carry.name} (id {carry.manifest['id']}): {len(carry.present)} of {carry.nparts} parts here")
        progress = Progress("hashing", total, args.quiet)
        bad = []
        for f, p in pieces:
            problem = piece_problem(carry, f, p)
            if problem is None:
                h = hashlib.sha256()
                carry.read_piece(p, [h], progress=progress)
                problem = None if h.hexdigest() == p["sha256"] else wrong_hash(f, p, h.hexdigest())
            if problem:
                bad.append(problem)
        progress.finish()
        if not bad:
            say(f"  {len(pieces)} pieces, {total:,} bytes: every size and sha256 matches")
        report.damaged += bad
        absent = [i for i in range(1, carry.nparts + 1) if i not in carry.present]
        if absent:
            say(f"  not here, not checked: {', '.join(carry.folder(i) for i in absent)}")
            if args.all:
                report.missing += missing_lines(carry, {i: [] for i in absent}, place(args.dirs))
    return report.finish("verify")


# ---------------------------------------------------------------------------------------------- unpack
class State:
    """DEST/.carry-state/<name>-<id>.json: the files assembled and checked, with their size and mtime, so that a
    rerun need not hash them again. A file changed since is checked again."""

    def __init__(self, dest: Path, carry: Carry) -> None:
        self.path = dest / STATE_DIR / f"{carry.name}-{carry.manifest['id']}.json"
        try:
            self.files: dict[str, dict] = json.loads(self.path.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError):
            self.files = {}

    def fresh(self, path: Path, f: dict) -> bool:
        try:
            st = path.stat()
        except OSError:
            return False
        return self.files.get(f["path"]) == {"sha256": f["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def record(self, path: Path, f: dict) -> None:
        st = path.stat()
        self.files[f["path"]] = {"sha256": f["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"files": self.files}, indent=1))
        os.replace(tmp, self.path)


def assemble(carry: Carry, f: dict, dest: Path, progress: Progress) -> str | None:
    """Write the file from its pieces under a temporary name, checking every piece's and the whole file's sha256;
    rename it into place only when all match. A problem (naming the part folder and the remedy) or None."""
    if dest.is_dir():
        return f"{dest} is a folder, where the carry has the file {f['path']}: move it away and rerun"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.carry-tmp")
    whole = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for p in f["pieces"]:
                h = hashlib.sha256()
                got = carry.read_piece(p, [h, whole], out, progress)
                if got != p["size"]:
                    return f"{p['folder']}: piece {p['piece']} of {f['path']} changed while being read: rerun"
                if h.hexdigest() != p["sha256"]:
                    return wrong_hash(f, p, h.hexdigest())
        if whole.hexdigest() != f["sha256"]:
            return (
                f"{f['path']}: the assembled file has sha256 {whole.hexdigest()[:16]}..., the manifest says "
                f"{f['sha256'][:16]}...: the pack is inconsistent: pack it again on the sending side"
            )
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, (0o777 if f.get("executable") else 0o666) & ~umask)
        os.replace(tmp, dest)
        return None
    finally:
        tmp.unlink(missing_ok=True)


def extract_project(carry: Carry, dest: Path, tar_entry: dict) -> tuple[str | None, str | None]:
    """The carried project tar unpacked into DEST/captain_ros/, once per commit: (what was done, problem)."""
    project = carry.manifest["project"]
    folder = dest / project["folder"]
    note = f"{project['commit']}\n{tar_entry['sha256']}\n"
    if (folder / COMMIT_NOTE).is_file():
        held = (folder / COMMIT_NOTE).read_text()
        if held == note:
            return None, None
        return None, (
            f"{folder} holds another commit ({held.split()[0][:12] if held.split() else '?'}), this carry has "
            f"{project['commit'][:12]}: move it away or unpack --to another folder"
        )
    if folder.exists():
        return None, f"{folder} exists and is not a carried project: move it away or unpack --to another folder"
    tmp = dest / f".{project['folder']}.carry-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with tarfile.open(dest / project["file"]) as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(tmp, filter="data")
            else:  # pragma: no cover - Python 3.11 before 3.11.4
                for member in archive.getmembers():
                    name = PurePosixPath(member.name)
                    if name.is_absolute() or ".." in name.parts or member.issym() or member.islnk():
                        return None, f"{project['file']} holds an unsafe member '{member.name}': pack again"
                archive.extractall(tmp)
        (tmp / COMMIT_NOTE).write_text(note)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f"project: commit {project['commit'][:12]} ({short(project['subject'])}) unpacked into {folder}", None


def sort_files(carry: Carry, dest: Path, state: State, report: Report) -> tuple[list[dict], dict, int]:
    """The files to assemble now, those waiting for part folders (by part), and how many are done already."""
    waiting: dict[int, list[str]] = {}
    todo, skipped = [], 0
    for f in carry.manifest["files"]:
        if state.fresh(dest / f["path"], f):
            skipped += 1
            continue
        absent = sorted({carry.part_of(p) for p in f["pieces"]} - carry.present.keys())
        for n in absent:
            waiting.setdefault(n, []).append(f["path"])
        if not absent:
            todo.append(f)
        else:  # say now what else must be copied again for it (sizes only: the hashes are checked when it is whole)
            here = [q for p in f["pieces"] if carry.part_of(p) not in absent and (q := piece_problem(carry, f, p))]
            report.damaged += here
    return todo, waiting, skipped


def unpack_carry(carry: Carry, dest: Path, args: argparse.Namespace, report: Report) -> None:
    m = carry.manifest
    say(
        f"{carry.name} (id {m['id']}): {len(m['files'])} files, {m['total_bytes']:,} bytes; "
        f"{len(carry.present)} of {carry.nparts} parts here; into {dest}"
    )
    state = State(dest, carry)
    todo, waiting, skipped = sort_files(carry, dest, state, report)
    done = 0
    progress = Progress("checking and copying", sum(f["size"] for f in todo), args.quiet)
    for f in todo:
        target = dest / f["path"]
        if target.is_file() and target.stat().st_size == f["size"] and sha256_file(target) == f["sha256"]:
            progress.add(f["size"])  # there already (a run that stopped before noting it, or a copy)
            state.record(target, f)
            skipped += 1
            continue
        problems = list(dict.fromkeys(q for p in f["pieces"] if (q := piece_problem(carry, f, p))))
        if not problems:
            problem = assemble(carry, f, target, progress)
            problems = [problem] if problem else []
        if problems:
            report.damaged += problems
            continue
        state.record(target, f)
        done += 1
        say(f"  ok  {f['path']}  ({f['size']:,} bytes, sha256 {f['sha256'][:16]}...)")
    progress.finish()
    held = {path for files in waiting.values() for path in files}
    say(f"  {done} assembled, {skipped} already there and checked, {len(held)} waiting for part folders")
    report.missing += missing_lines(carry, waiting, place(args.dirs))
    project = m.get("project")
    if project:
        tar_entry = next(f for f in m["files"] if f["path"] == project["file"])
        if state.fresh(dest / project["file"], tar_entry):
            message, problem = extract_project(carry, dest, tar_entry)
            if message:
                say(f"  {message}")
            if problem:
                report.damaged.append(problem)


def unpack(args: argparse.Namespace) -> int:
    args.to.mkdir(parents=True, exist_ok=True)
    carries, report = gather(args.dirs)
    for carry in carries:
        unpack_carry(carry, args.to, args, report)
    return report.finish(f"unpack into {args.to}")


# ---------------------------------------------------------------------------------------------- command line
def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="carry.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "pack",
        help="split files and folders into part folders under a size limit",
        description="Split PATHs (files or folders; --project for the committed tree) into OUT/<name>-partNN/ "
        "folders of at most --max-mib each, with the manifest and this script in every folder.",
    )
    p.add_argument("paths", nargs="*", type=Path, metavar="PATH", help="files or folders to carry")
    p.add_argument("--out", type=Path, required=True, help="where the part folders are written")
    p.add_argument("--max-mib", type=float, default=60.0, help="size limit of one folder, in MiB (default: 60)")
    p.add_argument("--name", help="the folders' name prefix (default: the one PATH's name, else 'carry')")
    p.add_argument(
        "--project",
        action="store_true",
        help=f"add the repository's committed tree (git archive HEAD, with its commit); unpacks into "
        f"DEST/{PROJECT_FOLDER}/",
    )
    p.add_argument(
        "--repo",
        type=Path,
        default=Path(__file__).resolve().parent,
        help="the repository --project archives (default: the one this script is in)",
    )
    p.add_argument(
        "--flat",
        action="store_true",
        help="write part files (not folders) directly in --out, each at most --max-mib, and one manifest file "
        "beside them: for bringing small things (an adapter) back through a channel that limits files",
    )
    p.add_argument("--force", action="store_true", help="replace part folders of the same name in --out")
    p.add_argument(
        "--there", default="/tmp/carry", help="where the folders go on the other side, for the printed commands"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=pack)

    u = sub.add_parser(
        "unpack",
        help="check the pieces and put the files back together",
        description="Check each piece's size and sha256, reassemble the files under --to and check each file's "
        "sha256. Rerun it as parts arrive: finished files are skipped; files whose parts are missing wait, and "
        "the missing part folders are named (exit status 3).",
    )
    u.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="part folders, or a folder that holds them")
    u.add_argument("--to", type=Path, required=True, help="where the files go (made if needed)")
    u.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    u.set_defaults(func=unpack)

    v = sub.add_parser(
        "verify",
        help="check the pieces (size and sha256) without reassembling",
        description="Check every piece of the part folders here. Folders not here are listed, not checked, "
        "unless --all asks for every part.",
    )
    v.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="part folders, or a folder that holds them")
    v.add_argument("--all", action="store_true", help="every part folder must be here (exit status 3 if not)")
    v.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    v.set_defaults(func=verify)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CarryError as exc:
        print(f"carry: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_DAMAGED


if __name__ == "__main__":
    sys.exit(main())
