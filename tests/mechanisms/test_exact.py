"""Exact samplers (mechanisms/exact.py) and the releases that use them.

An audit showed that float draws (``rng.random() < p`` on the 2^-53 grid, exp underflowing
to 0) break the pure eps-DP of exp-radius and df-exp by ~1e-16 per query; these tests check
that the draws are exact: by enumeration where the law depends on finitely many bits, by
frequencies elsewhere, and that the releases never touch the float grid."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from mechanisms.ensemble import df_draw, df_probabilities, lnmax_draw, lnmax_probabilities
from mechanisms.exact import (
    _BITS,
    LazyCauchy,
    _arctan_over_pi_bounds,
    _argmax_of,
    bernoulli,
    bernoulli_arctan_over_pi,
    bernoulli_exp,
    cauchy_argmax,
    discrete_laplace,
    exponential_choice,
    uniform_below,
)
from mechanisms.noise import (
    REFUSED,
    cauchy_flip_probability,
    laplace_flip_probability,
    ptr_draw,
    ptr_release_probability,
    threshold_draw,
)
from mechanisms.radius import exp_draw, exp_probabilities
from tests.helpers import IntegersOnly


class _Bits:
    """A generator whose integers are given: the first draw is ``prefix`` followed by
    zeros (a uniform u in [0, 1) with those leading bits)."""

    def __init__(self, prefix: int, width: int):
        self.value = prefix << (_BITS - width)

    def integers(self, low, high):
        assert (low, high) == (0, 1 << _BITS)
        return self.value


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
    rng = IntegersOnly(4)
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
    rng = IntegersOnly(5)
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


def test_uniform_below_is_uniform_at_any_size():
    rng = IntegersOnly(6)
    assert uniform_below(1, rng) == 0
    n = 30_000
    counts = np.bincount([uniform_below(5, rng) for _ in range(n)], minlength=5)
    assert np.all(np.abs(counts / n - 0.2) <= 5 * math.sqrt(0.16 / n))
    big = 3 * 2**100 + 1                          # beyond one 62-bit draw
    draws = [uniform_below(big, rng) for _ in range(2000)]
    assert all(0 <= d < big for d in draws)
    assert abs(np.mean([d / big for d in draws]) - 0.5) <= 5 * math.sqrt(1 / 12 / 2000)
    with pytest.raises(ValueError):
        uniform_below(0, rng)


@pytest.mark.parametrize("eps", [0.05, 1.0, 10.0])
def test_discrete_laplace_follows_its_law(eps):
    """P(Z = z) = (1 - a) / (1 + a) a^|z|, a = exp(-eps / 2), from exact integers only; the
    rate of a float eps is its exact rational value (eps = 0.05 has a 2^58 denominator)."""
    rng = IntegersOnly(7)
    rate = Fraction(eps) / 2
    n = 30_000
    draws = np.array([discrete_laplace(rate, rng) for _ in range(n)])
    a = math.exp(-eps / 2)
    for z in (-2, -1, 0, 1, 2, 5):
        p = (1 - a) / (1 + a) * a ** abs(z)
        assert abs(float(np.mean(draws == z)) - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-9
    tail = a ** 3 / (1 + a)                        # P(Z >= 3) = P(Z <= -3)
    assert abs(float(np.mean(draws >= 3)) - tail) <= 5 * math.sqrt(tail * (1 - tail) / n) + 1e-9
    with pytest.raises(ValueError):
        discrete_laplace(Fraction(0), rng)


def test_lnmax_draws_from_its_law_without_floats():
    """lnmax adds exact integer noise and breaks ties uniformly: the frequencies match the
    closed-form law, including a three-way tie of the counts."""
    rng = IntegersOnly(8)
    n = 20_000
    for row, eps in (([6, 2, 5], 0.8), ([3, 3, 3], 30.0)):
        counts = np.tile(np.array([row]), (n, 1))
        got = np.bincount(lnmax_draw(counts, eps, rng), minlength=3) / n
        p = lnmax_probabilities(counts[:1], eps)[0]
        assert np.all(np.abs(got - p) <= 5 * np.sqrt(p * (1 - p) / n))


_ARCTAN_POINTS = [1e-300, 3e-17, 1e-5, 0.1, 0.3, 0.4, 0.41, 3 / 7, 0.9, 1.0, 1.7, 2.4999, 2.5,
                  7.0, 1e8, 1e300]


@pytest.mark.parametrize("precision", [64, 128, 512])
def test_arctan_over_pi_enclosures_hold_and_shrink(precision):
    """lo <= arctan(x) / pi <= hi against mpmath values 100 bits finer than the enclosure, on
    both sides of every branch of the argument reduction, and hi - lo about 2^-precision."""
    with mpmath.workprec(precision + 100):
        for x in _ARCTAN_POINTS:
            lo, hi = _arctan_over_pi_bounds(Fraction(x), precision)
            p = mpmath.atan(mpmath.mpf(Fraction(x).numerator) / Fraction(x).denominator) / mpmath.pi
            assert mpmath.mpf(lo.numerator) / lo.denominator <= p
            assert p <= mpmath.mpf(hi.numerator) / hi.denominator
            assert hi - lo <= Fraction(1, 2 ** (precision - 7))


@pytest.mark.parametrize("x", [0.3, 1.7, 1e-5])
def test_bernoulli_arctan_over_pi_decides_u_below_p(x):
    """With u's first 12 bits given (the rest repeat them), the answer is exactly u < p:
    the count over all 4096 prefixes matches the exact p."""
    m = 12
    with mpmath.workdps(60):
        p = mpmath.atan(mpmath.mpf(Fraction(x).numerator) / Fraction(x).denominator) / mpmath.pi
        expected = sum(1 for prefix in range(1 << m)
                       if mpmath.mpf(prefix) / (1 << m) * (1 + mpmath.mpf(2) ** -62) < p)
    hits = sum(bernoulli_arctan_over_pi(Fraction(x), _Bits(prefix, m)) for prefix in range(1 << m))
    assert hits == expected


def test_cauchy_threshold_releases_draw_from_their_law_without_floats():
    """Binary Cauchy releases (ss-cauchy, ens-ss-cauchy, ss-argmax for two classes) flip
    with probability arctan(2 s) / pi, drawn exactly from uniform integers; s = 0 never
    flips and s = inf flips half the time."""
    rng = IntegersOnly(10)
    n = 30_000
    values = np.tile(np.array([0, 1], dtype=np.int64), n // 2)
    for scale in (0.05, 0.4, 3.0):
        got = threshold_draw(values, scale, "cauchy", rng)
        p = float(cauchy_flip_probability(scale))
        assert p == pytest.approx(math.atan(2 * scale) / math.pi, rel=1e-15)
        assert abs(float(np.mean(got != values)) - p) <= 5 * math.sqrt(p * (1 - p) / n)
    assert threshold_draw(values[:4], 0.0, "cauchy", rng).tolist() == values[:4].tolist()
    half = threshold_draw(values[:4000], math.inf, "cauchy", rng)
    assert abs(float(np.mean(half != values[:4000])) - 0.5) <= 5 * math.sqrt(0.25 / 4000)
    with pytest.raises(ValueError, match="binary"):
        threshold_draw(np.array([2]), 0.4, "cauchy", rng)
    for bad in (math.nan, -1.0):               # fail closed, never "no noise"
        for noise in ("cauchy", "laplace"):
            with pytest.raises(ValueError, match="scales"):
                threshold_draw(values[:2], bad, noise, rng)
    with pytest.raises(ValueError):
        bernoulli_arctan_over_pi(Fraction(-1), rng)


# -- lazily realised Cauchy noises (ss-argmax for more than two classes) -----------------------

_WORD_MAX = (1 << _BITS) - 1


class _Word:
    """A generator whose every draw is the same 62-bit word w: the lazily drawn uniform is
    then u = w / (2^62 - 1) exactly (the word's binary digits repeated forever)."""

    def __init__(self, word: int):
        self.word = word

    def integers(self, low, high):
        assert (low, high) == (0, 1 << _BITS)
        return self.word


def _cauchy_of(word: int) -> mpmath.mpf:
    """The standard Cauchy variate G^-1(u) = tan(pi (u - 1/2)) of u = w / (2^62 - 1)."""
    return mpmath.tan(mpmath.pi * (mpmath.mpf(word) / _WORD_MAX - mpmath.mpf(1) / 2))


def _word_of(z: mpmath.mpf) -> int:
    """The word whose variate is nearest z (kept off u = 0 and u = 1)."""
    word = int(mpmath.nint((mpmath.mpf(1) / 2 + mpmath.atan(z) / mpmath.pi) * _WORD_MAX))
    return min(max(word, 2), _WORD_MAX - 2)


def _fraction(x: mpmath.mpf) -> Fraction:
    x = mpmath.mpf(x)
    if x == 0:
        return Fraction(0)
    mantissa, exponent = x.man_exp                       # |x| = mantissa 2^exponent
    return int(mpmath.sign(x)) * Fraction(int(mantissa)) * Fraction(2) ** int(exponent)


def test_lazy_cauchy_answers_every_question_about_one_variate():
    """A LazyCauchy asked Z > t for many t (far, near to 1e-30 relative, in any order) answers
    as the one variate its digits define, and its interval always contains that variate."""
    rng = np.random.default_rng(5)
    with mpmath.workdps(80):
        words = [int(w) for w in rng.integers(1, _WORD_MAX, size=40)] + [1, 2, _WORD_MAX - 1]
        for word in words:
            z = _cauchy_of(word)
            noise = LazyCauchy(_Word(word))
            points = [z * (1 + mpmath.mpf(d)) + d
                      for d in (1e-30, -1e-30, 1e-15, -1e-15, 1e-3, -1e-3, 1, -1)]
            points += [mpmath.mpf(0), mpmath.mpf(10) ** 300, -mpmath.mpf(10) ** 300]
            for i in rng.permutation(len(points)):
                t = _fraction(points[i])
                assert noise.above(t) == (z > mpmath.mpf(t.numerator) / t.denominator)
                if noise.lo is not None:
                    assert mpmath.mpf(noise.lo.numerator) / noise.lo.denominator < z
                if noise.hi is not None:
                    assert z < mpmath.mpf(noise.hi.numerator) / noise.hi.denominator


@pytest.mark.parametrize("scale", [1e-250, 1e-6, 0.3, 12.0, 1e200])
def test_cauchy_argmax_is_the_exact_argmax_of_the_realised_scores(scale):
    """With every noise's digits known, the answer is the argmax of (1/2, f_j + s Z_j)
    computed in 80-digit arithmetic: on random digits and on constructed near-ties (two
    scores within 1e-15 of each other, a score next to the baseline)."""
    rng = np.random.default_rng(6)
    s = Fraction(scale)
    half = Fraction(1, 2)
    with mpmath.workdps(100 + int(abs(math.log10(scale)))):     # 1 + s Z and s Z apart
        s_mp = mpmath.mpf(s.numerator) / s.denominator
        cases = []
        for _ in range(30):
            m = int(rng.integers(2, 6))
            centres = [Fraction(int(c)) for c in rng.integers(0, 2, size=m)]
            cases.append((centres, [int(w) for w in rng.integers(1, _WORD_MAX, size=m)]))
        for _ in range(30):                   # near-ties between the two leading scores
            centres = [Fraction(1), Fraction(0), Fraction(0)]
            lead = mpmath.mpf(float(rng.uniform(0.6, 50.0))) / s_mp      # score of the 0-class
            other = (lead * s_mp - 1) / s_mp                              # the 1-class, as close
            words = [_word_of(other), _word_of(lead), int(rng.integers(1, _WORD_MAX))]
            cases.append((centres, words))
            cases.append(([Fraction(0)] * 3, [words[1], words[1] + 1, words[1] - 1]))
            cases.append(([Fraction(0), Fraction(1)],                     # beside the baseline
                          [_word_of(mpmath.mpf(1) / 2 / s_mp),
                           _word_of(-mpmath.mpf(1) / 2 / s_mp)]))
        for centres, words in cases:
            scores = [mpmath.mpf(1) / 2] + [mpmath.mpf(int(c)) + s_mp * _cauchy_of(w)
                                            for c, w in zip(centres, words)]
            best = max(range(len(scores)), key=lambda j: scores[j])
            assert sorted(scores)[-1] > sorted(scores)[-2]              # no exact tie
            noises = [LazyCauchy(_Word(w)) for w in words]
            assert _argmax_of(half, centres, s, noises) == best


def test_ss_argmax_draws_from_its_law_without_floats():
    """ss-argmax for 4 classes, integers only, at a tiny, a moderate and the largest scale
    (eps = 1e-300, the smallest accepted: s = 1.2e301), against the quadrature law."""
    from mechanisms import Certified, Source, make_mechanism

    src = Source("t", "ab" * 32, ("replace-one",), True)
    n = 12_000
    for eps, radius, pred in ((1.0, 3000, 1), (0.7, 5, 0), (0.7, -1, 3), (1e-300, 0, 2)):
        mech = make_mechanism("ss-argmax", eps)
        got = mech._draw(Certified(np.full(n, pred), np.full(n, radius), 4, src),
                         IntegersOnly(11))
        p = mech.probabilities(Certified(np.array([pred]), np.array([radius]), 4, src))[0]
        assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-9
        freq = np.bincount(got, minlength=4) / n
        assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12), (eps, freq, p)
    with pytest.raises(ValueError, match="scale"):
        cauchy_argmax(Fraction(1, 2), [Fraction(0)], Fraction(0), IntegersOnly(0))


