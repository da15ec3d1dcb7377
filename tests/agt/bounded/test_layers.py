"""Soundness of the bounded layers, losses and network passes (agt/bounded/).

Contract tests run against every layer rule through small sequential models (linear, MLP,
convolutional; cross-entropy and binary cross-entropy; float64 and float32):

(a) zero-width parameter boxes: the nominal pass equals torch (nn.Sequential logits,
    torch.func per-sample gradients) and the interval boxes contain it and are tiny;
(b) random parameter boxes (several groups of different widths, exact or interval inputs):
    logits and per-sample gradients computed by torch.func at sampled parameters (and
    inputs) - corners and interior points, in float64 and in the nominal dtype - and by the
    agt nominal pass, lie inside the bounds of their group;
(c) nested boxes give nested logit and gradient bounds.

Also: a per-rule contract suite over every registered layer rule (zero-width and wide
parameter/input/output-gradient boxes, three magnitudes), float32 at scale with
pre-activations within rounding of 0, GradSource row chunks, a frozen prefix, and direct
tests of the loss-gradient bounds over random logit boxes.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call, grad, vmap

from agt.bounded.layers import RULES, rule_for
from agt.bounded.losses import loss_grad_bounds, loss_grad_nominal, softmax_bounds
from agt.bounded.network import Network
from agt.interval import FloatModel, Interval
from agt.models import LayerSpec, ModelSpec, init_params

F64, F32 = torch.float64, torch.float32
BCE, CE = "binary_cross_entropy", "cross_entropy"
DTYPES = (F64, F32)

MODELS = {
    "logistic_bce": ([{"linear": {"in": 6, "out": 1}}], (6,), BCE),
    "linear_ce": ([{"linear": {"in": 6, "out": 2}}], (6,), CE),
    "mlp_ce": ([{"linear": {"in": 6, "out": 16}}, {"relu": {}},
                {"linear": {"in": 16, "out": 3}}], (6,), CE),
    "mlp_bce": ([{"linear": {"in": 5, "out": 8}}, {"relu": {}},
                 {"linear": {"in": 8, "out": 1}}], (5,), BCE),
    "conv_ce": ([{"conv2d": {"in": 1, "out": 3, "kernel": 3, "stride": 2}}, {"relu": {}},
                 {"flatten": {}}, {"linear": {"in": 27, "out": 2}}], (1, 8, 8), CE),
    "conv_bce": ([{"conv2d": {"in": 1, "out": 3, "kernel": 3, "stride": 2}}, {"relu": {}},
                  {"flatten": {}}, {"linear": {"in": 27, "out": 1}}], (1, 8, 8), BCE),
    # two convolutions (padding, no bias on the second): exercises the conv input-gradient
    # (fold) rule and a bias-free layer
    "conv2_ce": ([{"conv2d": {"in": 1, "out": 2, "kernel": 3, "stride": 1, "padding": 1}},
                  {"relu": {}},
                  {"conv2d": {"in": 2, "out": 3, "kernel": 3, "stride": 2, "bias": False}},
                  {"relu": {}}, {"flatten": {}}, {"linear": {"in": 27, "out": 3}}],
                 (1, 8, 8), CE),
}
MODEL_NAMES = tuple(MODELS)
BATCH = 5

# Relative width (w.r.t. the largest nominal value of the tensor) of results on zero-width
# boxes. Measured: <= 4e-12 in float64; in float32 3e-5 .. 7e-4 (the 2-conv model): the
# loss-gradient slack of agt/bounded/losses.py, (C + 4) * 32 * u ~ 1e-5 absolute on dL/dz,
# dominates and is summed over all positions of a convolution's weight gradient.
ZERO_WIDTH_REL = {F64: 1e-9, F32: 2e-3}
# agreement of the agt nominal pass with torch
NOMINAL_RTOL = {F64: 1e-12, F32: 1e-5}
GRAD_RTOL = {F64: 1e-10, F32: 1e-4}


# ------------------------------------------------------------------------------ helpers

pytestmark = pytest.mark.usefixtures("one_thread")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_case(name: str, dtype: torch.dtype, seed: int = 0):
    entries, in_shape, loss = MODELS[name]
    spec = ModelSpec.from_config(entries).with_input_shape(in_shape)
    gen = _gen(1000 + seed)
    params = init_params(spec, seed, F64)
    # rescale so logits are O(1) and ReLUs are active and inactive
    params = {k: (v * 1.5).to(dtype) for k, v in params.items()}
    x = (torch.randn((BATCH,) + in_shape, generator=gen, dtype=F64) * 1.5).to(dtype)
    n_logits = spec.n_logits
    y = torch.randint(0, 2 if loss == BCE else n_logits, (BATCH,), generator=gen)
    return spec, loss, params, x, y


def round_out(lo: torch.Tensor, hi: torch.Tensor, dtype: torch.dtype):
    """Round the ends of a float64 box outward to values representable in dtype."""
    if dtype == F64:
        return lo, hi
    lo_d, hi_d = lo.to(dtype), hi.to(dtype)
    lo_d = torch.where(lo_d.to(F64) > lo,
                       torch.nextafter(lo_d, torch.tensor(-math.inf, dtype=dtype)), lo_d)
    hi_d = torch.where(hi_d.to(F64) < hi,
                       torch.nextafter(hi_d, torch.tensor(math.inf, dtype=dtype)), hi_d)
    return lo_d.to(F64), hi_d.to(F64)


def box_around(gen, center: torch.Tensor, rel_widths, dtype) -> Interval:
    """A box per group g around ``center`` with asymmetric relative width rel_widths[g]."""
    c = center.to(F64)
    los, his = [], []
    for w in rel_widths:
        scale = w * (c.abs() + 0.1)
        # shift the centre a little, so groups differ by more than their widths
        shift = (torch.rand(c.shape, generator=gen, dtype=F64) - 0.5) * scale
        lo = c + shift - scale * torch.rand(c.shape, generator=gen, dtype=F64)
        hi = c + shift + scale * torch.rand(c.shape, generator=gen, dtype=F64)
        lo, hi = round_out(lo, hi, dtype)
        los.append(lo)
        his.append(hi)
    return Interval(torch.stack(los), torch.stack(his))


def sample_box(gen, lo: torch.Tensor, hi: torch.Tensor, dtype, n_corners: int,
               n_interior: int) -> torch.Tensor:
    """(P, *shape) dtype points: all-lower, all-upper, random corners, interior points.
    Points with the same index across calls form joint corners of a product box."""
    pts = [lo, hi]
    for _ in range(n_corners):
        pts.append(torch.where(torch.rand(lo.shape, generator=gen) < 0.5, lo, hi))
    for _ in range(n_interior):
        t = torch.rand(lo.shape, generator=gen, dtype=F64)
        p = (lo + t * (hi - lo)).to(dtype).to(F64)
        pts.append(torch.minimum(torch.maximum(p, lo), hi))
    return torch.stack(pts).to(dtype)


def torch_reference(spec, loss, params, x, y, dtype, params_batched: bool, x_batched: bool):
    """torch.func per-sample gradients (flattened, (..., b, numel)) and logits (..., b, C).

    params: dict name -> (P, *shape) if params_batched; x: (P, b, ...) if x_batched."""
    module = spec.build(dtype)

    def per_sample(p, xi, yi):
        z = functional_call(module, p, (xi.unsqueeze(0),))
        if loss == BCE:
            value = F.binary_cross_entropy_with_logits(z[:, 0], yi.to(z.dtype).unsqueeze(0),
                                                       reduction="sum")
        else:
            value = F.cross_entropy(z, yi.unsqueeze(0), reduction="sum")
        return value, z[0]

    fn = vmap(grad(per_sample, has_aux=True), in_dims=(None, 0, 0))
    params = {k: v.to(dtype) for k, v in params.items()}
    x = x.to(dtype)
    if params_batched or x_batched:
        # a loop over the sampled points (vmapping over convolution weights takes torch's
        # grouped slow_conv2d path, which is very slow in float64)
        n = next(iter(params.values())).shape[0] if params_batched else x.shape[0]
        outs = [fn({k: v[i] for k, v in params.items()} if params_batched else params,
                   x[i] if x_batched else x, y) for i in range(n)]
        grads = {k: torch.stack([o[0][k] for o in outs]) for k in outs[0][0]}
        logits = torch.stack([o[1] for o in outs])
    else:
        grads, logits = fn(params, x, y)
    lead = logits.shape[:-1]
    return {k: g.reshape(*lead, -1) for k, g in grads.items()}, logits


def nominal_grads(net: Network, params, x, y, loss):
    srcs = net.grads_nominal(params, x, y, loss)
    return {k: s.fn(0, s.n_rows) for k, s in srcs.items()}


def bound_grads(net: Network, params, x, y, loss, fm):
    srcs = net.grads_bounds(params, x, y, loss, fm)
    return {k: s.fn(0, s.n_rows) for k, s in srcs.items()}


def assert_inside(box: Interval, value: torch.Tensor, what: str) -> None:
    value = value.to(F64)
    assert box.shape == value.shape, f"{what}: shapes {tuple(box.shape)} vs {tuple(value.shape)}"
    assert not torch.isnan(value).any(), f"{what}: NaN"
    ok = box.contains(value)
    if not bool(ok.all()):
        gap = torch.where(ok, torch.zeros_like(value),
                          torch.maximum(box.lo - value, value - box.hi))
        i = int(torch.argmax(gap.reshape(-1)))
        width = box.width().reshape(-1)[i].item()
        raise AssertionError(
            f"{what}: {int((~ok).sum())} of {ok.numel()} values outside; worst at flat index "
            f"{i}: value {value.reshape(-1)[i].item()!r} vs "
            f"[{box.lo.reshape(-1)[i].item()!r}, {box.hi.reshape(-1)[i].item()!r}] "
            f"(gap {gap.reshape(-1)[i].item():.3e}, box width {width:.3e})")


def assert_nested(inner: Interval, outer: Interval, what: str) -> None:
    """inner inside outer up to a few float64 ulps of the outer magnitude: the interval
    rules are inclusion-monotone in exact arithmetic; their float64
    evaluation may round two nearly equal ends in opposite directions (seen: 8.5e-19 on
    ends of magnitude 5e-16 from a box of magnitude 0.08)."""
    tol = 8 * 2.0**-53 * outer.magnitude() + 1e-300
    ok = (outer.lo - tol <= inner.lo) & (inner.hi <= outer.hi + tol)
    if not bool(ok.all()):
        gap = torch.maximum(outer.lo - inner.lo, inner.hi - outer.hi)
        raise AssertionError(f"{what}: inner box sticks out by {float(gap.max()):.3e}")


def point_box(t: torch.Tensor, groups: int = 1) -> Interval:
    t = t.to(F64).unsqueeze(0).expand(groups, *t.shape).contiguous()
    return Interval(t, t.clone())


# ------------------------------------------------------------ (a) zero-width boxes

@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_zero_width_boxes_match_torch(name, dtype):
    spec, loss, params, x, y = make_case(name, dtype)
    net = Network(spec.layers)
    fm = FloatModel(dtype)

    # nominal logits == nn.Sequential
    module = spec.build(dtype)
    module.load_state_dict(params)
    with torch.no_grad():
        ref_logits = module(x)
    logits, _ = net.forward_nominal(params, x)
    assert logits.dtype == dtype and logits.shape == ref_logits.shape
    scale = float(ref_logits.abs().max())
    torch.testing.assert_close(logits, ref_logits, rtol=NOMINAL_RTOL[dtype],
                               atol=NOMINAL_RTOL[dtype] * scale)

    # nominal per-sample gradients == torch.func per-sample gradients
    ref_grads, ref_logits2 = torch_reference(spec, loss, params, x, y, dtype, False, False)
    torch.testing.assert_close(ref_logits2, ref_logits, rtol=NOMINAL_RTOL[dtype],
                               atol=NOMINAL_RTOL[dtype] * scale)
    nom = nominal_grads(net, params, x, y, loss)
    assert set(nom) == set(spec.trainable_param_names()) == set(ref_grads)
    for k in nom:
        assert nom[k].shape == (BATCH, params[k].numel()), k
        gscale = float(ref_grads[k].abs().max()) + 1e-30
        torch.testing.assert_close(nom[k], ref_grads[k], rtol=GRAD_RTOL[dtype],
                                   atol=GRAD_RTOL[dtype] * gscale, msg=lambda m: f"{k}: {m}")

    # interval passes on point boxes (two identical groups) contain the nominal values
    # and are tiny
    pbox = {k: point_box(v, 2) for k, v in params.items()}
    xb = x.to(F64)
    zb, _ = net.forward_bounds(pbox, xb, fm)
    assert zb.shape == (2,) + tuple(logits.shape)
    for g in range(2):
        assert_inside(zb[g], logits, "logits (nominal)")
        assert_inside(zb[g], ref_logits, "logits (torch)")
    rel = ZERO_WIDTH_REL[dtype]
    assert float(zb.width().max()) <= rel * scale
    gb = bound_grads(net, pbox, xb, y, loss, fm)
    for k in nom:
        for g in range(2):
            assert_inside(gb[k][g], nom[k], f"{k} gradient (nominal)")
            assert_inside(gb[k][g], ref_grads[k], f"{k} gradient (torch.func)")
        gscale = float(nom[k].abs().max())
        assert float(gb[k].width().max()) <= rel * gscale, \
            f"{k}: width {float(gb[k].width().max()):.3e} vs scale {gscale:.3e}"


@pytest.mark.parametrize("name", ["mlp_ce", "conv2_ce"])
def test_zero_width_interval_input_equals_exact_input(name):
    """An exact input given as a point Interval (1, b, ...) gives the same enclosures."""
    spec, loss, params, x, y = make_case(name, F32)
    net = Network(spec.layers)
    fm = FloatModel(F32)
    pbox = {k: point_box(v) for k, v in params.items()}
    nom = nominal_grads(net, params, x, y, loss)
    gb = bound_grads(net, pbox, point_box(x), y, loss, fm)
    for k in nom:
        assert_inside(gb[k][0], nom[k], k)
        assert float(gb[k].width().max()) <= ZERO_WIDTH_REL[F32] * float(nom[k].abs().max())


# --------------------------------------------------- GradSource row chunks are slices

@pytest.mark.parametrize("name", ["mlp_ce", "conv2_ce"])
def test_grad_source_row_chunks(name):
    spec, loss, params, x, y = make_case(name, F64)
    net = Network(spec.layers)
    gen = _gen(5)
    pbox = {k: box_around(gen, v, [1e-3, 1e-2], F64) for k, v in params.items()}
    nom = net.grads_nominal(params, x, y, loss)
    bnd = net.grads_bounds(pbox, x, y, loss, FloatModel(F64))
    for k, src in nom.items():
        assert src.n_rows * src.row_size == params[k].numel()
        full = src.fn(0, src.n_rows)
        bfull = bnd[k].fn(0, src.n_rows)
        assert bfull.shape == (2, BATCH, params[k].numel())
        for start in range(src.n_rows):
            stop = min(src.n_rows, start + 2)
            cols = slice(start * src.row_size, stop * src.row_size)
            # equal up to rounding: a different row count may change the kernel's
            # summation order
            part, bpart = src.fn(start, stop), bnd[k].fn(start, stop)
            torch.testing.assert_close(part, full[:, cols], rtol=1e-13, atol=1e-15)
            torch.testing.assert_close(bpart.lo, bfull.lo[..., cols], rtol=1e-13, atol=1e-15)
            torch.testing.assert_close(bpart.hi, bfull.hi[..., cols], rtol=1e-13, atol=1e-15)
            assert_inside(bpart[0], full[:, cols], f"{k} rows {start}:{stop}")
            assert_inside(bfull[0][..., cols], part, f"{k} rows {start}:{stop}")


# ---------------------------------------------------------- (b) random boxes, sampled

REL_WIDTHS = (0.0, 1e-4, 1e-2, 0.1)       # G = 4 groups of very different widths
N_CORNERS, N_INTERIOR = 6, 6


def _check_random_boxes(name, dtype, interval_input: str, seed: int = 0):
    spec, loss, params, x, y = make_case(name, dtype, seed)
    net = Network(spec.layers)
    fm = FloatModel(dtype)
    gen = _gen(77 + seed)
    pbox = {k: box_around(gen, v, REL_WIDTHS, dtype) for k, v in params.items()}
    n_groups = len(REL_WIDTHS)
    if interval_input == "exact":
        xin = x.to(F64)
    elif interval_input == "shared":            # one input box for every group: (1, b, ...)
        xin = box_around(gen, x, [0.05], dtype)
    else:                                       # one input box per group: (G, b, ...)
        xin = box_around(gen, x, [0.0, 0.01, 0.02, 0.05], dtype)
    zb, _ = net.forward_bounds(pbox, xin, fm)
    gb = bound_grads(net, pbox, xin, y, loss, fm)
    assert zb.shape == (n_groups, BATCH, spec.n_logits)
    # logit bounds are float64; per-sample gradient bounds come in the compute (nominal)
    # dtype, rounded outward when cast (see GradSource.samples_last)
    for k, box in [("logits", zb)] + list(gb.items()):
        want = F64 if k == "logits" else dtype
        assert box.lo.dtype == want and box.hi.dtype == want, k
        assert bool(torch.isfinite(box.lo).all() and torch.isfinite(box.hi).all()), k
        assert bool((box.lo <= box.hi).all()), k

    for g in range(n_groups):
        pts = {k: sample_box(gen, b.lo[g], b.hi[g], dtype, N_CORNERS, N_INTERIOR)
               for k, b in pbox.items()}
        n_pts = 2 + N_CORNERS + N_INTERIOR
        if interval_input == "exact":
            xs = None
        else:
            gx = 0 if xin.shape[0] == 1 else g
            xs = sample_box(gen, xin.lo[gx], xin.hi[gx], dtype, N_CORNERS, N_INTERIOR)
        # torch.func in float64 (the exact result up to float64 rounding) and in dtype
        ref_dtypes = (F64,) if dtype == F64 else (F64, F32)
        for rd in ref_dtypes:
            grads, logits = torch_reference(spec, loss, pts, x if xs is None else xs, y, rd,
                                            True, xs is not None)
            for p in range(n_pts):
                assert_inside(zb[g], logits[p], f"group {g} point {p}: logits (torch {rd})")
                for k in grads:
                    assert_inside(gb[k][g], grads[k][p],
                                  f"group {g} point {p}: {k} gradient (torch {rd})")
        # the agt nominal pass (the definition of the nominal computation)
        for p in range(n_pts):
            pp = {k: v[p] for k, v in pts.items()}
            xp = x if xs is None else xs[p]
            z, _ = net.forward_nominal(pp, xp)
            assert_inside(zb[g], z, f"group {g} point {p}: logits (agt nominal)")
            for k, v in nominal_grads(net, pp, xp, y, loss).items():
                assert_inside(gb[k][g], v, f"group {g} point {p}: {k} gradient (agt nominal)")
    # group widths are ordered like the box widths
    for k in gb:
        widths = [float(gb[k][g].width().mean()) for g in range(n_groups)]
        if interval_input == "exact":
            assert widths == sorted(widths), (k, widths)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_random_boxes_contain_sampled_gradients(name, dtype):
    _check_random_boxes(name, dtype, "exact")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_random_boxes_with_interval_inputs(name, dtype):
    _check_random_boxes(name, dtype, "shared")


@pytest.mark.parametrize("name", ["mlp_bce", "conv2_ce"])
def test_random_boxes_with_grouped_interval_inputs(name):
    _check_random_boxes(name, F32, "grouped", seed=1)


@settings(max_examples=16, deadline=None, derandomize=True, database=None)
@given(name=st.sampled_from(MODEL_NAMES), dtype=st.sampled_from(DTYPES),
       mode=st.sampled_from(["exact", "shared"]), seed=st.integers(1, 10**6))
def test_random_boxes_more_seeds(name, dtype, mode, seed):
    _check_random_boxes(name, dtype, mode, seed)


# ----------------------------------------------------------------- (c) nested boxes

def _sub_box(gen, box: Interval) -> Interval:
    w = box.width()
    t1 = torch.rand(w.shape, generator=gen, dtype=F64) * 0.5
    t2 = torch.rand(w.shape, generator=gen, dtype=F64) * 0.5
    keep = torch.rand(w.shape, generator=gen) < 0.3            # some ends shared
    t1 = torch.where(keep, torch.zeros_like(t1), t1)
    lo = torch.clamp(box.lo + t1 * w, max=box.hi)
    hi = torch.maximum(torch.clamp(box.hi - t2 * w, min=box.lo), lo)
    return Interval(lo, hi)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("interval_input", [False, True], ids=["exact_x", "interval_x"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_nested_boxes_give_nested_bounds(name, dtype, interval_input):
    spec, loss, params, x, y = make_case(name, dtype, seed=3)
    net = Network(spec.layers)
    fm = FloatModel(dtype)
    gen = _gen(11)
    outer = {k: box_around(gen, v, (1e-3, 3e-2, 0.1), dtype) for k, v in params.items()}
    inner = {k: _sub_box(gen, b) for k, b in outer.items()}
    # a point inside, as a zero-width box
    point = {k: Interval(b.lo + 0.5 * b.width(), b.lo + 0.5 * b.width()) for k, b in inner.items()}
    if interval_input:
        x_out = box_around(gen, x, [0.05], dtype)
        x_in = _sub_box(gen, x_out)
        x_pt = Interval(x_in.lo, x_in.lo)
    else:
        x_out = x_in = x_pt = x.to(F64)
    chain = [(outer, x_out), (inner, x_in), (point, x_pt)]
    logits = [net.forward_bounds(p, xx, fm)[0] for p, xx in chain]
    grads = [bound_grads(net, p, xx, y, loss, fm) for p, xx in chain]
    for level in (1, 2):
        assert_nested(logits[level], logits[level - 1], f"logits level {level}")
        for k in grads[0]:
            assert_nested(grads[level][k], grads[level - 1][k], f"{k} gradient level {level}")


# ------------------------------------------- float32 at scale, near-zero pre-activations

def test_float32_near_zero_pre_activations():
    """float32 nominal and interval passes may round a pre-activation to opposite
    sides of 0. Build inputs whose first-layer pre-activations are within rounding of 0 for
    several units, and check the agt nominal and torch.func float32 gradients of a large
    batch against zero-width boxes."""
    spec, loss, params, _, _ = make_case("mlp_ce", F32, seed=4)
    gen = _gen(9)
    n = 3000
    w = params["0.weight"].to(F64)
    bias = params["0.bias"].to(F64)
    x = torch.randn(n, 6, generator=gen, dtype=F64)
    unit = torch.randint(0, w.shape[0], (n,), generator=gen)
    # solve for the last feature so that unit `unit` has pre-activation 0 in exact arithmetic
    rest = (x[:, :-1] * w[unit, :-1]).sum(-1) + bias[unit]
    x[:, -1] = -rest / w[unit, -1]
    x = x.to(F32)
    y = torch.randint(0, 3, (n,), generator=gen)
    net = Network(spec.layers)
    z0 = (x @ params["0.weight"].T + params["0.bias"])[torch.arange(n), unit]
    assert float(z0.abs().max()) < 1e-4                  # really near 0
    assert bool((z0 > 0).any() and (z0 <= 0).any())
    pbox = {k: point_box(v) for k, v in params.items()}
    gb = bound_grads(net, pbox, x.to(F64), y, loss, FloatModel(F32))
    nom = nominal_grads(net, params, x, y, loss)
    ref, _ = torch_reference(spec, loss, params, x, y, F32, False, False)
    ref64, _ = torch_reference(spec, loss, params, x, y, F64, False, False)
    for k in nom:
        assert_inside(gb[k][0], nom[k], f"{k} (agt nominal)")
        assert_inside(gb[k][0], ref[k], f"{k} (torch.func float32)")
        assert_inside(gb[k][0], ref64[k], f"{k} (torch.func float64)")


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
def test_conv_large_batch_zero_width(dtype):
    spec, loss, params, _, _ = make_case("conv2_ce", dtype, seed=2)
    gen = _gen(12)
    n = 1000
    x = (torch.randn(n, 1, 8, 8, generator=gen, dtype=F64)).to(dtype)
    y = torch.randint(0, 3, (n,), generator=gen)
    net = Network(spec.layers)
    gb = bound_grads(net, {k: point_box(v) for k, v in params.items()}, x.to(F64), y, loss,
                     FloatModel(dtype))
    nom = nominal_grads(net, params, x, y, loss)
    ref, _ = torch_reference(spec, loss, params, x, y, dtype, False, False)
    for k in nom:
        assert_inside(gb[k][0], nom[k], f"{k} (agt nominal)")
        assert_inside(gb[k][0], ref[k], f"{k} (torch.func)")


# ---------------------------------------------------------------- frozen prefix

def test_trainable_suffix_of_frozen_model():
    """Network.trainable keeps global layer indices; gradients of the trainable part on
    prefix features equal torch.func gradients of the whole model w.r.t. those parameters."""
    entries, in_shape, loss = MODELS["mlp_ce"]
    spec = ModelSpec.from_config(entries, frozen_layers=2).with_input_shape(in_shape)
    _, _, params, x, y = make_case("mlp_ce", F64, seed=6)
    prefix, net = Network.prefix(spec), Network.trainable(spec)
    assert net.first == 2 and len(net.layers) == 1
    feats, _ = prefix.forward_nominal(params, x)
    nom = nominal_grads(net, params, feats, y, loss)
    assert set(nom) == {"2.weight", "2.bias"}
    ref, _ = torch_reference(spec, loss, params, x, y, F64, False, False)
    gen = _gen(3)
    pbox = {k: box_around(gen, params[k], [0.0, 0.05], F64) for k in nom}
    gb = bound_grads(net, pbox, feats, y, loss, FloatModel(F64))
    for k in nom:
        torch.testing.assert_close(nom[k], ref[k], rtol=1e-12, atol=1e-14)
        assert_inside(gb[k][0], nom[k], k)


# ------------------------------------------------- per-rule contract (every layer rule)

# (layer, input shape without batch); every registered rule appears
RULE_CASES = {
    "linear": (LayerSpec("linear", 7, 4), (7,)),
    "linear_nobias": (LayerSpec("linear", 5, 3, bias=False), (5,)),
    "conv_s2": (LayerSpec("conv2d", 1, 3, kernel=3, stride=2), (1, 7, 7)),
    "conv_pad_nobias": (LayerSpec("conv2d", 2, 3, kernel=3, stride=1, padding=1, bias=False),
                        (2, 5, 5)),
    "conv_k2": (LayerSpec("conv2d", 2, 2, kernel=2, stride=1), (2, 4, 4)),
    "relu": (LayerSpec("relu"), (6,)),
    "relu_image": (LayerSpec("relu"), (2, 3, 3)),
    "flatten": (LayerSpec("flatten"), (2, 3, 3)),
}
RULE_B = 3


def test_rule_cases_cover_registry():
    assert {layer.kind for layer, _ in RULE_CASES.values()} == set(RULES)


def _layer_param_shapes(layer):
    if layer.kind == "linear":
        shapes = {"weight": (layer.out_features, layer.in_features)}
    elif layer.kind == "conv2d":
        shapes = {"weight": (layer.out_features, layer.in_features, layer.kernel, layer.kernel)}
    else:
        return {}
    if layer.bias:
        shapes["bias"] = (layer.out_features,)
    return shapes


def _as_box(act, groups):
    """An activation of the interval pass as an Interval (groups, b, ...)."""
    if isinstance(act, Interval):
        return act
    return point_box(act, groups)


def _rule_boxes(case, dtype, input_mode, seed, scale):
    layer, in_shape = RULE_CASES[case]
    gen = _gen(seed)
    rel = (0.0, 0.02, 0.3)                 # group 0: zero-width box, then wider ones
    params = {k: box_around(gen, torch.randn(s, generator=gen, dtype=F64) * scale, rel, dtype)
              for k, s in _layer_param_shapes(layer).items()}
    x0 = torch.randn((RULE_B,) + in_shape, generator=gen, dtype=F64) * scale
    if input_mode == "exact":
        x = x0.to(dtype).to(F64)
    elif input_mode == "shared":
        x = box_around(gen, x0, (0.1,), dtype)
    else:
        x = box_around(gen, x0, rel, dtype)
    return layer, gen, rel, params, x


def _sample_joint(gen, boxes: dict, g, dtype, n_corners=5, n_interior=5):
    out = {}
    for k, b in boxes.items():
        if isinstance(b, Interval):
            gb = 0 if b.shape[0] == 1 else g
            out[k] = sample_box(gen, b.lo[gb], b.hi[gb], dtype, n_corners, n_interior)
        else:
            out[k] = b.to(dtype).unsqueeze(0).expand(2 + n_corners + n_interior, *b.shape)
    return out


@pytest.mark.parametrize("scale", [1.0, 1e-3, 1e3], ids=["s1", "s1e-3", "s1e3"])
@pytest.mark.parametrize("input_mode", ["exact", "shared", "grouped"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("case", tuple(RULE_CASES))
def test_rule_contract(case, dtype, input_mode, scale):
    """Each rule alone: nominal forward/backward (in dtype, and in float64 from the same
    points as a proxy of exact arithmetic) at points sampled in the parameter, input and
    output-gradient boxes lies inside the interval forward/backward results; nested boxes
    give nested results."""
    layer, gen, rel, params, x = _rule_boxes(case, dtype, input_mode, 7 + len(case), scale)
    rule = rule_for(layer)
    n_groups = len(rel)
    fm = FloatModel(dtype)
    z_box, cache_b = rule.forward_bounds(layer, params, x, fm)
    z_box = _as_box(z_box, n_groups)
    n_out = z_box.shape[0]
    # output-gradient boxes (G, b, ...) of the same kinds: zero width, then wider
    d0 = torch.randn(z_box.shape[1:], generator=gen, dtype=F64) * scale
    delta = box_around(gen, d0, rel, dtype)
    if n_out == 1 and not params:
        delta = delta[0:1]
    gin_box, srcs_b = rule.backward_bounds(layer, params, cache_b, delta, fm, True)
    for g in range(delta.shape[0]):
        pts = _sample_joint(gen, {**params, "_x": x, "_d": delta}, g, dtype)
        for p in range(pts["_d"].shape[0]):
            for rd in {F64, dtype}:
                pp = {k: v[p].to(rd) for k, v in pts.items() if not k.startswith("_")}
                xp, dp = pts["_x"][p].to(rd), pts["_d"][p].to(rd)
                z, cache = rule.forward_nominal(layer, pp, xp)
                what = f"{case} group {g} point {p} ({rd})"
                assert_inside(z_box[min(g, n_out - 1)], z, f"{what}: forward")
                gin, srcs = rule.backward_nominal(layer, pp, cache, dp, True)
                assert_inside(_as_box(gin_box, 1)[g if gin_box.shape[0] > 1 else 0], gin,
                              f"{what}: input gradient")
                assert set(srcs) == set(srcs_b) == set(params)
                for k, src in srcs.items():
                    bsrc = srcs_b[k]
                    assert (bsrc.n_rows, bsrc.row_size) == (src.n_rows, src.row_size)
                    assert_inside(bsrc.fn(0, bsrc.n_rows)[g], src.fn(0, src.n_rows),
                                  f"{what}: {k} gradient")
    # nested boxes give nested results
    inner_params = {k: _sub_box(gen, b) for k, b in params.items()}
    inner_x = _sub_box(gen, x) if isinstance(x, Interval) else x
    inner_delta = _sub_box(gen, delta)
    zi, cache_i = rule.forward_bounds(layer, inner_params, inner_x, fm)
    assert_nested(_as_box(zi, n_groups), z_box, f"{case}: forward")
    gi, srcs_i = rule.backward_bounds(layer, inner_params, cache_i, inner_delta, fm, True)
    assert_nested(_as_box(gi, 1), _as_box(gin_box, 1), f"{case}: input gradient")
    for k in srcs_i:
        assert_nested(srcs_i[k].fn(0, srcs_i[k].n_rows), srcs_b[k].fn(0, srcs_b[k].n_rows),
                      f"{case}: {k} gradient")


# --------------------------------------------------------------- loss-gradient bounds

@st.composite
def logit_boxes(draw, widths):
    seed = draw(st.integers(0, 2**31 - 1))
    n_classes = draw(st.sampled_from([1, 2, 3, 5]))
    width = draw(st.sampled_from(widths))
    offset = draw(st.sampled_from([1.0, 10.0, 50.0]))
    dtype = draw(st.sampled_from(DTYPES))
    return seed, n_classes, width, offset, dtype


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(case=logit_boxes([0.0, 1e-6, 1e-3, 0.1, 1.0]))
def test_loss_grad_bounds_contain_sampled_logits(case):
    """dL/dz bounds over a logit box contain sigmoid/softmax(z) - y at sampled z, computed
    in float64, in the nominal dtype, by the agt nominal rule and by torch autograd."""
    _check_loss_box(*case)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(case=logit_boxes([3.0, 8.0, 20.0, 60.0]))
def test_loss_grad_bounds_wide_logit_boxes(case):
    """As above for logit boxes several units wide (large k, wide parameter boxes)."""
    _check_loss_box(*case)


def _check_loss_box(seed, n_classes, width, offset, dtype):
    gen = _gen(seed)
    b = 4
    loss = BCE if n_classes == 1 else CE
    center = torch.randn(3, b, n_classes, generator=gen, dtype=F64) * offset
    lo = center - width * torch.rand(center.shape, generator=gen, dtype=F64)
    hi = center + width * torch.rand(center.shape, generator=gen, dtype=F64)
    lo, hi = round_out(lo, hi, dtype)
    z = Interval(lo, hi)
    y = torch.randint(0, 2 if loss == BCE else n_classes, (b,), generator=gen)
    box = loss_grad_bounds(loss, z, y, FloatModel(dtype))
    assert box.shape == z.shape
    assert bool((box.lo <= box.hi).all())

    def autograd_grad(zz):
        zz = zz.clone().requires_grad_(True)
        if loss == BCE:
            v = F.binary_cross_entropy_with_logits(zz[:, 0], y.to(zz.dtype), reduction="sum")
        else:
            v = F.cross_entropy(zz, y, reduction="sum")
        (g,) = torch.autograd.grad(v, zz)
        return g

    for g in range(3):
        pts = sample_box(gen, lo[g], hi[g], dtype, 6, 6)
        for p in pts:
            for rd in {F64, dtype}:
                pd = p.to(rd)
                assert_inside(box[g], loss_grad_nominal(loss, pd, y), f"group {g} ({rd}) nominal")
                assert_inside(box[g], autograd_grad(pd), f"group {g} ({rd}) autograd")


def test_softmax_bounds_wide_logit_box():
    """Minimal reproducer: class 0 logit in [-40, 0], class 1 fixed at -38. At z = (-40, -38)
    softmax_0 = 1 / (1 + e^2) = 0.119, so the lower bound on softmax_0 must be <= 0.119."""
    z = Interval(torch.tensor([[[-40.0, -38.0]]], dtype=F64),
                 torch.tensor([[[0.0, -38.0]]], dtype=F64))
    lower, upper = softmax_bounds(z)
    p = torch.softmax(torch.tensor([-40.0, -38.0], dtype=F64), -1)
    assert float(lower[0, 0, 0]) <= float(p[0]) <= float(upper[0, 0, 0]), (lower, upper, p)
    assert float(lower[0, 0, 1]) <= float(p[1]) <= float(upper[0, 0, 1]), (lower, upper, p)


def test_wide_box_network_level_cross_entropy():
    """The same through a network: linear 6 -> 2, CE, one sample x = e_0 with label 1;
    weight[0, 0] in [-40, 0], bias = (0, -38), all else 0. At weight[0, 0] = -40 the logits
    are (-40, -38) and d loss / d weight[0, 0] = softmax_0 * x_0 = 0.119."""
    spec = ModelSpec.from_config([{"linear": {"in": 6, "out": 2}}]).with_input_shape((6,))
    net = Network(spec.layers)
    w_lo = torch.zeros(1, 2, 6, dtype=F64)
    w_lo[0, 0, 0] = -40.0
    bias = torch.tensor([[0.0, -38.0]], dtype=F64)
    params = {"0.weight": Interval(w_lo, torch.zeros(1, 2, 6, dtype=F64)),
              "0.bias": Interval(bias, bias)}
    x = torch.zeros(1, 6, dtype=F64)
    x[0, 0] = 1.0
    y = torch.tensor([1])
    for dtype in DTYPES:
        gb = bound_grads(net, params, x, y, CE, FloatModel(dtype))
        point = {"0.weight": w_lo[0], "0.bias": bias[0]}
        nom = nominal_grads(net, point, x, y, CE)
        assert abs(float(nom["0.weight"][0, 0]) - 1 / (1 + math.e**2)) < 1e-12
        assert_inside(gb["0.weight"][0], nom["0.weight"], f"weight gradient ({dtype})")
