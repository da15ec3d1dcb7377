"""Overflow and underflow at the edges of the float formats (an adversarial review of the
stability balls and the certifier). Every bound models rounding, not overflow, so
what could overflow is refused or left uncertified; each case below broke a certificate
before its fix (a neighbour outside the ball, a certified query that flips)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import agt.training as training_mod
from agt.certify import Certifier
from agt.config import config_from_dict
from agt.data import Dataset
from agt.errors import BundleError, ConfigError, DataError
from agt.interval import Interval
from agt.optim import round_to
from agt.stability import StabilityProblem, StabilityStep
from agt.store import from_result, validate_bundle
from agt.tensors import predicted_classes
from agt.training import train, train_nominal
from tests.agt.test_stability import R, ball_data, distance, head
from tests.agt.test_training import assert_steps_nest
from tests.helpers import (
    LOGISTIC,
    LOGISTIC_CE,
    MLP,
    blobs,
    classes,
    config,
    inside,
    logits,
    with_train,
)

F32 = float(torch.finfo(torch.float32).max)


def _init(tmp_path, **arrays) -> str:
    path = tmp_path / "init.npz"
    np.savez(path, **{k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()})
    return str(path)


def _two_ray_data(radius: float, extra_on_e1: bool):
    """49 (or 50) records at radius * e1 and 25 at radius * e2, all of class 1 (and one
    record at 0 of class 0): with a learning rate near max(float32) / radius the step on
    e1 lands just below (or above) max(float32)."""
    a, b = 49, 25
    n = a + b + 1
    x = np.zeros((n, 2))
    y = np.ones(n, dtype=np.int64)
    x[:a] = [radius, 0.0]
    x[a:a + b] = [0.0, radius]
    if extra_on_e1:
        x[-1] = [radius, 0.0]
    else:
        y[-1] = 0
    return Dataset("rays", x, y, np.array([[0.0, 1.0]]), np.array([1]), 2), n, a


def _ray_config(tmp_path, radius: float, lr: float):
    return config_from_dict(dict(
        model=[{"linear": {"in": 2, "out": 1}}], loss="binary_cross_entropy",
        data={"name": "blobs"}, learning_rate=lr, lr_decay=0.0, n_epochs=1, batch_size="full",
        clip_gamma=radius, k_values=[0, 1], dtype="float32", device="cpu",
        bound_method="stability", input_norm_bound=radius,
        pretrained=_init(tmp_path, **{"0.weight": [[-1.0, -1.0]], "0.bias": [0.0]})))


@pytest.mark.parametrize("radius", [1e4, 1e8])
def test_stability_refuses_runs_a_neighbour_could_overflow(tmp_path, radius):
    """D trained to finite float32 weights, a one-record neighbour (norm R) to +inf, which
    flipped a query certified at k = 1; now the public norm bound refuses the run."""
    ds, n, a = _two_ray_data(radius, extra_on_e1=False)
    lr = F32 / radius * n / (a + 0.5)
    cfg = _ray_config(tmp_path, radius, lr)
    x2, y2 = ds.x_train.copy(), ds.y_train.copy()
    x2[-1], y2[-1] = [radius, 0.0], 1
    neighbour = train_nominal(cfg, Dataset("rays", x2, y2, ds.x_test, ds.y_test, 2))
    assert not bool(torch.isfinite(neighbour["0.weight"]).all()), "the neighbour overflows"
    with pytest.raises(DataError, match="could overflow on a dataset of the declared domain"):
        train(cfg, ds)


def test_stability_guard_uses_the_public_norm_bound():
    """The guard is data-independent: ordinary settings pass, a learning rate that could
    carry some in-domain run past max / 16 does not."""
    problem = StabilityProblem.build("cross_entropy", 3, 4, True, 0.0, 2.0, torch.float32,
                                     n_records=100)
    steps = [StabilityStep(0, 0.3, 100, 1.0, 1.0)] * 20
    problem.check_overflow(steps)
    with pytest.raises(DataError, match="could overflow"):
        problem.check_overflow([StabilityStep(0, 1e36, 100, 1.0, 1.0)] * 2)


@pytest.mark.parametrize("lr", [1e37, 3e36])
def test_subnormal_domain_keeps_neighbours_inside_the_ball(tmp_path, lr):
    """Records of norm 2^-148 (no bias) make every mean gradient a subnormal: its cast to
    float32 is off by half a subnormal step, which a large learning rate multiplies. A
    one-record neighbour left the ball by 2.5x (and flipped a certified query) while that
    error was charged outside the lr factor."""
    radius = 2.0 ** -148
    n = 10
    x = np.zeros((n, 1))
    y = np.zeros(n, dtype=np.int64)
    x[:6], y[:6] = radius, 1
    ds = Dataset("tiny", x, y, np.array([[1.0]]), np.array([1]), 2)
    cfg = config_from_dict(dict(
        model=[{"linear": {"in": 1, "out": 1, "bias": False}}], loss="binary_cross_entropy",
        data={"name": "blobs"}, learning_rate=lr, lr_decay=0.0, n_epochs=1, batch_size="full",
        clip_gamma=radius, k_values=[0, 1], dtype="float32", device="cpu",
        bound_method="stability", input_norm_bound=radius,
        pretrained=_init(tmp_path, **{"0.weight": [[0.0]]})))
    res = train(cfg, ds)
    served = float(res.nominal["0.weight"])
    assert served > 0.0, "the served step is not 0: the test exercises the subnormal cast"
    x2, y2 = x.copy(), y.copy()
    x2[0], y2[0] = 0.0, 0
    other = train_nominal(cfg, Dataset("tiny", x2, y2, ds.x_test, ds.y_test, 2))
    assert abs(float(other["0.weight"]) - served) <= res.ball_radius[1]
    cert = Certifier(from_result(res)).certify(ds.x_test)
    pred = predicted_classes(logits(res.spec, other, ds.x_test, torch.float32))
    assert cert.max_certified_k[0] < 1 or int(pred[0]) == int(cert.prediction[0])


@pytest.mark.parametrize("method", ["stability", "served-k0"])
def test_queries_whose_logits_could_overflow_are_not_certified(tmp_path, method):
    """A finite query whose served float32 logit sits just below max(float32): the served
    model predicts class 1 (z_1 = inf), and a one-record neighbour inside the k = 1 ball and
    box overflows z_0 too, so argmax picks class 0. Such a query was certified at k = 1;
    now the certifier checks the forward pass's magnitudes over the box."""
    init = _init(tmp_path, **{"0.weight": [[5.0, 0.0], [10.0, 0.0]], "0.bias": [0.0, 0.0]})
    ds = ball_data(80, 20, 2, 2, seed=1)
    kw = dict(dtype="float32", n_epochs=1, k_values=[0, 1], pretrained=init)
    if method == "served-k0":
        kw.update(bound_method="served-k0", input_norm_bound=None, k_boxes="interval",
                  clip_gamma=2.0)
    cfg = head(2, 2, **kw)
    res = train(cfg, ds)
    s = F32 / float(res.nominal["0.weight"][0, 0]) * 1.001
    while not torch.isfinite(logits(res.spec, res.nominal, [[s, 0.0]], torch.float32)[0, 0]):
        s = float(np.nextafter(np.float32(s), np.float32(0)))
    xq = np.array([[s, 0.0]])
    x2, y2 = ds.x_train.copy(), ds.y_train.copy()
    i = int(np.nonzero(y2 == 1)[0][0])
    x2[i], y2[i] = [R * (1 - 1e-6), 0.0], 0
    other = train_nominal(cfg, Dataset("ball", x2, y2, ds.x_test, ds.y_test, 2))
    if method == "stability":
        assert distance(other, res.nominal) <= res.ball_radius[1]
    cert = Certifier(from_result(res)).certify(xq)
    served = int(cert.prediction[0])
    flipped = int(predicted_classes(logits(res.spec, other, xq, torch.float32))[0]) != served
    assert flipped, "the neighbour changes the prediction: a certificate at 1 would be false"
    assert cert.max_certified_k[0] < 1
    # ordinary queries of the same bundle still certify
    assert (Certifier(from_result(res)).certify(ds.x_test).max_certified_k >= 0).all()


