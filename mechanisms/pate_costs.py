"""PATE's data-dependent privacy costs (owner-only), their smooth sensitivity, and the
sanitised release of the cost (Papernot et al. 2018, Sec. 4 and Appendices A-C; Papernot
et al. 2017, Thm 3), with AGT-certified teachers as the distance.

Everything here is a function of the private votes except `SanitisedCost.draw`'s output:
the data-dependent costs, the local and smooth sensitivities and the reports are owner-only,
and no release path (CLI, service, client) returns them. What may leave is the sanitised
estimate, drawn by `Ledger.release_estimate` after its own Renyi cost is charged.

Data-dependent Renyi bounds (per query)
---------------------------------------
* gnmax at sigma on counts n (Prop. 7 and Thm 6). With i* the top class and q the
  probability that the release is not i*, the union bound gives
  q <= q~(n) = sum_{j >= 2} P(Z_1 - Z_2 >= s_1 - s_j) (s the sorted counts; a tie counted as a
  loss), the tail of the discrete Gaussian difference (pate.py, upper bracket). GNMax is
  (mu, mu / sigma^2)-RDP at every mu; Thm 6 with mu_2 = sigma sqrt(ln(1/q)), mu_1 = mu_2 + 1,
  eps_i = mu_i / sigma^2 bounds the order-lambda divergence at D, for every neighbour, by
      (1 / (lambda - 1)) ln((1 - q) A^(lambda-1) + q B^(lambda-1)),
      A = (1 - q) / (1 - (q e^eps_2)^((mu_2 - 1) / mu_2)),   B = e^eps_1 / q^(1 / (mu_1 - 1)),
  when mu_2 > 1, lambda <= mu_1, q e^eps_2 < 1 and the higher-order condition
  q <= e^((mu_2 - 1) eps_2) / (mu_1 / (mu_1 - 1) * mu_2 / (mu_2 - 1))^mu_2 hold; otherwise the
  data-independent lambda / sigma^2 (`thm6_bound`). Thm 6 holds for any q~ >= q, so for q~
  the smallest bound over the grid points q_k >= q~ (a fine grid in ln q) is valid too, and
  that envelope (`gnmax_cost`) is non-decreasing in q~ by construction: the smooth-
  sensitivity analysis below needs a monotone cost.
* the threshold test of confident-gnmax: its output is one bit; with p = P(answer) =
  P(max n + Z >= T) its likely outcome is missed with probability q = min(p, 1 - p) (upper
  bracket), and it is (mu, mu / (2 sigma_1^2))-RDP: Thm 6 with sigma sqrt(2)
  (`threshold_cost`).
* lnmax (eps-DP) by PATE 2017's Thm 3 in Renyi form (order lambda = l + 1): for q >= P(release
  != i*) < (e^eps - 1) / (e^(2 eps) - 1),
      D_lambda <= ln((1 - q) ((1 - q) / (1 - e^eps q))^l + q e^(eps l)) / l,
  and at most the pure curve (q from the exact law of lnmax; the same envelope over q).
A run's data-dependent curve sums the per-query bounds over the queries; for confident-gnmax
the gnmax step counts on the answered queries only (the paper's accounting; which queries
were answered is itself released).

Smooth sensitivity of the cost at a fixed order lambda (Appendix B, in our own form)
-----------------------------------------------------------------------------------
F(D) = sum_j c_j(n_j(D)), c_j one of the costs above at order lambda. A record change at
distance d can reach the histograms of a set H_j(d); for every class i we use the exact
largest and smallest count over that set, U_i(d) and L_i(d):
* plain PATE (a record changes at most one teacher's vote): H(d) = histograms within d vote
  moves, U_i = min(T, n_i + d), L_i = max(0, n_i - d).
* with AGT radii r_t (teacher t's vote cannot change before r_t + 1 of its own records do):
  teachers with r_t <= 0 are free (any vote, k1 of them); changing a set S of the others
  costs at least sum_S r_t records; H(d) = {votes of the others outside S kept, |S| + k1 votes
  anywhere : sum_S r_t <= d}. Then U_i = n'_i + k1 + m_-i(d), L_i = n'_i - m_i(d), with n' the
  counts of the non-free teachers and m_i(d) (m_-i(d)) the most non-free teachers voting
  (not voting) i whose smallest radii sum to at most d. Both bounds are used together (the
  AGT set and the plain ball each contain the reachable histograms): U = min, L = max.
The sorted counts of any histogram of H(d) satisfy h_(1) >= max_i L_i and h_(j) <= U_(j)
(componentwise order survives sorting), so q~ lies in [Q_lo(d), Q_hi(d)] with
Q_hi = sum_{j>=2} T(max L - U_(j)) and Q_lo = sum_{j>=2} T(max U - L_(j)) (T the tail,
non-increasing in the gap); the top count, which decides the threshold step's p, lies in
[max L, max U]. One step from a histogram moves each sorted count by at most 1, so each
sorted gap by at most 2, and the q~ of a neighbour is within a factor rho of this one's, rho
the largest ratio T(g - 2) / T(g) (or T(g) / T(g + 2)) over the gaps that can occur; the cost
is non-decreasing in q~, so the step of cost from a histogram with q~ = q is at most
phi(q) = max(c(rho q) - c(q), c(q) - c(q / rho)) (on the envelope's grid, shifted by a whole
number of grid steps, `_step_table`). The threshold cost is a function of the top count
alone, and its largest one-step move is read off directly. So the local sensitivity at
every dataset within distance d is at most
    A(d) = sum_j max phi_j over [Q_lo,j(d), Q_hi,j(d)]
           (+ max psi_j over top counts in [max L_j(d), max U_j(d)])   (`local_sensitivities`)
and S(D) = max_d e^(-beta d) A(d) is a beta-smooth upper bound on the local sensitivity
(Nissim, Raskhodnikova & Smith 2007, Lemma 2.3): A(0) bounds LS(D), and A_D(d) <= A_E(d + 1)
for neighbours D, E because U, L are the exact extremes over sets with H_D(d) subset of
H_E(d + 1), so the ranges A maximises over only grow. That inclusion is clear for the
ball. For the AGT set it is checked case by case
for the one teacher t0 whose data differ (the others' votes and radii are equal; radii are
1-Lipschitz, r(E) >= r(D) - 1 both ways, so a radius crosses 0/1 only with the vote fixed):
t0 free at both: the same set; non-free at both: the same vote, each cost up by at most 1,
so a plan of cost d at D costs at most d + 1 at E; free at D, radius 1 at E: add t0 to the
plan at cost 1; radius 1 at D, free at E: drop t0 from the plan, its vote is free at E. The
plain ball moves by one vote and grows by one. Without AGT radii only the ball is used.
With radii one more fact enters: teacher t's vote at query j is the same at every dataset
within r_t,j(D) records of D (the certificate at D), so between a dataset within d records
and its neighbour (within d + 1) query j's histogram can move only if some r_t,j(D) <= d;
where none is, query j adds nothing to A(d). That gate nests too (r(E) <= r(D) + 1).

The sanitised release (Thm 23)
------------------------------
V = F(D) + S(D) Z, Z ~ N(0, sigma_s^2), is (lambda', gnss_curve(beta, sigma_s)(lambda'))-RDP
(rdp.py). beta, sigma_s and lambda are chosen without the private votes (`surrogate_plan`
picks them on a public surrogate histogram). The estimate of the run's eps is V plus the
release's own cost at lambda, converted at delta by the Canonne-Kamath-Steinke conversion
at that one order; it is an estimate (post-processing of a DP release), not a bound: the
always-valid guarantee is the data-independent one the ledger composes. The Gaussian draw is numpy's
float64 normal, rounded to 1e-6: a float sampler realises another law than the continuous
one (exact.py says why); only this estimate carries that, never a label.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import DataError, PrivacyError, Problems
from mechanisms.checks import check_delta, is_real, privacy_problems
from mechanisms.ensemble import NoisyArgmax, lnmax_probabilities
from mechanisms.inputs import Votes
from mechanisms.noise import REFUSED
from mechanisms.pate import (
    ConfidentGaussianNoisyMax,
    GaussianNoisyMax,
    difference_tail,
    gaussian_tail,
)
from mechanisms.rdp import ORDERS, Curve, compose_curves, gnss_curve, pad_up, pure_curve
from mechanisms.votes import counts_of

__all__ = ["thm6_bound", "lnmax_bound", "gnmax_q", "gnmax_cost", "threshold_cost",
           "lnmax_cost", "DataDependentReport", "data_dependent_report", "count_extremes",
           "local_sensitivities", "smooth_sensitivity", "SanitisationPlan", "SanitisedCost",
           "sanitised_epsilon", "surrogate_plan"]

_LOGQ_STEP = 0.005            # the envelope's grid in ln q
_LOGQ_MIN = -740.0            # below exp(-740) a float is 0
_Q_SLACK = 1e-9               # relative pad of float probabilities (they err ~1e-13)


# ---------------------------------------------------------------------------------------------
# The bounds as printed (module docstring)

def _log1mexp(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """ln(1 - e^x) for x < 0, accurate in relative terms on both sides of -ln 2 (log1p of
    -e^x where e^x is small, ln of -expm1(x) where it is near 1)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x < -math.log(2.0), np.log1p(-np.exp(x)), np.log(-np.expm1(x)))


