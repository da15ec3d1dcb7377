"""A fast screen for the box test of a one-layer linear model: most (query, box) pairs
decided by one small product, the rest by the reference test.

For a model that is a single linear layer with exact inputs x (no frozen prefix, no hidden
layers), the reference lower bound on the margin of the predicted class c over box k
(`agt.certify.Certifier.margin_lower_bound`) is, in exact arithmetic before its rounding
terms,

    T_k(x) = min_{j != c} [ sum_i s_i x_i + (b_c^lo - b_j^hi) ],
    s_i = fl(W_ci^lo - W_ji^hi) where x_i >= 0, fl(W_ci^hi - W_ji^lo) where x_i < 0,

a four-corner product with an exact factor picks one end per coordinate. With x+ = max(x, 0)
and x- = min(x, 0) this is one dot product of [x+, x-] with a precomputed column per
(box, class, competitor). (One logit: class 1 bounds z from below and class 0 bounds -z,
the columns [W^lo; W^hi] with b^lo, and [-W^hi; -W^lo] with -b^hi.)

The reference computes L_k = T_k - (its rounding widenings) + (its own float64 error). With
magU = sum_i (|W_ci| + |W_ji|) |x_i| + |b_c| + |b_j| <= ||x||_1 m_k + bm_k over the box
(m_k = 2 max|W| and bm_k = 2 max|b| in box k), every widening the reference adds (the
products', the sum's, the bias's and the final two-logit term, each with its graded part
GRADE_FACTOR k coeff64, agt/interval.py) is at most magU Cw(k) + Aw(k), and its float64
error and that of the screen's own estimate A (Higham Thm 3.1: any summation order, FMA or
not) at most Ce magU. Hence |L_k - A| <= F_k(x) = S (magU (Cw + Ce) + Aw), with a safety
factor S = 2, and

    fl(A - F) > 0  implies L_k > 0 (the reference certifies),
    fl(A + F) < 0  implies L_k < 0 (it does not),

because rounding to nearest is monotone and fixes 0. Pairs in between (|A| <= F: a margin
within about 1e-11 of its magnitude from zero in float64) go to the reference test itself.
So the screen never changes a decision: every property of the reference (soundness,
isotonicity in the box and the grade, hence the binary search and the smooth radii) holds
for the screened search unchanged; tests compare the two on every bundle shape, including
queries placed on the decision boundary.
"""

from __future__ import annotations

import torch

from agt.interval import BOUND_DTYPE, GRADE_FACTOR, FloatModel, gamma
from agt.tensors import grid_pairs

_U64 = 2.0**-53
#: Safety factor on the error bar: only makes more pairs go to the reference.
SAFETY = 2.0
#: Largest column table built (bytes); beyond it the certifier keeps the reference path.
MAX_TABLE_BYTES = 8 << 20


