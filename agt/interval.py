"""Interval tensors and sound interval arithmetic with outward rounding.

Every bound in agt is computed in float64 and must enclose two things:

1. the exact-arithmetic result for every point of the input boxes, and
2. what the *nominal* floating-point computation (in the training dtype, float32 or
   float64) returns for every such point.

Neither PyTorch nor the CPU give directed rounding, so each operation computes its result
with round-to-nearest and then widens it outward by a rigorous a-priori error bound
(Higham, "Accuracy and Stability of Numerical Algorithms", Thm 3.1/3.5): a sum of ``n``
products evaluated in *any* order (blocked, pairwise, with or without FMA) satisfies

    |fl(sum_i a_i b_i) - sum_i a_i b_i| <= gamma_n(u) * sum_i |a_i b_i|,
    gamma_n(u) = n u / (1 - n u),

plus ``n`` times the smallest normal number for underflow (this also covers
flush-to-zero). `FloatModel.widen` adds both error terms, one for the nominal dtype and one
for the float64 bound computation itself, each with headroom.

`Interval` is the one value type of the tensor core: a frozen pair
``lo <= hi`` of tensors of equal shape.

Graded widening (nesting in floating point). The smooth radius needs the boxes of
neighbours to nest, box(D', k - 1) inside box(D, k), for the *computed* boxes. Each
operation's formula is inclusion isotone in exact arithmetic, and the computation is not:
for sub-boxes A of B the float64 results can leave B's by rounding (a midpoint rounded the
other way), and a ReLU mask decided on B but undecided on A turns one ulp into a whole
gradient range. A `FloatModel` with a *grade* g per box (its k, `FloatModel.graded`) adds
``GRADE_FACTOR g`` times the float64 part of the rounding bound to every widening. Lemma:
if A lies inside B (in floats) and the grades satisfy g_A <= g_B - 1, the computed result
of an operation on A at g_A lies inside its computed result on B at g_B. Proof for the
lower end (the upper is symmetric): let L be the exact formula (isotone: L(A) >= L(B)),
e_X the float64 error of its evaluation on X, w_X the float64 part of X's rounding bound
and W_X the nominal dtype's part, with e_X <= w_X (the accounting behind `coeff`), and
w_A <= w_B (1 + eps), W_A <= W_B (1 + eps), eps the relative rounding of a magnitude that
is isotone in exact arithmetic (about n u64 for n terms). With c = GRADE_FACTOR,

    lo_A >= L(A) - e_A - W_A - (1 + c g_A) w_A,   lo_B <= L(B) + e_B - W_B - (1 + c g_B) w_B,

so lo_A >= lo_B once 2 + (1 + c (g_B - 1)) (1 + eps) + eps W_B / w_B <= 1 + c g_B, i.e.
eps (1 + c g_B + W_B / w_B) <= c - 2 = 6. W / w is at most u / u64 (2^29 in float32), so
this holds while n k < 1e15 and n < 1e8 (n an operation's terms; k is below the batch
size), far beyond agt's layers and batches; it leaves room for e_X up to 2.5 w_X. The
final subtraction fl(x - y) is monotone in x and y, so the ordering survives its rounding.
Operations that round only monotonically (four-corner products, relu, clamp, masks,
selections, the outward casts) are isotone in floating point outright, so a chain of
graded and monotone operations maps nested boxes to nested boxes with no assumption on
summation order or determinism of the kernels. (Callers that compare two computations at
the *same* grade rest on determinism instead: the frozen prefix's features and the first
epoch of the per-epoch programme, agt/placement.py; agt.tensors.strict_kernels asks for
deterministic kernels off the CPU.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agt.errors import SoundnessError

BOUND_DTYPE = torch.float64
_U64 = 2.0**-53
_TINY64 = torch.finfo(torch.float64).tiny


def gamma(n: int | float, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u) (requires n u < 1)."""
    nu = n * u
    if nu >= 0.5:
        raise SoundnessError(f"rounding bound undefined for {n} terms at unit roundoff {u}")
    return nu / (1.0 - nu)


#: Multiple of the float64 rounding bound added per unit of grade (module docstring).
GRADE_FACTOR = 8.0


