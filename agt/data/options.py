"""Shared pieces of the dataset loaders: typed option access, npz reading, array checks.

`Options` gives typed read access to one loader's ``data`` options; every problem (an
unknown key, a wrong type, an impossible value) is collected and raised together by
`Options.done()` as one `ConfigError` naming the keys.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from agt.errors import ConfigError, DataError, Problems


class Options:
    """Typed read access to one loader's options.

    Every accessor returns the parsed value, or records a problem and returns the default;
    a loader reads all its options and then calls `done()`, which raises one `ConfigError`
    naming every bad key (unknown keys included) before any file is read."""

    def __init__(self, loader: str, options: Mapping[str, Any] | None, allowed: tuple[str, ...]):
        self.loader = loader
        self.problems = Problems(kind=ConfigError)
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            self.problems.add(f"the options of dataset '{loader}' (keys beside data.name) must "
                              f"be a mapping, got {type(options).__name__}")
            options = {}
        for key in options:
            if key not in allowed:
                self.problems.add(f"unknown option '{key}' for dataset '{loader}'; allowed "
                                  f"options: " + ", ".join(allowed))
        self.raw = dict(options)

    def done(self) -> None:
        """Raise the collected problems (if any)."""
        self.problems.raise_if_any()

    def _where(self, key: str) -> str:
        return f"data.{key} (dataset '{self.loader}')"

    def _bad(self, key: str, what: str, default: Any) -> Any:
        self.problems.add(f"{self._where(key)} {what}")
        return default

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def int(self, key: str, default: int | None, minimum: int | None = None) -> int | None:
        v = self.raw.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            return self._bad(key, f"must be an integer, got {v!r}", default)
        if minimum is not None and v < minimum:
            return self._bad(key, f"must be >= {minimum}, got {v}", default)
        return int(v)

    def float(self, key: str, default: float, lo: float, hi: float, hi_open: bool) -> float:
        v = self.raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            return self._bad(key, f"must be a number, got {v!r}", default)
        v = float(v)
        if not (math.isfinite(v) and lo <= v and (v < hi if hi_open else v <= hi)):
            bracket = ")" if hi_open else "]"
            return self._bad(key, f"must be in [{lo}, {hi}{bracket}, got {v}", default)
        return v

    def bool(self, key: str, default: bool) -> bool:
        v = self.raw.get(key, default)
        if not isinstance(v, (bool, np.bool_)):
            return self._bad(key, f"must be true or false, got {v!r}", default)
        return bool(v)

    def str(self, key: str, default: str | None) -> str | None:
        v = self.raw.get(key, default)
        if v is None:
            return None
        if not isinstance(v, str) or not v:
            return self._bad(key, f"must be a non-empty string, got {v!r}", default)
        return v

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        v = self.raw.get(key, default)
        if v not in choices:
            return self._bad(key, f"must be one of {', '.join(choices)}, got {v!r}", default)
        return v

    def int_list(self, key: str, allowed: tuple[int, ...]) -> list[int] | None:
        v = self.raw.get(key)
        if v is None:
            return None
        if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
            return self._bad(key, f"must be a list of integers, got {v!r}", None)
        out = []
        for item in v:
            if isinstance(item, bool) or not isinstance(item, (int, np.integer)) \
                    or int(item) not in allowed:
                return self._bad(key, f"must list values from {list(allowed)}, got {item!r}",
                                 None)
            out.append(int(item))
        if not out:
            return self._bad(key, "must not be empty", None)
        if len(set(out)) != len(out):
            return self._bad(key, f"lists a value twice: {out}", None)
        return sorted(out)

    def file(self, base_dir: Path | None, default_name: str | None, hint: str) -> Path:
        """Resolve `path` (a file) or `data_dir` (a folder holding `default_name`); raises the
        options collected so far first (read every option before calling this)."""
        path = self.str("path", None)
        data_dir = self.str("data_dir", None) if default_name is not None else None
        if path is not None and data_dir is not None:
            self.problems.add(f"give either data.path or data.data_dir for "
                              f"dataset '{self.loader}', not both")
        if path is None and data_dir is None and default_name is None:
            self.problems.add(f"{self._where('path')} is required (the .npz file to load)")
        self.done()
        if path is None and data_dir is None:
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


class NpzArchive:
    """Read-only access to an .npz archive with DataErrors that list the keys present."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as fh:
                magic = fh.read(6)
            obj = np.load(self.path, allow_pickle=False)
        except FileNotFoundError:
            raise DataError(f"file not found: {self.path}") from None
        except ValueError:
            # numpy reads any other file as a pickle and suggests allow_pickle=True, which
            # would run code from the file: say what the file is not instead
            if magic[:4] != b"PK\x03\x04" and magic != b"\x93NUMPY":
                raise DataError(f"{self.path} is not a numpy .npz archive (numpy.savez writes "
                                f"one)") from None
            raise DataError(f"cannot read {self.path} as a numpy .npz archive (it holds "
                            f"object arrays, which are not read)") from None
        except (OSError, zipfile.BadZipFile, EOFError) as exc:
            raise DataError(f"cannot read {self.path} as a numpy .npz archive: {exc}") from None
        if not isinstance(obj, np.lib.npyio.NpzFile):
            raise DataError(
                f"{self.path} holds a single array, not an .npz archive of named arrays "
                f"(save it with numpy.savez)")
        self.npz = obj
        self.keys = tuple(sorted(obj.files))

    def __enter__(self) -> "NpzArchive":
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
        except ValueError:
            # an object (pickled) array: reading it would run code from the file
            raise DataError(f"array '{key}' of {self.path} holds Python objects (a pickled "
                            f"array), which are not read; save numbers with numpy.savez"
                            ) from None
        except (OSError, zipfile.BadZipFile, EOFError) as exc:
            raise DataError(f"cannot read array '{key}' from {self.path}: {exc}") from None


def as_features(x: np.ndarray, where: str, min_ndim: int = 2) -> np.ndarray:
    if x.dtype.kind not in "biuf":
        raise DataError(f"{where} must hold numbers, got dtype {x.dtype}")
    if x.ndim < min_ndim:
        raise DataError(f"{where} must have shape (n, *features), got {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float64)


def as_labels(y: np.ndarray, where: str) -> np.ndarray:
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
                f"{where}[{int(bad[0])}] = {y[bad[0]].item()!r} is not an integer class label")
        return np.ascontiguousarray(y, dtype=np.int64)
    raise DataError(f"{where} must hold integer class labels, got dtype {y.dtype}")


def check_pair(x: np.ndarray, y: np.ndarray | None, where: str) -> None:
    if y is not None and x.shape[0] != y.shape[0]:
        raise DataError(f"{where}: {x.shape[0]} records but {y.shape[0]} labels")


def check_same_features(x_train: np.ndarray, x_test: np.ndarray | None, name: str) -> None:
    if x_test is not None and x_test.shape[1:] != x_train.shape[1:]:
        raise DataError(
            f"dataset '{name}': test features have shape {tuple(x_test.shape[1:])} but training "
            f"features have {tuple(x_train.shape[1:])}; both splits must come from the same "
            f"feature pipeline")


def subsample_sorted(rng: np.random.Generator, idx: np.ndarray, k: int) -> np.ndarray:
    """k of the indices idx, chosen uniformly by rng, returned in ascending (file) order."""
    if k >= idx.size:
        return np.sort(idx)
    return np.sort(rng.choice(idx, size=k, replace=False))


def resolve_path(path: str | Path, base_dir: Path | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    return p

