"""Single-model mechanism objects (gs, ss-laplace, ss-cauchy): calibration (hand values),
empirical release rates against the exact closed forms, guarantees, the smoothness-proof
gate, and bad parameters or inputs (one typed error, no noise drawn)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agt.errors import DataError, PrivacyError
from mechanisms import Certified, Guarantee, Source, make_mechanism
from mechanisms.global_sens import GlobalSensitivity, flip_probability_gs
from mechanisms.noise import cauchy_flip_probability, laplace_flip_probability, make_generator
from mechanisms.smooth import (
    SmoothSensitivity,
    flip_probability_ss,
    noise_scale,
    smooth_beta,
    smooth_bound,
)

N_DRAWS = 200_000
RELATION = "replace-one"
SHA = "ab" * 32


def source(smooth=True, relations=(RELATION,)):
    return Source("bundle", SHA, tuple(relations), smooth, "exact" if smooth else "threshold")


def certified(prediction, radius=None, n_classes=2, **kw):
    return Certified(np.asarray(prediction), None if radius is None else np.asarray(radius),
                     n_classes, source(**kw))


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
    # e^beta - 1 = eps / (2 ln(2/delta)) exactly (the papers' beta is its first order)
    assert smooth_beta(1.0, 1e-5, "laplace") == pytest.approx(math.log1p(1.0 / (2 * math.log(2e5))))
    assert smooth_beta(0.6, None, "cauchy") == pytest.approx(0.1)
    # r = 0: S = 1, Laplace 2/eps, Cauchy 6/eps.
    assert noise_scale(0.5, 1e-5, 0, "laplace") == pytest.approx(4.0)
    assert noise_scale(0.5, None, 0, "cauchy") == pytest.approx(12.0)
    # Cauchy, eps = 0.6: beta = 0.1, r = 10 -> S = e^-1, scale = 6 e^-1 / 0.6 = 10 / e.
    assert noise_scale(0.6, None, 10, "cauchy") == pytest.approx(10.0 / math.e)
    beta = math.log1p(2.0 / (2 * math.log(2 / 1e-6)))
    assert noise_scale(2.0, 1e-6, [0, 3, 7], "laplace") == pytest.approx(
        np.exp(-beta * np.array([0, 3, 7])))
    assert smooth_bound([0, 1, 2], 0.5) == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0)])
    # r = -1 (not even k = 0 certified) is used as 0: S = 1
    assert smooth_bound([-1, 0], 0.5) == pytest.approx([1.0, 1.0])


def test_flip_probability_hand_values():
    assert flip_probability_gs(2.0) == pytest.approx(0.5 * math.exp(-1.0))
    assert laplace_flip_probability(0.5) == pytest.approx(0.5 * math.exp(-1.0))
    assert cauchy_flip_probability(0.5) == pytest.approx(0.25)  # 1/2 - arctan(1)/pi
    assert laplace_flip_probability(0.0) == 0.0
    assert cauchy_flip_probability(0.0) == 0.0
    s = noise_scale(1.0, None, 4, "cauchy")
    assert flip_probability_ss(1.0, None, 4, "cauchy") == pytest.approx(
        0.5 - math.atan(1 / (2 * s)) / math.pi)


def test_registry_names_and_guarantees():
    gs = make_mechanism("gs", 0.7)
    assert isinstance(gs, GlobalSensitivity) and gs.name == "gs"
    g = gs.guarantee("add-remove")
    assert (g.epsilon, g.delta, g.relation, g.mechanism) == (0.7, 0.0, "add-remove", "gs")
    ss = make_mechanism("ss-laplace", 1.0, 1e-6)
    assert isinstance(ss, SmoothSensitivity) and ss.name == "ss-laplace"
    g = ss.guarantee(RELATION)
    assert (g.epsilon, g.delta, g.mechanism, g.relation) == (1.0, 1e-6, "ss-laplace", RELATION)
    g = make_mechanism("ss-cauchy", 1.0).guarantee(RELATION)
    assert (g.delta, g.mechanism, g.is_pure) == (0.0, "ss-cauchy", True)


def test_gs_holds_under_every_relation_ss_only_under_certified_ones():
    inputs = certified([0, 1], [3, 4], relations=("replace-one",))
    assert make_mechanism("gs", 1.0).guarantee_for(inputs, "add-remove").epsilon == 1.0
    # SS radii certified under replace-one say nothing about adding a record
    with pytest.raises(PrivacyError, match="no add-remove guarantee"):
        make_mechanism("ss-cauchy", 1.0).guarantee_for(inputs, "add-remove")
    # certified under add-remove only: converted to replace-one by group privacy (2 eps)
    inputs = certified([0, 1], [3, 4], relations=("add-remove",))
    g = make_mechanism("ss-cauchy", 1.0).guarantee_for(inputs, "replace-one")
    assert g.epsilon == 2.0 and g.relation == "replace-one" and "group privacy" in g.note


# -- empirical flip rates -----------------------------------------------------------------

@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0])
def test_gs_flip_rate_matches_analytical(eps):
    f = alternating(N_DRAWS)
    mech = make_mechanism("gs", eps)
    labels = mech.release(certified(f), make_generator(11))
    assert labels.dtype == np.int64 and labels.shape == f.shape
    p = flip_probability_gs(eps)
    assert_rate(labels[f == 0], 0, p)
    assert_rate(labels[f == 1], 1, p)
    correct = mech.correct_probability(certified(f), f)
    assert np.allclose(correct, 1 - p)


@pytest.mark.parametrize("name,eps,delta", [("ss-laplace", 1.0, 1e-5), ("ss-laplace", 0.3, 1e-3),
                                            ("ss-cauchy", 1.0, None), ("ss-cauchy", 5.0, None)])
def test_ss_flip_rate_matches_analytical(name, eps, delta):
    radii_levels = np.array([-1, 0, 5, 20, 60])
    f = alternating(N_DRAWS)
    r = np.repeat(radii_levels, N_DRAWS // len(radii_levels))
    mech = make_mechanism(name, eps, delta)
    inputs = certified(f, r)
    labels = mech.release(inputs, make_generator(7))
    noise = name.split("-")[1]
    p = flip_probability_ss(eps, delta, radii_levels, noise)
    assert p[0] == p[1]                      # r = -1 is as noisy as r = 0
    assert np.all(np.diff(p[1:]) < 0)        # larger certified radius, less noise
    for level, p_level in zip(radii_levels, p):
        mask = r == level
        assert_rate(labels[mask], f[mask], float(p_level))
    # the exact probability of a correct answer agrees with the flip probability
    correct = mech.correct_probability(inputs, f)
    assert np.allclose(correct, 1 - np.repeat(p, N_DRAWS // len(radii_levels)))


def test_ss_with_radius_zero_is_at_least_as_noisy_as_gs():
    for eps in (0.1, 1.0, 10.0):
        assert flip_probability_ss(eps, 1e-5, 0, "laplace") >= flip_probability_gs(eps)
        assert flip_probability_ss(eps, None, 0, "cauchy") >= flip_probability_gs(eps)


def test_underflowing_noise_releases_the_nominal_label():
    f = alternating(1000)
    labels = make_mechanism("ss-cauchy", 10.0).release(certified(f, np.full(1000, 10**6)),
                                                       make_generator(0))
    np.testing.assert_array_equal(labels, f)


@settings(max_examples=50, deadline=None)
@given(eps=st.floats(1e-3, 50.0), r=st.integers(0, 10_000),
       delta=st.floats(1e-12, 0.5), noise=st.sampled_from(["laplace", "cauchy"]))
def test_flip_probability_is_a_probability_and_shrinks_with_radius(eps, r, delta, noise):
    d = delta if noise == "laplace" else None
    p0, p1 = flip_probability_ss(eps, d, [r, r + 1], noise)
    assert 0.0 <= p1 <= p0 <= 0.5


def test_ss_privacy_ratio_on_neighbouring_radii():
    """Pure DP check of ss-cauchy on the output space {0, 1}: for neighbours with the same
    prediction and radii r, r' = r - 1 (and where predictions differ, both radii <= 0), every
    output's probability ratio is at most e^eps."""
    eps = 0.8
    mech = make_mechanism("ss-cauchy", eps)
    worst = 0.0
    for f in (0, 1):
        for r in range(-1, 60):
            for r2 in (r - 1, r, r + 1):
                if r2 < -1:
                    continue
                a = mech.correct_probability(certified([f], [r]), np.array([f]))[0]
                b = mech.correct_probability(certified([f], [r2]), np.array([f]))[0]
                worst = max(worst, abs(math.log(a / b)), abs(math.log((1 - a) / (1 - b))))
        for r, r2 in ((0, 0), (-1, 0), (0, -1), (-1, -1)):     # predictions differ
            a = mech.correct_probability(certified([f], [r]), np.array([f]))[0]
            b = 1 - mech.correct_probability(certified([1 - f], [r2]), np.array([1 - f]))[0]
            worst = max(worst, abs(math.log(a / b)), abs(math.log((1 - a) / (1 - b))))
    assert worst <= eps + 1e-12


