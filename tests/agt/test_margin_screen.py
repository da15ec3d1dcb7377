"""The linear margin screen decides exactly as the reference box test
(agt/certify/margin_screen.py): its error bar holds without its safety factor, queries placed
on the decision boundary are sent to the reference, and a screen with too small an error
bar is caught."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agt.certify import Certifier
from agt.certify import certifier as certifier_module
from agt.certify.margin_screen import SAFETY
from agt.data import load_dataset
from agt.interval import Interval
from agt.store import from_result
from agt.training import train
from tests.helpers import LOGISTIC, LOGISTIC_CE, blobs, config

DIGITS_LINEAR = [{"linear": {"in": 64, "out": 10}}]
NO_BIAS = [{"linear": {"in": 6, "out": 2, "bias": False}}]

CASES = {
    "one logit": (LOGISTIC, "binary_cross_entropy", "blobs", "float64"),
    "two logits": (LOGISTIC_CE, "cross_entropy", "blobs", "float64"),
    "two logits float32": (LOGISTIC_CE, "cross_entropy", "blobs", "float32"),
    "one logit float32": (LOGISTIC, "binary_cross_entropy", "blobs", "float32"),
    "no bias": (NO_BIAS, "cross_entropy", "blobs", "float64"),
    "ten classes": (DIGITS_LINEAR, "cross_entropy", "digits", "float64"),
}


def _bundle_and_queries(case: str):
    model, loss, data, dtype = CASES[case]
    if data == "digits":
        ds = load_dataset("digits", {"seed": 3, "max_train": 600})
    else:
        ds = blobs(300, seed=31)
    b = from_result(train(config(model, loss, n_epochs=2, k_values="0..40", dtype=dtype,
                                 learning_rate=0.2, batch_size=100), ds))
    return b, np.asarray(ds.x_test)


def _estimate_and_bar(c: Certifier, feats, pred, j):
    s = c.screen
    x_split, norm1 = s.split(feats)
    row = j * s.rows_per_box + pred
    est = torch.bmm(x_split, s.columns.index_select(0, row)).squeeze(1)
    est = est + s.offsets.index_select(0, row)
    if s.n_logits > 1:
        est = est.scatter(1, pred[:, None], torch.inf)
    return est.min(1).values, s.intercept[j] + norm1 * s.slope[j]


def _reference_bound(c: Certifier, feats, pred, j):
    params = {n: Interval(c.lower[n][j], c.upper[n][j]) for n in c.trainable}
    return c.margin_lower_bound(feats, pred, params, c.fm.graded(c.k_float[j]))


def _boundary_queries(c: Certifier, x: np.ndarray, rng) -> np.ndarray:
    """Queries on the segment between two queries of different classes where the screen's
    estimate at some box crosses zero (bisection to the last float): the pairs it cannot
    decide."""
    pred = c.predict(x)
    out = []
    K = len(c.k_values)
    for _ in range(60):
        a = x[rng.choice(np.flatnonzero(pred == pred[0]))]
        b = x[rng.choice(np.flatnonzero(pred != pred[0]))]
        j = int(rng.integers(0, K))
        lo, hi = 0.0, 1.0

        def sign(t):
            q = torch.as_tensor((1 - t) * a + t * b, dtype=torch.float64)[None]
            p = torch.as_tensor(c.predict(q.numpy()))
            est, _ = _estimate_and_bar(c, q, p, torch.full_like(p, j))
            return float(est[0]) > 0, int(p[0])

        s_lo = sign(lo)
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            if sign(mid) == s_lo:
                lo = mid
            else:
                hi = mid
        out += [(1 - lo) * a + lo * b, (1 - hi) * a + hi * b]
    return np.stack(out)


@pytest.mark.parametrize("case", list(CASES))
def test_the_screen_is_used_and_its_error_bar_holds_without_the_safety_factor(case):
    """|reference bound - estimate| <= bar / SAFETY on test queries, on one-hot queries (the
    magnitude bound tight) and at every box, so the safety factor is headroom only."""
    b, x = _bundle_and_queries(case)
    c = Certifier(b)
    assert c.screen is not None
    rng = np.random.default_rng(5)
    d = x.shape[1]
    one_hot = np.eye(d)[rng.integers(0, d, 400)] * rng.choice([-1, 1], (400, 1)) \
        * rng.uniform(0.1, 1e3, (400, 1))
    queries = np.concatenate([x, one_hot])
    xq = c._check_queries(queries)
    feats = c._features(xq)
    pred = torch.as_tensor(c.predict(queries))
    worst = 0.0
    for j in range(len(c.k_values)):
        jj = torch.full_like(pred, j)
        est, bar = _estimate_and_bar(c, feats, pred, jj)
        ref = _reference_bound(c, feats, pred, jj)
        assert bool(((ref - est).abs() <= bar / SAFETY).all()), f"box {j}"
        worst = max(worst, float(((ref - est).abs() / bar).max()))
    assert worst > 1e-3                      # the bar is not absurdly loose either


@pytest.mark.parametrize("case", list(CASES))
def test_screened_search_decides_exactly_as_the_reference(case, monkeypatch):
    """Random and boundary-placed queries: the screened binary search (per step, and over
    one verdict table of every box), the unscreened one and the linear scan give the same
    predictions and radii; boundary queries reach the reference through the screen's
    unsure pairs on both paths."""
    b, x = _bundle_and_queries(case)
    c = Certifier(b)
    rng = np.random.default_rng(7)
    edge = _boundary_queries(c, x, rng)
    queries = np.concatenate([x, edge]).astype(np.float64)
    unsure = []
    real = c.screen.decide

    def counting(*args):
        sure, unsure_now = real(*args)
        unsure[-1] += int(unsure_now.sum())
        return sure, unsure_now

    c.screen.decide = counting           # `decide_grid` decides through it too
    screened = []
    for budget in (0, 1 << 40):          # per step; then every chunk as one verdict table
        monkeypatch.setattr(certifier_module, "_TABLE_ELEMENTS", budget)
        unsure.append(0)
        screened.append(c.certify(queries))
    linear = c.certify_linear(queries)
    c._screen = False
    plain = c.certify(queries)
    for one in screened:
        for other in (linear, plain):
            assert np.array_equal(one.prediction, other.prediction)
            assert np.array_equal(one.radius, other.radius)
            assert np.array_equal(one.max_certified_k, other.max_certified_k)
    assert min(unsure) > 0


def test_a_screen_without_its_error_bar_is_caught():
    """With the bar set to zero the screen certifies boundary queries the reference does
    not certify: the comparison above can fail."""
    b, x = _bundle_and_queries("two logits")
    c = Certifier(b)
    edge = _boundary_queries(c, x, np.random.default_rng(8))
    reference = c.certify_linear(edge)
    c.screen.slope = torch.zeros_like(c.screen.slope)
    c.screen.intercept = torch.zeros_like(c.screen.intercept)
    broken = c.certify(edge)
    assert not np.array_equal(broken.max_certified_k, reference.max_certified_k)


def test_models_the_screen_does_not_cover_keep_the_reference_path():
    from tests.helpers import MLP

    ds = blobs(200, seed=3)
    b = from_result(train(config(MLP, "cross_entropy", k_values="0..5"), ds))
    assert Certifier(b).screen is None
