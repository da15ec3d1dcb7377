"""The audit: its statistics, its power against planted bugs, its false-alarm rate on the
correct mechanisms (tests/mechanisms/planted.py), and its interface."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agt.errors import ConfigError, DataError
from mechanisms.audit import audit, epsilon_lower_bound, exact_loss
from mechanisms.audit.stats import clopper_pearson_lower, clopper_pearson_upper
from mechanisms.global_sens import GlobalSensitivity
from mechanisms.radius import ExponentialRadius, RadiusPTR
from tests.mechanisms.planted import (
    HalvedNoise,
    RadiusOffByOne,
    ReplaceOneOnAddRemove,
    SessionOfExpRadius,
    ThresholdOneStepLow,
    certified,
)

SEEDS = range(10)

# (planted, correct twin, first input, neighbour, relation, releases per side): the
# neighbours are those that make the bug visible and that the correct twin handles
CASES = {
    "radius off by one": (RadiusOffByOne(1.0), ExponentialRadius(1.0),
                          certified([(0, 0)]), certified([(1, 0)]), None, 400),
    "noise scale halved": (HalvedNoise(1.0), GlobalSensitivity(1.0),
                           certified([(0, 0)]), certified([(1, 0)]), None, 1500),
    "composition ignored": (SessionOfExpRadius(1.0), SessionOfExpRadius(1.0, composed=True),
                            certified([(0, 0)] * 3), certified([(1, 0)] * 3), None, 500),
    "replace-one claim on add-remove": (
        ReplaceOneOnAddRemove(1.0), ExponentialRadius(1.0),
        certified([(0, 2)], relations=("add-remove",)),
        certified([(0, 0)], relations=("add-remove",)), "replace-one", 3000),
    # at eps 2 a step of the threshold multiplies the tail by e^2: 0.37 against delta 0.1
    "ptr threshold one step low": (ThresholdOneStepLow(2.0, 0.1), RadiusPTR(2.0, 0.1),
                                   certified([(0, 0)]), certified([(1, 0)]), None, 1000),
}


@pytest.mark.parametrize("case", CASES)
def test_every_planted_bug_is_caught_over_seeds_and_its_correct_twin_never_flagged(case):
    planted, correct, a, b, relation, n = CASES[case]
    caught = [audit(planted, a, b, relation=relation, samples=n, seed=s, exact=False).violated
              for s in SEEDS]
    flagged = [audit(correct, a, b, relation=relation, samples=n, seed=100 + s,
                     exact=False).violated for s in SEEDS]
    assert all(caught), f"{case}: caught in {sum(caught)} of {len(caught)} seeds"
    assert not any(flagged), f"{case}: the correct mechanism flagged in {sum(flagged)} seeds"


def test_the_correct_claim_converts_add_remove_to_replace_one():
    a = certified([(0, 2)], relations=("add-remove",))
    b = certified([(0, 0)], relations=("add-remove",))
    result = audit(ExponentialRadius(1.0), a, b, relation="replace-one", samples=400, seed=0)
    assert result.claim_epsilon == 2.0
    planted = audit(ReplaceOneOnAddRemove(1.0), a, b, relation="replace-one", samples=400)
    assert planted.claim_epsilon == 1.0
    # the exact loss of this pair is above the planted claim: the bug is real
    assert 1.7 < result.exact_loss < 1.75


def test_a_tight_mechanism_is_audited_close_to_its_exact_loss():
    """exp-radius's different-answer pair at r = 0 has exact loss eps."""
    result = audit(ExponentialRadius(1.0), certified([(0, 0)]), certified([(1, 0)]),
                   samples=40_000, seed=3)
    assert result.exact_loss == pytest.approx(1.0, abs=1e-12)
    assert 0.9 < result.lower_bound <= 1.0 and not result.violated
    assert result.verdict == "claim holds"


