"""Subsample-and-aggregate releases over a voting ensemble (AGT Sec. 5.2, Thm 5.3).

The private dataset D is split into T disjoint parts; teacher t is trained on part t only
(agt/ensemble.py assigns records by index, so under the *replace-one* relation one record
change touches one teacher). At a query x teacher t votes v_t in {0, ..., C-1} and is stable
at its radius r_t (agt/certify.py; -1 where not even k = 0 certifies, used here as 0: a vote
is always stable at distance 0). Everything below the mechanism classes is a pure function
of the (Q, T) vote and radius arrays; the mechanism objects are the only code that draws
noise, and the ledger calls them after recording the spend.

Aggregation and tie rule
------------------------
n_c = vote counts; the ensemble answer w is the class with the most votes, the lowest class
index among equal counts (binary: a tie gives class 0). Another class j beats w when
n_j > n_w, or n_j = n_w and j < w; so j needs the gap n_w - n_j reduced by
    R_j = n_w - n_j      (j < w)        R_j = n_w - n_j + 1      (j > w).
One changed teacher moves one vote, which reduces a gap by at most 2 (a w-voter turning to j).
Votes that must change:  m = min_j ceil(R_j / 2)  (>= 1). Binary: m = ceil((n_1 - n_0)/2) for
w = 1 and floor((n_0 - n_1)/2) + 1 for w = 0; the paper writes ceil(|n_1 - n_0| / 2), which is
0 at a tie and never larger.

Ensemble radii (smooth: r(D') >= r(D) - 1 on neighbours)
-------------------------------------------------------
Changing teacher t's vote needs at least c_t = max(r_t, 0) + 1 records of its own part.
    min-cost ("tight"):  R = min over j != w of the cheapest set of vote changes that lets j
        beat w, minus 1. A w-voter turning to j closes the gap by 2 at cost c_t, any voter
        outside {w, j} turning to j by 1; so with W_a the sum of the a smallest costs among
        the w-voters and O^j_b the sum of the b smallest among the voters outside {w, j},
        R = min_j min_a [W_a + O^j_max(0, R_j - 2a)] - 1.
    thm5.3 (binary only): the sum of the m smallest r_t over the voters for w (AGT Thm 5.3);
        equal to min-cost - (m - 1) in the binary case.
Why both are 1-Lipschitz: a neighbour changes one teacher t*. If its vote stays, c_t* moves by
at most 1, and so does every minimum of sums of costs. If its vote changes, r_t* <= 0 at both
datasets (r >= 1 certifies the vote at distance 1), so any plan at one dataset is a plan at
the other for at most one more record (undo or make t*'s change at cost 1); if the answer
itself differs, R = 0 on the side that reaches the other's votes with that one change.
So R(D') >= R(D) - 1. And R >= 1 means no neighbour changes the answer (every change costs
>= R + 1 >= 2 records). Summing over *all* teachers, or for C > 2 over the w-voters only (a
voter for a third class can turn to j), is not a stability distance and is not offered.
The vote-only distance m - 1 is the min-cost radius with every r_t = 0 (also 1-Lipschitz).

Releases (per query; one neighbour moves at most one vote: every count changes by <= 1 and
the count vector has L1 sensitivity 2)
----------------------------------------------------------------------------------------------
* lnmax (PATE 2017's LNMax; noisy argmax at global sensitivity): argmax_c (n_c + Z_c),
  Z_c i.i.d. Laplace(2/eps). eps-DP: a Laplace mechanism on an L1-sensitivity-2 vector
  (Dwork-Roth Thm 3.6) and post-processing. Binary: P(label = 1) = P(Z_1 - Z_0 > n_0 - n_1)
  with P(W > t) = exp(-t/b) (2 + t/b) / 4 for t >= 0, b = 2/eps; C > 2: one-dimensional
  quadrature of prod_j F(n_y - n_j + z) against the density of Z_y.
* ens-ss-laplace / ens-ss-cauchy (AGT Cor 5.2 + Thm 5.3, binary): the smooth-sensitivity
  release of smooth.py on the ensemble answer with the ensemble radius.
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
from functools import partial

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import DataError, Problems

from mechanisms.base import REFUSED, Mechanism, register
from mechanisms.checks import check_delta, check_epsilon, class_array, privacy_problems, \
    radius_array
from mechanisms.guarantee import Guarantee
from mechanisms.inputs import Votes
from mechanisms.noise import correct_from_flip, flip_probability, laplace_flip_probability, \
    threshold_draw
from mechanisms.smooth import SmoothSensitivity, smooth_note

RADIUS_RULES: tuple[str, ...] = ("thm5.3", "tight")


# ---------------------------------------------------------------------------------------------
# Pure vote arithmetic (no noise)

def _classes(n_classes: int | None, votes: np.ndarray) -> int:
    top = int(votes.max(initial=0)) + 1
    return max(2, top) if n_classes is None else int(n_classes)


def _check_votes(teacher_predictions: ArrayLike, n_classes: int | None,
                 teacher_radii: ArrayLike | None = None):
    problems = Problems("teacher votes", DataError)
    arr = np.asarray(teacher_predictions)
    if arr.ndim != 2 or arr.shape[1] < 1:
        problems.add(f"teacher predictions must have shape (queries, teachers) with at least "
                     f"one teacher, got shape {arr.shape}")
        problems.raise_if_any()
    c = _classes(n_classes, arr if arr.dtype.kind in "iu" else np.zeros(1, np.int64))
    votes = class_array(arr, c, problems, "teacher votes")
    radii = None
    if teacher_radii is not None:
        radii = radius_array(teacher_radii, problems, "teacher radii")
        if radii is not None and radii.shape != arr.shape:
            problems.add(f"teacher radii must have the shape of the votes {arr.shape}, got "
                         f"{radii.shape}")
    problems.raise_if_any()
    return votes, radii, c


def _counts(votes: NDArray[np.int64], n_classes: int) -> NDArray[np.int64]:
    q = votes.shape[0]
    counts = np.zeros((q, n_classes), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(q), votes.shape[1]), votes.ravel()), 1)
    return counts


def _needed(counts: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(winner (Q,), R (Q, C)): the gap reduction each class needs to beat the winner
    (a large value for the winner itself)."""
    winner = counts.argmax(axis=1)                       # lowest index among maxima
    n_w = counts[np.arange(len(counts)), winner][:, None]
    cls = np.arange(counts.shape[1])[None, :]
    need = n_w - counts + (cls > winner[:, None]).astype(np.int64)
    need = np.where(cls == winner[:, None], np.iinfo(np.int64).max // 4, need)
    return winner, need


def vote_counts(teacher_predictions: ArrayLike, n_classes: int | None = None) -> NDArray[np.int64]:
    """(Q, C) vote counts from (Q, T) teacher votes."""
    votes, _, c = _check_votes(teacher_predictions, n_classes)
    return _counts(votes, c)


def aggregate(teacher_predictions: ArrayLike, n_classes: int | None = None) -> NDArray[np.int64]:
    """Ensemble answer per query: most votes, lowest class index among ties."""
    return vote_counts(teacher_predictions, n_classes).argmax(axis=1)


def flips_needed(teacher_predictions: ArrayLike, n_classes: int | None = None) -> NDArray[np.int64]:
    """m per query: the fewest vote changes that change `aggregate` (>= 1)."""
    _, need = _needed(vote_counts(teacher_predictions, n_classes))
    return ((need + 1) // 2).min(axis=1).astype(np.int64)


def _prefix(costs: NDArray[np.float64]) -> NDArray[np.float64]:
    """Sorted prefix sums along the last axis: out[..., a] = sum of the a smallest (inf where
    fewer than a finite costs exist); length T + 2 (the last is always inf)."""
    s = np.sort(costs, axis=-1)
    out = np.zeros(s.shape[:-1] + (s.shape[-1] + 2,))
    with np.errstate(invalid="ignore"):
        out[..., 1:-1] = np.cumsum(s, axis=-1)
    out[..., -1] = np.inf
    return np.where(np.isnan(out), np.inf, out)


def _min_cost_radius(votes: NDArray[np.int64], radii: NDArray[np.int64],
                     n_classes: int) -> NDArray[np.int64]:
    counts = _counts(votes, n_classes)
    winner, need = _needed(counts)
    q, t = votes.shape
    cost = (np.maximum(radii, 0) + 1).astype(np.float64)                  # (Q, T)
    w_mask = votes == winner[:, None]
    wp = _prefix(np.where(w_mask, cost, np.inf))                           # (Q, T+2)
    cls = np.arange(n_classes)
    others = (~w_mask)[:, None, :] & (votes[:, None, :] != cls[None, :, None])   # (Q, C, T)
    op = _prefix(np.where(others, cost[:, None, :], np.inf))               # (Q, C, T+2)
    a = np.arange(t + 1)
    b = np.clip(need[:, :, None] - 2 * a[None, None, :], 0, t + 1)          # (Q, C, T+1)
    total = wp[:, None, :t + 1] + np.take_along_axis(op, b, axis=2)
    total = np.where(cls[None, :, None] == winner[:, None, None], np.inf, total)
    best = total.min(axis=(1, 2))
    return (best - 1).astype(np.int64)


def ensemble_radius(teacher_predictions: ArrayLike, teacher_radii: ArrayLike,
                    rule: str = "thm5.3", n_classes: int | None = None) -> NDArray[np.int64]:
    """Smooth radius of the ensemble answer per query (module docstring): "tight" is the
    min-cost radius (any number of classes); "thm5.3" the paper's sum of the m smallest
    winner radii (binary only)."""
    votes, radii, c = _check_votes(teacher_predictions, n_classes, teacher_radii)
    if rule not in RADIUS_RULES:
        raise DataError(f"radius rule must be one of {RADIUS_RULES}, got {rule!r}")
    if radii is None:
        raise DataError("ensemble_radius needs teacher radii")
    if rule == "tight":
        return _min_cost_radius(votes, radii, c)
    if c > 2:
        raise DataError("the thm5.3 radius is proven for binary ensembles only (a voter for a "
                        "third class can turn to the runner-up); use the tight radius")
    m = flips_needed(votes, c)
    winner = aggregate(votes, c)
    r = np.maximum(radii, 0)
    big = np.iinfo(np.int64).max // (votes.shape[1] + 1)
    ordered = np.sort(np.where(votes == winner[:, None], r, big), axis=1)
    keep = np.arange(votes.shape[1])[None, :] < m[:, None]
    return np.where(keep, ordered, 0).sum(axis=1).astype(np.int64)


def ptr_distance(teacher_predictions: ArrayLike, teacher_radii: ArrayLike | None = None,
                 n_classes: int | None = None) -> NDArray[np.int64]:
    """The sensitivity-1 stability distance PTR tests: m - 1 from votes alone, or the
    min-cost radius with AGT radii (equal to m - 1 when every radius is 0)."""
    if teacher_radii is None:
        return flips_needed(teacher_predictions, n_classes) - 1
    return ensemble_radius(teacher_predictions, teacher_radii, "tight", n_classes)


# ---------------------------------------------------------------------------------------------
# Closed forms

def lnmax_scale(epsilon: float) -> float:
    """Laplace scale b = 2 / eps per vote count (L1 sensitivity of the counts is 2)."""
    return 2.0 / float(epsilon)


def _difference_tail(t: NDArray[np.float64], b: float) -> NDArray[np.float64]:
    """P(Z_1 - Z_0 > t) for Z_c i.i.d. Laplace(b)."""
    u = np.abs(t) / b
    upper = np.exp(-u) * (2.0 + u) / 4.0
    return np.where(t >= 0, upper, 1.0 - upper)


def _laplace_cdf(x: NDArray[np.float64], b: float) -> NDArray[np.float64]:
    return np.where(x < 0, 0.5 * np.exp(np.minimum(x, 0) / b), 1.0 - 0.5 * np.exp(-np.maximum(x, 0) / b))


def lnmax_probabilities(counts: ArrayLike, epsilon: float) -> NDArray[np.float64]:
    """P(argmax_c (n_c + Z_c) = y) for every class y, (Q, C), Z_c i.i.d. Laplace(2/eps).

    Two classes: exact. More: P(y) = E_z[prod_{j != y} F(n_y - n_j + z)] over z ~ Laplace(b),
    F the Laplace CDF, by Simpson's rule on z in [-40 b, 40 b] (the mass beyond is below
    e^-40) with about 4000 points. The step is a power of two, so z = 0, where the density has
    its kink, and (for b up to ~50) every integer gap, where the CDFs' second derivatives
    jump, are panel boundaries; the result is accurate to about 1e-9."""
    n = np.asarray(counts, dtype=np.float64)
    b = lnmax_scale(epsilon)
    if n.shape[1] == 2:     # both tails directly: no cancellation in 1 - p
        return np.stack([_difference_tail(n[:, 1] - n[:, 0], b),
                         _difference_tail(n[:, 0] - n[:, 1], b)], axis=1)
    half = 40.0 * b
    h = 2.0 ** math.floor(math.log2(half / 2048.0))
    m = int(math.ceil(half / h / 2.0)) * 2                    # even: the 2h grid ends on it
    z = np.arange(-m, m + 1) * h
    density = np.exp(-np.abs(z) / b) / (2.0 * b)
    w_h = np.full(z.shape, h)
    w_h[[0, -1]] *= 0.5
    w_2h = np.zeros(z.shape)
    w_2h[::2] = 2.0 * h
    w_2h[[0, -1]] *= 0.5
    weights = (4.0 * w_h - w_2h) / 3.0 * density               # Simpson = Romberg on h, 2h
    q, c = n.shape
    out = np.empty_like(n)
    chunk = max(1, (1 << 22) // (c * z.size))
    for q0 in range(0, q, chunk):
        part = n[q0:q0 + chunk]
        for y in range(c):
            gap = part[:, y:y + 1, None] - part[:, :, None] + z[None, None, :]   # (q, C, Z)
            cdf = _laplace_cdf(gap, b)
            cdf[:, y, :] = 1.0
            out[q0:q0 + chunk, y] = np.prod(cdf, axis=1) @ weights
    return np.clip(out, 0.0, 1.0)


def ptr_threshold(epsilon: float, delta: float) -> float:
    """T = ln(1/delta) / eps: the noisy distance must exceed it for an answer."""
    problems = privacy_problems()
    check_epsilon(epsilon, problems)
    check_delta(delta, problems)
    problems.raise_if_any()
    return math.log(1.0 / delta) / epsilon


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
    """answer where distance + Laplace(1/eps) > ln(1/delta)/eps, else REFUSED."""
    noisy = distance.astype(np.float64) + rng.laplace(0.0, 1.0 / epsilon, size=distance.shape)
    passed = noisy > math.log(1.0 / delta) / epsilon
    return np.where(passed, answer, REFUSED).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Mechanism objects

def _params(name: str, epsilon, delta, needs_delta: bool):
    problems = privacy_problems(name)
    check_epsilon(epsilon, problems)
    if needs_delta:
        check_delta(delta, problems)
    elif delta not in (None, 0, 0.0):
        problems.add(f"{name} is pure eps-DP per query and takes no delta, got {delta!r}")
    problems.raise_if_any()


@register("lnmax", inputs=Votes, needs_delta=False,
          summary="noisy argmax over the vote counts, Laplace(2/eps), eps-DP; any classes")
@dataclass(frozen=True)
class NoisyArgmax(Mechanism):
    """argmax_c (n_c + Laplace(2/eps)): eps-DP per query (module docstring)."""

    epsilon: float
    delta: float | None = None

    input_type = Votes

    def __post_init__(self) -> None:
        _params("lnmax", self.epsilon, self.delta, False)

    @property
    def name(self) -> str:
        return "lnmax"

    def guarantee(self, relation: str) -> Guarantee:
        return Guarantee(float(self.epsilon), 0.0, relation, self.name,
                         f"noisy argmax over the T vote counts, Laplace({lnmax_scale(self.epsilon)!r})"
                         " per count: one record moves one teacher's vote (L1 sensitivity 2), "
                         "Laplace mechanism + post-processing")

    def _draw(self, inputs: Votes, rng):
        counts = _counts(inputs.votes, inputs.n_classes).astype(np.float64)
        noisy = counts + rng.laplace(0.0, lnmax_scale(self.epsilon), size=counts.shape)
        return noisy.argmax(axis=1)

    def _correct(self, inputs: Votes, y):
        p = lnmax_probabilities(_counts(inputs.votes, inputs.n_classes), self.epsilon)
        valid = (y >= 0) & (y < inputs.n_classes)
        return np.where(valid, p[np.arange(len(y)), np.clip(y, 0, inputs.n_classes - 1)], 0.0)


@dataclass(frozen=True)
class SmoothEnsemble(Mechanism):
    """The smooth-sensitivity release of the ensemble answer with the ensemble radius
    (binary; module docstring)."""

    epsilon: float
    delta: float | None = None
    noise: str = "cauchy"
    radius_rule: str = "thm5.3"

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
                         f"ensemble radius ({rule}; AGT Thm 5.3); "
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
        _params(self.name, self.epsilon, self.delta, True)

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
        _params(self.name, self.epsilon, self.delta, True)

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
        fallback = threshold_draw(answer, 2.0 / self.epsilon, "laplace", rng)
        return np.where(labels >= 0, labels, fallback)

    def _correct(self, inputs: Votes, y):
        answer = aggregate(inputs.votes, inputs.n_classes)
        passed = ptr_release_probability(self._ptr.distance(inputs), self.epsilon / 2.0,
                                         self.delta)
        fallback = correct_from_flip(answer, y, laplace_flip_probability(2.0 / self.epsilon))
        return np.where(answer == y, passed, 0.0) + (1.0 - passed) * fallback


# ---------------------------------------------------------------------------------------------
# Dwork-Feldman: the exponential mechanism on the vote counts

def df_probabilities(counts: ArrayLike, beta: float) -> NDArray[np.float64]:
    """(Q, C): P(y) = exp(beta n_y) / sum_c exp(beta n_c)."""
    n = np.asarray(counts, dtype=np.float64) * beta
    n -= n.max(axis=1, keepdims=True)
    e = np.exp(n)
    return e / e.sum(axis=1, keepdims=True)


def df_zcdp_beta(epsilon: float, delta: float, n_queries: int) -> float:
    """beta of a df-exp-zcdp session of B queries at (eps, delta) (module docstring)."""
    root = math.sqrt(math.log(1.0 / delta) + epsilon) - math.sqrt(math.log(1.0 / delta))
    return max(math.sqrt(2.0 / n_queries) * root, epsilon / (2.0 * n_queries))


@dataclass(frozen=True)
class DworkFeldman(Mechanism):
    """P(y) ~ exp(beta n_y): per query with beta = eps / 2 (eps-DP), or as one (eps, delta)
    session over the release's queries (module docstring)."""

    epsilon: float
    delta: float | None = None
    session: bool = False

    input_type = Votes

    def __post_init__(self) -> None:
        _params(self.name, self.epsilon, self.delta, self.session)

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
        p = df_probabilities(_counts(inputs.votes, inputs.n_classes), self.beta(inputs.n_queries))
        u = rng.random((p.shape[0], 1))
        return np.minimum((np.cumsum(p, axis=1) < u).sum(axis=1), p.shape[1] - 1)

    def _correct(self, inputs: Votes, y):
        p = df_probabilities(_counts(inputs.votes, inputs.n_classes), self.beta(inputs.n_queries))
        valid = (y >= 0) & (y < inputs.n_classes)
        return np.where(valid, p[np.arange(len(y)), np.clip(y, 0, inputs.n_classes - 1)], 0.0)


register("df-exp", inputs=Votes, needs_delta=False,
         summary="Dwork-Feldman exponential mechanism on the votes, beta = eps/2, eps-DP per query")(
    partial(DworkFeldman, session=False))
register("df-exp-zcdp", inputs=Votes, needs_delta=True,
         summary="Dwork-Feldman exponential mechanism, one zCDP-composed (eps, delta) session")(
    partial(DworkFeldman, session=True))