def test_learning_rates_beyond_the_dtype_are_refused():
    base = dict(model=[{"linear": {"in": 2, "out": 1}}], loss="binary_cross_entropy",
                data={"name": "blobs"}, dtype="float32")
    for key in ("learning_rate", "clip_gamma", "l2_reg"):
        with pytest.raises(ConfigError, match=f"{key} = 1e\\+39 is beyond"):
            config_from_dict({**base, key: 1e39, "learning_rate": 1e-40} if key == "l2_reg"
                             else {**base, key: 1e39})
    config_from_dict({**base, "learning_rate": 1e39, "dtype": "float64"})


def test_a_diverged_run_is_refused_and_an_infinite_bundle_rejected(tmp_path, monkeypatch):
    """The last line of defence behind the guards: a run whose served parameters overflow
    is refused by name, and a bundle with an infinite served model does not validate."""
    ds, n, a = _two_ray_data(100.0, extra_on_e1=True)
    cfg = _ray_config(tmp_path, 100.0, F32 / 100.0 * n / (a + 0.5))
    monkeypatch.setattr(StabilityProblem, "check_overflow", lambda self, steps: None)
    with pytest.raises(DataError, match="training diverged"):
        train(cfg, ds)
    good = from_result(train(head(2, 2, k_values=[0, 1]), ball_data(60, 5, 2, 2, seed=2)))
    bad = dict(good.nominal)
    bad["0.bias"] = torch.full_like(bad["0.bias"], torch.inf)
    with pytest.raises(BundleError, match="infinite"):
        validate_bundle(dataclasses.replace(good, nominal=bad))


