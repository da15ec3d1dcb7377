"""Random generators and the closed forms of threshold releases.

Release noise is drawn only inside mechanism objects (base.py), from a generator the
ledger makes: `make_generator(None)`, 128 bits from the operating system's secure source,
so the noise cannot be replayed. A seeded generator (`make_generator(seed)`) is for
experiments and tests only; the ledger records every release that used one.

Threshold releases (global_sens.py, smooth.py) output 1[f + s Z > 1/2] for a nominal binary
prediction f and Z Laplace(0, 1) or standard Cauchy. They differ from f ("flip") exactly when
the noise crosses 1/2 towards the other label; by symmetry of Z,
    Laplace, scale s:  P(flip) = P(s Z > 1/2) = 0.5 * exp(-1 / (2 s))
    Cauchy,  scale s:  P(flip) = P(s Z > 1/2) = 1/2 - arctan(1 / (2 s)) / pi = arctan(2 s) / pi.
The threshold releases and the PTR tests draw their outcomes from these closed forms exactly
(mechanisms/exact.py), with s the float the code computed.

lnmax and the sparse vector add discrete Laplace noise to integers (vote counts, radii):
P(Z = z) = kappa a^|z|, a = exp(-g) for a rate g > 0, kappa = (1 - a) / (1 + a), with
P(Z <= k) = a^-k / (1 + a) for k < 0 and 1 - a^(k+1) / (1 + a) for k >= 0
(`discrete_laplace_pmf`, `discrete_laplace_cdf`; drawn by `exact.discrete_laplace`).
"""

from __future__ import annotations

import math
import secrets
from fractions import Fraction
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.checks import check_delta, check_epsilon, privacy_problems
from mechanisms.exact import bernoulli, bernoulli_arctan_over_pi, bernoulli_exp
from mechanisms.rounding import float_up

NoiseKind = Literal["laplace", "cauchy"]
NOISE_KINDS: tuple[str, ...] = ("laplace", "cauchy")


def make_generator(seed: int | None = None) -> np.random.Generator:
    """The generator that draws release noise: OS-seeded (secure) for None, else seeded
    (reproducible: experiments and tests only)."""
    if seed is None:
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))
    return np.random.default_rng(seed)


def laplace_flip_probability(scale: ArrayLike | float) -> NDArray[np.float64]:
    """P(Laplace(0, s) > 1/2) = 0.5 * exp(-1 / (2 s)); 0 for s = 0."""
    s = np.asarray(scale, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore"):     # tiny s: exp(-inf) = 0, as meant
        return 0.5 * np.exp(-1.0 / (2.0 * s))


def cauchy_flip_probability(scale: ArrayLike | float) -> NDArray[np.float64]:
    """P(Cauchy(0, s) > 1/2) = arctan(2 s) / pi (= 1/2 - arctan(1 / (2 s)) / pi, without its
    cancellation at small s); 0 for s = 0, 1/2 for s = inf."""
    s = np.asarray(scale, dtype=np.float64)
    with np.errstate(over="ignore"):                      # 2 s = inf: arctan is pi/2, as meant
        return np.arctan(2.0 * s) / math.pi


def flip_probability(scale: ArrayLike | float, noise: NoiseKind) -> NDArray[np.float64]:
    """P(1[f + s Z > 1/2] != f) for noise scale `scale` (the same for f = 0 and f = 1)."""
    if noise == "laplace":
        return laplace_flip_probability(scale)
    if noise == "cauchy":
        return cauchy_flip_probability(scale)
    raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")


def threshold_draw(values: NDArray[np.int64], scale: ArrayLike | float, noise: NoiseKind,
                   rng: np.random.Generator) -> NDArray[np.int64]:
    """1[values + scale * Z > 1/2] for binary values, Z i.i.d. Laplace(0, 1) or standard
    Cauchy. Called only by mechanism objects, after their inputs and parameters are
    validated. The label is drawn from its exact law: it differs from f in {0, 1} exactly
    when s Z crosses 1/2 towards the other label, with the flip probability of the module
    docstring (s as the float holds it, exactly); s = 0 never flips (no noise)."""
    if noise not in NOISE_KINDS:    # never draw from an unknown distribution
        raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), values.shape)
    if np.isnan(scale).any() or (scale < 0).any():     # fail closed: never "no noise" by accident
        raise ValueError("threshold releases need noise scales >= 0 (inf allowed), got NaN "
                         "or < 0")
    flat = np.asarray(values).reshape(-1).tolist()
    if not set(flat) <= {0, 1}:
        raise ValueError("threshold releases take binary predictions (0 or 1)")
    flip = _laplace_flip if noise == "laplace" else _cauchy_flip
    out = np.empty(len(flat), dtype=np.int64)
    for q, (f, s) in enumerate(zip(flat, scale.reshape(-1).tolist())):
        out[q] = 1 - f if s > 0 and flip(s, rng) else f
    return out.reshape(np.shape(values))


