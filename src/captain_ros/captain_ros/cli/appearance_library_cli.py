"""`captain-ros appearance-library [--force] [--path FILE]`: build (or load) the appearance library of LIBERO's objects
(captain_ros.libero.appearance_library) and list its models."""

from __future__ import annotations

import argparse
from pathlib import Path

from captain_ros.libero import appearance_library


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="captain-ros appearance-library", description=appearance_library.__doc__.split("\n\n")[0]
    )
    parser.add_argument("--force", action="store_true", help="render again even if the cached library exists")
    parser.add_argument(
        "--path",
        type=Path,
        default=appearance_library.CACHE,
        help=f"where the library is kept (default {appearance_library.CACHE})",
    )
    args = parser.parse_args(argv)
    lib = appearance_library.library(args.path, force=args.force)
    print(f"{len(lib.names)} models ({lib.source}, {appearance_library.assets_dir()}), kept in {args.path}:")
    print(", ".join(n.replace("_", " ") for n in lib.names))
    return 0
