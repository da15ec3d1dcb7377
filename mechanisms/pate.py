"""PATE's Gaussian releases over teacher votes (Papernot, Song, Mironov, Raghunathan, Talwar &
Erlingsson 2018, "Scalable Private Learning with PATE", Sec. 4): gnmax and confident-gnmax.

Conventions (one replaced record moves at most one teacher's vote)
------------------------------------------------------------------
Teacher t is trained on part t of the private data only (votes.py), so a replaced record
changes at most one vote per query: the count vector n moves by +1 in one class and -1 in
another, an L2 move of sqrt(2); the largest count max_c n_c moves by at most 1.

Releases (per query; only a label, or REFUSED = -1 for "no answer", leaves)
----------------------------------------------------------------------------
* gnmax: argmax_c (n_c + Z_c), Z_c i.i.d. discrete Gaussian N_Z(0, sigma^2), a tie won by a
  uniformly chosen maximiser. The noisy count vector is the multivariate discrete Gaussian
  mechanism with L2 sensitivity sqrt(2): (alpha, alpha / sigma^2)-RDP at every order
  (Canonne, Kamath & Steinke 2020, Cor. 9: the discrete Gaussian has the Renyi divergences of
  the continuous one, alpha ||mu||^2 / (2 sigma^2), at integer shifts mu); the argmax with a
  data-independent tie-break is post-processing.
* confident-gnmax (PATE 2018, Alg. 1): answer only if max_c n_c + Z >= T, Z ~ N_Z(0,
  sigma_1^2) (sensitivity 1: (alpha, alpha / (2 sigma_1^2))-RDP), and then with gnmax at
  sigma_2. The data-independent charge per query is the sum of both curves whether or not
  the query is answered (the ledger charges before any noise is drawn, so it cannot charge
  by the outcome); the data-dependent analysis (pate_costs.py) follows the paper and counts
  the gnmax step on answered queries only.

Realised law. The noise is drawn exactly (mechanisms/exact.py, `discrete_gaussian`:
Canonne, Kamath & Steinke 2020, Alg. 3, from the generator's integers, no float); the
released label has exactly the law above for sigma^2 = the exact rational value of the float
sigma, squared. Continuous Gaussian noise on integer counts would only add rounding
(a float sampler realises another law than the proof's, exact.py), and the paper's
analysis needs only the Renyi curve and tail bounds, both stated here for the discrete law.

Tails. `difference_tail(sigma, g)` = P(Z_1 - Z_2 >= g) for independent N_Z(0, sigma^2), the
probability that a class g votes behind the leader is released at least level with it; it is
computed in float64 from the pmf, summed over |z| <= ceil(40 sigma) + g (the rest weighs
below e^-800), and returned with an upper and a lower bracket 1e-9 apart (relative), which
the data-dependent bounds use in the safe direction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import DataError, PrivacyError
from mechanisms.base import REFUSED, Mechanism, register
from mechanisms.checks import (
    MIN_EPSILON,
    check_delta,
    check_epsilon,
    is_real,
    privacy_problems,
)
from mechanisms.ensemble import _gauss_legendre_unit
from mechanisms.exact import discrete_gaussian, uniform_below
from mechanisms.guarantee import Guarantee
from mechanisms.inputs import Votes
from mechanisms.rdp import Curve, compose_curves, curve_epsilon, gaussian_curve
from mechanisms.votes import counts_of

__all__ = ["GaussianNoisyMax", "ConfidentGaussianNoisyMax", "gnmax_curve",
           "MAX_ANALYSIS_SIGMA",
           "calibrate_sigma", "sigmas_for_budget", "difference_tail", "gaussian_tail", "dg_pmf",
           "gnmax_probabilities", "gnmax_label_probabilities", "answer_probabilities",
           "gnmax_draw", "REFUSED"]

_TAIL_WIDTH = 40.0        # pmf support |z| <= ceil(40 sigma) + margin: e^-800 is left out
_TAIL_SLACK = 1e-9        # relative bracket of the float64 tail sums (they err ~1e-13)
_MAX_SIGMA = 1e6          # above this the pmf tables grow past memory; no use needs it
_MIN_SIGMA = 1e-3


def _check_sigma(sigma: object, name: str, problems) -> None:
    if not is_real(sigma) or not math.isfinite(sigma) or sigma <= 0:
        problems.add(f"{name} must be a finite number > 0, got {sigma!r}")
    elif not _MIN_SIGMA <= sigma <= _MAX_SIGMA:
        problems.add(f"{name} must be in [{_MIN_SIGMA:g}, {_MAX_SIGMA:g}], got {sigma!r}")


def _sigma_sq(sigma: float) -> Fraction:
    """sigma^2 as the exact rational square of the float sigma."""
    s = Fraction(float(sigma))
    return s * s


# ---------------------------------------------------------------------------------------------
# Renyi curves (module docstring)

def gnmax_curve(sigma: float) -> Curve:
    """gnmax's curve: alpha / sigma^2 (L2 sensitivity sqrt(2))."""
    return gaussian_curve(1.0 / float(sigma) ** 2)


