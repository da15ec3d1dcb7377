"""Global- and smooth-sensitivity releases: calibration (hand values), empirical flip rates
against the analytical ones, and bad input."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agt.errors import DataError, PrivacyError
from mechanisms.global_sens import flip_probability_gs, global_guarantee, release_global
from mechanisms.guarantee import Guarantee
from mechanisms.noise import cauchy_flip_probability, laplace_flip_probability, make_generator
from mechanisms.smooth import (flip_probability_ss, noise_scale, release_smooth, smooth_beta,
                               smooth_bound, smooth_guarantee)

N_DRAWS = 200_000
RELATION = "replace-one"


def assert_rate(labels, nominal, p, sigmas=5.0):
    """Empirical flip rate within `sigmas` binomial standard errors of p."""
    n = labels.size
    rate = np.mean(labels != nominal)
    se = math.sqrt(p * (1 - p) / n)
    assert abs(rate - p) <= sigmas * se, f"flip rate {rate} vs analytical {p} (n={n})"


def alternating(n):
    return np.arange(n) % 2


# -- hand values --------------------------------------------------------------------------

def test_beta_and_scales_hand_values():
    assert smooth_beta(1.0, 1e-5, "laplace") == pytest.approx(1.0 / (2 * math.log(2e5)))
    assert smooth_beta(0.6, None, "cauchy") == pytest.approx(0.1)
    # r = 0: S = 1, Laplace 2/eps, Cauchy 6/eps.
    assert noise_scale(0.5, 1e-5, 0, "laplace") == pytest.approx(4.0)
    assert noise_scale(0.5, None, 0, "cauchy") == pytest.approx(12.0)
    # Cauchy, eps = 0.6: beta = 0.1, r = 10 -> S = e^-1, scale = 6 e^-1 / 0.6 = 10 / e.
    assert noise_scale(0.6, None, 10, "cauchy") == pytest.approx(10.0 / math.e)
    beta = 2.0 / (2 * math.log(2 / 1e-6))
    assert noise_scale(2.0, 1e-6, [0, 3, 7], "laplace") == pytest.approx(
        np.exp(-beta * np.array([0, 3, 7])))
    assert smooth_bound([0, 1, 2], 0.5) == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0)])


def test_flip_probability_hand_values():
    assert flip_probability_gs(2.0) == pytest.approx(0.5 * math.exp(-1.0))
    assert laplace_flip_probability(0.5) == pytest.approx(0.5 * math.exp(-1.0))
    assert cauchy_flip_probability(0.5) == pytest.approx(0.25)  # 1/2 - arctan(1)/pi
    assert laplace_flip_probability(0.0) == 0.0
    assert cauchy_flip_probability(0.0) == 0.0
    # SS flip probability is the noise flip probability at the calibrated scale.
    s = noise_scale(1.0, None, 4, "cauchy")
    assert flip_probability_ss(1.0, None, 4, "cauchy") == pytest.approx(
        0.5 - math.atan(1 / (2 * s)) / math.pi)


def test_guarantees_carry_relation_and_mechanism():
    _, g = release_global([0, 1], 0.7, relation="add-remove", rng=make_generator(0))
    assert g == global_guarantee(0.7, "add-remove")
    assert (g.epsilon, g.delta, g.relation, g.mechanism) == (0.7, 0.0, "add-remove", "gs")
    g = smooth_guarantee(1.0, 1e-6, "laplace", RELATION)
    assert (g.epsilon, g.delta, g.mechanism, g.relation) == (1.0, 1e-6, "ss-laplace", RELATION)
    g = smooth_guarantee(1.0, None, "cauchy", RELATION)
    assert (g.delta, g.mechanism, g.is_pure) == (0.0, "ss-cauchy", True)


# -- empirical flip rates -----------------------------------------------------------------

@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0])
def test_gs_flip_rate_matches_analytical(eps):
    f = alternating(N_DRAWS)
    labels, _ = release_global(f, eps, relation=RELATION, rng=make_generator(11))
    assert labels.dtype == np.int64 and labels.shape == f.shape
    p = flip_probability_gs(eps)
    assert_rate(labels[f == 0], 0, p)
    assert_rate(labels[f == 1], 1, p)


@pytest.mark.parametrize("noise,eps,delta", [("laplace", 1.0, 1e-5), ("laplace", 0.3, 1e-3),
                                             ("cauchy", 1.0, None), ("cauchy", 5.0, None)])
def test_ss_flip_rate_matches_analytical(noise, eps, delta):
    radii_levels = np.array([0, 5, 20, 60])
    f = alternating(N_DRAWS)
    r = np.repeat(radii_levels, N_DRAWS // len(radii_levels))
    labels, g = release_smooth(f, r, eps, delta, noise=noise, relation=RELATION,
                               rng=make_generator(7))
    assert g.mechanism == f"ss-{noise}"
    p = flip_probability_ss(eps, delta, radii_levels, noise)
    assert np.all(np.diff(p) < 0)  # larger certified radius, less noise
    for level, p_level in zip(radii_levels, p):
        mask = r == level
        assert_rate(labels[mask], f[mask], float(p_level))


def test_ss_with_radius_zero_is_at_least_as_noisy_as_gs():
    for eps in (0.1, 1.0, 10.0):
        assert flip_probability_ss(eps, 1e-5, 0, "laplace") >= flip_probability_gs(eps)
        assert flip_probability_ss(eps, None, 0, "cauchy") >= flip_probability_gs(eps)


def test_underflowing_noise_releases_the_nominal_label():
    f = alternating(1000)
    labels, _ = release_smooth(f, np.full(1000, 10**6), 10.0, None, noise="cauchy",
                               relation=RELATION, rng=make_generator(0))
    np.testing.assert_array_equal(labels, f)


@settings(max_examples=50, deadline=None)
@given(eps=st.floats(1e-3, 50.0), r=st.integers(0, 10_000),
       delta=st.floats(1e-12, 0.5), noise=st.sampled_from(["laplace", "cauchy"]))
def test_flip_probability_is_a_probability_and_shrinks_with_radius(eps, r, delta, noise):
    d = delta if noise == "laplace" else None
    p0, p1 = flip_probability_ss(eps, d, [r, r + 1], noise)
    assert 0.0 <= p1 <= p0 <= 0.5


# -- generators ---------------------------------------------------------------------------

def test_seeded_generators_reproduce_and_secure_ones_differ():
    f = alternating(500)
    a, _ = release_global(f, 0.5, relation=RELATION, rng=make_generator(3))
    b, _ = release_global(f, 0.5, relation=RELATION, rng=make_generator(3))
    np.testing.assert_array_equal(a, b)
    x, y = make_generator(None).random(8), make_generator(None).random(8)
    assert not np.array_equal(x, y)
    labels, _ = release_global(f, 0.5, relation=RELATION)  # default: OS-seeded
    assert set(np.unique(labels)) <= {0, 1}


# -- bad input: typed errors, one message naming every problem, no noise drawn ------------

@pytest.mark.parametrize("eps", [0.0, -1.0, float("nan"), float("inf"), "1", None, True])
def test_bad_epsilon_is_refused(eps):
    with pytest.raises(PrivacyError, match="epsilon"):
        release_global([0, 1], eps, relation=RELATION, rng=make_generator(0))
    with pytest.raises(PrivacyError, match="epsilon"):
        release_smooth([0, 1], [1, 2], eps, None, noise="cauchy", relation=RELATION,
                       rng=make_generator(0))
    with pytest.raises(PrivacyError, match="epsilon"):
        flip_probability_gs(eps)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 1.5, float("nan"), None])
def test_laplace_needs_delta_in_open_unit_interval(delta):
    with pytest.raises(PrivacyError, match="delta"):
        release_smooth([0, 1], [1, 2], 1.0, delta, noise="laplace", relation=RELATION,
                       rng=make_generator(0))
    with pytest.raises(PrivacyError, match="delta"):
        smooth_beta(1.0, delta, "laplace")


def test_cauchy_refuses_a_delta_and_unknown_noise_is_refused():
    with pytest.raises(PrivacyError, match="takes no delta"):
        release_smooth([0, 1], [1, 2], 1.0, 1e-5, noise="cauchy", relation=RELATION)
    with pytest.raises(PrivacyError, match="noise must be one of"):
        release_smooth([0, 1], [1, 2], 1.0, 1e-5, noise="gaussian", relation=RELATION)


@pytest.mark.parametrize("radii,match", [
    ([1.0, float("nan")], "NaN"), ([1, -2], "negative"), ([1.5, 2.0], "integers"),
    ([1.0, float("inf")], "finite"), ([True, False], "dtype"), (["1", "2"], "dtype")])
def test_bad_radii_are_refused(radii, match):
    with pytest.raises(DataError, match=match):
        release_smooth([0, 1], radii, 1.0, 1e-5, noise="laplace", relation=RELATION)
    with pytest.raises(DataError):
        noise_scale(1.0, 1e-5, radii, "laplace")


@pytest.mark.parametrize("predictions", [[0, 2], [0.5, 1], [-1, 0], [float("nan"), 1], ["a", "b"]])
def test_non_binary_predictions_are_refused(predictions):
    with pytest.raises(DataError, match="predictions"):
        release_global(predictions, 1.0, relation=RELATION)
    with pytest.raises(DataError, match="predictions"):
        release_smooth(predictions, [0, 0], 1.0, None, noise="cauchy", relation=RELATION)


def test_shape_mismatch_and_relation_are_checked():
    with pytest.raises(DataError, match="same shape"):
        release_smooth([0, 1, 1], [0, 0], 1.0, None, noise="cauchy", relation=RELATION)
    with pytest.raises(PrivacyError, match="relation"):
        release_global([0, 1], 1.0, relation="swap-two")
    with pytest.raises(PrivacyError, match="relation"):
        Guarantee(1.0, 0.0, "", "gs")


def test_all_problems_reported_together_and_no_noise_drawn():
    rng = make_generator(5)
    state = rng.bit_generator.state
    with pytest.raises(PrivacyError) as info:
        release_smooth([0, 3], [float("nan"), 1], -1.0, 2.0, noise="laplace",
                       relation="other", rng=rng)
    message = str(info.value)
    for word in ("epsilon", "delta", "relation", "predictions", "radii"):
        assert word in message
    assert "\n" not in message
    assert rng.bit_generator.state == state