def test_clopper_pearson_bounds_have_their_coverage():
    """Over many binomial draws the one-sided bounds fail at most alpha of the time (exact
    binomial probabilities, no sampling)."""
    from scipy.stats import binom

    n, alpha = 60, 0.05
    k = np.arange(n + 1)
    lo, hi = clopper_pearson_lower(k, n, alpha), clopper_pearson_upper(k, n, alpha)
    for p in np.linspace(0.01, 0.99, 37):
        pmf = binom.pmf(k, n, p)
        assert pmf[lo > p].sum() <= alpha + 1e-12
        assert pmf[hi < p].sum() <= alpha + 1e-12
    assert lo[0] == 0.0 and hi[-1] == 1.0


def test_the_lower_bound_formula():
    # p_lo - delta <= 0 shows nothing
    assert float(epsilon_lower_bound(10, 0, 1000, 0.5, 0.05)) == 0.0
    n, alpha = 10_000, 0.05
    value = float(epsilon_lower_bound(7000, 3000, n, 0.0, alpha))
    p_lo = float(clopper_pearson_lower(7000, n, alpha / 2))
    q_hi = float(clopper_pearson_upper(3000, n, alpha / 2))
    assert value == pytest.approx(math.log(p_lo / q_hi))
    assert value < math.log(7 / 3)


def test_exact_loss_is_the_hockey_stick_epsilon():
    p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    assert exact_loss(p, q, 0.0) == pytest.approx(math.log(2.5))
    # with delta the best event is still a likelihood-ratio set: {0} gives ln(0.4 / 0.2)
    assert exact_loss(p, q, 0.1) == pytest.approx(math.log(0.4 / 0.2))
    assert exact_loss([0.5, 0.5], [1.0, 0.0], 0.0) == math.inf
    assert exact_loss([0.5, 0.5], [0.5, 0.5], 0.0) == 0.0


def test_the_result_records_its_inputs_and_plots(tmp_path):
    result = audit(ExponentialRadius(1.0), certified([(0, 0)]), certified([(1, 0)]),
                   samples=200, seed=7)
    again = audit(ExponentialRadius(1.0), certified([(0, 0)]), certified([(1, 0)]),
                  samples=200, seed=7)
    assert result.frequencies_a == again.frequencies_a      # seeded: reproducible
    d = result.to_dict()
    assert d["verdict"] == "claim holds" and d["samples"] == 200 and d["seed"] == 7
    assert sum(result.frequencies_a) == pytest.approx(1.0)
    assert result.outcomes == ((0,), (1,))
    path = result.plot(tmp_path / "audit.png")
    assert path.stat().st_size > 1000
    assert "claim holds" in result.summary()


def test_bad_arguments_are_refused():
    a, b = certified([(0, 0)]), certified([(1, 0)])
    with pytest.raises(ConfigError, match="samples"):
        audit(ExponentialRadius(1.0), a, b, samples=10)
    with pytest.raises(ConfigError, match="confidence"):
        audit(ExponentialRadius(1.0), a, b, confidence=1.5)
    with pytest.raises(DataError, match="n_queries"):
        audit(ExponentialRadius(1.0), a, certified([(1, 0), (1, 0)]))
    with pytest.raises(ConfigError, match="protocol"):
        audit(object(), a, b)


def test_the_literal_r_for_r_plus_1_utility_is_still_eps_dp():
    """The docs' claim: exp-radius with utility -r (not -(r + 1)) is noisier, not leakier;
    its exact loss over every neighbouring pair stays eps (so the planted bug reads the
    radius one too high instead)."""
    from mechanisms.audit.cases import certified_pairs
    from mechanisms.radius import exp_probabilities

    for c in (2, 3, 10):
        for eps in (0.1, 1.0, 3.0):
            worst = max(exact_loss(exp_probabilities(p.first.prediction, p.first.radius - 1,
                                                     eps, c)[0],
                                   exp_probabilities(p.second.prediction, p.second.radius - 1,
                                                     eps, c)[0], 0.0)
                        for p in certified_pairs(c, max_radius=12))
            assert worst <= eps * (1 + 1e-9)
            # reading the radius one too high doubles it at the different-answer pair
            high = exact_loss(exp_probabilities(np.array([0]), np.array([1]), eps, c)[0],
                              exp_probabilities(np.array([1]), np.array([1]), eps, c)[0], 0.0)
            assert high == pytest.approx(2 * eps)
