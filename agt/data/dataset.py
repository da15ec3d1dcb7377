"""The `Dataset` value type and its validation.

A `Dataset` holds the private training split (float64 features, int64 labels) and an
optional test split (the queries). Every loader of this package returns one that has
passed `validate_dataset`; `Dataset.from_arrays` builds one from numpy arrays for the
Python API.

Record order matters: AGT assigns batches as a function of the record index (agt.training,
`epoch_orders`), so loaders keep the surviving records in file order.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from agt.errors import DataError, Problems

__all__ = ["Dataset", "validate_dataset", "first_nonfinite_record"]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A labelled dataset: the private training split and an optional test split.

    x_train: float64, shape (n, *feature_shape); y_train: int64, shape (n,), in
    [0, n_classes). x_test/y_test follow the same rules (y_test may be None for unlabelled
    queries). `meta` is JSON-friendly provenance (source path, options, counts).
    `source_index`, when set, gives for each training record its row in the source file's
    training split (used to keep a public split disjoint from the private one); None means
    the records are the source rows in order, or were generated.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    n_classes: int
    meta: dict = field(default_factory=dict)
    source_index: np.ndarray | None = None

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """The shape of one record, (*features)."""
        return tuple(int(s) for s in self.x_train.shape[1:])

    @property
    def n_train(self) -> int:
        """The number of training records."""
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        """The number of test records (0 without a test split)."""
        return 0 if self.x_test is None else int(self.x_test.shape[0])

    @staticmethod
    def from_arrays(x_train, y_train, x_test=None, y_test=None, *, n_classes: int | None = None,
                    name: str = "arrays", meta: dict | None = None) -> "Dataset":
        """A validated dataset from array-likes (the Python API's entry point).

        Features become float64 of shape (n, *features); labels int64 of shape (n,) (a
        trailing axis of 1 is dropped; float labels must be whole numbers).

        Args:
            x_train: the private training features, (n, *features).
            y_train: their labels, (n,) whole numbers in [0, n_classes).
            x_test: optional test features (queries), the same feature shape.
            y_test: optional test labels.
            n_classes: the number of classes; default 1 + the largest label of either split
                (at least 2). Give it when a class may have no record.
            name: a name for messages and provenance.
            meta: JSON-friendly provenance to keep.

        Returns:
            The validated `Dataset`.

        Raises:
            DataError: a wrong shape, a non-finite feature, a label out of range.
        """
        from agt.data.options import as_features, as_labels

        x = as_features(np.asarray(x_train), "x_train")
        y = as_labels(np.asarray(y_train), "y_train")
        xt = None if x_test is None else as_features(np.asarray(x_test), "x_test")
        yt = None if y_test is None else as_labels(np.asarray(y_test), "y_test")
        if n_classes is None:
            top = max((int(v.max()) for v in (y, yt) if v is not None and v.size), default=0)
            n_classes = max(2, top + 1)
        return validate_dataset(Dataset(name, x, y, xt, yt, n_classes, dict(meta or {})))

    def sha256(self) -> str:
        """Hex SHA-256 of the training split (it identifies the private dataset).

        Canonical bytes: a format tag, the shapes of x_train and y_train as little-endian
        int64 (with their ranks), then x_train as little-endian float64 and y_train as
        little-endian int64, both C-contiguous. Name, test split and meta do not enter.

        Returns:
            64 hex digits.
        """
        x = np.ascontiguousarray(self.x_train, dtype="<f8")
        y = np.ascontiguousarray(self.y_train, dtype="<i8")
        h = hashlib.sha256()
        h.update(b"agt-dataset-train-v1\0")
        for arr in (x, y):
            h.update(np.asarray([arr.ndim, *arr.shape], dtype="<i8").tobytes())
        h.update(x.tobytes(order="C"))
        h.update(y.tobytes(order="C"))
        return h.hexdigest()


def first_nonfinite_record(x: np.ndarray) -> int | None:
    if x.shape[0] == 0:
        return None
    ok = np.isfinite(x.reshape(x.shape[0], -1)).all(axis=1)
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if bad.size else None


def validate_dataset(ds: Dataset) -> Dataset:
    """Check a dataset and return it unchanged; raise one `DataError` listing every problem.

    Checks: at least one training record; x float64 with a record axis, y int64 of shape
    (n,) with as many labels as records; all features finite (the message names the split
    and the first bad record); labels in [0, n_classes); n_classes >= 2; the test split has
    the training feature shape.
    """
    problems = Problems(f"dataset '{ds.name}'", DataError)
    if not isinstance(ds.n_classes, (int, np.integer)) or isinstance(ds.n_classes, bool) \
            or ds.n_classes < 2:
        problems.add(f"n_classes must be an integer >= 2, got {ds.n_classes!r}")
    if ds.x_test is None and ds.y_test is not None:
        problems.add("y_test is given without x_test")
    splits = [("train", ds.x_train, ds.y_train)]
    if ds.x_test is not None:
        splits.append(("test", ds.x_test, ds.y_test))
    for split, x, y in splits:
        if not isinstance(x, np.ndarray) or x.ndim < 2:
            shape = getattr(x, "shape", None)
            problems.add(f"x_{split} must be an array of shape (n, *features), got shape {shape}")
            continue
        if x.dtype != np.float64:
            problems.add(f"x_{split} must be float64, got {x.dtype}")
        elif (bad := first_nonfinite_record(x)) is not None:
            problems.add(f"x_{split} has a NaN or infinite value in record {bad}")
        if (split == "test" and isinstance(ds.x_train, np.ndarray) and ds.x_train.ndim >= 2
                and x.shape[1:] != ds.x_train.shape[1:]):
            problems.add(
                f"x_test has feature shape {tuple(x.shape[1:])} but x_train has "
                f"{tuple(ds.x_train.shape[1:])}")
        if y is None:
            if split == "train":
                problems.add("y_train is missing")
            continue
        if not isinstance(y, np.ndarray) or y.ndim != 1:
            problems.add(f"y_{split} must have shape (n,), got {getattr(y, 'shape', None)}")
            continue
        if y.dtype != np.int64:
            problems.add(f"y_{split} must be int64, got {y.dtype}")
            continue
        if y.shape[0] != x.shape[0]:
            problems.add(f"x_{split} has {x.shape[0]} records but y_{split} has "
                         f"{y.shape[0]} labels")
        if y.size and isinstance(ds.n_classes, (int, np.integer)):
            out = np.flatnonzero((y < 0) | (y >= ds.n_classes))
            if out.size:
                i = int(out[0])
                problems.add(
                    f"y_{split}[{i}] = {int(y[i])} is outside [0, {ds.n_classes}) "
                    f"({out.size} labels out of range)")
    if isinstance(ds.x_train, np.ndarray) and ds.x_train.ndim >= 1 and ds.x_train.shape[0] < 1:
        problems.add("the training split is empty (need at least 1 record)")
    problems.raise_if_any()
    return ds
