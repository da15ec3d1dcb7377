"""Handwritten digits: scikit-learn's ``load_digits`` ("digits") and MNIST .npz files ("mnist").

digits  The UCI optical-recognition digits shipped inside scikit-learn (no download):
        1797 images of 8 x 8 pixels, integer grey levels 0..16, labels 0..9. Needs the
        optional dependency scikit-learn (``pip install -e ".[datasets]"``); without it the
        loader raises a one-line `DataError` saying so.
mnist   A user's MNIST archive (default file name ``mnist.npz``, the layout of
        ``keras.datasets.mnist``): keys ``x_train``, ``y_train``, ``x_test``, ``y_test``;
        images (n, 28, 28) or flattened (n, 784), any numeric dtype; labels (n,) or (n, 1).

Both return flattened raw pixels (float64, shape (n, H*W)): no scaling here. The pixel range
is public knowledge about the *format* (digits: [0, 16]; MNIST: [0, 255] unless
``pixel_range`` says otherwise), recorded as ``meta["feature_range"]``; every pixel is checked
against it (a value outside is a `DataError`, never clipped), because the trade-off study's
linear methods scale by that range to put every input in the unit ball
(agt/baselines/unit_ball.py) and their privacy proofs need the bound to hold for every record.

Tasks (option ``task``):
  multiclass  the ten digits, label = digit (10 classes);
  binary      two classes. Default: odd vs even over all digits (label 1 = odd digit, 0 =
              even), which keeps every image. With ``pair: [a, b]`` only the images of
              digits a and b are kept, a -> label 0 and b -> label 1.

digits split (option ``test_fraction``, default 0.2, and ``seed``, default 0): the test
records are round(n * test_fraction) indices drawn by ``numpy.random.default_rng(seed)``
*after* the task's selection; the training split is every other record in file order (record
order matters for AGT: batches are a function of the record index). mnist keeps the file's own
train/test split.
``max_train`` (both): keep that many training records, chosen by the same seeded generator,
in file order.

Features (option ``features``, both): ``raw`` (default) or ``unit_ball``, the public map of
agt/baselines/unit_ball.py (pixels centred on the middle of the format's range and divided by
its half-width times sqrt(d), so ||x||_2 <= 1 for every image the format allows): the
declared domain ``input_norm_bound: 1`` of bound method stability then holds for every
neighbouring dataset, from the format alone. ``meta["feature_range"]`` is then the mapped
per-pixel range [-1/sqrt(d), 1/sqrt(d)].
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from agt.data.dataset import Dataset, validate_dataset
from agt.data.options import (
    NpzArchive,
    Options,
    as_features,
    as_labels,
    check_pair,
    subsample_sorted,
)
from agt.errors import ConfigError, DataError

DIGITS_RANGE = (0.0, 16.0)
MNIST_FILENAME = "mnist.npz"
TASKS = ("multiclass", "binary")
FEATURES = ("raw", "unit_ball")
_INSTALL = 'pip install -e ".[datasets]" (or pip install "scikit-learn>=1.3")'
_MNIST_HINT = ("an MNIST archive with arrays x_train, y_train, x_test, y_test (e.g. the "
               "mnist.npz of keras.datasets.mnist); pass data.path or data_dir")


def load_sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) float64 in [0, 16], labels (1797,) int64) from scikit-learn."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError(f"dataset 'digits' needs scikit-learn, which is not installed: "
                        f"{_INSTALL}") from None
    bunch = load_digits()
    return (np.asarray(bunch.images, dtype=np.float64),
            np.asarray(bunch.target, dtype=np.int64))


def task_labels(labels: np.ndarray, task: str, pair: list[int] | None
                ) -> tuple[np.ndarray, np.ndarray, int, dict]:
    """(kept record indices, task labels, number of classes, label meaning) for `task`.

    multiclass: every record, label = digit. binary without pair: every record, label 1 for
    an odd digit. binary with pair [a, b]: records of digits a and b, a -> 0, b -> 1."""
    if task == "multiclass":
        return (np.arange(labels.shape[0]), labels.astype(np.int64), 10,
                {str(d): f"digit {d}" for d in range(10)})
    if pair is None:
        return (np.arange(labels.shape[0]), (labels % 2).astype(np.int64), 2,
                {"0": "even digit", "1": "odd digit"})
    a, b = pair
    keep = np.flatnonzero((labels == a) | (labels == b))
    return keep, (labels[keep] == b).astype(np.int64), 2, {"0": f"digit {a}", "1": f"digit {b}"}


def _read_task_options(opts: Options) -> tuple[str, list[int] | None]:
    task = opts.choice("task", "multiclass", TASKS)
    pair = None
    raw = opts.raw.get("pair")
    if raw is not None:
        ok = (isinstance(raw, (list, tuple)) and len(raw) == 2
              and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                      and 0 <= v <= 9 for v in raw) and raw[0] != raw[1])
        if not ok:
            opts.problems.add(f"data.pair (dataset '{opts.loader}') must be two "
                              f"different digits in 0..9, e.g. [3, 8], got {raw!r}")
        elif task != "binary":
            opts.problems.add(f"data.pair (dataset '{opts.loader}') selects a binary "
                              f"task: set task: binary")
        else:
            pair = [int(raw[0]), int(raw[1])]
    return task, pair


def check_range(x: np.ndarray, low: float, high: float, where: str) -> None:
    """Refuse a pixel outside the format's public range [low, high] (no silent clipping)."""
    bad = np.flatnonzero(((x < low) | (x > high)).reshape(x.shape[0], -1).any(axis=1))
    if bad.size:
        i = int(bad[0])
        row = x[i].reshape(-1)
        j = int(np.flatnonzero((row < low) | (row > high))[0])
        raise DataError(f"{where}: record {i} has pixel value {row[j]!r} outside the format's "
                        f"range [{low:g}, {high:g}] ({bad.size} records out of range); fix the "
                        f"file or give data.pixel_range")


