"""Streaming top-k/bottom-k accumulation and the descent-direction bound (paper Thm 4.6).

For a batch of size b, per-sample clamped gradient bounds g_i^L <= g_i <= g_i^U (elementwise
per parameter, valid for every parameter in the current box) and a distance k:

    delta_L = ( sum of the smallest (b - k) of g_i^L  -  k * gamma ) / b
    delta_U = ( sum of the largest  (b - k) of g_i^U  +  k * gamma ) / b

bound the clamped mean gradient of every batch obtained by replacing up to k records (and,
with the divisor of the actual batch, by removing up to k and adding up to k; the
intersection with [-gamma, gamma], where every clamped mean lies, keeps k >= b sound).

Streaming: ``sum of the smallest (b - k) = sum of all - sum of the largest k``, so per
parameter we keep the running sum of all g^L and a running buffer of its k_max largest
values (and the same for -g^U), merged fragment by fragment: memory is O(P k_max), not
O(P b). Selections use unsorted top-k; the buffer is sorted once at the end, and its
prefix sums give the bound for every k <= k_max at once.
"""

from __future__ import annotations

import torch

from agt.interval import BOUND_DTYPE, FloatModel, Interval, gamma as gamma_n

_U64 = 2.0**-53
SUM_BLOCK = 16


