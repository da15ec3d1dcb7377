"""Input scale: a per-feature affine map fixed by public information, recorded in the bundle.

AGT's interval bounds and a plain learning rate both assume features of roughly unit scale;
on raw features (areas in the thousands next to ratios below one) a model can end up
predicting the majority class only. The map here is

    x' = (x - shift) / scale        (elementwise; shift, scale broadcast over the features)

with `shift`, `scale` taken from **public** data (`InputScale.from_public`: mean and
standard deviation of a public sample of the task) or from **fixed bounds** known a priori
(`InputScale.from_bounds`: [low, high] -> [-1, 1]). Never from the private training set: its
mean and deviation change when one record changes, so the map, and with it every certified
radius and the served model, would depend on the private data outside AGT's bounds.

`agt.train(..., input_scale=...)` (``agt train --scale-from public.npz``) trains on the
scaled records and records the map in the bundle; the certifier applies it to every query
(`agt.certify.Certifier`), so certification, ``agt predict`` and the service take queries
in the original units. The dataset hash stays that of the original records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agt.errors import DataError

#: a feature whose public standard deviation is below this (or not finite) is only shifted
MIN_DEVIATION = 1e-12


@dataclass(frozen=True, eq=False)
class InputScale:
    """x' = (x - shift) / scale per feature, fixed by public data or a priori bounds.

    Attributes:
        shift: float64, shape () or the feature shape.
        scale: float64 > 0, the same shape as `shift`.
        source: where the numbers came from (a public file, "fixed bounds"), for the record.
    """

    shift: np.ndarray
    scale: np.ndarray
    source: str = ""

    def __post_init__(self) -> None:
        shift = np.asarray(self.shift, dtype=np.float64)
        scale = np.asarray(self.scale, dtype=np.float64)
        if shift.shape != scale.shape:
            raise DataError(f"input scale: shift has shape {shift.shape}, scale {scale.shape}; "
                            f"give both for the same features")
        if not (np.isfinite(shift).all() and np.isfinite(scale).all() and (scale > 0).all()):
            raise DataError("input scale: shift must be finite and scale finite and > 0")
        object.__setattr__(self, "shift", shift)
        object.__setattr__(self, "scale", scale)

    @staticmethod
    def from_public(x, *, source: str = "public data") -> "InputScale":
        """Standardise by the mean and standard deviation of public records.

        Args:
            x: public records of the task, shape (n, *features); never the private set.
            source: a note stored in the bundle (e.g. the file name).

        Returns:
            The `InputScale` (a feature with no spread is only shifted).

        Raises:
            DataError: fewer than two records, or a NaN or infinite value.
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim < 2 or x.shape[0] < 2:
            raise DataError(f"input scale from public data needs at least 2 records of shape "
                            f"(n, *features), got shape {x.shape}")
        if not np.isfinite(x).all():
            raise DataError("input scale: the public records contain NaN or infinite values")
        std = x.std(axis=0)
        std = np.where(np.isfinite(std) & (std > MIN_DEVIATION), std, 1.0)
        return InputScale(x.mean(axis=0), std, source)

    @staticmethod
    def from_bounds(low, high, *, source: str = "fixed bounds") -> "InputScale":
        """Map the a-priori range [low, high] of every feature onto [-1, 1].

        Args:
            low: lower bound, a number or one per feature (known without the private data,
                e.g. 0 for pixel intensities).
            high: upper bound, same shape, > low.
            source: a note stored in the bundle.

        Returns:
            The `InputScale`.

        Raises:
            DataError: high <= low somewhere, or a bound that is not finite.
        """
        low = np.asarray(low, dtype=np.float64)
        high = np.asarray(high, dtype=np.float64)
        if low.shape != high.shape or not (high > low).all():
            raise DataError("input scale bounds need low < high, of the same shape")
        return InputScale((low + high) / 2, (high - low) / 2, source)

    @staticmethod
    def from_npz(path, *, split: str = "train") -> "InputScale":
        """`from_public` of a public npz file's ``x_<split>`` (else ``x``).

        Args:
            path: the public file (never the private training file).
            split: which array to read, ``x_<split>`` first.

        Returns:
            The `InputScale`, its source the file's name.

        Raises:
            DataError: the file is missing or holds no usable records.
        """
        from agt.data import load_npz_queries

        x, _ = load_npz_queries(path, split=split)
        return InputScale.from_public(x, source=f"public statistics of {Path(path).name}")

    def apply(self, x) -> np.ndarray:
        """The scaled records, float64.

        Args:
            x: records of shape (n, *features) in the original units.

        Returns:
            (x - shift) / scale, float64, the same shape.

        Raises:
            DataError: the feature shape does not match the scale's.
        """
        x = np.asarray(x, dtype=np.float64)
        if self.shift.ndim and tuple(x.shape[1:]) != self.shift.shape:
            raise DataError(f"records have feature shape {tuple(x.shape[1:])}, the input scale "
                            f"has {self.shift.shape}")
        return (x - self.shift) / self.scale

    def apply_to(self, dataset):
        """A copy of `dataset` with both splits scaled (labels, meta and order kept).

        Args:
            dataset: an `agt.Dataset` in the original units.

        Returns:
            The scaled `agt.Dataset`.
        """
        from dataclasses import replace

        return replace(dataset, x_train=self.apply(dataset.x_train),
                       x_test=None if dataset.x_test is None else self.apply(dataset.x_test))

    def to_record(self) -> dict:
        """The JSON-friendly description stored with the bundle (the arrays go alongside).

        Returns:
            A mapping with the source note and the shape of shift and scale.
        """
        return {"source": self.source, "shape": list(self.shift.shape)}
