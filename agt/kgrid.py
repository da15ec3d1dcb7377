"""The k grid: the distances a bundle holds bounds for, parsed once.

A grid is a strictly increasing tuple of distances g_0 = 0 < g_1 < ... < g_K. The
*stability radius* of a certified prediction is the grid index j of the largest certified
g_j (-1 where not even g_0 = 0 certifies). On a contiguous grid {0, 1, ..., K} the index is
the distance itself; on a sparse grid it is a lower bound on the distance that drops by at
most 1 between neighbouring datasets (box(D', g_{j-1}) lies inside box(D', g_j - 1), inside
box(D, g_j)), which is what smooth mechanisms need (Nissim-Raskhodnikova-Smith: the bound
exp(-beta r) must itself be beta-smooth); the value g_j would not be.

Every k must stay below an integer batch size (`require_below`): the top-k rule removes k of
the b per-sample gradients of a batch, and k >= b certifies nothing. Under ``batch_size:
full`` the trainer does not check: b is then n, which add-remove neighbours do not share, and
the rule stays sound for k >= b (the bound becomes the clamp range, agt/topk.py).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agt.errors import ConfigError

MAX_K = 10**9            # no dataset here is larger; bigger values are typos
MAX_VALUES = 100_000     # bounds for each value are stored: a larger grid does not fit memory

__all__ = ["KGrid", "MAX_K", "MAX_VALUES"]


@dataclass(frozen=True, eq=False)
class KGrid(Sequence):
    """An ascending grid of distances starting at 0 (a read-only sequence of ints)."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        v = self.values
        if not v or v[0] != 0 or any(b <= a for a, b in zip(v, v[1:])):
            raise ConfigError(f"a k grid must be ascending, without repeats and start at 0, "
                              f"got {v[:8]}{'...' if len(v) > 8 else ''}")

    # -- parsing --------------------------------------------------------------------------
    @staticmethod
    def parse(spec: Any) -> "KGrid":
        """Parse a k grid.

        Args:
            spec: a list of ints or a string like ``"0..199"``, ``"0,1,2,5"``, ``"0..10,20,50"``
                or ``"0..100:10"`` (a step). 0 is always included; sizes are checked before
                anything is materialised.

        Returns:
            The `KGrid`, ascending from 0.

        Raises:
            ConfigError: a malformed spec, an empty range, or a grid too large.
        """
        values: set[int] = set()
        count = 0

        def add_range(a: int, b: int, step: int, part: str) -> None:
            nonlocal count
            if b < a or step < 1:
                raise ConfigError(f"k_values range '{part}' is empty; write low..high")
            if b > MAX_K:
                raise ConfigError(f"k_values: {b} is larger than any dataset here "
                                  f"(at most {MAX_K})")
            n = (b - a) // step + 1
            count += n
            if count > MAX_VALUES:
                raise ConfigError(f"k_values has more than {MAX_VALUES} values; bounds are "
                                  f"stored for each, so use a sparse grid (e.g. '0..100,200,500')")
            values.update(range(a, b + 1, step))

        if isinstance(spec, KGrid):
            return spec
        if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):
            if spec < 0:
                raise ConfigError("k_values must be non-negative")
            add_range(int(spec), int(spec), 1, str(spec))
        elif isinstance(spec, (list, tuple, range)):
            for v in spec:
                if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                    raise ConfigError(f"k_values entries must be integers, got {v!r}")
                if v < 0:
                    raise ConfigError("k_values must be non-negative")
                add_range(int(v), int(v), 1, str(v))
        elif isinstance(spec, str):
            parts = spec.replace(" ", "").split(",")
            if not any(parts):
                raise ConfigError("k_values is empty; give e.g. '0..199' or '0,1,2,5'")
            for part in parts:
                if not part:
                    continue
                m = re.fullmatch(r"(\d{1,12})\.\.(\d{1,12})(?::(\d{1,12}))?", part)
                if m:
                    add_range(int(m.group(1)), int(m.group(2)), int(m.group(3) or 1), part)
                elif re.fullmatch(r"\d{1,12}", part):
                    add_range(int(part), int(part), 1, part)
                else:
                    raise ConfigError(f"k_values: cannot parse '{part}'; use e.g. '0..199' or "
                                      f"'0,1,2,5,10'")
        else:
            raise ConfigError(f"k_values must be a list of integers or a string like '0..199', "
                              f"got {spec!r}")
        if not values:
            raise ConfigError("k_values is empty; give e.g. '0..199' or [0, 1, 2, 5]")
        return KGrid(tuple(sorted(values | {0})))

    # -- sequence protocol --------------------------------------------------------------
    def __getitem__(self, i):
        return self.values[i]

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self):
        return iter(self.values)

    def __eq__(self, other: object) -> bool:
        """Equal to another grid or to a tuple/list of the same values."""
        if isinstance(other, (KGrid, tuple, list)):
            return self.values == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.values)

    # -- meaning ------------------------------------------------------------------------
    @property
    def contiguous(self) -> bool:
        """True for {0, 1, ..., K}: the radius (a grid index) is then the distance itself."""
        return self.values[-1] == len(self.values) - 1

    @property
    def k_max(self) -> int:
        """The largest k of the grid."""
        return self.values[-1]

    def value_at(self, index: int) -> int:
        """The distance of a grid index.

        Args:
            index: a grid index, or -1 (nothing certified).

        Returns:
            ``values[index]``, or -1 for -1.
        """
        return -1 if index < 0 else self.values[index]

    def require_below(self, batch: int, what: str = "the batch size", why: str = "") -> None:
        """Require every k to be smaller than the batch size (the top-k rule removes k of the
        batch's b per-sample gradients).

        Args:
            batch: the batch size b.
            what: how the message names `batch`.
            why: an explanation appended to the message.

        Raises:
            ConfigError: the largest k is >= `batch`.
        """
        if self.k_max >= batch:
            raise ConfigError(f"k value {self.k_max} must be smaller than {what} {batch}{why}; "
                              f"lower k_values (e.g. --k-values 0..{max(0, batch - 1)}) or "
                              f"raise batch_size")

    def below(self, batch: int) -> "KGrid":
        """The grid cut to k < batch (a function of the batch size only).

        Args:
            batch: the batch size.

        Returns:
            A `KGrid` of the values below `batch`.
        """
        return KGrid(tuple(k for k in self.values if k < batch))

    def describe(self) -> str:
        """A short description for messages.

        Returns:
            e.g. "50 values, 0..49 (contiguous)".
        """
        kind = "contiguous" if self.contiguous else "sparse"
        return f"{len(self)} values, {self.values[0]}..{self.k_max} ({kind})"
