"""Input checks shared by the mechanisms, in the one validation vocabulary of agt.errors:
each check adds to a `Problems` collector, and one typed error names every problem
(privacy parameters -> PrivacyError, arrays -> DataError)."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import DataError, PrivacyError, Problems

__all__ = ["privacy_problems", "is_real", "check_epsilon", "check_delta", "check_count",
           "class_array", "radius_array", "check_params"]


def privacy_problems(where: str = "") -> Problems:
    """A collector whose problems are PrivacyErrors unless said otherwise."""
    return Problems(where, PrivacyError)


def is_real(x: object) -> bool:
    return (isinstance(x, (int, float, np.integer, np.floating))
            and not isinstance(x, (bool, np.bool_)))


# Above this an epsilon promises nothing, and noise scales such as 6 S / eps would leave the
# normal float range (a review found ss-cauchy's scales subnormal from eps ~ 1e47 and 0 at
# 1e64, an infinite ratio between neighbouring release laws).
MAX_EPSILON = 1e6
# Below this the noise scales (2 / eps, ln(1/delta) / eps, ...) leave the float range: the
# release would be pure noise, and an audit found such values failing only after the
# ledger had recorded the spend.
MIN_EPSILON = 1e-300


def check_epsilon(epsilon: object, problems: Problems, name: str = "epsilon") -> None:
    """epsilon must be a real number in [MIN_EPSILON, MAX_EPSILON]."""
    if not is_real(epsilon) or not math.isfinite(epsilon) or epsilon <= 0:
        problems.add(f"{name} must be a finite number > 0, got {epsilon!r}", PrivacyError)
    elif epsilon < MIN_EPSILON:
        problems.add(f"{name} must be at least {MIN_EPSILON:g} (smaller values push noise "
                     f"scales out of the float range), got {epsilon!r}", PrivacyError)
    elif epsilon > MAX_EPSILON:
        problems.add(f"{name} must be at most {MAX_EPSILON:g} (larger values give no privacy "
                     f"and push noise scales out of the float range), got {epsilon!r}",
                     PrivacyError)


def check_delta(delta: object, problems: Problems, name: str = "delta",
                allow_zero: bool = False) -> None:
    """delta must be a real number in (0, 1) (or [0, 1) with allow_zero)."""
    ok = is_real(delta) and math.isfinite(delta) and delta < 1 and \
        (delta >= 0 if allow_zero else delta > 0)
    if not ok:
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        problems.add(f"{name} must be a number in {interval}, got {delta!r}", PrivacyError)


def check_count(q: object, problems: Problems, name: str = "Q") -> None:
    """A number of queries: an integer >= 1."""
    if isinstance(q, (bool, np.bool_)) or not isinstance(q, (int, np.integer)) or q < 1:
        problems.add(f"{name} must be an integer >= 1, got {q!r}", PrivacyError)


def class_array(values: ArrayLike, n_classes: int, problems: Problems,
                name: str = "predictions") -> NDArray[np.int64] | None:
    """Class labels as int64; every entry must be an integer in [0, n_classes)."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf":
        problems.add(f"{name} must be class labels, got dtype {arr.dtype}", DataError)
        return None
    bad = ~np.isin(arr, np.arange(n_classes)) if arr.size else np.zeros(arr.shape, bool)
    if arr.dtype.kind == "f":
        bad |= ~np.isfinite(arr)
    if bad.any():
        # no offending value in the message: labels and radii are owner-only
        problems.add(f"{name} must be classes in 0..{n_classes - 1}; {int(bad.sum())} entries "
                     f"are not", DataError)
        return None
    return arr.astype(np.int64)


def radius_array(radii: ArrayLike, problems: Problems, name: str = "radii",
                 minimum: int = -1) -> NDArray[np.int64] | None:
    """Stability radii as int64: finite integers >= `minimum` (-1: not even k = 0 certified)."""
    arr = np.asarray(radii)
    if arr.dtype.kind == "b" or arr.dtype.kind not in "iuf":
        problems.add(f"{name} must be integers >= {minimum}, got dtype {arr.dtype}", DataError)
        return None
    if arr.dtype.kind == "f":
        nonfinite = ~np.isfinite(arr)
        if nonfinite.any():
            problems.add(f"{name} must be finite; {int(nonfinite.sum())} entries are NaN or "
                         f"infinite", DataError)
            return None
        if (arr != np.floor(arr)).any():
            problems.add(f"{name} must be integers (grid indices), got fractional values",
                         DataError)
            return None
    if (arr > (2**53 if arr.dtype.kind in "iu" else 2.0**53)).any():   # uint64 would wrap
        problems.add(f"{name} must be at most 2**53; {int((arr > 2**53).sum())} entries are "
                     f"larger", DataError)
        return None
    low = arr < minimum
    if low.any():
        problems.add(f"{name} must be >= {minimum}; {int(low.sum())} entries are lower",
                     DataError)
        return None
    return arr.astype(np.int64)


def check_params(name: str, epsilon, delta, needs_delta: bool) -> None:
    """A mechanism's (epsilon, delta): epsilon > 0; delta in (0, 1) where it takes one, none
    (None or 0) where it is pure eps-DP. One PrivacyError names every problem."""
    problems = privacy_problems(name)
    check_epsilon(epsilon, problems)
    if needs_delta:
        check_delta(delta, problems)
    elif delta not in (None, 0, 0.0):
        problems.add(f"{name} is pure eps-DP and takes no delta, got {delta!r}")
    problems.raise_if_any()