def calibrate_sigma(epsilon: float, delta: float, *, confident: bool = False,
                    spent: Curve | None = None, count: int = 1) -> float:
    """The smallest sigma (to 1e-9 relative, rounded up) such that `count` charges of the
    per-query curve at sigma (gnmax's `gnmax_curve(sigma)`; with `confident`,
    confident-gnmax's at sigma_2 = sigma, sigma_1 = 2 sigma), composed after `spent` (a
    curve already charged, or nothing) exactly as an rdp ledger composes them, convert to at
    most (epsilon, delta)-DP.

    Args:
        epsilon: the epsilon to fit in, > 0.
        delta: the delta it is converted at, in (0, 1).
        confident: calibrate confident-gnmax's sigma_2 instead of gnmax's sigma.
        spent: a curve composed before (an rdp ledger's `spent_curve`).
        count: the number of charges (queries).
    """
    epsilon, delta = float(epsilon), float(delta)

    def eps_at(sigma: float) -> float:
        own = _confident_curve(2.0 * sigma, sigma) if confident else gnmax_curve(sigma)
        groups = [(own, int(count))] + ([(spent, 1)] if spent is not None else [])
        return curve_epsilon(compose_curves(groups), delta)[0]

    lo, hi = _MIN_SIGMA, _MAX_SIGMA
    if eps_at(hi) > epsilon:
        raise PrivacyError(f"no sigma up to {_MAX_SIGMA:g} fits {count} quer"
                           f"{'y' if count == 1 else 'ies'} in ({epsilon!r}, {delta!r}); "
                           f"raise epsilon or delta")
    if eps_at(lo) <= epsilon:
        return lo
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps_at(mid) <= epsilon else (mid, hi)
        if hi / lo < 1 + 1e-9:
            break
    return hi


def _confident_curve(sigma1: float, sigma2: float) -> Curve:
    """confident-gnmax's per-query curve (the one float expression the mechanism and the
    planner share, so a plan and the ledger's charge are the same floats)."""
    return gaussian_curve(0.5 / sigma1 ** 2 + 1.0 / sigma2 ** 2)


def sigmas_for_budget(epsilon_total: float, delta_total: float, n_queries: int, *,
                      confident: bool = False, spent: Curve | None = None
                      ) -> tuple[float, float | None]:
    """The noise of a run of `n_queries` releases that composes (rdp ledger) to at most
    (epsilon_total, delta_total): (sigma, None) for gnmax; (sigma_2, sigma_1 = 2 sigma_2)
    for confident-gnmax, whose per-query curve is then 9 alpha / (8 sigma_2^2), charged on
    every query. A function of public quantities only (and of what the ledger has charged).

    Args:
        epsilon_total: the run's total epsilon.
        delta_total: the run's total delta, in (0, 1).
        n_queries: the number of queries of the run, >= 1.
        confident: calibrate confident-gnmax's pair instead of gnmax's sigma.
        spent: the ledger's curve so far (`Ledger.spent_curve`), or None for a new one.
    """
    problems = privacy_problems("PATE calibration")
    check_epsilon(epsilon_total, problems, name="epsilon_total")
    check_delta(delta_total, problems, name="delta_total")
    problems.check(isinstance(n_queries, (int, np.integer)) and not isinstance(n_queries, bool)
                   and n_queries >= 1, f"n_queries must be an integer >= 1, got {n_queries!r}")
    problems.raise_if_any()
    sigma = calibrate_sigma(epsilon_total, delta_total, confident=confident, spent=spent,
                            count=int(n_queries))
    if confident and 2.0 * sigma > _MAX_SIGMA:
        raise PrivacyError(f"sigma_1 = 2 sigma_2 = {2 * sigma:.6g} would be above "
                           f"{_MAX_SIGMA:g}: the budget is too small for {n_queries} queries")
    return (sigma, 2.0 * sigma) if confident else (sigma, None)


