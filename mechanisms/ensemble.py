"""Subsample-and-aggregate releases over a binary voting ensemble (AGT Sec. 5.2, Thm 5.3).

The private dataset D is split into T disjoint parts; teacher t is trained on part t only
(agt/ensemble.py assigns records by index, so under the *replace-one* relation one record
change touches one teacher). At a query x teacher t votes v_t in {0, 1} and is stable at its
smooth radius r_t >= 0 (agt/certify.py: r_t(D') >= r_t(D) - 1 on neighbours, and r_t >= 1
means no neighbour changes the vote). Everything here is a pure function of the (Q, T) vote
and radius arrays; the only functions that draw noise are the `release_*` ones, and callers
run them inside the ledger's release function (check, then commit, then release).

Aggregation and tie rule
------------------------
n_0, n_1 = vote counts; the ensemble answer is
    w = 1 if n_1 > n_0 else 0            (a tie n_0 == n_1 releases the fixed class 0).
Votes that must flip to change w, for this rule (exact, not a bound):
    w = 1 (margin n_1 - n_0 >= 1):  m = ceil((n_1 - n_0) / 2)      (reaching a tie gives 0)
    w = 0 (margin n_0 - n_1 >= 0):  m = floor((n_0 - n_1) / 2) + 1 (class 1 must win strictly)
So m >= 1 always; at a tie m = 1 (one 0-voter turning to 1 changes the answer). The paper
writes m = ceil(|n_1 - n_0| / 2), which is 0 at a tie and never larger than ours; odd T
has no ties.

Ensemble radius (Thm 5.3) and a tighter variant
-----------------------------------------------
Only voters for w can change the answer by changing their vote, and changing teacher t's
vote needs at least r_t + 1 of the records of its own part. With R_w the radii of the
voters for w sorted ascending:
    thm5.3:  R = R_w[0] + ... + R_w[m-1]                 (AGT Thm 5.3)
    tight:   R = (R_w[0] + 1) + ... + (R_w[m-1] + 1) - 1  =  thm5.3 + m - 1
Both are stability distances of the ensemble answer and both are 1-Lipschitz in D (what
makes exp(-beta R) a beta-smooth bound; DESIGN.md "The smooth bound must itself be smooth"):
a neighbour changes one teacher t*; if its vote is unchanged, one radius drops by at most 1
and so does a sum of the m smallest; if its vote changes then r_t*(D) = 0: a voter for w
with radius 0 leaves (m drops by one and the removed term was a 0 in the thm5.3 sum; the
tight sum drops by exactly 1; if w changes, R(D) = 0), or a voter joins w (m grows by one,
the sum of m + 1 smallest of a larger set is no smaller). Summing over *all* teachers, or
over the losing voters, is not 1-Lipschitz and is not offered. With all r_t = 0 the tight
radius is m - 1 (vote flips alone); thm5.3 is 0.

Releases and their guarantees (per query, w.r.t. the relation passed in)
-----------------------------------------------------------------------
The relation must be one under which a neighbouring dataset changes the training data of at
most one teacher (replace-one with index partitioning). Then one neighbour moves at most one
vote: n_0 and n_1 each change by at most 1 (the vector (n_0, n_1) has L1 sensitivity 2).

* gnmax (PATE-style noisy argmax, global sensitivity): label = 1[n_1 + Z_1 > n_0 + Z_0],
  Z_c i.i.d. Laplace(b), b = 2 / eps. eps-DP: the noisy count vector is a Laplace mechanism
  on an L1-sensitivity-2 vector (Dwork-Roth Thm 3.6) and the argmax is post-processing. (PATE
  2017's LNMax with Laplace(1/gamma) is the same statement: 2 gamma-DP.) The name follows the
  CLI; it is Laplace, not PATE 2018's Gaussian GNMax. P(label = 1) = P(W > n_0 - n_1) with
  W = Z_1 - Z_0, P(W > t) = exp(-t/b) (2 + t/b) / 4 for t >= 0.
* ss-laplace / ss-cauchy (AGT Cor 5.2 + Thm 5.3): mechanisms/smooth.py's release with the
  ensemble radius R in place of a single model's: (eps, delta)-DP (Laplace) or eps-DP (Cauchy).
* ptr (propose-test-release, Dwork-Lei 2009; Thakurta-Smith 2013 "distance to instability"):
  s = a stability distance of w with sensitivity 1 (s >= 1 implies every neighbour gives
  the same w):  without radii s = m - 1 (one record moves at most one vote, so m - 1
  changes cannot change w; testing m itself would be wrong);  with AGT radii s = the tight radius
  above (>= m - 1 and >= the thm5.3 radius). Draw s_hat = s + Laplace(1/eps); if
  s_hat > ln(1/delta) / eps release w exactly, else release BOTTOM (-1, "no answer").
  (eps, delta)-DP: where neighbours agree on w the output is a post-processing of s_hat
  (eps-DP); where they disagree s = 0 on both and any answer other than BOTTOM has
  probability P(Laplace(1/eps) > ln(1/delta)/eps) = delta / 2. The test is passed with
  probability 1 - exp(-eps (s - T)) / 2 for s > T and exp(-eps (T - s)) / 2 otherwise,
  T = ln(1/delta)/eps.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms._checks import Problems, binary_array, check_delta, check_epsilon, radius_array
from mechanisms.guarantee import Guarantee, check_relation
from mechanisms.noise import NOISE_KINDS, NoiseKind, make_generator
from mechanisms.smooth import flip_probability_ss, release_smooth, smooth_guarantee

TIE_CLASS = 0
BOTTOM = -1                      # PTR's "no answer"
RadiusRule = Literal["thm5.3", "tight"]
RADIUS_RULES: tuple[str, ...] = ("thm5.3", "tight")

GNMAX = "ens-gnmax"
PTR_VOTES = "ens-ptr"
PTR_AGT = "ens-ptr-agt"


# ---------------------------------------------------------------------------------------------
# Validation

def _votes(teacher_predictions: ArrayLike, problems: Problems) -> NDArray[np.int64] | None:
    arr = np.asarray(teacher_predictions)
    if arr.ndim != 2 or arr.shape[1] < 1:
        problems.data.append(f"teacher predictions must have shape (queries, teachers) with at "
                             f"least one teacher, got shape {arr.shape}")
        return None
    return binary_array(arr, problems, name="teacher predictions (binary votes)")


def _votes_and_radii(teacher_predictions: ArrayLike, teacher_radii: ArrayLike,
                     problems: Problems) -> tuple[NDArray[np.int64] | None, NDArray[np.int64] | None]:
    votes = _votes(teacher_predictions, problems)
    radii = radius_array(teacher_radii, problems, name="teacher radii")
    if votes is not None and radii is not None and radii.shape != votes.shape:
        problems.data.append(f"teacher radii must have the shape of the votes {votes.shape}, "
                             f"got {radii.shape}")
    return votes, radii


def _check_rule(rule: object, problems: Problems) -> None:
    if rule not in RADIUS_RULES:
        problems.data.append(f"radius rule must be one of {RADIUS_RULES}, got {rule!r}")


# ---------------------------------------------------------------------------------------------
# Non-private aggregation (pure, no noise)

def _counts(votes: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    n1 = votes.sum(axis=1)
    return votes.shape[1] - n1, n1


def _winner(n0: NDArray[np.int64], n1: NDArray[np.int64]) -> NDArray[np.int64]:
    return (n1 > n0).astype(np.int64)        # ties -> TIE_CLASS (0)


def _flips(n0: NDArray[np.int64], n1: NDArray[np.int64]) -> NDArray[np.int64]:
    return np.where(n1 > n0, (n1 - n0 + 1) // 2, (n0 - n1) // 2 + 1).astype(np.int64)


def vote_counts(teacher_predictions: ArrayLike) -> NDArray[np.int64]:
    """(Q, 2) int64: n_0 and n_1 per query from (Q, T) binary teacher votes."""
    problems = Problems()
    votes = _votes(teacher_predictions, problems)
    problems.raise_if_any()
    n0, n1 = _counts(votes)
    return np.stack([n0, n1], axis=1)


def aggregate(teacher_predictions: ArrayLike) -> NDArray[np.int64]:
    """Ensemble answer per query: 1 if n_1 > n_0 else 0 (a tie gives class 0)."""
    counts = vote_counts(teacher_predictions)
    return _winner(counts[:, 0], counts[:, 1])


def flips_needed(teacher_predictions: ArrayLike) -> NDArray[np.int64]:
    """m per query: the fewest votes whose change changes `aggregate` (>= 1; see module doc)."""
    counts = vote_counts(teacher_predictions)
    return _flips(counts[:, 0], counts[:, 1])


def _sum_smallest_winner_radii(votes, radii, winner, m, add_one: bool) -> NDArray[np.int64]:
    cost = radii + (1 if add_one else 0)
    big = np.iinfo(np.int64).max // (votes.shape[1] + 1)
    # losing voters are excluded by a cost no selection of m winners can reach
    masked = np.where(votes == winner[:, None], cost, big)
    ordered = np.sort(masked, axis=1)
    keep = np.arange(votes.shape[1])[None, :] < m[:, None]
    total = np.where(keep, ordered, 0).sum(axis=1)
    return (total - 1 if add_one else total).astype(np.int64)


def ensemble_radius(teacher_predictions: ArrayLike, teacher_radii: ArrayLike,
                    rule: RadiusRule = "thm5.3") -> NDArray[np.int64]:
    """Smooth radius of the ensemble answer per query (see the module docstring).

    thm5.3: sum of the m smallest radii among the teachers that voted for the winning class
    (AGT Thm 5.3); tight: sum of the m smallest (r_t + 1) among them, minus 1. Both are
    1-Lipschitz in the dataset, so exp(-beta R) is beta-smooth.
    """
    problems = Problems()
    votes, radii = _votes_and_radii(teacher_predictions, teacher_radii, problems)
    _check_rule(rule, problems)
    problems.raise_if_any()
    n0, n1 = _counts(votes)
    winner = _winner(n0, n1)
    return _sum_smallest_winner_radii(votes, radii, winner, _flips(n0, n1), rule == "tight")


def ptr_distance(teacher_predictions: ArrayLike, teacher_radii: ArrayLike | None = None
                 ) -> NDArray[np.int64]:
    """The sensitivity-1 stability distance PTR tests: m - 1 from votes alone, or the tight
    ensemble radius with AGT radii (equal to m - 1 when every radius is 0)."""
    if teacher_radii is None:
        return flips_needed(teacher_predictions) - 1
    return ensemble_radius(teacher_predictions, teacher_radii, "tight")


# ---------------------------------------------------------------------------------------------
# GS noisy argmax (PATE-style)

def gnmax_scale(epsilon: float) -> float:
    """Laplace scale b = 2 / eps per vote count (L1 sensitivity of (n_0, n_1) is 2)."""
    problems = Problems()
    check_epsilon(epsilon, problems)
    problems.raise_if_any()
    return 2.0 / float(epsilon)


def gnmax_guarantee(epsilon: float, relation: str) -> Guarantee:
    """Per-query guarantee of `release_gnmax`: pure eps-DP w.r.t. `relation`."""
    b = gnmax_scale(epsilon)
    return Guarantee(
        epsilon=float(epsilon), delta=0.0, relation=relation, mechanism=GNMAX,
        note=f"noisy argmax over the T vote counts, Laplace({b!r}) per count: one record "
             "moves one teacher's vote (L1 sensitivity 2), Laplace mechanism + post-processing")


def _difference_tail(t: NDArray[np.float64], b: float) -> NDArray[np.float64]:
    """P(Z_1 - Z_0 > t) for Z_c i.i.d. Laplace(b)."""
    u = np.abs(t) / b
    upper = np.exp(-u) * (2.0 + u) / 4.0
    return np.where(t >= 0, upper, 1.0 - upper)


def gnmax_probability_one(votes: ArrayLike, epsilon: float) -> NDArray[np.float64]:
    """Analytical P(release_gnmax gives 1) per query, from (Q, 2) counts (n_0, n_1)."""
    counts = np.asarray(votes, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[1] != 2:
        raise ValueError(f"votes must have shape (queries, 2), got {counts.shape}")
    b = gnmax_scale(epsilon)
    return _difference_tail(counts[:, 0] - counts[:, 1], b)


def release_gnmax(teacher_predictions: ArrayLike, epsilon: float, *, relation: str,
                  rng: np.random.Generator | None = None
                  ) -> tuple[NDArray[np.int64], Guarantee]:
    """label = 1[n_1 + Laplace(2/eps) > n_0 + Laplace(2/eps)] per query; eps-DP each."""
    problems = Problems()
    check_epsilon(epsilon, problems)
    check_relation(relation, problems)
    votes = _votes(teacher_predictions, problems)
    problems.raise_if_any()
    guarantee = gnmax_guarantee(epsilon, relation)
    n0, n1 = _counts(votes)
    rng = make_generator(None) if rng is None else rng
    z = rng.laplace(0.0, 2.0 / epsilon, size=(votes.shape[0], 2))
    labels = (n1 + z[:, 1] > n0 + z[:, 0]).astype(np.int64)
    return labels, guarantee


# ---------------------------------------------------------------------------------------------
# Smooth-sensitivity ensemble (Thm 5.3 + Cor 5.2)

def ss_ensemble_guarantee(epsilon: float, delta: float | None, noise: NoiseKind,
                          relation: str, rule: RadiusRule = "thm5.3") -> Guarantee:
    """Per-query guarantee of `release_ss_ensemble` (that of mechanisms/smooth.py)."""
    g = smooth_guarantee(epsilon, delta, noise, relation)
    return dataclasses.replace(
        g, mechanism=f"ens-ss-{noise}",
        note=f"ensemble radius ({rule}: sum of the m smallest radii of the winning voters"
             f"{', +1 each, -1' if rule == 'tight' else ''}; AGT Thm 5.3); {g.note}")


def release_ss_ensemble(teacher_predictions: ArrayLike, teacher_radii: ArrayLike,
                        epsilon: float, delta: float | None = None, *, noise: NoiseKind,
                        relation: str, rule: RadiusRule = "thm5.3",
                        rng: np.random.Generator | None = None
                        ) -> tuple[NDArray[np.int64], Guarantee]:
    """Smooth-sensitivity release of the ensemble answer with the ensemble radius."""
    problems = Problems()
    votes, radii = _votes_and_radii(teacher_predictions, teacher_radii, problems)
    _check_rule(rule, problems)
    if noise not in NOISE_KINDS:
        problems.privacy.append(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
    problems.raise_if_any()
    guarantee = ss_ensemble_guarantee(epsilon, delta, noise, relation, rule)
    winner = aggregate(votes)
    radius = ensemble_radius(votes, radii, rule)
    labels, _ = release_smooth(winner, radius, epsilon, delta, noise=noise, relation=relation,
                               rng=rng)
    return labels, guarantee


def ss_ensemble_flip_probability(teacher_predictions: ArrayLike, teacher_radii: ArrayLike,
                                 epsilon: float, delta: float | None, noise: NoiseKind,
                                 rule: RadiusRule = "thm5.3") -> NDArray[np.float64]:
    """Analytical P(release != aggregate) per query."""
    radius = ensemble_radius(teacher_predictions, teacher_radii, rule)
    return flip_probability_ss(epsilon, delta, radius, noise)


# ---------------------------------------------------------------------------------------------
# Propose-test-release on the vote margin

def _check_ptr(epsilon: object, delta: object, problems: Problems) -> None:
    check_epsilon(epsilon, problems)
    check_delta(delta, problems)


def ptr_threshold(epsilon: float, delta: float) -> float:
    """T = ln(1/delta) / eps: the noisy distance must exceed it for an answer."""
    problems = Problems()
    _check_ptr(epsilon, delta, problems)
    problems.raise_if_any()
    return math.log(1.0 / delta) / epsilon


def ptr_guarantee(epsilon: float, delta: float, relation: str, with_radii: bool) -> Guarantee:
    """Per-query guarantee of `release_ptr`: (eps, delta)-DP w.r.t. `relation`."""
    threshold = ptr_threshold(epsilon, delta)
    distance = ("tight ensemble radius (sum of the m smallest r_t + 1 of the winning voters, "
                "-1)" if with_radii else "m - 1 (votes that must flip, minus one)")
    return Guarantee(
        epsilon=float(epsilon), delta=float(delta), relation=relation,
        mechanism=PTR_AGT if with_radii else PTR_VOTES,
        note=f"propose-test-release: distance {distance} + Laplace(1/eps) > "
             f"ln(1/delta)/eps = {threshold!r} releases the ensemble answer, else bottom "
             "(answers where neighbours disagree have probability delta/2)")


def ptr_release_probability(distance: ArrayLike, epsilon: float, delta: float
                            ) -> NDArray[np.float64]:
    """Analytical P(the PTR test passes) for stability distance(s) s."""
    threshold = ptr_threshold(epsilon, delta)
    s = np.asarray(distance, dtype=np.float64)
    gap = epsilon * (s - threshold)
    return np.where(gap > 0, 1.0 - 0.5 * np.exp(-np.abs(gap)), 0.5 * np.exp(-np.abs(gap)))


def release_ptr(teacher_predictions: ArrayLike, epsilon: float, delta: float, *,
                relation: str, teacher_radii: ArrayLike | None = None,
                rng: np.random.Generator | None = None
                ) -> tuple[NDArray[np.int64], Guarantee]:
    """Propose-test-release per query: the exact ensemble answer, or BOTTOM (-1).

    teacher_radii None: distance m - 1 (vote flips); given: the tight AGT ensemble radius.
    """
    problems = Problems()
    _check_ptr(epsilon, delta, problems)
    check_relation(relation, problems)
    if teacher_radii is None:
        votes, radii = _votes(teacher_predictions, problems), None
    else:
        votes, radii = _votes_and_radii(teacher_predictions, teacher_radii, problems)
    problems.raise_if_any()
    guarantee = ptr_guarantee(epsilon, delta, relation, radii is not None)
    winner = aggregate(votes)
    distance = ptr_distance(votes, radii).astype(np.float64)
    rng = make_generator(None) if rng is None else rng
    noisy = distance + rng.laplace(0.0, 1.0 / epsilon, size=distance.shape)
    passed = noisy > math.log(1.0 / delta) / epsilon
    return np.where(passed, winner, BOTTOM).astype(np.int64), guarantee
