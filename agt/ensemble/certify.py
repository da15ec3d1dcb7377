"""Certify queries against every teacher of an ensemble (owner-only votes and radii; the
vote arithmetic and the ensemble radius live in mechanisms/ensemble.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from agt.certify import Certifier
from agt.ensemble.partition import ENSEMBLE_RELATIONS
from agt.ensemble.store import Ensemble


@dataclass(frozen=True)
class EnsembleCertificate:
    """Per-query certification of an ensemble (Q queries, T teachers), owner-only.

    teacher_predictions / teacher_radii / teacher_max_k: (Q, T) nominal votes, stability
    radii (grid index, -1 where k = 0 does not certify) and largest certified k of every
    teacher. Votes, the ensemble answer and the ensemble radius are computed from these by
    mechanisms/ensemble.py; the provenance fields are those of `agt.certify.Certificate`.
    """

    teacher_predictions: np.ndarray
    teacher_radii: np.ndarray | None
    teacher_max_k: np.ndarray | None
    k_values: tuple[int, ...]
    contiguous: bool
    n_classes: int = 2
    source_id: str = ""
    dataset_sha256: str = ""
    relations: tuple[str, ...] = ENSEMBLE_RELATIONS
    smooth_radii: bool = True
    selection: str = "exact"
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def n_teachers(self) -> int:
        """The number of teachers T."""
        return int(self.teacher_predictions.shape[1])


class EnsembleCertifier:
    """Certify queries against every teacher (agt/certify/)."""

    def __init__(self, ensemble: Ensemble, device: str = "cpu", training_data=None):
        """``training_data``: the ensemble's whole training split; every teacher (a linear
        head from the interval pass) is then also certified by the margin bound along its
        training run on its own part (agt/trajectory.py; teachers are replace-one only)."""
        self.ensemble = ensemble
        trajectories = [None] * len(ensemble.bundles)
        if training_data is not None:
            trajectories = self._trajectories(training_data)
        self.certifiers = [Certifier(b, device=device, trajectory=tr)
                           for b, tr in zip(ensemble.bundles, trajectories)]

    def _trajectories(self, ds) -> list:
        from agt.ensemble.partition import teacher_dataset
        from agt.errors import DataError
        from agt.trajectory import TrajectoryBounds
        if ds.sha256() != self.ensemble.manifest["dataset_sha256"]:
            raise DataError("this dataset is not the ensemble's training split (its sha256 "
                            "differs from the manifest's dataset_sha256)")
        T = len(self.ensemble.bundles)
        return [TrajectoryBounds(b, teacher_dataset(ds, t, T))
                for t, b in enumerate(self.ensemble.bundles)]

    def predict_teachers(self, x) -> np.ndarray:
        """Every teacher's nominal class per query (no certification).

        Args:
            x: the queries, (Q, *features).

        Returns:
            (Q, T) int64 votes.
        """
        return np.stack([c.predict(x) for c in self.certifiers], axis=1).astype(np.int64)

    def certify(self, x, radii: bool = True) -> EnsembleCertificate:
        """Every teacher's certificate of the queries (owner-only).

        Args:
            x: the queries, (Q, *features).
            radii: False for votes only (radii None), for releases that spend none.

        Returns:
            An `EnsembleCertificate` (teacher predictions and radii).
        """
        t0 = time.perf_counter()
        certs = [c.certify(x, radii=radii) for c in self.certifiers]
        ens = self.ensemble

        def stack(field):
            if not radii:
                return None
            return np.stack([getattr(c, field) for c in certs], axis=1).astype(np.int64)

        return EnsembleCertificate(
            np.stack([c.prediction for c in certs], axis=1).astype(np.int64),
            stack("radius"), stack("max_certified_k"),
            certs[0].k_values, certs[0].contiguous, ens.spec.n_classes, ens.ensemble_id,
            ens.manifest["dataset_sha256"], tuple(ens.relations),
            all(c.smooth_radii for c in certs), certs[0].selection,
            {"seconds": time.perf_counter() - t0})
