"""Property tests for agt.interval: every operation encloses what it claims to enclose.

For random boxes (many shapes; zero-width, negative, positive, straddling and mixed boxes;
tiny and large magnitudes) we sample points inside the input boxes (all-lower, all-upper and
random corners, plus interior points) and check that the output box contains

* the *exact* result (rational arithmetic with `fractions.Fraction`), and
* the result computed in the nominal dtype from points representable in that dtype, in
  several summation orders (torch's kernel, elementwise-then-sum, sequential, reversed,
  fused multiply-add), because the rounding bound claims to cover any order.

Boxes for ``FloatModel(torch.float32)`` have float32-representable ends so that float32
sample points can be clamped into them exactly. Further properties: inclusion monotonicity
(nested inputs give nested outputs), midpoint-radius enclosure, consistency of the
exact-factor matmuls with the general one, and the ReLU-derivative mask rules.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agt import interval as iv
from agt.errors import SoundnessError
from agt.interval import FloatModel, Interval

F64 = torch.float64
DTYPES = (torch.float32, torch.float64)
# decimal exponents of the box magnitudes per nominal dtype: float32 products of the
# smallest reach the subnormal range, sums of the largest stay far from overflow.
EXPONENTS = {torch.float32: (-20, 15), torch.float64: (-60, 60)}
KINDS = ("zero", "pos", "neg", "straddle", "mixed")

SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None)


# ------------------------------------------------------------------------------ helpers

pytestmark = pytest.mark.usefixtures("one_thread")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _round_to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype).to(F64)


def make_box(gen: torch.Generator, shape, kind: str, exp: int, dtype: torch.dtype) -> Interval:
    """A random box of the given kind whose ends are representable in ``dtype``."""
    shape = tuple(shape)
    spread = torch.rand(shape, generator=gen, dtype=F64) * 3.0 - 1.5        # +-1.5 decades
    mag = 10.0 ** (exp + spread)
    a = torch.rand(shape, generator=gen, dtype=F64) * mag
    b = torch.rand(shape, generator=gen, dtype=F64) * mag
    c = torch.randn(shape, generator=gen, dtype=F64) * mag
    choices = {
        "zero": (c, c),
        "pos": (a, a + b),
        "neg": (-a - b, -a),
        "straddle": (-a, b),
    }
    if kind == "mixed":
        pick = torch.randint(0, 7, shape, generator=gen)
        options = list(choices.values()) + [
            (torch.zeros(shape, dtype=F64), b),               # [0, b]
            (-a, torch.zeros(shape, dtype=F64)),              # [-a, 0]
            (torch.zeros(shape, dtype=F64), torch.zeros(shape, dtype=F64)),
        ]
        lo = torch.zeros(shape, dtype=F64)
        hi = torch.zeros(shape, dtype=F64)
        for i, (low, h) in enumerate(options):
            lo = torch.where(pick == i, low, lo)
            hi = torch.where(pick == i, h, hi)
    else:
        lo, hi = choices[kind]
    lo, hi = _round_to(lo, dtype), _round_to(hi, dtype)   # rounding is monotone: lo <= hi
    assert bool((lo <= hi).all())
    return Interval(lo, hi)


def sample_points(gen: torch.Generator, box: Interval, dtype: torch.dtype,
                  n_corners: int = 4, n_interior: int = 4) -> torch.Tensor:
    """(P, *shape) float64 tensor of points of ``box`` that are representable in dtype:
    both extreme corners, random corners and random interior points."""
    lo, hi = box.lo, box.hi
    pts = [lo, hi]
    for _ in range(n_corners):
        pick = torch.rand(lo.shape, generator=gen) < 0.5
        pts.append(torch.where(pick, lo, hi))
    for _ in range(n_interior):
        t = torch.rand(lo.shape, generator=gen, dtype=F64)
        p = _round_to(lo + t * (hi - lo), dtype)
        pts.append(torch.minimum(torch.maximum(p, lo), hi))
    return torch.stack(pts)


def frac(t: torch.Tensor) -> np.ndarray:
    """Exact rational copy of a float tensor as a numpy object array."""
    t = t.detach().to(F64)
    out = np.empty(tuple(t.shape), dtype=object)
    out.reshape(-1)[:] = [Fraction(v) for v in t.reshape(-1).tolist()]
    return out


def assert_exact_inside(box: Interval, exact: np.ndarray, what: str) -> None:
    lo, hi = frac(box.lo), frac(box.hi)
    exact = np.broadcast_to(exact, lo.shape)
    ok = np.vectorize(lambda a, x, b: a <= x <= b, otypes=[bool])(lo, exact, hi)
    if not ok.all():
        i = np.argwhere(~ok)[0]
        raise AssertionError(f"{what}: exact value {float(exact[tuple(i)])!r} at {tuple(i)} "
                             f"outside [{float(lo[tuple(i)])!r}, {float(hi[tuple(i)])!r}]")


def assert_inside(box: Interval, value: torch.Tensor, what: str) -> None:
    value = value.to(F64)
    assert not torch.isnan(value).any(), f"{what}: NaN"
    ok = box.contains(value)
    if not bool(ok.all()):
        gap = torch.maximum(box.lo - value, value - box.hi)
        i = int(torch.argmax(torch.where(ok, torch.full_like(gap, -np.inf), gap)))
        raise AssertionError(
            f"{what}: value {value.reshape(-1)[i].item()!r} outside "
            f"[{box.lo.reshape(-1)[i].item()!r}, {box.hi.reshape(-1)[i].item()!r}] "
            f"by {gap.reshape(-1)[i].item():.3e}")


def assert_nested(inner: Interval, outer: Interval, what: str) -> None:
    """inner inside outer, up to a few float64 ulps of the outer magnitude (the rules are
    inclusion-monotone in exact arithmetic; their float64 evaluation may round two nearly
    equal ends in opposite directions)."""
    tol = 8 * 2.0**-53 * outer.magnitude() + 1e-300
    ok = (outer.lo - tol <= inner.lo) & (inner.hi <= outer.hi + tol)
    if not bool(ok.all()):
        gap = torch.maximum(outer.lo - inner.lo, inner.hi - outer.hi)
        raise AssertionError(f"{what}: inner box sticks out by {float(gap.max()):.3e}")


def nested_box(gen: torch.Generator, box: Interval) -> Interval:
    """A random sub-box (sometimes equal to the box, sometimes a point)."""
    lo, hi = box.lo, box.hi
    w = hi - lo
    t1 = torch.rand(lo.shape, generator=gen, dtype=F64) * 0.5
    t2 = torch.rand(lo.shape, generator=gen, dtype=F64) * 0.5
    keep = torch.rand(lo.shape, generator=gen) < 0.25
    t1 = torch.where(keep, torch.zeros_like(t1), t1)
    t2 = torch.where(keep, torch.zeros_like(t2), t2)
    ilo = torch.minimum(torch.maximum(lo + t1 * w, lo), hi)
    ihi = torch.maximum(torch.minimum(hi - t2 * w, hi), ilo)
    return Interval(ilo, ihi)


# float evaluations of the nominal computations in several orders ----------------------

def matmul_orders(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
    """a @ b evaluated by torch's kernel, as products-then-sum, sequentially left to right,
    right to left, and with addcmul accumulation."""
    out = [a @ b, (a.unsqueeze(-1) * b.unsqueeze(-3)).sum(-2)]
    n = a.shape[-1]
    for order in (range(n), reversed(range(n))):
        acc = None
        for k in order:
            term = a[..., :, k:k + 1] * b[..., k:k + 1, :]
            acc = term if acc is None else acc + term
        out.append(acc)
    acc = torch.zeros_like(out[0])
    for k in range(n):
        acc = torch.addcmul(acc, a[..., :, k:k + 1], b[..., k:k + 1, :])
    out.append(acc)
    return out


def sum_orders(x: torch.Tensor, dim: int) -> list[torch.Tensor]:
    return [x.sum(dim), x.cumsum(dim).select(dim, -1), x.flip(dim).cumsum(dim).select(dim, -1)]


# -------------------------------------------------------------------- strategies

def _exp(dtype):
    lo, hi = EXPONENTS[dtype]
    return st.integers(lo, hi)


dtypes = st.sampled_from(DTYPES)
kinds = st.sampled_from(KINDS)
seeds = st.integers(0, 2**31 - 1)
small_shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def box_args(draw, n_boxes: int = 1):
    dtype = draw(dtypes)
    return (dtype, draw(seeds), [(draw(kinds), draw(_exp(dtype))) for _ in range(n_boxes)])


@st.composite
def broadcast_shapes(draw):
    shape = draw(small_shapes)
    other = tuple(1 if draw(st.booleans()) else s for s in shape)
    # drop some leading dims of the other operand
    other = other[draw(st.integers(0, len(other))):]
    return (shape, other) if draw(st.booleans()) else (other, shape)


@st.composite
def matmul_shapes(draw):
    m, n, p = draw(st.integers(1, 4)), draw(st.integers(1, 6)), draw(st.integers(1, 4))
    batch = draw(st.sampled_from([((), ()), ((2,), ()), ((), (3,)), ((2, 1), (3,)),
                                  ((1, 3), (2, 1)), ((2,), (2,))]))
    return batch[0] + (m, n), batch[1] + (n, p)


# ------------------------------------------------------------------ basic behaviour

def test_gamma_and_float_model():
    assert iv.gamma(1, 0.25) == pytest.approx(1 / 3)
    with pytest.raises(SoundnessError):
        iv.gamma(2**52, 2.0**-53)
    for dtype in DTYPES:
        fm = FloatModel(dtype)
        assert fm.unit_roundoff == torch.finfo(dtype).eps / 2
        for n in (1, 7, 1000, 10**6):
            assert fm.coeff(n) >= iv.gamma(n, fm.unit_roundoff)
            assert fm.absolute(n) >= n * torch.finfo(dtype).tiny
        box = fm.widen(torch.tensor([-1.0, 0.0], dtype=F64), torch.tensor([1.0, 0.0], dtype=F64),
                       torch.tensor([1.0, 0.0], dtype=F64), 3)
        assert bool((box.lo < torch.tensor([-1.0, 0.0], dtype=F64)).all())
        assert bool((box.hi > torch.tensor([1.0, 0.0], dtype=F64)).all())


def test_interval_value_type():
    x = torch.tensor([[-1.0, 2.0]], dtype=F64)
    with pytest.raises(SoundnessError):
        Interval(torch.zeros(2, dtype=F64), torch.zeros(3, dtype=F64))
    e = Interval.exact(x.to(torch.float32))
    assert e.lo.dtype == F64 and torch.equal(e.lo, e.hi) and torch.equal(e.lo, x)
    b = Interval(x - 1, x + 2)
    assert torch.equal(b.width(), torch.full_like(x, 3.0))
    assert torch.equal(b.magnitude(), torch.tensor([[2.0, 4.0]], dtype=F64))
    assert b.contains(x).all() and not b.contains(x + 3).any()
    h = Interval.hull(Interval(x, x), Interval(x + 5, x + 6))
    assert torch.equal(h.lo, x) and torch.equal(h.hi, x + 6)
    assert b[0, 1].lo.item() == 1.0 and b.map(lambda t: t.T).shape == (2, 1)


# -------------------------------------------------------------------------- midrad

@SETTINGS
@given(seed=seeds, shape=small_shapes, kind=kinds, exp=st.integers(-300, 300))
def test_midrad_encloses_box(seed, shape, kind, exp):
    gen = _gen(seed)
    box = make_box(gen, shape, kind, exp, F64)
    if not bool(torch.isfinite(box.lo).all() and torch.isfinite(box.hi).all()):
        return
    mid, rad = box.midrad()
    assert bool((rad >= 0).all())
    m, r = frac(mid), frac(rad)
    lo, hi = frac(box.lo), frac(box.hi)
    ok = np.vectorize(lambda mm, rr, low, h: mm - rr <= low and h <= mm + rr,
                      otypes=[bool])(m, r, lo, hi)
    assert ok.all()


# --------------------------------------------------------------------- monotone maps

@SETTINGS
@given(args=box_args(), shape=small_shapes, bound=st.floats(1e-3, 1e3))
def test_relu_and_clamp_enclose(args, shape, bound):
    dtype, seed, [(kind, exp)] = args
    gen = _gen(seed)
    box = make_box(gen, shape, kind, exp, dtype)
    bound = float(torch.tensor(bound * 10.0 ** exp).to(dtype))
    pts = sample_points(gen, box, dtype)
    r, c = iv.relu(box), iv.clamp(box, bound)
    for p in pts:
        assert_inside(r, torch.relu(p.to(dtype)), "relu")
        assert_inside(c, p.to(dtype).clamp(-bound, bound), "clamp")
    # exact on the ends: the extreme points attain the bounds
    assert torch.equal(r.lo, torch.relu(box.lo)) and torch.equal(r.hi, torch.relu(box.hi))
    assert bool((c.lo >= -bound).all() and (c.hi <= bound).all())


# ------------------------------------------------------------------ add / sum / mul

@SETTINGS
@given(args=box_args(2), shapes=broadcast_shapes())
def test_add_encloses(args, shapes):
    dtype, seed, [(ka, ea), (kb, eb)] = args
    gen = _gen(seed)
    a = make_box(gen, shapes[0], ka, ea, dtype)
    b = make_box(gen, shapes[1], kb, eb, dtype)
    out = iv.add(a, b, FloatModel(dtype))
    assert out.shape == torch.broadcast_shapes(a.shape, b.shape)
    for pa, pb in zip(sample_points(gen, a, dtype), sample_points(gen, b, dtype)):
        assert_exact_inside(out, frac(pa) + frac(pb), "add exact")
        for rd in {dtype, F64}:
            assert_inside(out, pa.to(rd) + pb.to(rd), f"add {rd}")


@SETTINGS
@given(args=box_args(), shape=st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple),
       data=st.data())
def test_sum_intervals_encloses(args, shape, data):
    dtype, seed, [(kind, exp)] = args
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    gen = _gen(seed)
    x = make_box(gen, shape, kind, exp, dtype)
    out = iv.sum_intervals(x, dim, FloatModel(dtype))
    for p in sample_points(gen, x, dtype):
        assert_exact_inside(out, frac(p).sum(axis=dim), "sum exact")
        for rd in {dtype, F64}:
            for k, s in enumerate(sum_orders(p.to(rd), dim)):
                assert_inside(out, s, f"sum {rd} (order {k})")


@SETTINGS
@given(args=box_args(2), shapes=broadcast_shapes())
def test_mul_encloses(args, shapes):
    dtype, seed, [(ka, ea), (kb, eb)] = args
    gen = _gen(seed)
    a = make_box(gen, shapes[0], ka, ea, dtype)
    b = make_box(gen, shapes[1], kb, eb, dtype)
    fm = FloatModel(dtype)
    out = iv.mul(a, b, fm)
    for pa, pb in zip(sample_points(gen, a, dtype), sample_points(gen, b, dtype)):
        assert_exact_inside(out, frac(pa) * frac(pb), "mul exact")
        for rd in {dtype, F64}:
            assert_inside(out, pa.to(rd) * pb.to(rd), f"mul {rd}")
    # an exact left factor: mul_exact is the same set, never wider
    x = a.lo
    ex = iv.mul_exact(x, b, fm)
    for pb in sample_points(gen, b, dtype):
        assert_exact_inside(ex, frac(x) * frac(pb), "mul_exact exact")
        for rd in {dtype, F64}:
            assert_inside(ex, x.to(rd) * pb.to(rd), f"mul_exact {rd}")
    general = iv.mul(Interval(x, x), b, fm)
    assert_nested(ex, general, "mul_exact inside mul of a point box")


# ------------------------------------------------------------------------- matmul

@SETTINGS
@given(args=box_args(2), shapes=matmul_shapes())
def test_matmul_encloses(args, shapes):
    dtype, seed, [(ka, ea), (kb, eb)] = args
    gen = _gen(seed)
    a = make_box(gen, shapes[0], ka, ea, dtype)
    b = make_box(gen, shapes[1], kb, eb, dtype)
    out = iv.matmul(a, b, FloatModel(dtype))
    assert out.shape == (a.lo @ b.lo).shape
    for pa, pb in zip(sample_points(gen, a, dtype), sample_points(gen, b, dtype)):
        assert_exact_inside(out, np.matmul(frac(pa), frac(pb)), "matmul exact")
        for rd in {dtype, F64}:
            for k, r in enumerate(matmul_orders(pa.to(rd), pb.to(rd))):
                assert_inside(out, r, f"matmul {rd} (order {k})")


@SETTINGS
@given(args=box_args(2), shapes=matmul_shapes())
def test_matmul_exact_factors_enclose_and_agree(args, shapes):
    dtype, seed, [(ka, ea), (kb, eb)] = args
    gen = _gen(seed)
    a = make_box(gen, shapes[0], ka, ea, dtype)
    b = make_box(gen, shapes[1], kb, eb, dtype)
    fm = FloatModel(dtype)
    x = sample_points(gen, a, dtype, 1, 0)[2]           # a random corner of a, exact
    y = sample_points(gen, b, dtype, 1, 0)[2]
    left = iv.matmul_exact_left(x, b, fm)
    right = iv.matmul_exact_right(a, y, fm)
    for pa, pb in zip(sample_points(gen, a, dtype), sample_points(gen, b, dtype)):
        assert_exact_inside(left, np.matmul(frac(x), frac(pb)), "exact_left exact")
        assert_exact_inside(right, np.matmul(frac(pa), frac(y)), "exact_right exact")
        for rd in {dtype, F64}:
            for r in matmul_orders(x.to(rd), pb.to(rd)):
                assert_inside(left, r, f"exact_left {rd}")
            for r in matmul_orders(pa.to(rd), y.to(rd)):
                assert_inside(right, r, f"exact_right {rd}")
    # consistency with the general rule on point boxes: the exact-factor rules enclose the
    # same set and are never (more than a rounding error) wider
    for special, general in ((left, iv.matmul(Interval(x, x), b, fm)),
                             (right, iv.matmul(a, Interval(y, y), fm))):
        slack = 4 * fm.coeff(shapes[0][-1]) * special.magnitude() + fm.absolute(shapes[0][-1])
        assert bool((special.lo >= general.lo - slack).all())
        assert bool((special.hi <= general.hi + slack).all())
        assert bool((special.width() <= general.width() + 2 * slack).all())
    # both point factors: all three rules contain the exact product of the points
    both = iv.matmul_exact_left(x, Interval(y, y), fm)
    assert_exact_inside(both, np.matmul(frac(x), frac(y)), "point product")
    scale = x.abs() @ y.abs()
    assert bool((both.width() <= 2.5 * fm.coeff(shapes[0][-1]) * scale
                 + 2 * fm.absolute(shapes[0][-1]) + 1e-290).all())   # + midrad's tiny


def test_matmul_zero_width_is_tight():
    gen = _gen(3)
    a = torch.randn(5, 7, generator=gen, dtype=F64)
    b = torch.randn(7, 4, generator=gen, dtype=F64)
    for dtype in DTYPES:
        fm = FloatModel(dtype)
        out = iv.matmul(Interval.exact(a), Interval.exact(b), fm)
        ref = a @ b
        assert_inside(out, ref, "point matmul")
        assert float((out.width() / (a.abs() @ b.abs())).max()) <= 40 * fm.coeff(7)


# ------------------------------------------------------------- inclusion monotonicity

@SETTINGS
@given(args=box_args(2), shapes=matmul_shapes(), bshapes=broadcast_shapes(),
       bound=st.floats(0.1, 10.0))
def test_inclusion_monotone(args, shapes, bshapes, bound):
    dtype, seed, [(ka, ea), (kb, eb)] = args
    gen = _gen(seed)
    fm = FloatModel(dtype)

    def pair(shape_a, shape_b):
        a = make_box(gen, shape_a, ka, ea, dtype)
        b = make_box(gen, shape_b, kb, eb, dtype)
        return (a, b), (nested_box(gen, a), nested_box(gen, b))

    (a, b), (ia, ib) = pair(*shapes)
    assert_nested(iv.matmul(ia, ib, fm), iv.matmul(a, b, fm), "matmul")
    x, y = ia.lo, ib.hi          # exact factors: points of the boxes
    assert_nested(iv.matmul_exact_left(x, ib, fm), iv.matmul_exact_left(x, b, fm), "exact_left")
    assert_nested(iv.matmul_exact_right(ia, y, fm), iv.matmul_exact_right(a, y, fm),
                  "exact_right")
    (a, b), (ia, ib) = pair(*bshapes)
    assert_nested(iv.add(ia, ib, fm), iv.add(a, b, fm), "add")
    assert_nested(iv.mul(ia, ib, fm), iv.mul(a, b, fm), "mul")
    assert_nested(iv.mul_exact(ia.lo, ib, fm), iv.mul_exact(ia.lo, b, fm), "mul_exact")
    assert_nested(iv.relu(ia), iv.relu(a), "relu")
    bound = bound * 10.0 ** ea
    assert_nested(iv.clamp(ia, bound), iv.clamp(a, bound), "clamp")
    if a.lo.dim() > 0:
        assert_nested(iv.sum_intervals(ia, -1, fm), iv.sum_intervals(a, -1, fm), "sum")
    assert_nested(iv.heaviside_mask(ia), iv.heaviside_mask(a), "heaviside")
    mask = iv.heaviside_mask(b)
    assert_nested(iv.mask_product(ia, iv.heaviside_mask(ib)), iv.mask_product(a, mask),
                  "mask_product")


# ------------------------------------------------------------ heaviside / mask product

def test_heaviside_cases():
    lo = torch.tensor([1e-300, 0.0, -1.0, -2.0, 0.0, -1e-300, 3.0], dtype=F64)
    hi = torch.tensor([2.0, 0.0, 1.0, -1.0, 1e-300, 0.0, 3.0], dtype=F64)
    m = iv.heaviside_mask(Interval(lo, hi))
    assert m.lo.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert m.hi.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]


@SETTINGS
@given(args=box_args(), shape=small_shapes)
def test_heaviside_encloses_relu_derivative(args, shape):
    dtype, seed, [(kind, exp)] = args
    gen = _gen(seed)
    pre = make_box(gen, shape, kind, exp, dtype)
    m = iv.heaviside_mask(pre)
    assert bool(((m.lo == 0) | (m.lo == 1)).all() and ((m.hi == 0) | (m.hi == 1)).all())
    assert bool((m.lo <= m.hi).all())
    for p in sample_points(gen, pre, dtype):
        assert_inside(m, (p.to(dtype) > 0).to(dtype), "heaviside")
    # tight: [0, 1] only where the box straddles 0 (contains a point <= 0 and one > 0)
    straddle = (pre.lo <= 0) & (pre.hi > 0)
    assert torch.equal(m.hi - m.lo == 1, straddle)


def test_mask_product_cases():
    x = Interval(torch.tensor([-2.0, -2.0, -2.0, 1.0, 1.0, 1.0, -3.0, -3.0, -3.0], dtype=F64),
                 torch.tensor([-1.0, -1.0, -1.0, 2.0, 2.0, 2.0, 4.0, 4.0, 4.0], dtype=F64))
    mlo = torch.tensor([0.0, 1.0, 0.0] * 3, dtype=F64)
    mhi = torch.tensor([0.0, 1.0, 1.0] * 3, dtype=F64)
    out = iv.mask_product(x, Interval(mlo, mhi))
    assert out.lo.tolist() == [0.0, -2.0, -2.0, 0.0, 1.0, 0.0, 0.0, -3.0, -3.0]
    assert out.hi.tolist() == [0.0, -1.0, 0.0, 0.0, 2.0, 2.0, 0.0, 4.0, 4.0]


@SETTINGS
@given(args=box_args(), shape=small_shapes)
def test_mask_product_encloses(args, shape):
    dtype, seed, [(kind, exp)] = args
    gen = _gen(seed)
    x = make_box(gen, shape, kind, exp, dtype)
    which = torch.randint(0, 3, x.shape, generator=gen)            # [0,0], [1,1], [0,1]
    mask = Interval((which == 1).to(F64), (which >= 1).to(F64))
    out = iv.mask_product(x, mask)
    # exact formula per case
    zero = torch.zeros_like(x.lo)
    assert torch.equal(out.lo, torch.where(which == 0, zero, torch.where(which == 1, x.lo,
                                                                        x.lo.clamp_max(0))))
    assert torch.equal(out.hi, torch.where(which == 0, zero, torch.where(which == 1, x.hi,
                                                                        x.hi.clamp_min(0))))
    for p in sample_points(gen, x, dtype):
        for m in (mask.lo, mask.hi):
            assert_inside(out, p.to(dtype) * m.to(dtype), "mask_product")
