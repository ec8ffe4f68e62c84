"""`captain-ros rviz-config [--check]`: write (or check) the rviz2 configuration of every shipped robot profile,
config/rviz/<profile>.rviz (captain_ros.core.rviz_config renders them)."""

from __future__ import annotations

import argparse

from captain_ros.core import rviz_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="captain-ros rviz-config", description=rviz_config.__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report out-of-date files (exit 1 if any)")
    args = parser.parse_args(argv)
    stale = rviz_config.write_all(check=args.check)
    verb = "out of date" if args.check else "written"
    print(f"{verb}: {', '.join(stale)}" if stale else "every profile's rviz configuration is up to date")
    return 1 if args.check and stale else 0
