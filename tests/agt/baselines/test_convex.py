"""Convex baselines: the logistic fit reaches its tolerance, the replace-one sensitivity bound
2K/(N lambda) holds on real neighbouring datasets, the unit-ball map is data-independent and
refuses records it cannot bound, and the bias trap (an unscaled bias coordinate breaks
K = sqrt 2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from agt.baselines.convex import LIPSCHITZ, fit_logistic, logit_gradient, sensitivity_bound
from agt.baselines.unit_ball import UnitBallMap, check_unit_ball, pca_basis
from agt.errors import ConfigError, DataError


def raw(n=80, d=6, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 17, size=(n, d)).astype(float), rng.integers(0, 3, size=n)


def test_fit_reaches_tolerance_and_neighbours_stay_within_the_bound():
    x, y = raw()
    unit = UnitBallMap(0.0, 16.0, 6, bias=True)
    z = unit.transform(x)
    lam = 0.05
    fit = fit_logistic(z, y, 3, lam, tol=1e-10)
    assert fit.grad_norm <= 1e-10
    worst = 0.0
    rng = np.random.default_rng(1)
    for i in range(12):                   # replace one record by an extreme one
        x2, y2 = x.copy(), y.copy()
        x2[i] = rng.choice([0.0, 16.0], size=6)
        y2[i] = (y[i] + 1) % 3
        w2 = fit_logistic(unit.transform(x2), y2, 3, lam, tol=1e-10).weights
        worst = max(worst, float(np.linalg.norm(fit.weights - w2)))
    bound = sensitivity_bound(len(y), lam, grad_tol=1e-10)
    assert 0 < worst <= bound
    assert worst > 0.05 * bound           # the bound is not vacuous on these neighbours


def test_gradient_norm_below_k_and_the_bias_trap():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(1000, 10)) * 20
    y = rng.integers(0, 10, size=1000)
    # sup, approached (in floats reached) as one wrong logit dominates
    assert np.linalg.norm(logit_gradient(a, y), axis=1).max() <= LIPSCHITZ * (1 + 1e-15)
    # an unscaled bias coordinate: ||[x, 1]|| = sqrt 2 makes ||g z^T|| exceed K
    g = logit_gradient(np.array([[30.0, -30.0]]), np.array([1]))
    z = np.array([1.0, 1.0])               # [x, 1] with ||x|| = 1
    assert np.linalg.norm(np.outer(g, z)) > LIPSCHITZ
    # the map's bias coordinate keeps the whole vector in the ball
    zb = UnitBallMap(0.0, 16.0, 4, bias=True).transform(np.full((1, 4), 16.0))
    assert np.linalg.norm(zb) <= 1.0


def test_unit_ball_refusals():
    unit = UnitBallMap(0.0, 16.0, 3)
    with pytest.raises(DataError, match="outside the public range"):
        unit.transform(np.array([[0.0, 17.0, 1.0]]))
    with pytest.raises(DataError, match="UnitBallMap"):
        check_unit_ball(np.array([[1.0, 0.5]]))
    with pytest.raises(DataError):
        fit_logistic(np.array([[2.0, 0.0]]), np.array([0]), 2, 0.1)
    with pytest.raises(ConfigError):
        UnitBallMap(1.0, 1.0, 3)
    with pytest.raises(ConfigError, match="lambda"):
        sensitivity_bound(10, -1.0)


def test_pca_projection_stays_in_the_ball():
    x, _ = raw(n=50, d=6)
    unit = UnitBallMap(0.0, 16.0, 6)
    v = pca_basis(x, 3, unit)
    assert np.allclose(v.T @ v, np.eye(3), atol=1e-10)
    z = unit.with_basis(v).transform(np.vstack([x, np.full((1, 6), 16.0)]))
    assert np.linalg.norm(z, axis=1).max() <= 1.0 and z.shape[1] == 3


def test_digits_loader_tasks():
    pytest.importorskip("sklearn")
    from agt.data import load_dataset
    ds = load_dataset("digits", {"task": "multiclass"}, None)
    assert ds.n_classes == 10 and ds.n_train + ds.n_test == 1797
    assert ds.meta["feature_range"] == [0.0, 16.0]
    pair = load_dataset("digits", {"task": "binary", "pair": [3, 8]}, None)
    assert pair.n_classes == 2 and math.isclose(pair.n_test / (pair.n_train + pair.n_test),
                                                0.2, abs_tol=0.01)
