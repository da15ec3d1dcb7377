"""Releases that spend the certified radius directly (any number of classes).

The stability radius r of a query (agt/certify/: the grid index of the largest certified
box, -1 where not even k = 0 certifies; for an ensemble the min-cost radius R >= 0 of
mechanisms/ensemble.py) has two properties, for neighbouring datasets D, D' (under the
relations the certificates hold under, and for selection rules with a nesting proof):
  (P1) r(D') >= r(D) - 1, both ways: the radius has sensitivity 1;
  (P2) if r(D) >= 1 then the answer (certified class) at D' equals the one at D: every
      neighbour's nominal model lies in the k = 1 box, all of which predict it. So if the
      answers of D and D' differ, r(D) <= 0 and r(D') <= 0.
It is a lower bound on the distance to instability (Smith & Thakurta 2013). Three releases:

exp-radius / ens-exp-radius: the exponential mechanism on the radius (inverse-sensitivity
  style, Asi & Duchi 2020). Scores u(y) = 0 for the answer c, u(y) = -(r + 1) otherwise.
  Every score has sensitivity 1 (if the answers agree only r moves, by at most 1 (P1); if they
  differ r, r' are in {-1, 0} (P2)), so the generic exponential mechanism, weights
  exp(eps u / 2), is eps-DP (McSherry-Talwar 2007; Dwork-Roth Thm 3.10). This score is
  tighter than generic, and we release y with probability proportional to exp(eps u(y)):
  with w = e^{-eps (r + 1)}, P(c) = 1 / (1 + (C - 1) w) and P(y) = w / (1 + (C - 1) w).
  Proof of eps-DP. Same answer, w' = w e^{-eps s} with |s| <= 1: P(c)/P'(c) =
  (1 + (C-1) w') / (1 + (C-1) w) lies between 1 and w'/w, and P(y)/P'(y) = (w/w') P(c)/P'(c)
  lies between 1 and w/w': both within [e^-eps, e^eps] (all non-answer scores move together,
  the normaliser moves the other way). Different answers c != c' (w, w' in {e^-eps, 1}):
  P_D(c)/P_D'(c) = (1 + (C-1) w') / (w' (1 + (C-1) w)) <= (1 + (C-1) w') / (w' (1 + (C-1)
  e^-eps)), which is e^eps for w' = e^-eps and C / (1 + (C-1) e^-eps) <= e^eps for w' = 1;
  P_D'(c)/P_D(c) = w' (1 + (C-1) w) / (1 + (C-1) w') <= C w' / (1 + (C-1) w') <= 1; the same
  holds for c' with D, D' swapped, and a third class's ratio (w/w') (1 + (C-1) w') / (1 +
  (C-1) w) lies between 1 and w/w' as before. tests/mechanisms/test_radius.py checks every
  neighbouring (class, radius) pair exactly, and that doubling the constant breaks it.
  Flip probability: P(release != c) = (C - 1) w / (1 + (C - 1) w). r = -1 gives the uniform
  distribution; binary is C = 2. The draw follows this law exactly (`exp_draw`,
  mechanisms/exact.py), not a float approximation of it.

ptr: propose-test-release on one model's radius: release c if r + Laplace(1/eps) >
  ln(1/delta) / eps, else REFUSED. (eps, delta)-DP as in ens-ptr (mechanisms/ensemble.py):
  where answers agree the output is post-processing of the noisy radius (P1); where they
  differ r <= 0 and an answer has probability <= delta / 2 (P2).

svt / ens-svt: stability-gated answering with the sparse vector (Bassily, Thakkar & Thakurta
  2018; AboveThreshold as in Dwork & Roth 2014, Alg. 1 and Thm 3.23, in the form that draws
  the query noise at scale 4/eps1, not the broken variants of Lyu, Su & Li 2017), with
  discrete Laplace noises on the integer radii (drawn exactly, mechanisms/exact.py). A
  *session* answers the queries of one release in order. With the session budget split into
  eps_svt (gate) and eps_fb (fallbacks), cutoff c and eps1 = eps_svt / c: the gate draws a
  threshold noise rho, discrete Laplace of rate eps1 / 2 (scale 2/eps1); query i is
  *unstable* when -r_i + nu_i >= -T + rho with nu_i discrete Laplace of rate eps1 / 4 (scale
  4/eps1; AboveThreshold on the sensitivity-1 scores -r_i), and *stable* otherwise. A stable
  query is answered with its certified class c_i, at no cost; an unstable one by the
  fallback (REFUSED, or exp-radius at eps_fb / c) and counts towards c; a fresh rho is drawn
  after each unstable query; after c of them the session refuses every later query.
  Privacy: the stable/unstable transcript is c AboveThreshold instances, eps1 each, so
  eps_svt-DP (basic composition). Dwork-Roth's proof of one instance carries over to integer
  noise: it substitutes rho' = rho + 1 and nu_k' = nu_k + 2 for the instance's unstable
  query k, a bijection of the integers, and uses only P(rho = x) <= e^(eps1/2) P(rho = x + 1)
  and P(nu = y) <= e^(eps1/2) P(nu = y + 2), which the rates eps1/2 and eps1/4 give exactly
  (P(Z = z) / P(Z = z + 1) <= e^rate for a discrete Laplace of that rate). The fallbacks
  compose to eps_fb. The certified answers are
  a function of the transcript and of the answers c_i of stable queries, which agree between
  D and D' except where r_i <= 0 at both (P2); call E the event that such a query is declared
  stable. Fix an instance's start; let i* be the first query with r <= 0 after it. Any such
  query declared stable in this instance means i* was (an unstable one ends the instance),
  which needs rho - nu_i* > T (r_i* <= 0); rho and nu_i* are fresh and independent of the
  start, so this has probability at most q(T) = P(rho - nu > T), and P(E) <= c q(T) =: delta'. The
  usual argument (compare, for each neighbouring pair D, D', with a mechanism that answers
  a fixed class at the queries whose radii are <= 0 under both) gives
      (eps, delta)-DP for the whole session, eps = eps_svt + eps_fb,
      delta = (1 + e^eps) delta'.
  T is the smallest integer with (1 + e^eps) c q(T) <= delta; q has a closed form
  (`discrete_difference_tail`).
  The ledger records a session as one entry of (eps, delta): the budget pays only for the
  unstable queries' cutoff, not per query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import PrivacyError
from mechanisms.base import REFUSED, Mechanism, register
from mechanisms.checks import check_delta, check_epsilon, check_params, privacy_problems
from mechanisms.exact import bernoulli_exps, discrete_laplace, distinct_rows
from mechanisms.guarantee import Guarantee
from mechanisms.inputs import Certified, Votes
from mechanisms.noise import (
    discrete_laplace_cdf,
    discrete_laplace_pmf,
    ptr_draw,
    ptr_release_probability,
    ptr_threshold,
)
from mechanisms.rounding import float_down
from mechanisms.votes import aggregate, ensemble_radius

FALLBACKS = ("refuse", "exp-radius")


def answer_and_radius(inputs) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The certified answer and its stability radius per query: a single model's prediction
    and radius, or an ensemble's winner and min-cost radius (both satisfy P1 and P2)."""
    if isinstance(inputs, Votes):
        return (aggregate(inputs.votes, inputs.n_classes),
                ensemble_radius(inputs.votes, inputs.radii, "tight", inputs.n_classes))
    return inputs.prediction, inputs.radius


