"""Exact samplers (mechanisms/exact.py) and the discrete releases that use them.

An audit showed that float draws (``rng.random() < p`` on the 2^-53 grid, exp underflowing
to 0) break the pure eps-DP of exp-radius and df-exp by ~1e-16 per query; these tests check
that the draws are exact: by enumeration where the law depends on finitely many bits, by
frequencies elsewhere, and that the releases never touch the float grid."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from mechanisms.ensemble import df_draw, df_probabilities
from mechanisms.exact import _BITS, bernoulli, bernoulli_exp, exponential_choice
from mechanisms.noise import (REFUSED, laplace_flip_probability, ptr_draw,
                              ptr_release_probability, threshold_draw)
from mechanisms.radius import exp_draw, exp_probabilities


class _Bits:
    """A generator whose integers are given: the first draw is ``prefix`` followed by
    zeros (a uniform u in [0, 1) with those leading bits)."""

    def __init__(self, prefix: int, width: int):
        self.value = prefix << (_BITS - width)

    def integers(self, low, high):
        assert (low, high) == (0, 1 << _BITS)
        return self.value


class _IntegersOnly:
    """A generator that offers exactly uniform integers and nothing else."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def integers(self, low, high, size=None):
        return self.rng.integers(low, high, size=size)


@pytest.mark.parametrize("p", [Fraction(0), Fraction(1), Fraction(5, 16), Fraction(1, 2),
                               Fraction(11, 32), Fraction(31, 32), Fraction(1, 64)])
def test_bernoulli_is_exact_on_dyadic_probabilities(p):
    """For p = a / 2^m the outcome depends on u's first m bits only: over all 2^m prefixes,
    exactly a of them say True."""
    m = 6
    hits = sum(bernoulli(p, _Bits(prefix, m)) for prefix in range(1 << m))
    assert Fraction(hits, 1 << m) == p


@pytest.mark.parametrize("p", [Fraction(1, 3), Fraction(2, 7) + Fraction(1, 2**80),
                               Fraction(float(math.exp(-30)))])
def test_bernoulli_frequencies(p):
    rng = np.random.default_rng(1)
    n = 60_000
    freq = sum(bernoulli(p, rng) for _ in range(n)) / n
    assert abs(freq - float(p)) <= 5 * math.sqrt(float(p) * (1 - float(p)) / n) + 1e-9


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 2), Fraction(1), Fraction(27, 10)])
def test_bernoulli_exp_frequencies(gamma):
    rng = np.random.default_rng(2)
    n = 40_000
    p = math.exp(-float(gamma))
    freq = sum(bernoulli_exp(gamma, rng) for _ in range(n)) / n
    assert abs(freq - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12
    with pytest.raises(ValueError):
        bernoulli_exp(Fraction(-1), rng)


def test_exponential_choice_follows_its_weights():
    rng = np.random.default_rng(3)
    deficits = [Fraction(0), Fraction(1, 3), Fraction(2), Fraction(1, 3)]
    n = 40_000
    counts = np.bincount([exponential_choice(deficits, rng) for _ in range(n)], minlength=4)
    w = np.exp(-np.array([float(d) for d in deficits]))
    p = w / w.sum()
    assert np.all(np.abs(counts / n - p) <= 5 * np.sqrt(p * (1 - p) / n))
    with pytest.raises(ValueError):
        exponential_choice([Fraction(1), Fraction(2)], rng)


def test_exp_radius_and_df_exp_draw_from_their_laws_without_floats():
    """Only exact uniform integers are used (a float draw would call rng.random), the
    frequencies match the closed forms, and radii whose weights underflow a float (eps (r +
    1) > 745) still draw, returning the answer as the exact law says they almost surely do."""
    rng = _IntegersOnly(4)
    n = 30_000
    answer = np.full(n, 1, dtype=np.int64)
    radius = np.full(n, 1, dtype=np.int64)
    got = np.bincount(exp_draw(answer, radius, 0.4, 3, rng), minlength=3) / n
    p = exp_probabilities(answer[:1], radius[:1], 0.4, 3)[0]
    assert np.all(np.abs(got - p) <= 5 * np.sqrt(p * (1 - p) / n))
    counts = np.tile([[7, 9, 2]], (n, 1))
    got = np.bincount(df_draw(counts, 0.3, rng), minlength=3) / n
    p = df_probabilities(counts[:1], 0.3)[0]
    assert np.all(np.abs(got - p) <= 5 * np.sqrt(p * (1 - p) / n))
    far = exp_draw(np.array([0, 1]), np.array([10**6, 744]), 1.0, 2, rng)
    assert far.tolist() == [0, 1]


def test_laplace_threshold_and_ptr_draw_from_their_laws_without_floats():
    """The binary Laplace releases (gs, ss-laplace and the ensembles' GS fallback) and PTR
    draw their decisions exactly: only uniform integers are used, and the frequencies match
    `laplace_flip_probability` and `ptr_release_probability`."""
    rng = _IntegersOnly(5)
    n = 30_000
    values = np.tile(np.array([0, 1], dtype=np.int64), n // 2)
    got = threshold_draw(values, 0.4, "laplace", rng)
    p = float(laplace_flip_probability(0.4))
    assert abs(float(np.mean(got != values)) - p) <= 5 * math.sqrt(p * (1 - p) / n)
    assert threshold_draw(values[:4], 0.0, "laplace", rng).tolist() == values[:4].tolist()
    assert set(threshold_draw(values[:4], math.inf, "laplace", rng).tolist()) <= {0, 1}
    with pytest.raises(ValueError, match="binary"):
        threshold_draw(np.array([2]), 0.4, "laplace", rng)
    for d in (3, 12, 25):
        answer = np.zeros(n, dtype=np.int64)
        passed = ptr_draw(answer, np.full(n, d), 0.5, 1e-4, rng) != REFUSED
        p = float(ptr_release_probability(d, 0.5, 1e-4))
        assert abs(float(passed.mean()) - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-9