@pytest.mark.parametrize("eps", [1.0, 0.5, 20.0])
def test_smooth_scales_never_underflow_at_large_radii(eps):
    """Before the exponent cap, ss-cauchy's scale 6 exp(-eps r / 6) / eps was 0 from
    r = 4471 at eps = 1 (a positive flip probability at r = 4470 against none at 4471: an
    infinite ratio) and subnormal just before (neighbouring ratios of 2 at eps = 0.5). Now
    every scale is a normal float, and neighbouring flip probabilities stay within e^beta."""
    radii = np.array([4460, 4470, 4471, 8928, 8942, 10**6, 10**9])
    beta = smooth_beta(eps, None, "cauchy")
    for r in radii:
        pair = np.array([r, r + 1])
        scale = noise_scale(eps, None, pair, "cauchy")
        assert (scale >= np.finfo(np.float64).tiny).all()
        p = flip_probability_ss(eps, None, pair, "cauchy")
        assert p[1] > 0 and p[0] / p[1] <= math.exp(beta) * (1 + 1e-12)
        assert (noise_scale(eps, 1e-6, pair, "laplace") >= np.finfo(np.float64).tiny).all()
    argmax = make_mechanism("ss-argmax", eps)
    assert (argmax.scale(radii, 5) >= np.finfo(np.float64).tiny).all()


