"""Dataset loaders: generated blobs, generic npz, MedMNIST OctMNIST, IMDB embeddings.

Every loader returns a `Dataset` (float64 features, int64 labels) that has passed
`validate_dataset`. Loaders are chosen by name with `load_dataset(name, options)`; each
loader accepts a fixed set of option keys (an unknown key, a wrong type or an impossible
value raises `ConfigError` naming the key) and raises `DataError` for a missing or malformed
file, with a one-line message that says how to fix it.

Record order matters: AGT assigns batches as a function of the record index (DESIGN.md
section 3), so every subsampling here keeps the surviving records in file order and is a
deterministic function of the option `seed`.

File formats
------------
blobs (generated, no file)
    Two isotropic Gaussians in the plane (DESIGN.md section 5). "separable": centres
    +(1.25, 1.25) (label 1) and -(1.25, 1.25) (label 0), std 0.35; "overlapping": centres
    +-(1, 1), std 0.75. ``n_samples // 2`` points are drawn from the + centre and the rest
    from the - centre (an odd ``n_samples`` gives the - class one extra point). All points are
    shuffled with ``seed`` and the first ``n_samples - round(n_samples * test_fraction)``
    form the training split. Features (`blobs_features`): "cubic" maps (x1, x2) to
    (x1, x2, x1^2, x2^2, x1^3, x2^3); "raw" keeps (x1, x2).

npz (generic)
    A numpy ``.npz`` archive with features under ``x_key`` (default ``x_train``), shape
    (n, *feature_shape), labels under ``y_key`` (default ``y_train``), shape (n,) or (n, 1),
    and optionally ``x_test``/``y_test`` (keys ``x_test_key``/``y_test_key``).

octmnist (MedMNIST ``octmnist.npz``)
    Keys ``{train,val,test}_{images,labels}``; images N x 28 x 28 uint8, labels N x 1 with
    0 CNV, 1 DME, 2 drusen, 3 normal (97,477 / 10,832 / 1,000 images). Get it from
    https://medmnist.com (Zenodo) or with the ``medmnist`` package. Loaded channel-first,
    (n, 1, 28, 28), scaled to [0, 1] by default.

imdb (``imdb_embeddings.npz``)
    Pre-computed review embeddings: ``x_train`` (n, 768) float, ``y_train`` (n,) in {0, 1}
    (1 = positive review), ``x_test`` (m, 768) float, ``y_test`` (m,) in {0, 1}. Each row is
    the mean over tokens of GPT-2's last hidden states for one review (768-d). Produce it with
    ``python -m agt.embed_imdb --reviews aclImdb --out DIR/imdb_embeddings.npz`` (see README section Data).
"""

from __future__ import annotations

import hashlib
import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from agt.errors import ConfigError, DataError

__all__ = [
    "Dataset",
    "validate_dataset",
    "load_dataset",
    "blobs_features",
    "octmnist_public_split",
    "load_npz_queries",
    "DATASET_NAMES",
    "OCTMNIST_FILENAME",
    "IMDB_FILENAME",
    "OCTMNIST_CLASS_NAMES",
]

OCTMNIST_FILENAME = "octmnist.npz"
IMDB_FILENAME = "imdb_embeddings.npz"
OCTMNIST_CLASS_NAMES = {0: "CNV", 1: "DME", 2: "drusen", 3: "normal"}
_OCT_NORMAL = 3
_OCT_PUBLIC_CLASSES = (0, 1, 3)

_OCTMNIST_HINT = (
    "download octmnist.npz from MedMNIST (https://medmnist.com, or its Zenodo record; or "
    "`pip install medmnist` in a separate environment, then `python -c \"import medmnist; "
    "medmnist.OCTMNIST(split='train', download=True, root='DIR')\"`) and pass --data-dir DIR "
    "or set data.options.data_dir"
)
_IMDB_HINT = (
    "produce it by embedding the IMDB reviews with GPT-2 via `transformers` (mean of the last "
    "hidden states, 768-d): `python -m agt.embed_imdb --reviews aclImdb --out DIR/imdb_embeddings.npz` (see "
    "README section Data), then pass --data-dir DIR or set data.options.data_dir"
)


