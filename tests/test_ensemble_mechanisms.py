"""mechanisms/ensemble.py: vote aggregation and its tie rule, the ensemble radius against a
brute-force minimum over vote-flip sets, the winners-only rule, 1-Lipschitz radii on
abstract neighbours, and calibration of noisy argmax, SS ensemble and PTR (empirical vs
analytical probabilities, plus the DP ratio bounds of the stated guarantees)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agt.errors import DataError, PrivacyError
from mechanisms import ensemble as me
from mechanisms.noise import make_generator

N_DRAWS = 200_000
RELATION = "replace-one"


def assert_rate(hits: np.ndarray, p: float, sigmas: float = 5.0) -> None:
    n = hits.size
    rate = float(np.mean(hits))
    se = math.sqrt(max(p * (1 - p), 1e-12) / n)
    assert abs(rate - p) <= sigmas * se + 1e-12, f"empirical {rate} vs analytical {p} (n={n})"


def rows(votes, n=N_DRAWS):
    return np.tile(np.asarray(votes, dtype=np.int64)[None, :], (n, 1))


# -- aggregation, tie rule, flips ---------------------------------------------------------

@pytest.mark.parametrize("votes,winner,m", [
    ([1, 1, 0], 1, 1),
    ([1, 1, 1, 0, 0], 1, 1),
    ([1, 1, 1, 1, 0], 1, 2),
    ([1, 1, 1, 1, 1], 1, 3),
    ([1, 1, 1, 1], 1, 2),            # flipping 2 reaches a tie, which gives 0
    ([0, 0, 0, 0], 0, 3),            # flipping 2 reaches a tie, which stays 0
    ([0, 0, 0, 1], 0, 2),
    ([0, 0, 1], 0, 1),
    ([1, 0], 0, 1),                  # tie: the fixed class 0; one 0-voter turning to 1 changes it
    ([0, 0, 1, 1], 0, 1),
    ([1], 1, 1),
    ([0], 0, 1),
])
def test_winner_and_flips_hand_values(votes, winner, m):
    v = np.asarray([votes])
    assert me.aggregate(v)[0] == winner
    assert me.flips_needed(v)[0] == m
    assert list(me.vote_counts(v)[0]) == [len(votes) - sum(votes), sum(votes)]


def brute_force(votes: np.ndarray, radii: np.ndarray):
    """Minimum over all sets F of teachers whose vote changes change the ensemble answer of
    |F|, sum r_t (Thm 5.3 cost) and sum (r_t + 1) - 1 (records needed, minus one); and the
    same minimum over sets of winning voters only."""
    T = len(votes)
    w = me.aggregate(votes[None])[0]
    best = {"flips": math.inf, "thm": math.inf, "tight": math.inf, "thm_winners": math.inf}
    for size in range(1, T + 1):
        for F in itertools.combinations(range(T), size):
            flipped = votes.copy()
            flipped[list(F)] = 1 - flipped[list(F)]
            if me.aggregate(flipped[None])[0] == w:
                continue
            cost = int(radii[list(F)].sum())
            best["flips"] = min(best["flips"], size)
            best["thm"] = min(best["thm"], cost)
            best["tight"] = min(best["tight"], cost + size - 1)
            if all(votes[t] == w for t in F):
                best["thm_winners"] = min(best["thm_winners"], cost)
    return best


def test_radius_equals_brute_force_minimum_over_flip_sets():
    rng = np.random.default_rng(0)
    checked = 0
    for T in range(1, 8):
        for votes in itertools.product([0, 1], repeat=T):
            votes = np.asarray(votes, dtype=np.int64)
            for _ in range(3):
                radii = rng.integers(0, 6, size=T)
                bf = brute_force(votes, radii)
                v, r = votes[None], radii[None]
                assert me.flips_needed(v)[0] == bf["flips"]
                assert me.ensemble_radius(v, r, "thm5.3")[0] == bf["thm"]
                assert me.ensemble_radius(v, r, "tight")[0] == bf["tight"]
                # the cheapest flip set only uses winning voters (winners-only rule)
                assert bf["thm_winners"] == bf["thm"]
                checked += 1
    assert checked > 700


def test_radius_vectorised_over_queries_matches_per_query():
    rng = np.random.default_rng(1)
    votes = rng.integers(0, 2, size=(500, 9))
    radii = rng.integers(0, 30, size=(500, 9))
    for rule in me.RADIUS_RULES:
        batch = me.ensemble_radius(votes, radii, rule)
        single = [me.ensemble_radius(votes[i:i + 1], radii[i:i + 1], rule)[0] for i in range(500)]
        assert np.array_equal(batch, single)
    assert np.array_equal(me.ensemble_radius(votes, radii, "tight"),
                          me.ensemble_radius(votes, radii) + me.flips_needed(votes) - 1)


def test_winners_only_rule():
    # the losing voters have the smallest radii; they cannot change the answer by flipping
    votes = np.array([[1, 1, 1, 0, 0]])
    radii = np.array([[5, 6, 7, 0, 0]])
    assert me.flips_needed(votes)[0] == 1
    assert me.ensemble_radius(votes, radii)[0] == 5
    assert me.ensemble_radius(votes, radii, "tight")[0] == 5
    votes = np.array([[0, 1, 0, 1, 0, 0, 1]])           # winner 0 by 4 to 3
    radii = np.array([[9, 0, 4, 1, 2, 8, 0]])
    assert me.ensemble_radius(votes, radii)[0] == 2      # m = 1: smallest 0-voter radius
    votes = np.array([[1, 1, 1, 1, 1, 0, 0]])           # m = 2
    radii = np.array([[3, 9, 1, 7, 2, 0, 0]])
    assert me.ensemble_radius(votes, radii)[0] == 3      # 1 + 2
    assert me.ensemble_radius(votes, radii, "tight")[0] == 4


def test_tie_rule():
    # T even, n0 == n1: the answer is class 0, one 0-voter flipping changes it (m = 1), so
    # the radius is the smallest radius among the 0-voters (not 0 as m = ceil(0/2) would give)
    votes = np.array([[0, 0, 1, 1], [1, 0, 1, 0]])
    radii = np.array([[3, 4, 1, 2], [0, 6, 0, 5]])
    assert list(me.aggregate(votes)) == [0, 0]
    assert list(me.flips_needed(votes)) == [1, 1]
    assert list(me.ensemble_radius(votes, radii)) == [3, 5]
    assert list(me.ptr_distance(votes)) == [0, 0]
    assert list(me.ptr_distance(votes, radii)) == [3, 5]
    # one vote away from the tie, towards 1: the answer flips with one 1-voter
    assert me.aggregate(np.array([[0, 1, 1, 1]]))[0] == 1
    assert me.ensemble_radius(np.array([[0, 1, 1, 1]]), np.array([[0, 2, 5, 9]]))[0] == 2


def test_ptr_distance_vote_flips_minus_one():
    votes = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 1]])
    assert list(me.ptr_distance(votes)) == [2, 0, 1]
    zero = np.zeros_like(votes)
    assert np.array_equal(me.ptr_distance(votes, zero), me.ptr_distance(votes))


# -- smoothness on abstract neighbours ----------------------------------------------------

@st.composite
def neighbours(draw):
    """An ensemble state (votes, radii) and a neighbour's: one teacher t changes, its radius
    by at most 1, its vote only where both radii are 0 (a radius >= 1 certifies the vote at
    distance 1, in both directions)."""
    T = draw(st.integers(1, 9))
    votes = np.asarray(draw(st.lists(st.integers(0, 1), min_size=T, max_size=T)))
    radii = np.asarray(draw(st.lists(st.integers(0, 12), min_size=T, max_size=T)))
    t = draw(st.integers(0, T - 1))
    v2, r2 = votes.copy(), radii.copy()
    r2[t] = max(0, radii[t] + draw(st.sampled_from([-1, 0, 1])))
    if radii[t] == 0 and draw(st.booleans()):
        r2[t] = 0
        v2[t] = 1 - votes[t]
    return votes[None], radii[None], v2[None], r2[None]


@settings(max_examples=400, deadline=None)
@given(neighbours())
def test_radii_are_one_lipschitz_on_neighbours(pair):
    v, r, v2, r2 = pair
    for f in (lambda a, b: me.ensemble_radius(a, b, "thm5.3"),
              lambda a, b: me.ensemble_radius(a, b, "tight"),
              lambda a, b: me.ptr_distance(a, b),
              lambda a, b: me.ptr_distance(a)):
        a, b = f(v, r)[0], f(v2, r2)[0]
        assert abs(int(a) - int(b)) <= 1
    # and the ensemble radius is a stability distance: no answer change unless it is 0
    if me.aggregate(v)[0] != me.aggregate(v2)[0]:
        assert me.ensemble_radius(v, r)[0] == 0 and me.ptr_distance(v, r)[0] == 0


def test_sum_over_all_voters_would_not_be_lipschitz():
    """Why winners only: taking the m smallest radii over *all* teachers is not 1-Lipschitz.
    A radius-0 winner changing its vote (a legal neighbour) lowers m from 2 to 1; the
    all-teachers sum then drops from 5 to 0, winners-only stays at 7."""
    def all_voters(v, r):
        return int(np.sort(r[0])[:me.flips_needed(v)[0]].sum())
    v, r = np.array([[1, 1, 1, 1, 0]]), np.array([[0, 7, 7, 7, 5]])
    v2 = np.array([[0, 1, 1, 1, 0]])                    # teacher 0 (radius 0) flips
    assert all_voters(v, r) == 5 and all_voters(v2, r) == 0
    assert me.ensemble_radius(v, r)[0] == 7 and me.ensemble_radius(v2, r)[0] == 7


# -- noisy argmax (PATE-style, global sensitivity) ---------------------------------------

@pytest.mark.parametrize("votes,eps", [
    ([1, 1, 1, 0, 0], 0.5), ([1, 1, 1, 0, 0], 2.0), ([0, 0, 0, 0, 1], 1.0),
    ([1, 1, 1, 1, 1], 0.3), ([0, 1, 0, 1], 1.0), ([1] * 20 + [0] * 5, 0.8),
])
def test_gnmax_rate_matches_analytical(votes, eps):
    v = rows(votes)
    labels, g = me.release_gnmax(v, eps, relation=RELATION, rng=make_generator(3))
    assert labels.dtype == np.int64 and set(np.unique(labels)) <= {0, 1}
    p1 = float(me.gnmax_probability_one(me.vote_counts(v[:1]), eps)[0])
    assert_rate(labels == 1, p1)
    assert (g.epsilon, g.delta, g.relation, g.mechanism) == (eps, 0.0, RELATION, me.GNMAX)


def test_gnmax_probability_hand_values():
    b = me.gnmax_scale(1.0)
    assert b == 2.0
    assert me.gnmax_probability_one(np.array([[2, 2]]), 1.0)[0] == pytest.approx(0.5)
    # P(W > t) = e^{-t/b} (2 + t/b) / 4: counts (3, 1) -> P(label 1) = P(W > 2) = e^-1 3/4
    assert me.gnmax_probability_one(np.array([[3, 1]]), 1.0)[0] == pytest.approx(0.75 / math.e)
    assert me.gnmax_probability_one(np.array([[1, 3]]), 1.0)[0] == pytest.approx(1 - 0.75 / math.e)


@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0])
def test_gnmax_is_eps_dp_for_one_moved_vote(eps):
    """Neighbours move one vote: (n0, n1) -> (n0 - 1, n1 + 1). Both output probabilities
    change by at most e^eps, and the bound is approached (the calibration is not loose by
    more than the analysis)."""
    T = 60
    n1 = np.arange(0, T)
    before, after = np.stack([T - n1, n1], 1), np.stack([T - n1 - 1, n1 + 1], 1)
    a, b = (me.gnmax_probability_one(c, eps) for c in (before, after))
    # P(label 0) from swapped counts (no cancellation in 1 - p)
    a0, b0 = (me.gnmax_probability_one(c[:, ::-1], eps) for c in (before, after))
    assert np.allclose(a + a0, 1.0)
    ratios = np.concatenate([b / a, a / b, a0 / b0, b0 / a0])
    assert ratios.max() <= math.exp(eps) * (1 + 1e-9)
    if eps <= 1.0:
        assert ratios.max() > math.exp(eps) * 0.8


# -- SS ensemble --------------------------------------------------------------------------

@pytest.mark.parametrize("noise,delta,rule", [("laplace", 1e-5, "thm5.3"), ("cauchy", None, "thm5.3"),
                                              ("laplace", 1e-3, "tight")])
def test_ss_ensemble_rate_matches_analytical(noise, delta, rule):
    votes = rows([1, 1, 1, 0, 0, 1, 1])
    radii = rows([3, 1, 4, 0, 0, 2, 5])
    eps = 0.5
    labels, g = me.release_ss_ensemble(votes, radii, eps, delta, noise=noise, relation=RELATION,
                                       rule=rule, rng=make_generator(4))
    p = float(me.ss_ensemble_flip_probability(votes[:1], radii[:1], eps, delta, noise, rule)[0])
    assert 0.01 < p < 0.49
    assert_rate(labels != 1, p)
    assert g.mechanism == f"ens-ss-{noise}" and g.relation == RELATION
    assert g.delta == (delta or 0.0)


def test_ss_ensemble_uses_the_ensemble_radius():
    from mechanisms.smooth import flip_probability_ss
    votes = np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    radii = np.array([[10, 20, 30, 0, 0], [1, 2, 3, 4, 5]])
    p = me.ss_ensemble_flip_probability(votes, radii, 1.0, None, "cauchy")
    assert p == pytest.approx(flip_probability_ss(1.0, None, [10, 6], "cauchy"))
    p = me.ss_ensemble_flip_probability(votes, radii, 1.0, None, "cauchy", "tight")
    assert p == pytest.approx(flip_probability_ss(1.0, None, [10, 8], "cauchy"))


# -- propose-test-release -----------------------------------------------------------------

@pytest.mark.parametrize("votes,radii,eps,delta", [
    ([1] * 9, None, 1.0, 1e-2),             # s = m - 1 = 4, threshold 4.6
    ([1] * 9, None, 0.5, 1e-2),
    ([1, 1, 1, 0, 0], None, 2.0, 0.1),      # s = 0
    ([1, 1, 1, 0, 0], [2, 3, 1, 0, 0], 1.0, 1e-3),   # s = 1 + 1 - 1 = 1
    ([0] * 7, [5, 5, 5, 5, 5, 5, 5], 1.0, 1e-5),     # s = 4 * 6 - 1 = 23
])
def test_ptr_rate_matches_analytical(votes, radii, eps, delta):
    v = rows(votes)
    r = None if radii is None else rows(radii)
    labels, g = me.release_ptr(v, eps, delta, relation=RELATION, teacher_radii=r,
                               rng=make_generator(5))
    winner = me.aggregate(v[:1])[0]
    answered = labels != me.BOTTOM
    assert set(np.unique(labels[answered])) <= {winner}
    s = me.ptr_distance(v[:1], None if r is None else r[:1])[0]
    p = float(me.ptr_release_probability(s, eps, delta))
    assert_rate(answered, p)
    assert (g.epsilon, g.delta) == (eps, delta)
    assert g.mechanism == (me.PTR_VOTES if radii is None else me.PTR_AGT)


def test_ptr_threshold_and_probability_hand_values():
    assert me.ptr_threshold(1.0, math.exp(-3)) == pytest.approx(3.0)
    # s = 0: an answer with probability P(Laplace(1/eps) > ln(1/delta)/eps) = delta / 2
    assert me.ptr_release_probability(0, 0.7, 1e-4) == pytest.approx(0.5e-4)
    assert me.ptr_release_probability(3.0, 1.0, math.exp(-3)) == pytest.approx(0.5)
    assert me.ptr_release_probability(5.0, 1.0, math.exp(-3)) == pytest.approx(1 - 0.5 * math.exp(-2))


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-6), (1.0, 1e-3), (4.0, 0.05)])
def test_ptr_guarantee_ratios(eps, delta):
    """(eps, delta)-DP: neighbours with the same answer have distances s, s + 1 and every
    output probability within e^eps; where the answer differs s = 0 on both sides and any
    answer has probability delta / 2 <= delta."""
    threshold = me.ptr_threshold(eps, delta)
    s = np.arange(0, int(threshold + 30 / eps))

    def fail(d):                          # P(no answer), without cancellation
        gap = eps * (d - threshold)
        return np.where(gap > 0, 0.5 * np.exp(-np.abs(gap)), 1 - 0.5 * np.exp(-np.abs(gap)))

    a, b = me.ptr_release_probability(s, eps, delta), me.ptr_release_probability(s + 1, eps, delta)
    assert np.allclose(a + fail(s), 1.0)
    ratios = np.concatenate([b / a, a / b, fail(s) / fail(s + 1), fail(s + 1) / fail(s)])
    assert ratios.max() <= math.exp(eps) * (1 + 1e-9)
    assert me.ptr_release_probability(0, eps, delta) <= delta / 2 * (1 + 1e-12)


# -- bad input ----------------------------------------------------------------------------

def test_bad_inputs_raise_typed_errors():
    with pytest.raises(DataError, match="0 or 1"):
        me.aggregate(np.array([[0, 2, 1]]))
    with pytest.raises(DataError, match="shape"):
        me.vote_counts(np.array([0, 1, 1]))
    with pytest.raises(DataError, match="shape of the votes"):
        me.ensemble_radius(np.array([[0, 1, 1]]), np.array([[1, 2]]))
    with pytest.raises(DataError, match=">= 0"):
        me.ensemble_radius(np.array([[0, 1, 1]]), np.array([[1, -2, 0]]))
    with pytest.raises(DataError, match="radius rule"):
        me.ensemble_radius(np.array([[0, 1, 1]]), np.array([[1, 2, 0]]), "sum-all")
    with pytest.raises(PrivacyError, match="epsilon"):
        me.release_gnmax(np.array([[0, 1, 1]]), 0.0, relation=RELATION)
    with pytest.raises(PrivacyError, match="relation"):
        me.release_gnmax(np.array([[0, 1, 1]]), 1.0, relation="bounded")
    with pytest.raises(PrivacyError, match="delta"):
        me.release_ptr(np.array([[0, 1, 1]]), 1.0, 0.0, relation=RELATION)
    with pytest.raises(PrivacyError, match="delta"):
        me.release_ss_ensemble(np.array([[0, 1, 1]]), np.array([[1, 2, 0]]), 1.0, None,
                               noise="laplace", relation=RELATION)
    with pytest.raises(PrivacyError, match="noise"):
        me.release_ss_ensemble(np.array([[0, 1, 1]]), np.array([[1, 2, 0]]), 1.0, None,
                               noise="gauss", relation=RELATION)