def thm6_bound(logq: ArrayLike, sigma: float, order: float) -> NDArray[np.float64]:
    """PATE 2018 Thm 6 for gnmax at `sigma` (curve mu / sigma^2), at order `order`, for
    upper bounds q = exp(logq) on the probability of missing the likely outcome; the
    data-independent order / sigma^2 where a condition fails (module docstring).

    Args:
        logq: ln q, any shape, <= 0.
        sigma: the noise scale of a mechanism whose curve is mu / sigma^2.
        order: the Renyi order lambda > 1.
    Returns:
        The bound per q (same shape as logq).
    """
    logq = np.minimum(np.asarray(logq, dtype=np.float64), 0.0)
    var = float(sigma) ** 2
    lam = float(order)
    plain = np.full(logq.shape, lam / var)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mu2 = np.sqrt(var * -logq)
        mu1 = mu2 + 1.0
        eps1, eps2 = mu1 / var, mu2 / var
        ok = (mu2 > 1.0) & (lam <= mu1) & (logq + eps2 < 0.0)
        higher = (mu2 - 1.0) * eps2 - mu2 * (np.log(mu1 / (mu1 - 1.0))
                                            + np.log(mu2 / (mu2 - 1.0)))
        ok &= logq <= higher
        log1mq = _log1mexp(logq)
        inner = (logq + eps2) * (mu2 - 1.0) / mu2          # ln (q e^eps2)^((mu2-1)/mu2) < 0
        log_a = log1mq - _log1mexp(inner)
        log_b = eps1 - logq / (mu1 - 1.0)
        log_sum = np.logaddexp(log1mq + (lam - 1.0) * log_a, logq + (lam - 1.0) * log_b)
        dd = log_sum / (lam - 1.0)
    out = np.where(ok & np.isfinite(dd), np.minimum(plain, dd), plain)
    return np.maximum(out, 0.0)