class LinearMarginScreen:
    """Precomputed columns of a one-layer linear bundle (K boxes) for `estimate`."""

    def __init__(self, lower: dict[str, torch.Tensor], upper: dict[str, torch.Tensor],
                 weight: str, bias: str | None, k_values: torch.Tensor, fm: FloatModel):
        """Args:
            lower, upper: the bundle's boxes, (K, ...) per parameter name.
            weight, bias: the names of the layer's weight (K, C, in) and bias (K, C) or None.
            k_values: (K,) float64, the grade of each box.
            fm: the certifier's rounding model (ungraded).
        """
        wlo = lower[weight].to(BOUND_DTYPE)
        whi = upper[weight].to(BOUND_DTYPE)
        K, C, n_in = wlo.shape
        if bias is not None:
            blo, bhi = lower[bias].to(BOUND_DTYPE), upper[bias].to(BOUND_DTYPE)
        else:
            blo = bhi = torch.zeros(K, C, dtype=BOUND_DTYPE, device=wlo.device)
        if C == 1:
            # row 2k + c: class 1 bounds z from below, class 0 bounds -z from below
            lo_cols = torch.stack([-whi[:, 0], wlo[:, 0]], 1)                  # (K, 2, in)
            hi_cols = torch.stack([-wlo[:, 0], whi[:, 0]], 1)
            self.columns = torch.cat([lo_cols, hi_cols], -1).unsqueeze(-1)     # (K, 2, 2in, 1)
            self.offsets = torch.stack([-bhi[:, 0], blo[:, 0]], 1).unsqueeze(-1)  # (K, 2, 1)
            self.rows_per_box = 2
        else:
            # the same float subtractions as the reference's margin (wc.lo - W.hi, ...)
            dlo = wlo[:, :, None, :] - whi[:, None, :, :]                      # (K, c, j, in)
            dhi = whi[:, :, None, :] - wlo[:, None, :, :]
            self.columns = torch.cat([dlo, dhi], -1).transpose(-1, -2)         # (K, c, 2in, j)
            self.offsets = blo[:, :, None] - bhi[:, None, :]                   # (K, c, j)
            self.rows_per_box = C
        self.columns = self.columns.reshape(K * self.rows_per_box, 2 * n_in, -1).contiguous()
        self.offsets = self.offsets.reshape(K * self.rows_per_box, -1).contiguous()
        self.n_logits = C
        w_mag = torch.maximum(wlo.abs(), whi.abs()).flatten(1).amax(1)
        b_mag = torch.maximum(blo.abs(), bhi.abs()).flatten(1).amax(1)
        # magU <= ||x||_1 m + bm, with a relative slack for the rounding of the sums
        m = 2.0 * w_mag * (1.0 + 1e-12)
        bm = 2.0 * b_mag * (1.0 + 1e-12)
        g = k_values.to(BOUND_DTYPE).to(wlo.device)
        cw = (2 * fm.coeff(1) + fm.coeff(n_in) + 2 * fm.coeff(n_in + 2)
              + GRADE_FACTOR * g * (2 * fm.coeff64(1) + fm.coeff64(n_in)
                                    + 2 * fm.coeff64(n_in + 2)))
        aw = ((n_in + 1) * (fm.absolute(1) + GRADE_FACTOR * g * fm.absolute64(1))
              + fm.absolute(n_in) + GRADE_FACTOR * g * fm.absolute64(n_in)
              + 2 * (fm.absolute(n_in + 2) + GRADE_FACTOR * g * fm.absolute64(n_in + 2)))
        ce = 2.0 * gamma(4 * n_in + 40, _U64) * (1.0 + cw)
        self.slope = SAFETY * m * (cw + ce) * (1.0 + 1e-9)                    # (K,)
        self.intercept = SAFETY * (bm * (cw + ce) + aw) * (1.0 + 1e-9)        # (K,)

    @staticmethod
    def fits(lower: dict[str, torch.Tensor], weight: str) -> bool:
        """Whether the column table of this bundle stays under `MAX_TABLE_BYTES` (an
        ensemble keeps one per teacher)."""
        K, C, n_in = lower[weight].shape
        cols = K * (2 if C == 1 else C * C) * 2 * n_in
        return cols * 8 <= MAX_TABLE_BYTES

    @staticmethod
    def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([x+, x-] as (Q, 1, 2 in), ||x||_1 as (Q,)) of exact float64 queries (Q, in)."""
        both = torch.cat([x.clamp_min(0.0), x.clamp_max(0.0)], 1).unsqueeze(1)
        return both, x.abs().sum(1)

    def decide(self, x_split: torch.Tensor, norm1: torch.Tensor, pred: torch.Tensor,
               box: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sure, unsure): per query, whether the reference box test at box[q] certifies
        for sure, and whether the screen cannot tell (those go to the reference).

        Args:
            x_split, norm1: `split` of the queries.
            pred: (Q,) predicted classes.
            box: (Q,) box indices.
        """
        row = box * self.rows_per_box + pred
        est = torch.bmm(x_split, self.columns.index_select(0, row)).squeeze(1)
        est = est + self.offsets.index_select(0, row)
        if self.n_logits > 1:
            est = est.scatter(1, pred[:, None], torch.inf)
        est = est.min(1).values
        bar = torch.addcmul(self.intercept[box], norm1, self.slope[box])
        sure = (est - bar) > 0
        unsure = ~sure & ~((est + bar) < 0)
        return sure, unsure

    def decide_grid(self, x_split: torch.Tensor, norm1: torch.Tensor,
                    pred: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`decide` of every query at every box: (sure, unsure), each (Q, K), by `decide`
        itself on the (query, box) pairs (each pair's decision depends on its own row
        only).

        Args:
            x_split, norm1: `split` of the queries.
            pred: (Q,) predicted classes.
        """
        K = self.slope.shape[0]
        Q = pred.shape[0]
        query, box = grid_pairs(Q, K, pred.device)                       # row q K + k
        sure, unsure = self.decide(x_split.index_select(0, query), norm1.index_select(0, query),
                                   pred.index_select(0, query), box)
        return sure.reshape(Q, K), unsure.reshape(Q, K)
