"""The LIBERO world: LIBERO's scenes in a LIBERO server (`.venv-libero`). Its backend is `LiberoBackend`
(`libero_backend.py`), its link `LiberoLink` (`link.py`), its privileged-state source `LiberoPrivileged`
(`privileged.py`: object poses, fixture joints, the goal predicates). Tasks are `<suite>/<index>`, start states the
official initial states, the evaluation split CaPtain's held-out 11-16 (`link.py`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from captain_ros.worlds import World, WorldOptions, register_world

# how perception names LIBERO's objects -> LiberoLink options; the first is the default (no simulator state in it)
SEGMENTATIONS = {
    "appearance": {"appearance": True},
    "colour_shape": {"appearance": False},
    "oracle": {"oracle_segmentation": True},  # ORACLE: the simulator's object ids segment the images
}
SUITES = ("libero_spatial", "libero_object", "libero_goal")  # CaPtain's evaluation suites, the default


@register_world("libero")
class LiberoWorld(World):
    segmentations = tuple(SEGMENTATIONS)

    def describe(self, options: WorldOptions) -> str:
        return f"LIBERO ({self.segmentation(options)} segmentation)"

    def tasks(self, selection: str, options: WorldOptions) -> list[str]:
        from captain_ros.libero.link import list_tasks

        return list_tasks(list(options.suites or SUITES), selection, log_dir=options.log_dir)

    def start_states(self, task: str, split: str, count: int, rng: np.random.Generator) -> list[str]:
        from captain_ros.libero.link import start_states

        return start_states(split, count, rng)

    def group_id(self, task: str, start: str) -> str:
        return f"{task}/{start}"  # an initial state's index is the same number in every task

    def defaults(self, split: str) -> tuple[int, int]:
        """A LIBERO evaluation is CaPtain's protocol: every held-out state 11-16, once."""
        return (6, 1) if split == "eval" else (2, 4)

    def backend_class(self) -> type:
        from captain_ros.libero.libero_backend import LiberoBackend

        return LiberoBackend

    def link_class(self) -> type:
        from captain_ros.libero.link import LiberoLink

        return LiberoLink

    def link(self, harness: Any, options: WorldOptions, worker: str) -> Any:
        segmentation = self.segmentation(options)
        log_dir = options.log_dir / f"libero-{worker}" if options.log_dir else None
        return self.link_class()(harness, log_dir=log_dir, **SEGMENTATIONS[segmentation])

    def privileged(self, link: Any) -> Any:
        from captain_ros.libero.privileged import LiberoPrivileged

        return LiberoPrivileged(link)