def lnmax_bound(logq: ArrayLike, epsilon: float, order: float) -> NDArray[np.float64]:
    """PATE 2017 Thm 3 in Renyi form for an eps-DP noisy argmax at order lambda = l + 1
    (module docstring); the pure curve's value where its condition fails."""
    logq = np.minimum(np.asarray(logq, dtype=np.float64), 0.0)
    e, lam = float(epsilon), float(order)
    steps = lam - 1.0
    plain = np.full(logq.shape, min(e, lam * e * e / 2.0))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.exp(logq)
        ok = q < np.expm1(e) / np.expm1(2.0 * e)
        log1mq = np.log1p(-q)
        log_ratio = log1mq - np.log1p(-np.exp(e + logq))
        log_sum = np.logaddexp(log1mq + steps * log_ratio, logq + e * steps)
        dd = log_sum / steps
    out = np.where(ok & np.isfinite(dd), np.minimum(plain, dd), plain)
    return np.maximum(out, 0.0)


# ---------------------------------------------------------------------------------------------
# Monotone envelopes (module docstring): for each q, the smallest bound at grid points >= q

@lru_cache(maxsize=1)
def _logq_grid() -> NDArray[np.float64]:
    """The envelope's points in ln q: _LOGQ_MIN + i * _LOGQ_STEP for integer i, the last one
    0. Built from integer indices, so that point i is the one `_grid_index` means by i (an
    np.arange with a float step accumulates the step's rounding: its points drifted up to
    6.7e-10 below the intended ones)."""
    n = int(round(-_LOGQ_MIN / _LOGQ_STEP)) + 1
    grid = _LOGQ_MIN + np.arange(n, dtype=np.float64) * _LOGQ_STEP
    grid[-1] = 0.0
    grid.setflags(write=False)
    return grid


# 128 (~1.2 MB each): the PATE table's plan search cycles through ~240 (scale, order) pairs,
# which an LRU of 32 recomputed three times over
@lru_cache(maxsize=128)
def _envelope(kind: str, scale: float, order: float) -> tuple[NDArray[np.float64], float]:
    grid = _logq_grid()
    values = (thm6_bound(grid, scale, order) if kind == "gauss"
              else lnmax_bound(grid, scale, order))
    suffix_min = np.minimum.accumulate(values[::-1])[::-1]
    suffix_min.setflags(write=False)
    return suffix_min, float(values[-1])


def _grid_index(q: ArrayLike) -> NDArray[np.int64]:
    """The first grid index with grid >= ln q (q = 0 maps to the grid's start: ln q < -740).
    The division's rounding can land one index low; the comparison with the point itself
    moves such an index up, so that the point read is never below ln q."""
    with np.errstate(divide="ignore"):
        logq = np.log(np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0))
    grid = _logq_grid()
    n = len(grid)
    idx = np.ceil((np.maximum(logq, _LOGQ_MIN) - _LOGQ_MIN) / _LOGQ_STEP).astype(np.int64)
    idx = np.clip(idx, 0, n - 1)
    return np.minimum(idx + (grid[idx] < logq), n - 1)


def _monotone_cost(kind: str, scale: float, order: float, q: ArrayLike) -> NDArray[np.float64]:
    env, _ = _envelope(kind, float(scale), float(order))
    return env[_grid_index(q)]


