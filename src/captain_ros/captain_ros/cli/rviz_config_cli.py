"""`python -m captain_ros.cli.rviz_config_cli [--check]`: write (or check) the rviz2 configuration of every shipped
robot profile, config/rviz/<profile>.rviz (captain_ros.core.rviz_config renders them). `python -m
captain_ros.core.rviz_config`, the name the docs and the files' header give, runs this too."""

from __future__ import annotations

import argparse
import sys

from captain_ros.core import rviz_config


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=rviz_config.__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report out-of-date files (exit 1 if any)")
    args = parser.parse_args(argv)
    stale = rviz_config.write_all(check=args.check)
    verb = "out of date" if args.check else "written"
    print(f"{verb}: {', '.join(stale)}" if stale else "every profile's rviz configuration is up to date")
    if args.check and stale:
        sys.exit(1)


if __name__ == "__main__":
    main()
