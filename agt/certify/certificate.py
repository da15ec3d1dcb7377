"""The owner-only result of certification: per query, the served model's class and its
stability radius, with the provenance a release needs (agt/certify/__init__.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Certificate:
    prediction: np.ndarray          # (Q,) int64: the served nominal model's class
    max_certified_k: np.ndarray | None   # (Q,) int64: largest certified grid value, -1 if none
    radius: np.ndarray | None       # (Q,) int64: stability radius (grid index, -1 if none)
    k_values: tuple[int, ...]
    contiguous: bool
    n_classes: int = 2
    source_id: str = ""             # the bundle's id
    dataset_sha256: str = ""        # the private dataset releases from it spend privacy of
    relations: tuple[str, ...] = ("replace-one",)
    smooth_radii: bool = True       # radii from a selection rule with a nesting proof
    selection: str = "exact"

    def certified_fraction(self) -> dict[int, float]:
        """Fraction of queries certified at each k of the grid."""
        q = max(1, len(self.prediction))
        return {k: float((self.max_certified_k >= k).sum()) / q for k in self.k_values}