def public_features(ds: Dataset, features: str) -> Dataset:
    """``features: unit_ball``: both splits through the data-independent unit-ball map of the
    format's public range (module docstring); ``raw``: unchanged."""
    if features == "raw":
        return ds
    from agt.baselines.unit_ball import UnitBallMap
    low, high = ds.meta["feature_range"]
    d = int(ds.x_train.shape[1])
    unit = UnitBallMap(float(low), float(high), d)
    half = 1.0 / math.sqrt(d)
    meta = {**ds.meta, "features": features, "feature_range": [-half, half],
            "raw_feature_range": [low, high]}
    x_test = None if ds.x_test is None else unit.transform(ds.x_test, f"{ds.name} test images")
    return validate_dataset(Dataset(ds.name, unit.transform(ds.x_train, f"{ds.name} images"),
                                    ds.y_train, x_test, ds.y_test, ds.n_classes, meta,
                                    source_index=ds.source_index))


def load_digits_dataset(options: Mapping[str, Any] | None, base_dir: Path | None) -> Dataset:
    opts = Options("digits", options, ("task", "pair", "test_fraction", "seed", "max_train",
                                       "features"))
    task, pair = _read_task_options(opts)
    features = opts.choice("features", "raw", FEATURES)
    test_fraction = opts.float("test_fraction", 0.2, 0.0, 1.0, hi_open=True)
    seed = opts.int("seed", 0, minimum=0)
    max_train = opts.int("max_train", None, minimum=1)
    opts.done()
    images, digits = load_sklearn_digits()
    keep, y, n_classes, meaning = task_labels(digits, task, pair)
    x = images[keep].reshape(len(keep), -1)
    check_range(x, *DIGITS_RANGE, "scikit-learn digits")
    n = len(keep)
    n_test = int(math.floor(n * test_fraction + 0.5))
    if n - n_test < 1:
        raise ConfigError(f"data.test_fraction (dataset 'digits') = {test_fraction} "
                          f"leaves no training record out of {n}")
    rng = np.random.default_rng(seed)
    test_idx = np.sort(rng.choice(n, size=n_test, replace=False)) if n_test else \
        np.zeros(0, np.int64)
    train_idx = np.setdiff1d(np.arange(n), test_idx)
    n_train_task = int(train_idx.size)
    if max_train is not None and max_train < train_idx.size:
        train_idx = subsample_sorted(rng, train_idx, max_train)
    ds = Dataset(
        name="digits",
        x_train=np.ascontiguousarray(x[train_idx]), y_train=np.ascontiguousarray(y[train_idx]),
        x_test=np.ascontiguousarray(x[test_idx]) if n_test else None,
        y_test=np.ascontiguousarray(y[test_idx]) if n_test else None,
        n_classes=n_classes,
        meta={"source": "scikit-learn load_digits (UCI optical recognition of handwritten "
                        "digits, 8 x 8, grey levels 0..16)",
              "options": {"task": task, "pair": pair, "test_fraction": test_fraction,
                          "seed": seed, "max_train": max_train, "features": features},
              "label_meaning": meaning, "image_shape": [8, 8],
              "feature_range": list(DIGITS_RANGE), "n_task_records": n,
              "n_train_before_max_train": n_train_task,
              "n_train": int(train_idx.size), "n_test": n_test},
        source_index=keep[train_idx].astype(np.int64),
    )
    return public_features(validate_dataset(ds), features)