def test_queries_that_overflow_inside_a_frozen_prefix_are_not_certified(tmp_path):
    """A finite float32 query that the frozen prefix takes to inf (2 * 3e38) while its
    float64 features stay finite: the served logits are +-inf, and which one is inf turns on
    a weight the k = 1 box lets cross 0; a one-record neighbour flipped a query certified at
    k = 1. The magnitude check now runs from the raw query through the prefix."""
    n = 100
    x = np.zeros((n, 1))
    y = (np.arange(n) % 2).astype(np.int64)
    xq = np.array([[3e38]])
    ds = Dataset("d", x, y, xq, np.array([1]), 2)
    init = _init(tmp_path, **{"0.weight": [[2.0]], "0.bias": [0.0], "1.weight": [[1e-3]],
                              "1.bias": [0.0], "2.weight": [[-1e-6], [1.0]], "2.bias": [0.0, 0.0]})
    cfg = config_from_dict(dict(
        model=[{"linear": {"in": 1, "out": 1}}, {"linear": {"in": 1, "out": 1}},
               {"linear": {"in": 1, "out": 2}}], frozen_layers=2, loss="cross_entropy",
        data={"name": "blobs"}, learning_rate=1.0, lr_decay=0.0, n_epochs=1, batch_size="full",
        clip_gamma=1.0, k_values=[0, 1], dtype="float32", device="cpu", pretrained=init))
    res = train(cfg, ds)
    x2, y2 = x.copy(), y.copy()
    x2[0], y2[0] = [-1000.0], 1
    other = train_nominal(cfg, Dataset("d", x2, y2, xq, np.array([1]), 2))
    cert = Certifier(from_result(res)).certify(xq)
    flipped_class = int(predicted_classes(logits(res.spec, other, xq, torch.float32))[0])
    assert flipped_class != int(cert.prediction[0])
    assert cert.max_certified_k[0] < 1
    assert (Certifier(from_result(res)).certify(np.array([[0.5], [-2.0]])).max_certified_k
            >= 0).all()


def test_momentum_that_could_overflow_is_refused(tmp_path):
    """sgdm with gamma = 2e37 (accepted: <= max / 16) and momentum 0.95: D's velocity stayed
    finite near 3e38, a one-record neighbour's reached gamma / (1 - m) = 4e38 = inf and its
    weight -inf, while D's run certified the query at k = 1. The guard now bounds the next
    velocity m |v| + gamma + l2 |theta| too."""
    big = 2e37
    x = np.array([[big], [big], [big], [-big]])
    y = np.zeros(4, dtype=np.int64)
    ds = Dataset("d", x, y, np.array([[1.0]]), np.array([1]), 2)
    cfg = config_from_dict(dict(
        model=[{"linear": {"in": 1, "out": 1, "bias": False}}], loss="binary_cross_entropy",
        data={"name": "blobs"}, optimizer="sgdm", momentum=0.95, learning_rate=1e-43,
        lr_decay=0.0, n_epochs=40, batch_size="full", clip_gamma=big, k_values=[0, 1],
        dtype="float32", device="cpu", pretrained=_init(tmp_path, **{"0.weight": [[0.5]]})))
    x2 = x.copy()
    x2[3] = [big]
    other = train_nominal(cfg, Dataset("d", x2, y, ds.x_test, ds.y_test, 2))
    assert not bool(torch.isfinite(other["0.weight"]).all()), "the neighbour overflows"
    with pytest.raises(DataError, match="could overflow"):
        train(cfg, ds)


