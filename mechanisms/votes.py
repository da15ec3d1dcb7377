"""Vote arithmetic of a teacher ensemble (AGT Sec. 5.2, Thm 5.3): pure functions, no noise.

The private dataset D is split into T disjoint parts; teacher t is trained on part t only
(agt/ensemble/partition.py assigns records by index, so under the *replace-one* relation one record
change touches one teacher). At a query x teacher t votes v_t in {0, ..., C-1} and is stable
at its radius r_t (agt/certify/; -1 where not even k = 0 certifies, used here as 0: a vote
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
        equal to min-cost - (m - 1) in the binary case, so never larger. Both are proven
        below; min-cost is the default everywhere (the tighter of two sound radii), thm5.3
        stays as an option to reproduce the paper's figures. On Blobs with T = 25 binary
        teachers a poisoning attack on every teacher meets the min-cost radius on 99 of 100
        queries (benchmarks/bench_gap.py): with these teacher certificates nothing tighter
        exists there.
Why both are 1-Lipschitz: a neighbour changes one teacher t*. If its vote stays, c_t* moves by
at most 1, and so does every minimum of sums of costs. If its vote changes, r_t* <= 0 at both
datasets (r >= 1 certifies the vote at distance 1), so any plan at one dataset is a plan at
the other for at most one more record (undo or make t*'s change at cost 1); if the answer
itself differs, R = 0 on the side that reaches the other's votes with that one change.
So R(D') >= R(D) - 1. And R >= 1 means no neighbour changes the answer (every change costs
>= R + 1 >= 2 records). Summing over *all* teachers, or for C > 2 over the w-voters only (a
voter for a third class can turn to j), is not a stability distance and is not offered.
The vote-only distance m - 1 is the min-cost radius with every r_t = 0 (also 1-Lipschitz).

"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import DataError, Problems
from mechanisms.checks import class_array, radius_array

__all__ = ["RADIUS_RULES", "vote_counts", "aggregate", "flips_needed", "ensemble_radius",
           "ptr_distance", "counts_of", "probability_of_labels"]

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


def counts_of(votes: NDArray[np.int64], n_classes: int) -> NDArray[np.int64]:
    """(Q, C) counts of validated (Q, T) votes."""
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
    return counts_of(votes, c)


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
    counts = counts_of(votes, n_classes)
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
                    rule: str = "tight", n_classes: int | None = None) -> NDArray[np.int64]:
    """Smooth radius of the ensemble answer per query (module docstring): "tight" (the
    default) is the min-cost radius (any number of classes); "thm5.3" the paper's sum of the
    m smallest winner radii (binary only), m - 1 below the min-cost radius."""
    votes, radii, c = _check_votes(teacher_predictions, n_classes, teacher_radii)
    if rule not in RADIUS_RULES:
        raise DataError(f"radius rule must be one of {RADIUS_RULES}, got {rule!r}")
    if radii is None:
        raise DataError("ensemble_radius needs teacher radii")
    # Sums of T + 1 radii must stay exact in float64 and int64: an adversarial review found
    # radii near 2**53 rounding (a one-record change moved the tight radius by 4), wrapping
    # int64 and overflowing the float-to-int cast. min(r, cap) keeps each teacher's radius
    # 1-Lipschitz under its neighbours and never claims more than r, so both proofs hold.
    radii = np.minimum(radii, 2**52 // (votes.shape[1] + 1))
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


def probability_of_labels(p: np.ndarray, y: np.ndarray) -> np.ndarray:
    """p[q, y[q]] per query from a (Q, C) table of release probabilities; 0 where y[q] is not
    a class (REFUSED, or out of range): the `_correct` of the noisy-argmax releases."""
    n_classes = p.shape[1]
    valid = (y >= 0) & (y < n_classes)
    return np.where(valid, p[np.arange(len(y)), np.clip(y, 0, n_classes - 1)], 0.0)
