"""MedMNIST OctMNIST (``octmnist.npz``): the private set and the public pre-training set.

Keys ``{train,val,test}_{images,labels}``; images N x 28 x 28 uint8, labels N x 1 with
0 CNV, 1 DME, 2 drusen, 3 normal (97,477 / 10,832 / 1,000 images). Get it from
https://medmnist.com (Zenodo) or with the ``medmnist`` package. Loaded channel-first,
(n, 1, 28, 28), scaled to [0, 1] by default.

Both datasets of the OctMNIST experiment come from one reader (`_read`): the private set
(`load_octmnist`: a task over chosen classes, optionally class-balanced) and the public
pre-training set (`octmnist_public_split`: CNV, DME and normal, balanced, with the private
records excluded so that no record is both public and private).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from agt.data.dataset import Dataset, first_nonfinite_record, validate_dataset
from agt.data.options import (
    NpzArchive,
    Options,
    as_labels,
    check_pair,
    check_same_features,
    subsample_sorted,
)
from agt.errors import DataError

OCTMNIST_FILENAME = "octmnist.npz"
OCTMNIST_CLASS_NAMES = {0: "CNV", 1: "DME", 2: "drusen", 3: "normal"}
_NORMAL = 3
_PUBLIC_CLASSES = (0, 1, 3)
_ALL = (0, 1, 2, 3)
_TASKS = ("abnormal_vs_normal", "multiclass")
_HINT = (
    "download octmnist.npz from MedMNIST (https://medmnist.com, or its Zenodo record; or "
    "`pip install medmnist` in a separate environment, then `python -c \"import medmnist; "
    "medmnist.OCTMNIST(split='train', download=True, root='DIR')\"`) and pass --data-dir DIR "
    "or set data.data_dir"
)


def _read_split(f: NpzArchive, split: str) -> tuple[np.ndarray, np.ndarray]:
    images = f.get(f"{split}_images")
    labels = as_labels(f.get(f"{split}_labels"), f"{f.path.name}:{split}_labels")
    if images.ndim != 3:
        raise DataError(
            f"{f.path.name}:{split}_images must have shape (N, H, W) (grayscale), "
            f"got {images.shape}")
    if images.dtype.kind not in "biuf":
        raise DataError(f"{f.path.name}:{split}_images must hold numbers, got dtype {images.dtype}")
    check_pair(images, labels, f"{f.path.name} ({split}_images, {split}_labels)")
    bad = np.flatnonzero((labels < 0) | (labels > 3))
    if bad.size:
        raise DataError(
            f"{f.path.name}:{split}_labels[{int(bad[0])}] = {int(labels[bad[0]])} is not an "
            f"OctMNIST class (0 CNV, 1 DME, 2 drusen, 3 normal)")
    return images, labels


def _images(images: np.ndarray, idx: np.ndarray, scale: bool, where: str) -> np.ndarray:
    x = np.ascontiguousarray(images[idx], dtype=np.float64)[:, None, :, :]
    bad = first_nonfinite_record(x)
    if bad is not None:
        raise DataError(f"{where} has a NaN or infinite pixel in record {int(idx[bad])}")
    if scale:
        x /= 255.0
    return x


def _balance(rng: np.random.Generator, idx: np.ndarray, groups: np.ndarray,
             where: str) -> np.ndarray:
    """Subsample every group of idx (by `groups`, aligned with idx) to the smallest group."""
    values = np.unique(groups)
    counts = {int(v): int(np.sum(groups == v)) for v in values}
    if len(values) < 2:
        raise DataError(
            f"{where}: balance=true needs at least two classes in the training split, found "
            f"{sorted(counts)}; widen data.classes or set balance: false")
    m = min(counts.values())
    keep = [subsample_sorted(rng, idx[groups == v], m) for v in values]
    return np.sort(np.concatenate(keep))


@dataclass(frozen=True)
class _Read:
    x: np.ndarray
    y: np.ndarray
    index: np.ndarray           # train-split rows kept, ascending
    original: np.ndarray        # original labels of the kept rows
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    n_excluded: int


def _read(path: Path, *, train_classes, test_classes, labels: Callable[[np.ndarray], np.ndarray],
          balance_by: Callable[[np.ndarray], np.ndarray] | None, seed: int,
          exclude: np.ndarray | None, split_test: str, scale: bool, what: str) -> _Read:
    """The one OctMNIST reader: keep training rows of `train_classes` (minus `exclude`),
    optionally balance them over `balance_by(original labels)`, map labels with `labels`,
    and read the `split_test` images of `test_classes`."""
    with NpzArchive(path) as f:
        images, orig = _read_split(f, "train")
        mask = np.isin(orig, train_classes)
        n_excluded = 0
        if exclude is not None:
            ex = np.asarray(exclude)
            if ex.ndim != 1 or ex.dtype.kind not in "iu" or (ex.size and (
                    ex.min() < 0 or ex.max() >= orig.size)):
                raise DataError(f"exclude_indices must be a 1-D array of train-split rows in "
                                f"[0, {orig.size})")
            n_excluded = int(np.sum(mask[ex]))
            mask[ex] = False
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            raise DataError(f"{path.name}: no training image left for {what} (classes "
                            f"{list(train_classes)}); check data.classes")
        if balance_by is not None:
            idx = _balance(np.random.default_rng(seed), idx, balance_by(orig[idx]),
                           f"{what} ({path.name})")
        x = _images(images, idx, scale, f"{path.name}:train_images")
        x_test = y_test = None
        if split_test != "none":
            t_images, t_orig = _read_split(f, split_test)
            t_idx = np.flatnonzero(np.isin(t_orig, test_classes))
            x_test = _images(t_images, t_idx, scale, f"{path.name}:{split_test}_images")
            y_test = labels(t_orig[t_idx])
    check_same_features(x, x_test, "octmnist")
    return _Read(x, labels(orig[idx]), idx.astype(np.int64), orig[idx], x_test, y_test,
                 n_excluded)


def _counts(original: np.ndarray, classes) -> dict[str, int]:
    return {OCTMNIST_CLASS_NAMES[c]: int(np.sum(original == c)) for c in classes}


def load_octmnist(options: Mapping[str, Any] | None, base_dir: Path | None) -> Dataset:
    """The private OctMNIST set: ``task`` abnormal_vs_normal (1 = abnormal) or multiclass,
    over ``classes`` (default all), optionally class-balanced (by task label, seeded)."""
    opts = Options("octmnist", options,
                   ("path", "data_dir", "task", "classes", "balance", "seed", "test_classes",
                    "split_test", "scale"))
    task = opts.choice("task", "abnormal_vs_normal", _TASKS)
    classes = opts.int_list("classes", _ALL)
    test_classes = opts.int_list("test_classes", _ALL)
    balance = opts.bool("balance", False)
    seed = opts.int("seed", 0, minimum=0)
    split_test = opts.choice("split_test", "test", ("test", "val", "none"))
    scale = opts.bool("scale", True)
    path = opts.file(base_dir, OCTMNIST_FILENAME, _HINT)
    keep_train = classes if classes is not None else list(_ALL)
    keep_test = test_classes if test_classes is not None else keep_train

    def task_labels(orig: np.ndarray) -> np.ndarray:
        if task == "abnormal_vs_normal":
            return (orig != _NORMAL).astype(np.int64)
        return orig.astype(np.int64)

    r = _read(path, train_classes=keep_train, test_classes=keep_test, labels=task_labels,
              balance_by=task_labels if balance else None, seed=seed, exclude=None,
              split_test=split_test, scale=scale, what="dataset 'octmnist'")
    ds = Dataset(
        name="octmnist", x_train=r.x, y_train=r.y, x_test=r.x_test, y_test=r.y_test,
        n_classes=2 if task == "abnormal_vs_normal" else 4,
        meta={
            "source": str(path),
            "options": {"task": task, "classes": keep_train, "test_classes": keep_test,
                        "balance": balance, "seed": seed, "split_test": split_test,
                        "scale": scale},
            "label_meaning": ({"0": "normal", "1": "abnormal"} if task == "abnormal_vs_normal"
                              else {str(k): v for k, v in OCTMNIST_CLASS_NAMES.items()}),
            "train_class_counts": _counts(r.original, keep_train),
            "n_train": int(r.x.shape[0]),
            "n_test": 0 if r.x_test is None else int(r.x_test.shape[0]),
        },
        source_index=r.index,
    )
    return validate_dataset(ds)


def octmnist_public_split(
    path: str | Path | None = None,
    data_dir: str | Path | None = None,
    *,
    base_dir: Path | None = None,
    labels: str = "multiclass",
    balance: bool = True,
    seed: int = 0,
    exclude_indices: np.ndarray | None = None,
    split_test: str = "test",
    scale: bool = True,
) -> Dataset:
    """The public pre-training set of the OctMNIST experiment: classes CNV, DME and normal.

    Training images come from the file's train split, restricted to the public classes and,
    with `balance` (default), subsampled (deterministically by `seed`) to the size of the
    smallest of the three classes. `labels="multiclass"` maps CNV -> 0, DME -> 1, normal -> 2
    (n_classes 3); `labels="binary"` gives 1 = abnormal (CNV, DME), 0 = normal. Balancing is
    over the three original classes in both cases.

    `exclude_indices` are train-split rows to leave out before balancing, normally the private
    set's `source_index` (e.g. its normal images), so that no record is both public and
    private: the privacy guarantee covers the private set given a fixed public set only.
    The test split (`split_test`: test, val or none) holds that split's images of the public
    classes, unbalanced.
    """
    options: dict[str, Any] = {"labels": labels, "balance": balance, "seed": seed,
                               "split_test": split_test, "scale": scale}
    if path is not None:
        options["path"] = str(path)
    if data_dir is not None:
        options["data_dir"] = str(data_dir)
    opts = Options("octmnist-public", options,
                   ("path", "data_dir", "labels", "balance", "seed", "split_test", "scale"))
    labels = opts.choice("labels", "multiclass", ("multiclass", "binary"))
    balance = opts.bool("balance", True)
    seed = opts.int("seed", 0, minimum=0)
    split_test = opts.choice("split_test", "test", ("test", "val", "none"))
    scale = opts.bool("scale", True)
    file = opts.file(base_dir, OCTMNIST_FILENAME, _HINT)
    remap = np.array([0, 1, -1, 2], dtype=np.int64)  # CNV, DME, (drusen), normal

    def task_labels(orig: np.ndarray) -> np.ndarray:
        if labels == "binary":
            return (orig != _NORMAL).astype(np.int64)
        return remap[orig]

    r = _read(file, train_classes=_PUBLIC_CLASSES, test_classes=_PUBLIC_CLASSES,
              labels=task_labels, balance_by=(lambda o: o) if balance else None, seed=seed,
              exclude=exclude_indices, split_test=split_test, scale=scale,
              what="OctMNIST public split")
    ds = Dataset(
        name="octmnist-public", x_train=r.x, y_train=r.y, x_test=r.x_test, y_test=r.y_test,
        n_classes=3 if labels == "multiclass" else 2,
        meta={
            "source": str(file),
            "options": {"labels": labels, "balance": balance, "seed": seed,
                        "split_test": split_test, "scale": scale},
            "label_meaning": ({"0": "CNV", "1": "DME", "2": "normal"} if labels == "multiclass"
                              else {"0": "normal", "1": "abnormal"}),
            "train_class_counts": _counts(r.original, _PUBLIC_CLASSES),
            "n_excluded": r.n_excluded,
        },
        source_index=r.index,
    )
    return validate_dataset(ds)
