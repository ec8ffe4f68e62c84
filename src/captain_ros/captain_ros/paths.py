"""Where the package's shared files (launch/, config/, urdf/) live.

In a source checkout or an editable install they are read from the repository, so edits take
effect without reinstalling; in a colcon/ament install they come from share/captain_ros.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

PACKAGE = "captain_ros"


@cache
def share_dir() -> Path:
    source_root = Path(__file__).resolve().parents[1]
    if (source_root / "package.xml").is_file() and (source_root / "config").is_dir():
        return source_root
    from ament_index_python.packages import get_package_share_directory

    return Path(get_package_share_directory(PACKAGE))


def config_path(name: str) -> Path:
    return share_dir() / "config" / name


def urdf_path(name: str) -> Path:
    return share_dir() / "urdf" / name
