"""The owner-only result of certification: per query, the served model's class and its
stability radius, with the provenance a release needs (agt/certify/__init__.py).

`Certificate.summary` condenses it for a person (accuracy against labels, certified
fraction per k, radius quantiles) and `Certificate.plot` draws it (agt/plots.py, the figure
of ``agt certify --plot``); both stay owner-only, as the certificate does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from agt.errors import DataError

#: the radius quantiles `Certificate.summary` reports
RADIUS_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def summary_ks(k_values: Sequence[int], limit: int = 12) -> list[int]:
    """A readable subset of a k grid: all of it if short, else its ends and round values.

    Args:
        k_values: an ascending k grid.
        limit: the most values a grid may have to be shown whole.

    Returns:
        The k values to show, ascending.
    """
    k_values = list(k_values)
    if len(k_values) <= limit:
        return k_values
    picks = {k_values[0], k_values[-1]}
    for target in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000):
        candidates = [k for k in k_values if k <= target]
        if candidates:
            picks.add(candidates[-1])
    return sorted(picks)


@dataclass(frozen=True)
class CertificateSummary:
    """What a certificate says, in a few numbers (owner-only: functions of the radii).

    Attributes:
        n_queries: the number of queries certified.
        accuracy: the served model's accuracy against the labels given to
            `Certificate.summary`, None without labels.
        certified_fraction: k -> fraction of queries certified at k, for every k of the grid.
        radius_quantiles: q -> the q-quantile of the stability radii (an observed radius;
            -1 is a query not certified even at k = 0).
        uncertified: the number of queries with radius -1.
        contiguous: whether the grid is {0, 1, ..., K}, so that a radius is a number of
            records (else a grid index).
    """

    n_queries: int
    accuracy: float | None
    certified_fraction: dict[int, float]
    radius_quantiles: dict[float, int]
    uncertified: int
    contiguous: bool

    def __str__(self) -> str:
        unit = "records" if self.contiguous else "grid index"
        lines = [f"{self.n_queries} queries (owner-only summary)"]
        if self.accuracy is not None:
            lines.append(f"  accuracy vs labels: {self.accuracy:.4f}")
        lines.append(f"  not certified at k = 0: {self.uncertified}")
        lines.append("  radius quantiles (" + unit + "): " + ", ".join(
            f"q{round(q * 100)} {r}" for q, r in self.radius_quantiles.items()))
        lines.append("  certified fraction:")
        lines += [f"    k={k:<6d} {self.certified_fraction[k]:.4f}"
                  for k in summary_ks(list(self.certified_fraction))]
        return "\n".join(lines)


@dataclass(frozen=True, repr=False)
class Certificate:
    """Per-query predictions and stability radii of one bundle (owner-only).

    Attributes:
        prediction: (Q,) int64, the served nominal model's class.
        max_certified_k: (Q,) int64, the largest certified grid value, -1 if none.
        radius: (Q,) int64, the stability radius (grid index of `max_certified_k`, -1 if
            none), what the mechanisms spend.
        k_values: the bundle's k grid.
        contiguous: whether the grid is {0, 1, ..., K} (radius = number of records).
        n_classes: the number of classes.
        source_id: the bundle's id.
        dataset_sha256: the private dataset that releases from it spend privacy of.
        relations: the neighbouring relations the bounds hold under.
        smooth_radii: whether the radii come from a selection rule with a nesting proof.
        selection: the bundle's top-k selection rule.
    """

    prediction: np.ndarray
    max_certified_k: np.ndarray | None
    radius: np.ndarray | None
    k_values: tuple[int, ...]
    contiguous: bool
    n_classes: int = 2
    source_id: str = ""
    dataset_sha256: str = ""
    relations: tuple[str, ...] = ("replace-one",)
    smooth_radii: bool = True
    selection: str = "exact"

    def certified_fraction(self) -> dict[int, float]:
        """Fraction of queries certified at each k of the grid.

        Returns:
            k -> the fraction of queries whose largest certified k is at least k.
        """
        q = max(1, len(self.prediction))
        return {k: float((self.max_certified_k >= k).sum()) / q for k in self.k_values}

    def summary(self, labels=None) -> CertificateSummary:
        """Accuracy, certified fraction per k and radius quantiles (owner-only).

        Args:
            labels: optional true labels of the queries, shape (Q,), to report the served
                model's accuracy against.

        Returns:
            A `CertificateSummary`; ``print`` it for a short table.

        Raises:
            DataError: `labels` does not have one label per query.
        """
        accuracy = None
        if labels is not None:
            y = np.asarray(labels).reshape(-1)
            if y.shape[0] != len(self.prediction):
                raise DataError(f"summary(labels=...) got {y.shape[0]} labels for "
                                f"{len(self.prediction)} queries; pass one label per query")
            accuracy = float((self.prediction == y).mean()) if y.size else None
        radius = np.asarray(self.radius)
        quantiles = ({q: int(np.quantile(radius, q, method="inverted_cdf"))
                      for q in RADIUS_QUANTILES} if radius.size else {})
        return CertificateSummary(
            n_queries=len(self.prediction), accuracy=accuracy,
            certified_fraction=self.certified_fraction(), radius_quantiles=quantiles,
            uncertified=int((radius < 0).sum()), contiguous=self.contiguous)

    def plot(self, path=None):
        """The certified-fraction curve and the radius histogram (``agt certify --plot``).

        Args:
            path: optional PNG, PDF or SVG file to save the figure to.

        Returns:
            The `matplotlib.figure.Figure` (a notebook shows it; owner-only).
        """
        from agt.plots import certification_figure, save_figure

        fig = certification_figure(self)
        if path is not None:
            save_figure(fig, path)
        return fig

    def __repr__(self) -> str:
        ks = self.k_values
        grid = f"{ks[0]}..{ks[-1]}" if self.contiguous and ks else \
            f"{len(ks)} values {ks[0]}..{ks[-1]}" if ks else "empty"
        return (f"Certificate({len(self.prediction)} queries, {self.n_classes} classes, "
                f"k grid {grid}, relations {', '.join(self.relations)}, "
                f"{'smooth' if self.smooth_radii else 'non-smooth'} radii, "
                f"bundle {self.source_id or '?'}; owner-only, summary() for numbers)")
