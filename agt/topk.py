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
O(P b). The buffers are float32 with values rounded *up* (monotone rounding keeps the
top-k set), which can only over-estimate the subtracted top-k sums: the bounds get looser
by at most one float32 ulp per buffered value, never wrong. The prefix sums of the sorted
buffer give the bound for every k <= k_max at once.
"""

from __future__ import annotations

import torch

from agt.interval import BOUND_DTYPE, FloatModel, Interval, gamma as gamma_n

_U64 = 2.0**-53


def round_up_f32(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float32, rounded toward +inf."""
    y = x.to(torch.float32)
    below = y.to(BOUND_DTYPE) < x
    if bool(below.any()):
        y = torch.where(below, torch.nextafter(y, torch.full_like(y, float("inf"))), y)
    return y


class DescentAccumulator:
    """Running sums and top-k buffers of clamped per-sample gradient bounds of one parameter
    (flattened to P entries) for G parameter boxes at once."""

    def __init__(self, n_groups: int, n_params: int, k_max: int, gamma: float,
                 device: torch.device):
        self.gamma = float(gamma)
        self.k_max = int(k_max)
        self.count = 0
        self.sum_lo = torch.zeros(n_groups, n_params, dtype=BOUND_DTYPE, device=device)
        self.sum_hi = torch.zeros_like(self.sum_lo)
        if self.k_max > 0:
            shape = (n_groups, n_params, self.k_max)
            self.top_lo = torch.full(shape, -float("inf"), dtype=torch.float32, device=device)
            self.top_neg_hi = torch.full_like(self.top_lo, -float("inf"))

    def add(self, start: int, stop: int, grads: Interval) -> None:
        """grads: Interval (G or 1, f, stop - start) of per-sample gradient bounds of the
        parameter entries [start, stop) for f samples; clamped here."""
        lo = grads.lo.clamp(-self.gamma, self.gamma)
        hi = grads.hi.clamp(-self.gamma, self.gamma)
        self.sum_lo[:, start:stop] += lo.sum(1)
        self.sum_hi[:, start:stop] += hi.sum(1)
        if self.k_max > 0:
            self.top_lo[:, start:stop] = self._merge(self.top_lo[:, start:stop], lo)
            self.top_neg_hi[:, start:stop] = self._merge(self.top_neg_hi[:, start:stop], -hi)

    def _merge(self, buffer: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        vals = round_up_f32(values).transpose(1, 2)                      # (G, n, f)
        if vals.shape[0] != buffer.shape[0]:
            vals = vals.expand(buffer.shape[0], -1, -1)
        if vals.shape[-1] > self.k_max:
            vals = vals.topk(self.k_max, dim=-1).values
        merged = torch.cat([buffer, vals], dim=-1)
        return merged.topk(self.k_max, dim=-1).values

    def samples_seen(self, n: int) -> None:
        self.count += n

    def bounds(self, k: torch.Tensor, fm: FloatModel, group: torch.Tensor | None = None) -> Interval:
        """Descent-direction bounds for distances ``k`` (int tensor (M,)), each computed from
        group ``group[m]`` of this accumulator (default: group m). Returns Interval (M, P)."""
        b = self.count
        if group is None:
            group = torch.arange(k.shape[0], device=k.device)
        k = k.to(self.sum_lo.device)
        group = group.to(self.sum_lo.device)
        sum_lo = self.sum_lo[group]
        sum_hi = self.sum_hi[group]
        kf = k.to(BOUND_DTYPE)[:, None]
        if self.k_max > 0:
            top_lo = self._prefix(self.top_lo[group], k)
            top_neg_hi = self._prefix(self.top_neg_hi[group], k)
        else:
            top_lo = top_neg_hi = torch.zeros_like(sum_lo)
        lower = (sum_lo - top_lo - kf * self.gamma) / b
        upper = (sum_hi + top_neg_hi + kf * self.gamma) / b
        # float64 rounding of the sums (|values| <= gamma) and of the nominal mean, which is
        # accumulated in float64 and rounded once to the training dtype.
        n_terms = b + self.k_max + 8
        w = (2.0 * gamma_n(n_terms, _U64) * n_terms / b + 2.0 * fm.unit_roundoff
             + 8 * _U64) * self.gamma + fm.absolute(1)
        lower = (lower - w).clamp_min(-self.gamma)
        upper = (upper + w).clamp_max(self.gamma)
        return Interval(lower, upper)

    def _prefix(self, buffer: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Sum of the k largest buffered values per row (k may differ per group row)."""
        vals = torch.where(torch.isinf(buffer), torch.zeros_like(buffer), buffer).to(BOUND_DTYPE)
        csum = torch.cumsum(vals, dim=-1)                                  # (M, P, k_max)
        idx = (k - 1).clamp_min(0)[:, None, None].expand(-1, csum.shape[1], 1)
        picked = torch.gather(csum, -1, idx).squeeze(-1)
        return torch.where((k > 0)[:, None], picked, torch.zeros_like(picked))
