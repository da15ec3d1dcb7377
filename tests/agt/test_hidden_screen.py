"""The hidden-layer screen decides exactly as the reference box test
(agt/certify/hidden_screen.py): its error bar holds without its safety factor at every box,
the screened binary search gives the reference's radii on random queries and on queries
placed where a box's margin bound crosses zero, and a screen with too small an error bar is
caught."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agt.certify import Certifier, hidden_screen
from agt.certify import certifier as certifier_module
from agt.data import load_dataset
from agt.interval import Interval
from agt.store import from_result
from agt.training import train
from tests.helpers import MLP_BCE, blobs, config, images

DIGITS_MLP = [{"linear": {"in": 64, "out": 16}}, {"relu": {}}, {"linear": {"in": 16, "out": 10}}]
TWO_HIDDEN = [{"linear": {"in": 6, "out": 8}}, {"relu": {}}, {"linear": {"in": 8, "out": 8}},
              {"relu": {}}, {"linear": {"in": 8, "out": 2}}]
PREFIX_MLP = [{"linear": {"in": 6, "out": 12}}, {"relu": {}}, {"linear": {"in": 12, "out": 10}},
              {"relu": {}}, {"linear": {"in": 10, "out": 1}}]
# a frozen prefix of two convolutions (run channels-last by agt/certify/prefix_box.py) in
# front of a 36-10-1 head: the OctMNIST head's shape in small
CONV_PREFIX_MLP = [{"conv2d": {"in": 1, "out": 3, "kernel": 3, "stride": 1}}, {"relu": {}},
                   {"conv2d": {"in": 3, "out": 4, "kernel": 2, "stride": 1}}, {"relu": {}},
                   {"flatten": {}}, {"linear": {"in": 36, "out": 10}}, {"relu": {}},
                   {"linear": {"in": 10, "out": 1}}]

CASES = {
    "one hidden, one logit": (MLP_BCE, "binary_cross_entropy", "blobs", "float64", {}),
    "one hidden, one logit, float32": (MLP_BCE, "binary_cross_entropy", "blobs", "float32", {}),
    "ten classes": (DIGITS_MLP, "cross_entropy", "digits", "float64", {}),
    "ten classes, float32": (DIGITS_MLP, "cross_entropy", "digits", "float32", {}),
    "two hidden": (TWO_HIDDEN, "cross_entropy", "separable", "float64",
                   {"learning_rate": 0.5, "n_epochs": 4}),
    "frozen prefix": (PREFIX_MLP, "binary_cross_entropy", "blobs", "float32",
                      {"frozen_layers": 2}),
    # more queries than `_SERVED_ROWS`: the served pass runs in blocks
    "conv prefix": (CONV_PREFIX_MLP, "binary_cross_entropy", "images", "float32",
                    {"frozen_layers": 5}),
}
_BUNDLES: dict = {}


def _bundle_and_queries(case: str):
    if case not in _BUNDLES:
        model, loss, data, dtype, extra = CASES[case]
        if data == "images":
            ds = images(200, seed=9)
            queries = np.concatenate([ds.x_test, ds.x_train[:100]])
        else:
            ds = (load_dataset("digits", {"seed": 3, "max_train": 300}) if data == "digits"
                  else blobs(200, seed=31, variant="separable" if data == "separable"
                             else "overlapping"))
            queries = np.asarray(ds.x_test)
        kw = dict(n_epochs=2, k_values="0..20", dtype=dtype, learning_rate=0.2,
                  batch_size=100)
        cfg = config(model, loss, **{**kw, **extra})
        _BUNDLES[case] = (from_result(train(cfg, ds)), queries)
    return _BUNDLES[case]


def _reference_bound(c: Certifier, feats, pred, j):
    params = {n: Interval(c.lower[n][j], c.upper[n][j]) for n in c.trainable}
    return c.margin_lower_bound(feats, pred, params, c.fm.graded(c.k_float[j]))


def _estimate(c: Certifier, queries: np.ndarray, j: int):
    xq = c._check_queries(queries)
    feats = c._features(xq)
    pred = torch.as_tensor(c.predict(queries))
    est, err = c.hidden_screen.estimate(c.hidden_screen.prepare(feats), pred,
                                        torch.full_like(pred, j))
    return est, err, feats, pred


def _along(a: np.ndarray, b: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The points (1 - t) a + t b, one per t (queries of any feature shape)."""
    t = ts.reshape(-1, *([1] * a.ndim))
    return (1 - t) * a + t * b