# -- the interval pass: refusals from the config alone, records that could overflow marked --
def _huge_records(ds, value: float, count: int = 20):
    x = ds.x_train.copy()
    x[:count] = 0.0
    x[:count, 0] = value
    return with_train(ds, x, ds.y_train.copy())


def test_a_marked_record_keeps_the_nominal_gradient_inside_its_bound():
    """Twenty float32 records whose logit overflows at the parameters of the box (softmax of
    an infinite logit is NaN, which the nominal rule counts as 0) while the float64 interval
    computes the saturated gradient +-gamma: an adversarial review's neighbour left its
    k = 1 box this way. A record that could overflow gets the whole clamp range instead,
    which holds the 0; without the marking (the weakened version) the mean leaves its
    bound."""
    ds = _huge_records(blobs(200, seed=13), 1.9e38)
    cfg = config(LOGISTIC_CE, clip_gamma=0.1, k_values=[0], dtype="float32")
    setup = training_mod.prepare(cfg, ds, torch.device("cpu"))
    theta = {"0.weight": torch.zeros(2, 6), "0.bias": torch.zeros(2)}
    theta["0.weight"][0, 0] = 2.0                   # logit 3.8e38: inf in float32
    idx = torch.arange(ds.n_train)
    with torch.no_grad():
        z = logits(setup.spec, theta, ds.x_train[:20], torch.float32)
    assert not bool(torch.isfinite(z).all()), "the records' logits overflow"
    direction, _ = setup.nominal.direction(theta, idx)
    boxes = {n: Interval.exact(t.to(torch.float64).unsqueeze(0)) for n, t in theta.items()}
    k = torch.tensor([0])

    def holds(marked) -> bool:
        d = setup.passes.descent_bounds(boxes, k, idx, shared=False, marked=marked)
        return all(bool(d[n].contains(direction[n].to(torch.float64).unsqueeze(0)).all())
                   for n in theta)

    marked = setup.overflow.marked_records({n: float(t.abs().max()) for n, t in theta.items()})
    assert marked is not None and int(marked.sum()) == 20
    assert holds(marked)
    assert not holds(None), "the weakened version (no marking) must leave the bound"


@pytest.mark.parametrize("value,dtype", [(1.9e38, "float32"), (1e39, "float32"),
                                         (1e307, "float64")])
def test_data_that_could_overflow_trains_and_its_neighbours_stay_inside(value, dtype):
    """Records that could overflow the dtype (1e39: inf once cast to float32) used to make
    training refuse, judged on the records, so one record decided whether D' trained where
    D did. Now they train with their whole clamp range; retrained neighbours (a marked record
    replaced by an ordinary one or relabelled, an ordinary record replaced by a marked one)
    stay inside the k = 1 box, the computed boxes nest at every step, and a certified test
    query keeps its class on every neighbour."""
    base = blobs(200, seed=13)
    ds = _huge_records(base, value)
    cfg = config(LOGISTIC_CE, n_epochs=3, clip_gamma=0.1, learning_rate=2.0, lr_decay=0.0,
                 k_values=[0, 1, 2], dtype=dtype)
    kept = []
    res = train(cfg, ds, bounds_callback=kept.append)
    validate_bundle(from_result(res))
    cert = Certifier(from_result(res)).certify(ds.x_test)
    assert (cert.max_certified_k >= 1).any(), "the test exercises certified queries"
    rng = np.random.default_rng(0)
    neighbours = []
    x, y = ds.x_train.copy(), ds.y_train.copy()
    x[3] = base.x_train[3]                                   # a marked record made ordinary
    neighbours.append((x, y))
    x, y = ds.x_train.copy(), ds.y_train.copy()
    y[5] = 1 - y[5]                                          # a marked record relabelled
    neighbours.append((x, y))
    x, y = ds.x_train.copy(), ds.y_train.copy()
    x[150], y[150] = x[0], 1 - y[0]                          # an ordinary record made huge
    neighbours.append((x, y))
    x, y = ds.x_train.copy(), ds.y_train.copy()
    i = int(rng.integers(20, len(y)))
    y[i] = 1 - y[i]                                          # an ordinary label flipped
    neighbours.append((x, y))
    torch_dtype = torch.float32 if dtype == "float32" else torch.float64
    for t, (x2, y2) in enumerate(neighbours):
        other = with_train(ds, x2, y2)
        params = train_nominal(cfg, other)
        ok, msg = inside(params, res.lower, res.upper, 1)
        assert ok, f"neighbour {t}: {msg}"
        kept2 = []
        train(cfg, other, bounds_callback=kept2.append)
        assert_steps_nest(kept, kept2, f"neighbour {t}")
        pred = classes(logits(res.spec, params, ds.x_test, torch_dtype))
        assert not ((cert.max_certified_k >= 1) & (pred != cert.prediction)).any()