def _mnist_images(raw: np.ndarray, where: str) -> np.ndarray:
    x = as_features(raw, where)
    if x.ndim == 3:
        return np.ascontiguousarray(x.reshape(x.shape[0], -1))
    if x.ndim == 2:
        return x
    raise DataError(f"{where} must hold images of shape (n, H, W) or flattened (n, H*W), got "
                    f"{raw.shape}")


def load_mnist(options: Mapping[str, Any] | None, base_dir: Path | None) -> Dataset:
    opts = Options("mnist", options, ("path", "data_dir", "task", "pair", "seed", "max_train",
                                      "pixel_range", "features"))
    task, pair = _read_task_options(opts)
    features = opts.choice("features", "raw", FEATURES)
    seed = opts.int("seed", 0, minimum=0)
    max_train = opts.int("max_train", None, minimum=1)
    pr = opts.raw.get("pixel_range", [0, 255])
    ok = (isinstance(pr, (list, tuple)) and len(pr) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                  for v in pr) and pr[0] < pr[1])
    if not ok:
        opts.problems.add(f"data.pixel_range (dataset 'mnist') must be [low, high] "
                          f"with low < high, got {pr!r}")
        pr = [0, 255]
    low, high = float(pr[0]), float(pr[1])
    path = opts.file(base_dir, MNIST_FILENAME, _MNIST_HINT)
    with NpzArchive(path) as f:
        x = _mnist_images(f.get("x_train"), f"{path.name}:x_train")
        y = as_labels(f.get("y_train"), f"{path.name}:y_train")
        x_test = _mnist_images(f.get("x_test"), f"{path.name}:x_test")
        y_test = as_labels(f.get("y_test"), f"{path.name}:y_test")
    check_pair(x, y, f"{path.name} (x_train, y_train)")
    check_pair(x_test, y_test, f"{path.name} (x_test, y_test)")
    if x.shape[1] != x_test.shape[1]:
        raise DataError(f"{path.name}: x_train has {x.shape[1]} pixels per image, x_test "
                        f"{x_test.shape[1]}")
    for name, arr in (("y_train", y), ("y_test", y_test)):
        bad = np.flatnonzero((arr < 0) | (arr > 9))
        if bad.size:
            raise DataError(f"{path.name}:{name}[{int(bad[0])}] = {int(arr[bad[0]])} is not a "
                            f"digit 0..9")
    check_range(x, low, high, f"{path.name}:x_train")
    check_range(x_test, low, high, f"{path.name}:x_test")
    keep, y_task, n_classes, meaning = task_labels(y, task, pair)
    keep_t, yt_task, _, _ = task_labels(y_test, task, pair)
    train_idx = keep
    if max_train is not None and max_train < keep.size:
        train_idx = subsample_sorted(np.random.default_rng(seed), keep, max_train)
        y_task = y_task[np.searchsorted(keep, train_idx)]
    side = int(round(math.sqrt(x.shape[1])))
    ds = Dataset(
        name="mnist",
        x_train=np.ascontiguousarray(x[train_idx]), y_train=np.ascontiguousarray(y_task),
        x_test=np.ascontiguousarray(x_test[keep_t]), y_test=np.ascontiguousarray(yt_task),
        n_classes=n_classes,
        meta={"source": str(path),
              "options": {"task": task, "pair": pair, "seed": seed, "max_train": max_train,
                          "pixel_range": [low, high], "features": features},
              "label_meaning": meaning,
              "image_shape": [side, side] if side * side == x.shape[1] else [x.shape[1]],
              "feature_range": [low, high], "n_train_source": int(x.shape[0]),
              "n_train": int(train_idx.size), "n_test": int(keep_t.size)},
        source_index=train_idx.astype(np.int64),
    )
    return public_features(validate_dataset(ds), features)
