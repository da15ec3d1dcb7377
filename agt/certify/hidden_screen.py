"""A fast screen for the box test of a model with hidden layers: most (query, box) pairs
decided from products shared by every query of a box, the rest by the reference test.

The reference (`agt.certify.Certifier.margin_lower_bound`) carries each query through its
own copy of its box: per query and step it gathers the first layer's weight box and takes
Rump's midpoint-radius product (agt/interval.py, `matmul`) of one row with it. The screen
evaluates the same formulas, with the first layer's products taken as matrix products of
all the queries tested at box k (the box's midpoint, radius and |midpoint| computed once
per k), and carries a rigorous bound on how far its result can lie from the reference's.

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

_U64 = 2.0**-53
_TINY64 = torch.finfo(torch.float64).tiny
#: Safety factor on the error bar: only makes more pairs go to the reference.
SAFETY = 2.0
#: Largest first-layer table built (bytes, float64 midpoints, radii and |midpoints| of every
#: box); beyond it the certifier keeps the reference path.
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
        self.bm = bm.contiguous()
        abs_bm = bm.abs()
        #: |am| is multiplied by both: one product (K, in, 2 out)
        self.br_abs = torch.cat([br, abs_bm], 2).contiguous()
        #: colsum of M = |bm| + br, for the reference's tiny-radius term of exact inputs
        self.m_colsum = (abs_bm + br).sum(1)        # (K, out)
        self.n_in = int(bm.shape[1])
        bias = f"{first}.bias"
        self.bias = (Interval(lower[bias].to(BOUND_DTYPE), upper[bias].to(BOUND_DTYPE))
                     if bias in lower else None)

    @staticmethod
    def fits(lower: dict[str, torch.Tensor], first: int) -> bool:
        """Whether the first layer's tables stay under `MAX_TABLE_BYTES` (an ensemble keeps
        one per teacher)."""
        K, out, n_in = lower[f"{first}.weight"].shape
        return 3 * K * out * n_in * 8 <= MAX_TABLE_BYTES

    # -- the first layer: products shared by the queries of a box ---------------------------
    def _first_layer(self, am, abs_am, ar, box, fm):
        """(screen's box (Q, 1, out) after the first layer and its bias, e, m) with the
        notation of the module docstring; ``ar`` None for exact inputs."""
        Q = am.shape[0]
        out = self.bm.shape[2]
        mid = am.new_empty(Q, out)
        rad = am.new_empty(Q, out)
        mag = am.new_empty(Q, out)
        order = torch.argsort(box)
        counts = torch.bincount(box, minlength=self.bm.shape[0]).tolist()
        start = 0
        for k, count in enumerate(counts):
            if not count:
                continue
            rows = order[start:start + count]
            start += count
            a = am.index_select(0, rows)
            both = abs_am.index_select(0, rows) @ self.br_abs[k]       # (q, 2 out)
            r = both[:, :out]
            if ar is not None:
                r = r + ar.index_select(0, rows) @ (self.br_abs[k, :, out:]
                                                    + self.br_abs[k, :, :out])
            mid[rows] = a @ self.bm[k]
            rad[rows] = r
            mag[rows] = both[:, out:] + r
        n = self.n_in
        # the reference's ar M for an exact input: ar = tiny, so 0 <= ar M <= tiny colsum(M)
        # up to underflow; the screen takes 0 and puts the bracket into e
        slack = (self.m_colsum.index_select(0, box) * _TINY64 * (1.0 + 1e-6) + n * _TINY64
                 if ar is None else 0.0)
        g = self.k_values.index_select(0, box)[:, None]
        c = fm.coeff(n) + GRADE_FACTOR * g * fm.coeff64(n)
        z = fm.widen(mid - rad, mid + rad, mag, n)
        m = mag
        if self.bias is not None:
            b = Interval(self.bias.lo.index_select(0, box), self.bias.hi.index_select(0, box))
            z = iv.add(z, b, fm)
            c = c + fm.coeff(1) + GRADE_FACTOR * g * fm.coeff64(1)
            m = m + b.magnitude()
        e = _rho(n, c) * m + _abs(n) + slack * (1.0 + 2.0 * c)
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
        wmag = W.magnitude()
        if W.shape[1] > 1:
            ar = torch.arange(W.shape[0], device=W.lo.device)
            wmag = wmag[ar, pred][:, None, :] + wmag                    # rows c and j
        wmag = wmag * (1.0 + 4 * _U64)
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

    # -- the screen ---------------------------------------------------------------------------
    def prepare(self, feats) -> tuple:
        """The per-chunk parts of the first layer's input: (am, |am|, ar or None) with the
        reference's floats; ``feats`` exact (Q, in) or the prefix's Interval (1, Q, in)."""
        if isinstance(feats, Interval):
            am, ar = Interval(feats.lo[0], feats.hi[0]).midrad()
            return am, am.abs(), ar
        x = feats.to(BOUND_DTYPE)
        return x, x.abs(), None

    def estimate(self, parts: tuple, pred: torch.Tensor,
                 box: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, e): the screen's value of the reference's margin bound at box[q] and the
        bound e on their distance (module docstring), inf where a magnitude is out of range.

        Args:
            parts: `prepare` of the queries.
            pred: (Q,) predicted classes.
            box: (Q,) box indices.
        """
        am, abs_am, ar = parts
        fm = self.fm.graded(self.k_values.index_select(0, box))
        h, e, m = self._first_layer(am, abs_am, ar, box, fm)
        worst = m.max(1).values
        for idx, layer in self.body[1:]:
            if layer.kind == "relu":
                h = iv.relu(h)
            else:
                h, e, m = self._linear(idx, layer, h, e, box, fm)
                worst = torch.maximum(worst, m.max(1).values)
        err, m_last, W = self._last_layer_error(h, e, pred, box, fm)
        worst = torch.maximum(worst, m_last)
        bias_name = f"{self.last}.bias"
        bias = self._box(bias_name, box) if bias_name in self.lower else None
        est = self.head(h.map(lambda t: t[:, 0]), pred, W, bias, fm)
        err = torch.where(worst < _HUGE, err, torch.full_like(err, torch.inf))
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
        est, err = self.estimate(parts, pred, box)
        bar = SAFETY * err
        sure = (est - bar) > 0
        unsure = ~sure & ~((est + bar) < 0)
        return sure, unsure