# --------------------------------------------------------------------------------------
# The value type
# --------------------------------------------------------------------------------------


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
        return tuple(int(s) for s in self.x_train.shape[1:])

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        return 0 if self.x_test is None else int(self.x_test.shape[0])

    def sha256(self) -> str:
        """Hex SHA-256 of the training split (it identifies the private dataset).

        Canonical bytes: a format tag, the shapes of x_train and y_train as little-endian
        int64 (with their ranks), then x_train as little-endian float64 and y_train as
        little-endian int64, both C-contiguous. Name, test split and meta do not enter.
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


def _first_nonfinite_record(x: np.ndarray) -> int | None:
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
    problems: list[str] = []
    if not isinstance(ds.n_classes, (int, np.integer)) or isinstance(ds.n_classes, bool) \
            or ds.n_classes < 2:
        problems.append(f"n_classes must be an integer >= 2, got {ds.n_classes!r}")
    if ds.x_test is None and ds.y_test is not None:
        problems.append("y_test is given without x_test")
    splits = [("train", ds.x_train, ds.y_train)]
    if ds.x_test is not None:
        splits.append(("test", ds.x_test, ds.y_test))
    for split, x, y in splits:
        if not isinstance(x, np.ndarray) or x.ndim < 2:
            shape = getattr(x, "shape", None)
            problems.append(f"x_{split} must be an array of shape (n, *features), got shape {shape}")
            continue
        if x.dtype != np.float64:
            problems.append(f"x_{split} must be float64, got {x.dtype}")
        elif (bad := _first_nonfinite_record(x)) is not None:
            problems.append(f"x_{split} has a NaN or infinite value in record {bad}")
        if split == "test" and ds.x_train.ndim >= 2 and x.shape[1:] != ds.x_train.shape[1:]:
            problems.append(
                f"x_test has feature shape {tuple(x.shape[1:])} but x_train has "
                f"{tuple(ds.x_train.shape[1:])}")
        if y is None:
            if split == "train":
                problems.append("y_train is missing")
            continue
        if not isinstance(y, np.ndarray) or y.ndim != 1:
            problems.append(f"y_{split} must have shape (n,), got {getattr(y, 'shape', None)}")
            continue
        if y.dtype != np.int64:
            problems.append(f"y_{split} must be int64, got {y.dtype}")
            continue
        if y.shape[0] != x.shape[0]:
            problems.append(f"x_{split} has {x.shape[0]} records but y_{split} has {y.shape[0]} labels")
        if y.size and isinstance(ds.n_classes, (int, np.integer)):
            out = np.flatnonzero((y < 0) | (y >= ds.n_classes))
            if out.size:
                i = int(out[0])
                problems.append(
                    f"y_{split}[{i}] = {int(y[i])} is outside [0, {ds.n_classes}) "
                    f"({out.size} labels out of range)")
    if isinstance(ds.x_train, np.ndarray) and ds.x_train.ndim >= 1 and ds.x_train.shape[0] < 1:
        problems.append("the training split is empty (need at least 1 record)")
    if problems:
        raise DataError(f"dataset '{ds.name}': " + "; ".join(problems))
    return ds


# --------------------------------------------------------------------------------------
# Option parsing (ConfigError names the key)
# --------------------------------------------------------------------------------------


class _Options:
    """Typed read access to one loader's options; unknown keys are rejected up front."""

    def __init__(self, loader: str, options: Mapping[str, Any] | None, allowed: tuple[str, ...]):
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"data.options for dataset '{loader}' must be a mapping, got {type(options).__name__}")
        unknown = [k for k in options if k not in allowed]
        if unknown:
            raise ConfigError(
                f"unknown option '{unknown[0]}' for dataset '{loader}'; allowed options: "
                + ", ".join(allowed))
        self.loader = loader
        self.raw = dict(options)

    def _where(self, key: str) -> str:
        return f"data.options.{key} (dataset '{self.loader}')"

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def int(self, key: str, default: int | None, minimum: int | None = None) -> int | None:
        v = self.raw.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ConfigError(f"{self._where(key)} must be an integer, got {v!r}")
        if minimum is not None and v < minimum:
            raise ConfigError(f"{self._where(key)} must be >= {minimum}, got {v}")
        return int(v)

    def float(self, key: str, default: float, lo: float, hi: float, hi_open: bool) -> float:
        v = self.raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ConfigError(f"{self._where(key)} must be a number, got {v!r}")
        v = float(v)
        if not (math.isfinite(v) and lo <= v and (v < hi if hi_open else v <= hi)):
            bracket = ")" if hi_open else "]"
            raise ConfigError(f"{self._where(key)} must be in [{lo}, {hi}{bracket}, got {v}")
        return v

    def bool(self, key: str, default: bool) -> bool:
        v = self.raw.get(key, default)
        if not isinstance(v, (bool, np.bool_)):
            raise ConfigError(f"{self._where(key)} must be true or false, got {v!r}")
        return bool(v)

    def str(self, key: str, default: str | None) -> str | None:
        v = self.raw.get(key, default)
        if v is None:
            return None
        if not isinstance(v, str) or not v:
            raise ConfigError(f"{self._where(key)} must be a non-empty string, got {v!r}")
        return v

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        v = self.raw.get(key, default)
        if v not in choices:
            raise ConfigError(
                f"{self._where(key)} must be one of {', '.join(choices)}, got {v!r}")
        return v

    def int_list(self, key: str, allowed: tuple[int, ...]) -> list[int] | None:
        v = self.raw.get(key)
        if v is None:
            return None
        if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
            raise ConfigError(f"{self._where(key)} must be a list of integers, got {v!r}")
        out = []
        for item in v:
            if isinstance(item, bool) or not isinstance(item, (int, np.integer)) \
                    or int(item) not in allowed:
                raise ConfigError(
                    f"{self._where(key)} must list values from {list(allowed)}, got {item!r}")
            out.append(int(item))
        if not out:
            raise ConfigError(f"{self._where(key)} must not be empty")
        if len(set(out)) != len(out):
            raise ConfigError(f"{self._where(key)} lists a value twice: {out}")
        return sorted(out)

    def file(self, base_dir: Path | None, default_name: str | None, hint: str) -> Path:
        """Resolve `path` (a file) or `data_dir` (a folder holding `default_name`)."""
        path = self.str("path", None)
        data_dir = self.str("data_dir", None) if default_name is not None else None
        if path is not None and data_dir is not None:
            raise ConfigError(
                f"give either data.options.path or data.options.data_dir for dataset "
                f"'{self.loader}', not both")
        if path is None and data_dir is None:
            if default_name is None:
                raise ConfigError(f"{self._where('path')} is required (the .npz file to load)")
            raise DataError(f"no {default_name} location given for dataset '{self.loader}': {hint}")
        p = Path(path if path is not None else data_dir).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = Path(base_dir) / p
        if data_dir is not None:
            p = p / default_name
        if not p.is_file():
            what = default_name or "data file"
            raise DataError(f"{what} not found at {p}" + (f": {hint}" if hint else ""))
        return p