def _pad_q(q: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.minimum(1.0, np.asarray(q) * (1 + _Q_SLACK) + 1e-300)


def gnmax_q(counts: ArrayLike, sigma: float, *, bound: str = "upper") -> NDArray[np.float64]:
    """q~(n) = min(1, sum_{j>=2} P(Z_1 - Z_2 >= s_1 - s_j)) per query (Prop. 7; "upper" or
    "lower" bracket of the float sum)."""
    s = -np.sort(-np.asarray(counts, dtype=np.int64), axis=1)
    gaps = s[:, :1] - s[:, 1:]
    return np.minimum(1.0, difference_tail(sigma, gaps, bound=bound).sum(axis=1))


def gnmax_cost(q: ArrayLike, sigma: float, order: float) -> NDArray[np.float64]:
    """gnmax's data-dependent Renyi bound at `order` for q~ = q: the monotone envelope of
    Thm 6 (module docstring)."""
    return _monotone_cost("gauss", sigma, order, q)


def threshold_cost(q: ArrayLike, sigma1: float, order: float) -> NDArray[np.float64]:
    """The threshold step's data-dependent bound for q = min(p, 1 - p): Thm 6 at
    sigma_1 sqrt(2)."""
    return _monotone_cost("gauss", float(sigma1) * math.sqrt(2.0), order, q)


def lnmax_cost(q: ArrayLike, epsilon: float, order: float) -> NDArray[np.float64]:
    """lnmax's data-dependent bound (PATE 2017 Thm 3, monotone envelope)."""
    return _monotone_cost("lap", epsilon, order, q)


def _threshold_q(top: NDArray[np.int64], threshold: float, sigma1: float) -> NDArray[np.float64]:
    p = gaussian_tail(sigma1, float(threshold) - np.asarray(top, dtype=np.float64))
    return _pad_q(np.minimum(p, 1.0 - p))


# ---------------------------------------------------------------------------------------------
# A run's data-dependent cost (owner-only)

@dataclass(frozen=True)
class DataDependentReport:
    """A run's Renyi costs on `ORDERS` (owner-only: a function of the private votes).

    `independent` is what the ledger charges (valid whatever the votes); `dependent` the
    data-dependent bound at these votes; eps_* their conversions at `delta`."""

    mechanism: str
    n_queries: int
    n_answered: int
    independent: Curve
    dependent: Curve
    delta: float
    eps_independent: float
    eps_dependent: float


def _check_run(mechanism, inputs: Votes, labels) -> NDArray[np.int64]:
    problems = Problems("data-dependent cost", DataError)
    if not isinstance(inputs, Votes):
        raise DataError(f"the data-dependent cost is of a teacher ensemble's Votes, got "
                        f"{type(inputs).__name__}")
    if not isinstance(mechanism, (GaussianNoisyMax, ConfidentGaussianNoisyMax, NoisyArgmax)):
        raise PrivacyError(f"a data-dependent analysis exists for gnmax, confident-gnmax and "
                           f"lnmax, not {getattr(mechanism, 'name', mechanism)!r}")
    y = np.asarray(labels)
    problems.check(y.shape == (inputs.n_queries,),
                   f"labels must have shape ({inputs.n_queries},), got {y.shape}")
    problems.raise_if_any()
    return y.astype(np.int64)


def _per_query_dependent(mechanism, counts: NDArray[np.int64], answered: NDArray[np.bool_],
                         threshold: float | None, order: float) -> NDArray[np.float64]:
    if isinstance(mechanism, GaussianNoisyMax):
        return gnmax_cost(gnmax_q(counts, mechanism.sigma), mechanism.sigma, order)
    if isinstance(mechanism, NoisyArgmax):
        p = lnmax_probabilities(counts, mechanism.epsilon)
        q = _pad_q(np.clip(1.0 - p.max(axis=1), 0.0, 1.0))
        return lnmax_cost(q, mechanism.epsilon, order)
    top = counts.max(axis=1)
    cost = threshold_cost(_threshold_q(top, threshold, mechanism.sigma1), mechanism.sigma1,
                          order)
    step = gnmax_cost(gnmax_q(counts, mechanism.sigma2), mechanism.sigma2, order)
    return cost + np.where(answered, step, 0.0)


def data_dependent_report(mechanism, inputs: Votes, labels: ArrayLike,
                          delta: float) -> DataDependentReport:
    """The data-dependent Renyi cost of a run that released `labels` (REFUSED where not
    answered) with `mechanism` on `inputs`, beside its data-independent charge.
    Owner-only: it is a function of the private votes.

    Args:
        mechanism: a gnmax, confident-gnmax or lnmax mechanism object.
        inputs: the Votes it released.
        labels: what it released (one per query).
        delta: the delta the curves are converted at.
    """
    from mechanisms.rdp import curve_epsilon

    y = _check_run(mechanism, inputs, labels)
    problems = privacy_problems("data-dependent cost")
    check_delta(delta, problems)
    problems.raise_if_any()
    counts = counts_of(inputs.votes, inputs.n_classes)
    answered = y != REFUSED
    threshold = (mechanism.threshold_for(inputs)
                 if isinstance(mechanism, ConfidentGaussianNoisyMax) else None)
    dependent = compose_curves([(tuple(
        pad_up(float(_per_query_dependent(mechanism, counts, answered, threshold, a).sum()))
        for a in ORDERS), 1)])
    per_query = mechanism.guarantee(inputs.source.relations[0])
    own = per_query.rdp if per_query.rdp is not None else pure_curve(per_query.epsilon)
    independent = compose_curves([(own, inputs.n_queries)])
    dependent = tuple(min(d, i) for d, i in zip(dependent, independent))
    return DataDependentReport(mechanism.name, inputs.n_queries, int(answered.sum()),
                               independent, dependent, float(delta),
                               curve_epsilon(independent, delta)[0],
                               curve_epsilon(dependent, delta)[0])


# ---------------------------------------------------------------------------------------------
# Local and smooth sensitivity (module docstring)

def _cheapest_counts(radii_sorted: list[int], d: NDArray[np.int64]) -> NDArray[np.int64]:
    """For each d: the most of these (sorted, >= 1) costs whose sum is <= d."""
    if not radii_sorted:
        return np.zeros_like(d)
    cum = np.cumsum(np.asarray(radii_sorted, dtype=np.int64))
    return np.searchsorted(cum, d, side="right").astype(np.int64)


def count_extremes(votes_row: ArrayLike, radii_row: ArrayLike | None, n_classes: int,
                   distances: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(U, L), each (len(distances), C): the largest and smallest count of every class over
    the histograms a change of d records can reach (plain ball, intersected with the AGT set
    when radii are given; module docstring).

    Args:
        votes_row: the T teachers' votes at one query.
        radii_row: their stability radii (None: plain PATE).
        n_classes: C.
        distances: record distances d >= 0.
    """
    v = np.asarray(votes_row, dtype=np.int64)
    d = np.asarray(distances, dtype=np.int64)
    t = len(v)
    n = np.bincount(v, minlength=n_classes)
    upper = np.minimum(t, n[None, :] + d[:, None])
    lower = np.maximum(0, n[None, :] - d[:, None])
    if radii_row is None:
        return upper, lower
    r = np.asarray(radii_row, dtype=np.int64)
    free = r <= 0
    k1 = int(free.sum())
    kept_votes, kept_r = v[~free], r[~free]
    n_kept = np.bincount(kept_votes, minlength=n_classes)
    for i in range(n_classes):
        voting = np.sort(kept_r[kept_votes == i]).tolist()
        others = np.sort(kept_r[kept_votes != i]).tolist()
        up_i = n_kept[i] + k1 + _cheapest_counts(others, d)
        low_i = n_kept[i] - _cheapest_counts(voting, d)
        upper[:, i] = np.minimum(upper[:, i], up_i)
        lower[:, i] = np.maximum(lower[:, i], low_i)
    return upper, lower


def _q_range(upper: NDArray[np.int64], lower: NDArray[np.int64], sigma: float
             ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """[Q_lo, Q_hi] of q~ over histograms with counts in [L, U] (rows: distances)."""
    u_sorted = -np.sort(-upper, axis=1)
    l_sorted = -np.sort(-lower, axis=1)
    top_low = lower.max(axis=1, keepdims=True)
    top_high = upper.max(axis=1, keepdims=True)
    q_hi = difference_tail(sigma, top_low - u_sorted[:, 1:], bound="upper").sum(axis=1)
    q_lo = difference_tail(sigma, top_high - l_sorted[:, 1:], bound="upper").sum(axis=1)
    return np.minimum(q_lo, 1.0), np.minimum(q_hi, 1.0)


@lru_cache(maxsize=32)
def _step_table(sigma: float, order: float, n_teachers: int) -> list[NDArray[np.float64]]:
    """A sparse table (range maxima) of phi_k = the most the gnmax cost can move in one step
    from a q~ of grid index k: a neighbour's gaps are within 2 of these (sorted counts move
    by at most 1), so its q~ is within a factor rho of this one, rho the largest ratio
    T(g - 2) / T(g) (or T(g) / T(g + 2)) over the gaps |g| <= T + 2, and the cost is
    non-decreasing in q~."""
    g = np.arange(-n_teachers - 2, n_teachers + 3)
    tail = difference_tail(sigma, np.concatenate([g - 2, g, g + 2]), bound="upper")
    below, here, above = np.split(tail, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = max(float(np.max(below / here)), float(np.max(here / above)), 1.0)
    shift = int(math.ceil(math.log(rho) / _LOGQ_STEP)) + 1
    env, _ = _envelope("gauss", float(sigma), float(order))
    n = len(env)
    up = env[np.minimum(np.arange(n) + shift, n - 1)] - env
    down = env - env[np.maximum(np.arange(n) - shift, 0)]
    return _sparse_table(np.maximum(up, down))


def _sparse_table(values: NDArray[np.float64]) -> list[NDArray[np.float64]]:
    """Level i holds the maxima of values over windows of 2^i (for `_range_max`)."""
    levels = [np.asarray(values, dtype=np.float64)]
    while 2 ** len(levels) <= len(values):
        prev, half = levels[-1], 2 ** (len(levels) - 1)
        levels.append(np.maximum(prev[:-half], prev[half:]))
    return levels


def _range_max(levels: list[NDArray[np.float64]], a: NDArray[np.int64],
               b: NDArray[np.int64]) -> NDArray[np.float64]:
    """max of levels[0][a..b] (inclusive), elementwise over index arrays a <= b."""
    length = b - a + 1
    k = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    out = np.empty(len(a))
    for level in np.unique(k):
        sel = k == level
        table = levels[int(level)]
        out[sel] = np.maximum(table[a[sel]], table[b[sel] - 2 ** int(level) + 1])
    return out


def _threshold_steps(threshold: float, sigma1: float, order: float, n_teachers: int
                     ) -> NDArray[np.float64]:
    """psi(c) for top counts c = 0..T: the most the threshold cost moves when the top count
    moves by one from c (the cost is a function of the top count alone)."""
    c = np.arange(0, n_teachers + 1)
    cost = threshold_cost(_threshold_q(c, threshold, sigma1), sigma1, order)
    step = np.abs(np.diff(cost))
    return np.maximum(np.concatenate([[0.0], step]), np.concatenate([step, [0.0]]))


def local_sensitivities(mechanism, inputs: Votes, labels: ArrayLike, order: float,
                        distances: ArrayLike, *, use_radii: bool = False
                        ) -> NDArray[np.float64]:
    """A(d): a bound on the local sensitivity of the run's data-dependent cost at `order`
    at every dataset within d records, for each d of `distances` (module docstring).
    Owner-only.

    Args:
        mechanism: gnmax or confident-gnmax.
        inputs: the Votes it released (with radii when use_radii).
        labels: what it released.
        order: the Renyi order lambda.
        distances: record distances d >= 0.
        use_radii: intersect with the AGT set (needs radii with the smoothness proof).
    """
    y = _check_run(mechanism, inputs, labels)
    if isinstance(mechanism, NoisyArgmax):
        raise PrivacyError("the smooth-sensitivity release is offered for gnmax and "
                           "confident-gnmax (lnmax's PATE 2017 bound is reported, not "
                           "sanitised)")
    radii = None
    if use_radii:
        if inputs.radii is None or not inputs.source.smooth_radii:
            raise PrivacyError("AGT radii inside PATE need teacher radii with r(D') >= "
                               "r(D) - 1 on neighbours (selection: exact); these inputs have "
                               "none, or radii without that proof")
        radii = inputs.radii
    d = np.asarray(distances, dtype=np.int64)
    confident = isinstance(mechanism, ConfidentGaussianNoisyMax)
    sigma = mechanism.sigma2 if confident else mechanism.sigma
    t = inputs.n_teachers
    levels = _step_table(float(sigma), float(order), t)
    if confident:
        steps_levels = _sparse_table(_threshold_steps(mechanism.threshold_for(inputs),
                                                      mechanism.sigma1, order, t))
    total = np.zeros(len(d))
    for j in range(inputs.n_queries):
        upper, lower = count_extremes(inputs.votes[j], None if radii is None else radii[j],
                                      inputs.n_classes, d)
        # with radii: no vote at query j moves between a dataset within d records and its
        # neighbour unless some teacher's radius at D is <= d (module docstring)
        movable = np.ones(len(d)) if radii is None else (radii[j].min() <= d).astype(float)
        if not confident or y[j] != REFUSED:
            q_lo, q_hi = _q_range(upper, lower, sigma)
            total += movable * _range_max(levels, _grid_index(q_lo), _grid_index(q_hi))
        if confident:
            total += movable * _range_max(steps_levels, lower.max(axis=1), upper.max(axis=1))
    return total


def smooth_sensitivity(mechanism, inputs: Votes, labels: ArrayLike, order: float,
                       beta: float, *, use_radii: bool = False, chunk: int = 64) -> float:
    """S(D) = max_d e^(-beta d) A(d), a beta-smooth upper bound on the local sensitivity of
    the run's data-dependent cost at `order` (module docstring). Owner-only. The search
    stops once e^(-beta d) times the largest possible A is below the maximum found."""
    if not (is_real(beta) and math.isfinite(beta) and beta > 0):
        raise PrivacyError(f"beta must be a finite number > 0, got {beta!r}")
    # computed at a beta a hair smaller: a (1 - 1e-9) beta-smooth bound is beta-smooth, and
    # the slack e^(1e-9 beta) covers the float rounding of the products below (a review
    # found a ratio one ulp above e^beta without it)
    beta = float(beta) * (1.0 - 1e-9)
    confident = isinstance(mechanism, ConfidentGaussianNoisyMax)
    sigma = mechanism.sigma2 if confident else mechanism.sigma
    ceiling = inputs.n_queries * (order / sigma ** 2
                                  + (order / (2 * mechanism.sigma1 ** 2) if confident else 0))
    best, start = 0.0, 0
    while True:
        ds = np.arange(start, start + chunk)
        a = local_sensitivities(mechanism, inputs, labels, order, ds, use_radii=use_radii)
        best = max(best, float(np.max(np.exp(-beta * ds) * a)))
        start += chunk
        if best > 0 and math.exp(-beta * start) * ceiling <= best:
            return pad_up(best)
        if best == 0 and math.exp(-beta * start) * ceiling < 1e-300:
            return 0.0


# ---------------------------------------------------------------------------------------------
# The sanitised release (module docstring)

@dataclass(frozen=True)
class SanitisationPlan:
    """Public parameters of the sanitised release, fixed before looking at the votes:
    the Renyi order `order` (one of ORDERS), the smoothness `beta` and the noise `sigma`
    (in units of the smooth sensitivity)."""

    order: float
    beta: float
    sigma: float

    def __post_init__(self) -> None:
        problems = privacy_problems("sanitisation plan")
        problems.check(self.order in ORDERS, f"order must be one of mechanisms.rdp.ORDERS, "
                                             f"got {self.order!r}")
        problems.check(is_real(self.beta) and math.isfinite(self.beta) and self.beta > 0,
                       f"beta must be a finite number > 0, got {self.beta!r}")
        problems.check(is_real(self.sigma) and math.isfinite(self.sigma) and self.sigma > 0,
                       f"sigma must be a finite number > 0, got {self.sigma!r}")
        problems.raise_if_any()
        if not all(math.isfinite(v) for v, a in zip(self.curve, ORDERS) if a <= self.order):
            raise PrivacyError(f"beta {self.beta!r} leaves the release's Renyi cost infinite "
                               f"at order {self.order!r} (Thm 23 needs 2 order beta < 1): "
                               f"lower beta")

    @property
    def curve(self) -> Curve:
        """The release's own Renyi curve (Thm 23)."""
        return gnss_curve(self.beta, self.sigma)

    @staticmethod
    def default(order: float) -> "SanitisationPlan":
        """beta = 0.4 / order (below Thm 23's 1 / (2 order)) and sigma = 2 order, so that the
        release's own cost at the order, about e^0.8 / (4 order) + (0.4 + ln(5) / 2) /
        (order - 1), stays small beside a run's; from the order only: no private quantity
        enters."""
        return SanitisationPlan(order=float(order), beta=0.4 / float(order),
                                sigma=2.0 * float(order))


@dataclass(frozen=True)
class SanitisedCost:
    """One sanitised release of a run's data-dependent cost at plan.order, prepared by the
    owner (`prepare`: build it no other way, the ledger cannot check a value or a
    sensitivity given by hand) and drawn only by `Ledger.release_estimate`, which charges
    plan.curve first. `value` and `sensitivity` are owner-only."""

    plan: SanitisationPlan
    value: float = field(repr=False)
    sensitivity: float = field(repr=False)
    source_id: str = ""
    dataset_sha256: str = field(default="", repr=False)
    use_radii: bool = False
    name: str = "pate-sanitised-cost"

    def __post_init__(self) -> None:
        problems = privacy_problems("sanitised cost")
        problems.check(type(self.plan) is SanitisationPlan,
                       "plan must be a mechanisms.pate_costs.SanitisationPlan")
        problems.check(is_real(self.value) and math.isfinite(self.value) and self.value >= 0,
                       "the data-dependent cost must be a finite number >= 0 (build the "
                       "estimate with SanitisedCost.prepare)")
        problems.check(is_real(self.sensitivity) and math.isfinite(self.sensitivity)
                       and self.sensitivity >= 0,
                       "the smooth sensitivity must be a finite number >= 0 (build the "
                       "estimate with SanitisedCost.prepare)")
        problems.check(isinstance(self.source_id, str), "source_id must be a string")
        sha = self.dataset_sha256
        problems.check(isinstance(sha, str) and len(sha) == 64,
                       "dataset_sha256 must be the 64-digit hash of the private dataset")
        problems.raise_if_any()

    @staticmethod
    def prepare(mechanism, inputs: Votes, labels: ArrayLike, plan: SanitisationPlan, *,
                use_radii: bool = False) -> "SanitisedCost":
        """Compute (owner-only) the run's data-dependent cost at plan.order and its smooth
        sensitivity (plain, or with the AGT distance)."""
        y = _check_run(mechanism, inputs, labels)
        counts = counts_of(inputs.votes, inputs.n_classes)
        threshold = (mechanism.threshold_for(inputs)
                     if isinstance(mechanism, ConfidentGaussianNoisyMax) else None)
        value = float(_per_query_dependent(mechanism, counts, y != REFUSED, threshold,
                                           plan.order).sum())
        s = smooth_sensitivity(mechanism, inputs, y, plan.order, plan.beta,
                               use_radii=use_radii)
        return SanitisedCost(plan, value, s, inputs.source.source_id,
                             inputs.source.dataset_sha256, use_radii)

    def draw(self, rng: np.random.Generator) -> float:
        """V = value + sensitivity * N(0, sigma^2), rounded to 1e-6 (module docstring)."""
        noise = float(rng.normal(0.0, self.plan.sigma))
        return round(self.value + self.sensitivity * noise, 6)


def _surrogate_votes(n_teachers: int, n_classes: int, consensus: float) -> NDArray[np.int64]:
    """One surrogate query's votes: round(consensus T) for class 0, the rest evenly over the
    other classes."""
    top = int(round(consensus * n_teachers))
    rest = np.full(n_classes - 1, (n_teachers - top) // (n_classes - 1))
    rest[: (n_teachers - top) % (n_classes - 1)] += 1
    counts = np.concatenate([[top], rest]).astype(np.int64)
    return np.repeat(np.arange(n_classes), counts)[None, :]


def surrogate_plan(mechanism, n_queries: int, n_teachers: int, n_classes: int, delta: float,
                   *, consensus: float = 0.9) -> SanitisationPlan:
    """A `SanitisationPlan` chosen on a public surrogate: Q identical histograms that give
    round(consensus T) votes to one class and the rest evenly to the others, every query
    answered. For each order lambda >= 2 of ORDERS (beta = 0.4 / lambda), the surrogate's
    data-dependent cost R(lambda), smooth sensitivity S(lambda) (Q times one query's: A(d) is
    a sum over queries) and the sigma minimising the release's own cost lambda e^(2 beta) /
    sigma^2 plus the noise's scale sigma S give the surrogate's eps estimate R + own +
    sigma S + conversion; the plan is the order with the smallest. Only public quantities
    enter: the mechanism's parameters, Q, T, C and the a-priori consensus level.

    Args:
        mechanism: gnmax or confident-gnmax.
        n_queries: Q.
        n_teachers: T.
        n_classes: C >= 2.
        delta: the delta of the conversion.
        consensus: the surrogate's share of votes for its top class, in (1/C, 1].
    """
    from mechanisms.inputs import Source

    problems = privacy_problems("surrogate plan")
    check_delta(delta, problems)
    problems.check(isinstance(n_classes, (int, np.integer)) and n_classes >= 2,
                   f"n_classes must be an integer >= 2, got {n_classes!r}")
    problems.check(isinstance(n_teachers, (int, np.integer)) and n_teachers >= 1,
                   f"n_teachers must be an integer >= 1, got {n_teachers!r}")
    problems.check(is_real(consensus) and 1.0 / max(int(n_classes), 2) < consensus <= 1.0,
                   f"consensus must be in (1/C, 1], got {consensus!r}")
    problems.raise_if_any()
    votes = _surrogate_votes(int(n_teachers), int(n_classes), float(consensus))
    surrogate = Votes(votes, None, int(n_classes), Source("surrogate", "0" * 64,
                                                         ("replace-one",), True))
    labels = np.zeros(1, dtype=np.int64)
    counts = counts_of(surrogate.votes, surrogate.n_classes)
    threshold = (mechanism.threshold_for(surrogate)
                 if isinstance(mechanism, ConfidentGaussianNoisyMax) else None)
    best, best_eps = None, math.inf
    for a in ORDERS:
        if a < 2.0 or a > 64.0:
            continue
        beta = 0.4 / a
        cost = n_queries * float(_per_query_dependent(mechanism, counts, np.ones(1, bool),
                                                      threshold, a)[0])
        s = n_queries * smooth_sensitivity(mechanism, surrogate, labels, a, beta)
        scale = math.exp(2 * beta)
        sigma = (2 * a * scale / s) ** (1 / 3) if s > 0 else 1e6
        sigma = min(max(sigma, 1e-3), 1e6)
        plan = SanitisationPlan(a, beta, sigma)
        own = plan.curve[ORDERS.index(a)]
        eps = cost + own + sigma * s + math.log((a - 1) / a) \
            - (math.log(delta) + math.log(a)) / (a - 1)
        if eps < best_eps:
            best, best_eps = plan, eps
    return best


def sanitised_epsilon(estimate: float, plan: SanitisationPlan, delta: float) -> float:
    """The estimate's eps at delta: (V + the release's own cost) at plan.order, converted by
    eps = R + ln((lambda - 1) / lambda) - (ln delta + ln lambda) / (lambda - 1)."""
    problems = privacy_problems("sanitised epsilon")
    check_delta(delta, problems)
    problems.raise_if_any()
    lam = plan.order
    own = plan.curve[ORDERS.index(lam)]
    r = max(0.0, float(estimate)) + own
    eps = r + math.log((lam - 1) / lam) - (math.log(delta) + math.log(lam)) / (lam - 1)
    return pad_up(max(0.0, eps))
