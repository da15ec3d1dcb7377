"""Generic npz files: training data and query files.

A numpy ``.npz`` archive with features under ``x_key`` (default ``x_train``), shape
(n, *feature_shape), labels under ``y_key`` (default ``y_train``), shape (n,) or (n, 1),
and optionally ``x_test``/``y_test`` (keys ``x_test_key``/``y_test_key``). Query files for
the CLI hold ``x_<split>`` (and ``y_<split>``) or ``x`` (and ``y``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from agt.data.dataset import Dataset, first_nonfinite_record, validate_dataset
from agt.data.options import (
    NpzArchive,
    Options,
    as_features,
    as_labels,
    check_pair,
    check_same_features,
    resolve_path,
)
from agt.errors import ConfigError, DataError


def load_npz(options: Mapping[str, Any] | None, base_dir: Path | None) -> Dataset:
    opts = Options("npz", options,
                    ("path", "x_key", "y_key", "x_test_key", "y_test_key", "n_classes"))
    x_key = opts.str("x_key", "x_train")
    y_key = opts.str("y_key", "y_train")
    x_test_key = opts.str("x_test_key", "x_test")
    y_test_key = opts.str("y_test_key", "y_test")
    n_classes = opts.int("n_classes", None, minimum=2)
    path = opts.file(base_dir, None, "")
    with NpzArchive(path) as f:
        x = as_features(f.get(x_key), f"{path.name}:{x_key}")
        y = as_labels(f.get(y_key), f"{path.name}:{y_key}")
        check_pair(x, y, f"{path.name} ({x_key}, {y_key})")
        x_test = y_test = None
        if x_test_key in f or opts.has("x_test_key"):
            x_test = as_features(f.get(x_test_key), f"{path.name}:{x_test_key}")
            if y_test_key in f or opts.has("y_test_key"):
                y_test = as_labels(f.get(y_test_key), f"{path.name}:{y_test_key}")
                check_pair(x_test, y_test, f"{path.name} ({x_test_key}, {y_test_key})")
        elif opts.has("y_test_key"):
            raise ConfigError(
                "data.y_test_key (dataset 'npz') is set but the file has no test "
                f"features '{x_test_key}'; set x_test_key too")
    check_same_features(x, x_test, "npz")
    if n_classes is None:
        top = max((int(v.max()) for v in (y, y_test) if v is not None and v.size), default=0)
        n_classes = max(2, top + 1)
    ds = Dataset(
        name="npz",
        x_train=x, y_train=y, x_test=x_test, y_test=y_test, n_classes=n_classes,
        meta={"source": str(path), "options": dict(opts.raw), "n_train": int(x.shape[0]),
              "n_test": 0 if x_test is None else int(x_test.shape[0])},
    )
    return validate_dataset(ds)


def load_npz_queries(path: str | Path, split: str = "test",
                     base_dir: Path | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Query points (and labels, if present) from an .npz file for the CLI.

    Reads `x_<split>`/`y_<split>` when `x_<split>` exists, else `x`/`y`. Returns x as float64
    (n, *features) and y as int64 (n,) or None. Labels of shape (n, 1) are flattened.
    """
    p = resolve_path(path, base_dir)
    if not p.is_file():
        raise DataError(f"query file not found: {p}")
    with NpzArchive(p) as f:
        if f"x_{split}" in f:
            x_key, y_key = f"x_{split}", f"y_{split}"
        elif "x" in f:
            x_key, y_key = "x", "y"
        else:
            raise DataError(
                f"{p} has neither 'x_{split}' nor 'x'; keys present: {', '.join(f.keys) or 'none'}")
        x = as_features(f.get(x_key), f"{p.name}:{x_key}")
        y = as_labels(f.get(y_key), f"{p.name}:{y_key}") if y_key in f else None
    if x.shape[0] == 0:
        raise DataError(f"{p.name}:{x_key} holds no query")
    bad = first_nonfinite_record(x)
    if bad is not None:
        raise DataError(f"{p.name}:{x_key} has a NaN or infinite value in record {bad}")
    check_pair(x, y, f"{p.name} ({x_key}, {y_key})")
    if y is not None and y.size and y.min() < 0:
        raise DataError(f"{p.name}:{y_key} has a negative label at record {int(np.argmin(y))}")
    return x, y
