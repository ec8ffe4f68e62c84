"""ORACLE segmentation for LIBERO scenes: masks from the simulator's own object ids. A labelled variant, never the
default: it puts ground truth inside perception, so any figure measured with it says "oracle segmentation".

What it stands in for is the text-prompted segmentation model a deployment would run (SAM-style, the HTTP protocol
of perception/remote.py): it answers `masks(rgb, text)` like `HttpSegmenter`, with one mask per LIBERO object or
fixture whose name shares the query's words. It exists so that the rest of the harness (geometry from depth, grasp
planning, guarded motion, the receipts, LIBERO's predicates) can be measured on LIBERO before the built-in
segmenter names LIBERO's objects. Depth, calibration and everything downstream stay the ordinary path.
"""

from __future__ import annotations

import numpy as np

from captain_ros.core.contract import FailureCategory
from captain_ros.libero.libero_backend import LiberoBackend, image_digest
from captain_ros.perception.appearance import words
from captain_ros.perception.observation import PerceptionError

MIN_SCORE = 0.5  # at least half the query's words in the object's name


class OracleSegmenter:
    url = "ORACLE LIBERO segmentation (simulator object ids)"

    def __init__(self, backend: LiberoBackend):
        if not backend.oracle_segmentation:
            raise ValueError("the LIBERO backend must be made with oracle_segmentation=True to serve an oracle")
        self.backend = backend

    def masks(self, rgb: np.ndarray, text: str) -> list[tuple[float, np.ndarray]]:
        found = self.backend.labels.get(image_digest(rgb))
        if found is None:
            raise PerceptionError(
                FailureCategory.BACKEND_ERROR,
                "the oracle segmenter has no labels for this image (not a LIBERO capture)",
            )
        labels, names = found
        query = words(text)
        if not query:
            return []
        scored = []
        for i, name in enumerate(names):
            score = len(query & words(name)) / len(query)
            mask = labels == i
            if score >= MIN_SCORE and mask.any():
                scored.append((score, int(mask.sum()), mask))
        scored.sort(key=lambda s: (-s[0], -s[1]))
        return [(score, mask) for score, _, mask in scored]