def _boundary_queries(c: Certifier, x: np.ndarray, rng, n: int = 40) -> np.ndarray:
    """Queries on the segment between two queries of different classes where the screen's
    estimate at some box crosses zero (bisection to the last float): pairs within its
    error bar, which it must leave to the reference."""
    pred = c.predict(x)
    out = []
    K = len(c.k_values)
    for _ in range(n):
        a = x[rng.choice(np.flatnonzero(pred == pred[0]))]
        b = x[rng.choice(np.flatnonzero(pred != pred[0]))]
        j = int(rng.integers(0, K))
        ts = np.linspace(0.0, 1.0, 65)
        segment = _along(a, b, ts)
        est = _estimate(c, segment, j)[0].numpy()
        side = (est > 0) * 2 + c.predict(segment)
        change = np.flatnonzero(side[1:] != side[:-1])
        if not change.size:
            continue
        lo, hi = ts[change[0]], ts[change[0] + 1]
        s_lo = side[change[0]]
        for _ in range(60):
            mids = np.linspace(lo, hi, 9)
            pts = _along(a, b, mids)
            s = (_estimate(c, pts, j)[0].numpy() > 0) * 2 + c.predict(pts)
            first = int(np.argmax(s != s_lo)) if (s != s_lo).any() else 8
            lo, hi = mids[max(first - 1, 0)], mids[first]
            if hi - lo <= 4 * np.spacing(max(abs(hi), 1e-300)):
                break
        out += [(1 - lo) * a + lo * b, (1 - hi) * a + hi * b]
    return np.stack(out)


@pytest.mark.parametrize("case", list(CASES))
def test_the_screen_is_used_and_its_error_bar_holds_without_the_safety_factor(case):
    """|reference bound - estimate| <= e (the bar without SAFETY) at every 4th box, on test
    queries and on scaled ones (large magnitudes); and the screen decides almost every pair
    by itself."""
    b, x = _bundle_and_queries(case)
    c = Certifier(b)
    assert c.hidden_screen is not None and c.screen is None
    queries = np.concatenate([x[:80], x[:20] * 1e3, x[:20] * 1e-3])
    decided = total = 0
    for j in range(0, len(c.k_values), 4):
        est, err, feats, pred = _estimate(c, queries, j)
        ref = _reference_bound(c, feats, pred, torch.full_like(pred, j))
        assert bool(((ref - est).abs() <= err).all()), f"box {j}"
        decided += int(((est - hidden_screen.SAFETY * err > 0)
                        | (est + hidden_screen.SAFETY * err < 0)).sum())
        total += len(queries)
    assert decided >= 0.99 * total


@pytest.mark.parametrize("case", list(CASES))
def test_screened_search_decides_exactly_as_the_reference(case, monkeypatch):
    """Random and boundary-placed queries: the screened binary search (per step, and over
    one verdict table of every box), the unscreened one and the linear scan give the same
    predictions and radii; in float64 boundary queries reach the reference through the
    screen's unsure pairs on both paths (float32 queries cannot come closer to a zero of
    the bound than a float32 step, far outside the bar)."""
    b, x = _bundle_and_queries(case)
    c = Certifier(b)
    edge = _boundary_queries(c, x, np.random.default_rng(7), n=8)
    queries = np.concatenate([x, edge])
    unsure = []
    screen = c.hidden_screen

    def counting(real):
        def count(*args):
            sure, unsure_now = real(*args)
            unsure[-1] += int(unsure_now.sum())
            return sure, unsure_now
        return count

    screen.decide = counting(screen.decide)
    screen.decide_grid = counting(screen.decide_grid)
    screened = []
    for budget in (0, 1 << 40):          # per step; then every chunk as one verdict table
        monkeypatch.setattr(certifier_module, "_HIDDEN_TABLE_ELEMENTS", budget)
        unsure.append(0)
        screened.append(c.certify(queries))
    linear = c.certify_linear(queries)
    c._hidden = False
    plain = c.certify(queries)
    for one in screened:
        for other in (linear, plain):
            assert np.array_equal(one.prediction, other.prediction)
            assert np.array_equal(one.radius, other.radius)
            assert np.array_equal(one.max_certified_k, other.max_certified_k)
    assert min(unsure) > 0 or CASES[case][3] == "float32"


def test_a_screen_with_too_small_an_error_bar_is_caught(monkeypatch):
    """With the safety factor set to 1e-9 the screen decides boundary pairs its bar cannot
    tell, and certifies differently from the reference: the comparison above can fail."""
    b, x = _bundle_and_queries("ten classes")
    c = Certifier(b)
    edge = _boundary_queries(c, x, np.random.default_rng(8), n=16)
    reference = c.certify_linear(edge)
    monkeypatch.setattr(hidden_screen, "SAFETY", 1e-9)
    broken = c.certify(edge)
    assert not np.array_equal(broken.max_certified_k, reference.max_certified_k)