def discrete_laplace_pmf(k: ArrayLike, rate: float) -> NDArray[np.float64]:
    """P(Z = k) for Z discrete Laplace of rate g: kappa exp(-g |k|)."""
    k = np.asarray(k)
    kappa = -math.expm1(-rate) / (1.0 + math.exp(-rate))
    return kappa * np.exp(-rate * np.abs(k).astype(np.float64))


def discrete_laplace_cdf(k: ArrayLike, rate: float) -> NDArray[np.float64]:
    """P(Z <= k) for Z discrete Laplace of rate g (no cancellation in either tail)."""
    k = np.asarray(k).astype(np.float64)
    tail = np.exp(-rate * np.where(k >= 0, k + 1.0, -k)) / (1.0 + math.exp(-rate))
    return np.where(k >= 0, 1.0 - tail, tail)


def laplace_scale_up(sensitivity: float, epsilon: float) -> float:
    """The Laplace scale sensitivity / eps rounded up to a float: a scale rounded down would
    break eps-DP at tiny eps, where the proof's slack (e^(eps/2) - 1)^2 is below one rounding
    of the scale (an adversarial review found 754 of 4000 eps values <= 4e-16)."""
    return float_up(Fraction(float(sensitivity)) / Fraction(float(epsilon)))


def correct_from_flip(released_from: NDArray[np.int64], y: NDArray[np.int64],
                      flip: ArrayLike) -> NDArray[np.float64]:
    """P(release == y) for a binary release that flips `released_from` w.p. `flip`."""
    flip = np.broadcast_to(np.asarray(flip, dtype=np.float64), released_from.shape)
    return np.where(released_from == y, 1.0 - flip, np.where((y == 0) | (y == 1), flip, 0.0))


# -- propose-test-release (ens-ptr, ptr) ----------------------------------------------------

REFUSED = -1          # the released label of "no answer"


def ptr_threshold(epsilon: float, delta: float) -> float:
    """T = ln(1/delta) / eps: the noisy distance must exceed it for an answer."""
    problems = privacy_problems()
    check_epsilon(epsilon, problems)
    check_delta(delta, problems)
    problems.raise_if_any()
    return -math.log(delta) / epsilon


def ptr_release_probability(distance: ArrayLike, epsilon: float, delta: float
                            ) -> NDArray[np.float64]:
    """Analytical P(the PTR test passes) for stability distance(s) s:
    1 - exp(-eps (s - T)) / 2 for s > T, exp(-eps (T - s)) / 2 otherwise."""
    threshold = ptr_threshold(epsilon, delta)
    s = np.asarray(distance, dtype=np.float64)
    gap = epsilon * (s - threshold)
    return np.where(gap > 0, 1.0 - 0.5 * np.exp(-np.abs(gap)), 0.5 * np.exp(-np.abs(gap)))


def ptr_draw(answer: NDArray[np.int64], distance: NDArray[np.int64], epsilon: float,
             delta: float, rng: np.random.Generator) -> NDArray[np.int64]:
    """answer where distance + Laplace(1/eps) > T = ln(1/delta)/eps, else REFUSED, drawn
    from the exact law: with t = T - distance (the float T, exactly), the test passes with
    probability exp(-eps t) / 2 for t >= 0 and 1 - exp(eps t) / 2 for t < 0
    (`ptr_release_probability`), so pass = [t >= 0] xor not (B(1/2) and B(exp(-eps |t|)))."""
    threshold = Fraction(ptr_threshold(epsilon, delta))
    eps = Fraction(float(epsilon))
    passed = np.empty(np.shape(distance), dtype=bool)
    for q, d in enumerate(np.asarray(distance).tolist()):
        t = threshold - int(d)
        tail = bernoulli(Fraction(1, 2), rng) and bernoulli_exp(eps * abs(t), rng)
        passed[q] = tail if t >= 0 else not tail
    return np.where(passed, answer, REFUSED).astype(np.int64)


def _laplace_flip(s: float, rng: np.random.Generator) -> bool:
    """True with probability exp(-1 / (2 s)) / 2 = B(1/2) and B(exp(-1 / (2 s))), s > 0."""
    return bernoulli(Fraction(1, 2), rng) and (
        math.isinf(s) or bernoulli_exp(1 / (2 * Fraction(s)), rng))


def _cauchy_flip(s: float, rng: np.random.Generator) -> bool:
    """True with probability arctan(2 s) / pi, s > 0 (1/2 for s = inf)."""
    if math.isinf(s):
        return bernoulli(Fraction(1, 2), rng)
    return bernoulli_arctan_over_pi(2 * Fraction(s), rng)