def _worst_delta_ss_laplace(eps, delta, beta):
    """max over neighbouring (prediction, radius) pairs and both outputs of
    P_D(o) - e^eps P_D'(o) for the binary Laplace release with smoothness beta (closed-form
    flip probabilities of the scales 2 exp(-beta max(r, 0)) / eps)."""
    def flip(r):
        return 0.5 * math.exp(-eps / (4.0 * math.exp(-beta * max(r, 0))))

    worst = -1.0
    pairs = [((f, r), (f, r2)) for f in (0, 1) for r in range(-1, 6) for r2 in (r - 1, r + 1)
             if r2 >= -1]
    pairs += [((f, r), (1 - f, r2)) for f in (0, 1) for r in (-1, 0) for r2 in (-1, 0)]
    for (f, r), (g, r2) in pairs:
        for out in (0, 1):
            p = 1 - flip(r) if out == f else flip(r)
            q = 1 - flip(r2) if out == g else flip(r2)
            worst = max(worst, p - math.exp(eps) * q)
    return worst


@pytest.mark.parametrize("delta,eps_range", [(1e-6, (40.0, 56.0)), (1e-12, (85.0, 112.0)),
                                             (1e-5, (0.1, 5.0))])
def test_ss_laplace_is_eps_delta_dp_at_large_eps(delta, eps_range):
    """An adversarial review found the papers' beta = eps / (2 ln(2/delta)) above (eps, delta)
    at eps = 46.9-52.5 for delta = 1e-6 (neighbours r = 0 and 1: the flip at r = 0 has
    probability exp(-eps/4)/2, at r = 1 exp(-eps e^beta / 4)/2, and e^beta - 1 > beta). The
    mechanism's beta = ln(1 + eps / (2 ln(2/delta))) holds everywhere; the papers' fails."""
    grid = np.linspace(*eps_range, 65)
    for eps in grid:
        mech_beta = smooth_beta(float(eps), delta, "laplace")
        scale = noise_scale(float(eps), delta, [0, 1], "laplace")
        assert scale[1] == pytest.approx(scale[0] * math.exp(-mech_beta), rel=1e-12)
        assert _worst_delta_ss_laplace(float(eps), delta, mech_beta) <= delta * (1 + 1e-9)
    papers = max(_worst_delta_ss_laplace(float(e), delta, e / (2 * math.log(2 / delta)))
                 for e in grid)
    if delta < 1e-5:
        assert papers > 1.5 * delta