def blocked_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim, returned in float64: blocks of SUM_BLOCK values are summed in
    the input dtype (worst-case relative error gamma_16(u) of the block's absolute sum,
    accounted for by the callers), the block sums in float64. Several times faster than a
    float64 cast of every value."""
    if x.dtype == BOUND_DTYPE:
        return x.sum(-1)
    n = x.shape[-1]
    main = n - n % SUM_BLOCK
    # each partial sum adds SUM_BLOCK values (strided: vectorises well), then float64
    out = x[..., :main].reshape(*x.shape[:-1], SUM_BLOCK, main // SUM_BLOCK).sum(-2)
    out = out.to(BOUND_DTYPE).sum(-1)
    if main < n:
        out = out + x[..., main:].to(BOUND_DTYPE).sum(-1)
    return out


def _sum_slack(fm: FloatModel) -> float:
    """Relative (to b * gamma) error of blocked sums in the compute dtype."""
    return gamma_n(SUM_BLOCK, fm.unit_roundoff)


class DescentAccumulator:
    """Running sums and top-k buffers of clamped per-sample gradient bounds of one parameter
    (flattened to P entries) for G parameter boxes at once.

    Values arrive as sound bounds in the compute dtype (float32 for float32 training: the
    bound passes round outward when they cast), so buffering them loses nothing; sums are
    accumulated in float64."""

    def __init__(self, n_groups: int, n_params: int, k_max: int, gamma: float,
                 device: torch.device, dtype: torch.dtype = BOUND_DTYPE):
        self.gamma = float(gamma)
        self.k_max = int(k_max)
        self.count = 0
        self.sum_lo = torch.zeros(n_groups, n_params, dtype=BOUND_DTYPE, device=device)
        self.sum_hi = torch.zeros_like(self.sum_lo)
        if self.k_max > 0:
            shape = (n_groups, n_params, self.k_max)
            self.top_lo = torch.full(shape, -float("inf"), dtype=dtype, device=device)
            self.top_neg_hi = torch.full_like(self.top_lo, -float("inf"))

    def add(self, start: int, stop: int, grads: Interval) -> None:
        """grads: Interval (G or 1, stop - start, f) of per-sample gradient bounds of the
        parameter entries [start, stop) for f samples (samples last); clamped here."""
        lo = grads.lo.clamp(-self.gamma, self.gamma)
        neg_hi = grads.hi.clamp(-self.gamma, self.gamma).neg_()
        self.sum_lo[:, start:stop] += blocked_sum(lo)
        self.sum_hi[:, start:stop] -= blocked_sum(neg_hi)
        if self.k_max > 0:
            self.top_lo[:, start:stop] = self._merge(self.top_lo[:, start:stop], lo)
            self.top_neg_hi[:, start:stop] = self._merge(self.top_neg_hi[:, start:stop], neg_hi)

    def _merge(self, buffer: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        values = values.to(buffer.dtype)
        if values.shape[0] != buffer.shape[0]:
            values = values.expand(buffer.shape[0], -1, -1)
        if values.shape[-1] > 2 * self.k_max:   # shrink the fragment first: cheaper merge
            values = values.topk(self.k_max, dim=-1, sorted=False).values
        merged = torch.cat([buffer, values], dim=-1)
        return merged.topk(self.k_max, dim=-1, sorted=False).values

    def samples_seen(self, n: int) -> None:
        self.count += n

    def bounds(self, k: torch.Tensor, fm: FloatModel, group: torch.Tensor | None = None) -> Interval:
        """Descent-direction bounds for distances ``k`` (int tensor (M,)), each computed from
        group ``group[m]`` of this accumulator (default: group m). Returns Interval (M, P)."""
        b = self.count
        device = self.sum_lo.device
        if group is None:
            group = torch.arange(k.shape[0])
        k = k.to(device)
        group = group.to(device)
        sum_lo = self.sum_lo[group]
        sum_hi = self.sum_hi[group]
        kf = k.to(BOUND_DTYPE)[:, None]
        if self.k_max > 0:
            top_lo = self._top_sums(self.top_lo, k, group)
            top_neg_hi = self._top_sums(self.top_neg_hi, k, group)
        else:
            top_lo = top_neg_hi = torch.zeros_like(sum_lo)
        lower = (sum_lo - top_lo - kf * self.gamma) / b
        upper = (sum_hi + top_neg_hi + kf * self.gamma) / b
        # float64 rounding of the sums (|values| <= gamma), the nominal mean (accumulated in
        # float64, rounded once to the training dtype) and per-product underflow.
        n_terms = b + self.k_max + 8
        w = (2.0 * gamma_n(n_terms, _U64) * n_terms / b + 2.0 * fm.unit_roundoff
             + 8 * _U64 + _sum_slack(fm)) * self.gamma + 2.0 * fm.absolute(1)
        lower = (lower - w).clamp_min(-self.gamma)
        upper = (upper + w).clamp_max(self.gamma)
        return Interval(lower, upper)

    def _top_sums(self, buffer: torch.Tensor, k: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """Sum of the k[m] largest buffered values of group[m], per parameter: (M, P)."""
        out = torch.zeros(k.shape[0], buffer.shape[1], dtype=BOUND_DTYPE, device=buffer.device)
        chunk = max(1, (1 << 21) // max(1, self.k_max))
        for g in torch.unique(group).tolist():
            members = (group == g).nonzero().flatten()
            ks = k[members]
            idx = (ks - 1).clamp_min(0)
            full = bool((ks == self.k_max).all())
            for p0 in range(0, buffer.shape[1], chunk):
                part = buffer[g, p0:p0 + chunk]
                part = torch.where(torch.isinf(part), torch.zeros_like(part), part)
                if full:
                    out[members, p0:p0 + chunk] = part.to(BOUND_DTYPE).sum(-1)
                    continue
                part = part.sort(dim=-1, descending=True).values
                csum = torch.cumsum(part.to(BOUND_DTYPE), dim=-1)            # (p, k_max)
                picked = csum[:, idx].T                                     # (m, p)
                out[members, p0:p0 + chunk] = torch.where((ks > 0)[:, None], picked,
                                                          torch.zeros_like(picked))
        return out


class ThresholdAccumulator:
    """The descent bound of Thm 4.6 through its variational form, without selections.

    For any threshold tau (Ogryczak-Tamir; sum of the k largest = min over tau of
    k tau + sum_i (g_i - tau)_+):

        sum of the smallest (b - k) of g  >=  sum_i min(g_i, tau)  - k tau
        sum of the largest  (b - k) of g  <=  sum_i max(g_i, tau') - k tau'

    with equality when tau (tau') is the k-th largest (smallest) value. Soundness holds for
    every tau, so the thresholds can come from a cheap source: the order statistics of the
    *nominal* clamped per-sample gradients (which lie inside every box's gradient bounds),
    giving bounds that are exact at zero-width boxes and nearly exact for the narrow boxes
    where certification succeeds. Cost: one clamp and one sum per bound and element,
    no top-k buffers.

    ``tau_lo``/``tau_hi``: (M, P) thresholds, ``k``: (M,) distances; grads of (M or 1) boxes.
    """

    def __init__(self, k: torch.Tensor, tau_lo: torch.Tensor, tau_hi: torch.Tensor, gamma: float):
        self.gamma = float(gamma)
        self.k = k
        self.count = 0
        self.tau_lo = tau_lo.clamp(-self.gamma, self.gamma)
        self.tau_hi = tau_hi.clamp(-self.gamma, self.gamma)
        self.sum_lo = torch.zeros(tau_lo.shape, dtype=BOUND_DTYPE, device=tau_lo.device)
        self.sum_hi = torch.zeros_like(self.sum_lo)
        self.k_max = int(k.max()) if k.numel() else 0

    def add(self, start: int, stop: int, grads: Interval) -> None:
        dtype = grads.lo.dtype
        t_lo = self.tau_lo[:, start:stop, None].to(dtype)
        t_hi = self.tau_hi[:, start:stop, None].to(dtype)
        lo = torch.clamp(grads.lo, min=torch.full_like(t_lo, -self.gamma), max=t_lo)
        hi = torch.clamp(grads.hi, min=t_hi, max=torch.full_like(t_hi, self.gamma))
        self.sum_lo[:, start:stop] += blocked_sum(lo)
        self.sum_hi[:, start:stop] += blocked_sum(hi)

    def samples_seen(self, n: int) -> None:
        self.count += n

    def bounds(self, fm: FloatModel) -> Interval:
        b = self.count
        kf = self.k.to(BOUND_DTYPE)[:, None].to(self.sum_lo.device)
        # tau was cast to the compute dtype for the clamp: use that value here too
        t_lo = self.tau_lo.to(fm.nominal_dtype).to(BOUND_DTYPE)
        t_hi = self.tau_hi.to(fm.nominal_dtype).to(BOUND_DTYPE)
        lower = (self.sum_lo - kf * t_lo - kf * self.gamma) / b
        upper = (self.sum_hi - kf * t_hi + kf * self.gamma) / b
        n_terms = b + 2 * self.k_max + 8
        w = (2.0 * gamma_n(n_terms, _U64) * n_terms / b + 2.0 * fm.unit_roundoff
             + 8 * _U64 + _sum_slack(fm)) * self.gamma + 2.0 * fm.absolute(1)
        return Interval((lower - w).clamp_min(-self.gamma), (upper + w).clamp_max(self.gamma))


def order_statistics(acc: DescentAccumulator, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From an accumulator fed with point values g: per k, the k-th largest (tau_lo) and the
    k-th smallest (tau_hi) value per parameter; +gamma / -gamma for k = 0 (no threshold)."""
    device = acc.sum_lo.device
    P = acc.sum_lo.shape[1]
    k = k.to(device)
    tau_lo = torch.full((k.shape[0], P), acc.gamma, dtype=BOUND_DTYPE, device=device)
    tau_hi = torch.full_like(tau_lo, -acc.gamma)
    if acc.k_max == 0:
        return tau_lo, tau_hi
    ks = k.tolist()
    for buf, out, sign in ((acc.top_lo[0], tau_lo, 1.0), (acc.top_neg_hi[0], tau_hi, -1.0)):
        few = len(set(ks)) <= 8
        srt = None if few else buf.sort(dim=-1, descending=True).values.to(BOUND_DTYPE)
        for m, kk in enumerate(ks):
            if kk > 0:
                if few:   # the kk-th largest = the (k_max - kk + 1)-th smallest
                    col = buf.kthvalue(acc.k_max - kk + 1, dim=-1).values.to(BOUND_DTYPE)
                else:
                    col = srt[:, kk - 1]
                # fewer than k samples seen (-inf padding): every value is below tau
                col = torch.where(torch.isinf(col), torch.full_like(col, -acc.gamma), col)
                out[m] = sign * col
    return tau_lo, tau_hi
