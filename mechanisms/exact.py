"""Exact samplers for the discrete releases (exp-radius, ens-exp-radius, df-exp; through
mechanisms/noise.py also the binary Laplace threshold releases and PTR).

Why. A float sampler realises another distribution than the one the proof is about:
``rng.random()`` returns multiples of 2^-53, so ``rng.random() < p`` happens with
probability ceil(p 2^53) / 2^53, and exp(-x) underflows to 0 for x > 745. An adversarial
audit showed what that does to the exponential mechanism on the radius: at eps = 1 a query
of radius 745 never flips while its neighbour of radius 744 flips with probability 2^-53
(an infinite privacy-loss ratio, so (eps, 1.1e-16)-DP, not eps-DP), and rounding up to the
grid pushes the ratio above e^eps at radii 22 and beyond; df-exp's cumulative-sum draw
went over e^eps the same way. The samplers below draw from the exact distributions.

* `bernoulli(p)`, p a rational (a float's exact value is one): compares p with a uniform
  u in [0, 1) bit by bit, drawing u's bits lazily from the generator's exactly uniform
  integers; P(u < p) = p exactly, and two bits are drawn on average.
* `bernoulli_exp(gamma)`, gamma >= 0 rational: Bernoulli(exp(-gamma)) by the algorithm of
  Canonne, Kamath & Steinke 2020 ("The discrete Gaussian for differential privacy",
  Alg. 1): for gamma in [0, 1], draw A_k ~ Bernoulli(gamma / k) for k = 1, 2, ... until the
  first A_K = 0 and return 1 iff K is odd (P(K > k) = gamma^k / k!, so P(K odd) =
  sum over odd k of gamma^(k-1)/(k-1)! - gamma^k/k! = exp(-gamma)); for gamma > 1, the
  product of floor(gamma) draws at 1 and one at the fractional part. No exp is evaluated.
* `exponential_choice(deficits)`: class j with probability proportional to exp(-d_j)
  (d_j >= 0 rational, min d_j = 0), by rejection: a uniform class j is accepted with
  probability exp(-d_j) (`bernoulli_exp`); the accepted class has exactly that law, and
  at most C proposals are needed on average (the class of deficit 0 is always accepted).

mechanisms/noise.py draws the binary Laplace threshold releases and the PTR tests through
`bernoulli` and `bernoulli_exp` too (their outcomes have closed-form laws). The Cauchy
releases, lnmax, the sparse vector's noises and the convex mechanisms' Gaussian noises are
still drawn in floating point; README "What is private and what is not" states what that
leaves.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

_BITS = 62


def bernoulli(p: Fraction, rng: np.random.Generator) -> bool:
    """True with probability exactly p (a rational; <= 0: never, >= 1: always)."""
    if p <= 0:
        return False
    if p >= 1:
        return True
    num, den = p.numerator, p.denominator
    while True:
        bits = int(rng.integers(0, 1 << _BITS))
        for i in range(_BITS - 1, -1, -1):
            num *= 2                           # the next binary digit of p ...
            p_bit = num >= den
            if p_bit:
                num -= den
            u_bit = (bits >> i) & 1            # ... against the next digit of u
            if u_bit != p_bit:
                return u_bit < p_bit
            if num == 0:                       # p's digits end: u >= p from here on
                return False


def bernoulli_exp(gamma: Fraction, rng: np.random.Generator) -> bool:
    """True with probability exactly exp(-gamma), gamma >= 0 rational (module docstring)."""
    if gamma < 0:
        raise ValueError(f"bernoulli_exp needs gamma >= 0, got {gamma}")
    whole = int(gamma)                          # floor for gamma >= 0
    for _ in range(whole):
        if not _bernoulli_exp_unit(Fraction(1), rng):
            return False
    return _bernoulli_exp_unit(gamma - whole, rng)


def _bernoulli_exp_unit(gamma: Fraction, rng: np.random.Generator) -> bool:
    """Bernoulli(exp(-gamma)) for gamma in [0, 1]."""
    k = 1
    while bernoulli(gamma / k, rng):
        k += 1
    return k % 2 == 1


def exponential_choice(deficits: list[Fraction], rng: np.random.Generator) -> int:
    """An index j drawn with probability exp(-deficits[j]) / sum_i exp(-deficits[i]); every
    deficit >= 0 and at least one equal to 0."""
    if not deficits or min(deficits) != 0 or any(d < 0 for d in deficits):
        raise ValueError("exponential_choice needs deficits >= 0 with a minimum of 0")
    while True:
        j = int(rng.integers(0, len(deficits)))
        if bernoulli_exp(deficits[j], rng):
            return j