# ---------------------------------------------------------------------------------------------
# The discrete Gaussian's law (module docstring: tails)

@lru_cache(maxsize=64)
def dg_pmf(sigma: float, half_width: int) -> NDArray[np.float64]:
    """P(Z = z) for z = -half_width..half_width, Z ~ N_Z(0, sigma^2) (normalised over that
    range; the mass beyond 40 sigma is below e^-800)."""
    z = np.arange(-half_width, half_width + 1, dtype=np.float64)
    w = np.exp(-z * z / (2.0 * float(sigma) ** 2))
    out = w / math.fsum(w)
    out.setflags(write=False)
    return out


def _half_width(sigma: float, extra: int = 0) -> int:
    return int(math.ceil(_TAIL_WIDTH * float(sigma))) + 2 + int(extra)


#: the largest sigma the data-dependent analysis tables (their support is 80 sigma wide)
MAX_ANALYSIS_SIGMA = 1e4


@lru_cache(maxsize=64)
def _difference_tails(sigma: float, max_gap: int) -> tuple[NDArray[np.float64], int]:
    """P(Z_1 - Z_2 >= g) for g = -max_gap..max_gap (index g + max_gap): sum_z p(z) S(z + g)
    with S(t) = P(Z >= t), one dot product of nonnegative terms per gap (linear in the
    support, so large sigmas stay fast; exact up to float64 rounding)."""
    if sigma > MAX_ANALYSIS_SIGMA:
        raise PrivacyError(f"sigma {sigma:g} is above {MAX_ANALYSIS_SIGMA:g}, where the "
                           f"data-dependent analysis is not offered (its charge is the "
                           f"data-independent one)")
    w = _half_width(sigma)
    p = dg_pmf(sigma, w)
    tail = np.concatenate([np.cumsum(p[::-1])[::-1], [0.0]])   # S(t) at index t + w, t <= w+1
    g = np.arange(-max_gap, max_gap + 1)
    out = np.empty(len(g))
    z = np.arange(-w, w + 1)
    for i, gap in enumerate(g.tolist()):
        t = z + gap
        s_t = np.where(t > w, 0.0, np.where(t < -w, 1.0, tail[np.clip(t + w, 0, 2 * w + 1)]))
        out[i] = float(p @ s_t)
    out = np.minimum(out, 1.0)
    out.setflags(write=False)
    return out, max_gap


def difference_tail(sigma: float, gaps: ArrayLike, *, bound: str = "upper") -> NDArray[np.float64]:
    """P(Z_1 - Z_2 >= g) for integer gaps g, Z_i i.i.d. N_Z(0, sigma^2): the "upper" (or
    "lower") end of a bracket 1e-9 wide (relative) around the float64 sum.

    Args:
        sigma: the noise standard deviation.
        gaps: integer array of gaps (any shape).
        bound: "upper" (for bounds that must not be too small) or "lower".
    """
    g = np.asarray(gaps, dtype=np.int64)
    reach = int(np.abs(g).max(initial=0))
    table, m = _difference_tails(float(sigma), max(reach, 1))
    value = table[np.clip(g, -m, m) + m]
    if bound == "upper":
        return np.minimum(1.0, value * (1 + _TAIL_SLACK) + 1e-300)
    if bound == "lower":
        return np.maximum(0.0, value * (1 - _TAIL_SLACK) - 1e-300)
    raise ValueError(f"bound must be 'upper' or 'lower', got {bound!r}")


