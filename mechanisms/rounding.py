"""Directed rounding of exact rationals to floats: the one place where a computed privacy
constant is rounded, always towards safety (a scale up, an epsilon or a budget share down)."""

from __future__ import annotations

import math
from fractions import Fraction


def float_up(x: Fraction) -> float:
    """The smallest float >= x."""
    f = float(x)
    return math.nextafter(f, math.inf) if Fraction(f) < x else f


def float_down(x: Fraction) -> float:
    """The largest float <= x."""
    f = float(x)
    return math.nextafter(f, -math.inf) if Fraction(f) > x else f
