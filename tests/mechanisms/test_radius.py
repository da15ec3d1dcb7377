"""Radius mechanisms (mechanisms/radius.py): the exponential mechanism on the radius, PTR on a
single model's radius and the stability-gated sparse-vector session. Exact privacy ratios on
neighbouring inputs (each test also shows that a deliberately wrong constant breaks it),
calibration against Monte Carlo draws, sessions, ledger records and bad parameters."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from agt.errors import BudgetExceededError, DataError, PrivacyError
from mechanisms import Certified, Ledger, Source, Votes, make_mechanism
from mechanisms.ensemble import ensemble_radius
from mechanisms.noise import discrete_laplace_cdf, discrete_laplace_pmf, make_generator
from mechanisms.radius import (
    discrete_difference_tail,
    exp_flip_probability,
    exp_probabilities,
    gated_correct_probability,
    svt_rates,
    svt_threshold,
)
from tests.helpers import IntegersOnly

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

def test_discrete_difference_tail_matches_enumeration():
    """P(rho - nu >= s) against the convolution of the two laws (summed to e^-60)."""
    for g1, g2 in ((0.5, 0.25), (1.0, 0.5), (0.05, 0.025), (3.0, 0.1)):
        reach = int(60 / g2)
        z = np.arange(-reach, reach + 1)
        law = np.convolve(discrete_laplace_pmf(z, g1), discrete_laplace_pmf(z, g2)[::-1])
        values = np.arange(-2 * reach, 2 * reach + 1)
        for s in (-5, 0, 1, 2, 7, 30, 200):
            exact = float(law[values >= s].sum())
            assert discrete_difference_tail(s, g1, g2) == pytest.approx(exact, rel=1e-12)
    with pytest.raises(ValueError):
        discrete_difference_tail(3, 0.25, 0.5)


def test_threshold_meets_delta_and_is_the_smallest():
    for eps, c, delta in ((1.0, 1, 1e-5), (10.0, 10, 1e-5), (0.5, 3, 1e-3), (0.05, 2, 1e-9)):
        t = svt_threshold(eps, c, delta, eps)
        g1, g2 = (float(r) for r in svt_rates(eps, c))
        assert (g1, g2) == (eps / c / 2, eps / c / 4)
        assert isinstance(t, int) and t > 0

        def bound(threshold):
            return (1 + math.exp(eps)) * c * discrete_difference_tail(threshold + 1, g1, g2)

        assert bound(t) <= delta < bound(t - 1)


def _tail_by_summation(s, g1, g2):
    """P(rho - nu >= s) at 40 digits by summing P(nu = y) P(rho >= s + y) directly."""
    with mpmath.workdps(40):
        a, b = mpmath.exp(-g1), mpmath.exp(-g2)

        def survival(m):                    # P(rho >= m)
            return a ** m / (1 + a) if m >= 0 else 1 - a ** (1 - m) / (1 + a)

        reach = int(80 / g2) + abs(s)
        return mpmath.fsum((1 - b) / (1 + b) * b ** abs(y) * survival(s + y)
                           for y in range(-reach, reach + 1))


def test_threshold_holds_exactly_at_the_boundary_and_beyond_eps_700():
    """An adversarial review found delta = 0.2838578317809405 (eps 1, c = 1) where the float
    q(8) passed and the exact one did not; and eps > 700, where (1 + e^eps) was capped at
    1 + e^700. Both are checked against 40-digit sums of the law."""
    t = svt_threshold(1.0, 1, 0.2838578317809405, 1.0)
    g1, g2 = (float(r) for r in svt_rates(1.0, 1))
    with mpmath.workdps(40):
        assert (1 + mpmath.e) * _tail_by_summation(t + 1, g1, g2) <= mpmath.mpf(0.2838578317809405)
    assert t == 9
    t = svt_threshold(800.0, 1, 0.9, 900.0)
    g1, g2 = (float(r) for r in svt_rates(800.0, 1))
    with mpmath.workdps(40):
        assert (1 + mpmath.exp(900)) * _tail_by_summation(t + 1, g1, g2) <= mpmath.mpf(0.9)
        assert (1 + mpmath.exp(900)) * _tail_by_summation(t, g1, g2) > mpmath.mpf(0.9)


def test_gate_and_fallbacks_spend_at_most_eps_exactly():
    """eps1 = eps_gate / c exactly, and the fallbacks' eps rounded down: the session's total
    c eps1 + c eps_fb never exceeds eps as rationals (a review found 1.5e-16 excess)."""
    for eps in (0.3, 1.0, 0.7, 2.9, 1e-3):
        for cutoff in (1, 3, 7, 10):
            for share in (0.1, 0.3, 0.5, 0.9):
                mech = make_mechanism("svt", eps, 1e-5, cutoff=cutoff, fallback_share=share)
                rate_rho, _ = mech.rates
                total = 2 * rate_rho * cutoff + cutoff * Fraction(mech.eps_fallback)
                assert total <= Fraction(eps)


def test_coarse_gate_law_is_close_to_the_exact_sum():
    """Wide threshold noises (eps1 < 0.018) are summed in blocks; against the exact sum over
    every integer the difference stays below 1e-5."""
    radius = np.random.default_rng(0).integers(-5, 400, 30)
    for g1 in (0.004, 0.0005):
        args = (np.ones(30, bool), np.full(30, 0.3), radius, 200, g1, g1 / 2, 3)
        exact = gated_correct_probability(*args, max_points=10**7)
        coarse = gated_correct_probability(*args)
        assert np.abs(exact - coarse).max() < 1e-5


def transcript_probabilities(radii, threshold, rate_rho, rate_nu, cutoff):
    """Exact probability of every stable/unstable transcript of a session on `radii`
    (queries after the cutoff are refused, so transcripts stop there), summing over the
    integer threshold noise (|rho| with mass above e^-40 left out and renormalised)."""
    reach = int(40 / rate_rho)
    rho = np.arange(-reach, reach + 1)
    w = discrete_laplace_pmf(rho, rate_rho)
    w /= w.sum()

    def stable(r):                        # P(nu < r - T + rho)
        return discrete_laplace_cdf(r - threshold + rho - 1, rate_nu)

    out = {}
    for pattern in itertools.product((0, 1), repeat=len(radii)):   # 1 = unstable
        p, inst, tops = 1.0, np.ones(rho.size), 0
        valid = True
        for i, top in enumerate(pattern):
            if tops >= cutoff:
                valid = valid and top == 0      # after the cutoff nothing is tested
                continue
            if top:
                p *= float(((inst * (1 - stable(radii[i]))) * w).sum())
                inst, tops = np.ones(rho.size), tops + 1
            else:
                inst = inst * stable(radii[i])
        if not valid:
            continue
        p *= float((inst * w).sum())
        out[pattern] = p
    return out


def worst_transcript_ratio(eps1, query_scale, cutoff=1, length=3):
    rate_rho, rate_nu = eps1 / 2, eps1 / query_scale
    t = 6
    worst = 0.0
    base = [4, 7, 5]
    for shifts in itertools.product((-1, 0, 1), repeat=length):
        r1 = base[:length]
        r2 = [r + s for r, s in zip(r1, shifts)]
        p = transcript_probabilities(r1, t, rate_rho, rate_nu, cutoff)
        q = transcript_probabilities(r2, t, rate_rho, rate_nu, cutoff)
        for k in p:
            worst = max(worst, abs(math.log(p[k] / q[k])))
    return worst


@pytest.mark.parametrize("cutoff", [1, 2])
def test_gate_transcript_is_eps_dp_and_a_wrong_query_scale_is_not(cutoff):
    eps1 = 1.0
    assert worst_transcript_ratio(eps1, 4.0, cutoff) <= cutoff * eps1 + 1e-9
    # query noise of scale 2/eps1 (a known broken variant for non-monotone scores) fails
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
    g1, g2, t = 0.5, 0.25, 3
    for r in (-1, 0, 3, 8):
        p = gated_correct_probability(np.array([True]), np.array([0.0]), np.array([r]), t, g1,
                                      g2, 1)[0]
        # stable iff r - t > nu - rho: P = P(rho - nu > t - r) = P(rho - nu >= t - r + 1)
        assert p == pytest.approx(discrete_difference_tail(t - r + 1, g1, g2), abs=1e-13)


def test_session_draws_only_exact_integers():
    """The gate's noises are exact discrete Laplace draws: a generator offering only
    uniform integers runs a whole session, fallbacks included (the draw itself; `release`
    insists on a numpy Generator)."""
    mech = make_mechanism("svt", 3.0, 1e-5, cutoff=3)
    radius = np.array([10**6, -1, 10**6, -1, 3, 10**6, -1, -1])
    labels = mech._draw(certified(np.ones(8, int), radius, 3), IntegersOnly(9))
    assert labels[0] == 1 and labels[2] == 1 and (labels[-2:] == -1).all()


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
