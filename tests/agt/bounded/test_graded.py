"""Graded widening (agt/interval.py): computed results on a sub-box at grade k - 1 lie
inside the computed results on the box at grade k, exactly, in floating point.

The boxes behind a smooth radius must nest between neighbours, box(D', k - 1) inside
box(D, k), as *computed*. The interval formulas are isotone in exact arithmetic, their
float64 evaluation is not: these tests build sub-boxes that differ from the box by a few
ulps (where a midpoint rounds the other way), check exact nesting with grading, and check
that without grading (the weakened version) the same search finds boxes that leave.
"""

from __future__ import annotations

import pytest
import torch

import agt.bounded.losses as losses_mod
import agt.interval as iv
from agt.bounded.network import Network
from agt.interval import FloatModel, Interval
from tests.agt.bounded.test_layers import (
    DTYPES,
    F64,
    MODEL_NAMES,
    _gen,
    bound_grads,
    box_around,
    make_case,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _nudged_sub_box(gen, box: Interval, fraction: bool = False) -> Interval:
    """A sub-box whose ends are the box's or moved inward by 1-3 float64 ulps (where the
    computed midpoint rounds the other way and the real gap is below the rounding); with
    ``fraction``, one end in eight moves by a fraction of the width instead."""
    lo, hi = box.lo, box.hi
    choice = torch.randint(0, 8, lo.shape, generator=gen)
    steps = torch.randint(1, 4, lo.shape, generator=gen)
    frac = torch.rand(lo.shape, generator=gen, dtype=F64) * 0.3

    def ulps(t, direction):
        target = torch.full_like(t, direction * float("inf"))
        out = t
        for i in range(3):
            out = torch.where(steps > i, torch.nextafter(out, target), out)
        return out

    lo2 = torch.where((choice == 3) | (choice == 4), ulps(lo, 1), lo)
    if fraction:
        lo2 = torch.where(choice == 7, lo + frac * (hi - lo), lo2)
    hi2 = torch.where((choice == 5) | (choice == 6), ulps(hi, -1), hi)
    lo2 = torch.minimum(lo2, hi)
    hi2 = torch.maximum(hi2, lo2)
    return Interval(lo2, hi2)


def _excess(inner: Interval, outer: Interval) -> float:
    """How far inner leaves outer (0 when nested), without tolerance."""
    return max(0.0, float((outer.lo - inner.lo).max()), float((inner.hi - outer.hi).max()))


def _worst_excess(name, dtype, seed, k, graded: bool, fraction: bool = False,
                  trials: int = 6) -> float:
    spec, loss, params, x, y = make_case(name, dtype, seed=seed)
    net = Network(spec.layers)
    gen = _gen(seed)
    fm = FloatModel(dtype)
    fm_in, fm_out = (fm.graded([k - 1]), fm.graded([k])) if graded else (fm, fm)
    worst = 0.0
    for _ in range(trials):
        outer = {n: box_around(gen, v, (1e-3,), dtype) for n, v in params.items()}
        inner = {n: _nudged_sub_box(gen, b, fraction) for n, b in outer.items()}
        z_out, _ = net.forward_bounds(outer, x.to(F64), fm_out)
        z_in, _ = net.forward_bounds(inner, x.to(F64), fm_in)
        worst = max(worst, _excess(z_in, z_out))
        g_out = bound_grads(net, outer, x.to(F64), y, loss, fm_out)
        g_in = bound_grads(net, inner, x.to(F64), y, loss, fm_in)
        for n in g_out:
            worst = max(worst, _excess(g_in[n], g_out[n]))
    return worst


@pytest.mark.parametrize("dtype", DTYPES, ids=["f64", "f32"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_graded_sub_boxes_nest_exactly(name, dtype):
    for seed in range(3):
        for k in (1, 7, 200):
            for fraction in (False, True):
                assert _worst_excess(name, dtype, seed, k, True, fraction) == 0.0, (seed, k)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_without_grading_sub_boxes_leave_by_rounding(name, monkeypatch):
    """The weakened versions: the same search with ungraded passes, and with graded passes
    whose GRADE_FACTOR is 0, finds computed sub-box results outside the box's."""
    assert max(_worst_excess(name, F64, seed, 1, graded=False) for seed in range(3)) > 0.0
    monkeypatch.setattr(iv, "GRADE_FACTOR", 0.0)
    monkeypatch.setattr(losses_mod, "GRADE_FACTOR", 0.0)
    assert max(_worst_excess(name, F64, seed, 1, graded=True) for seed in range(3)) > 0.0


def test_grades_must_match_the_boxes():
    fm = FloatModel(torch.float32).graded([0, 1, 2])
    lo = torch.zeros(2, 3, dtype=F64)
    with pytest.raises(iv.SoundnessError, match="3 grades"):
        fm.widen(lo, lo, lo, 4)
    with pytest.raises(iv.SoundnessError, match="non-negative"):
        FloatModel(torch.float32).graded([-1.0])


def test_grading_costs_nothing_measurable():
    """The graded part is GRADE_FACTOR k times the float64 share: for k = 199 in float32
    it moves an end by < 1e-9 of the magnitude, against ~1e-7 for the nominal rounding."""
    fm = FloatModel(torch.float32)
    lo = torch.ones(1, 4, dtype=F64)
    plain = fm.widen(lo, lo, lo, 64)
    graded = fm.graded([199]).widen(lo, lo, lo, 64)
    extra = float((plain.lo - graded.lo).max())
    assert 0.0 < extra < 1e-9
    assert float((lo - plain.lo).max()) > 1e-6


def _mask_flip_case():
    """A ReLU mask that rounding flips (the case an adversarial review built by hand): the
    box lets one first-layer weight range over one ulp, the sub-box is its upper end, and
    the record's last feature is bisected until the box's computed pre-activation lower
    bound is just above 0. Ungraded, the sub-box's is then <= 0 for some records: its mask
    is undecided where the box's is active."""
    spec, loss, params, x, y = make_case("mlp_bce", F64, seed=0)
    net = Network(spec.layers)
    fm = FloatModel(F64)
    gen = _gen(0)
    unit = 0

    def pre(box, xx):
        return net.forward_bounds(box, xx, fm)[1][1].lo[0, 0, unit]     # ReLU cache

    for _ in range(200):
        feats = torch.randn(4, generator=gen, dtype=F64)
        j = int(torch.randint(0, 4, (1,), generator=gen))
        lo = {n: v.clone().unsqueeze(0) for n, v in params.items()}
        hi = {n: v.clone().unsqueeze(0) for n, v in params.items()}
        hi["0.weight"][0, unit, j] = torch.nextafter(lo["0.weight"][0, unit, j],
                                                     torch.tensor(float("inf"), dtype=F64))
        outer = {n: Interval(lo[n], hi[n]) for n in params}
        inner = dict(outer)
        inner["0.weight"] = Interval(hi["0.weight"], hi["0.weight"])

        def record(t):
            return torch.cat([feats, torch.tensor([t], dtype=F64)])[None]

        neg, pos = -50.0, 50.0
        if (pre(outer, record(neg)) > 0) == (pre(outer, record(pos)) > 0):
            continue
        if pre(outer, record(neg)) > 0:
            neg, pos = pos, neg
        while True:
            mid = 0.5 * (neg + pos)
            if mid in (neg, pos):
                break
            if pre(outer, record(mid)) > 0:
                pos = mid
            else:
                neg = mid
        xt = record(pos)
        if pre(outer, xt) > 0 >= pre(inner, xt):
            return net, loss, outer, inner, xt, y[:1]
    raise AssertionError("no mask flip found")


def test_graded_passes_absorb_a_rounding_mask_flip():
    net, loss, outer, inner, xt, y = _mask_flip_case()
    fm = FloatModel(F64)
    plain_out = bound_grads(net, outer, xt, y, loss, fm)["0.weight"]
    plain_in = bound_grads(net, inner, xt, y, loss, fm)["0.weight"]
    # ungraded: the sub-box's gradient bound of the unit's weights opens to a whole range
    assert _excess(plain_in, plain_out) > 1e-3 * float(plain_out.magnitude().max())
    graded_out = bound_grads(net, outer, xt, y, loss, fm.graded([1]))["0.weight"]
    graded_in = bound_grads(net, inner, xt, y, loss, fm.graded([0]))["0.weight"]
    assert _excess(graded_in, graded_out) == 0.0
