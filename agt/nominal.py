"""The nominal descent direction: the clamped mean of the per-sample gradients of a batch.

The rule (what the bundle's nominal parameters are; anyone can re-run it): per-sample
gradients of the loss (agt/bounded; with config ``clip_norm`` C, bound method stability
only, of each record's clipped loss, whose gradient has L2 norm <= C: agt/stability.py),
clamped elementwise to [-gamma, gamma], summed in float64 and divided by the batch size,
rounded once to the training dtype and clamped to [-gamma, gamma] again (the float64 mean
of values in [-gamma, gamma] can exceed gamma by an ulp). Under stability with
``k_boxes: ball`` the logits and per-sample gradients are computed in float64, from the
dtype parameters and records (the compute dtype below). The update that applies the
direction is agt/optim.py's; the batches and learning rates are agt/training.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agt import memory
from agt.bounded.network import Network
from agt.interval import Interval
from agt.topk import DescentAccumulator


@dataclass(frozen=True)
class NominalGradient:
    """The nominal rule's direction on batches of a fixed set of records.

    ``net``: the trainable part; ``x`` (n, ...): the records' inputs to it in
    ``compute_dtype`` (the training dtype, or float64, module docstring); ``y`` (n,): the
    labels; ``loss``: the config's loss; ``gamma``: the clamp; ``dtype``: the training
    dtype; ``fragment_size``: records per per-sample pass; ``clip_floor`` (n,) or None: the
    per-record floors of the clipped loss (`StabilityProblem.clip_floors`); ``device``: the
    training device."""
    net: Network
    x: torch.Tensor
    y: torch.Tensor
    loss: str
    gamma: float
    dtype: torch.dtype
    compute_dtype: torch.dtype
    fragment_size: int
    clip_floor: torch.Tensor | None
    device: torch.device

    def direction(self, theta: dict[str, torch.Tensor], idx: torch.Tensor, k_max: int = 0):
        """Nominal clamped mean gradient on the records ``idx``; with ``k_max`` also the
        streamed top-k_max buffers of the nominal per-sample gradients (thresholds for
        selection=threshold, agt/bound_pass.py).

        Args:
            theta: the trainable parameters (name -> tensor, training dtype).
            idx: the batch's record indices.
            k_max: the largest k of the grid under selection=threshold, else 0.

        Returns:
            The direction (name -> tensor of theta's shape, training dtype) and the
            buffers (name -> `DescentAccumulator`, None when ``k_max`` is 0)."""
        sums = {n: torch.zeros(t.numel(), dtype=torch.float64, device=self.device)
                for n, t in theta.items()}
        theta_c = {n: t.to(self.compute_dtype) for n, t in theta.items()}
        frag = self.fragment_size
        # Thresholds only need to be good, not exact (any threshold is sound): take the order
        # statistics of the first fragment (the batch is a random permutation), at ranks
        # scaled to the fragment, so this costs one selection over one fragment.
        first = min(frag, len(idx))
        # at most the fragment: a k >= n (batch_size full) must not size a buffer by k
        k_frag = min(first, math.ceil(k_max * first / len(idx))) if k_max else 0
        stats = ({n: DescentAccumulator(1, t.numel(), k_frag, self.gamma, self.device,
                                        self.dtype) for n, t in theta.items()}
                 if k_max else None)
        for f0 in range(0, len(idx), frag):
            fidx = idx[f0:f0 + frag]
            floor = None if self.clip_floor is None else self.clip_floor[fidx]
            sources = self.net.grads_nominal(theta_c, self.x[fidx], self.y[fidx], self.loss,
                                             clip_floor=floor)
            for name, src in sources.items():
                for r0, r1 in memory.row_chunks(src, len(fidx), 1):
                    # a record far outside the data can overflow the logits (softmax of an
                    # infinite logit is NaN): the clamp sends +-inf to +-gamma and a NaN
                    # counts as 0, so every record's clamped gradient lies in [-gamma, gamma]
                    # as the bounds assume (finite gradients are unchanged)
                    g = src.fn(r0, r1).clamp(-self.gamma, self.gamma).nan_to_num_(nan=0.0)
                    sums[name][r0 * src.row_size:r1 * src.row_size] += g.to(torch.float64).sum(0)
                    if stats is not None and f0 == 0:
                        gt = g.T.unsqueeze(0)
                        stats[name].add(r0 * src.row_size, r1 * src.row_size, Interval(gt, gt))
            if stats is not None and f0 == 0:
                for acc in stats.values():
                    acc.samples_seen(len(fidx))
        b = len(idx)
        # the mean of values in [-gamma, gamma] lies there too, but its float64 rounding
        # can exceed gamma by an ulp (0.1 three times); clamped in the dtype, as the bounds'
        # final clamp and `UpdateRule.public_magnitudes` assume
        return ({n: (s / b).to(self.dtype).clamp(-self.gamma, self.gamma).reshape(theta[n].shape)
                 for n, s in sums.items()}, stats)
