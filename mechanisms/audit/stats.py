"""The audit's statistics: Clopper-Pearson bounds, distinguishing events, the eps lower bound.

The test. A mechanism M is (eps, delta)-DP for neighbours D, D' when, for every event S of
its outputs, P[M(D) in S] <= e^eps P[M(D') in S] + delta (and with D, D' swapped). Fix an
event S *before* looking at the evaluation samples, and let p = P[M(D) in S], q = P[M(D')
in S]. From m independent releases on each side, k_p and k_q of which fall in S, the
one-sided Clopper-Pearson bounds at level alpha / 2 each,
    p_lo = Beta^-1(alpha/2; k_p, m - k_p + 1),   q_hi = Beta^-1(1 - alpha/2; k_q + 1, m - k_q),
hold together (p >= p_lo and q <= q_hi) with probability at least 1 - alpha (union bound;
Clopper & Pearson 1934). On that event every eps the mechanism satisfies at this delta obeys
    eps >= ln((p - delta) / q) >= ln((p_lo - delta) / q_hi) =: eps_lo,
so eps_lo is a lower bound, at confidence 1 - alpha, on the smallest eps the mechanism can
truly have at that delta. An audit reports "claim violated" only when eps_lo exceeds the
claimed eps; for a mechanism that keeps its claim that happens with probability at most
alpha = 1 - confidence (the false-alarm rate). Where p_lo <= delta the event shows nothing
and eps_lo is 0.

The event is chosen on a separate half of the samples (`select_event`): among the sets of
outcomes whose empirical likelihood ratio is above a cut (the Neyman-Pearson sets, which
contain the maximiser of (p - delta) / q, see `exact_loss`), both directions, the one with
the largest bound on the selection half. The evaluation half never influences the choice, so
the bound above applies to it as to a fixed event.

Where the mechanism states its exact output laws, the event can instead be fixed from those
laws before any release is drawn (`law_event`): then every sample evaluates it (m = n, not
n / 2). That choice sees no sample, so the bound holds as for any fixed event whatever the
laws are; stated laws that are wrong (a bug) only cost power, never confidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["clopper_pearson_lower", "clopper_pearson_upper", "epsilon_lower_bound", "Event",
           "select_event", "law_event", "exact_loss"]


def clopper_pearson_lower(k: ArrayLike, n: int, alpha: float) -> NDArray[np.float64]:
    """One-sided lower Clopper-Pearson bound on a binomial proportion.

    Args:
        k: successes (array of integers in [0, n]).
        n: trials.
        alpha: the bound fails with probability at most alpha.

    Returns:
        Beta^-1(alpha; k, n - k + 1), 0 where k = 0.
    """
    from scipy.stats import beta

    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out = beta.ppf(alpha, np.maximum(k, 1.0), n - k + 1.0)
    return np.where(k > 0, out, 0.0)


def clopper_pearson_upper(k: ArrayLike, n: int, alpha: float) -> NDArray[np.float64]:
    """One-sided upper Clopper-Pearson bound, Beta^-1(1 - alpha; k + 1, n - k) (1 where
    k = n): by the Beta law's symmetry, 1 - the lower bound on the failures n - k.

    Args:
        k: successes (array of integers in [0, n]).
        n: trials.
        alpha: the bound fails with probability at most alpha.
    """
    return 1.0 - clopper_pearson_lower(n - np.asarray(k, dtype=np.float64), n, alpha)


def epsilon_lower_bound(k_p: ArrayLike, k_q: ArrayLike, n: int, delta: float,
                        alpha: float) -> NDArray[np.float64]:
    """eps_lo = ln((p_lo - delta) / q_hi), 0 where p_lo <= delta (module docstring).

    Args:
        k_p: releases of the first side in the event.
        k_q: releases of the second side in the event.
        n: releases per side.
        delta: the claim's delta.
        alpha: 1 - confidence, split evenly between the two bounds.

    Returns:
        The lower bound on eps (>= 0), at confidence 1 - alpha when the event is fixed.
    """
    p_lo = clopper_pearson_lower(k_p, n, alpha / 2.0)
    q_hi = clopper_pearson_upper(k_q, n, alpha / 2.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.log((p_lo - delta) / q_hi)
    return np.where(p_lo > delta, np.maximum(value, 0.0), 0.0)


@dataclass(frozen=True)
class Event:
    """A set of outcomes (indices into the audit's outcome list) and its direction: `first`
    is True when the event is likelier under the first input (p is the first side's)."""

    outcomes: tuple[int, ...]
    first: bool


def _prefix_events(n_a: NDArray[np.float64], n_b: NDArray[np.float64]) -> list[Event]:
    """The Neyman-Pearson sets of counts n_a against n_b: outcomes sorted by (n_a + 1/2) /
    (n_b + 1/2), every proper prefix (the smoothing ranks outcomes unseen on one side)."""
    ratio = (n_a + 0.5) / (n_b + 0.5)
    order = np.argsort(-ratio, kind="stable")
    return [Event(tuple(int(i) for i in order[:j]), True) for j in range(1, len(order))] \
        or [Event((0,), True)]


def _counts_in(events: list[Event], counts_a: NDArray, counts_b: NDArray
               ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(k_p, k_q) of each event: p the side the event favours."""
    k_p, k_q = [], []
    for e in events:
        a, b = int(counts_a[list(e.outcomes)].sum()), int(counts_b[list(e.outcomes)].sum())
        k_p.append(a if e.first else b)
        k_q.append(b if e.first else a)
    return np.asarray(k_p), np.asarray(k_q)


def select_event(counts_a: NDArray[np.int64], counts_b: NDArray[np.int64], n: int,
                 delta: float, alpha: float) -> Event:
    """The event with the largest `epsilon_lower_bound` on these (selection-half) counts,
    among the Neyman-Pearson sets in both directions.

    Args:
        counts_a: per-outcome counts of the first side's selection releases.
        counts_b: the same for the second side.
        n: releases per side in this half.
        delta: the claim's delta.
        alpha: 1 - confidence.

    Returns:
        The chosen event (ties: the first found, favouring the first side).
    """
    a, b = np.asarray(counts_a, np.float64), np.asarray(counts_b, np.float64)
    events = _prefix_events(a, b) + [Event(e.outcomes, False) for e in _prefix_events(b, a)]
    k_p, k_q = _counts_in(events, counts_a, counts_b)
    score = epsilon_lower_bound(k_p, k_q, n, delta, alpha)
    # among equal bounds prefer the event with the largest p - e^bound q margin on this half
    margin = (k_p - np.exp(score) * k_q) / n
    best = max(range(len(events)), key=lambda i: (float(score[i]), float(margin[i])))
    return events[best]


def law_event(p: ArrayLike, q: ArrayLike, m: int, delta: float,
              alpha: float) -> Event:
    """The event an audit of m releases per side should evaluate, chosen from the exact laws
    p, q alone (no sample): among the likelihood-ratio sets of both directions, the one whose
    `epsilon_lower_bound` at the expected counts (m P(S), m Q(S)) is largest.

    Args:
        p: the first input's output law (a probability vector).
        q: the second input's, over the same outcomes.
        m: the releases per side that will evaluate the event.
        delta: the claim's delta.
        alpha: 1 - confidence.

    Returns:
        The event (indices into p's outcomes).
    """
    a, b = np.asarray(p, np.float64), np.asarray(q, np.float64)
    events = []
    for first, (x, y) in ((True, (a, b)), (False, (b, a))):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(y > 0, x / np.where(y > 0, y, 1.0), np.where(x > 0, np.inf, 0.0))
        order = np.argsort(-ratio, kind="stable")
        events += [Event(tuple(int(i) for i in order[:j]), first)
                   for j in range(1, max(2, len(order)))]
    in_p = np.array([(a if e.first else b)[list(e.outcomes)].sum() for e in events])
    in_q = np.array([(b if e.first else a)[list(e.outcomes)].sum() for e in events])
    score = epsilon_lower_bound(np.minimum(in_p, 1.0) * m, np.minimum(in_q, 1.0) * m, m,
                                delta, alpha)
    return events[int(np.argmax(score))]


def exact_loss(p: ArrayLike, q: ArrayLike, delta: float) -> float:
    """The largest ln((P(S) - delta) / Q(S)) over events S, both directions, for two exact
    output laws p, q (probability vectors over the same outcomes): the smallest eps at
    which this pair of inputs keeps (eps, delta). The maximiser is a likelihood-ratio set:
    at the optimum value v, S maximises sum_S (P - v Q) - delta, i.e. S = {P > v Q}.

    Args:
        p: the first input's output law.
        q: the second input's output law.
        delta: the claim's delta.

    Returns:
        The loss (0 where no event beats delta; inf where an event of probability 0 under
        one side has probability above delta under the other).
    """
    best = 0.0
    for x, y in ((np.asarray(p, np.float64), np.asarray(q, np.float64)),
                 (np.asarray(q, np.float64), np.asarray(p, np.float64))):
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(y > 0, x / np.where(y > 0, y, 1.0), np.where(x > 0, np.inf, 0.0))
        order = np.argsort(-ratio, kind="stable")
        cum_x, cum_y = np.cumsum(x[order]), np.cumsum(y[order])
        for px, qy in zip(cum_x.tolist(), cum_y.tolist()):
            if px > delta:
                value = math.inf if qy <= 0 else math.log((px - delta) / qy)
                best = max(best, value)
    return best