def gaussian_tail(sigma: float, t: ArrayLike) -> NDArray[np.float64]:
    """P(Z >= t) for Z ~ N_Z(0, sigma^2) and real t (float64; for expected accuracies and the
    threshold step's answer probability)."""
    t = np.asarray(t, dtype=np.float64)
    w = _half_width(sigma)
    p = dg_pmf(float(sigma), w)
    tail = np.cumsum(p[::-1])[::-1]                 # P(Z >= k), index k + w
    k = np.ceil(t).astype(np.int64)
    return np.where(k > w, 0.0, np.where(k < -w, 1.0, tail[np.clip(k + w, 0, 2 * w)]))


# ---------------------------------------------------------------------------------------------
# Exact laws of the releases (experiments' expected accuracies)

def gnmax_probabilities(counts: ArrayLike, sigma: float) -> NDArray[np.float64]:
    """P(gnmax releases y), (Q, C), for vote counts (Q, C).

    y wins with its noisy count v = n_y + z when every other class is below v, or level with
    it and then loses the uniform tie-break: sum_z p(z) sum_S prod_{j in S} P(n_j + Z_j = v)
    prod_{j not in S} P(n_j + Z_j < v) / (1 + |S|), and sum_k c_k / (1 + k) over a
    polynomial's coefficients is its integral over [0, 1], computed exactly by Gauss-Legendre
    (the polynomial has degree C - 1). z runs over |z| <= 12 sigma + 2 (the rest weighs below
    e^-72: an expected accuracy, not a privacy bound, so this truncation is harmless).

    Args:
        counts: (Q, C) integer vote counts.
        sigma: the noise standard deviation.

    Returns:
        (Q, C) release probabilities, clipped to [0, 1].
    """
    n = np.asarray(counts, dtype=np.int64)
    q, c = n.shape
    labels = np.tile(np.arange(c), q)
    return gnmax_label_probabilities(np.repeat(n, c, axis=0), sigma, labels).reshape(q, c)


def gnmax_label_probabilities(counts: ArrayLike, sigma: float,
                              labels: ArrayLike) -> NDArray[np.float64]:
    """P(gnmax releases labels[q]) per query: the entries of `gnmax_probabilities` that an
    expected accuracy reads, each computed once per distinct (counts, label) pair by the same
    float operations (so equal to the full table's entries bit for bit).

    Args:
        counts: (Q, C) integer vote counts.
        sigma: the noise standard deviation.
        labels: (Q,) labels; one that is not a class (REFUSED, out of range) gets 0.

    Returns:
        (Q,) probabilities in [0, 1].
    """
    n = np.asarray(counts, dtype=np.int64)
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    q, c = n.shape
    if len(y) != q:
        raise ValueError(f"labels: one per query ({q}), got {len(y)}")
    valid = (y >= 0) & (y < c)
    out = np.zeros(q)
    if not valid.any():
        return out
    pairs, inverse = np.unique(np.column_stack([n[valid], y[valid]]), axis=0,
                               return_inverse=True)
    w = int(math.ceil(12 * float(sigma))) + 2
    p = dg_pmf(float(sigma), w)
    cdf = np.concatenate([[0.0], np.cumsum(p)])     # P(Z < k) at index k + w (k = -w..w+1)
    # k = n_y + z - n_j runs over a window of the tables shifted by n_y - n_j: pad them with
    # their clipped values (0 and P(Z < w + 1) below and above; 0 outside the pmf's support)
    # so that each window is a slice
    pad = int(np.abs(n[valid]).max(initial=0)) + 1
    cdf_pad = np.concatenate([np.full(pad, cdf[0]), cdf, np.full(pad, cdf[-1])])
    p_pad = np.concatenate([np.zeros(pad), p, np.zeros(pad)])
    nodes, weights = _gauss_legendre_unit(c)
    t = nodes[:, None]
    width = 2 * w + 1
    law = np.empty(len(pairs))
    for i, pair in enumerate(pairs.tolist()):
        row, label = pair[:c], pair[c]
        poly = np.ones((len(nodes), width)) if c == 1 else None
        for j in range(c):
            if j == label:
                continue
            lo = pad + row[label] - row[j]
            factor = cdf_pad[lo:lo + width] + t * p_pad[lo:lo + width]
            if poly is None:
                poly = factor
            else:
                poly *= factor
        law[i] = float(p @ (weights @ poly))
    out[valid] = law[inverse.reshape(-1)]
    return np.clip(out, 0.0, 1.0)


