"""A fake moveit-py, built from moveit2's moveit_py stubs and bindings (README.md beside this package).

moveit_py/moveit/__init__.py: `from moveit.core import *`, `from moveit.planning import *`, and utils'
get_launch_params_filepaths."""

from moveit import core, planning
from moveit.utils import get_launch_params_filepaths

__all__ = ["core", "get_launch_params_filepaths", "planning"]
