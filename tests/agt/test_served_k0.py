"""Bound method "served-k0" (agt/training.py, `served_k0_box`): the k = 0 box is the served
model itself; the boxes of k >= 1 are the interval boxes.

Falsification at k = 0 (retraining on D reproduces a point of the box, float32, many
full-batch steps), the goal behind the method (k = 0 certifies after 10+ float32 steps where the
interval box fails), "no looser anywhere" (k >= 1 bitwise equal, k = 0 inside the interval
box), neighbour smoothness in float32, a weakened box that the falsification test catches,
and the bundle attribute.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import agt.training as training_mod
from agt import store
from agt.certify import Certifier
from agt.data import Dataset
from agt.errors import BundleError
from agt.store import from_result, read_bundle, write_bundle
from agt.training import train, train_nominal
from tests.agt.test_training import perturb
from tests.helpers import MLP_BCE, blobs, config, inside, restamp

#: a share of queries that float rounding alone must not take from k = 0
K0_GOAL = 0.99


def gaussian_classes(n: int, n_test: int, dim: int, n_classes: int, seed: int) -> Dataset:
    """Overlapping Gaussian classes (unit noise around random means)."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(n_classes, dim)) * 0.6
    y = rng.integers(0, n_classes, size=n + n_test)
    x = means[y] + rng.normal(size=(n + n_test, dim))
    return Dataset("gauss", x[:n], y[:n], x[n:], y[n:], n_classes)


def long_float32(**kw):
    """10-class linear model, 12 full-batch float32 steps with a large step: the setting in
    which float32 rounding empties the interval method's k = 0 certificates."""
    ds = gaussian_classes(600, 200, 32, 10, seed=40)
    cfg = config([{"linear": {"in": 32, "out": 10}}], "cross_entropy", learning_rate=2.0,
                 lr_decay=0.0, clip_gamma=0.1, n_epochs=12, batch_size="full",
                 k_values=[0, 1, 2], dtype="float32", **kw)
    return cfg, ds


def test_default_is_served_k0_and_recorded():
    cfg, _ = long_float32()
    assert cfg.bound_method == "served-k0"
    assert config(MLP_BCE, "binary_cross_entropy", bound_method="interval").bound_method == \
        "interval"


def check_k0_falsification(cfg, ds, res):
    """Retrain on D (the only dataset within distance 0) by the nominal rule, as the served
    model is trained: the result must lie in box(D, 0)."""
    again = train_nominal(cfg, ds)
    ok, msg = inside(again, res.lower, res.upper, 0)
    assert ok, f"retraining on D left the k = 0 box: {msg}"


def test_k0_box_is_the_served_model_and_retraining_lands_in_it():
    cfg, ds = long_float32()
    res = train(cfg, ds)
    for name, value in res.nominal.items():
        assert torch.equal(res.lower[name][0], value.double())
        assert torch.equal(res.upper[name][0], value.double())
    check_k0_falsification(cfg, ds, res)


def test_weakened_k0_box_is_caught(monkeypatch):
    """Mutation: the k = 0 point taken from the float64 run of the same rule (the exact-
    arithmetic proxy, a plausible slip) instead of the served float32 run. The served model
    then lies outside its own k = 0 box, and the falsification check must see it."""
    cfg, ds = long_float32()
    proxy = train_nominal(cfg.replace(dtype="float64"), ds)
    real = training_mod.served_k0_box

    def weakened(k_values, nominal, lower, upper):
        return real(k_values, proxy, lower, upper)

    monkeypatch.setattr(training_mod, "served_k0_box", weakened)
    res = train(cfg, ds)
    with pytest.raises(AssertionError, match="left the k = 0 box"):
        check_k0_falsification(cfg, ds, res)


def test_k0_certifies_after_many_float32_steps_and_is_no_looser():
    """The method's goal at k = 0; k >= 1 boxes equal to the interval method's bit for bit,
    the k = 0 box inside the interval k = 0 box, so no certificate is lost anywhere."""
    cfg, ds = long_float32()
    new = train(cfg, ds)
    old = train(cfg.replace(bound_method="interval"), ds)
    for name in new.lower:
        assert torch.equal(new.lower[name][1:], old.lower[name][1:])
        assert torch.equal(new.upper[name][1:], old.upper[name][1:])
        assert bool((old.lower[name][0] <= new.lower[name][0]).all())
        assert bool((new.upper[name][0] <= old.upper[name][0]).all())
    c_new = Certifier(from_result(new)).certify(ds.x_test)
    c_old = Certifier(from_result(old)).certify(ds.x_test)
    assert np.array_equal(c_new.prediction, c_old.prediction)
    assert (c_new.max_certified_k >= c_old.max_certified_k).all()
    assert c_new.certified_fraction()[0] >= K0_GOAL
    # the setting is one where the interval k = 0 box does lose queries to rounding
    assert c_old.certified_fraction()[0] < K0_GOAL


@pytest.mark.parametrize("method", ["served-k0", "interval"])
def test_smooth_radius_on_neighbours_float32(method):
    """r(D') >= r(D) - 1 both ways for neighbours (replaced, adversarial, removed, added:
    full batch certifies add-remove too) in float32, where r(D) = 1 requires the k = 0 box
    of D' (served-k0: a point) to certify. Both methods claim smoothness."""
    ds = blobs(300, seed=41, variant="overlapping")
    cfg = config(MLP_BCE, "binary_cross_entropy", n_epochs=4, batch_size="full",
                 learning_rate=0.5, dtype="float32", k_values="0..12", bound_method=method)
    cert = Certifier(from_result(train(cfg, ds))).certify(ds.x_test)
    # queries at r(D) = 1 exercise the k = 0 leg of the proof; r must not saturate the grid
    assert (cert.radius == 1).any() and 1 < cert.radius.max() < 12
    rng = np.random.default_rng(42)
    for kind in ("random", "adversarial", "remove", "add"):
        ds2 = perturb(ds, kind, 1, rng)
        cert2 = Certifier(from_result(train(cfg, ds2))).certify(ds.x_test)
        assert (cert2.radius >= cert.radius - 1).all(), kind
        assert (cert.radius >= cert2.radius - 1).all(), kind


def test_bundle_records_bound_method(tmp_path, monkeypatch):
    ds = blobs(200, seed=43)
    for method in ("served-k0", "interval"):
        cfg = config(MLP_BCE, "binary_cross_entropy", bound_method=method)
        path = write_bundle(from_result(train(cfg, ds)), tmp_path / f"{method}.h5")
        back = read_bundle(path)
        assert back.bound_method == method and back.smooth_radii
    # a bundle written before the attribute existed was written by the interval method
    with h5py.File(path, "a") as f:
        del f.attrs["bound_method"]
    restamp(path)
    assert read_bundle(path).bound_method == "interval"
    with h5py.File(path, "a") as f:
        f.attrs["bound_method"] = "affine"
    restamp(path)
    with pytest.raises(BundleError, match="bound_method"):
        read_bundle(path)
    # a method without a nesting proof would make the radii non-smooth (releases refuse them)
    monkeypatch.setattr(store, "SMOOTH_BOUND_METHODS", ("interval",))
    b = from_result(train(config(MLP_BCE, "binary_cross_entropy"), ds))
    assert not b.smooth_radii
    assert not Certifier(b).certify(ds.x_test).smooth_radii