# ---------------------------------------------------------------------------------------------
# Exponential mechanism on the radius

def exp_flip_probability(radius: ArrayLike, epsilon: float, n_classes: int) -> NDArray[np.float64]:
    """P(release != c) = (C - 1) w / (1 + (C - 1) w), w = exp(-eps (r + 1))."""
    w = np.exp(-epsilon * (np.asarray(radius, dtype=np.float64) + 1.0))
    return (n_classes - 1) * w / (1.0 + (n_classes - 1) * w)


def exp_probabilities(answer: NDArray[np.int64], radius: NDArray[np.int64], epsilon: float,
                      n_classes: int) -> NDArray[np.float64]:
    """(Q, C): P(release = y) for every class y."""
    flip = exp_flip_probability(radius, epsilon, n_classes)
    p = np.repeat((flip / (n_classes - 1))[:, None], n_classes, axis=1)
    p[np.arange(len(answer)), answer] = 1.0 - flip
    return p


def exp_draw(answer: NDArray[np.int64], radius: NDArray[np.int64], epsilon: float,
             n_classes: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """One draw per query from `exp_probabilities`, exactly (mechanisms/exact.py: weight 1
    for the answer c and exp(-eps (r + 1)) for every other class, in rational arithmetic;
    a float draw realised another law, which an audit showed is not eps-DP)."""
    a, b = Fraction(float(epsilon)).as_integer_ratio()        # eps = a / b exactly
    answer = np.asarray(answer, dtype=np.int64)
    radius = np.asarray(radius, dtype=np.int64)
    out = np.full(answer.shape, REFUSED, dtype=np.int64)
    # gamma = eps (r + 1) = a (r + 1) / b once per distinct radius, in lowest terms (as
    # Fraction holds it), each query pointing at its radius's row (`bernoulli_exps`)
    distinct, kind = distinct_rows(radius.reshape(-1))
    nums, dens = [], []
    for r in distinct.tolist():
        g = a * (r + 1)
        d = math.gcd(g, b)
        nums.append(g // d)
        dens.append(b // d)
    # `exponential_choice` for every query at once: a uniform class per query, the answer
    # always kept, another class kept with probability exp(-eps (r + 1)) (`bernoulli_exps`),
    # again for the queries whose proposal was not kept
    active = np.arange(answer.size)
    while active.size:
        proposal = rng.integers(0, n_classes, size=active.size)
        keep = proposal == answer[active]
        other = np.flatnonzero(~keep)
        if other.size:
            keep[other] = bernoulli_exps(nums, dens, rng, kinds=kind[active[other]])
        out[active[keep]] = proposal[keep]
        active = active[~keep]
    return out


@dataclass(frozen=True)
class ExponentialRadius(Mechanism):
    """The exponential mechanism on the radius (module docstring): eps-DP per query, any
    number of classes; `ensemble` selects Votes inputs and the min-cost ensemble radius."""

    epsilon: float
    delta: float | None = None
    ensemble: bool = False

    uses_radii = True

    def __post_init__(self) -> None:
        check_params(self.name, self.epsilon, self.delta, False)

    @property
    def input_type(self):         # type: ignore[override]
        return Votes if self.ensemble else Certified

    @property
    def name(self) -> str:
        return "ens-exp-radius" if self.ensemble else "exp-radius"

    def guarantee(self, relation: str) -> Guarantee:
        radius = "min-cost ensemble radius" if self.ensemble else "stability radius"
        return Guarantee(float(self.epsilon), 0.0, relation, self.name,
                         f"exponential mechanism on the {radius}: score 0 for the certified "
                         f"class, -(r+1) otherwise (sensitivity 1, one-directional), weights "
                         f"exp(eps u); "
                         f"eps={self.epsilon!r} per query (McSherry-Talwar; Asi-Duchi)")

    def _draw(self, inputs, rng):
        answer, radius = answer_and_radius(inputs)
        return exp_draw(answer, radius, self.epsilon, inputs.n_classes, rng)

    def _correct(self, inputs, y):
        answer, radius = answer_and_radius(inputs)
        flip = exp_flip_probability(radius, self.epsilon, inputs.n_classes)
        valid = (y >= 0) & (y < inputs.n_classes)
        return np.where(answer == y, 1.0 - flip,
                        np.where(valid, flip / (inputs.n_classes - 1), 0.0))


register("exp-radius", inputs=Certified, needs_delta=False,
         summary="exponential mechanism on the radius, eps-DP; any number of classes")(
    partial(ExponentialRadius, ensemble=False))
register("ens-exp-radius", inputs=Votes, needs_delta=False,
         summary="exponential mechanism on the min-cost ensemble radius, eps-DP; any classes")(
    partial(ExponentialRadius, ensemble=True))


# ---------------------------------------------------------------------------------------------
# Propose-test-release on one model's radius

@register("ptr", inputs=Certified, needs_delta=True,
          summary="propose-test-release on the radius: the class or no answer, (eps, delta)-DP")
@dataclass(frozen=True)
class RadiusPTR(Mechanism):
    """The certified class where radius + Laplace(1/eps) > ln(1/delta)/eps, else REFUSED."""

    epsilon: float
    delta: float

    input_type = Certified
    uses_radii = True

    def __post_init__(self) -> None:
        check_params(self.name, self.epsilon, self.delta, True)

    @property
    def name(self) -> str:
        return "ptr"

    def guarantee(self, relation: str) -> Guarantee:
        return Guarantee(float(self.epsilon), float(self.delta), relation, self.name,
                         f"propose-test-release: stability radius + Laplace(1/eps) > "
                         f"ln(1/delta)/eps = {ptr_threshold(self.epsilon, self.delta)!r} "
                         f"releases the certified class, else no answer")

    def _draw(self, inputs, rng):
        return ptr_draw(inputs.prediction, inputs.radius, self.epsilon, self.delta, rng)

    def _correct(self, inputs, y):
        passed = ptr_release_probability(inputs.radius, self.epsilon, self.delta)
        return np.where(inputs.prediction == y, passed, 0.0)


# ---------------------------------------------------------------------------------------------
# Stability-gated answering with the sparse vector

def svt_rates(eps_gate: float, cutoff: int) -> tuple[Fraction, Fraction]:
    """The rates of the threshold noise (eps1 / 2) and the query noise (eps1 / 4), eps1 =
    eps_gate / c exactly (the float eps_gate's rational value over c), so that the c
    instances spend exactly eps_gate."""
    eps1 = Fraction(float(eps_gate)) / int(cutoff)
    return eps1 / 2, eps1 / 4


def log_discrete_difference_tail(s: int, rate_rho: float, rate_nu: float) -> float:
    """ln P(rho - nu >= s) for independent discrete Laplace rho (rate g1 = rate_rho) and nu
    (rate g2 = rate_nu < g1), a = e^-g1, b = e^-g2, kappa_b = (1 - b) / (1 + b). For s >= 1,
    summing P(nu = y) P(rho >= s + y) over y >= 0, -s <= y < 0 and y < -s (geometric series;
    P(rho >= m) = a^m / (1 + a) for m >= 0 and 1 - a^(1-m) / (1 + a) below) gives
    P = b^s B with
        B = kappa_b e^(-d s) / ((1 + a)(1 - a b)) + kappa_b E / (1 + a)
            + b (1 / (1 + b) - kappa_b a^2 / ((1 + a)(1 - a b))),
    d = g1 - g2, E = (1 - e^(-d s)) / (1 - e^(-d)) (the middle sum, b^(1-s) sum_i b^i a^(s-i));
    the last bracket is the y < -s part, at least half of its first term. In logs, so that
    tiny tails (eps > 700) neither underflow nor round to 0. For s <= 0 by symmetry:
    ln(1 - P(rho - nu >= 1 - s))."""
    s = int(s)
    g1, g2 = float(rate_rho), float(rate_nu)
    if not g1 > g2 > 0:
        raise ValueError("discrete_difference_tail needs rate_rho > rate_nu > 0")
    if s <= 0:
        return math.log1p(-math.exp(log_discrete_difference_tail(1 - s, g1, g2)))
    a, b = math.exp(-g1), math.exp(-g2)
    kappa_b = -math.expm1(-g2) / (1.0 + b)
    one_minus_ab = -math.expm1(-(g1 + g2))
    d = g1 - g2
    middle = math.expm1(-d * s) / math.expm1(-d)
    below = b * (1.0 / (1.0 + b) - kappa_b * a * a / ((1.0 + a) * one_minus_ab))
    bracket = (kappa_b * math.exp(-d * s) / ((1.0 + a) * one_minus_ab)
               + kappa_b * middle / (1.0 + a) + below)
    return -g2 * s + math.log(bracket)


def discrete_difference_tail(s: int, rate_rho: float, rate_nu: float) -> float:
    """P(rho - nu >= s) (`log_discrete_difference_tail`)."""
    return math.exp(log_discrete_difference_tail(s, rate_rho, rate_nu))


def svt_threshold(eps_gate: float, cutoff: int, delta: float, eps_total: float) -> int:
    """The smallest integer T >= 0 with (1 + e^eps_total) c q(T) <= delta, where
    q(T) = P(rho - nu > T) = P(rho - nu >= T + 1) for the session's noises; compared in logs
    with a relative margin of 1e-9 on q (plus 1e-13 of the logs' size, the scale of their
    rounding at eps >> 1), so that float rounding of q never lets a T through whose exact q
    misses delta."""
    rate_rho, rate_nu = (float(r) for r in svt_rates(eps_gate, cutoff))
    log_target = math.log(delta) - math.log(cutoff) - float(np.logaddexp(0.0, eps_total))

    def fails(t: int) -> bool:
        if t > 2**53:                     # radii never get there: every query would be unstable
            raise PrivacyError(f"the sparse vector's threshold exceeds 2**53 at eps {eps_gate!r} "
                               f"over cutoff {cutoff}: raise epsilon or lower the cutoff")
        log_q = log_discrete_difference_tail(t + 1, rate_rho, rate_nu)
        # the float log's error grows with its size (about 1e-16 of it): margin beyond that
        return log_q + 1e-9 + 1e-13 * (abs(log_target) + abs(log_q)) > log_target

    if not fails(0):
        return 0
    lo, hi = 0, 1                         # fails(lo) and, once the loop ends, not fails(hi)
    while fails(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class GateState:
    """A stability-gated session between queries: the current threshold noise rho and the
    number of unstable queries met (the session is closed at the cutoff)."""

    rho: int
    tops: int


@dataclass(frozen=True)
class SparseVectorGate(Mechanism):
    """One stability-gated session over the queries of a release (module docstring)."""

    epsilon: float
    delta: float
    cutoff: int = 10
    fallback: str = "exp-radius"
    fallback_share: float = 0.5
    ensemble: bool = False

    uses_radii = True
    per_query = False            # the guarantee covers the whole session: one ledger entry

    def __post_init__(self) -> None:
        problems = privacy_problems(self.name)
        check_epsilon(self.epsilon, problems)
        check_delta(self.delta, problems)
        if isinstance(self.cutoff, bool) or not isinstance(self.cutoff, (int, np.integer)) \
                or not 1 <= self.cutoff <= 10**6:
            problems.add(f"cutoff must be an integer in [1, 10**6], got {self.cutoff!r}")
        if self.fallback not in FALLBACKS:
            problems.add(f"fallback must be one of {FALLBACKS}, got {self.fallback!r}")
        if not (isinstance(self.fallback_share, (int, float)) and 0 < self.fallback_share < 1):
            problems.add(f"fallback_share must be in (0, 1), got {self.fallback_share!r}")
        problems.raise_if_any()

    @property
    def input_type(self):         # type: ignore[override]
        return Votes if self.ensemble else Certified

    @property
    def name(self) -> str:
        return "ens-svt" if self.ensemble else "svt"

    @property
    def eps_gate(self) -> float:
        return self.epsilon * (1.0 - self.fallback_share) if self.fallback != "refuse" \
            else self.epsilon

    @property
    def eps_fallback(self) -> float:
        """Per fallback answer (at most `cutoff` of them): (eps - eps_gate) / c, rounded down
        so that the gate and c fallbacks spend at most eps exactly."""
        if self.fallback == "refuse":
            return 0.0
        return float_down((Fraction(float(self.epsilon)) - Fraction(float(self.eps_gate)))
                          / int(self.cutoff))

    @property
    def threshold(self) -> int:
        return svt_threshold(self.eps_gate, int(self.cutoff), self.delta, self.epsilon)

    @property
    def rates(self) -> tuple[Fraction, Fraction]:
        """Discrete Laplace rates of the threshold and the query noises."""
        return svt_rates(self.eps_gate, int(self.cutoff))

    def guarantee(self, relation: str) -> Guarantee:
        return Guarantee(float(self.epsilon), float(self.delta), relation, self.name,
                         f"one stability-gated session (sparse vector): radius gate at T = "
                         f"{self.threshold} with eps {self.eps_gate!r} over {self.cutoff} "
                         f"AboveThreshold instances (discrete Laplace noises of scale 2/eps1 "
                         f"on the threshold, 4/eps1 on the radii), fallback {self.fallback}"
                         + (f" at eps {self.eps_fallback!r} each" if self.fallback != "refuse"
                            else "") + "; (eps, delta) for the whole session")

    def _draw(self, inputs, rng):
        out, _, _ = self._answer(inputs, self._open(rng), rng)
        return out

    # -- a session across releases (the prediction service): the same draws, in the same
    # order, with the gate's state kept between calls. The state (the current threshold
    # noise) is owner-only: it never leaves the process or the ledger file.
    def open_session(self, rng: np.random.Generator) -> "GateState":
        """A new session's state: a fresh threshold noise, no unstable query met yet. The
        caller charges the session's guarantee before it draws (`Ledger.answer`)."""
        if not isinstance(rng, np.random.Generator):
            raise PrivacyError("a session needs a numpy Generator")
        return self._open(rng)

    def continue_session(self, inputs, state: "GateState", rng: np.random.Generator
                         ) -> tuple[NDArray[np.int64], "GateState", int]:
        """Answer the queries of `inputs` in order within the session `state`.

        Returns:
            (labels, state after them, answered): the first `answered` labels are the
            session's answers (REFUSED where the fallback refuses); the session closed after
            them when answered < the number of queries (its cutoff of unstable queries was
            reached), and the rest are for a new session."""
        self.check(inputs)
        if not isinstance(rng, np.random.Generator):
            raise PrivacyError("a session needs a numpy Generator")
        if not (isinstance(state, GateState) and 0 <= state.tops < self.cutoff):
            raise PrivacyError(f"{self.name}: not an open session's state")
        return self._answer(inputs, state, rng)

    def session_state(self, rho: int, tops: int) -> "GateState | None":
        """A stored session's state (its threshold noise and unstable queries met), or None
        when that session is closed."""
        state = GateState(int(rho), int(tops))
        return None if self.session_closed(state) else state

    def session_closed(self, state: "GateState") -> bool:
        """Whether the session reached its cutoff (a new one must be opened and charged)."""
        return state.tops >= self.cutoff

    def _open(self, rng) -> "GateState":
        return GateState(discrete_laplace(self.rates[0], rng), 0)

    def _answer(self, inputs, state: "GateState", rng):
        answer, radius = answer_and_radius(inputs)
        rate_rho, rate_nu = self.rates
        t = self.threshold
        out = np.full(answer.shape, REFUSED, dtype=np.int64)
        tops, rho = state.tops, state.rho
        answered = len(answer)
        for i in range(len(answer)):
            if tops >= self.cutoff:
                answered = i
                break
            nu = discrete_laplace(rate_nu, rng)
            if -int(radius[i]) + nu >= -t + rho:          # unstable: fallback, one of c
                tops += 1
                if self.fallback == "exp-radius":
                    out[i] = exp_draw(answer[i:i + 1], radius[i:i + 1], self.eps_fallback,
                                      inputs.n_classes, rng)[0]
                rho = discrete_laplace(rate_rho, rng)
            else:
                out[i] = answer[i]
        return out, GateState(int(rho), int(tops)), answered

    def _correct(self, inputs, y):
        answer, radius = answer_and_radius(inputs)
        fb = np.zeros(len(answer))
        if self.fallback == "exp-radius":
            flip = exp_flip_probability(radius, self.eps_fallback, inputs.n_classes)
            fb = np.where(answer == y, 1.0 - flip, flip / (inputs.n_classes - 1))
            fb = np.where((y >= 0) & (y < inputs.n_classes), fb, 0.0)
        return gated_correct_probability(answer == y, fb, radius, self.threshold,
                                         *self.rates, int(self.cutoff))

    def answered_probability(self, inputs) -> NDArray[np.float64]:
        """P(answer) per query in one pass of the session's law: a stable query is always
        answered, an unstable one within the cutoff when the fallback answers
        (`gated_correct_probability` with every stable answer and fallback counted right).

        Args:
            inputs: this session's inputs, in the order it answers them.

        Returns:
            (Q,) probabilities in [0, 1].
        """
        self.check(inputs)
        _, radius = answer_and_radius(inputs)
        fb = 1.0 if self.fallback != "refuse" else 0.0
        return np.clip(gated_correct_probability(
            np.ones(len(radius), bool), np.full(len(radius), fb), radius, self.threshold,
            *self.rates, int(self.cutoff)), 0.0, 1.0)


GATE_GRID_POINTS = 8001      # threshold-noise values summed exactly; wider laws go in blocks


def gated_correct_probability(stable_right: NDArray[np.bool_], fallback_right: NDArray[np.float64],
                              radius: NDArray[np.int64], threshold: int, rate_rho: float,
                              rate_nu: float, cutoff: int,
                              max_points: int = GATE_GRID_POINTS) -> NDArray[np.float64]:
    """Per-query probability that a session answers correctly.

    The state before query i is (tops used j < c, current threshold noise rho); it is kept as
    a distribution over the integers |rho| <= M, P(|rho| > M) < 1e-15, for each j. Query i is
    stable given rho with probability s_i(rho) = P(nu < r_i - T + rho) = F_nu(r_i - T + rho - 1);
    then it is answered with the certified class (right iff `stable_right`), else by the
    fallback (right with probability `fallback_right`) and the state moves to (j + 1, fresh
    rho). Halted sessions refuse. Exact up to float rounding while the 2M + 1 values fit in
    `max_points` (eps1 >= 0.018); beyond, rho is summed in blocks of h consecutive integers
    (each block's exact mass at its middle integer), a midpoint rule on functions that vary
    on the scale 1 / eps1 > h (h eps1 <= 0.054); measured against the exact sums for eps1 =
    0.001-0.036, the error stays below 1.1e-6 (tests/mechanisms/test_radius.py)."""
    g1, g2 = float(rate_rho), float(rate_nu)
    reach = int(math.ceil(36.0 / g1))
    block = max(1, math.ceil((2 * reach + 1) / max_points))
    block += 1 - block % 2                              # odd: blocks tile the integers
    reach = (reach // block + 1) * block                 # whole blocks, centred on 0
    centres = np.arange(-reach, reach + 1, block)
    upper = discrete_laplace_cdf(centres + block // 2, g1)
    lower = discrete_laplace_cdf(centres - block // 2 - 1, g1)
    w = upper - lower if block > 1 else discrete_laplace_pmf(centres, g1)
    w /= w.sum()
    mass = np.zeros((cutoff, centres.size))        # P(state = (j, rho))
    mass[0] = w
    out = np.zeros(len(radius))
    for i in range(len(radius)):
        stable = discrete_laplace_cdf(int(radius[i]) - int(threshold) + centres - 1, g2)
        p_stable = mass * stable[None, :]
        p_top = mass - p_stable
        top_by_j = p_top.sum(axis=1)
        out[i] = p_stable.sum() * float(stable_right[i]) + top_by_j.sum() * fallback_right[i]
        mass = p_stable
        mass[1:] += top_by_j[:-1, None] * w[None, :]
    return out


register("svt", inputs=Certified, needs_delta=True,
         summary="stability-gated session (sparse vector): stable queries free, at most "
                 "--cutoff unstable ones, (eps, delta) per session")(
    partial(SparseVectorGate, ensemble=False))
register("ens-svt", inputs=Votes, needs_delta=True,
         summary="stability-gated session on the ensemble radius, (eps, delta) per session")(
    partial(SparseVectorGate, ensemble=True))
