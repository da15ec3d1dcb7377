"""Blobs: two isotropic Gaussians in the plane, generated (the AGT paper's synthetic task).

"separable": centres +(1.25, 1.25) (label 1) and -(1.25, 1.25) (label 0), std 0.35;
"overlapping": centres +-(1, 1), std 0.75. ``n_samples // 2`` points are drawn from the +
centre and the rest from the - centre (an odd ``n_samples`` gives the - class one extra
point). All points are shuffled with ``seed`` and the first
``n_samples - round(n_samples * test_fraction)`` form the training split. Features
(`blobs_features`): "cubic" maps (x1, x2) to (x1, x2, x1^2, x2^2, x1^3, x2^3); "raw" keeps
(x1, x2).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from agt.data.dataset import Dataset, validate_dataset
from agt.data.options import Options
from agt.errors import ConfigError, DataError

_BLOBS_VARIANTS = {"separable": (1.25, 0.35), "overlapping": (1.0, 0.75)}
_BLOBS_FEATURES = ("cubic", "raw")


def blobs_features(points_2d: np.ndarray, features: str = "cubic") -> np.ndarray:
    """Map raw planar points (m, 2) to the blobs model's feature space, float64.

    "cubic": (x1, x2, x1^2, x2^2, x1^3, x2^3), shape (m, 6); "raw": (x1, x2), shape (m, 2).
    The blobs loader uses this function, so heat maps over the input plane match training.
    """
    if features not in _BLOBS_FEATURES:
        raise ConfigError(f"blobs features must be one of {', '.join(_BLOBS_FEATURES)}, "
                          f"got {features!r}")
    p = np.asarray(points_2d, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != 2:
        raise DataError(f"blobs points must have shape (m, 2), got {p.shape}")
    if features == "raw":
        return np.ascontiguousarray(p)
    return np.ascontiguousarray(np.concatenate([p, p ** 2, p ** 3], axis=1))


def load_blobs(options: Mapping[str, Any] | None, base_dir: Path | None) -> Dataset:
    opts = Options("blobs", options, ("variant", "n_samples", "test_fraction", "seed", "features"))
    variant = opts.choice("variant", "separable", tuple(_BLOBS_VARIANTS))
    n_samples = opts.int("n_samples", 6250, minimum=2)
    test_fraction = opts.float("test_fraction", 0.2, 0.0, 1.0, hi_open=True)
    seed = opts.int("seed", 0, minimum=0)
    features = opts.choice("features", "cubic", _BLOBS_FEATURES)
    opts.done()
    n_test = int(math.floor(n_samples * test_fraction + 0.5))
    n_train = n_samples - n_test
    if n_train < 1:
        raise ConfigError(
            f"data.test_fraction (dataset 'blobs') = {test_fraction} leaves no training "
            f"record out of n_samples = {n_samples}")

    centre, std = _BLOBS_VARIANTS[variant]
    rng = np.random.default_rng(seed)
    n_pos = n_samples // 2
    n_neg = n_samples - n_pos
    pos = centre + std * rng.standard_normal((n_pos, 2))
    neg = -centre + std * rng.standard_normal((n_neg, 2))
    points = np.concatenate([pos, neg], axis=0)
    labels = np.concatenate([np.ones(n_pos, np.int64), np.zeros(n_neg, np.int64)])
    order = rng.permutation(n_samples)
    points, labels = points[order], labels[order]
    x = blobs_features(points, features)

    ds = Dataset(
        name="blobs",
        x_train=x[:n_train],
        y_train=np.ascontiguousarray(labels[:n_train]),
        x_test=x[n_train:] if n_test else None,
        y_test=np.ascontiguousarray(labels[n_train:]) if n_test else None,
        n_classes=2,
        meta={
            "source": "generated",
            "options": {"variant": variant, "n_samples": n_samples,
                        "test_fraction": test_fraction, "seed": seed, "features": features},
            "centres": [[centre, centre], [-centre, -centre]],
            "std": std,
            "n_train": n_train,
            "n_test": n_test,
        },
    )
    return validate_dataset(ds)

