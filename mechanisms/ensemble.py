"""Releases over a voting ensemble (AGT Sec. 5.2, Thm 5.3; Dwork & Feldman 2018).

Everything here is a mechanism object: it draws noise only in `release` (the ledger calls it
after recording the spend). The vote arithmetic (counts, the ensemble answer, the votes
that must change, the ensemble radii and their 1-Lipschitz proofs) is in mechanisms/votes.py.

Releases (per query; one neighbour moves at most one vote: every count changes by <= 1 and
the count vector has L1 sensitivity 2)
----------------------------------------------------------------------------------------------
* lnmax (PATE 2017's LNMax, on the integers; noisy argmax at global sensitivity):
  argmax_c (n_c + Z_c), Z_c i.i.d. discrete Laplace with P(Z = z) = kappa a^|z|,
  a = exp(-eps/2), kappa = (1 - a) / (1 + a) (scale 2/eps, as PATE's continuous Laplace),
  ties broken uniformly at random. The counts are integers, so integer noise can be drawn
  exactly (mechanisms/exact.py); continuous Laplace cannot. eps-DP: first for ties broken
  by a fixed priority order pi. Fix the other classes' noises; class i wins iff
  Z_i >= tau(D) = max(max_{j before i} (n_j + Z_j) + 1, max_{j after i} (n_j + Z_j)) - n_i,
  an integer. A neighbour changes every count by at most 1, so tau(D') <= tau(D) + 2, and
  the survival function S(t) = P(Z >= t) satisfies S(t + 1) >= a S(t) for every integer t
  (S(t) = a^t / (1 + a) for t >= 0: ratio a; S(t) = 1 - a^(1-t) / (1 + a) for t < 0:
  S(t + 1) >= a S(t) iff 1 - a^2 >= a^(-t) (1 - a^2), true as a^(-t) <= 1). Hence
  P_D'(i | Z_-i) >= a^2 P_D(i | Z_-i) = e^-eps P_D(i | Z_-i); integrating over Z_-i and
  swapping D, D' gives eps-DP. Breaking ties uniformly at random is the mixture over a
  uniformly random order pi, drawn independently of the data: a mixture of eps-DP
  mechanisms with data-independent weights is eps-DP. The exact law is
  `lnmax_probabilities` (closed forms for the noise tails, a direct sum in between).
* ens-ss-laplace / ens-ss-cauchy (AGT Cor 5.2 + Thm 5.3, binary): the smooth-sensitivity
  release of smooth.py on the ensemble answer with the ensemble radius (min-cost by
  default, `radius_rule="thm5.3"` for the paper's, m - 1 smaller; votes.py).
* ens-ptr / ens-ptr-votes (propose-test-release; Dwork-Lei 2009, Thakurta-Smith 2013): s = the
  min-cost radius (with AGT radii) or m - 1 (votes only), both of sensitivity 1 with s >= 1
  implying every neighbour gives the same answer. Release w if s + Laplace(1/eps) >
  ln(1/delta)/eps, else REFUSED. (eps, delta)-DP: where neighbours agree on w the output is a
  post-processing of the noisy s (eps-DP); where they disagree s = 0 on both and an answer has
  probability P(Laplace(1/eps) > ln(1/delta)/eps) = delta/2.
* df-exp (Dwork & Feldman 2018; van der Maaten & Hannun Alg. 8): P(y) ~ exp(beta n_y). One
  replaced record moves one vote from a to b: n_a - 1, n_b + 1, the other counts fixed. Then
  ln P_D(y)/P_D'(y) = beta (n_y - n'_y) - ln(Z / Z'), where beta (n_y - n'_y) is in
  {-beta, 0, beta} and ln(Z / Z') in [-beta, beta]: the worst log-ratio is at most 2 beta
  (reached as beta T grows: Z / Z' -> e^beta when class b dominates, and y = a). So
  beta = eps / 2 per query is eps-DP; the study's Thm 7 uses beta = eps / B for B queries,
  i.e. beta = eps per query, which only bounds this by 2 eps (tests/mechanisms/test_ensemble.py
  computes the exact worst ratio). Any number of classes.
* df-exp-zcdp: one session over the release's B queries at (eps, delta). Each query's
  privacy loss ranges over an interval of width at most 2 beta (the numerator's beta (n_y -
  n'_y) varies by at most 2 beta across y, the normaliser does not depend on y): the
  exponential mechanism is 2 beta-bounded-range, hence (2 beta)^2 / 8 = beta^2 / 2 zCDP
  (Cesar & Rogers 2021, Lemma 3.2); B queries compose to rho = B beta^2 / 2 zCDP, which is
  (rho + 2 sqrt(rho ln(1/delta)), delta)-DP (Bun & Steinke 2016, Prop. 1.3). With
  sqrt(rho) = sqrt(ln(1/delta) + eps) - sqrt(ln(1/delta)), rho + 2 sqrt(rho ln(1/delta)) =
  eps exactly, so beta = sqrt(2 rho / B) -- the study's Thm 8 value beta''. The session
  uses the larger of that and the pure per-query value eps / (2 B) (standard composition).
* ens-ptr-gs (the paper's variant, binary): ens-ptr at eps/2; where it refuses, the
  global-sensitivity release of the answer w (binary, sensitivity 1) at eps/2. Basic
  composition of (eps/2, delta) and (eps/2, 0): (eps, delta)-DP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.base import REFUSED, Mechanism, register
from mechanisms.checks import check_params, privacy_problems
from mechanisms.exact import discrete_laplace, exponential_choice
from mechanisms.guarantee import Guarantee
from mechanisms.inputs import Votes
from mechanisms.noise import (
    correct_from_flip,
    discrete_laplace_cdf,
    discrete_laplace_pmf,
    flip_probability,
    laplace_flip_probability,
    laplace_scale_up,
    ptr_draw,
    ptr_release_probability,
    ptr_threshold,
    threshold_draw,
)
from mechanisms.rounding import float_down
from mechanisms.smooth import SmoothSensitivity, smooth_note
from mechanisms.votes import (
    RADIUS_RULES,
    aggregate,
    counts_of,
    ensemble_radius,
    flips_needed,
    probability_of_labels,
    ptr_distance,
    vote_counts,
)

__all__ = ["RADIUS_RULES", "vote_counts", "aggregate", "flips_needed", "ensemble_radius",
           "ptr_distance", "lnmax_probabilities", "df_probabilities", "df_zcdp_beta",
           "ptr_threshold", "ptr_release_probability", "REFUSED"]


# ---------------------------------------------------------------------------------------------
# Closed forms of noisy argmax

def lnmax_rate(epsilon: float) -> Fraction:
    """The discrete Laplace rate eps / 2 per vote count (the counts have L1 sensitivity 2),
    as the exact rational value of the float eps / 2."""
    return Fraction(float(epsilon)) / 2


def lnmax_scale(epsilon: float) -> float:
    """The noise scale 1 / rate = 2 / eps (for messages)."""
    return float(1 / lnmax_rate(epsilon))


def _gauss_legendre_unit(n_classes: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Nodes and weights on [0, 1] that integrate polynomials of degree n_classes - 1
    exactly (ceil(C / 2) Gauss-Legendre points)."""
    t, w = np.polynomial.legendre.leggauss(max(1, (n_classes + 1) // 2))
    return (t + 1.0) / 2.0, w / 2.0


def _exclusive_product(f: NDArray[np.float64], axis: int) -> NDArray[np.float64]:
    """out[..., y, ...] = prod_{j != y} f[..., j, ...] along `axis`, without dividing (a
    factor may underflow to 0)."""
    f = np.moveaxis(f, axis, -1)
    ones = np.ones(f.shape[:-1] + (1,))
    before = np.cumprod(np.concatenate([ones, f[..., :-1]], axis=-1), axis=-1)
    after = np.cumprod(np.concatenate([ones, f[..., :0:-1]], axis=-1), axis=-1)[..., ::-1]
    return np.moveaxis(before * after, -1, axis)


def lnmax_probabilities(counts: ArrayLike, epsilon: float) -> NDArray[np.float64]:
    """P(lnmax releases y) for every class y, (Q, C): counts n, Z_c i.i.d. discrete Laplace
    of rate g = eps / 2 (a = e^-g), ties broken uniformly at random.

    With v the value of n_y + Z_y, L_j(v) = P(n_j + Z_j < v), E_j(v) = P(n_j + Z_j = v):
        P(y) = sum_v P(Z_y = v - n_y) int_0^1 prod_{j != y} (L_j(v) + x E_j(v)) dx,
    since int_0^1 x^m dx = 1 / (m + 1) is the chance to win an m-fold tie. Split at
    lo = min n, hi = max n:
    * v <= lo: every factor is a geometric term, and the sum is
      a^(N - C lo) / (C (1 + a)^C), N = sum n (the same for every y);
    * v > hi: L_j + x E_j = 1 - a^(v - n_j) (1 - x (1 - a)) / (1 + a); substituting
      s = a^(v - hi - 1) (1 - x (1 - a)) turns the sum over v and the integral over x into
      one integral over s in (0, 1]:
      a_y / (1 + a) int_0^1 prod_{j != y} (1 - a_j s / (1 + a)) ds, a_j = a^(hi + 1 - n_j);
    * lo < v <= hi (at most max n - min n values): summed directly.
    The x and s integrands are polynomials of degree C - 1, integrated exactly by
    Gauss-Legendre; every term is non-negative, so float rounding stays relative."""
    n = np.asarray(counts, dtype=np.int64)
    if n.ndim != 2 or n.shape[1] < 1:
        raise ValueError(f"counts must have shape (Q, C), got {n.shape}")
    q_total, c = n.shape
    g = float(lnmax_rate(epsilon))
    a = math.exp(-g)
    x, w = _gauss_legendre_unit(c)

    def power(k):                          # a^k for integer arrays k >= 0
        return np.exp(-g * k.astype(np.float64))

    out = np.empty((q_total, c))
    chunk = max(1, (1 << 21) // (c * x.size * max(1, int(np.ptp(n, axis=1).max(initial=0)))))
    for q0 in range(0, q_total, chunk):
        m = n[q0:q0 + chunk]
        lo, hi = m.min(axis=1), m.max(axis=1)
        low = power(m.sum(axis=1) - c * lo) / (c * (1.0 + a) ** c)
        tail = power(hi[:, None] + 1 - m)                                    # (q, C)
        factor = 1.0 - tail[:, :, None] * x[None, None, :] / (1.0 + a)       # (q, C, X)
        high = tail / (1.0 + a) * (_exclusive_product(factor, axis=1) @ w)
        span = int((hi - lo).max(initial=0))
        v = lo[:, None] + np.arange(1, span + 1)[None, :]                    # (q, V)
        inside = v <= hi[:, None]
        gap = v[:, :, None] - m[:, None, :]                                  # (q, V, C)
        pmf = discrete_laplace_pmf(gap, g)
        f = discrete_laplace_cdf(gap - 1, g)[..., None] + pmf[..., None] * x  # (q, V, C, X)
        ties = _exclusive_product(f, axis=2) @ w                             # (q, V, C)
        middle = (np.where(inside[:, :, None], pmf, 0.0) * ties).sum(axis=1)
        out[q0:q0 + chunk] = low[:, None] + middle + high
    return np.clip(out, 0.0, 1.0)


def lnmax_draw(counts: NDArray[np.int64], epsilon: float,
               rng: np.random.Generator) -> NDArray[np.int64]:
    """argmax_c (n_c + Z_c) per row, Z_c exact discrete Laplace draws of rate eps / 2, a
    tie won by a uniformly chosen maximiser (exact integers: rng.integers only)."""
    rate = lnmax_rate(epsilon)
    out = np.empty(len(counts), dtype=np.int64)
    for q, row in enumerate(np.asarray(counts).tolist()):
        noisy = [int(n) + discrete_laplace(rate, rng) for n in row]
        top = max(noisy)
        winners = [j for j, value in enumerate(noisy) if value == top]
        out[q] = winners[int(rng.integers(0, len(winners)))] if len(winners) > 1 else winners[0]
    return out


# ---------------------------------------------------------------------------------------------
# Mechanism objects

@register("lnmax", inputs=Votes, needs_delta=False,
          summary="noisy argmax over the vote counts, discrete Laplace(2/eps), eps-DP; any classes")
@dataclass(frozen=True)
class NoisyArgmax(Mechanism):
    """argmax_c (n_c + discrete Laplace(2/eps)), random tie-break: eps-DP per query (module
    docstring)."""

    epsilon: float
    delta: float | None = None

    input_type = Votes

    def __post_init__(self) -> None:
        check_params("lnmax", self.epsilon, self.delta, False)

    @property
    def name(self) -> str:
        return "lnmax"

    def guarantee(self, relation: str) -> Guarantee:
        return Guarantee(float(self.epsilon), 0.0, relation, self.name,
                         f"noisy argmax over the T vote counts, discrete Laplace of scale "
                         f"{lnmax_scale(self.epsilon)!r} per count, random tie-break: one record "
                         "moves one teacher's vote (every count changes by at most 1)")

    def _draw(self, inputs: Votes, rng):
        return lnmax_draw(counts_of(inputs.votes, inputs.n_classes), self.epsilon, rng)

    def _correct(self, inputs: Votes, y):
        return probability_of_labels(
            lnmax_probabilities(counts_of(inputs.votes, inputs.n_classes), self.epsilon), y)


@dataclass(frozen=True)
class SmoothEnsemble(Mechanism):
    """The smooth-sensitivity release of the ensemble answer with the ensemble radius
    (binary; module docstring)."""

    epsilon: float
    delta: float | None = None
    noise: str = "cauchy"
    radius_rule: str = "tight"

    input_type = Votes
    uses_radii = True
    max_classes = 2

    def __post_init__(self) -> None:
        inner = SmoothSensitivity(self.epsilon, self.delta, self.noise)   # validates
        object.__setattr__(self, "delta", inner.delta)
        if self.radius_rule not in RADIUS_RULES:
            problems = privacy_problems(self.name)
            problems.add(f"radius_rule must be one of {RADIUS_RULES}, got {self.radius_rule!r}")
            problems.raise_if_any()

    @property
    def name(self) -> str:
        return f"ens-ss-{self.noise}"

    @property
    def _inner(self) -> SmoothSensitivity:
        return SmoothSensitivity(self.epsilon, self.delta, self.noise)

    def guarantee(self, relation: str) -> Guarantee:
        rule = ("thm5.3: sum of the m smallest radii of the winning voters" if
                self.radius_rule == "thm5.3" else "min-cost: cheapest vote changes, minus 1")
        g = self._inner.guarantee(relation)
        return Guarantee(g.epsilon, g.delta, relation, self.name,
                         f"ensemble radius ({rule}; AGT Sec. 5.2); "
                         f"{smooth_note(self.epsilon, self.delta, self.noise)}")

    def radius(self, inputs: Votes) -> NDArray[np.int64]:
        return ensemble_radius(inputs.votes, inputs.radii, self.radius_rule, inputs.n_classes)

    def _draw(self, inputs: Votes, rng):
        answer = aggregate(inputs.votes, inputs.n_classes)
        return threshold_draw(answer, self._inner.scale(self.radius(inputs)), self.noise, rng)

    def _correct(self, inputs: Votes, y):
        answer = aggregate(inputs.votes, inputs.n_classes)
        flip = flip_probability(self._inner.scale(self.radius(inputs)), self.noise)
        return correct_from_flip(answer, y, flip)


register("ens-ss-laplace", inputs=Votes, needs_delta=True,
         summary="smooth sensitivity on the ensemble radius, Laplace, (eps, delta)-DP; binary")(
    partial(SmoothEnsemble, noise="laplace"))
register("ens-ss-cauchy", inputs=Votes, needs_delta=False,
         summary="smooth sensitivity on the ensemble radius, Cauchy, eps-DP; binary")(
    partial(SmoothEnsemble, noise="cauchy"))


@dataclass(frozen=True)
class EnsemblePTR(Mechanism):
    """Propose-test-release on the ensemble's stability distance: the exact answer or
    REFUSED (module docstring); `with_radii` selects the min-cost radius or m - 1."""

    epsilon: float
    delta: float
    with_radii: bool = True

    input_type = Votes

    def __post_init__(self) -> None:
        check_params(self.name, self.epsilon, self.delta, True)

    @property
    def uses_radii(self) -> bool:      # type: ignore[override]
        return self.with_radii

    @property
    def name(self) -> str:
        return "ens-ptr" if self.with_radii else "ens-ptr-votes"

    def guarantee(self, relation: str) -> Guarantee:
        distance = ("min-cost ensemble radius (cheapest vote changes in records, minus 1)"
                    if self.with_radii else "m - 1 (votes that must change, minus one)")
        return Guarantee(float(self.epsilon), float(self.delta), relation, self.name,
                         f"propose-test-release: distance {distance} + Laplace(1/eps) > "
                         f"ln(1/delta)/eps = {ptr_threshold(self.epsilon, self.delta)!r} "
                         "releases the ensemble answer, else no answer (answers where "
                         "neighbours disagree have probability delta/2)")

    def distance(self, inputs: Votes) -> NDArray[np.int64]:
        return ptr_distance(inputs.votes, inputs.radii if self.with_radii else None,
                            inputs.n_classes)

    def _draw(self, inputs: Votes, rng):
        answer = aggregate(inputs.votes, inputs.n_classes)
        return ptr_draw(answer, self.distance(inputs), self.epsilon, self.delta, rng)

    def _correct(self, inputs: Votes, y):
        answer = aggregate(inputs.votes, inputs.n_classes)
        passed = ptr_release_probability(self.distance(inputs), self.epsilon, self.delta)
        return np.where(answer == y, passed, 0.0)


register("ens-ptr", inputs=Votes, needs_delta=True,
         summary="propose-test-release on the min-cost ensemble radius, (eps, delta)-DP")(
    partial(EnsemblePTR, with_radii=True))
register("ens-ptr-votes", inputs=Votes, needs_delta=True,
         summary="propose-test-release on the vote margin alone, (eps, delta)-DP")(
    partial(EnsemblePTR, with_radii=False))


@register("ens-ptr-gs", inputs=Votes, needs_delta=True,
          summary="the paper's PTR at eps/2 with a GS fallback at eps/2, (eps, delta)-DP; binary")
@dataclass(frozen=True)
class EnsemblePTRWithGS(Mechanism):
    """ens-ptr at eps/2; where it refuses, 1[w + Laplace(2/eps) > 1/2] (GS at eps/2) on the
    binary ensemble answer w. Basic composition of the two halves: (eps, delta)-DP."""

    epsilon: float
    delta: float

    input_type = Votes
    uses_radii = True
    max_classes = 2

    def __post_init__(self) -> None:
        check_params(self.name, self.epsilon, self.delta, True)

    @property
    def name(self) -> str:
        return "ens-ptr-gs"

    @property
    def _ptr(self) -> EnsemblePTR:
        return EnsemblePTR(self.epsilon / 2.0, self.delta, True)

    def guarantee(self, relation: str) -> Guarantee:
        return Guarantee(float(self.epsilon), float(self.delta), relation, self.name,
                         f"PTR on the min-cost ensemble radius at eps/2 (threshold "
                         f"{ptr_threshold(self.epsilon / 2, self.delta)!r}), else the GS "
                         f"release of the ensemble answer at eps/2; basic composition")

    def _draw(self, inputs: Votes, rng):
        answer = aggregate(inputs.votes, inputs.n_classes)
        labels = self._ptr._draw(inputs, rng)
        fallback = threshold_draw(answer, laplace_scale_up(2.0, self.epsilon), "laplace", rng)
        return np.where(labels >= 0, labels, fallback)

    def _correct(self, inputs: Votes, y):
        answer = aggregate(inputs.votes, inputs.n_classes)
        passed = ptr_release_probability(self._ptr.distance(inputs), self.epsilon / 2.0,
                                         self.delta)
        fallback = correct_from_flip(answer, y,
                                     laplace_flip_probability(laplace_scale_up(2.0, self.epsilon)))
        return np.where(answer == y, passed, 0.0) + (1.0 - passed) * fallback


# ---------------------------------------------------------------------------------------------
# Dwork-Feldman: the exponential mechanism on the vote counts

def df_probabilities(counts: ArrayLike, beta: float) -> NDArray[np.float64]:
    """(Q, C): P(y) = exp(beta n_y) / sum_c exp(beta n_c)."""
    n = np.asarray(counts, dtype=np.float64) * beta
    n -= n.max(axis=1, keepdims=True)
    e = np.exp(n)
    return e / e.sum(axis=1, keepdims=True)


def df_draw(counts: ArrayLike, beta: float, rng: np.random.Generator) -> NDArray[np.int64]:
    """One label per query from `df_probabilities`, exactly (mechanisms/exact.py: deficits
    beta (max_c n_c - n_y) in rational arithmetic; the float cumulative-sum draw an audit
    found above e^eps at vote counts such as 60 : 0 against 59 : 1)."""
    b = Fraction(float(beta))
    counts = np.asarray(counts, dtype=np.int64)
    out = np.empty(counts.shape[0], dtype=np.int64)
    for q, row in enumerate(counts.tolist()):
        top = max(row)
        out[q] = exponential_choice([b * (top - n) for n in row], rng)
    return out


def df_zcdp_beta(epsilon: float, delta: float, n_queries: int) -> float:
    """beta of a df-exp-zcdp session of B queries at (eps, delta) (module docstring), rounded
    down: sqrt(L + eps) - sqrt(L) = eps / (sqrt(L + eps) + sqrt(L)), L = ln(1/delta), without
    the cancellation of the difference (which put rho + 2 sqrt(rho L) above eps by up to
    1.5e-7 relative at eps = 1e-6, an adversarial review found), then lowered by 1e-12
    relative, far more than the few roundings left; the pure value eps / (2B) is rounded
    down exactly."""
    log_inv_delta = -math.log(delta)
    root = epsilon / (math.sqrt(log_inv_delta + epsilon) + math.sqrt(log_inv_delta))
    zcdp = math.sqrt(2.0 / n_queries) * root * (1.0 - 1e-12)
    return max(zcdp, float_down(Fraction(float(epsilon)) / (2 * int(n_queries))))


@dataclass(frozen=True)
class DworkFeldman(Mechanism):
    """P(y) ~ exp(beta n_y): per query with beta = eps / 2 (eps-DP), or as one (eps, delta)
    session over the release's queries (module docstring)."""

    epsilon: float
    delta: float | None = None
    session: bool = False

    input_type = Votes

    def __post_init__(self) -> None:
        check_params(self.name, self.epsilon, self.delta, self.session)

    @property
    def per_query(self) -> bool:          # type: ignore[override]
        return not self.session

    @property
    def name(self) -> str:
        return "df-exp-zcdp" if self.session else "df-exp"

    def beta(self, n_queries: int) -> float:
        if self.session:
            return df_zcdp_beta(self.epsilon, self.delta, n_queries)
        return self.epsilon / 2.0

    def guarantee(self, relation: str) -> Guarantee:
        if self.session:
            note = ("Dwork-Feldman exponential mechanism on the vote counts, one session: "
                    "2 beta-bounded range, beta^2/2 zCDP per query, zCDP composition over the "
                    "release's queries (van der Maaten-Hannun Thm 8 value of beta)")
            return Guarantee(float(self.epsilon), float(self.delta), relation, self.name, note)
        return Guarantee(float(self.epsilon), 0.0, relation, self.name,
                         f"Dwork-Feldman exponential mechanism on the vote counts, "
                         f"P(y) ~ exp(beta n_y) with beta = eps/2 = {self.epsilon / 2!r}: one "
                         f"moved vote changes the log-ratio by at most 2 beta")

    def _draw(self, inputs: Votes, rng):
        return df_draw(counts_of(inputs.votes, inputs.n_classes), self.beta(inputs.n_queries), rng)

    def _correct(self, inputs: Votes, y):
        return probability_of_labels(df_probabilities(counts_of(inputs.votes, inputs.n_classes),
                                                      self.beta(inputs.n_queries)), y)


register("df-exp", inputs=Votes, needs_delta=False,
         summary="Dwork-Feldman exponential mechanism on the votes, beta = eps/2, "
                 "eps-DP per query")(
    partial(DworkFeldman, session=False))
register("df-exp-zcdp", inputs=Votes, needs_delta=True,
         summary="Dwork-Feldman exponential mechanism, one zCDP-composed (eps, delta) session")(
    partial(DworkFeldman, session=True))