@pytest.mark.parametrize("name", ["ss-cauchy", "ss-argmax", "ss-laplace", "gs"])
def test_scales_stay_normal_up_to_the_largest_epsilon(name):
    """eps is refused above 1e6; at 1e6 every scale is still a normal float."""
    delta = 1e-5 if name == "ss-laplace" else None
    mech = make_mechanism(name, 1e6, delta)
    radii = np.array([-1, 0, 1, 10**4, 10**9])
    inputs = certified([1, 0, 1, 1, 0], radii)
    if name == "ss-argmax":
        scales = mech.scale(radii, 3)
    elif name == "gs":
        scales = np.array([1.0 / mech.epsilon])
    else:
        scales = mech.scale(radii)
    assert (scales >= np.finfo(np.float64).tiny).all()
    assert set(mech.release(inputs, make_generator(0)).tolist()) <= {0, 1}


def test_sparse_vector_refuses_a_threshold_beyond_any_radius():
    with pytest.raises(PrivacyError, match="2\\*\\*53"):
        make_mechanism("svt", 1e-280, 1e-5).threshold


# -- refusals ---------------------------------------------------------------------------

def test_radii_without_a_nesting_proof_are_refused_by_radius_mechanisms():
    inputs = certified([0, 1], [3, 4], smooth=False)
    for name, delta in (("ss-cauchy", None), ("ss-laplace", 1e-5)):
        with pytest.raises(PrivacyError, match="threshold.*selection: exact"):
            make_mechanism(name, 1.0, delta).release(inputs, make_generator(0))
    make_mechanism("gs", 1.0).release(inputs, make_generator(0))   # needs no radius


def test_radius_mechanisms_need_radii_and_binary_models():
    with pytest.raises(DataError, match="carry no radii"):
        make_mechanism("ss-cauchy", 1.0).check(certified([0, 1]))
    with pytest.raises(DataError, match="at most 2 classes"):
        make_mechanism("gs", 1.0).check(certified([0, 2], n_classes=3))


@pytest.mark.parametrize("eps", [0.0, -1.0, float("nan"), float("inf"), "1", None, True, 1.1e6])
def test_bad_epsilon_is_refused(eps):
    for name, delta in (("gs", None), ("ss-cauchy", None), ("ss-laplace", 1e-5)):
        with pytest.raises(PrivacyError, match="epsilon"):
            make_mechanism(name, eps, delta)
    with pytest.raises(PrivacyError, match="epsilon"):
        flip_probability_gs(eps)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 1.5, float("nan"), None])