@pytest.mark.parametrize("case", ["update", "momentum", "gradient"])
def test_the_overflow_refusal_reads_no_record(case):
    """Training refuses when the nominal run could overflow for *some* dataset: the bound
    comes from the config alone (`UpdateRule.public_magnitudes`), so D, D with huge records,
    a dataset of zeros and D with one record fewer refuse alike, and the ordinary settings
    train alike."""
    base = blobs(200, seed=13)
    kw = dict(n_epochs=2, clip_gamma=0.1, learning_rate=1.0, lr_decay=0.0,
              k_values=[0, 1, 2], dtype="float32")
    bad = {"update": dict(learning_rate=1e30, clip_gamma=1e10),
           "momentum": dict(optimizer="sgdm", momentum=0.9, learning_rate=1e27,
                            clip_gamma=1e10, n_epochs=3),
           # updates stay below the limit; the hidden layer's products do not
           "gradient": dict(clip_gamma=1e36)}[case]
    model = MLP if case == "gradient" else LOGISTIC_CE
    datasets = [base, _huge_records(base, 1e39),
                with_train(base, np.zeros_like(base.x_train), base.y_train.copy()),
                with_train(base, base.x_train[1:], base.y_train[1:])]      # one record fewer
    messages = set()
    for ds in datasets:
        with pytest.raises(DataError, match="could overflow") as err:
            train(config(model, **{**kw, **bad}), ds)
        messages.add(str(err.value))
    assert len(messages) == 1, "the refusal must not depend on the records"
    for ds in datasets:
        train(config(model, **kw), ds)


@pytest.mark.parametrize("optimizer", [dict(), dict(l2_reg=0.05),
                                       dict(optimizer="sgdm", momentum=0.9),
                                       dict(optimizer="sgdm", momentum=0.9, nesterov=True),
                                       dict(optimizer="sgdm", momentum=0.5, dampening=0.3,
                                            l2_reg=0.01)])
def test_public_magnitudes_bound_every_run_and_are_attained(tmp_path, optimizer):
    """|theta_t| <= P_t for the nominal run on any dataset. From zero weights, records of
    one class whose per-sample gradient clamps on every weight at every step make the run
    grow as fast as the bound (within 1e-4, the bound's rounding margin of 32 u per
    quantity and step; without L2, whose term the bound charges with the worst sign), so a
    recursion that forgot a term (the momentum, the nesterov look-ahead, a step) would fail
    here; ordinary data stays below."""
    base = blobs(200, seed=13)
    saturating = with_train(base, np.full_like(base.x_train, 0.5), np.ones_like(base.y_train))
    init = _init(tmp_path, **{"0.weight": np.zeros((1, 6)), "0.bias": [0.0]})
    cfg = config(LOGISTIC, "binary_cross_entropy", n_epochs=6, clip_gamma=0.01,
                 learning_rate=0.5, lr_decay=0.2, k_values=[0, 1], dtype="float32",
                 pretrained=init, **optimizer)
    lrs = [round_to(cfg.learning_rate_at(t), torch.float32) for t in range(6)]
    for ds in (base, saturating):
        public = training_mod.prepare(cfg, ds, torch.device("cpu")).overflow.public_bounds(lrs)
        seen = []
        train(cfg, ds, step_callback=lambda step, theta, boxes: seen.append(
            {n: float(v.abs().max()) for n, v in theta.items()}))
        for t, mags in enumerate(seen):
            for name, mag in mags.items():
                assert mag <= public.params[t + 1][name], (t, name)
        if ds is saturating and not optimizer.get("l2_reg"):
            for t, mags in enumerate(seen):
                assert mags["0.weight"] >= public.params[t + 1]["0.weight"] * (1 - 1e-4), t


