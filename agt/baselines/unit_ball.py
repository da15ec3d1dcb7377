"""Inputs in the unit L2 ball, by a data-independent map (assumption 5 of the trade-off study).

The sensitivity and loss-perturbation proofs (van der Maaten & Hannun App. A-C; Chaudhuri,
Monteleoni & Sarwate 2011) need ||z||_2 <= 1 for *every* record a neighbouring dataset could
hold, so the map from raw features to the model's input z must not depend on the private
data: dividing by the largest row norm of the training set, or subtracting its mean, would
make the scale itself a function of the data (it leaks, and a replaced record could change
it). `UnitBallMap` uses only public facts about the input *format*:

  raw features x in the box [low, high]^d (digits: grey levels 0..16; MNIST: 0..255),
  centre  c = (low + high) / 2,     radius  R = (high - low) / 2 * sqrt(d),
  u = (x - c) / R                   so ||u||_2 <= 1 for every x in the box,
  optional projection u -> V^T u    V (d, D) with orthonormal columns from *public* data
                                    (PCA): a projection never increases the norm,
  optional bias coordinate          z = [u, 1] / sqrt(2), so ||z||_2 <= 1 still.

The bias trap. With logits W [x, 1] and ||x|| <= 1, the effective input has norm up to
sqrt(2), and the gradient of the loss with respect to W is bounded by K sqrt(2), not K: the
study's K = sqrt(2) (no bias) would become 2. Here a bias is an input coordinate like any
other and the whole vector z, bias included, is in the unit ball, so K = sqrt(2) holds
as stated (the model itself never has a separate bias: `agt/baselines/convex.py`).

Records outside the public box are refused with a `DataError` (never clipped): clipping
would be a silent change of the data, and a value outside the declared range means the
declaration is wrong. A final check refuses any z with ||z||_2 > 1 as computed; every z is
shrunk by the factor (1 - 1e-12) so that float rounding of the map cannot push a record on
the sphere outside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import ConfigError, DataError

__all__ = ["UnitBallMap", "pca_basis", "check_unit_ball", "SAFETY"]

SAFETY = 1.0 - 1e-12      # shrink factor against rounding (toward the safe side)


def check_unit_ball(z: ArrayLike, where: str = "inputs") -> NDArray[np.float64]:
    """Return z (float64, (n, d)); refuse a row with ||z||_2 > 1 (the proofs assume <= 1)."""
    arr = np.asarray(z, dtype=np.float64)
    if arr.ndim != 2:
        raise DataError(f"{where} must have shape (n, d), got {arr.shape}")
    if not np.isfinite(arr).all():
        raise DataError(f"{where} has a NaN or infinite value")
    if arr.shape[0]:
        norms = np.linalg.norm(arr, axis=1)
        bad = np.flatnonzero(norms > 1.0)
        if bad.size:
            i = int(bad[0])
            raise DataError(
                f"{where}: record {i} has ||z||_2 = {norms[i]:.6g} > 1 ({bad.size} records); "
                f"the sensitivity bounds assume every input in the unit ball (a bias "
                f"coordinate included): map the features with UnitBallMap, never by a "
                f"statistic of the private data")
    return arr


def pca_basis(x_public: ArrayLike, dim: int, unit: "UnitBallMap") -> NDArray[np.float64]:
    """(d, dim) orthonormal columns: the top `dim` principal directions of *public* inputs
    x_public after `unit`'s centring and scaling (their own mean removed for the fit only; the
    map never subtracts it, so the projection stays a contraction of the unit ball).

    Pass data whose privacy is not claimed (e.g. the query points, which the querier sends;
    their labels are not used): a basis fitted on the private training set would be a
    function of it that no guarantee covers."""
    u = unit.center_scale(np.asarray(x_public, dtype=np.float64), "public PCA data")
    if not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= u.shape[1]:
        raise ConfigError(f"PCA dimension must be an integer in [1, {u.shape[1]}], got {dim!r}")
    if u.shape[0] < 2:
        raise DataError("PCA needs at least 2 public records")
    centred = u - u.mean(axis=0, keepdims=True)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    if vt.shape[0] < dim:     # fewer records than dimensions: complete the basis
        q, _ = np.linalg.qr(np.concatenate([vt.T, np.eye(u.shape[1])], axis=1))
        return np.ascontiguousarray(q[:, :dim])
    return np.ascontiguousarray(vt[:dim].T)


@dataclass(frozen=True)
class UnitBallMap:
    """The data-independent map of raw features in [low, high]^d into the unit ball (module
    docstring). `basis`: optional (d, D) matrix with orthonormal columns; `bias`: append a
    constant coordinate (the whole vector then has norm <= 1)."""

    low: float
    high: float
    n_features: int
    bias: bool = False
    basis: NDArray[np.float64] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        problems = []
        if not (isinstance(self.low, (int, float)) and isinstance(self.high, (int, float))
                and math.isfinite(self.low) and math.isfinite(self.high)
                and self.low < self.high):
            problems.append(f"feature range must be finite with low < high, got "
                            f"[{self.low!r}, {self.high!r}]")
        if not isinstance(self.n_features, int) or self.n_features < 1:
            problems.append(f"n_features must be an integer >= 1, got {self.n_features!r}")
        if self.basis is not None:
            v = np.asarray(self.basis, dtype=np.float64)
            if v.ndim != 2 or v.shape[0] != self.n_features or v.shape[1] < 1:
                problems.append(f"basis must have shape ({self.n_features}, D), got {v.shape}")
            elif not np.allclose(v.T @ v, np.eye(v.shape[1]), atol=1e-9):
                problems.append("basis columns must be orthonormal (a projection that could "
                                "lengthen a vector would break the unit-ball bound)")
            object.__setattr__(self, "basis", v)
        if problems:
            raise ConfigError("UnitBallMap: " + "; ".join(problems))

    @staticmethod
    def for_dataset(meta: dict, n_features: int, bias: bool = False) -> "UnitBallMap":
        """From a dataset's ``meta["feature_range"]`` (the public pixel range)."""
        rng = meta.get("feature_range")
        if not (isinstance(rng, (list, tuple)) and len(rng) == 2):
            raise DataError("the dataset declares no public feature_range (meta); the unit-ball "
                            "map needs the range every record lies in, known without the data")
        return UnitBallMap(float(rng[0]), float(rng[1]), int(n_features), bias)

    @property
    def radius(self) -> float:
        """R = (high - low) / 2 * sqrt(d): the largest ||x - c|| over the box."""
        return 0.5 * (self.high - self.low) * math.sqrt(self.n_features)

    @property
    def dim(self) -> int:
        """Dimension of z (projection and bias coordinate included)."""
        base = self.n_features if self.basis is None else int(self.basis.shape[1])
        return base + int(self.bias)

    def with_basis(self, basis: NDArray[np.float64] | None) -> "UnitBallMap":
        return UnitBallMap(self.low, self.high, self.n_features, self.bias, basis)

    def center_scale(self, x: np.ndarray, where: str) -> NDArray[np.float64]:
        arr = np.asarray(x, dtype=np.float64)
        arr = arr.reshape(arr.shape[0], -1) if arr.ndim > 2 else arr
        if arr.ndim != 2 or arr.shape[1] != self.n_features:
            raise DataError(f"{where} must have shape (n, {self.n_features}), got "
                            f"{np.shape(x)}")
        if not np.isfinite(arr).all():
            raise DataError(f"{where} has a NaN or infinite value")
        out = (arr < self.low) | (arr > self.high)
        if out.any():
            i, j = (int(v[0]) for v in np.nonzero(out))
            raise DataError(f"{where}: record {i} has feature {j} = {arr[i, j]!r} outside the "
                            f"public range [{self.low:g}, {self.high:g}]; the unit-ball bound "
                            f"would not hold (refused, not clipped)")
        centre = 0.5 * (self.low + self.high)
        return (arr - centre) * (SAFETY / self.radius)

    def transform(self, x: ArrayLike, where: str = "features") -> NDArray[np.float64]:
        """z for raw features x (n, d) (or (n, *shape), flattened): refuses records outside
        the box; every returned row has ||z||_2 <= 1."""
        u = self.center_scale(np.asarray(x), where)
        if self.basis is not None:
            u = (u @ self.basis) * SAFETY
        if self.bias:
            u = np.concatenate([u, np.ones((u.shape[0], 1))], axis=1) * (SAFETY / math.sqrt(2.0))
        return check_unit_ball(np.ascontiguousarray(u), where)

    def to_json_dict(self) -> dict:
        return {"low": self.low, "high": self.high, "n_features": self.n_features,
                "centre": 0.5 * (self.low + self.high), "radius": self.radius,
                "bias_coordinate": self.bias,
                "projection_dim": None if self.basis is None else int(self.basis.shape[1]),
                "dim": self.dim,
                "rule": "z = (x - c) / R (then V^T, then [., 1] / sqrt 2 if a bias), "
                        "c and R from the public feature range only"}