def test_laplace_needs_delta_in_open_unit_interval(delta):
    with pytest.raises(PrivacyError, match="delta"):
        make_mechanism("ss-laplace", 1.0, delta)
    with pytest.raises(PrivacyError, match="delta"):
        smooth_beta(1.0, delta, "laplace")


def test_pure_mechanisms_refuse_a_delta_and_unknown_names_are_refused():
    with pytest.raises(PrivacyError, match="takes no delta"):
        make_mechanism("ss-cauchy", 1.0, 1e-5)
    with pytest.raises(PrivacyError, match="takes no delta"):
        make_mechanism("gs", 1.0, 1e-5)
    with pytest.raises(PrivacyError, match="noise must be one of"):
        SmoothSensitivity(1.0, 1e-5, "gaussian")
    with pytest.raises(ValueError, match="unknown mechanism 'no-such-mechanism'"):
        make_mechanism("no-such-mechanism", 1.0)


@pytest.mark.parametrize("radii,match", [
    ([1.0, float("nan")], "NaN"), ([1, -2], ">= -1"), ([1.5, 2.0], "integers"),
    ([1.0, float("inf")], "finite"), ([True, False], "dtype"), (["1", "2"], "dtype"),
    (np.array([1, 2**63], dtype=np.uint64), "2\\*\\*53"), ([1, 2**53 + 1], "2\\*\\*53")])
def test_bad_radii_are_refused(radii, match):
    with pytest.raises(DataError, match=match):
        certified([0, 1], radii)
    with pytest.raises(DataError):
        noise_scale(1.0, 1e-5, radii, "laplace")


@pytest.mark.parametrize("predictions", [[0, 2], [0.5, 1], [-1, 0], [float("nan"), 1], ["a", "b"]])
def test_predictions_outside_the_classes_are_refused(predictions):
    with pytest.raises(DataError, match="predictions"):
        certified(predictions)


def test_shape_mismatch_and_relation_are_checked():
    with pytest.raises(DataError, match="same shape"):
        certified([0, 1, 1], [0, 0])
    with pytest.raises(PrivacyError, match="relation"):
        make_mechanism("gs", 1.0).guarantee("swap-two")
    with pytest.raises(PrivacyError, match="relation"):
        Guarantee(1.0, 0.0, "", "gs")


def test_all_problems_reported_together():
    with pytest.raises(PrivacyError) as info:
        SmoothSensitivity(-1.0, 2.0, "laplace")
    message = str(info.value)
    assert "epsilon" in message and "delta" in message and "\n" not in message
    with pytest.raises(DataError) as info:
        Certified(np.array([0, 3]), np.array([float("nan"), 1.0]), 2, source())
    assert "predictions" in str(info.value) and "radii" in str(info.value)


def test_release_needs_a_generator_and_draws_nothing_on_refusal():
    rng = make_generator(5)
    state = rng.bit_generator.state
    with pytest.raises(PrivacyError):
        make_mechanism("ss-cauchy", 1.0).release(certified([0, 1], [0, 1], smooth=False), rng)
    assert rng.bit_generator.state == state
    with pytest.raises(PrivacyError, match="Generator"):
        make_mechanism("gs", 1.0).release(certified([0, 1]), 3)


def test_secure_generators_differ_and_seeded_ones_reproduce():
    f = alternating(500)
    mech = make_mechanism("gs", 0.5)
    a = mech.release(certified(f), make_generator(3))
    b = mech.release(certified(f), make_generator(3))
    np.testing.assert_array_equal(a, b)
    x, y = make_generator(None).random(8), make_generator(None).random(8)
    assert not np.array_equal(x, y)


