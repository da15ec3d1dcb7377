"""Radius mechanisms (mechanisms/radius.py): the exponential mechanism on the radius, PTR on a
single model's radius and the stability-gated sparse-vector session. Exact privacy ratios on
neighbouring inputs (each test also shows that a deliberately wrong constant breaks it),
calibration against Monte Carlo draws, sessions, ledger records and bad parameters."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from agt.errors import BudgetExceededError, DataError, PrivacyError
from mechanisms import Certified, Ledger, Source, Votes, make_mechanism
from mechanisms.ensemble import ensemble_radius
from mechanisms.noise import make_generator
from mechanisms.radius import (exp_flip_probability, exp_probabilities,
                               gated_correct_probability, laplace_difference_tail,
                               svt_threshold)

SHA = "ab" * 32
SRC = Source("b", SHA, ("replace-one",), True)
K_MAX = 40


def certified(pred, radius, n_classes=2):
    return Certified(np.asarray(pred), np.asarray(radius), n_classes, SRC)


def assert_rate(hits, p, sigmas=5.0):
    n = hits.size
    se = math.sqrt(max(p * (1 - p), 1e-12) / n)
    assert abs(float(np.mean(hits)) - p) <= sigmas * se + 1e-12


# -- exponential mechanism on the radius --------------------------------------------------

def neighbour_pairs(n_classes):
    """(c, r, c', r') of neighbouring datasets: same answer and |r - r'| <= 1, or different
    answers with both radii <= 0 (P1, P2), at every grid edge."""
    radii = list(range(-1, K_MAX + 1))
    for c in range(min(n_classes, 3)):
        for r in radii:
            for r2 in (r - 1, r, r + 1):
                if -1 <= r2 <= K_MAX:
                    yield c, r, c, r2
        for c2 in range(n_classes):
            if c2 != c:
                for r, r2 in itertools.product((-1, 0), repeat=2):
                    yield c, r, c2, r2


def worst_log_ratio(prob, n_classes, eps):
    worst = 0.0
    for c, r, c2, r2 in neighbour_pairs(n_classes):
        p = prob(np.array([c]), np.array([r]), eps, n_classes)[0]
        q = prob(np.array([c2]), np.array([r2]), eps, n_classes)[0]
        worst = max(worst, float(np.abs(np.log(p / q)).max()))
    return worst


@pytest.mark.parametrize("n_classes", [2, 3, 10])
@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0])
def test_exp_radius_is_eps_dp_on_neighbouring_class_radius_pairs(n_classes, eps):
    worst = worst_log_ratio(exp_probabilities, n_classes, eps)
    assert worst <= eps + 1e-12
    assert worst > (1 - 1e-9) * eps     # the tight constant: the bound is attained


def test_a_wrong_constant_breaks_the_exp_radius_ratio():
    """Weights exp(2 eps u) (the constant doubled): the same check fails."""
    def wrong(answer, radius, eps, n_classes):
        return exp_probabilities(answer, radius, 2 * eps, n_classes)
    assert worst_log_ratio(wrong, 3, 1.0) > 1.0 + 1e-3


def test_exp_radius_closed_form_and_draws():
    eps = 1.0
    # eps = 1, r = 20, binary: e^-21 (the generic exp(eps u / 2) would give ~3e-5)
    assert exp_flip_probability(20, eps, 2) == pytest.approx(math.exp(-21) / (1 + math.exp(-21)))
    assert exp_flip_probability(-1, eps, 10) == pytest.approx(0.9)     # r = -1: uniform
    n = 200_000
    for n_classes, r in ((2, 0), (3, 2), (10, 1), (10, -1)):
        mech = make_mechanism("exp-radius", eps)
        pred = np.full(n, 1)
        labels = mech.release(certified(pred, np.full(n, r), n_classes), make_generator(3))
        p = float(exp_flip_probability(r, eps, n_classes))
        assert_rate(labels != 1, p)
        others = labels[labels != 1]
        if n_classes > 2:                                      # uniform over the others
            counts = np.bincount(others, minlength=n_classes)
            counts = np.delete(counts, 1)
            assert counts.min() > 0.8 * counts.mean()
        correct = mech.correct_probability(certified(pred[:3], np.full(3, r), n_classes),
                                           np.array([1, 0, 1]))
        assert correct == pytest.approx([1 - p, p / (n_classes - 1), 1 - p])


def test_ens_exp_radius_uses_the_min_cost_radius():
    votes = np.array([[0, 1, 2, 2, 2, 1], [1, 1, 1, 1, 0, 0]])
    radii = np.array([[3, 0, 5, 1, 2, 9], [4, -1, 2, 7, 0, 0]])
    inputs = Votes(votes, radii, 3, SRC)
    mech = make_mechanism("ens-exp-radius", 0.7)
    r = ensemble_radius(votes, radii, "tight", 3)
    got = 1 - mech.correct_probability(inputs, np.array([2, 1]))
    assert got == pytest.approx(exp_flip_probability(r, 0.7, 3))


# -- PTR on one model's radius ------------------------------------------------------------

def test_single_ptr_rates_and_ratio():
    eps, delta = 1.0, 1e-4
    mech = make_mechanism("ptr", eps, delta)
    n = 200_000
    for r in (-1, 0, 9, 20):
        labels = mech.release(certified(np.ones(n, int), np.full(n, r), 3), make_generator(r + 5))
        assert set(np.unique(labels)) <= {-1, 1}
        p = float(mech.correct_probability(certified([1], [r], 3), np.array([1]))[0])
        assert_rate(labels == 1, p)
    # where answers differ (r <= 0 both), an answer has probability <= delta / 2
    p0 = mech.correct_probability(certified([1, 1], [0, -1], 3), np.array([1, 1]))
    assert (p0 <= delta / 2 * (1 + 1e-12)).all()


# -- the sparse vector gate ---------------------------------------------------------------

def test_laplace_difference_tail_against_monte_carlo():
    rng = np.random.default_rng(0)
    a, b = 2.0, 4.0
    d = rng.laplace(0, a, 1_000_000) - rng.laplace(0, b, 1_000_000)
    for t in (0.0, 1.0, 5.0, 15.0, -3.0):
        p = laplace_difference_tail(t, a, b)
        assert_rate(d > t, p)


def test_threshold_meets_delta():
    for eps, c, delta in ((1.0, 1, 1e-5), (10.0, 10, 1e-5), (0.5, 3, 1e-3)):
        t = svt_threshold(eps, c, delta, eps)
        a, b = 2.0 * c / eps, 4.0 * c / eps
        assert (1 + math.exp(eps)) * c * laplace_difference_tail(t, a, b) <= delta * (1 + 1e-9)
        assert (1 + math.exp(eps)) * c * laplace_difference_tail(0.999 * t, a, b) > delta


def transcript_probabilities(radii, threshold, a, b, cutoff, points=4001):
    """Exact (quadrature) probability of every stable/unstable transcript of a session on
    `radii` (queries after the cutoff are refused, so transcripts stop there)."""
    rho = np.linspace(-40 * a, 40 * a, points)
    w = np.exp(-np.abs(rho) / a) / (2 * a) * (rho[1] - rho[0])
    w[[0, -1]] *= 0.5
    w /= w.sum()

    def stable(r):
        x = r - threshold + rho
        return np.where(x < 0, 0.5 * np.exp(np.minimum(x, 0) / b),
                        1 - 0.5 * np.exp(-np.maximum(x, 0) / b))

    out = {}
    for pattern in itertools.product((0, 1), repeat=len(radii)):   # 1 = unstable
        p, inst, tops = 1.0, np.ones(points), 0
        valid = True
        for i, top in enumerate(pattern):
            if tops >= cutoff:
                valid = valid and top == 0      # after the cutoff nothing is tested
                continue
            if top:
                p *= float(((inst * (1 - stable(radii[i]))) * w).sum())
                inst, tops = np.ones(points), tops + 1
            else:
                inst = inst * stable(radii[i])
        if not valid:
            continue
        p *= float((inst * w).sum())
        out[pattern] = p
    return out


def worst_transcript_ratio(eps1, query_scale, cutoff=1, length=3):
    a, b = 2.0 / eps1, query_scale / eps1
    t = 6.0
    worst = 0.0
    base = [4, 7, 5]
    for shifts in itertools.product((-1, 0, 1), repeat=length):
        r1 = base[:length]
        r2 = [r + s for r, s in zip(r1, shifts)]
        p = transcript_probabilities(r1, t, a, b, cutoff)
        q = transcript_probabilities(r2, t, a, b, cutoff)
        for k in p:
            worst = max(worst, abs(math.log(p[k] / q[k])))
    return worst


@pytest.mark.parametrize("cutoff", [1, 2])
def test_gate_transcript_is_eps_dp_and_a_wrong_query_scale_is_not(cutoff):
    eps1 = 1.0
    assert worst_transcript_ratio(eps1, 4.0, cutoff) <= cutoff * eps1 + 1e-6
    # query noise Laplace(2/eps1) (a known broken variant for non-monotone scores) fails
    assert worst_transcript_ratio(eps1, 2.0, 1) > eps1 + 1e-3


def test_session_refuses_after_the_cutoff_and_is_one_ledger_entry():
    mech = make_mechanism("svt", 2.0, 1e-5, cutoff=2, fallback="refuse")
    t = mech.threshold
    radius = np.array([1000] * 5 + [-1] * 4 + [1000] * 5)
    inputs = certified(np.ones(14, int), radius)
    with Ledger.in_memory(2.0, 1e-5) as ledger:
        out = ledger.release(mech, inputs, insecure_seed=1)
        assert len(ledger.entries()) == 1 and "session of 14 queries" in ledger.entries()[0].note
        assert not out.per_query
        assert ledger.spent().epsilon == 2.0
        with pytest.raises(BudgetExceededError):
            ledger.release(mech, inputs)                 # the whole budget was the session
    labels = out.labels
    assert (labels[:5] == 1).all()                          # far above the threshold: free
    assert (labels[5:] == -1).all()                         # two unstable, then refused
    assert t > 0


def test_session_expected_accuracy_matches_simulation():
    eps, delta = 4.0, 1e-4
    mech = make_mechanism("svt", eps, delta, cutoff=3)
    t = mech.threshold
    rng = np.random.default_rng(1)
    radius = np.concatenate([np.full(6, int(t + 30)), rng.integers(-1, int(t), 6),
                             np.full(6, int(t + 5))])
    rng.shuffle(radius)
    pred = rng.integers(0, 3, size=18)
    y = np.where(rng.random(18) < 0.8, pred, (pred + 1) % 3)
    inputs = certified(pred, radius, 3)
    expected = mech.correct_probability(inputs, y)
    draws = np.array([mech.release(inputs, make_generator(s)) == y for s in range(3000)])
    assert np.abs(draws.mean(0) - expected).max() < 0.035
    assert abs(draws.mean() - expected.mean()) < 0.01


def test_gated_probability_reduces_to_a_single_query_closed_form():
    a, b, t = 2.0, 4.0, 3.0
    for r in (-1, 0, 3, 8):
        p = gated_correct_probability(np.array([True]), np.array([0.0]), np.array([r]), t, a,
                                      b, 1)[0]
        # stable iff r - t > nu - rho: P = P(rho - nu > t - r)
        assert p == pytest.approx(laplace_difference_tail(t - r, a, b), abs=1e-5)


def test_radius_mechanisms_refuse_bad_parameters_and_inputs():
    with pytest.raises(PrivacyError, match="cutoff"):
        make_mechanism("svt", 1.0, 1e-5, cutoff=0)
    with pytest.raises(PrivacyError, match="fallback"):
        make_mechanism("svt", 1.0, 1e-5, fallback="gnmax")
    with pytest.raises(PrivacyError, match="delta"):
        make_mechanism("svt", 1.0)
    with pytest.raises(PrivacyError, match="takes no delta"):
        make_mechanism("exp-radius", 1.0, 1e-5)
    with pytest.raises(PrivacyError, match="epsilon"):
        make_mechanism("ptr", 0.0, 1e-5)
    threshold = Certified(np.array([0, 1]), np.array([2, 3]), 2,
                          Source("b", SHA, ("replace-one",), False, "threshold"))
    for name, delta in (("exp-radius", None), ("ptr", 1e-5), ("svt", 1e-5)):
        with pytest.raises(PrivacyError, match="selection: exact"):
            make_mechanism(name, 1.0, delta).check(threshold)
    with pytest.raises(DataError, match="carry no radii"):
        make_mechanism("exp-radius", 1.0).check(Certified(np.array([0, 1]), None, 2, SRC))