def test_release_inputs_are_unchanged_by_the_screen(monkeypatch):
    """The library call behind the CLI, the service and teacher labels (`agt.api.certify`,
    a `Certifier`) goes through the screen and hands a release the same inputs as with the
    screen switched off."""
    import mechanisms
    from agt import api

    b, x = _bundle_and_queries("one hidden, one logit, float32")
    # the per-step search (a verdict table decides through `decide_grid`, tested above)
    monkeypatch.setattr(certifier_module, "_HIDDEN_TABLE_ELEMENTS", 0)
    calls = []
    real = hidden_screen.HiddenLayerScreen.decide

    def counting(self, *args):
        calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(hidden_screen.HiddenLayerScreen, "decide", counting)
    screened = mechanisms.Certified.from_certificate(api.certify(b, x))
    assert calls
    monkeypatch.setattr(certifier_module, "_hidden_screen_fits", lambda *a: False)
    reference = mechanisms.Certified.from_certificate(api.certify(b, x))
    assert len(calls) == 5 and reference.source == screened.source
    assert np.array_equal(reference.prediction, screened.prediction)
    assert np.array_equal(reference.radius, screened.radius)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("case", ["ten classes", "frozen prefix"])
def test_screened_search_on_cuda_decides_as_the_reference_on_cuda(case):
    """On a GPU the screen's matrix products run in cuBLAS: the screened search still gives
    the reference's radii on the same device (run by benchmarks/gpu_check.py)."""
    b, x = _bundle_and_queries(case)
    c = Certifier(b, device="cuda")
    assert c.hidden_screen is not None
    screened = c.certify(x)
    c._hidden = False
    reference = c.certify(x)
    assert np.array_equal(screened.radius, reference.radius)
    assert np.array_equal(screened.prediction, reference.prediction)


@pytest.mark.parametrize("case", ["ten classes", "one hidden, one logit"])
def test_a_bar_without_the_float32_products_rounding_is_caught(monkeypatch, case):
    """The first layer's per-step products are float32 (module docstring): with their
    rounding left out of the bar (u32 = 0) the estimate leaves it on the same queries as
    the test above (float64 data; ten classes through the reference's head, one logit
    through the rearranged one), so that test can fail."""
    b, x = _bundle_and_queries(case)
    c = Certifier(b)
    monkeypatch.setattr(hidden_screen, "_U32", 0.0)
    queries = np.concatenate([x[:80], x[:20] * 1e3, x[:20] * 1e-3])
    escaped = 0
    for j in range(0, len(c.k_values), 4):
        est, err, feats, pred = _estimate(c, queries, j)
        ref = _reference_bound(c, feats, pred, torch.full_like(pred, j))
        escaped += int(((ref - est).abs() > err).sum())
    assert escaped > 0


@pytest.mark.parametrize("case", ["one hidden, one logit, float32", "frozen prefix"])
def test_the_rearranged_binary_head_is_the_reference_head_up_to_rounding(case):
    """One logit behind a ReLU: the screen's sums over units (`_binary_head`) and the
    reference's four-corner code (`Certifier.head_margin`) on the same hidden boxes agree
    to float64 rounding (1e-12 of the magnitudes), while the float32 widenings they both
    carry are about 1e-6 of them: a rearrangement that lost or doubled a widening term
    would differ by far more (checked: the bias widening doubled)."""
    b, x = _bundle_and_queries(case)
    c = Certifier(b)
    screen = c.hidden_screen
    assert screen.binary
    xq = c._check_queries(np.concatenate([x[:60], x[:20] * 1e3]))
    feats = c._features(xq)
    pred = torch.as_tensor(c.predict(xq.numpy()))
    parts = screen.prepare(feats)
    for j in range(0, len(c.k_values), 5):
        box = torch.full_like(pred, j)
        fm = screen.fm.graded(screen.k_values.index_select(0, box))
        assert [layer.kind for _, layer in screen.body[1:]] == ["relu"]
        h = hidden_screen.iv.relu(screen._first_layer(parts, box, fm)[0])
        fast, _, m = screen._binary_head(h, torch.zeros_like(h.lo[:, 0]), pred, box, fm)
        W = screen._box(f"{screen.last}.weight", box)
        bias = screen._box(f"{screen.last}.bias", box)
        ref = screen.head(h.map(lambda t: t[:, 0]), pred, W, bias, fm)
        assert bool(((fast - ref).abs() <= 1e-12 * (m + 1e-300)).all()), f"box {j}"
        widening = 2 * fm.coeff(1) * m
        assert bool((widening > 1e-8 * m).all())
