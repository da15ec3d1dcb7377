"""Renyi differential privacy: curves on a fixed grid of orders, their composition, and the
conversion to (eps, delta).

A mechanism M is (alpha, r)-RDP (Mironov 2017) when D_alpha(M(D) || M(D')) <= r for every
pair of neighbours. Here a guarantee is a *curve*: its bound r(alpha) at every order of the
fixed grid `ORDERS` (+inf where nothing is claimed). Everything that leaves this module is
rounded up (a relative 1e-12 pad and one ulp), so a curve never claims less than its
formula.

Curves
------
* `gaussian_curve(rho)`: r(alpha) = rho alpha. The Gaussian mechanism with L2 sensitivity s
  and noise N(0, sigma^2) per coordinate has rho = s^2 / (2 sigma^2) (Mironov 2017, Prop. 7);
  so does the discrete Gaussian N_Z(0, sigma^2) on integer vectors (Canonne, Kamath &
  Steinke 2020, Thm 4 and its multivariate form, Cor. 9), which is what the GNMax releases
  draw. GNMax on a vote-count vector: one replaced record moves one vote, the count vector
  moves by (+1, -1), s = sqrt(2), rho = 1 / sigma^2. The threshold test of Confident-GNMax
  adds noise to the largest count, s = 1, rho = 1 / (2 sigma_1^2). Post-processing (the
  argmax, the answer/no-answer bit) only lowers a Renyi divergence.
* `pure_curve(eps)`: eps-DP gives r(alpha) <= eps at every order (the Renyi divergence is at
  most the max divergence) and r(alpha) <= alpha eps^2 / 2 (eps-DP implies eps^2/2-zCDP; Bun &
  Steinke 2016, Prop. 3.3). The curve is the smaller of the two. An (eps, delta)-DP guarantee
  with delta > 0 implies no RDP bound at any order and is refused (`curve_of`).
* `gnss_curve(beta, sigma)`: the release f(D) + S(D) N(0, sigma^2) of a real f with a
  beta-smooth upper bound S on its local sensitivity (Papernot et al. 2018, Thm 23):
  r(alpha) = alpha e^(2 beta) / sigma^2 + (beta alpha - ln(1 - 2 alpha beta) / 2) / (alpha - 1)
  for 2 alpha beta < 1, +inf above.

Composition and conversion
--------------------------
Curves of mechanisms run one after another add order by order (Mironov 2017, Prop. 1),
also when each mechanism is chosen after seeing the earlier outputs. The sum converts to
(eps, delta)-DP by the conversion of Canonne, Kamath & Steinke 2020 (Prop. 12) and Asoodeh
et al. 2020: eps = min over alpha of r(alpha) + ln((alpha - 1) / alpha) - (ln delta +
ln alpha) / (alpha - 1), tighter than Mironov's r(alpha) + ln(1/delta) / (alpha - 1). That
formula is dp-accounting's `compute_epsilon`, used as it is; what is written here is the
curve arithmetic on a fixed grid (dp-accounting's RDP accountant composes its own event
types only, and the data-dependent curves of PATE are none of them) and the rounding.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from agt.errors import PrivacyError
from mechanisms.checks import check_delta, check_epsilon, is_real, privacy_problems

__all__ = ["ORDERS", "Curve", "gaussian_curve", "pure_curve", "gnss_curve", "compose_curves",
           "curve_epsilon", "curve_of", "curve_problem", "curve_to_bytes", "curve_from_bytes",
           "pad_up"]

#: the orders every curve is stated at (a fixed grid, so curves of different mechanisms add)
ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 7.0, 8.0, 9.0,
    10.0, 11.0, 12.0, 14.0, 16.0, 18.0, 20.0, 22.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0,
    80.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0, 1024.0)

#: a curve: one float per order of ORDERS (+inf where nothing is claimed)
Curve = tuple[float, ...]

_PAD = 1e-12


def pad_up(x: float) -> float:
    """x raised by a relative 1e-12 and one ulp: above the rounding of the float formulas
    here (they err by a few ulps)."""
    if not math.isfinite(x) or x == 0:
        return x            # (an exact 0, e.g. nothing spent, stays 0)
    return math.nextafter(x + abs(x) * _PAD, math.inf)


def _orders() -> np.ndarray:
    return np.asarray(ORDERS, dtype=np.float64)


def _curve(values: Iterable[float]) -> Curve:
    out = tuple(pad_up(float(v)) if v > 0 else 0.0 for v in values)
    if len(out) != len(ORDERS) or any(math.isnan(v) for v in out):
        raise PrivacyError("internal: a Renyi curve must have one value per order, none NaN")
    return out


def gaussian_curve(rho: float) -> Curve:
    """r(alpha) = rho alpha at every order (module docstring: the Gaussian mechanism, and the
    discrete Gaussian, with rho = sensitivity^2 / (2 sigma^2))."""
    if not is_real(rho) or not math.isfinite(rho) or rho < 0:
        raise PrivacyError(f"rho must be a finite number >= 0, got {rho!r}")
    return _curve(float(rho) * _orders())


def pure_curve(epsilon: float) -> Curve:
    """The curve of an eps-DP mechanism: min(eps, alpha eps^2 / 2) (module docstring)."""
    problems = privacy_problems("pure-DP curve")
    check_epsilon(epsilon, problems)
    problems.raise_if_any()
    e = float(epsilon)
    return _curve(np.minimum(e, _orders() * e * e / 2.0))


def gnss_curve(beta: float, sigma: float) -> Curve:
    """The curve of the Gaussian smooth-sensitivity release f(D) + S(D) N(0, sigma^2) with a
    beta-smooth bound S (Papernot et al. 2018, Thm 23); +inf at orders with 2 alpha beta >= 1.

    Args:
        beta: the smoothness of S (S(D) <= e^beta S(D') on neighbours), > 0.
        sigma: the noise standard deviation in units of S, > 0.
    """
    problems = privacy_problems("smooth-sensitivity release")
    problems.check(is_real(beta) and math.isfinite(beta) and beta > 0,
                   f"beta must be a finite number > 0, got {beta!r}")
    problems.check(is_real(sigma) and math.isfinite(sigma) and sigma > 0,
                   f"sigma must be a finite number > 0, got {sigma!r}")
    problems.raise_if_any()
    out = []
    for a in ORDERS:
        if 2.0 * a * beta >= 1.0:
            out.append(math.inf)
            continue
        out.append(a * math.exp(2.0 * beta) / sigma ** 2
                   + (beta * a - 0.5 * math.log1p(-2.0 * a * beta)) / (a - 1.0))
    return _curve(out)


def curve_problem(curve: object) -> str | None:
    """Why `curve` is not a Renyi curve on ORDERS (None when it is one): one real number per
    order, each >= 0 or +inf, none NaN."""
    if not isinstance(curve, (tuple, list)) or len(curve) != len(ORDERS):
        return (f"a Renyi curve needs one value per order of mechanisms.rdp.ORDERS "
                f"({len(ORDERS)}), got {type(curve).__name__} of length "
                f"{len(curve) if hasattr(curve, '__len__') else '?'}")
    for v in curve:
        if not is_real(v) or math.isnan(v) or v < 0:
            return f"a Renyi curve's values must be numbers >= 0 (or +inf), got {v!r}"
    return None


def compose_curves(groups: Sequence[tuple[Curve, int]]) -> Curve:
    """The curve of running every (curve, count) group's mechanism `count` times, one after
    another: sum over groups of count * curve, order by order (rounded up). Refuses a group
    that is not a curve (`curve_problem`) or a negative count."""
    total = np.zeros(len(ORDERS))
    for curve, count in groups:
        problem = curve_problem(curve)
        if problem is not None:
            raise PrivacyError(problem)
        if count < 0:
            raise PrivacyError("internal: a negative count of charges")
        if count:
            with np.errstate(invalid="ignore"):
                total = total + count * np.asarray(curve, dtype=np.float64)
    return _curve(np.nan_to_num(total, nan=math.inf))


def curve_epsilon(curve: Curve, delta: float) -> tuple[float, float]:
    """(eps, alpha): the smallest eps over the orders for which the curve implies
    (eps, delta)-DP (module docstring), rounded up, and the order that gives it.

    Args:
        curve: the composed curve.
        delta: the target delta, in (0, 1).
    """
    problems = privacy_problems("Renyi conversion")
    check_delta(delta, problems)
    problems.raise_if_any()
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    finite = [(a, r) for a, r in zip(ORDERS, curve) if math.isfinite(r)]
    if not finite:
        return math.inf, math.nan
    eps, order = compute_epsilon([a for a, _ in finite], [r for _, r in finite], float(delta))
    return pad_up(float(eps)), float(order)


def curve_of(epsilon: float, delta: float, rdp: Curve | None, mechanism: str) -> Curve:
    """The curve a guarantee brings to an RDP ledger: its own where the mechanism states one,
    else the pure-DP curve of eps; an (eps, delta > 0) guarantee without one is refused."""
    if rdp is not None:
        problem = curve_problem(rdp)
        if problem is not None:
            raise PrivacyError(f"{mechanism}: {problem}; nothing was recorded")
        return tuple(float(v) for v in rdp)
    if delta == 0:
        return pure_curve(epsilon)
    raise PrivacyError(
        f"{mechanism} states ({epsilon!r}, {delta!r})-DP, which implies no Renyi bound at any "
        f"order, so an rdp ledger cannot compose it: release it through a ledger with the "
        f"standard, best or tight accountant, or use a mechanism with a Renyi curve (gnmax, "
        f"confident-gnmax) or a pure one")


def curve_to_bytes(curve: Curve) -> bytes:
    """The curve as little-endian float64 bytes (the ledger stores it so)."""
    return np.asarray(curve, dtype="<f8").tobytes()


def curve_from_bytes(data: bytes) -> Curve:
    """Inverse of `curve_to_bytes`."""
    arr = np.frombuffer(data, dtype="<f8")
    if arr.shape != (len(ORDERS),):
        raise PrivacyError("a Renyi curve in the ledger has the wrong length (written by "
                           "another agt version?)")
    return tuple(float(v) for v in arr)
