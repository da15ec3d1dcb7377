"""Mechanisms of the trade-off study (mechanisms/convex.py, the Dwork-Feldman exponential
mechanism of mechanisms/ensemble.py, ss-argmax of mechanisms/radius.py): calibration against
closed forms or Monte Carlo, exact privacy ratios on neighbouring inputs (each with a
deliberately wrong constant that breaks it), ledgered releases and bad parameters."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, stats

from agt.errors import DataError, PrivacyError
from mechanisms import Certified, Ledger, Source, Votes, make_mechanism
from mechanisms.convex import (
    LinearModel,
    analytic_gaussian_sigma,
    gaussian_delta,
    sample_norm_noise,
)
from mechanisms.ensemble import df_probabilities, df_zcdp_beta, vote_counts
from mechanisms.noise import make_generator

SHA = "ab" * 32
SRC = Source("m", SHA, ("replace-one",), True)


def linear(n_queries=6, classes=3, d=4, seed=0, sensitivity=0.05):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_queries, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True) * 1.2
    return LinearModel(rng.normal(size=(classes, d)), x, sensitivity, classes, SRC)


# -- noise samplers and calibration ----------------------------------------------------------

def test_norm_noise_has_gamma_norms_and_uniform_directions():
    rng = np.random.default_rng(0)
    d, beta = 7, 2.5
    b = sample_norm_noise(40_000, d, beta, rng)
    norms = np.linalg.norm(b, axis=1)
    assert stats.kstest(norms, stats.gamma(d, scale=1 / beta).cdf).pvalue > 1e-3
    cos = (b / norms[:, None]) @ np.eye(d)[0]
    assert abs(cos.mean()) < 0.01 and abs(cos.var() - 1 / d) < 0.01


def test_model_sensitivity_density_ratio_is_at_most_e_eps_and_tight():
    """log p(O - W) - log p(O - W') = beta (||O - W'|| - ||O - W||) <= beta ||W - W'||; the
    calibrated beta = eps / sensitivity makes the worst case exactly eps."""
    eps, sens = 0.7, 0.3
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 4))
    delta = rng.normal(size=(3, 4))
    delta *= sens / np.linalg.norm(delta)
    outs = w + rng.normal(size=(2000, 3, 4)) * 0.01
    outs = np.concatenate([outs, (w - 50 * delta)[None]])      # aligned: attains the bound

    def worst(beta):
        d1 = np.linalg.norm((outs - w).reshape(len(outs), -1), axis=1)
        d2 = np.linalg.norm((outs - w - delta).reshape(len(outs), -1), axis=1)
        return float(np.max(beta * (d2 - d1)))

    assert worst(eps / sens) <= eps + 1e-12 and worst(eps / sens) > 0.99 * eps
    assert worst(2 * eps / sens) > eps * 1.5                    # a wrong constant breaks it


@pytest.mark.parametrize("eps,delta,sens", [(0.5, 1e-5, 1.0), (2.0, 1e-3, 0.3), (8.0, 1e-6, 2.0)])
def test_analytic_gaussian_sigma_is_exact(eps, delta, sens):
    sigma = analytic_gaussian_sigma(sens, eps, delta)
    assert gaussian_delta(sigma, sens, eps) <= delta
    assert gaussian_delta(sigma * (1 - 1e-6), sens, eps) > delta * (1 - 1e-4)

    # an independent check: delta(eps) = int max(0, p - e^eps q) for p = N(0, s), q = N(D, s)
    def excess(x):
        return max(0.0, stats.norm.pdf(x, 0, sigma)
                   - math.exp(eps) * stats.norm.pdf(x, sens, sigma))
    numeric, _ = integrate.quad(excess, -40 * sigma, 40 * sigma, limit=500,
                                points=[sens / 2 - eps * sigma ** 2 / sens])
    assert numeric == pytest.approx(gaussian_delta(sigma, sens, eps), rel=1e-4, abs=1e-12)
    if eps < 1:     # better than the classical sqrt(2 ln(1.25/delta)) D / eps
        assert sigma < math.sqrt(2 * math.log(1.25 / delta)) * sens / eps


@pytest.mark.parametrize("name,delta", [("model-sens", None), ("model-sens-gauss", 1e-5),
                                        ("pred-sens", None), ("pred-sens-gauss", 1e-5)])
def test_convex_releases_match_their_probability_estimates(name, delta):
    inputs = linear()
    mech = make_mechanism(name, 2.0, delta)
    y = inputs.answer
    estimate = mech.correct_probability(inputs, y)
    draws = np.array([mech.release(inputs, make_generator(s)) for s in range(3000)])
    assert np.abs((draws == y[None]).mean(0) - estimate).max() < 0.05
    assert set(np.unique(draws)) <= {0, 1, 2}


def test_convex_guarantees_sessions_and_ledger():
    inputs = linear()
    with Ledger.in_memory(10.0, 1e-4) as ledger:
        out = ledger.release(make_mechanism("model-sens", 1.0), inputs, insecure_seed=1)
        assert not out.per_query and len(ledger.entries()) == 1        # one noisy model
        ledger.release(make_mechanism("pred-sens", 0.5), inputs, insecure_seed=2)
        assert len(ledger.entries()) == 1 + inputs.n_queries          # per query
        assert ledger.spent().epsilon == pytest.approx(1.0 + 0.5 * inputs.n_queries)


@pytest.mark.parametrize("name", ["model-sens", "model-sens-gauss", "pred-sens",
                                  "pred-sens-gauss"])
def test_convex_mechanisms_claim_replace_one_whatever_the_source_says(name):
    """The sensitivity 2K / (N lambda) keeps N fixed; a source claiming add-remove (a
    full-batch AGT bundle's, copied) got an add-remove guarantee whose eps was N / (N - 1)
    too small (a review's find)."""
    both = Source("m", SHA, ("replace-one", "add-remove"), True)
    x = linear()
    inputs = LinearModel(x.weights, x.queries, x.sensitivity, x.n_classes, both)
    mech = make_mechanism(name, 1.0, 1e-6 if name.endswith("gauss") else None)
    assert mech.relations(inputs) == ("replace-one",)
    assert mech.guarantee_for(inputs, "replace-one").relation == "replace-one"
    with pytest.raises(PrivacyError, match="replace-one"):
        mech.guarantee_for(inputs, "add-remove")
    with Ledger.in_memory(10.0, 1e-3, relation="add-remove") as ledger:
        with pytest.raises(PrivacyError):
            ledger.release(mech, inputs, insecure_seed=1)
        assert ledger.entries() == []


def test_linear_model_inputs_are_validated():
    with pytest.raises(DataError, match=r"\|\|x\|\|_2 <= 1"):
        LinearModel(np.zeros((3, 2)), np.array([[1.0, 1.0]]), 0.1, 3, SRC)
    with pytest.raises(DataError, match="sensitivity"):
        LinearModel(np.zeros((3, 2)), np.array([[0.5, 0.5]]), 0.0, 3, SRC)
    with pytest.raises(DataError, match="agree"):
        LinearModel(np.zeros((3, 2)), np.array([[0.5, 0.5, 0.0]]), 0.1, 3, SRC)
    with pytest.raises(PrivacyError, match="delta"):
        make_mechanism("model-sens-gauss", 1.0)
    with pytest.raises(PrivacyError, match="epsilon"):
        make_mechanism("pred-sens", -1.0)


# -- Dwork-Feldman ---------------------------------------------------------------------------

def worst_df_ratio(beta, T, C):
    worst = 0.0
    for votes in itertools.combinations_with_replacement(range(C), T):
        counts = np.bincount(votes, minlength=C)
        for a, b in itertools.permutations(range(C), 2):
            if counts[a] == 0:
                continue
            moved = counts.copy()
            moved[a] -= 1
            moved[b] += 1
            p = df_probabilities(counts[None], beta)[0]
            q = df_probabilities(moved[None], beta)[0]
            worst = max(worst, float(np.abs(np.log(p / q)).max()))
    return worst


def test_df_exp_constant_is_two_beta():
    """One replaced record moves one vote; the exact worst log-ratio lies between beta and
    2 beta and approaches 2 beta as beta T grows: beta = eps / 2 is eps-DP, beta = eps (the
    study's per-query value) is not."""
    eps = 1.0
    for T, C in ((6, 3), (8, 2), (5, 4)):
        assert worst_df_ratio(eps / 2, T, C) <= eps + 1e-12
    assert worst_df_ratio(eps, 8, 2) > eps * 1.3
    assert worst_df_ratio(3.0, 8, 3) > 0.95 * 6.0                 # -> 2 beta


def test_df_exp_release_and_probabilities():
    votes = Votes(np.tile([[0, 1, 1, 2, 1, 1]], (100_000, 1)), None, 3, SRC)
    mech = make_mechanism("df-exp", 1.0)
    labels = mech.release(votes, make_generator(4))
    p = df_probabilities(vote_counts(votes.votes[:1], 3), 0.5)[0]
    for k in range(3):
        assert abs(np.mean(labels == k) - p[k]) < 5 * math.sqrt(p[k] * (1 - p[k]) / 100_000)
    assert mech.guarantee("replace-one").epsilon == 1.0


def test_df_zcdp_session_beta_is_the_studys_theorem_8_value():
    eps, delta, B = 2.0, 1e-5, 100
    rho = (math.sqrt(math.log(1 / delta) + eps) - math.sqrt(math.log(1 / delta))) ** 2
    assert rho + 2 * math.sqrt(rho * math.log(1 / delta)) == pytest.approx(eps)
    beta = df_zcdp_beta(eps, delta, B)
    assert beta == pytest.approx(math.sqrt(2 / B) * (math.sqrt(math.log(1 / delta) + eps)
                                                      - math.sqrt(math.log(1 / delta))))
    assert beta > eps / (2 * B)              # better than standard composition of pure ones
    # bounded range: the privacy loss of one query spans at most 2 beta over the outputs
    counts = np.array([[5, 2, 1]])
    moved = np.array([[4, 3, 1]])
    loss = np.log(df_probabilities(counts, beta)[0] / df_probabilities(moved, beta)[0])
    assert loss.max() - loss.min() <= 2 * beta + 1e-12
    votes = Votes(np.tile([[0, 1, 1, 2]], (B, 1)), None, 3, SRC)
    with Ledger.in_memory(eps, delta) as ledger:
        out = ledger.release(make_mechanism("df-exp-zcdp", eps, delta), votes, insecure_seed=0)
        assert not out.per_query and len(ledger.entries()) == 1


# -- ss-argmax --------------------------------------------------------------------------------

def test_ss_argmax_is_ss_cauchy_for_two_classes():
    inputs = Certified(np.array([0, 1, 1, 0, 1]), np.array([-1, 0, 3, 12, 50]), 2, SRC)
    y = np.array([0, 1, 0, 0, 1])
    a = make_mechanism("ss-argmax", 0.8).correct_probability(inputs, y)
    b = make_mechanism("ss-cauchy", 0.8).correct_probability(inputs, y)
    assert np.allclose(a, b, atol=1e-9)


@pytest.mark.parametrize("n_classes", [3, 5])
def test_ss_argmax_privacy_ratio_on_neighbouring_class_radius_pairs(n_classes):
    eps = 1.0
    mech = make_mechanism("ss-argmax", eps)

    def probs(c, r):
        return mech.probabilities(Certified(np.array([c]), np.array([r]), n_classes, SRC))[0]

    worst = 0.0
    for c in range(n_classes):
        for r in range(-1, 40):
            for r2 in (r - 1, r + 1):
                if r2 >= -1:
                    worst = max(worst, float(np.abs(np.log(probs(c, r) / probs(c, r2))).max()))
        for c2 in range(n_classes):
            if c2 != c:
                for r, r2 in itertools.product((-1, 0), repeat=2):
                    worst = max(worst, float(np.abs(np.log(probs(c, r) / probs(c2, r2))).max()))
    assert worst <= eps + 1e-9
    # the release matches its exact probabilities
    inputs = Certified(np.full(60_000, 2), np.full(60_000, 4), n_classes, SRC)
    labels = mech.release(inputs, make_generator(9))
    p = probs(2, 4)
    assert np.abs(np.bincount(labels, minlength=n_classes) / 60_000 - p).max() < 0.01


def _ss_argmax_reference(n_classes: int, pred: int, s: float) -> list[float]:
    """The release law in 60-digit arithmetic (adaptive quadrature over phi, z = cot(phi))."""
    import mpmath

    with mpmath.workdps(60):
        s = mpmath.mpf(s)

        def cdf(x):
            return mpmath.atan(-1 / x) / mpmath.pi if x < 0 else 0.5 + mpmath.atan(x) / mpmath.pi

        f = [1 if pred == j else 0 for j in range(1, n_classes)]
        out = [mpmath.fprod(cdf((mpmath.mpf(1) / 2 - fj) / s) for fj in f)]
        for k in range(1, n_classes):
            fk = f[k - 1]
            width = mpmath.atan2(s, mpmath.mpf(1) / 2 - fk)

            def integrand(phi):
                score = fk + s * mpmath.cot(phi)
                return mpmath.fprod(cdf((score - f[j - 1]) / s) for j in range(1, n_classes)
                                    if j != k) / mpmath.pi
            out.append(mpmath.quad(integrand, [0, width / 2, width]))
        return [float(v) for v in out]


@pytest.mark.parametrize("eps,radius,n_classes,pred", [(30.0, 20, 3, 1), (1000.0, 3, 5, 2),
                                                       (1e6, 1, 3, 2), (1.0, 4, 4, 3),
                                                       (2.0, 30, 5, 0), (1e-300, 0, 4, 1)])
def test_ss_argmax_law_is_accurate_where_it_is_tiny(eps, radius, n_classes, pred):
    """A review found labels of probability ~1e-23 (s below ~1e-20) reported as probability
    0: 1/2 + arctan(x) / pi cancels for x << 0. Relative accuracy against 60 digits, at
    scales from 3e-266 to 1.2e301."""
    mech = make_mechanism("ss-argmax", eps)
    p = mech.probabilities(Certified(np.array([pred]), np.array([radius]), n_classes, SRC))[0]
    ref = np.array(_ss_argmax_reference(n_classes, pred, float(mech.scale(np.array([radius]),
                                                                          n_classes)[0])))
    assert np.all(ref > 0) and np.all(np.abs(p - ref) <= 1e-12 * ref)


def test_ss_argmax_privacy_ratio_holds_where_the_probabilities_are_tiny():
    """Neighbouring radii 15..60 at eps = 30 (s from 1e-16 to 1e-80): every probability is
    positive and every log-ratio within eps (it was 0 / 0 before)."""
    eps = 30.0
    mech = make_mechanism("ss-argmax", eps)
    for pred in (0, 2):
        radii = np.arange(15, 61)
        p = mech.probabilities(Certified(np.full(radii.size, pred), radii, 3, SRC))
        assert (p > 0).all()
        assert np.abs(np.log(p[1:] / p[:-1])).max() <= eps


@pytest.mark.parametrize("eps,delta", [(1.78e-6, 1e-300), (1e-4, 1e-300), (1e-6, 1e-12),
                                       (1e-10, 1e-300), (1e-12, 1e-30), (1.0, 1e-5)])
def test_analytic_gaussian_sigma_meets_delta_exactly_at_small_eps(eps, delta):
    """The float formula cancels at small eps: an adversarial review found the returned sigma
    over delta by 1.9e-4 relative at eps = 1.78e-6 and by 3e17x at eps = 1e-10. Checked here
    in decimal arithmetic with 40 digits beyond delta."""
    import mpmath

    sigma = analytic_gaussian_sigma(1.0, eps, delta)
    with mpmath.workdps(40 + int(-math.log10(delta))):
        s, e = mpmath.mpf(sigma), mpmath.mpf(eps)
        exact = mpmath.ncdf(1 / (2 * s) - e * s) - mpmath.exp(e) * mpmath.ncdf(-1 / (2 * s) - e * s)
        assert exact <= mpmath.mpf(delta)
