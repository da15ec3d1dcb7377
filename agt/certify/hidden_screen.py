"""A fast screen for the box test of a model with hidden layers: most (query, box) pairs
decided from products shared by every query of a box, the rest by the reference test.

The reference (`agt.certify.Certifier.margin_lower_bound`) carries each query through its
own copy of its box: per query and step it gathers the first layer's weight box and takes
Rump's midpoint-radius product (agt/interval.py, `matmul`) of one row with it. The screen
evaluates the same formulas, with the first layer's products taken as matrix products of
all the queries tested at box k (in float32, around box 0's midpoint, below), and carries
a rigorous bound on how far its result can lie from the reference's.

Notation. A linear layer of fan-in n maps an input box [l, h] (per query) and the weight
box [bm - br, bm + br] (its midpoint and radius, computed from the box by elementwise
float operations, which are correctly rounded, so both codes get the same floats) to

    am = (l + h) / 2,  ar = max(h - am, am - l)(1 + 4u) + tiny,   M = |bm| + br,
    mid = am bm,  rad = |am| br + ar M,  mag = |am| |bm| + rad,
    [mid - rad - w, mid + rad + w],  w = c_w mag + a_w,

c_w = coeff(n) + 8 g coeff64(n) and a_w its absolute part (the graded widening of
agt/interval.py, grade g = the box's k); a bias adds the box [b] and widens by
c_1 (|z| + |b|) + a_1. ReLU clamps both ends at 0. The last layer bounds the margin of the
predicted class by the four-corner products of its (difference) rows with the hidden box,
their sum, the bias and the final two-logit widening (`Certifier.head_margin`).

Claim. Let L_ref be the float64 number the reference computes for (query, box) and A the
screen's, both by any summation order of their products. The screen also returns
F = SAFETY e, where e is built layer by layer as below. Then |L_ref - A| <= e, so

    fl(A - F) > 0  implies L_ref > 0 (the reference certifies),
    fl(A + F) < 0  implies L_ref < 0 (it does not),

because rounding to nearest is monotone and fixes 0; every pair in between goes to the
reference itself, so every decision, and so every radius, is the reference's, and every
property of the reference (soundness, isotonicity in the box and the grade, hence the
binary search and the smooth radii) holds for the screened search unchanged.

Proof. Write both computations as the exact formulas above applied to their own inputs,
plus their own rounding. Induction over the layers on a per-unit bound e_out with
|l_ref - l_scr| <= e and |h_ref - h_scr| <= e (both ends) at every layer's output.

* First layer: both take the same input floats (the exact queries, or the frozen prefix's
  feature boxes computed once per chunk), so e_in = 0 and only rounding differs.
* Perturbation (exact arithmetic, parameters fixed): moving l and h by at most e moves am
  by at most e and ar by at most (1 + 4u) e, so mid, rad and mag by at most e |bm|,
  e br + (1 + 4u) e M and e |bm| + that; hence each end moves by at most
  (1 + c_w)(2 + 4u) e M, and by (1 + c_1) times that after the bias. Lip = 2(1 + 2 c)
  (1 + 1e-6), c the layer's total widening coefficient, covers both.
* Rounding: each float operation errs by at most u64 of its result; the products and sums
  of n terms by gamma_n(u64) times the sum of their |terms| (Higham Thm 3.1, any order, FMA
  or not), plus n tiny for underflow. Every term of every intermediate (am, ar, the three
  products, w, the ends, the bias add) is bounded by m = (|am| + ar) M + |b|, and w by
  c m, so one evaluation errs by at most gamma(4n + 40, u64)(1 + c) m + (n + 10) 4 tiny.
  The two evaluations' m differ by at most 2 e M, so both together err by at most
  rho (m_scr + 2 e M) + abs with rho = 2 gamma(4n + 40, u64)(1 + c) (1 + 1e-6).
* So e_out = Lip e M + rho (m_scr + 2 e M) + abs; ReLU is exact and 1-Lipschitz (e
  unchanged). The last layer is the same argument with M the magnitudes of its (difference)
  rows and c = 2 c_1 + c_n + 2 c_{n+2} (+ graded), and min over classes and the sign flip
  of one logit are 1-Lipschitz; the screen's products are rounded too, and their error is
  inside rho.
* Where the screen takes a bracket for a term instead of the term (the reference's ar M
  for an exact input, between 0 and tiny colsum(M) up to underflow; the screen takes 0),
  the bracket's width times (1 + 2 c) (it enters rad and, through mag, w) is added to e.
* The first layer's products (below) differ from the exact mid, rad and mag of the
  reference's floats by at most d_mid, d_rad and d_mag; the ends (and the bias's
  widening) move by at most (1 + 2 c)(d_mid + d_rad + c d_mag), added to e, and m is the
  screen's mag + d_mag (so it bounds the reference's).

The first layer in float32 around box 0. Boxes nest (box 0 inside box k, checked by
`fits`), so box 0's midpoint bm_0 lies in box k and d_k = bm_k - bm_0 has |d_k| <= br_k.
Per chunk, in float64: P0 = am bm_0, A0 = |am| |bm_0| and (interval inputs) T0 = ar |bm_0|;
per step and box, in float32 (u32 = 2^-24; half the cost of float64, and the errors are
relative to the radius-sized d_k and br_k, not to the magnitudes): D = am d_k and
R = |am| br_k, from float32 copies of am, d_k and br_k (each rounded once, relative u32,
below tiny32 absolutely). The screen takes mid = P0 + D, rad = R (+ T0), mag = A0 + rad.
By Higham Thm 3.1 for each product (n terms, plus the input roundings, gamma(n + 4, u32)
covering both; underflow tiny32 per term and per rounded input):
  |am| br_k <= Rb = (R + n tiny32)(1 + 2 gamma(n + 4, u32))(1 + 4 u32)
                    + 2 tiny32 (colsum br_k + |am|_1),
  d_mid = 2 gamma(n, u64) A0 + gamma(n + 4, u32) Rb + under,  d_rad = gamma(n + 4, u32) Rb
  + under (+ for interval inputs: the reference's ar M_k lies in [ar |bm_0|, ar |bm_0| +
  2 ar br_k], since |bm_0| <= M_k = |bm_k| + br_k <= |bm_0| + 2 br_k; the screen takes T0,
  and adds 2 gamma(n, u64) T0 + 2 max(ar) colsum(br_k)), d_mag = 2 gamma(n, u64) A0 + Rb +
  d_rad (|am| |bm_k| lies within |am| br_k of |am| |bm_0|), with under = tiny32 (colsum br_k
  + 2 |am|_1) + 2 n (tiny32 + tiny64). A first-layer input above 2^64 (float32 copies could
  overflow) or a non-finite estimate leaves the pair to the reference. The float32
  bounds need IEEE float32 products: the certifier runs the screen under
  `agt.tensors.strict_kernels` (no TF32 on CUDA, no bf16 in oneDNN's matmuls).

Rearranged formulas. The screen need not evaluate the reference's expressions in the
reference's order: the perturbation step above compares the exact values of the same real
formulas, so A may come from any expression with the same exact value on the screen's
inputs, and only its own rounding changes. The screen uses three such rearrangements,
each of at most a few dozen operations per unit on terms bounded by (1 + c) m (so inside
the gamma(4n + 40, u64)(1 + c) m of the rounding step):
* the widening's coefficients folded per query: w = mag (coeff + 8 g coeff64) + (absolute
  + 8 g absolute64), the same real number as `FloatModel.widen`'s; the first layer's ends
  as mid -+ (rad + w);
* the bias add's magnitude max(|mid - r|, |mid + r|) as |mid| + r (r = rad + w >= 0), and
  its ends as (mid + b_lo) - (r + w_b), (mid + b_hi) + (r + w_b);
* one logit behind a ReLU (h_lo >= 0): the four-corner product's ends min(w_l h_l, w_l h_h)
  and max(w_h h_h, w_h h_l) (the other two corners never win for h >= 0), |h| = h_h, and
  the sum's widening from max(|p_lo - w_j|, |p_hi + w_j|) = max(p_hi, -p_lo) + w_j
  (p_lo <= p_hi, w_j >= 0), with the sums of w_j taken once: sum(p_lo - w_j) =
  sum(p_lo) - (c_1 sum(|W_j| h_h) + n a_1).
The bar e itself may be any upper bound of the expressions above: the screen evaluates
e = rho m + abs + (1 + 2c)(d_mid + d_rad + c d_mag) as alpha (A0 + T0) + beta R +
rho |b| + sigma with per-query coefficients (c is per query), the underflow terms'
column sums replaced by each box's largest column sum (so e only grows), every
coefficient and the result raised by (1 + 1e-6) for the rounding of the bar's own few
float64 operations; m (overflow test only) by the same coefficients on the rows' largest
A0 + T0, R and |b|.

Overflow: the argument needs finite intermediates; a pair whose magnitudes exceed 2^1000
(or give inf/nan anywhere: comparisons with nan are false) is left to the reference.

Which models: a trainable part of linear and ReLU layers ending in a linear layer, with at
least one hidden linear layer, exact inputs or the boxes of a frozen prefix; no
stability ball, no trajectory bound (those tests are or'd in by the reference only).
"""

