"""Trajectory certificates (agt/trajectory.py): try to break them.

Falsification: the query-targeted poisoning attack (agt/attack.py) and retrained random,
adversarial, label-flipped and coordinate-targeted neighbours must never change a
prediction certified at their distance; radii of neighbouring datasets differ by at most 1;
the certificate is never looser than the boxes it is built on; weakened versions (the
replaced-record bound 10 % low, one replaced record fewer) are caught by the attack.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import agt.trajectory as trajectory_mod
from agt.attack import flip_radius
from agt.certify import Certifier
from agt.config import config_from_dict
from agt.errors import BundleError, ConfigError, DataError
from agt.store import from_result
from agt.training import train, train_nominal
from agt.trajectory import TrajectoryBounds
from tests.agt.test_attack import SETTINGS as ATTACK_SETTINGS
from tests.agt.test_attack import Q, attacked
from tests.agt.test_stability import ball_data, head
from tests.agt.test_training import perturb, targeted
from tests.helpers import LOGISTIC_CE, MLP, blobs, classes, config, logits

#: the linear-head settings of the attack tests whose bundles come from an interval pass
SETTINGS = [name for name in ATTACK_SETTINGS if name.startswith(("interval", "served-k0"))]
_CACHE: dict = {}


def certified(name: str):
    """(cfg, ds, bundle, box certificate, trajectory certificate, attack flips)."""
    if name not in _CACHE:
        cfg, ds, bundle, box, flips = attacked(name)
        traj = Certifier(bundle, trajectory=TrajectoryBounds(bundle, ds)).certify(ds.x_test[:Q])
        _CACHE[name] = (cfg, ds, bundle, box, traj, flips)
    return _CACHE[name]


@pytest.mark.parametrize("name", SETTINGS)
def test_attack_never_flips_a_certified_prediction(name):
    cfg, ds, bundle, box, traj, flips = certified(name)
    assert np.array_equal(traj.prediction, flips.prediction)
    assert (flips.flip_k > 0).any()
    bad = (flips.flip_k > 0) & (traj.max_certified_k >= flips.flip_k)
    assert not bad.any(), f"{int(bad.sum())} queries certified at or beyond an attack flip"


@pytest.mark.parametrize("name", SETTINGS)
def test_never_looser_than_the_boxes(name):
    cfg, ds, bundle, box, traj, flips = certified(name)
    assert np.array_equal(box.prediction, traj.prediction)
    assert (traj.max_certified_k >= box.max_certified_k).all()
    assert traj.relations == ("replace-one",)
    assert traj.smooth_radii == box.smooth_radii


def test_tighter_where_the_boxes_wrap():
    """Minibatches: the boxes charge every step its own worst records per coordinate."""
    cfg, ds, bundle, box, traj, flips = certified("served-k0-minibatch-f32")
    assert np.median(traj.max_certified_k) >= 2 * (np.median(box.max_certified_k) + 1)


@pytest.mark.parametrize("name", ["interval-ce-3-steps-f32", "interval-sgdm-l2-f32",
                                  "interval-nesterov-minibatch"])
def test_retrained_neighbours_keep_certified_predictions(name):
    cfg, ds, bundle, box, traj, flips = certified(name)
    dtype = torch.float32 if cfg.dtype == "float32" else torch.float64
    rng = np.random.default_rng(5)
    trials = 0
    for k in (1, 3, 10, 30):
        for kind in ("random", "adversarial", "flip", "targeted"):
            ds2 = targeted(cfg, ds, k, rng) if kind == "targeted" else perturb(ds, kind, k, rng)
            pred2 = classes(logits(bundle.spec, train_nominal(cfg, ds2), ds.x_test[:Q], dtype))
            changed = (traj.max_certified_k >= k) & (pred2 != traj.prediction)
            assert not changed.any(), f"{kind} at distance {k} changed a certified prediction"
            trials += 1
    assert trials == 16


@pytest.mark.parametrize("name,kind", [("interval-ce-3-steps-f32", "random"),
                                       ("interval-ce-3-steps-f32", "flip"),
                                       ("served-k0-minibatch-f32", "adversarial"),
                                       ("interval-nesterov-minibatch", "random")])
def test_radii_of_neighbours_differ_by_at_most_one(name, kind):
    cfg, ds, bundle, box, traj, flips = certified(name)
    rng = np.random.default_rng(6)
    for _ in range(3):
        ds2 = perturb(ds, kind, 1, rng)
        b2 = from_result(train(cfg, ds2))
        r2 = Certifier(b2, trajectory=TrajectoryBounds(b2, ds2)).certify(ds.x_test[:Q]).radius
        assert (r2 >= traj.radius - 1).all() and (traj.radius >= r2 - 1).all()
    assert traj.radius.max() > 1


class _Weakened(TrajectoryBounds):
    replaced_factor = 1.0
    fewer_selected = 0

    def _replaced_bound(self, row_norm, rows):
        return super()._replaced_bound(row_norm, rows) * self.replaced_factor

    def _selected(self, P, k):
        return super()._selected(P, max(0, k - self.fewer_selected))


@pytest.mark.parametrize("name", ["interval-ce-1-step", "interval-bce-1-step"])
@pytest.mark.parametrize("change", [{"replaced_factor": 0.9}, {"fewer_selected": 1}])
def test_weakened_bounds_are_caught(name, change):
    """After one full-batch step the bound is nearly exact: the attack's neighbours reach
    past a replaced-record bound 10 % low, and past a selection of k - 1 records."""
    cfg, ds, bundle, box, traj, flips = certified(name)
    weak_bounds = _Weakened(bundle, ds)
    for key, value in change.items():
        setattr(weak_bounds, key, value)
    weak = Certifier(bundle, trajectory=weak_bounds).certify(ds.x_test[:Q]).max_certified_k
    assert ((flips.flip_k > 0) & (weak >= flips.flip_k)).any()


def test_refusals():
    ds = blobs(200, seed=8)
    mlp = from_result(train(config(MLP, k_values=[0, 1]), ds))
    with pytest.raises(ConfigError, match="one trainable\\s+linear layer"):
        TrajectoryBounds(mlp, ds)
    lin = from_result(train(config(LOGISTIC_CE, k_values=[0, 1]), ds))
    with pytest.raises(DataError, match="not the one the bundle was trained on"):
        TrajectoryBounds(lin, blobs(200, seed=9))
    other = from_result(train(config(LOGISTIC_CE, k_values=[0, 1], seed=3), ds))
    with pytest.raises(BundleError, match="another bundle"):
        Certifier(lin, trajectory=TrajectoryBounds(other, ds))
    shifted = {n: v + 1e-3 for n, v in lin.nominal.items()}
    with pytest.raises(BundleError, match="did not reproduce"):
        TrajectoryBounds(dataclasses.replace(lin, nominal=shifted), ds)
    with pytest.raises(BundleError, match="made by agt 0.0.1, this is .*: retrain it"):
        TrajectoryBounds(dataclasses.replace(lin, nominal=shifted, agt_version="0.0.1"), ds)
    sds = ball_data(100, 10, 3, 2, seed=1)
    stab = from_result(train(head(3, 2, k_values=[0, 1]), sds))
    with pytest.raises(ConfigError, match="interval pass"):
        TrajectoryBounds(stab, sds)


def test_memory_guard(monkeypatch):
    cfg, ds = ATTACK_SETTINGS["interval-ce-1-step"]
    bundle = from_result(train(cfg, ds))
    monkeypatch.setattr(trajectory_mod, "_MAX_KEPT", 100)
    with pytest.raises(ConfigError, match="fewer steps or k values"):
        TrajectoryBounds(bundle, ds)


def test_ensemble_teachers_take_trajectory_bounds():
    """Every teacher certified on its own part; never looser than the boxes; a teacher's
    prediction certified at k survives the attack on that teacher's part."""
    from agt.ensemble import EnsembleCertifier, train_ensemble
    from agt.ensemble.partition import teacher_dataset
    ds = blobs(600, seed=11)
    cfg = config(LOGISTIC_CE, n_epochs=2, batch_size=50, clip_gamma=0.1, learning_rate=0.5,
                 k_values="0..40", dtype="float32")
    ens = train_ensemble(cfg, ds, 3)
    box = EnsembleCertifier(ens).certify(ds.x_test[:Q])
    traj = EnsembleCertifier(ens, training_data=ds).certify(ds.x_test[:Q])
    assert np.array_equal(box.teacher_predictions, traj.teacher_predictions)
    assert (traj.teacher_max_k >= box.teacher_max_k).all()
    assert (traj.teacher_max_k > box.teacher_max_k).any()
    part = teacher_dataset(ds, 0, 3)
    teacher_cfg = config_from_dict(ens.bundles[0].config)
    flips = flip_radius(teacher_cfg, part, ds.x_test[:Q], range(1, 41))
    bad = (flips.flip_k > 0) & (traj.teacher_max_k[:, 0] >= flips.flip_k)
    assert not bad.any()
    with pytest.raises(DataError, match="ensemble's training split"):
        EnsembleCertifier(ens, training_data=blobs(600, seed=12))
