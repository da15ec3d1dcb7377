"""The exact top-k rule in its first form (torch.topk merges, a cat per fragment,
one buffer of the group's largest k for every box): kept as a test oracle for agt/topk.py
(only its rounding allowance follows the package's: per k). Not used by the
package."""

from __future__ import annotations

import torch

from agt.interval import BOUND_DTYPE, FloatModel, Interval
from agt.interval import gamma as gamma_n
from agt.topk import _sum_slack, blocked_sum

_U64 = 2.0**-53


class ReferenceDescentAccumulator:
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

    def takes_outer(self, outer) -> bool:
        """Never: this reference takes every bound as a value (`add`)."""
        return False

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

    def bounds(self, k: torch.Tensor, fm: FloatModel,
               group: torch.Tensor | None = None) -> Interval:
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
        # float64, rounded once to the training dtype) and per-product underflow, for the
        # worst batch size within distance k (b - k .. b + k records: add-remove)
        w = torch.tensor([[(2.0 * gamma_n(b + 2 * kk + 8, _U64)
                            * (b + 2 * kk + 8) / max(1, b - kk)
                            + 2.0 * fm.unit_roundoff + 8 * _U64 + _sum_slack(fm)) * self.gamma
                           + 2.0 * fm.absolute(1)] for kk in k.tolist()],
                         dtype=BOUND_DTYPE, device=device)
        # plus 2 k w: the computed boxes nest as the real-number ones (agt/topk.py)
        lower = (lower - w * (1.0 + 2.0 * kf)).clamp_min(-self.gamma)
        upper = (upper + w * (1.0 + 2.0 * kf)).clamp_max(self.gamma)
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