class Scripted:
    """A generator that returns planned integers (the bulk draws' decision logic)."""

    def __init__(self, values):
        self.values = list(values)

    def integers(self, low, high, size=None):
        if size is None:
            return self.values.pop(0)
        out, self.values = self.values[:size], self.values[size:]
        return np.array(out, dtype=np.int64)


def test_bulk_bernoulli_decides_by_the_first_62_bits_then_goes_on():
    """p = 1/3: P = floor(2^62 / 3); U below P is a success, above a failure, and U = P
    compares the following bits with the rest of p's digits (here 01 01 ...)."""
    from mechanisms.exact import bernoulli_ratios

    top = (1 << 62) // 3
    got = bernoulli_ratios([1, 1, 1, 0, 5], [3, 3, 3, 7, 5],
                           Scripted([top - 1, top + 1, top, 0]))
    # the third lane's next bits are all 0 (u's digits 000... against p's rest 0101...): u < p
    assert got.tolist() == [True, False, True, False, True]
    got = bernoulli_ratios([1], [3], Scripted([top, (1 << 62) - 1]))
    assert got.tolist() == [False]                 # u's next digits 111... are above p's


@pytest.mark.parametrize("p", [Fraction(1, 3), Fraction(1, 1000), Fraction(999, 1000),
                               Fraction(7, 2**40)])
