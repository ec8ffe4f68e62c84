"""moveit_py/moveit/utils.py: get_launch_params_filepaths."""

from __future__ import annotations

import sys


def get_launch_params_filepaths(cli_args: list[str] | None = None) -> list[str]:
    """The path after each --params-file argument."""
    args = sys.argv if cli_args is None else cli_args
    return [args[i + 1] for i, v in enumerate(args[:-1]) if v == "--params-file"]