@dataclass(frozen=True, eq=False)
class FloatModel:
    """Rounding model of the nominal computation (dtype) plus the float64 bound computation.

    ``coeff(n)`` is the relative error coefficient to apply to the magnitude bound of an
    operation with ``n`` rounded terms; ``absolute(n)`` covers underflow. ``grade``: None,
    or a float64 tensor (G,) with one grade per box of the leading dimension of every
    widened result (module docstring, graded widening).
    """

    nominal_dtype: torch.dtype
    grade: torch.Tensor | None = None

    @property
    def unit_roundoff(self) -> float:
        return torch.finfo(self.nominal_dtype).eps / 2.0

    def graded(self, grade) -> "FloatModel":
        """This model with one grade per box (the boxes' distances k)."""
        g = torch.as_tensor(grade, dtype=BOUND_DTYPE)
        if g.dim() != 1 or not bool((g >= 0).all()):
            raise SoundnessError(f"grades must be a vector of non-negative numbers, got {g}")
        return FloatModel(self.nominal_dtype, g)

    @staticmethod
    def coeff64(n_terms: int | float) -> float:
        """The float64 part of `coeff`: rounding of the bound computation itself."""
        return gamma(3 * n_terms + 8, _U64) * (1.0 + 1e-6) + 4 * _U64

    def coeff(self, n_terms: int | float) -> float:
        # nominal rounding (n + 2 roundings per term covers the products, the sum and a
        # final cast) + float64 rounding of the bound computation (mid, rad, mag, widen).
        c = gamma(n_terms + 2, self.unit_roundoff) + gamma(3 * n_terms + 8, _U64)
        return c * (1.0 + 1e-6) + 4 * _U64

    @staticmethod
    def absolute64(n_terms: int | float) -> float:
        return (n_terms + 2) * _TINY64 * 2.0

    def absolute(self, n_terms: int | float) -> float:
        return (n_terms + 2) * (torch.finfo(self.nominal_dtype).tiny + _TINY64) * 2.0

    def grade_like(self, t: torch.Tensor) -> torch.Tensor | None:
        """The grades shaped to broadcast against ``t`` (leading dimension: the boxes)."""
        if self.grade is None:
            return None
        g = self.grade.to(t.device)
        if t.dim() == 0 or t.shape[0] != g.shape[0]:
            raise SoundnessError(f"internal: {g.shape[0]} grades for a result of shape "
                                 f"{tuple(t.shape)}")
        return g.view(-1, *([1] * (t.dim() - 1)))

    def graded_extra(self, t: torch.Tensor, mag, n_terms: int | float):
        """The graded part of the widening of a result shaped like ``t`` (0 ungraded)."""
        g = self.grade_like(t)
        if g is None:
            return 0.0
        return GRADE_FACTOR * g * (mag * self.coeff64(n_terms) + self.absolute64(n_terms))

    def widen(self, lo: torch.Tensor, hi: torch.Tensor, mag: torch.Tensor | float,
              n_terms: int | float) -> "Interval":
        """Outward-widen [lo, hi] by the rounding bound for a result of magnitude <= mag
        (plus the graded part, module docstring)."""
        w = mag * self.coeff(n_terms) + self.absolute(n_terms)
        w = w + self.graded_extra(lo, mag, n_terms)
        return Interval(lo - w, hi + w)