def test_bulk_bernoulli_frequencies(p):
    from mechanisms.exact import bernoulli_ratios

    rng = np.random.default_rng(3)
    n = 200_000
    got = bernoulli_ratios([p.numerator] * n, [p.denominator] * n, rng).mean()
    assert abs(got - float(p)) < 5 * math.sqrt(float(p) * (1 - float(p)) / n) + 1e-9


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(3, 10), Fraction(1), Fraction(5, 2),
                                   Fraction(9)])
def test_bulk_bernoulli_exp_frequencies(gamma):
    from mechanisms.exact import bernoulli_exps

    rng = np.random.default_rng(4)
    n = 200_000
    got = bernoulli_exps([gamma.numerator] * n, [gamma.denominator] * n, rng).mean()
    p = math.exp(-float(gamma))
    assert abs(got - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-9


def test_bulk_bernoulli_exp_catches_a_wrong_constant():
    """The frequency test fails for a sampler of exp(-1.1 gamma): it can tell."""
    from mechanisms.exact import bernoulli_exps

    rng = np.random.default_rng(5)
    n = 200_000
    got = bernoulli_exps([11] * n, [10] * n, rng).mean()
    p = math.exp(-1.0)
    assert abs(got - p) > 5 * math.sqrt(p * (1 - p) / n)


def _lane_by_lane_exps(nums, dens, rng):
    """The lane-by-lane form of the bulk exp draws (what `bernoulli_exps` computed before
    its table form), built on `bernoulli_ratios`: the reference the table form must match
    draw for draw."""
    from mechanisms.exact import bernoulli_ratios

    def units(nums, dens):
        k = np.ones(len(nums), dtype=np.int64)
        todo = list(range(len(nums)))
        while todo:
            more = bernoulli_ratios([nums[i] for i in todo],
                                    [dens[i] * int(k[i]) for i in todo], rng)
            k[np.asarray(todo)[more]] += 1
            todo = [i for i, m in zip(todo, more) if m]
        return k % 2 == 1

    alive = np.ones(len(nums), dtype=bool)
    left = [num // den for num, den in zip(nums, dens)]
    todo = [i for i in range(len(nums)) if left[i] > 0]
    while todo:
        ok = units([1] * len(todo), [1] * len(todo))
        nxt = []
        for i, success in zip(todo, ok):
            if not success:
                alive[i] = False
            else:
                left[i] -= 1
                if left[i] > 0:
                    nxt.append(i)
        todo = nxt
    last = np.flatnonzero(alive)
    if last.size:
        alive[last] = units([nums[i] % dens[i] for i in last], [dens[i] for i in last])
    return alive


@pytest.mark.parametrize("seed", range(6))
def test_table_exp_draws_match_the_lane_by_lane_form_draw_for_draw(seed):
    """`bernoulli_exps` with a table of gammas and each lane's row consumes the generator
    exactly as the lane-by-lane form: the same draws and the same generator state after,
    for gammas of 0, below 1, with integer parts, near 1 and with numerators beyond 2^64."""
    from mechanisms.exact import bernoulli_exps

    pick = np.random.default_rng(100 + seed)
    table = [Fraction(0), Fraction(1), Fraction(3, 10), Fraction(27, 10), Fraction(999, 1000),
             Fraction(float(1e-3)) * 57, Fraction(2**70 + 1, 2**68), Fraction(1, 2**80)]
    kinds = pick.integers(0, len(table), size=int(pick.integers(1, 400)))
    nums, dens = [g.numerator for g in table], [g.denominator for g in table]
    new, old = np.random.default_rng(seed), np.random.default_rng(seed)
    got = bernoulli_exps(nums, dens, new, kinds=kinds)
    want = _lane_by_lane_exps([nums[j] for j in kinds], [dens[j] for j in kinds], old)
    assert got.tolist() == want.tolist()
    assert new.integers(0, 1 << 62) == old.integers(0, 1 << 62)
    # without a table: one row per lane
    got = bernoulli_exps([nums[j] for j in kinds], [dens[j] for j in kinds], new)
    want = _lane_by_lane_exps([nums[j] for j in kinds], [dens[j] for j in kinds], old)
    assert got.tolist() == want.tolist()


def test_table_exp_draws_go_on_past_a_tie_in_lane_order():
    """U = P (probability 2^-62) continues with the next bits against p's rest, lane by lane
    after the round's bulk draw: p = 1/3 (gamma = 1/3, k = 1) for three lanes, the second
    tied and then above p; every later round's lanes fail."""
    from mechanisms.exact import bernoulli_exps

    top = (1 << 62) // 3
    # round 1: lanes 0, 1, 2 draw U; lane 1 ties and its next 62 bits (all ones) are above
    # p's rest: A_1 = 0 for lane 1, K = 1 (odd): true; lanes 0 and 2 go on (U < P) and meet
    # p / 2 = 1/6 with U = 2^62 - 1 (A_2 = 0, K = 2: false)
    rng = Scripted([top - 1, top, 0, (1 << 62) - 1, (1 << 62) - 1, (1 << 62) - 1])
    got = bernoulli_exps([1], [3], rng, kinds=[0, 0, 0])
    assert got.tolist() == [False, True, False]
    assert rng.values == []


def test_table_exp_draw_frequencies_per_row():
    """Each lane follows exp(-gamma) of its own row (a wrong row or constant fails: the rows
    differ by far more than 5 sigma)."""
    from mechanisms.exact import bernoulli_exps

    table = [Fraction(1, 10), Fraction(7, 5), Fraction(3)]
    rng = np.random.default_rng(6)
    kinds = np.tile([0, 1, 2], 40_000)
    got = bernoulli_exps([g.numerator for g in table], [g.denominator for g in table], rng,
                         kinds=kinds)
    for j, g in enumerate(table):
        p = math.exp(-float(g))
        freq = got[kinds == j].mean()
        assert abs(freq - p) < 5 * math.sqrt(p * (1 - p) / 40_000)


def test_exp_radius_draw_matches_its_lane_by_lane_form():
    """exp_draw (gammas once per distinct radius) returns what the per-query form returns
    from the same generator state: a uniform class per query, a non-answer kept with
    probability exp(-eps (r + 1)) lane by lane, again for the queries not kept."""
    pick = np.random.default_rng(7)
    n, classes, eps = 500, 4, 0.37
    answer = pick.integers(0, classes, size=n)
    radius = pick.integers(-1, 12, size=n)
    new, old = np.random.default_rng(8), np.random.default_rng(8)
    got = exp_draw(answer, radius, eps, classes, new)
    want = np.full(n, REFUSED)
    active = np.arange(n)
    while active.size:
        proposal = old.integers(0, classes, size=active.size)
        keep = proposal == answer[active]
        other = np.flatnonzero(~keep)
        if other.size:
            gammas = [Fraction(eps) * (int(r) + 1) for r in radius[active[other]]]
            keep[other] = _lane_by_lane_exps([g.numerator for g in gammas],
                                             [g.denominator for g in gammas], old)
        want[active[keep]] = proposal[keep]
        active = active[~keep]
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("n", [0, 1, 5, 16, 17, 300])
def test_distinct_rows_is_numpys_unique_with_its_inverse(n):
    from mechanisms.exact import distinct_rows

    values = np.random.default_rng(n).integers(-3, 9, size=n)
    distinct, rows = distinct_rows(values)
    want, inverse = np.unique(values, return_inverse=True)
    assert distinct.tolist() == want.tolist() and rows.tolist() == inverse.tolist()
    assert distinct.dtype == values.dtype