def _zeros_init(tmp_path) -> str:
    return _init(tmp_path, **{"0.weight": np.zeros((1, 6)), "0.bias": [0.0]})


def test_public_bounds_hold_where_steps_underflow(tmp_path):
    """A review's case: zero initial weights stepped by lr d = 2^-148 * 0.3 in float32,
    whose product underflows to the subnormal 2^-149, above the bound 0.6 * 2^-149 that a
    purely relative rounding model gave. The boxes are cut to the public bounds
    (`agt.overflow.cut_to_public`), so a one-label neighbour left the k = 1 box, and under
    add-remove the boxes of D and of D plus one record stopped nesting. Every operation is
    now charged an absolute half subnormal step too."""
    base = blobs(20)
    cfg = config(LOGISTIC, "binary_cross_entropy", dtype="float32", clip_gamma=0.3,
                 learning_rate=2.0 ** -148, lr_decay=0.0, n_epochs=1, k_values=[0, 1, 2],
                 pretrained=_zeros_init(tmp_path))
    x = np.zeros((10, 6))
    ds = with_train(base, x, np.array([1] * 9 + [0]))
    kept = []
    res = train(cfg, ds, bounds_callback=kept.append)
    relabelled = train_nominal(cfg, with_train(base, x, np.ones(10, dtype=np.int64)))
    assert float(relabelled["0.bias"]) > 0.0, "the step is a subnormal"
    ok, msg = inside(relabelled, res.lower, res.upper, 1)
    assert ok, msg
    train(cfg, with_train(base, x, np.ones(10, dtype=np.int64)))      # D's own check holds
    kept2 = []
    train(cfg, with_train(base, np.zeros((11, 6)), np.array([1] * 9 + [0, 0])),
          bounds_callback=kept2.append)
    assert_steps_nest(kept, kept2, "one record more")


def test_the_nominal_mean_never_exceeds_the_clamp():
    """Three float64 gradients clamped to 0.1 have the float64 mean 0.1 + 1 ulp, outside the
    descent bounds' final clamp and the public bounds; the nominal rule clamps the mean
    (a no-op in exact arithmetic)."""
    gam = 0.1
    total = torch.zeros(1, dtype=torch.float64) + torch.full((3,), gam, dtype=torch.float64).sum()
    assert float(total / 3) > gam, "the float64 mean exceeds the clamp"
    base = blobs(20)
    ds = with_train(base, np.full((3, 6), 1e3), np.zeros(3, dtype=np.int64))
    cfg = config(LOGISTIC, "binary_cross_entropy", clip_gamma=gam, k_values=[0, 1])
    setup = training_mod.prepare(cfg, ds, torch.device("cpu"))
    theta = {"0.weight": torch.zeros(1, 6, dtype=torch.float64),       # every record's
             "0.bias": torch.full((1,), 50.0, dtype=torch.float64)}     # gradient clamps
    direction, _ = setup.nominal.direction(theta, torch.arange(3))
    assert float(direction["0.weight"].max()) == gam


