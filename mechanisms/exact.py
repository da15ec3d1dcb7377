"""Exact samplers for the releases (exp-radius, ens-exp-radius, df-exp, lnmax, the sparse
vector, ss-argmax; through mechanisms/noise.py also the binary Laplace and Cauchy threshold
releases and PTR).

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
* `bernoulli_ratios`, `bernoulli_exps`: the same laws as `bernoulli` and `bernoulli_exp`
  for many independent draws at once, the generator's 62-bit integers drawn in bulk (a
  draw consumes the generator's output in another order than the one-at-a-time functions,
  so seeded runs differ; the laws do not). `bernoulli_exps` takes the lanes' gammas as a
  table of distinct values and each lane's row of it (`kinds`: exp-radius has one gamma
  per distinct radius, a few hundred at most for thousands of queries): each round's
  comparison points floor(p 2^62) are computed once per distinct (gamma, k) in integers
  and compared with the lanes' bits in numpy. It consumes the generator exactly as the
  lane-by-lane form (one 62-bit integer per undecided lane, in lane order, then the tie
  continuations in lane order), so it returns the same draws from the same generator
  state, and therefore has the same law.
* `bernoulli_arctan_over_pi(x)`, x >= 0 rational: Bernoulli(arctan(x) / pi), the flip
  probability of a binary Cauchy release (mechanisms/noise.py). p is irrational, so u is
  compared with rigorous rational enclosures lo <= p <= hi, and more digits of u and of p
  are drawn until u lies on one side: the decision is always u < p, so it happens with
  probability exactly p (u = p has probability 0), and the first stage (p to 2^-64)
  decides all but a 2^-60 fraction of calls. The enclosures: Euler's series
  arctan(x) = sum_n t_n, t_0 = x / (1 + x^2), t_(n+1) = t_n (2n + 2) / (2n + 3) x^2 / (1 + x^2)
  has positive terms whose ratio is below y = x^2 / (1 + x^2), so the tail after t_N is at
  most t_N y / (1 - y) = t_N x^2; arguments are first reduced below 3/7
  (`_arctan_over_pi_bounds`), and pi = 16 arctan(1/5) - 4 arctan(1/239) (Machin) comes
  from the same enclosures.
* `LazyCauchy` and `cauchy_argmax(baseline, centres, s)`: ss-argmax's release for C > 2,
  argmax(baseline, c_j + s Z_j) with Z_j i.i.d. standard Cauchy. Z_j = G^-1(u_j) for a
  lazily drawn uniform u_j and G(t) = 1/2 + arctan(t) / pi, so Z_j > t iff u_j > G(t),
  decided as above from enclosures of G(t); the same u_j answers every question about
  Z_j. The argmax is found by comparing the scores with the baseline and then bisecting the
  contested range at rational points until one score is left (`cauchy_argmax`). No tan is
  evaluated and no float is drawn: the answer is the exact argmax of the realised scores.
* `uniform_below(m)`: an integer uniform on {0, ..., m - 1} for any m >= 1, by rejection
  from the generator's 62-bit integers (Python integers: m may exceed 2^63).
* `discrete_laplace(rate)`: Z on the integers with P(Z = z) proportional to
  exp(-rate |z|), rate = s / t > 0 rational, by Canonne, Kamath & Steinke 2020, Alg. 2:
  U uniform on {0, ..., t - 1}, kept with probability exp(-U / t); V the number of
  successes of Bernoulli(exp(-1)) before the first failure; X = U + t V then has
  P(X = x) proportional to exp(-U / t) exp(-V) = exp(-x / t) (x >= 0 determines U and V),
  and Y = floor(X / s) has P(Y = y) proportional to sum_{x = ys}^{ys + s - 1} exp(-x / t),
  i.e. to exp(-y s / t); a fair sign, rejecting "-0" so that 0 is not counted twice, gives
  the two-sided law. Expected work is O(1) whatever the rate (the keep step accepts with
  probability 1 - 1/e on average for large t).
* `discrete_gaussian(sigma_sq)`: Z on the integers with P(Z = z) proportional to
  exp(-z^2 / (2 sigma^2)), sigma^2 > 0 rational, by Canonne, Kamath & Steinke 2020, Alg. 3:
  Y discrete Laplace of rate 1/t, t = floor(sigma) + 1, kept with probability
  exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)) (`bernoulli_exp` of a rational). The kept Y has
  P(Y = y) proportional to exp(-|y|/t - (|y| - sigma^2/t)^2 / (2 sigma^2)) =
  exp(-y^2 / (2 sigma^2) - sigma^2 / (2 t^2)), the discrete Gaussian exactly; a draw is kept
  with probability above 0.3 for every sigma (their Sec. 5.3).

mechanisms/noise.py draws the binary Laplace threshold releases and the PTR tests through
`bernoulli` and `bernoulli_exp` too (their outcomes have closed-form laws), and lnmax
(mechanisms/ensemble.py) adds `discrete_laplace` noise to its integer vote counts; the
binary Cauchy releases draw their flips through `bernoulli_arctan_over_pi`, and the sparse
vector adds `discrete_laplace` noise to the integer radii; ss-argmax for more than two
classes draws through `cauchy_argmax`. The convex and loss-perturbation mechanisms' Gaussian
noises are still drawn in floating point; docs/privacy.md states
what that leaves.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

_BITS = 62


def bernoulli(p: Fraction, rng: np.random.Generator) -> bool:
    """True with probability exactly p (a rational; <= 0: never, >= 1: always)."""
    if p <= 0:
        return False
    if p >= 1:
        return True
    return _bernoulli_ratio(p.numerator, p.denominator, rng)


def _bernoulli_ratio(num: int, den: int, rng: np.random.Generator) -> bool:
    """True with probability num / den (integers; plain ints keep the loop cheap)."""
    if num <= 0:
        return False
    if num >= den:
        return True
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
    num, den = gamma.numerator, gamma.denominator
    whole, rest = divmod(num, den)              # gamma = whole + rest / den
    for _ in range(whole):
        if not _bernoulli_exp_unit(1, 1, rng):
            return False
    return _bernoulli_exp_unit(rest, den, rng)


def _bernoulli_exp_unit(num: int, den: int, rng: np.random.Generator) -> bool:
    """Bernoulli(exp(-gamma)) for gamma = num / den in [0, 1]."""
    k = 1
    while _bernoulli_ratio(num, den * k, rng):
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


# -- many draws at once: the same laws, the generator's integers drawn in bulk ---------------

def bernoulli_ratios(nums: list[int], dens: list[int], rng: np.random.Generator
                     ) -> np.ndarray:
    """One draw of Bernoulli(nums[i] / dens[i]) per lane, exactly (`bernoulli`'s law).

    A lane's uniform u is compared with its p through u's first 62 bits, drawn for every
    lane at once: those bits U, as an integer, against P = floor(p 2^62): U < P means
    u < p and U > P means u > p; U = P (probability 2^-62) goes on with the next bits
    against the rest of p's digits, as `bernoulli` does (`_bernoulli_ratio`)."""
    n = len(nums)
    out = np.zeros(n, dtype=bool)
    undecided = []
    for i, (num, den) in enumerate(zip(nums, dens)):
        if num >= den:
            out[i] = True
        elif num > 0:
            undecided.append(i)
    if not undecided:
        return out
    bits = np.asarray(rng.integers(0, 1 << _BITS, size=len(undecided))).tolist()
    for i, u in zip(undecided, bits):
        scaled = nums[i] << _BITS
        p_top, rest = divmod(scaled, dens[i])
        if u != p_top:
            out[i] = u < p_top
        else:
            out[i] = _bernoulli_ratio(rest, dens[i], rng)
    return out


def bernoulli_exps(nums: list[int], dens: list[int], rng: np.random.Generator,
                   kinds: ArrayLike | None = None) -> np.ndarray:
    """One draw of Bernoulli(exp(-gamma_i)) per lane, exactly (`bernoulli_exp`'s algorithm,
    every lane's steps taken together): gamma_i = nums[j] / dens[j] >= 0 with j = kinds[i]
    (a table of distinct gammas and each lane's row of it), j = i without `kinds`.

    Steps, as `bernoulli_exp` takes them per lane: floor(gamma) rounds of Bernoulli(exp(-1))
    for the lanes whose integer part is not used up yet (a lane stops at its first failure),
    then Bernoulli(exp(-frac(gamma))) for the lanes still alive (`_bernoulli_exp_table`).
    Round t of the first part involves the lanes alive with floor(gamma) > t, in lane order,
    as the lane-by-lane form's list of lanes with integer part left; integer parts are
    compared capped at 2^62, which changes nothing for t < 2^62 rounds (each round is a
    loop iteration)."""
    if kinds is None:
        kinds = np.arange(len(nums))
    else:               # only the rows some lane points at
        rows, kinds = distinct_rows(np.asarray(kinds, dtype=np.intp))
        nums, dens = [nums[j] for j in rows.tolist()], [dens[j] for j in rows.tolist()]
    whole, rest = [], []
    for num, den in zip(nums, dens):
        if num < 0:
            raise ValueError(f"bernoulli_exps needs gamma >= 0, got {num}/{den}")
        w, r = divmod(num, den)
        whole.append(min(w, _CAP))
        rest.append(r)
    n = len(kinds)
    alive = np.ones(n, dtype=bool)
    if n == 0:
        return alive
    lane_whole = np.asarray(whole, dtype=np.int64)[kinds]
    unit = np.zeros(1, dtype=np.intp)          # every lane of a round at gamma = 1 / 1
    t = 0
    todo = np.flatnonzero(lane_whole > 0)
    while todo.size:
        ok = _bernoulli_exp_table([1], [1], unit.repeat(todo.size), rng)
        alive[todo[~ok]] = False
        t += 1
        todo = todo[ok & (lane_whole[todo] > t)]
    last = np.flatnonzero(alive)
    if last.size:
        alive[last] = _bernoulli_exp_table(rest, dens, kinds[last], rng)
    return alive


#: integer parts at or above this are capped (`bernoulli_exps`): that many rounds never run
_CAP = 1 << 62


def distinct_rows(values: NDArray[np.integer]) -> tuple[NDArray, NDArray[np.intp]]:
    """The distinct values of a 1-D integer array, sorted, and each entry's row among them
    (np.unique with return_inverse); a few values are sorted in Python, where numpy's cost
    per call is most of the work (single-query requests)."""
    if values.size <= 16:
        distinct = sorted(set(values.tolist()))
        row = {v: i for i, v in enumerate(distinct)}
        return (np.asarray(distinct, dtype=values.dtype),
                np.asarray([row[v] for v in values.tolist()], dtype=np.intp))
    distinct, inverse = np.unique(values, return_inverse=True)
    return distinct, inverse.reshape(-1)


def _bernoulli_exp_table(nums: list[int], dens: list[int], kinds: NDArray[np.intp],
                         rng: np.random.Generator) -> np.ndarray:
    """Bernoulli(exp(-nums[j] / dens[j])) for lane i, j = kinds[i], every gamma in [0, 1]:
    `_bernoulli_exp_unit` for every lane together (K = the first k with A_k = 0, A_k ~
    Bernoulli(gamma / k); true iff K is odd).

    Round by round, the lanes still drawing (in lane order) draw A_k as `bernoulli_ratios`
    does for p = nums[j] / (dens[j] k): p >= 1 is a success and p = 0 a failure without a
    draw; every other lane gets one 62-bit integer U (drawn together, in lane order) and
    succeeds iff U < P = floor(p 2^62), goes on lane by lane (`_bernoulli_ratio` on p's
    remaining digits) where U = P. P and the remainder are computed once per distinct (j,
    k) of the round, in Python integers (exact for any size of num and den)."""
    n = len(kinds)
    k = np.ones(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        kk = k[todo]
        # the distinct (j, k) of this round (k is at most the number of rounds so far)
        stride = int(kk.max()) + 1
        pairs, inverse = distinct_rows(kinds[todo].astype(np.int64) * stride + kk)
        # per pair: 1 for p >= 1 (a success without a draw), -1 for p = 0 (a failure
        # without a draw), else 0 with P = floor(p 2^62) < 2^62 and the remainder
        fixed, tops, rests, denominators = [], [], [], []
        for pair in pairs.tolist():
            j, kj = divmod(pair, stride)
            num, den = nums[j], dens[j] * kj
            top = rem = 0
            if num >= den:
                fixed.append(1)
            elif num <= 0:
                fixed.append(-1)
            else:
                fixed.append(0)
                top, rem = divmod(num << _BITS, den)
            tops.append(top)
            rests.append(rem)
            denominators.append(den)
        lane_fixed = np.asarray(fixed, dtype=np.int8)[inverse]
        more = lane_fixed == 1
        undecided = np.flatnonzero(lane_fixed == 0)
        if undecided.size:
            bits = np.asarray(rng.integers(0, 1 << _BITS, size=undecided.size), dtype=np.int64)
            top = np.asarray(tops, dtype=np.int64)[inverse[undecided]]
            more[undecided] = bits < top
            for i in undecided[bits == top].tolist():     # U = P: probability 2^-62 each
                q = int(inverse[i])
                more[i] = _bernoulli_ratio(rests[q], denominators[q], rng)
        k[todo[more]] += 1
        todo = todo[more]
    return k % 2 == 1


def uniform_below(m: int, rng: np.random.Generator) -> int:
    """An integer uniform on {0, ..., m - 1}, m >= 1 (any size)."""
    if m < 1:
        raise ValueError(f"uniform_below needs m >= 1, got {m}")
    bits = (m - 1).bit_length()
    while True:
        x, have = 0, 0
        while have < bits:
            x = (x << _BITS) | int(rng.integers(0, 1 << _BITS))
            have += _BITS
        x >>= have - bits                       # exactly uniform on [0, 2^bits)
        if x < m:                               # accepted with probability > 1/2
            return x


def discrete_laplace(rate: Fraction, rng: np.random.Generator) -> int:
    """An integer Z with P(Z = z) = (1 - a) / (1 + a) a^|z|, a = exp(-rate), rate > 0
    rational (module docstring: Canonne, Kamath & Steinke 2020, Alg. 2)."""
    if rate <= 0:
        raise ValueError(f"discrete_laplace needs rate > 0, got {rate}")
    s, t = rate.numerator, rate.denominator
    while True:
        u = uniform_below(t, rng)
        if not _bernoulli_exp_unit(u, t, rng):            # exp(-u / t), u / t < 1
            continue
        v = 0
        while _bernoulli_exp_unit(1, 1, rng):             # exp(-1)
            v += 1
        y = (u + t * v) // s
        negative = int(rng.integers(0, 2)) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_gaussian(sigma_sq: Fraction, rng: np.random.Generator) -> int:
    """An integer Z with P(Z = z) proportional to exp(-z^2 / (2 sigma_sq)), sigma_sq > 0
    rational (module docstring: Canonne, Kamath & Steinke 2020, Alg. 3)."""
    if sigma_sq <= 0:
        raise ValueError(f"discrete_gaussian needs sigma^2 > 0, got {sigma_sq}")
    t = math.isqrt(sigma_sq.numerator // sigma_sq.denominator) + 1   # floor(sigma) + 1
    rate = Fraction(1, t)
    shift = sigma_sq / t
    while True:
        y = discrete_laplace(rate, rng)
        gap = abs(y) - shift
        if bernoulli_exp(gap * gap / (2 * sigma_sq), rng):
            return y


def _arctan_bounds(x: Fraction, precision: int) -> tuple[Fraction, Fraction]:
    """lo <= arctan(x) <= hi with hi - lo <= 2^-precision (about), for 0 <= x <= 1: Euler's
    series (module docstring) in fixed point, M = 2^(precision + 8) units, each term kept
    as a floor and a ceiling of its exact value (the recurrence multiplies by a positive
    rational, so floor and ceiling stay on their sides), plus the tail bound t_N x^2
    rounded up."""
    a, b = x.numerator, x.denominator
    a2, norm = a * a, a * a + b * b
    scale = 1 << (precision + 8)
    low = high = 0
    t_low = (scale * a * b) // norm
    t_high = -((-scale * a * b) // norm)
    n = 0
    while True:
        low += t_low
        high += t_high
        tail = -((-t_high * a2) // (b * b))                   # ceil(t_N x^2)
        if tail <= 256:
            return Fraction(low, scale), Fraction(high + tail, scale)
        ratio_num, ratio_den = (2 * n + 2) * a2, (2 * n + 3) * norm
        t_low = (t_low * ratio_num) // ratio_den
        t_high = -((-t_high * ratio_num) // ratio_den)
        n += 1


@lru_cache(maxsize=8)
def _pi_bounds(precision: int) -> tuple[Fraction, Fraction]:
    """lo <= pi <= hi, hi - lo <= 2^-(precision - 5) (Machin's formula)."""
    a_lo, a_hi = _arctan_bounds(Fraction(1, 5), precision)
    b_lo, b_hi = _arctan_bounds(Fraction(1, 239), precision)
    return 16 * a_lo - 4 * b_hi, 16 * a_hi - 4 * b_lo


def _arctan_over_pi_bounds(x: Fraction, precision: int) -> tuple[Fraction, Fraction]:
    """lo <= arctan(x) / pi <= hi for x >= 0, to about 2^-(precision - 6). The series runs
    on an argument w <= 3/7 (y = w^2 / (1 + w^2) < 0.16: 2.6 bits a term), by
    arctan(x) = pi/4 -+ arctan(|1 - x| / (1 + x)) near 1 and pi/2 - arctan(1/x) above."""
    pi_lo, pi_hi = _pi_bounds(precision)
    if x <= Fraction(2, 5):
        w, offset, sign = x, Fraction(0), 1
    elif x <= 1:
        w, offset, sign = (1 - x) / (1 + x), Fraction(1, 4), -1
    elif x < Fraction(5, 2):
        w, offset, sign = (x - 1) / (x + 1), Fraction(1, 4), 1
    else:
        w, offset, sign = 1 / x, Fraction(1, 2), -1
    a_lo, a_hi = _arctan_bounds(w, precision)                 # arctan(w) in [a_lo, a_hi]
    low, high = a_lo / pi_hi, a_hi / pi_lo                    # arctan(w) / pi, a_lo >= 0
    return (offset + low, offset + high) if sign > 0 else (offset - high, offset - low)


class LazyUniform:
    """A uniform u in [0, 1) whose binary digits are drawn on demand and kept, so that one
    u can be compared with several numbers (a lazily realised Cauchy variate below)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.value, self.digits = 0, 0          # u in [value / 2^digits, (value + 1) / 2^digits)

    def below(self, bounds: Callable[[int], tuple[Fraction, Fraction]]) -> bool:
        """Whether u < p, for p given by enclosures bounds(precision) = (lo, hi) with
        lo <= p <= hi and hi - lo -> 0 as precision grows: u's digits and p's enclosures are
        refined together until u's interval lies on one side of [lo, hi]. Exact whenever
        u != p, an event of probability 0 (an irrational p never ends; a dyadic one is decided
        once u has its digits)."""
        precision = 64
        while True:
            lo, hi = bounds(precision)
            while self.digits < precision:
                self.value = (self.value << _BITS) | int(self.rng.integers(0, 1 << _BITS))
                self.digits += _BITS
            # (value + 1) / 2^digits <= lo and value / 2^digits >= hi, in integers
            if (self.value + 1) * lo.denominator <= lo.numerator << self.digits:
                return True
            if self.value * hi.denominator >= hi.numerator << self.digits:
                return False
            precision *= 2


def bernoulli_arctan_over_pi(x: Fraction, rng: np.random.Generator) -> bool:
    """True with probability exactly arctan(x) / pi, x >= 0 rational (module docstring)."""
    if x < 0:
        raise ValueError(f"bernoulli_arctan_over_pi needs x >= 0, got {x}")
    if x == 0:
        return False
    return LazyUniform(rng).below(lambda precision: _arctan_over_pi_bounds(x, precision))


@lru_cache(maxsize=256)
def _cauchy_cdf_bounds(t: Fraction, precision: int) -> tuple[Fraction, Fraction]:
    """lo <= G(t) <= hi for the standard Cauchy distribution function
    G(t) = 1/2 + arctan(t) / pi (odd arctan: G(-t) = 1 - G(t)). Cached: the noises of one
    argmax with equal centres are asked about the same points."""
    lo, hi = _arctan_over_pi_bounds(abs(t), precision)
    half = Fraction(1, 2)
    return (half + lo, half + hi) if t >= 0 else (half - hi, half - lo)


class LazyCauchy:
    """A standard Cauchy variate Z = G^-1(u), u a `LazyUniform`, known only through the
    comparisons asked of it: Z > t iff u > G(t) (G is continuous and strictly increasing),
    decided exactly by `LazyUniform.below` on enclosures of G(t). Each answer narrows the
    open interval (lo, hi) that Z is known to lie in (None: unbounded); the digits drawn so
    far are kept, so every answer is about the same Z."""

    def __init__(self, rng: np.random.Generator):
        self.uniform = LazyUniform(rng)
        self.lo: Fraction | None = None
        self.hi: Fraction | None = None

    def above(self, t: Fraction) -> bool:
        """Whether Z > t (Z = t has probability 0)."""
        if self.lo is not None and t <= self.lo:
            return True
        if self.hi is not None and t >= self.hi:
            return False
        if self.uniform.below(lambda precision: _cauchy_cdf_bounds(t, precision)):
            self.hi = t
            return False
        self.lo = t
        return True


def cauchy_argmax(baseline: Fraction, centres: list[Fraction], scale: Fraction,
                  rng: np.random.Generator) -> int:
    """argmax(baseline, centres[0] + scale Z_1, ..., centres[m-1] + scale Z_m) for i.i.d.
    standard Cauchy Z_j and scale > 0, exactly: 0 for the baseline, j for the j-th noisy
    score. The noises are `LazyCauchy` variates, and only comparisons with rational points
    are asked of them, so the answer is the exact argmax of the realised scores (ties have
    probability 0) and its law is exactly the continuous one.

    First every score is compared with the baseline; of those above it, scores whose
    interval lies below the largest lower end L are out (they are below another score),
    and the rest are compared with a point x in the contested range: (L + H) / 2 when the
    largest upper end H is finite, else L + scale 2^i at the i-th unbounded round. Each
    comparison with x leaves every interval on one side of x, so the contested range halves
    (or, unbounded, its lower end moves up geometrically) until one score is left; that
    happens with probability 1 since the two largest scores differ almost surely."""
    return _argmax_of(baseline, centres, scale, [LazyCauchy(rng) for _ in centres])


def _argmax_of(baseline: Fraction, centres: list[Fraction], scale: Fraction,
               noises: list[LazyCauchy]) -> int:
    """`cauchy_argmax` with the noises given (tests give each its own digits)."""
    if scale <= 0:
        raise ValueError(f"cauchy_argmax needs scale > 0, got {scale}")
    alive = [j for j, centre in enumerate(centres) if noises[j].above((baseline - centre) / scale)]
    unbounded_rounds = 0
    while len(alive) > 1:
        low = {j: centres[j] + scale * noises[j].lo for j in alive}      # lo set: above baseline
        high = {j: None if noises[j].hi is None else centres[j] + scale * noises[j].hi
                for j in alive}
        largest_low = max(low.values())
        alive = [j for j in alive if high[j] is None or high[j] > largest_low]
        if len(alive) == 1:
            break
        if any(high[j] is None for j in alive):
            x = largest_low + scale * (1 << unbounded_rounds)
            unbounded_rounds += 1
        else:
            x = (largest_low + max(high[j] for j in alive)) / 2
        above = [j for j in alive if noises[j].above((x - centres[j]) / scale)]
        if above:
            alive = above
    return 0 if not alive else alive[0] + 1