from __future__ import annotations

from typing import Callable

import torch

from agt import interval as iv
from agt.bounded.layers import rule_for
from agt.interval import BOUND_DTYPE, GRADE_FACTOR, FloatModel, Interval, gamma
from agt.models import LayerSpec
from agt.tensors import grid_pairs

_U64 = 2.0**-53
_TINY64 = torch.finfo(torch.float64).tiny
_U32 = 2.0**-24
_TINY32 = float(torch.finfo(torch.float32).tiny)
#: Largest |input| of the first layer the float32 products take (else the reference decides)
_BIG32 = 2.0**64
#: Safety factor on the error bar: only makes more pairs go to the reference.
SAFETY = 2.0
#: Largest first-layer table built (bytes, counted as three float64 tables of every box; the
#: float32 offsets and radii take a third of that); beyond it the certifier keeps the
#: reference path.
MAX_TABLE_BYTES = 512 << 20
#: Magnitudes above this leave a pair to the reference (no overflow in either evaluation).
_HUGE = 2.0**1000

HeadMargin = Callable[[Interval, torch.Tensor, Interval, "Interval | None", FloatModel],
                      torch.Tensor]


def _lipschitz(c: torch.Tensor | float) -> torch.Tensor | float:
    return 2.0 * (1.0 + 2.0 * c) * (1.0 + 1e-6)