# --------------------------------------------------------------------------------------
# Array helpers
# --------------------------------------------------------------------------------------


class _Npz:
    """Read-only access to an .npz archive with DataErrors that list the keys present."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            obj = np.load(self.path, allow_pickle=False)
        except FileNotFoundError:
            raise DataError(f"file not found: {self.path}") from None
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise DataError(f"cannot read {self.path} as a numpy .npz archive: {exc}") from None
        if not isinstance(obj, np.lib.npyio.NpzFile):
            raise DataError(
                f"{self.path} holds a single array, not an .npz archive of named arrays "
                f"(save it with numpy.savez)")
        self.npz = obj
        self.keys = tuple(sorted(obj.files))

    def __enter__(self) -> "_Npz":
        return self

    def __exit__(self, *exc) -> None:
        self.npz.close()

    def __contains__(self, key: str) -> bool:
        return key in self.npz.files

    def get(self, key: str) -> np.ndarray:
        if key not in self.npz.files:
            raise DataError(
                f"{self.path} has no array '{key}'; keys present: {', '.join(self.keys) or 'none'}")
        try:
            return self.npz[key]
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise DataError(f"cannot read array '{key}' from {self.path}: {exc}") from None


def _as_features(x: np.ndarray, where: str, min_ndim: int = 2) -> np.ndarray:
    if x.dtype.kind not in "biuf":
        raise DataError(f"{where} must hold numbers, got dtype {x.dtype}")
    if x.ndim < min_ndim:
        raise DataError(f"{where} must have shape (n, *features), got {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float64)


def _as_labels(y: np.ndarray, where: str) -> np.ndarray:
    """Labels as int64 of shape (n,); (n, 1) is flattened; floats must be whole numbers."""
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{where} must have shape (n,) or (n, 1), got {y.shape}")
    if y.dtype.kind in "biu":
        return np.ascontiguousarray(y, dtype=np.int64)
    if y.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
        if bad.size:
            raise DataError(
                f"{where}[{int(bad[0])}] = {y[bad[0]]!r} is not an integer class label")
        return np.ascontiguousarray(y, dtype=np.int64)
    raise DataError(f"{where} must hold integer class labels, got dtype {y.dtype}")


def _check_pair(x: np.ndarray, y: np.ndarray | None, where: str) -> None:
    if y is not None and x.shape[0] != y.shape[0]:
        raise DataError(f"{where}: {x.shape[0]} records but {y.shape[0]} labels")


def _check_same_features(x_train: np.ndarray, x_test: np.ndarray | None, name: str) -> None:
    if x_test is not None and x_test.shape[1:] != x_train.shape[1:]:
        raise DataError(
            f"dataset '{name}': test features have shape {tuple(x_test.shape[1:])} but training "
            f"features have {tuple(x_train.shape[1:])}; both splits must come from the same "
            f"feature pipeline")


def _subsample_sorted(rng: np.random.Generator, idx: np.ndarray, k: int) -> np.ndarray:
    """k of the indices idx, chosen uniformly by rng, returned in ascending (file) order."""
    if k >= idx.size:
        return np.sort(idx)
    return np.sort(rng.choice(idx, size=k, replace=False))


def _resolve_path(path: str | Path, base_dir: Path | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    return p


# --------------------------------------------------------------------------------------
# blobs
# --------------------------------------------------------------------------------------

_BLOBS_VARIANTS = {"separable": (1.25, 0.35), "overlapping": (1.0, 0.75)}
_BLOBS_FEATURES = ("cubic", "raw")


def blobs_features(points_2d: np.ndarray, features: str = "cubic") -> np.ndarray:
    """Map raw planar points (m, 2) to the blobs model's feature space, float64.

    "cubic": (x1, x2, x1^2, x2^2, x1^3, x2^3), shape (m, 6); "raw": (x1, x2), shape (m, 2).
    The blobs loader uses this function, so heat maps over the input plane match training.
    """
    if features not in _BLOBS_FEATURES:
        raise ConfigError(f"blobs features must be one of {', '.join(_BLOBS_FEATURES)}, got {features!r}")
    p = np.asarray(points_2d, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != 2:
        raise DataError(f"blobs points must have shape (m, 2), got {p.shape}")
    if features == "raw":
        return np.ascontiguousarray(p)
    return np.ascontiguousarray(np.concatenate([p, p ** 2, p ** 3], axis=1))


def _load_blobs(options: Mapping[str, Any] | None, base_dir: Path | None) -> Dataset:
    opts = _Options("blobs", options, ("variant", "n_samples", "test_fraction", "seed", "features"))
    variant = opts.choice("variant", "separable", tuple(_BLOBS_VARIANTS))
    n_samples = opts.int("n_samples", 6250, minimum=2)
    test_fraction = opts.float("test_fraction", 0.2, 0.0, 1.0, hi_open=True)
    seed = opts.int("seed", 0, minimum=0)
    features = opts.choice("features", "cubic", _BLOBS_FEATURES)
    n_test = int(math.floor(n_samples * test_fraction + 0.5))
    n_train = n_samples - n_test
    if n_train < 1:
        raise ConfigError(
            f"data.options.test_fraction (dataset 'blobs') = {test_fraction} leaves no training "
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


# --------------------------------------------------------------------------------------
# generic npz
# --------------------------------------------------------------------------------------


def _infer_n_classes(opts: _Options, *ys: np.ndarray | None) -> int:
    n_classes = opts.int("n_classes", None, minimum=2)
    if n_classes is not None:
        return n_classes
    top = max((int(y.max()) for y in ys if y is not None and y.size), default=0)
    return max(2, top + 1)


def _load_npz(options: Mapping[str, Any] | None, base_dir: Path | None) -> Dataset:
    opts = _Options("npz", options,
                    ("path", "x_key", "y_key", "x_test_key", "y_test_key", "n_classes"))
    path = opts.file(base_dir, None, "")
    x_key = opts.str("x_key", "x_train")
    y_key = opts.str("y_key", "y_train")
    x_test_key = opts.str("x_test_key", "x_test")
    y_test_key = opts.str("y_test_key", "y_test")
    with _Npz(path) as f:
        x = _as_features(f.get(x_key), f"{path.name}:{x_key}")
        y = _as_labels(f.get(y_key), f"{path.name}:{y_key}")
        _check_pair(x, y, f"{path.name} ({x_key}, {y_key})")
        x_test = y_test = None
        if x_test_key in f or opts.has("x_test_key"):
            x_test = _as_features(f.get(x_test_key), f"{path.name}:{x_test_key}")
            if y_test_key in f or opts.has("y_test_key"):
                y_test = _as_labels(f.get(y_test_key), f"{path.name}:{y_test_key}")
                _check_pair(x_test, y_test, f"{path.name} ({x_test_key}, {y_test_key})")
        elif opts.has("y_test_key"):
            raise ConfigError(
                "data.options.y_test_key (dataset 'npz') is set but the file has no test "
                f"features '{x_test_key}'; set x_test_key too")
    _check_same_features(x, x_test, "npz")
    n_classes = _infer_n_classes(opts, y, y_test)
    ds = Dataset(
        name="npz",
        x_train=x, y_train=y, x_test=x_test, y_test=y_test, n_classes=n_classes,
        meta={"source": str(path), "options": dict(opts.raw), "n_train": int(x.shape[0]),
              "n_test": 0 if x_test is None else int(x_test.shape[0])},
    )
    return validate_dataset(ds)


# --------------------------------------------------------------------------------------
# OctMNIST
# --------------------------------------------------------------------------------------

_OCT_TASKS = ("abnormal_vs_normal", "multiclass")
_OCT_ALL = (0, 1, 2, 3)


def _read_oct_split(f: _Npz, split: str) -> tuple[np.ndarray, np.ndarray]:
    images = f.get(f"{split}_images")
    labels = _as_labels(f.get(f"{split}_labels"), f"{f.path.name}:{split}_labels")
    if images.ndim != 3:
        raise DataError(
            f"{f.path.name}:{split}_images must have shape (N, H, W) (grayscale), got {images.shape}")
    if images.dtype.kind not in "biuf":
        raise DataError(f"{f.path.name}:{split}_images must hold numbers, got dtype {images.dtype}")
    _check_pair(images, labels, f"{f.path.name} ({split}_images, {split}_labels)")
    bad = np.flatnonzero((labels < 0) | (labels > 3))
    if bad.size:
        raise DataError(
            f"{f.path.name}:{split}_labels[{int(bad[0])}] = {int(labels[bad[0]])} is not an "
            f"OctMNIST class (0 CNV, 1 DME, 2 drusen, 3 normal)")
    return images, labels


def _oct_images(images: np.ndarray, idx: np.ndarray, scale: bool, where: str) -> np.ndarray:
    x = np.ascontiguousarray(images[idx], dtype=np.float64)[:, None, :, :]
    bad = _first_nonfinite_record(x)
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
            f"{sorted(counts)}; widen data.options.classes or set balance: false")
    m = min(counts.values())
    keep = [_subsample_sorted(rng, idx[groups == v], m) for v in values]
    return np.sort(np.concatenate(keep))


def _load_octmnist(options: Mapping[str, Any] | None, base_dir: Path | None) -> Dataset:
    opts = _Options("octmnist", options,
                    ("path", "data_dir", "task", "classes", "balance", "seed", "test_classes",
                     "split_test", "scale"))
    task = opts.choice("task", "abnormal_vs_normal", _OCT_TASKS)
    classes = opts.int_list("classes", _OCT_ALL)
    test_classes = opts.int_list("test_classes", _OCT_ALL)
    balance = opts.bool("balance", False)
    seed = opts.int("seed", 0, minimum=0)
    split_test = opts.choice("split_test", "test", ("test", "val", "none"))
    scale = opts.bool("scale", True)
    path = opts.file(base_dir, OCTMNIST_FILENAME, _OCTMNIST_HINT)
    keep_train = classes if classes is not None else list(_OCT_ALL)
    keep_test = test_classes if test_classes is not None else keep_train

    def task_labels(orig: np.ndarray) -> np.ndarray:
        if task == "abnormal_vs_normal":
            return (orig != _OCT_NORMAL).astype(np.int64)
        return orig.astype(np.int64)

    with _Npz(path) as f:
        images, orig = _read_oct_split(f, "train")
        idx = np.flatnonzero(np.isin(orig, keep_train))
        if idx.size == 0:
            raise DataError(
                f"{path.name}: no training image has a class in {keep_train}; check "
                f"data.options.classes")
        if balance:
            rng = np.random.default_rng(seed)
            idx = _balance(rng, idx, task_labels(orig[idx]), f"dataset 'octmnist' ({path.name})")
        x = _oct_images(images, idx, scale, f"{path.name}:train_images")
        y = task_labels(orig[idx])
        x_test = y_test = None
        n_test_source = 0
        if split_test != "none":
            t_images, t_orig = _read_oct_split(f, split_test)
            t_idx = np.flatnonzero(np.isin(t_orig, keep_test))
            n_test_source = int(t_idx.size)
            x_test = _oct_images(t_images, t_idx, scale, f"{path.name}:{split_test}_images")
            y_test = task_labels(t_orig[t_idx])
    _check_same_features(x, x_test, "octmnist")
    counts = {OCTMNIST_CLASS_NAMES[c]: int(np.sum(orig[idx] == c)) for c in keep_train}
    ds = Dataset(
        name="octmnist",
        x_train=x, y_train=y, x_test=x_test, y_test=y_test,
        n_classes=2 if task == "abnormal_vs_normal" else 4,
        meta={
            "source": str(path),
            "options": {"task": task, "classes": keep_train, "test_classes": keep_test,
                        "balance": balance, "seed": seed, "split_test": split_test,
                        "scale": scale},
            "label_meaning": ({"0": "normal", "1": "abnormal"} if task == "abnormal_vs_normal"
                              else {str(k): v for k, v in OCTMNIST_CLASS_NAMES.items()}),
            "train_class_counts": counts,
            "n_train": int(x.shape[0]),
            "n_test": n_test_source,
        },
        source_index=idx.astype(np.int64),
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
    opts = _Options("octmnist-public", options,
                    ("path", "data_dir", "labels", "balance", "seed", "split_test", "scale"))
    labels = opts.choice("labels", "multiclass", ("multiclass", "binary"))
    balance = opts.bool("balance", True)
    seed = opts.int("seed", 0, minimum=0)
    split_test = opts.choice("split_test", "test", ("test", "val", "none"))
    scale = opts.bool("scale", True)
    file = opts.file(base_dir, OCTMNIST_FILENAME, _OCTMNIST_HINT)
    remap = np.array([0, 1, -1, 2], dtype=np.int64)  # CNV, DME, (drusen), normal

    def task_labels(orig: np.ndarray) -> np.ndarray:
        if labels == "binary":
            return (orig != _OCT_NORMAL).astype(np.int64)
        return remap[orig]

    with _Npz(file) as f:
        images, orig = _read_oct_split(f, "train")
        mask = np.isin(orig, _OCT_PUBLIC_CLASSES)
        n_excluded = 0
        if exclude_indices is not None:
            ex = np.asarray(exclude_indices)
            if ex.ndim != 1 or ex.dtype.kind not in "iu" or (ex.size and (
                    ex.min() < 0 or ex.max() >= orig.size)):
                raise DataError(
                    f"exclude_indices must be a 1-D array of train-split rows in [0, {orig.size})")
            n_excluded = int(np.sum(mask[ex]))
            mask[ex] = False
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            raise DataError(f"{file.name}: no CNV, DME or normal training image left")
        if balance:
            rng = np.random.default_rng(seed)
            idx = _balance(rng, idx, orig[idx], f"OctMNIST public split ({file.name})")
        x = _oct_images(images, idx, scale, f"{file.name}:train_images")
        y = task_labels(orig[idx])
        x_test = y_test = None
        if split_test != "none":
            t_images, t_orig = _read_oct_split(f, split_test)
            t_idx = np.flatnonzero(np.isin(t_orig, _OCT_PUBLIC_CLASSES))
            x_test = _oct_images(t_images, t_idx, scale, f"{file.name}:{split_test}_images")
            y_test = task_labels(t_orig[t_idx])
    ds = Dataset(
        name="octmnist-public",
        x_train=x, y_train=y, x_test=x_test, y_test=y_test,
        n_classes=3 if labels == "multiclass" else 2,
        meta={
            "source": str(file),
            "options": {"labels": labels, "balance": balance, "seed": seed,
                        "split_test": split_test, "scale": scale},
            "label_meaning": ({"0": "CNV", "1": "DME", "2": "normal"} if labels == "multiclass"
                              else {"0": "normal", "1": "abnormal"}),
            "train_class_counts": {OCTMNIST_CLASS_NAMES[c]: int(np.sum(orig[idx] == c))
                                   for c in _OCT_PUBLIC_CLASSES},
            "n_excluded": n_excluded,
        },
        source_index=idx.astype(np.int64),
    )
    return validate_dataset(ds)


# --------------------------------------------------------------------------------------
# IMDB embeddings
# --------------------------------------------------------------------------------------


def _load_imdb(options: Mapping[str, Any] | None, base_dir: Path | None) -> Dataset:
    opts = _Options("imdb", options, ("path", "data_dir", "max_train", "seed"))
    max_train = opts.int("max_train", None, minimum=1)
    seed = opts.int("seed", 0, minimum=0)
    path = opts.file(base_dir, IMDB_FILENAME, _IMDB_HINT)
    with _Npz(path) as f:
        x = _as_features(f.get("x_train"), f"{path.name}:x_train")
        y = _as_labels(f.get("y_train"), f"{path.name}:y_train")
        x_test = _as_features(f.get("x_test"), f"{path.name}:x_test")
        y_test = _as_labels(f.get("y_test"), f"{path.name}:y_test")
    for split, arr in (("x_train", x), ("x_test", x_test)):
        if arr.ndim != 2:
            raise DataError(f"{path.name}:{split} must have shape (n, dim), got {arr.shape}")
    _check_pair(x, y, f"{path.name} (x_train, y_train)")
    _check_pair(x_test, y_test, f"{path.name} (x_test, y_test)")
    _check_same_features(x, x_test, "imdb")
    n_source = int(x.shape[0])
    source_index = None
    if max_train is not None and max_train < n_source:
        source_index = _subsample_sorted(np.random.default_rng(seed), np.arange(n_source), max_train)
        x, y = x[source_index], y[source_index]
    ds = Dataset(
        name="imdb",
        x_train=np.ascontiguousarray(x), y_train=np.ascontiguousarray(y),
        x_test=x_test, y_test=y_test, n_classes=2,
        meta={"source": str(path),
              "options": {"max_train": max_train, "seed": seed},
              "label_meaning": {"0": "negative", "1": "positive"},
              "embedding_dim": int(x.shape[1]),
              "n_train_source": n_source,
              "n_train": int(x.shape[0]),
              "n_test": int(x_test.shape[0])},
        source_index=None if source_index is None else source_index.astype(np.int64),
    )
    return validate_dataset(ds)


# --------------------------------------------------------------------------------------
# Dispatch and query files
# --------------------------------------------------------------------------------------

_LOADERS: dict[str, Callable[[Mapping[str, Any] | None, Path | None], Dataset]] = {
    "blobs": _load_blobs,
    "npz": _load_npz,
    "octmnist": _load_octmnist,
    "imdb": _load_imdb,
}
DATASET_NAMES = tuple(_LOADERS)


def load_dataset(name: str, options: Mapping[str, Any] | None = None,
                 base_dir: Path | None = None) -> Dataset:
    """Load dataset `name` (blobs, npz, octmnist, imdb) with its `options`.

    Relative paths in the options are resolved against `base_dir` (e.g. the config file's
    folder) when given, else against the working directory. The result is validated.
    """
    loader = _LOADERS.get(name) if isinstance(name, str) else None
    if loader is None:
        raise ConfigError(
            f"unknown dataset {name!r} in data.name; choose one of {', '.join(DATASET_NAMES)}")
    return loader(options, None if base_dir is None else Path(base_dir))


def load_npz_queries(path: str | Path, split: str = "test",
                     base_dir: Path | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Query points (and labels, if present) from an .npz file for the CLI.

    Reads `x_<split>`/`y_<split>` when `x_<split>` exists, else `x`/`y`. Returns x as float64
    (n, *features) and y as int64 (n,) or None. Labels of shape (n, 1) are flattened.
    """
    p = _resolve_path(path, base_dir)
    if not p.is_file():
        raise DataError(f"query file not found: {p}")
    with _Npz(p) as f:
        if f"x_{split}" in f:
            x_key, y_key = f"x_{split}", f"y_{split}"
        elif "x" in f:
            x_key, y_key = "x", "y"
        else:
            raise DataError(
                f"{p} has neither 'x_{split}' nor 'x'; keys present: {', '.join(f.keys) or 'none'}")
        x = _as_features(f.get(x_key), f"{p.name}:{x_key}")
        y = _as_labels(f.get(y_key), f"{p.name}:{y_key}") if y_key in f else None
    if x.shape[0] == 0:
        raise DataError(f"{p.name}:{x_key} holds no query")
    bad = _first_nonfinite_record(x)
    if bad is not None:
        raise DataError(f"{p.name}:{x_key} has a NaN or infinite value in record {bad}")
    _check_pair(x, y, f"{p.name} ({x_key}, {y_key})")
    if y is not None and y.size and y.min() < 0:
        raise DataError(f"{p.name}:{y_key} has a negative label at record {int(np.argmin(y))}")
    return x, y