def answer_probabilities(counts: ArrayLike, threshold: float, sigma1: float
                         ) -> NDArray[np.float64]:
    """P(max_c n_c + Z >= T) per query, Z ~ N_Z(0, sigma_1^2)."""
    top = np.asarray(counts, dtype=np.int64).max(axis=1)
    return gaussian_tail(sigma1, float(threshold) - top)


def gnmax_draw(counts: NDArray[np.int64], sigma: float,
               rng: np.random.Generator) -> NDArray[np.int64]:
    """argmax_c (n_c + Z_c) per row, Z_c exact N_Z(0, sigma^2) draws, a tie won by a
    uniformly chosen maximiser."""
    s2 = _sigma_sq(sigma)
    out = np.empty(len(counts), dtype=np.int64)
    for q, row in enumerate(np.asarray(counts).tolist()):
        noisy = [int(v) + discrete_gaussian(s2, rng) for v in row]
        top = max(noisy)
        winners = [j for j, value in enumerate(noisy) if value == top]
        out[q] = winners[uniform_below(len(winners), rng)] if len(winners) > 1 else winners[0]
    return out


# ---------------------------------------------------------------------------------------------
# Mechanism objects

def _per_query(epsilon: float, delta: float, curve: Curve, name: str) -> float:
    """The per-query epsilon the curve converts to at delta; refuses one above epsilon."""
    eps, _ = curve_epsilon(curve, float(delta))
    eps = max(eps, MIN_EPSILON)       # a conversion to 0 is stated as the smallest epsilon
    if eps > float(epsilon):          # (a numpy float32 would compare in float32)
        raise PrivacyError(f"{name}: these noise levels give ({eps:.6g}, {delta!r})-DP per "
                           f"query, above the epsilon {epsilon!r} asked for: raise the sigmas, "
                           f"or epsilon, or leave the sigmas out to have them calibrated")
    return eps


@register("gnmax", inputs=Votes, needs_delta=True,
          summary="PATE 2018 GNMax: argmax of the vote counts + discrete Gaussian; "
                  "Renyi alpha/sigma^2 per query; any classes")
@dataclass(frozen=True)
class GaussianNoisyMax(Mechanism):
    """argmax_c (n_c + N_Z(0, sigma^2)), random tie-break (module docstring). `sigma` is
    calibrated to the per-query (epsilon, delta) when not given; when given, its per-query
    guarantee must not exceed (epsilon, delta)."""

    epsilon: float
    delta: float | None = None
    sigma: float | None = None

    input_type = Votes

    def __post_init__(self) -> None:
        problems = privacy_problems("gnmax")
        check_epsilon(self.epsilon, problems)
        check_delta(self.delta, problems)
        if self.sigma is not None:
            _check_sigma(self.sigma, "sigma", problems)
        problems.raise_if_any()
        object.__setattr__(self, "epsilon", float(self.epsilon))   # (a numpy float32 would
        object.__setattr__(self, "delta", float(self.delta))       # compare in float32)
        sigma = (calibrate_sigma(self.epsilon, self.delta) if self.sigma is None
                 else float(self.sigma))
        object.__setattr__(self, "sigma", sigma)
        object.__setattr__(self, "_epsilon_used",
                           _per_query(self.epsilon, self.delta, gnmax_curve(sigma), "gnmax"))

    @property
    def name(self) -> str:
        return "gnmax"

    def guarantee(self, relation: str) -> Guarantee:
        return Guarantee(self._epsilon_used, float(self.delta), relation, self.name,
                         f"GNMax: argmax of the vote counts + discrete Gaussian sigma "
                         f"{self.sigma!r}, ({self._epsilon_used!r}, {self.delta!r}) per query "
                         f"from its Renyi curve alpha/sigma^2 (L2 sensitivity sqrt 2)",
                         rdp=gnmax_curve(self.sigma))

    def _draw(self, inputs: Votes, rng):
        return gnmax_draw(counts_of(inputs.votes, inputs.n_classes), self.sigma, rng)

    def _correct(self, inputs: Votes, y):
        return gnmax_label_probabilities(counts_of(inputs.votes, inputs.n_classes),
                                         self.sigma, y)