def _rho(n: int, c: torch.Tensor | float) -> torch.Tensor | float:
    return 2.0 * gamma(4 * n + 40, _U64) * (1.0 + c) * (1.0 + 1e-6)


def _abs(n: int) -> float:
    return 2.0 * (n + 10) * 4.0 * _TINY64


class HiddenLayerScreen:
    """The first hidden layer's box tables of a bundle (K boxes) and the screen's `decide`."""

    def __init__(self, lower: dict[str, torch.Tensor], upper: dict[str, torch.Tensor],
                 body: tuple[tuple[int, LayerSpec], ...], last: int, k_values: torch.Tensor,
                 fm: FloatModel, head: HeadMargin):
        """Args:
            lower, upper: the bundle's boxes, (K, ...) per trainable parameter name.
            body: (global index, layer) of the hidden part, linear and ReLU layers, the
                first one linear.
            last: the global index of the last (linear) layer.
            k_values: (K,) float64, the grade of each box.
            fm: the certifier's rounding model (ungraded).
            head: the reference's last-layer margin (`Certifier.head_margin`).
        """
        self.lower, self.upper, self.body, self.last = lower, upper, body, last
        self.k_values = k_values.to(BOUND_DTYPE)
        self.fm, self.head = fm, head
        first = body[0][0]
        self.first = first
        w_t = Interval(lower[f"{first}.weight"].to(BOUND_DTYPE).transpose(1, 2),
                       upper[f"{first}.weight"].to(BOUND_DTYPE).transpose(1, 2))
        bm, br = w_t.midrad()                       # (K, in, out): the reference's floats
        self.n_in = int(bm.shape[1])
        #: box 0's midpoint (float64) and every box's offset from it and radius (float32):
        #: the per-step products (module docstring, "The first layer in float32")
        self.bm0 = bm[0].contiguous()
        self.abs_bm0 = bm[0].abs().contiguous()
        self.d32 = (bm - bm[:1]).to(torch.float32).contiguous()
        self.br32 = br.to(torch.float32).contiguous()
        #: column sums of the radii and of M = |bm| + br (upper bounds: non-negative sums
        #: of n terms rounded up by their a-priori bound)
        up = 1.0 + 2.0 * gamma(self.n_in + 2, _U64)
        self.br_colsum = br.sum(1) * up + self.n_in * _TINY64            # (K, out)
        self.m_colsum = (bm.abs() + br).sum(1) * up + self.n_in * _TINY64
        #: their largest column per box (K,): the bar's underflow terms per query, not per
        #: unit (larger, so the bar only grows)
        self.br_cs_max = self.br_colsum.amax(1)
        self.m_cs_max = self.m_colsum.amax(1)
        bias = f"{first}.bias"
        self.bias = (Interval(lower[bias].to(BOUND_DTYPE), upper[bias].to(BOUND_DTYPE))
                     if bias in lower else None)
        #: |bias| per box (K, out) and its largest entry (K,)
        self.bias_mag = self.bias.magnitude() if self.bias is not None else None
        self.bias_mag_max = self.bias_mag.amax(1) if self.bias is not None else None
        #: the last layer's weight magnitudes per box (K, C, in), with the factor the bar
        #: puts on them
        last_w = Interval(lower[f"{last}.weight"].to(BOUND_DTYPE),
                          upper[f"{last}.weight"].to(BOUND_DTYPE))
        self.last_wmag = last_w.magnitude() * (1.0 + 4 * _U64)
        #: one logit behind a ReLU (its input h >= 0): the head's margin by `_binary_head`,
        #: with the last layer's boxes (K, in) and bias boxes (K,)
        self.binary = last_w.shape[1] == 1 and body[-1][1].kind == "relu"
        if self.binary:
            self.last_lo, self.last_hi = last_w.lo[:, 0], last_w.hi[:, 0]
            self.last_mag = last_w.magnitude()[:, 0]
            lb = f"{last}.bias"
            self.last_bias = (Interval(lower[lb][:, 0].to(BOUND_DTYPE),
                                       upper[lb][:, 0].to(BOUND_DTYPE))
                              if lb in lower else None)

    @staticmethod
    def fits(lower: dict[str, torch.Tensor], upper: dict[str, torch.Tensor],
             first: int) -> bool:
        """Whether the first layer's tables stay under `MAX_TABLE_BYTES` (an ensemble keeps
        one per teacher) and its weight boxes hold box 0 (the offsets' bound |bm_k - bm_0|
        <= br_k needs it; a validated bundle's boxes are nested in k)."""
        name = f"{first}.weight"
        K, out, n_in = lower[name].shape
        nested = bool((lower[name] <= lower[name][:1]).all()
                      and (upper[name] >= upper[name][:1]).all())
        return nested and 3 * K * out * n_in * 8 <= MAX_TABLE_BYTES

    # -- the first layer: products shared by the queries of a box ---------------------------
    def _first_layer(self, parts, box, fm, grid: bool = False):
        """(screen's box (Q, 1, out) after the first layer and its bias, e, m) with the
        notation of the module docstring. ``grid``: the rows are every box for every
        query, in `decide_grid`'s order (row q K + k: query q at box k); the products D
        and R are then one batched product per table instead of one per box (another
        summation order of the same float32 products: the bar holds for any)."""
        am32, abs_am32, p0, a0t, t0, l1, ar_max, ok, a0t_max = parts
        Q = am32.shape[0]
        out = self.bm0.shape[1]
        K = self.d32.shape[0]
        if grid:
            # (1, Q / K, n) x (K, n, out) -> (K, Q / K, out), then row q K + k
            dk = torch.matmul(am32[::K].unsqueeze(0), self.d32).transpose(0, 1).reshape(Q, out)
            rk = torch.matmul(abs_am32[::K].unsqueeze(0), self.br32).transpose(0, 1) \
                .reshape(Q, out)
            counts = ()
        else:
            dk = am32.new_empty(Q, out)
            rk = am32.new_empty(Q, out)
            order = torch.argsort(box)
            counts = torch.bincount(box, minlength=K).tolist()
        start = 0
        for k, count in enumerate(counts):
            if not count:
                continue
            if count == Q:                      # one box for all (the search's 1st step)
                torch.matmul(am32, self.d32[k], out=dk)
                torch.matmul(abs_am32, self.br32[k], out=rk)
                break
            rows = order[start:start + count]
            start += count
            dk[rows] = am32.index_select(0, rows) @ self.d32[k]
            rk[rows] = abs_am32.index_select(0, rows) @ self.br32[k]
        rk_max = (rk.amax(1) if out else rk.new_zeros(Q)).to(BOUND_DTYPE)
        n = self.n_in
        g32 = gamma(n + 4, _U32)
        g64 = 2.0 * gamma(n, _U64)
        c1 = (1.0 + 2.0 * g32) * (1.0 + 4 * _U32)
        gq = self.k_values.index_select(0, box)[:, None]                  # (Q, 1) grades
        # per-query terms (Q, 1) of the bar (module docstring, "The first layer in
        # float32"; underflow terms with each box's largest column sums)
        brcs = self.br_cs_max.index_select(0, box)[:, None]
        l1c = l1[:, None]
        under = _TINY32 * (brcs + 2.0 * l1c) + 2 * n * (_TINY32 + _TINY64)
        r0 = n * _TINY32 * c1 + 2 * _TINY32 * (brcs + l1c)      # Rb = c1 R + r0
        if t0 is None:
            # the reference's ar M for an exact input: ar = tiny, so 0 <= ar M <= tiny
            # colsum(M) up to underflow; the screen takes 0 and brackets it
            extra = self.m_cs_max.index_select(0, box)[:, None] * _TINY64 + n * _TINY64
        else:
            # ar M_k lies in [ar |bm_0|, ar |bm_0| + 2 ar br_k] (|bm_k - bm_0| <= br_k);
            # the screen takes ar |bm_0| (float64, once per chunk, inside a0t)
            extra = 2.0 * ar_max[:, None] * brcs + 2 * n * _TINY64
        # the estimate: mid = P0 + D, rad = R (+ T0), mag = A0 (+ T0) + R, the widening
        # with its per-query coefficients folded (the same real numbers as fm.widen)
        rk = rk.to(BOUND_DTYPE)
        mid = p0 + dk
        c = fm.coeff(n) + GRADE_FACTOR * gq * fm.coeff64(n)
        aw = fm.absolute(n) + GRADE_FACTOR * gq * fm.absolute64(n)
        rad = rk if t0 is None else rk + t0
        rw = torch.addcmul(rad, a0t + rk, c).add_(aw)                    # rad + w
        if self.bias is not None:
            b_lo = self.bias.lo.index_select(0, box)
            b_hi = self.bias.hi.index_select(0, box)
            b_mag = self.bias_mag.index_select(0, box)
            cb = fm.coeff(1) + GRADE_FACTOR * gq * fm.coeff64(1)
            ab = fm.absolute(1) + GRADE_FACTOR * gq * fm.absolute64(1)
            # iv.add's widening: max(|mid - rw|, |mid + rw|) = |mid| + rw (rw >= 0)
            wb = (mid.abs() + rw).add_(b_mag)
            rw = torch.addcmul(rw, wb, cb).add_(ab)
            lo, hi = (mid + b_lo).sub_(rw), (mid + b_hi).add_(rw)
            c = c + cb
        else:
            lo, hi = mid - rw, mid + rw
        z = Interval(lo, hi)
        # the bar e = rho m + abs + (1 + 2c)(d_mid + d_rad + c d_mag)(1 + 1e-6) as
        # alpha A0t + beta R + rho |b| + sigma with per-query coefficients (module docstring)
        rho = _rho(n, c)
        kk = (1.0 + 2.0 * c) * (1.0 + 1e-6)
        s_m = (1.0 + g32) * r0 + under + extra + 2 * n * _TINY64
        s_s = 2.0 * (g32 * r0 + under) + extra + c * s_m
        alpha = (rho * (1.0 + g64) + kk * g64 * (1.0 + c)) * (1.0 + 1e-6)
        beta = (rho * (1.0 + (1.0 + g32) * c1) + kk * c1 * (2.0 * g32 + c * (1.0 + g32))) \
            * (1.0 + 1e-6)
        sigma = (rho * s_m + _abs(n) + kk * s_s) * (1.0 + 1e-6)
        sigma = torch.where(ok[:, None], sigma, torch.full_like(sigma, torch.inf))
        e = torch.addcmul(sigma, a0t, alpha).addcmul_(rk, beta)
        # m: an upper bound of every unit's (the overflow test only)
        m = ((1.0 + g64) * a0t_max[:, None] + (1.0 + (1.0 + g32) * c1) * rk_max[:, None]
             + s_m) * (1.0 + 1e-6)
        if self.bias is not None:
            e.addcmul_(b_mag, rho * (1.0 + 1e-6))
            m = m + self.bias_mag_max.index_select(0, box)[:, None]
        return z.map(lambda t: t.unsqueeze(1)), e, m

    # -- further layers: the reference's code on the screen's boxes ---------------------------
    def _box(self, name: str, box: torch.Tensor) -> Interval:
        return Interval(self.lower[name].index_select(0, box),
                        self.upper[name].index_select(0, box))

    def _linear(self, idx, layer, h: Interval, e, box, fm):
        """A hidden linear layer after the first (per-query boxes, as the reference)."""
        p = {s: self._box(f"{idx}.{s}", box) for s in ("weight", "bias")
             if f"{idx}.{s}" in self.lower}
        z, _ = rule_for(layer).forward_bounds(layer, p, h, fm)
        w_t = p["weight"].map(lambda t: t.transpose(1, 2))             # (Q, in, out)
        bm, br = w_t.midrad()
        M = (bm.abs() + br) * (1.0 + 4 * _U64)
        hmag = h.magnitude()[:, 0] * (1.0 + 8 * _U64) + _TINY64        # >= |am| + ar
        n = int(M.shape[1])
        g = self.k_values.index_select(0, box)[:, None]
        c = fm.coeff(n) + GRADE_FACTOR * g * fm.coeff64(n)
        eM = torch.bmm(e.unsqueeze(1), M).squeeze(1) * (1.0 + 1e-6)
        m = torch.bmm(hmag.unsqueeze(1), M).squeeze(1) * (1.0 + 1e-6)
        if "bias" in p:
            c = c + fm.coeff(1) + GRADE_FACTOR * g * fm.coeff64(1)
            m = m + p["bias"].magnitude()
        e_out = _lipschitz(c) * eM + _rho(n, c) * (m + 2.0 * eM) + _abs(n)
        return z, e_out, m

    def _last_layer_error(self, h: Interval, e, pred, box, fm):
        """e and m of the margin through the last layer (module docstring)."""
        W = self._box(f"{self.last}.weight", box)                       # (Q, C, in)
        bias_name = f"{self.last}.bias"
        hmag = h.magnitude()[:, 0]                                      # (Q, in)
        wmag = self.last_wmag.index_select(0, box)                      # |W| (1 + 4 u64)
        if W.shape[1] > 1:
            ar = torch.arange(W.shape[0], device=W.lo.device)
            wmag = wmag[ar, pred][:, None, :] + wmag                    # rows c and j
        n = int(W.shape[2])
        eM = (wmag * e[:, None, :]).sum(-1) * (1.0 + 1e-6)              # (Q, C)
        m = (wmag * hmag[:, None, :]).sum(-1) * (1.0 + 1e-6)
        if bias_name in self.lower:
            bmag = self._box(bias_name, box).magnitude()
            if W.shape[1] > 1:
                bmag = bmag[ar, pred][:, None] + bmag
            m = m + bmag
        g = self.k_values.index_select(0, box)[:, None]
        c = (2 * fm.coeff(1) + fm.coeff(n) + 2 * fm.coeff(n + 2)
             + GRADE_FACTOR * g * (2 * fm.coeff64(1) + fm.coeff64(n) + 2 * fm.coeff64(n + 2)))
        err = _lipschitz(c) * eM + _rho(n, c) * (m + 2.0 * eM) + _abs(n)
        return err.max(1).values, m.max(1).values, W

    def _binary_head(self, h: Interval, e, pred, box, fm):
        """(A, e, m) of the head's margin for one logit behind a ReLU: the reference's
        formulas (`Certifier.head_margin`: the four-corner products, their sum, the bias,
        each widened) rearranged for 0 <= h_lo <= h_hi into sums over the units (module
        docstring, "Rearranged formulas"), and the bar of `_last_layer_error`."""
        hl, hh = h.lo[:, 0], h.hi[:, 0]                                 # (Q, in), >= 0
        wl = self.last_lo.index_select(0, box)
        wh = self.last_hi.index_select(0, box)
        wm = self.last_mag.index_select(0, box)
        n = int(hl.shape[1])
        g = self.k_values.index_select(0, box)
        # the four-corner rule's ends for h >= 0, and |W| |h| with |h| = h_hi
        lo = torch.minimum(wl * hl, wl * hh)
        hi = torch.maximum(wh * hh, wh * hl)
        mag = wm * hh
        s_mag = mag.sum(1)
        c1 = fm.coeff(1) + GRADE_FACTOR * g * fm.coeff64(1)
        a1 = fm.absolute(1) + GRADE_FACTOR * g * fm.absolute64(1)
        w_sum = c1 * s_mag + n * a1                                     # sum of the w_j
        # max(|lo_j - w_j|, |hi_j + w_j|) = max(hi_j, -lo_j) + w_j (lo_j <= hi_j, w_j >= 0)
        xmag = torch.maximum(hi, lo.neg_()).sum(1) + w_sum
        cn = fm.coeff(n) + GRADE_FACTOR * g * fm.coeff64(n)
        an = fm.absolute(n) + GRADE_FACTOR * g * fm.absolute64(n)
        wn = w_sum + xmag * cn + an
        z_lo = (-lo.sum(1)) - wn                          # lo was negated in place above
        z_hi = hi.sum(1) + wn
        m = s_mag * ((1.0 + 4 * _U64) * (1.0 + 1e-6))
        c = (2 * fm.coeff(1) + fm.coeff(n) + 2 * fm.coeff(n + 2)
             + GRADE_FACTOR * g * (2 * fm.coeff64(1) + fm.coeff64(n) + 2 * fm.coeff64(n + 2)))
        if self.last_bias is not None:
            bl = self.last_bias.lo.index_select(0, box)
            bh = self.last_bias.hi.index_select(0, box)
            bmag = torch.maximum(bl.abs(), bh.abs())
            wb = (torch.maximum(z_lo.abs(), z_hi.abs()) + bmag) * c1 + a1
            z_lo, z_hi = z_lo + bl - wb, z_hi + bh + wb
            m = m + bmag
        est = torch.where(pred == 1, z_lo, -z_hi)
        eM = (wm * e).sum(1) * ((1.0 + 4 * _U64) * (1.0 + 1e-6))
        err = _lipschitz(c) * eM + _rho(n, c) * (m + 2.0 * eM) + _abs(n)
        return est, err, m

    # -- the screen ---------------------------------------------------------------------------
    def prepare(self, feats) -> tuple:
        """The per-chunk parts of the first layer's input (module docstring): its float32
        copies, the float64 products with box 0's midpoint, and the magnitudes of its
        bracket terms; ``feats`` exact (Q, in) or the prefix's Interval (1, Q, in)."""
        if isinstance(feats, Interval):
            am, ar = Interval(feats.lo[0], feats.hi[0]).midrad()
        else:
            am, ar = feats.to(BOUND_DTYPE), None
        abs_am = am.abs()
        p0 = am @ self.bm0
        a0t = abs_am @ self.abs_bm0
        t0 = ar_max = None
        if ar is not None:
            t0 = ar @ self.abs_bm0
            ar_max = ar.amax(1) if ar.shape[1] else ar.new_zeros(ar.shape[0])
            a0t = a0t + t0                      # A0 + T0: they enter mag and the bar together
        # float32 copies stay finite and their rounding relative (or below tiny32)
        ok = (abs_am.amax(1) if am.shape[1] else am.new_zeros(am.shape[0])) <= _BIG32
        l1 = abs_am.sum(1) * (1.0 + 2.0 * gamma(self.n_in + 2, _U64)) + self.n_in * _TINY64
        a0t_max = a0t.amax(1) if a0t.shape[1] else a0t.new_zeros(a0t.shape[0])
        return (am.to(torch.float32), abs_am.to(torch.float32), p0, a0t, t0, l1, ar_max, ok,
                a0t_max)

    def estimate(self, parts: tuple, pred: torch.Tensor, box: torch.Tensor,
                 grid: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, e): the screen's value of the reference's margin bound at box[q] and the
        bound e on their distance (module docstring), inf where a magnitude is out of range.

        Args:
            parts: `prepare` of the queries.
            pred: (Q,) predicted classes.
            box: (Q,) box indices.
            grid: the rows are `decide_grid`'s (every box for every query), which only
                `decide_grid` passes.
        """
        fm = self.fm.graded(self.k_values.index_select(0, box))
        h, e, m = self._first_layer(parts, box, fm, grid)
        worst = m.max(1).values
        for idx, layer in self.body[1:]:
            if layer.kind == "relu":
                h = iv.relu(h)
            else:
                h, e, m = self._linear(idx, layer, h, e, box, fm)
                worst = torch.maximum(worst, m.max(1).values)
        if self.binary:
            est, err, m_last = self._binary_head(h, e, pred, box, fm)
        else:
            err, m_last, W = self._last_layer_error(h, e, pred, box, fm)
            bias_name = f"{self.last}.bias"
            bias = self._box(bias_name, box) if bias_name in self.lower else None
            est = self.head(h.map(lambda t: t[:, 0]), pred, W, bias, fm)
        worst = torch.maximum(worst, m_last)
        # overflow anywhere, or a non-finite estimate: the reference decides
        err = torch.where((worst < _HUGE) & torch.isfinite(est), err,
                          torch.full_like(err, torch.inf))
        return est, err

    def decide(self, parts: tuple, pred: torch.Tensor,
               box: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sure, unsure): per query, whether the reference box test at box[q] certifies
        for sure, and whether the screen cannot tell (those go to the reference).

        Args:
            parts: `prepare` of the queries.
            pred: (Q,) predicted classes.
            box: (Q,) box indices.
        """
        return _verdicts(*self.estimate(parts, pred, box))

    def decide_grid(self, parts: tuple, pred: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`decide` of every query at every box: (sure, unsure), each (Q, K). The same
        formulas and the same bar per pair as `decide` (each pair's decision is the
        reference's wherever the screen decides, whatever the pairs around it), with the
        first layer's products of a query taken against all K tables at once.

        Args:
            parts: `prepare` of the queries.
            pred: (Q,) predicted classes.
        """
        K = self.d32.shape[0]
        Q = pred.shape[0]
        query, box = grid_pairs(Q, K, pred.device)                       # row q K + k
        rows = tuple(None if p is None else p.index_select(0, query) for p in parts)
        sure, unsure = _verdicts(*self.estimate(rows, pred.index_select(0, query), box,
                                                grid=True))
        return sure.reshape(Q, K), unsure.reshape(Q, K)


def _verdicts(est: torch.Tensor, err: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sure, unsure) of the screen's estimates and error bounds: certified for sure where
    the estimate clears SAFETY times its error bound, undecided where it lies within it."""
    bar = SAFETY * err
    sure = (est - bar) > 0
    unsure = ~sure & ~((est + bar) < 0)
    return sure, unsure
