"""Input validation shared by the mechanisms. A `Problems` collector gathers every problem
before one typed error is raised (privacy parameters -> PrivacyError, arrays -> DataError)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import DataError, PrivacyError


@dataclass
class Problems:
    """Collects problems; `raise_if_any` raises one error naming all of them."""

    privacy: list[str] = field(default_factory=list)
    data: list[str] = field(default_factory=list)

    def raise_if_any(self) -> None:
        if self.privacy:
            raise PrivacyError("; ".join(self.privacy + self.data))
        if self.data:
            raise DataError("; ".join(self.data))


def _is_real_number(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def check_epsilon(epsilon: object, problems: Problems, name: str = "epsilon") -> None:
    """epsilon must be a finite real number > 0."""
    if not _is_real_number(epsilon) or not math.isfinite(epsilon) or epsilon <= 0:
        problems.privacy.append(f"{name} must be a finite number > 0, got {epsilon!r}")


def check_delta(delta: object, problems: Problems, name: str = "delta",
                allow_zero: bool = False) -> None:
    """delta must be a real number in (0, 1) (or [0, 1) with allow_zero)."""
    low_ok = (lambda d: d >= 0) if allow_zero else (lambda d: d > 0)
    if not _is_real_number(delta) or not math.isfinite(delta) or not low_ok(delta) or delta >= 1:
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        problems.privacy.append(f"{name} must be a number in {interval}, got {delta!r}")


def check_count(q: object, problems: Problems, name: str = "Q") -> None:
    """A number of queries: an integer >= 1."""
    if isinstance(q, bool) or not isinstance(q, (int, np.integer)) or q < 1:
        problems.privacy.append(f"{name} must be an integer >= 1, got {q!r}")


def binary_array(values: ArrayLike, problems: Problems, name: str = "predictions"
                 ) -> NDArray[np.int64] | None:
    """Nominal binary predictions as int64; every entry must be exactly 0 or 1."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf":
        problems.data.append(f"{name} must be numeric 0/1 values, got dtype {arr.dtype}")
        return None
    bad = ~((arr == 0) | (arr == 1))
    if bad.any():
        first = arr[bad].ravel()[0]
        problems.data.append(
            f"{name} must be 0 or 1; {int(bad.sum())} entries are not (e.g. {first!r})")
        return None
    return arr.astype(np.int64)


def radius_array(radii: ArrayLike, problems: Problems, name: str = "radii"
                 ) -> NDArray[np.int64] | None:
    """Smooth radii as int64; entries must be finite, integral and >= 0."""
    arr = np.asarray(radii)
    if arr.dtype.kind == "b" or arr.dtype.kind not in "iuf":
        problems.data.append(f"{name} must be non-negative integers, got dtype {arr.dtype}")
        return None
    if arr.dtype.kind == "f":
        nonfinite = ~np.isfinite(arr)
        if nonfinite.any():
            problems.data.append(
                f"{name} must be finite; {int(nonfinite.sum())} entries are NaN or infinite")
            return None
        if (arr != np.floor(arr)).any():
            problems.data.append(f"{name} must be integers (grid indices), got fractional values")
            return None
        if (arr > 2.0**53).any():
            problems.data.append(f"{name} must be at most 2**53, got {arr.max()!r}")
            return None
    negative = arr < 0
    if negative.any():
        problems.data.append(f"{name} must be >= 0; {int(negative.sum())} entries are negative "
                             f"(e.g. {arr.min()!r})")
        return None
    return arr.astype(np.int64)