@dataclass(frozen=True)
class Interval:
    """A box [lo, hi] of tensors of equal shape (elementwise lo <= hi).

    float64 throughout the tensor core; per-sample gradient bounds handed to the top-k
    accumulators may be in the training dtype after an outward cast (`to_dtype_outward`)."""

    lo: torch.Tensor
    hi: torch.Tensor

    def __post_init__(self) -> None:
        if self.lo.shape != self.hi.shape:
            raise SoundnessError(f"interval bounds of different shapes {tuple(self.lo.shape)}"
                                 f" and {tuple(self.hi.shape)}")

    # -- constructors -----------------------------------------------------------------
    @staticmethod
    def exact(x: torch.Tensor) -> "Interval":
        x = x.to(BOUND_DTYPE)
        return Interval(x, x)

    @staticmethod
    def hull(a: "Interval", b: "Interval") -> "Interval":
        return Interval(torch.minimum(a.lo, b.lo), torch.maximum(a.hi, b.hi))

    # -- views ------------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return self.lo.shape

    def midrad(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mid, rad) with [mid - rad, mid + rad] guaranteed to contain [lo, hi]."""
        # the same float operations as 0.5 (lo + hi) and max(hi - mid, mid - lo)
        # (1 + 4u) + tiny, in place where a fresh result already exists (fewer
        # temporaries: the certifier takes this on every chunk of prefix features)
        mid = torch.add(self.lo, self.hi).mul_(0.5)
        rad = self.hi - mid
        rad = torch.maximum(rad, torch.sub(mid, self.lo), out=rad) if rad.shape == mid.shape \
            else torch.maximum(rad, mid - self.lo)
        return mid, rad.mul_(1.0 + 4 * _U64).add_(_TINY64)

    def magnitude(self) -> torch.Tensor:
        """max |x| over the box."""
        return torch.maximum(self.lo.abs(), self.hi.abs())

    def width(self) -> torch.Tensor:
        return self.hi - self.lo

    def contains(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(BOUND_DTYPE)
        return (self.lo <= x) & (x <= self.hi)

    def map(self, fn) -> "Interval":
        """Apply a shape operation (view, reshape, index) to both ends."""
        return Interval(fn(self.lo), fn(self.hi))

    def __getitem__(self, idx) -> "Interval":
        return Interval(self.lo[idx], self.hi[idx])


# ----------------------------------------------------------------------------------------
# Monotone maps: exact on the endpoints (ReLU, clamp are exact in floating point too).
# ----------------------------------------------------------------------------------------

def nested_along_first(box: Interval) -> Interval:
    """The smallest widening whose slices along dimension 0 are nested, slice i inside
    slice i + 1 (running min of lo, running max of hi): boxes of a k grid made nested in k."""
    return Interval(torch.cummin(box.lo, dim=0).values, torch.cummax(box.hi, dim=0).values)


def relu(x: Interval) -> Interval:
    return Interval(x.lo.clamp_min(0.0), x.hi.clamp_min(0.0))


def clamp(x: Interval, bound: float) -> Interval:
    return Interval(x.lo.clamp(-bound, bound), x.hi.clamp(-bound, bound))


def add(a: Interval, b: Interval, fm: FloatModel) -> Interval:
    mag = a.magnitude() + b.magnitude()
    return fm.widen(a.lo + b.lo, a.hi + b.hi, mag, 1)


def sum_intervals(x: Interval, dim: int, fm: FloatModel) -> Interval:
    """Sum along ``dim`` (n terms, any summation order)."""
    n = x.shape[dim]
    return fm.widen(x.lo.sum(dim), x.hi.sum(dim), x.magnitude().sum(dim), n)


def mul(a: Interval, b: Interval, fm: FloatModel) -> Interval:
    """Elementwise product with broadcasting: the exact four-corner rule.

    [a]*[b] = [min(corners), max(corners)] with corners a_l b_l, a_l b_u, a_u b_l, a_u b_u.
    For a per-sample outer product (a contraction of length 1) this is as cheap as Rump's
    midpoint-radius product and never looser.
    """
    p1 = a.lo * b.lo
    p2 = a.lo * b.hi
    p3 = a.hi * b.lo
    p4 = a.hi * b.hi
    lo = torch.minimum(torch.minimum(p1, p2), torch.minimum(p3, p4))
    hi = torch.maximum(torch.maximum(p1, p2), torch.maximum(p3, p4))
    mag = a.magnitude() * b.magnitude()
    return fm.widen(lo, hi, mag, 1)


def mul_exact(x: torch.Tensor, b: Interval, fm: FloatModel) -> Interval:
    """Elementwise product of an exact (float64) tensor with an interval."""
    p1 = x * b.lo
    p2 = x * b.hi
    lo = torch.minimum(p1, p2)
    hi = torch.maximum(p1, p2)
    return fm.widen(lo, hi, x.abs() * b.magnitude(), 1)


def matmul(a: Interval, b: Interval, fm: FloatModel) -> Interval:
    """Interval matrix product (batched, broadcasting) by Rump's midpoint-radius rule.

    mid = A_m B_m,  rad = |A_m| B_r + A_r (|B_m| + B_r)   (Rump 1999, Thm 2.1)

    The rule is inclusion-isotone. The magnitude |A|max |B|max used for the rounding bound
    is |A_m||B_m| + rad.
    """
    am, ar = a.midrad()
    bm, br = b.midrad()
    mid = am @ bm
    am_abs = am.abs()
    rad = am_abs @ br + ar @ (bm.abs() + br)
    mag = am_abs @ bm.abs() + rad
    return fm.widen(mid - rad, mid + rad, mag, a.shape[-1])


def matmul_exact_left(x: torch.Tensor, b: Interval, fm: FloatModel) -> Interval:
    """x @ [B] for an exact float64 left factor x."""
    bm, br = b.midrad()
    x_abs = x.abs()
    mid = x @ bm
    rad = x_abs @ br
    mag = x_abs @ (bm.abs() + br)
    return fm.widen(mid - rad, mid + rad, mag, x.shape[-1])


def matmul_exact_right(a: Interval, y: torch.Tensor, fm: FloatModel) -> Interval:
    """[A] @ y for an exact float64 right factor y."""
    am, ar = a.midrad()
    y_abs = y.abs()
    mid = am @ y
    rad = ar @ y_abs
    mag = (am.abs() + ar) @ y_abs
    return fm.widen(mid - rad, mid + rad, mag, a.shape[-1])


def heaviside_mask(pre: Interval) -> Interval:
    """Interval of the ReLU derivative 1[z > 0] over a pre-activation box: 0, 1 or [0, 1].

    `pre` must already be widened for rounding, so a pre-activation the nominal float
    computation could place on either side of 0 gets [0, 1] (a ReLU that one rounding can flip is
    undecided).
    """
    return Interval((pre.lo > 0).to(BOUND_DTYPE), (pre.hi > 0).to(BOUND_DTYPE))


def mask_product(x: Interval, mask: Interval) -> Interval:
    """x * m for m a {0,1}-valued mask interval: exact (multiplying by 0 or 1 is exact)."""
    lo = torch.where(mask.lo > 0, x.lo, torch.where(mask.hi > 0, x.lo.clamp_max(0.0),
                                                    torch.zeros_like(x.lo)))
    hi = torch.where(mask.lo > 0, x.hi, torch.where(mask.hi > 0, x.hi.clamp_min(0.0),
                                                    torch.zeros_like(x.hi)))
    return Interval(lo, hi)


_F32_SHIFT = 2.0**-22
_TINY32 = float(torch.finfo(torch.float32).tiny)


def to_dtype_outward(x: Interval, dtype: torch.dtype) -> Interval:
    """Cast bounds to ``dtype`` rounding outward (lower down, upper up).

    float32: moving each end outward by 2^-22 of its magnitude (plus the smallest normal)
    before a round-to-nearest cast (error <= 2^-24 relative) lands on the safe side. The map
    is monotone, so orderings (top-k selections) are preserved."""
    if dtype == BOUND_DTYPE or x.lo.dtype != BOUND_DTYPE:
        return x
    if dtype != torch.float32:
        raise SoundnessError(f"unsupported compute dtype {dtype}")
    lo = (x.lo - x.lo.abs() * _F32_SHIFT - _TINY32).to(dtype)
    hi = (x.hi + x.hi.abs() * _F32_SHIFT + _TINY32).to(dtype)
    return Interval(lo, hi)


def product_factor(x: Interval, fm: FloatModel) -> Interval:
    """Widen a factor relatively so that products with it, evaluated in the nominal dtype
    (round to nearest), still bound the nominal products: the nominal rounding
    fl(d a) = d (1 + e) a with |e| <= u is absorbed into d, and so is the rounding of the
    bound computation itself (3u for both plus second-order terms, float64 slack). Underflow
    is covered by the absolute term of the descent bound (agt/topk.py)."""
    c = 3.0 * fm.unit_roundoff + 16 * _U64
    return Interval(x.lo - x.lo.abs() * c, x.hi + x.hi.abs() * c)
