"""The interval pass: bounds on the clamped mean gradient of a batch over boxes of parameters.

For boxes of the trainable parameters and distances k, the pass bounds the nominal rule's
direction (agt/nominal.py) on every batch that differs from the given one in at most k
records (the AGT paper, Thm 4.6): per-sample gradient bounds over each box (agt/bounded),
clamped and combined by the exact top-k rule or, under ``selection: threshold``, by its
variational form with thresholds from the nominal gradients (agt/topk.py). The boxes of a
group of k values are stacked and bounded in one vectorised pass, the groups sized to the
memory budgets (agt/memory.py); records marked as could-overflow (agt/overflow.py) get the
whole clamp range.
"""

from __future__ import annotations

import math

import torch

from agt import memory
from agt.bounded.network import Network
from agt.features import TrainingRecords
from agt.interval import FloatModel, Interval
from agt.models import infer_shapes
from agt.topk import DescentAccumulator, ThresholdAccumulator, order_statistics


class IntervalPass:
    """The interval pass over the batches of one set of training records.

    Args:
        net: the trainable part of the model.
        records: the training records (`TrainingRecords`).
        loss: the config's loss.
        gamma: the clamp of the per-sample gradients.
        fm: the rounding model of the training dtype (ungraded).
        param_shapes: name -> shape of every trainable parameter, in the network's order.
        fragment_size: records per per-sample pass.
        device: the training device.
    """

    def __init__(self, net: Network, records: TrainingRecords, loss: str, gamma: float,
                 fm: FloatModel, param_shapes: dict[str, torch.Size], fragment_size: int,
                 device: torch.device):
        self.net = net
        self.records = records
        self.loss = loss
        self.gamma = gamma
        self.fm = fm
        self.dtype = fm.nominal_dtype
        self.param_shapes = dict(param_shapes)
        self.fragment_size = fragment_size
        self.device = device
        self.footprint = memory.footprint_of(infer_shapes(net.layers, records.input_shape),
                                             list(self.param_shapes.values()), self.dtype)

    def descent_bounds(self, boxes: dict[str, Interval], k_values: torch.Tensor,
                       idx: torch.Tensor, shared: bool, stats=None,
                       marked: torch.Tensor | None = None) -> dict[str, Interval]:
        """Interval of the clamped mean gradient for every box (K, ...), batch ``idx``.

        ``shared``: all K boxes are identical; under the threshold rule one interval pass
        serves every k. The exact rule grades each box's pass by its k (agt/interval.py:
        computed boxes of neighbours nest without an assumption on the kernels), so it
        runs one pass per k also on the first step.

        Args:
            boxes: name -> box (K, ...) of every trainable parameter, one per k.
            k_values: the distances (K,), int64.
            idx: the batch's record indices.
            shared: all K boxes are the same.
            stats: the nominal top-k buffers of `NominalGradient.direction` for the
                threshold rule (selection: threshold), or None for the exact rule.
            marked: the records that could overflow (`OverflowGuard.marked_records`).

        Returns:
            name -> Interval (K, ...) of the direction, one per k."""
        K = k_values.shape[0]
        if stats is not None:
            first = next(iter(stats.values()))
            scale = first.count / len(idx)
            # ranks beyond the buffered fragment (k >= n under batch_size full) take its last:
            # any threshold is sound
            k_frag = torch.where(k_values > 0, torch.ceil(k_values * scale).long().clamp_min(1),
                                 k_values).clamp_max(first.k_max)
            taus = {n: order_statistics(acc, k_frag) for n, acc in stats.items()}

            def bound_pass(sub_boxes, g0, g1):
                sub_taus = {n: (t[0][g0:g1], t[1][g0:g1]) for n, t in taus.items()}
                return self.threshold_pass(sub_boxes, k_values[g0:g1], idx, sub_taus, marked)
        else:
            def bound_pass(sub_boxes, g0, g1):
                ks = k_values[g0:g1]
                return self.exact_pass(sub_boxes, ks, idx, None, ks.tolist(), grade=ks,
                                       marked=marked)
        if shared and stats is not None:
            return bound_pass({n: box[:1] for n, box in boxes.items()}, 0, K)
        parts = [bound_pass({n: box[g0:g1] for n, box in boxes.items()}, g0, g1)
                 for g0, g1 in memory.k_groups(k_values, len(idx), self.fragment_size,
                                               self.footprint, buffers=stats is None)]
        return {n: Interval(torch.cat([p[n].lo for p in parts]),
                            torch.cat([p[n].hi for p in parts]))
                for n in boxes}

    def boxes_per_pass(self, k_values: tuple[int, ...], batch_size: int) -> int:
        """How many boxes one pass of the placement programme may hold
        (`agt.memory.boxes_per_pass`).

        Args:
            k_values: the k grid.
            batch_size: the size of every batch but the last.

        Returns:
            The number of boxes, at least 1."""
        return memory.boxes_per_pass(k_values, batch_size, self.fragment_size, self.footprint)

    def threshold_pass(self, boxes, k_values, idx, taus, marked=None):
        """Threshold rule for M = len(k_values) distances over G boxes (G = M, or G = 1
        shared by all); ``taus``: name -> (tau_lo, tau_hi) (M, P) (`order_statistics`)."""
        accs = {n: ThresholdAccumulator(k_values, taus[n][0], taus[n][1], self.gamma)
                for n in self.param_shapes}
        self._stream(boxes, idx, accs, k_values.shape[0], self.fm, marked)
        return {n: self._reshape(n, acc.bounds(self.fm)) for n, acc in accs.items()}

    def exact_pass(self, boxes, k_values, idx, group_index, k_buffers, grade=None, marked=None):
        """Exact top-k rule for the distances ``k_values`` of G boxes.

        Args:
            boxes: name -> box (G, ...).
            k_values: the distances (L,).
            idx: the batch's record indices.
            group_index: the box of each distance (L,), or None: one box each (L = G).
            k_buffers: the top-k buffer size of each box (G).
            grade: the grade of each box's interval pass (G,) (agt/interval.py), or None.
            marked: the records that could overflow, or None.

        Returns:
            name -> Interval (L, ...) of the direction, one per distance."""
        G = next(iter(boxes.values())).shape[0]
        # a buffer never needs more slots than the batch has records: k >= b (batch_size
        # full, k up to 10^9) selects them all (DescentAccumulator.bounds)
        k_buffers = [min(int(k), len(idx)) for k in k_buffers]
        accs = {n: DescentAccumulator(G, shape.numel(), k_buffers, self.gamma, self.device,
                                      self.dtype)
                for n, shape in self.param_shapes.items()}
        fm = self.fm if grade is None else self.fm.graded(grade)
        self._stream(boxes, idx, accs, G, fm, marked)
        return {n: self._reshape(n, acc.bounds(k_values, self.fm, group_index))
                for n, acc in accs.items()}

    def _stream(self, boxes, idx, accs, n_groups: int, fm: FloatModel,
                marked: torch.Tensor | None) -> None:
        """Feed the per-sample gradient bounds of batch ``idx`` to the accumulators,
        fragment by fragment and in parameter-row chunks sized to the memory budget."""
        frag = self.fragment_size
        for f0 in range(0, len(idx), frag):
            fidx = idx[f0:f0 + frag]
            beyond = None if marked is None else marked[fidx]
            if beyond is not None and not bool(beyond.any()):
                beyond = None
            sources = self.net.grads_bounds(boxes, self.records.bound_inputs(fidx, beyond),
                                            self.records.y[fidx], self.loss, fm)
            for name, src in sources.items():
                acc = accs[name]
                if beyond is None and src.outer is not None and acc.takes_outer(src.outer):
                    acc.add_outer(src.outer)   # computed where merged: no per-sample bounds
                    continue
                for r0, r1 in memory.row_chunks(src, len(fidx), n_groups):
                    grads = src.samples_last(r0, r1)
                    if beyond is not None:
                        # the accumulators clamp these to the clamp range
                        grads = Interval(grads.lo.masked_fill(beyond, -math.inf),
                                         grads.hi.masked_fill(beyond, math.inf))
                    acc.add(r0 * src.row_size, r1 * src.row_size, grads)
            for acc in accs.values():
                acc.samples_seen(len(fidx))

    def _reshape(self, name: str, flat: Interval) -> Interval:
        shape = self.param_shapes[name]
        return flat.map(lambda t: t.reshape(t.shape[0], *shape))
