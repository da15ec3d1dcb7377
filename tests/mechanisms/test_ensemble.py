"""mechanisms/ensemble.py: vote aggregation and its tie rule, the ensemble radius against a
brute-force minimum over vote-flip sets, the winners-only rule, 1-Lipschitz radii on
abstract neighbours, and calibration of noisy argmax, SS ensemble and PTR (empirical vs
analytical probabilities, plus the DP ratio bounds of the stated guarantees)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agt.errors import DataError, PrivacyError
from mechanisms import Source, Votes, make_mechanism
from mechanisms import ensemble as me
from mechanisms.noise import make_generator
from mechanisms.smooth import flip_probability_ss

N_DRAWS = 200_000
RELATION = "replace-one"


def assert_rate(hits: np.ndarray, p: float, sigmas: float = 5.0) -> None:
    n = hits.size
    rate = float(np.mean(hits))
    se = math.sqrt(max(p * (1 - p), 1e-12) / n)
    assert abs(rate - p) <= sigmas * se + 1e-12, f"empirical {rate} vs analytical {p} (n={n})"


SOURCE = Source("ensemble", "cd" * 32, (RELATION,), True)


def rows(votes, n=N_DRAWS):
    return np.tile(np.asarray(votes, dtype=np.int64)[None, :], (n, 1))


def votes_inputs(votes, radii=None, n_classes=2, n=N_DRAWS):
    return Votes(rows(votes, n), None if radii is None else rows(radii, n), n_classes, SOURCE)


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
                          me.ensemble_radius(votes, radii, "thm5.3") + me.flips_needed(votes) - 1)


def test_winners_only_rule():
    # the losing voters have the smallest radii; they cannot change the answer by flipping
    votes = np.array([[1, 1, 1, 0, 0]])
    radii = np.array([[5, 6, 7, 0, 0]])
    assert me.flips_needed(votes)[0] == 1
    assert me.ensemble_radius(votes, radii, "thm5.3")[0] == 5
    assert me.ensemble_radius(votes, radii, "tight")[0] == 5
    votes = np.array([[0, 1, 0, 1, 0, 0, 1]])           # winner 0 by 4 to 3
    radii = np.array([[9, 0, 4, 1, 2, 8, 0]])
    assert me.ensemble_radius(votes, radii, "thm5.3")[0] == 2      # m = 1: smallest 0-voter radius
    votes = np.array([[1, 1, 1, 1, 1, 0, 0]])           # m = 2
    radii = np.array([[3, 9, 1, 7, 2, 0, 0]])
    assert me.ensemble_radius(votes, radii, "thm5.3")[0] == 3      # 1 + 2
    assert me.ensemble_radius(votes, radii, "tight")[0] == 4
    assert me.ensemble_radius(votes, radii)[0] == 4      # the default is the min-cost radius


def test_tie_rule():
    # T even, n0 == n1: the answer is class 0, one 0-voter flipping changes it (m = 1), so
    # the radius is the smallest radius among the 0-voters (not 0 as m = ceil(0/2) would give)
    votes = np.array([[0, 0, 1, 1], [1, 0, 1, 0]])
    radii = np.array([[3, 4, 1, 2], [0, 6, 0, 5]])
    assert list(me.aggregate(votes)) == [0, 0]
    assert list(me.flips_needed(votes)) == [1, 1]
    assert list(me.ensemble_radius(votes, radii, "thm5.3")) == [3, 5]
    assert list(me.ptr_distance(votes)) == [0, 0]
    assert list(me.ptr_distance(votes, radii)) == [3, 5]
    # one vote away from the tie, towards 1: the answer flips with one 1-voter
    assert me.aggregate(np.array([[0, 1, 1, 1]]))[0] == 1
    assert me.ensemble_radius(np.array([[0, 1, 1, 1]]), np.array([[0, 2, 5, 9]]), "thm5.3")[0] == 2


def test_ptr_distance_vote_flips_minus_one():
    votes = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 1]])
    assert list(me.ptr_distance(votes)) == [2, 0, 1]
    zero = np.zeros_like(votes)
    assert np.array_equal(me.ptr_distance(votes, zero), me.ptr_distance(votes))


# -- smoothness on abstract neighbours ----------------------------------------------------

@st.composite
def neighbours(draw):
    """An ensemble state (votes, radii) and a neighbour's: one teacher t changes, its radius
    by at most 1, its vote only where both radii are <= 0 (a radius >= 1 certifies the vote
    at distance 1, in both directions; -1: not even k = 0 certifies)."""
    T = draw(st.integers(1, 9))
    votes = np.asarray(draw(st.lists(st.integers(0, 1), min_size=T, max_size=T)))
    radii = np.asarray(draw(st.lists(st.integers(-1, 12), min_size=T, max_size=T)))
    t = draw(st.integers(0, T - 1))
    v2, r2 = votes.copy(), radii.copy()
    r2[t] = max(-1, radii[t] + draw(st.sampled_from([-1, 0, 1])))
    if radii[t] <= 0 and draw(st.booleans()):
        r2[t] = draw(st.sampled_from([r for r in (-1, 0) if abs(r - radii[t]) <= 1]))
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
        assert me.ensemble_radius(v, r, "thm5.3")[0] == 0
        assert me.ensemble_radius(v, r, "tight")[0] == 0 and me.ptr_distance(v, r)[0] == 0


def test_sum_over_all_voters_would_not_be_lipschitz():
    """Why winners only: taking the m smallest radii over *all* teachers is not 1-Lipschitz.
    A radius-0 winner changing its vote (a legal neighbour) lowers m from 2 to 1; the
    all-teachers sum then drops from 5 to 0, winners-only stays at 7."""
    def all_voters(v, r):
        return int(np.sort(r[0])[:me.flips_needed(v)[0]].sum())
    v, r = np.array([[1, 1, 1, 1, 0]]), np.array([[0, 7, 7, 7, 5]])
    v2 = np.array([[0, 1, 1, 1, 0]])                    # teacher 0 (radius 0) flips
    assert all_voters(v, r) == 5 and all_voters(v2, r) == 0
    assert me.ensemble_radius(v, r, "thm5.3")[0] == 7
    assert me.ensemble_radius(v2, r, "thm5.3")[0] == 7


# -- noisy argmax (PATE-style, global sensitivity) ---------------------------------------

LNMAX_DRAWS = 40_000         # exact draws cost ~10 us per count; the law is checked exactly below


@pytest.mark.parametrize("votes,eps", [
    ([1, 1, 1, 0, 0], 0.5), ([1, 1, 1, 0, 0], 2.0), ([0, 0, 0, 0, 1], 1.0),
    ([1, 1, 1, 1, 1], 0.3), ([0, 1, 0, 1], 1.0), ([1] * 20 + [0] * 5, 0.8),
])
def test_lnmax_rate_matches_analytical(votes, eps):
    mech = make_mechanism("lnmax", eps)
    inputs = votes_inputs(votes, n=LNMAX_DRAWS)
    labels = mech.release(inputs, make_generator(3))
    assert labels.dtype == np.int64 and set(np.unique(labels)) <= {0, 1}
    p1 = float(me.lnmax_probabilities(me.vote_counts(inputs.votes[:1]), eps)[0, 1])
    assert_rate(labels == 1, p1)
    assert (mech.correct_probability(inputs.subset(slice(0, 1)), np.array([1]))[0]
            == pytest.approx(p1))
    g = mech.guarantee(RELATION)
    assert (g.epsilon, g.delta, g.relation, g.mechanism) == (eps, 0.0, RELATION, "lnmax")


@pytest.mark.parametrize("votes,eps", [([0, 1, 2, 2, 2, 1, 0], 0.7), ([3, 3, 1, 0, 2, 3], 1.5),
                                       ([0, 1, 2, 3], 40.0)])
def test_lnmax_multiclass_rate_matches_exact_law(votes, eps):
    """The last case is a four-way tie of the counts with almost no noise: the released
    class is then uniform (random tie-break), not the lowest index."""
    n_classes = 4
    mech = make_mechanism("lnmax", eps)
    inputs = votes_inputs(votes, n_classes=n_classes, n=LNMAX_DRAWS)
    labels = mech.release(inputs, make_generator(8))
    p = me.lnmax_probabilities(me.vote_counts(inputs.votes[:1], n_classes), eps)[0]
    assert p.sum() == pytest.approx(1.0)
    for c in range(n_classes):
        assert_rate(labels == c, float(p[c]))


def _lnmax_by_enumeration(counts, eps):
    """P(release = y) summed over every noise vector in [-reach, reach]^C, reach with
    a^reach < e^-32 (a brute-force oracle, independent of the closed forms), ties split
    evenly."""
    a = math.exp(-eps / 2)
    z = np.arange(-math.ceil(64 / eps), math.ceil(64 / eps) + 1)
    pmf = (1 - a) / (1 + a) * a ** np.abs(z)
    grids = np.meshgrid(*([z] * len(counts)), indexing="ij")
    weight = np.prod(np.meshgrid(*([pmf] * len(counts)), indexing="ij"), axis=0)
    noisy = np.stack([n + g for n, g in zip(counts, grids)])
    won = noisy == noisy.max(axis=0)
    return (won * (weight / won.sum(axis=0))).reshape(len(counts), -1).sum(axis=1)


@pytest.mark.parametrize("counts,eps", [([2, 2], 1.0), ([3, 1], 1.0), ([0, 1, 3], 2.0),
                                        ([2, 2, 2], 3.0), ([5, 0, 1], 4.0), ([1, 0, 0, 2], 5.0),
                                        ([7, 0], 0.5), ([0, 4, 4, 1], 8.0)])
def test_lnmax_law_matches_enumeration(counts, eps):
    expected = _lnmax_by_enumeration(counts, eps)
    got = me.lnmax_probabilities(np.array([counts]), eps)[0]
    assert got == pytest.approx(expected, abs=1e-12)
    assert got.sum() == pytest.approx(1.0, abs=1e-14)


def test_lnmax_probability_hand_values():
    """Binary: the difference W = Z_1 - Z_0 of two discrete Laplace draws has
    P(W = w) = kappa^2 a^|w| ((1 + a^2) / (1 - a^2) + |w|); counts (3, 1) release 1 with
    probability P(W > 2) + P(W = 2) / 2."""
    assert me.lnmax_scale(1.0) == 2.0 and me.lnmax_rate(1.0) == Fraction(1, 2)
    a = math.exp(-0.5)
    kappa = (1 - a) / (1 + a)

    def law(w):
        return kappa ** 2 * a ** abs(w) * ((1 + a * a) / (1 - a * a) + abs(w))

    assert sum(law(w) for w in range(-400, 401)) == pytest.approx(1.0, abs=1e-14)
    one = sum(law(w) for w in range(3, 400)) + law(2) / 2
    p = me.lnmax_probabilities(np.array([[2, 2], [3, 1], [1, 3]]), 1.0)[:, 1]
    assert p == pytest.approx([0.5, one, 1 - one], abs=1e-14)
    # a third class with no chance leaves the binary law
    q = me.lnmax_probabilities(np.array([[3, 1, -1000]]), 1.0)[0]
    assert q == pytest.approx([1 - one, one, 0.0], abs=1e-14)


def test_lnmax_law_is_fast_at_tiny_epsilon():
    """The closed-form tails make the law's cost independent of the noise scale: at eps =
    3e-4 (scale 6667) the release is nearly uniform and the law still sums to 1."""
    counts = np.random.default_rng(0).multinomial(32, np.ones(10) / 10, size=50)
    p = me.lnmax_probabilities(counts, 3e-4)
    assert np.abs(p.sum(axis=1) - 1).max() < 1e-12
    assert np.all(np.abs(p - 0.1) < 0.01)


@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0])
def test_lnmax_is_eps_dp_for_one_moved_vote(eps):
    """Neighbours move one vote: (n0, n1) -> (n0 - 1, n1 + 1). Both output probabilities
    change by at most e^eps, and the bound is approached."""
    T = 60
    n1 = np.arange(0, T)
    before, after = np.stack([T - n1, n1], 1), np.stack([T - n1 - 1, n1 + 1], 1)
    a, b = (me.lnmax_probabilities(c, eps) for c in (before, after))
    ratios = np.concatenate([(b / a).ravel(), (a / b).ravel()])
    assert ratios.max() <= math.exp(eps) * (1 + 1e-9)
    if eps <= 1.0:
        assert ratios.max() > math.exp(eps) * 0.8


def test_lnmax_multiclass_is_eps_dp_for_one_moved_vote():
    eps = 0.9
    rng = np.random.default_rng(2)
    worst = 0.0
    for _ in range(60):
        counts = rng.multinomial(12, np.ones(4) / 4)[None, :]
        a_cls, b_cls = rng.choice(4, 2, replace=False)
        if counts[0, a_cls] == 0:
            continue
        moved = counts.copy()
        moved[0, a_cls] -= 1
        moved[0, b_cls] += 1
        p, q = me.lnmax_probabilities(counts, eps), me.lnmax_probabilities(moved, eps)
        worst = max(worst, float(np.abs(np.log(p / q)).max()))
    assert worst <= eps + 1e-12


def test_lnmax_at_half_the_scale_is_caught(monkeypatch):
    """Discrete Laplace at scale 1 / eps (rate eps) is not enough when a vote moves: the
    gap between two counts changes by 2, and the ratio reaches e^(2 eps) in the tails."""
    eps = 0.5
    monkeypatch.setattr(me, "lnmax_rate", lambda e: Fraction(float(e)))
    n1 = np.arange(0, 30)
    before, after = np.stack([30 - n1, n1], 1), np.stack([29 - n1, n1 + 1], 1)
    a, b = (me.lnmax_probabilities(c, eps) for c in (before, after))
    assert max((b / a).max(), (a / b).max()) > math.exp(eps) * 1.5


# -- SS ensemble --------------------------------------------------------------------------

@pytest.mark.parametrize("name,delta,rule", [("ens-ss-laplace", 1e-5, "thm5.3"),
                                             ("ens-ss-cauchy", None, "thm5.3"),
                                             ("ens-ss-laplace", 1e-3, "tight")])
def test_ss_ensemble_rate_matches_analytical(name, delta, rule):
    inputs = votes_inputs([1, 1, 1, 0, 0, 1, 1], [3, 1, 4, 0, 0, 2, 5])
    mech = make_mechanism(name, 0.5, delta, radius_rule=rule)
    labels = mech.release(inputs, make_generator(4))
    p = 1 - float(mech.correct_probability(inputs.subset(slice(0, 1)), np.array([1]))[0])
    assert 0.01 < p < 0.49
    assert_rate(labels != 1, p)
    g = mech.guarantee(RELATION)
    assert g.mechanism == name and g.relation == RELATION and g.delta == (delta or 0.0)


def test_ss_ensemble_uses_the_ensemble_radius():
    inputs = Votes(np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]),
                   np.array([[10, 20, 30, 0, 0], [1, 2, 3, 4, 5]]), 2, SOURCE)
    y = np.array([1, 0])
    for rule, radii in (("thm5.3", [10, 6]), ("tight", [10, 8]), (None, [10, 8])):
        options = {} if rule is None else {"radius_rule": rule}     # default: min-cost
        mech = make_mechanism("ens-ss-cauchy", 1.0, **options)
        assert 1 - mech.correct_probability(inputs, y) == pytest.approx(
            flip_probability_ss(1.0, None, radii, "cauchy"))


def test_ensemble_radius_mechanisms_need_smooth_radii_and_binary_votes():
    threshold = Source("e", "cd" * 32, (RELATION,), False, "threshold")
    inputs = Votes(np.array([[1, 1, 0]]), np.array([[1, 2, 0]]), 2, threshold)
    for name, delta in (("ens-ss-cauchy", None), ("ens-ptr", 1e-5), ("ens-ptr-gs", 1e-5)):
        with pytest.raises(PrivacyError, match="selection: exact"):
            make_mechanism(name, 1.0, delta).check(inputs)
    make_mechanism("lnmax", 1.0).check(inputs)               # votes only: allowed
    make_mechanism("ens-ptr-votes", 1.0, 1e-5).check(inputs)
    three = Votes(np.array([[1, 2, 0]]), np.array([[1, 2, 0]]), 3, SOURCE)
    with pytest.raises(DataError, match="at most 2 classes"):
        make_mechanism("ens-ss-cauchy", 1.0).check(three)
    make_mechanism("ens-ptr", 1.0, 1e-5).check(three)        # PTR: any number of classes


# -- propose-test-release -----------------------------------------------------------------

@pytest.mark.parametrize("votes,radii,eps,delta", [
    ([1] * 9, None, 1.0, 1e-2),             # s = m - 1 = 4, threshold 4.6
    ([1] * 9, None, 0.5, 1e-2),
    ([1, 1, 1, 0, 0], None, 2.0, 0.1),      # s = 0
    ([1, 1, 1, 0, 0], [2, 3, 1, 0, 0], 1.0, 1e-3),   # s = 1 + 1 - 1 = 1
    ([0] * 7, [5, 5, 5, 5, 5, 5, 5], 1.0, 1e-5),     # s = 4 * 6 - 1 = 23
])
def test_ptr_rate_matches_analytical(votes, radii, eps, delta):
    name = "ens-ptr-votes" if radii is None else "ens-ptr"
    mech = make_mechanism(name, eps, delta)
    inputs = votes_inputs(votes, radii)
    labels = mech.release(inputs, make_generator(5))
    winner = me.aggregate(inputs.votes[:1])[0]
    answered = labels != me.REFUSED
    assert set(np.unique(labels[answered])) <= {winner}
    s = me.ptr_distance(inputs.votes[:1], None if radii is None else inputs.radii[:1])[0]
    p = float(me.ptr_release_probability(s, eps, delta))
    assert_rate(answered, p)
    g = mech.guarantee(RELATION)
    assert (g.epsilon, g.delta, g.mechanism) == (eps, delta, name)


def test_ptr_with_gs_fallback_matches_analytical():
    inputs = votes_inputs([1, 1, 1, 0, 0], [2, 3, 1, 0, 0])
    mech = make_mechanism("ens-ptr-gs", 1.0, 1e-3)
    labels = mech.release(inputs, make_generator(6))
    assert set(np.unique(labels)) <= {0, 1}                 # the fallback always answers
    p = float(mech.correct_probability(inputs.subset(slice(0, 1)), np.array([1]))[0])
    assert_rate(labels == 1, p)
    assert mech.guarantee(RELATION).delta == 1e-3


def test_ptr_threshold_and_probability_hand_values():
    assert me.ptr_threshold(1.0, math.exp(-3)) == pytest.approx(3.0)
    # s = 0: an answer with probability P(Laplace(1/eps) > ln(1/delta)/eps) = delta / 2
    assert me.ptr_release_probability(0, 0.7, 1e-4) == pytest.approx(0.5e-4)
    assert me.ptr_release_probability(3.0, 1.0, math.exp(-3)) == pytest.approx(0.5)
    assert (me.ptr_release_probability(5.0, 1.0, math.exp(-3))
            == pytest.approx(1 - 0.5 * math.exp(-2)))


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


# -- multi-class radii --------------------------------------------------------------------

def brute_force_multiclass(votes: np.ndarray, radii: np.ndarray, n_classes: int) -> int:
    """min over sets of vote changes (each teacher to any class) that change the answer of
    sum (max(r_t, 0) + 1), minus 1."""
    T = len(votes)
    w = me.aggregate(votes[None], n_classes)[0]
    best = math.inf
    for assignment in itertools.product(range(n_classes), repeat=T):
        new = np.asarray(assignment)
        changed = new != votes
        if not changed.any() or me.aggregate(new[None], n_classes)[0] == w:
            continue
        best = min(best, int((np.maximum(radii[changed], 0) + 1).sum()))
    return best - 1


def test_min_cost_radius_equals_brute_force_for_three_classes():
    rng = np.random.default_rng(7)
    for _ in range(150):
        T = int(rng.integers(1, 6))
        votes = rng.integers(0, 3, size=T)
        radii = rng.integers(-1, 5, size=T)
        got = me.ensemble_radius(votes[None], radii[None], "tight", 3)[0]
        assert got == brute_force_multiclass(votes, radii, 3), (votes, radii)


def test_winners_only_sum_is_wrong_for_three_classes():
    """A voter for a third class can turn to the runner-up: votes w = 4, j = 3, k = 3 (T = 10):
    one cheap k-voter turning to j ties j with w, and j < w wins ties."""
    votes = np.array([[1, 1, 1, 1, 0, 0, 0, 2, 2, 2]])
    radii = np.array([[50, 50, 50, 50, 9, 9, 9, 0, 9, 9]])
    assert me.ensemble_radius(votes, radii, "tight", 3)[0] == 0       # one record suffices
    with pytest.raises(DataError, match="binary"):
        me.ensemble_radius(votes, radii, "thm5.3", 3)


@st.composite
def multiclass_neighbours(draw):
    C = draw(st.integers(2, 4))
    T = draw(st.integers(1, 8))
    votes = np.asarray(draw(st.lists(st.integers(0, C - 1), min_size=T, max_size=T)))
    radii = np.asarray(draw(st.lists(st.integers(-1, 10), min_size=T, max_size=T)))
    t = draw(st.integers(0, T - 1))
    v2, r2 = votes.copy(), radii.copy()
    r2[t] = max(-1, radii[t] + draw(st.sampled_from([-1, 0, 1])))
    if radii[t] <= 0 and draw(st.booleans()):
        r2[t] = draw(st.integers(-1, 0))
        v2[t] = draw(st.integers(0, C - 1))
    return C, votes[None], radii[None], v2[None], r2[None]


@settings(max_examples=400, deadline=None)
@given(multiclass_neighbours())
def test_multiclass_radii_are_one_lipschitz(pair):
    C, v, r, v2, r2 = pair
    for f in (lambda a, b: me.ensemble_radius(a, b, "tight", C),
              lambda a, b: me.ptr_distance(a, None, C)):
        x, y = f(v, r)[0], f(v2, r2)[0]
        assert abs(int(x) - int(y)) <= 1
    if me.aggregate(v, C)[0] != me.aggregate(v2, C)[0]:
        assert me.ensemble_radius(v, r, "tight", C)[0] == 0


# -- bad input ----------------------------------------------------------------------------

def test_bad_inputs_raise_typed_errors():
    with pytest.raises(DataError, match="classes in 0..1"):
        me.aggregate(np.array([[0, 2, 1]]), 2)
    with pytest.raises(DataError, match="shape"):
        me.vote_counts(np.array([0, 1, 1]))
    with pytest.raises(DataError, match="shape of the votes"):
        me.ensemble_radius(np.array([[0, 1, 1]]), np.array([[1, 2]]))
    with pytest.raises(DataError, match=">= -1"):
        me.ensemble_radius(np.array([[0, 1, 1]]), np.array([[1, -2, 0]]))
    with pytest.raises(DataError, match="radius rule"):
        me.ensemble_radius(np.array([[0, 1, 1]]), np.array([[1, 2, 0]]), "sum-all")
    with pytest.raises(PrivacyError, match="epsilon"):
        make_mechanism("lnmax", 0.0)
    with pytest.raises(PrivacyError, match="delta"):
        make_mechanism("ens-ptr", 1.0, 0.0)
    with pytest.raises(PrivacyError, match="delta"):
        make_mechanism("ens-ss-laplace", 1.0, None)
    with pytest.raises(PrivacyError, match="radius_rule"):
        make_mechanism("ens-ss-cauchy", 1.0, radius_rule="sum-all")
    with pytest.raises(DataError, match="Votes"):
        make_mechanism("lnmax", 1.0).check(object())


def test_ensemble_radius_stays_exact_and_lipschitz_at_huge_teacher_radii():
    """An adversarial review found teacher radii near 2**53 (which the checks accept)
    rounding in the float sums (a one-record change moved the tight radius by 4), wrapping
    int64 (thm5.3, T = 2049) and overflowing the float-to-int cast (tight, T = 2048). The
    radii are clipped to 2**52 // (T + 1) first: one teacher's radius + 1 moves the ensemble
    radius by at most 1, and no radius comes out negative."""
    for t, rule in ((5, "tight"), (5, "thm5.3"), (2048, "tight"), (2049, "thm5.3")):
        votes = np.ones((1, t), dtype=np.int64)
        votes[0, : t // 3] = 0
        for base in (2**53 - 10, 2**52, 2**40):
            radii = np.full((1, t), base, dtype=np.int64)
            moved = radii.copy()
            moved[0, -1] -= 1
            r, r2 = (int(me.ensemble_radius(votes, x, rule)[0]) for x in (radii, moved))
            assert 0 <= r <= 2**53 and 0 <= r2 <= 2**53 and abs(r - r2) <= 1


def test_df_zcdp_beta_meets_its_guarantee_exactly():
    """beta is rounded down: for every returned beta either the zCDP conversion
    rho + 2 sqrt(rho ln(1/delta)) <= eps (rho = B beta^2 / 2) or the pure bound 2 beta B <= eps
    holds exactly (an adversarial review found both exceeded by the float formulas)."""
    import mpmath

    rng = np.random.default_rng(3)
    with mpmath.workdps(60):
        for _ in range(400):
            eps = float(10 ** rng.uniform(-6, 1))
            delta = float(10 ** rng.uniform(-300, -2))
            queries = int(10 ** rng.uniform(0, 5))
            beta = me.df_zcdp_beta(eps, delta, queries)
            b = mpmath.mpf(beta)
            rho = queries * b * b / 2
            zcdp = rho + 2 * mpmath.sqrt(rho * -mpmath.log(mpmath.mpf(delta)))
            assert zcdp <= mpmath.mpf(eps) or Fraction(beta) * 2 * queries <= Fraction(eps)