def test_gs_scales_are_rounded_up():
    """A Laplace scale rounded down breaks eps-DP at tiny eps (the slack (e^(eps/2) - 1)^2 is
    below one rounding of 1/eps): the scales are the floats at or above sensitivity / eps."""
    from fractions import Fraction

    from mechanisms.noise import laplace_scale_up

    rng = np.random.default_rng(4)
    for eps in np.concatenate([10 ** rng.uniform(-17, 3, 2000), [0.1, 0.3, 3.0]]):
        for sens in (1.0, 2.0):
            scale = laplace_scale_up(sens, float(eps))
            assert Fraction(scale) >= Fraction(sens) / Fraction(float(eps))
            assert Fraction(math.nextafter(scale, 0.0)) < Fraction(sens) / Fraction(float(eps))


def test_add_remove_to_replace_one_delta_is_never_recorded_too_small():
    """(eps, delta) under add-remove is (2 eps, (1 + e^eps) delta) under replace-one; the
    recorded delta must be at least the exact value (one ulp of padding was not enough)."""
    import mpmath

    rng = np.random.default_rng(5)
    with mpmath.workdps(50):
        for _ in range(3000):
            eps, delta = float(10 ** rng.uniform(-6, 1)), float(10 ** rng.uniform(-15, -6))
            g = Guarantee(eps, delta, "add-remove", "dp-sgd", "test").in_relation("replace-one")
            exact = (1 + mpmath.exp(mpmath.mpf(eps))) * mpmath.mpf(delta)
            assert mpmath.mpf(g.delta) >= exact and g.epsilon == 2 * eps


def test_laplace_beta_is_never_rounded_above_its_exact_value():
    """The log1p beta meets the dilation condition with equality: a float one ulp above it
    exceeds delta. Against 50 digits over eps in [1e-300, 1e6] and delta down to 5e-324."""
    import mpmath

    rng = np.random.default_rng(3)
    with mpmath.workdps(50):
        for _ in range(2000):
            eps, delta = float(10 ** rng.uniform(-300, 6)), float(10 ** rng.uniform(-323, -1e-4))
            exact = min(mpmath.log1p(mpmath.mpf(eps) / (2 * (mpmath.log(2) - mpmath.log(delta)))),
                        mpmath.mpf(eps) / 2)
            beta = smooth_beta(eps, delta, "laplace")
            assert mpmath.mpf(beta) <= exact and mpmath.mpf(beta) >= exact * (1 - 1e-13)


@pytest.mark.parametrize("index", [slice(1, 4), slice(None, None, -2), slice(7, 99),
                                   np.array([4, 0, 4]), np.array([True, False] * 3),
                                   [2, -1]])
def test_subset_takes_the_rows_of_checked_inputs_without_checking_again(index):
    """A 1-D selection gives what the checked constructor gives for the same rows (ids
    included), read-only like the inputs it came from; a single position is refused."""
    from mechanisms import Votes

    source = Source("s", "d" * 64, ("replace-one",), True)
    ids = tuple(f"{i:064x}" for i in range(6))
    pred, radius = np.array([0, 2, 1, 1, 0, 2]), np.array([-1, 0, 5, 3, 2, 9])
    full = Certified(pred, radius, 3, source, ids)
    part = full.subset(index)
    want = Certified(pred[index], radius[index], 3, source,
                     tuple(np.asarray(ids)[index].tolist()))
    assert part.prediction.tolist() == want.prediction.tolist()
    assert part.radius.tolist() == want.radius.tolist()
    assert part.query_ids == want.query_ids and part.n_classes == 3 and part.source is source
    assert part.prediction.dtype == np.int64 and part.radius.dtype == np.int64
    for arr in (full.prediction, full.radius, part.prediction, part.radius):
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 1
    votes = Votes(np.stack([pred, pred]).T, np.stack([radius, radius]).T, 3, source, ids)
    vpart = votes.subset(index)
    assert vpart.votes.tolist() == np.stack([pred, pred]).T[index].tolist()
    assert vpart.query_ids == want.query_ids and not vpart.votes.flags.writeable
    with pytest.raises(DataError, match="1-D"):
        full.subset(2)                 # one row, not a run of queries