def test_full_batch_refuses_and_claims_alike_for_every_n():
    """Under `batch_size: full` the dataset size is not shared by add-remove neighbours, so
    nothing may depend on it: the k grid may reach n (the bound is the clamp range there),
    and the overflow refusal's threshold is the same for n and n + 1 (the mean bound once
    read n, and a review found a clip_gamma that D accepted and D plus one record did not)."""
    base = blobs(40, seed=2)
    small = with_train(base, base.x_train[:10], base.y_train[:10])
    bigger = with_train(base, base.x_train[:11], base.y_train[:11])
    for ds in (small, bigger):
        res = train(config(LOGISTIC_CE, k_values="0..12", dtype="float32"), ds)
        validate_bundle(from_result(res))
        # an integer batch (replace-one: n is public) still refuses k >= its batch
        with pytest.raises(ConfigError, match="must be smaller than"):
            train(config(LOGISTIC_CE, k_values="0..12", batch_size=8), ds)
    limit = float(torch.finfo(torch.float32).max) / 16

    def accepted(gamma, ds) -> bool:
        cfg = config(LOGISTIC, "binary_cross_entropy", dtype="float32", clip_gamma=gamma,
                     learning_rate=1e-30, lr_decay=0.0, n_epochs=1, k_values=[0, 1])
        try:
            training_mod.prepare(cfg, ds, torch.device("cpu")).overflow.public_bounds([1e-30])
            return True
        except DataError:
            return False

    lo, hi = limit * (1 - 1e-4), limit
    assert accepted(lo, small) and not accepted(hi, small)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if accepted(mid, small) else (lo, mid)
    assert accepted(lo, bigger) and not accepted(hi, bigger)


@pytest.mark.parametrize("selection", ["exact", "threshold"])
def test_full_batch_k_far_beyond_n_costs_no_more_than_k_equal_n(selection):
    """A review's find: k = 999,999,999 (the grid's documented limit) under `batch_size:
    full` asked for selection buffers of k slots per parameter (96 GB: a traceback). A
    buffer needs at most the batch's records; every k >= n gets the clamp range, the same
    bounds bit for bit as a grid of as many values just above n (exact rule; the
    threshold rule's thresholds depend on the grid, as they always did: any is sound)."""
    ds = blobs(40, seed=3)
    n = ds.n_train
    grid = [0, 1, n - 1, n, n + 1, 10**9 - 1, 10**9]
    res = train(config(MLP, k_values=grid, dtype="float32", selection=selection), ds)
    lo, hi = res.lower, res.upper
    for name in lo:
        for j in (5, 6):
            assert torch.equal(lo[name][j], lo[name][4]) and torch.equal(hi[name][j], hi[name][4])
    if selection == "threshold":
        return
    small = train(config(MLP, k_values=grid[:5] + [n + 5, n + 6], dtype="float32",
                         selection=selection), ds)
    for name in lo:
        assert torch.equal(small.lower[name], lo[name])
        assert torch.equal(small.upper[name], hi[name])


def test_update_coefficients_that_underflow_are_refused(tmp_path):
    """A review's case: float64, learning rate 5e-324 with momentum 0.4. The interval
    update's coefficient lr * momentum underflowed to 0 in float64, which dropped the
    velocity's share of theta' with no widening, and a neighbour left the k = 1 box. Such
    rates are refused from the config (`UpdateRule.check_coefficients`); ordinary ones,
    also with lr * l2 = 1 (a coefficient 1 - lr l2 that cancels), pass."""
    from agt.optim import UpdateRule
    base = blobs(40, seed=1)
    for lr in (5e-324, 1e-310):
        cfg = config(LOGISTIC, "binary_cross_entropy", optimizer="sgdm", momentum=0.4,
                     learning_rate=lr, lr_decay=0.0, k_values=[0, 1],
                     pretrained=_zeros_init(tmp_path))
        for ds in (base, with_train(base, np.full_like(base.x_train, 1e150), base.y_train)):
            with pytest.raises(DataError, match="underflows float64"):
                train(cfg, ds)
    rng = np.random.default_rng(0)
    for _ in range(400):
        lr = float(10.0 ** rng.uniform(-290, 1))
        rule = UpdateRule("sgdm", float(rng.uniform(0, 1 / lr)) if rng.random() < 0.5 else 1 / lr,
                          float(rng.uniform(0, 1)), float(rng.uniform(0, 1)),
                          bool(rng.random() < 0.3))
        if rule.nesterov:
            rule = UpdateRule("sgdm", rule.l2, rule.momentum, 1.0, True)
        for first in (True, False):
            assert rule.check_coefficients(lr, first), (lr, rule)
    assert not UpdateRule("sgdm", 0.0, 0.4, 1.0, False).check_coefficients(5e-324, False)
