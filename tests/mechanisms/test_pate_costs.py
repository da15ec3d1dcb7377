"""Pinned argument order of the data-dependent cost functions (the reference scripts of PATE
2018 call one local-sensitivity helper with two arguments swapped), and the owner-only
boundary of the PATE costs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechanisms import make_mechanism
from mechanisms.inputs import Source, Votes
from mechanisms.pate import difference_tail
from mechanisms.pate_costs import (
    SanitisationPlan,
    SanitisedCost,
    _envelope,
    _step_table,
    gnmax_cost,
    gnmax_q,
    local_sensitivities,
    thm6_bound,
    threshold_cost,
)

SRC = Source("s", "d" * 64, ("replace-one",), True)


def test_cost_functions_take_q_then_sigma_then_order():
    q, sigma, order = 1e-6, 5.0, 8.0
    direct = float(thm6_bound(np.log(q), sigma, order))
    assert float(gnmax_cost(q, sigma, order)) == pytest.approx(direct, rel=1e-2)
    # a swap of sigma and order would give another value: the test can tell them apart
    assert float(gnmax_cost(q, order, sigma)) != pytest.approx(direct, rel=1e-2)
    # the threshold step's cost is Thm 6 at sigma_1 sqrt 2
    assert float(threshold_cost(q, sigma, order)) == pytest.approx(
        float(thm6_bound(np.log(q), sigma * np.sqrt(2), order)), rel=1e-2)


def test_envelope_is_the_bound_at_the_grid_point_above():
    env, _ = _envelope("gauss", 3.0, 4.0)
    grid = -740.0 + np.arange(148001) * 0.005        # the intended points i * 0.005 - 740
    k = 140000
    assert env[k] <= thm6_bound(grid[k], 3.0, 4.0) + 1e-300
    assert np.all(np.diff(env) >= 0)            # non-decreasing in q


def test_step_table_is_built_from_sigma_order_and_teachers_in_that_order():
    levels = _step_table(4.0, 8.0, 20)
    env, _ = _envelope("gauss", 4.0, 8.0)
    g = np.arange(-22, 23)
    tail = difference_tail(4.0, np.concatenate([g - 2, g, g + 2]))
    below, here, above = np.split(tail, 3)
    rho = max(np.max(below / here), np.max(here / above))
    shift = int(np.ceil(np.log(rho) / 0.005)) + 1
    n = len(env)
    phi = np.maximum(env[np.minimum(np.arange(n) + shift, n - 1)] - env,
                     env - env[np.maximum(np.arange(n) - shift, 0)])
    np.testing.assert_array_equal(levels[0], phi)


def test_local_sensitivity_uses_the_mechanisms_own_sigma():
    votes = np.array([[0] * 8 + [1] * 2, [1] * 6 + [0] * 4])
    inputs = Votes(votes, None, 2, SRC)
    wide = make_mechanism("gnmax", 1e6, 1e-5, sigma=3.0)
    narrow = make_mechanism("gnmax", 1e6, 1e-5, sigma=1.0)
    labels = np.array([0, 1])
    a_wide = local_sensitivities(wide, inputs, labels, 4.0, [0, 1, 2])
    a_narrow = local_sensitivities(narrow, inputs, labels, 4.0, [0, 1, 2])
    assert not np.allclose(a_wide, a_narrow)
    assert np.all(np.diff(a_wide) >= -1e-15)


def test_prepared_estimate_keeps_the_private_values_out_of_its_repr():
    votes = np.array([[0] * 8 + [1] * 2] * 3)
    inputs = Votes(votes, None, 2, SRC)
    mech = make_mechanism("gnmax", 1e6, 1e-5, sigma=2.0)
    est = SanitisedCost.prepare(mech, inputs, np.zeros(3, dtype=np.int64),
                                SanitisationPlan.default(4.0))
    text = repr(est)
    assert repr(est.value) not in text and repr(est.sensitivity) not in text
    assert "dataset_sha256" not in text


def test_gnmax_q_sorts_the_counts():
    a = gnmax_q(np.array([[7, 2, 1]]), 2.0)
    b = gnmax_q(np.array([[1, 7, 2]]), 2.0)
    np.testing.assert_array_equal(a, b)


# -- regressions of an adversarial review ------------------------------------------------------

def _votes(q=4):
    return Votes(np.array([[0] * 8 + [1] * 2] * q), None, 2, SRC)


def test_a_bogus_renyi_curve_is_refused_before_anything_is_recorded():
    import dataclasses

    from agt.errors import PrivacyError
    from mechanisms.ledger import Ledger
    from mechanisms.pate import GaussianNoisyMax

    class Bogus(GaussianNoisyMax):
        def guarantee(self, relation):
            g = super().guarantee(relation)
            return dataclasses.replace(g, rdp=(-1e9,) + g.rdp[1:])

    ledger = Ledger.in_memory(1.0, 1e-5, "rdp")
    with pytest.raises(PrivacyError, match=">= 0"):
        ledger.release(Bogus(1e6, 1e-5, sigma=5.0), _votes(), insecure_seed=0)
    assert ledger.entries() == [] and ledger.spent().epsilon == 0.0


def test_hand_built_or_subclassed_sanitised_costs_are_refused():
    from agt.errors import PrivacyError
    from mechanisms.ledger import Ledger

    plan = SanitisationPlan.default(4.0)
    for value, sens in ((float("nan"), 0.1), (1.0, float("nan")), (1.0, -1.0)):
        with pytest.raises(PrivacyError):
            SanitisedCost(plan, value, sens, "s", "d" * 64)
    with pytest.raises(PrivacyError, match="64-digit"):
        SanitisedCost(plan, 1.0, 0.1, "s", "")

    class Other(SanitisedCost):
        def draw(self, rng):
            return self.value

    ledger = Ledger.in_memory(10.0, 1e-5, "rdp")
    with pytest.raises(PrivacyError, match="SanitisedCost"):
        ledger.release_estimate(Other(plan, 1.0, 0.1, "s", "d" * 64))
    assert ledger.entries() == []


def test_a_renyi_plan_is_always_accepted_by_its_ledger():
    from mechanisms.ledger import Ledger
    from mechanisms.rdp_plan import plan_renyi

    rng = np.random.default_rng(0)
    votes = _votes(1)
    for eps in [11.240017535694893] + list(rng.uniform(0.05, 30.0, 40)):
        for name in ("gnmax", "confident-gnmax"):
            mech = plan_renyi(name, float(eps), 1e-5, 1)
            Ledger.in_memory(float(eps), 1e-5, "rdp").check_release(mech, votes)


def test_a_float32_epsilon_is_compared_in_float64():
    from agt.errors import PrivacyError

    mech = make_mechanism("gnmax", np.float32(1.0), 1e-5)
    assert mech.guarantee("replace-one").epsilon <= float(np.float32(1.0))
    with pytest.raises(PrivacyError):
        make_mechanism("gnmax", np.float32(0.5), 1e-5, sigma=1.0)


def test_the_envelope_is_read_at_a_grid_point_at_or_above_q():
    """The ln-q grid and `_grid_index` agree point by point: at q = exp(-19.5), an intended
    grid point, an np.arange grid had drifted 6.6e-10 below it, and gnmax's cost was read
    there (1.6791981667573e-09 against Theorem 6's 1.6791981678262e-09 at sigma 40, order
    2); the 1e-9 pad on q hid it."""
    from mechanisms.pate_costs import _grid_index, _logq_grid

    grid = _logq_grid()
    assert grid[0] == -740.0 and grid[-1] == 0.0 and len(grid) == 148001
    q = math.exp(-19.5)
    assert grid[_grid_index(q)] >= math.log(q)
    assert float(gnmax_cost(q, 40.0, 2.0)) >= float(thm6_bound(np.log(q), 40.0, 2.0))
    # every intended point i / 200 - 740 (and values just around it) maps to a point >= ln q
    logq = -740.0 + np.arange(0, 148001, 7) / 200.0
    logq = np.concatenate([logq, np.nextafter(logq, np.inf), np.nextafter(logq, -np.inf)])
    logq = logq[(logq <= 0.0) & (logq >= -700.0)]      # normal floats: exp and log invert
    idx = _grid_index(np.exp(logq))
    back = np.log(np.exp(logq))              # the ln q the index is computed from
    assert np.all(grid[idx] >= back)
    assert np.all(grid[np.maximum(idx - 2, 0)] < back)       # and no coarser than one step