@register("confident-gnmax", inputs=Votes, needs_delta=True,
          summary="PATE 2018 Confident-GNMax: answers (GNMax at sigma2) only where the noisy "
                  "top count clears T, else no answer; Renyi per query; any classes")
@dataclass(frozen=True)
class ConfidentGaussianNoisyMax(Mechanism):
    """If max_c n_c + N_Z(0, sigma_1^2) >= threshold, gnmax at sigma_2, else REFUSED (module
    docstring). Without sigmas they are calibrated to (epsilon, delta) per query with
    sigma_1 = 2 sigma_2 (a fixed, data-independent ratio); `threshold` defaults to half the
    number of teachers (a public quantity)."""

    epsilon: float
    delta: float | None = None
    threshold: float | None = None
    sigma1: float | None = None
    sigma2: float | None = None

    input_type = Votes

    def __post_init__(self) -> None:
        problems = privacy_problems("confident-gnmax")
        check_epsilon(self.epsilon, problems)
        check_delta(self.delta, problems)
        if (self.sigma1 is None) != (self.sigma2 is None):
            problems.add("give both sigma1 and sigma2, or neither (then they are calibrated "
                         "to epsilon with sigma1 = 2 sigma2)")
        for name in ("sigma1", "sigma2"):
            if getattr(self, name) is not None:
                _check_sigma(getattr(self, name), name, problems)
        if self.threshold is not None and (not is_real(self.threshold) or
                                           not math.isfinite(self.threshold)
                                           or self.threshold < 0):
            problems.add(f"threshold must be a finite number >= 0 (a vote count), got "
                         f"{self.threshold!r}")
        problems.raise_if_any()
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "delta", float(self.delta))
        if self.sigma1 is None:
            s2 = calibrate_sigma(self.epsilon, self.delta, confident=True)
            object.__setattr__(self, "sigma1", 2.0 * s2)
            object.__setattr__(self, "sigma2", s2)
        else:
            object.__setattr__(self, "sigma1", float(self.sigma1))
            object.__setattr__(self, "sigma2", float(self.sigma2))
        object.__setattr__(self, "_epsilon_used",
                           _per_query(self.epsilon, self.delta, self.curve, "confident-gnmax"))

    @property
    def name(self) -> str:
        return "confident-gnmax"

    @property
    def curve(self) -> Curve:
        """The data-independent per-query curve: the threshold test's plus gnmax's."""
        return _confident_curve(self.sigma1, self.sigma2)

    def threshold_for(self, inputs: Votes) -> float:
        """The threshold used on these inputs (half the teachers where none was given)."""
        return float(self.threshold) if self.threshold is not None else inputs.n_teachers / 2

    def check(self, inputs) -> None:
        super().check(inputs)
        if self.threshold is not None and self.threshold > inputs.n_teachers:
            raise DataError(f"confident-gnmax: threshold {self.threshold!r} is above the "
                            f"number of teachers ({inputs.n_teachers}); choose T in [0, "
                            f"{inputs.n_teachers}]")

    def guarantee(self, relation: str) -> Guarantee:
        return Guarantee(self._epsilon_used, float(self.delta), relation, self.name,
                         f"Confident-GNMax: threshold test (sigma1 {self.sigma1!r}, "
                         f"sensitivity 1) then GNMax (sigma2 {self.sigma2!r}, L2 sensitivity "
                         f"sqrt 2), both charged on every query: ({self._epsilon_used!r}, "
                         f"{self.delta!r}) per query from the summed Renyi curve",
                         rdp=self.curve)

    def _draw(self, inputs: Votes, rng):
        counts = counts_of(inputs.votes, inputs.n_classes)
        threshold = Fraction(self.threshold_for(inputs))
        s1 = _sigma_sq(self.sigma1)
        answered = np.array([int(row.max()) + discrete_gaussian(s1, rng) >= threshold
                             for row in counts], dtype=bool)
        out = np.full(len(counts), REFUSED, dtype=np.int64)
        if answered.any():
            out[answered] = gnmax_draw(counts[answered], self.sigma2, rng)
        return out

    def _correct(self, inputs: Votes, y):
        counts = counts_of(inputs.votes, inputs.n_classes)
        ans = answer_probabilities(counts, self.threshold_for(inputs), self.sigma1)
        return ans * gnmax_label_probabilities(counts, self.sigma2, y)
