"""One update of the k-boxes through one batch, under either placement of the replaced records.

Per-batch placement (the paper): every batch may hold up to k replaced records, so the
k-box after the update is the optimizer's interval update (agt/optim.py) of the k-box with
the interval pass's descent bound for k (agt/bound_pass.py). Per-epoch placement: the
update Step_b of the dynamic programme of agt/placement.py, evaluated here for the
programme's boxes. Under both, the new boxes are cut to the public bounds of the step
after the update (agt/overflow.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agt.bound_pass import IntervalPass
from agt.interval import BOUND_DTYPE, FloatModel, Interval, nested_along_first
from agt.optim import PublicMagnitudes, UpdateRule
from agt.overflow import cut_to_public
from agt.placement import EpochBudgetBoxes, StepEvaluator
from agt.topk import clamp_limit, nesting_allowance


@dataclass(frozen=True)
class BoxUpdate:
    """The k-box updates of one run.

    ``rule``: the update rule; ``passes``: the interval pass; ``trainable``: the trainable
    parameters' names; ``gamma``: the clamp; ``fm``: the rounding model of the training
    dtype."""
    rule: UpdateRule
    passes: IntervalPass
    trainable: tuple[str, ...]
    gamma: float
    fm: FloatModel

    def per_batch(self, boxes: dict[str, Interval], velocity: dict[str, Interval | None],
                  k_values: torch.Tensor, idx: torch.Tensor, lr: float, first_step: bool,
                  stats, public: PublicMagnitudes, after: int,
                  marked: torch.Tensor | None = None):
        """The k-boxes after the update on batch ``idx`` under per-batch placement.

        Args:
            boxes: name -> box (K, ...) of every trainable parameter, one per k.
            velocity: name -> momentum box (K, ...), or None (plain sgd, first step).
            k_values: the distances (K,), int64.
            idx: the batch's record indices.
            lr: the step's rounded learning rate.
            first_step: the run's first update (all boxes the same point).
            stats: the threshold rule's nominal buffers, or None (`descent_bounds`).
            public: the public bounds of every step (agt/overflow.py).
            after: the step whose public bounds cut the new boxes.
            marked: the records that could overflow, or None.

        Returns:
            The new parameter boxes and momentum boxes (None entries without momentum),
            nested in k and cut to the public bounds."""
        d_boxes = self.passes.descent_bounds(boxes, k_values, idx, shared=first_step,
                                             stats=stats, marked=marked)
        new_boxes, new_v = {}, {}
        for n in self.trainable:
            new_boxes[n], new_v[n] = self.rule.bounds(boxes[n], velocity[n], d_boxes[n],
                                                      lr, first_step, self.fm)
        boxes = {n: cut_to_public(nested_in_k(b), public.params[after][n])
                 for n, b in new_boxes.items()}
        velocity = {n: (cut_to_public(nested_in_k(v), public.velocity[after][n])
                        if v is not None else None) for n, v in new_v.items()}
        return boxes, velocity

    def per_epoch_evaluator(self, idx: torch.Tensor, lr: float, first_step: bool,
                            public: PublicMagnitudes, after: int,
                            marked: torch.Tensor | None = None) -> StepEvaluator:
        """Step_b of agt/placement.py on batch ``idx``: for boxes (G, ...) and pairs
        (c[l], group[l]) the update bounds from box group[l] with up to c[l] of the batch's
        records replaced (the exact top-k rule: one selection buffer per box), the descent
        bound widened by the transition slack 2 w_cap units[l] of that module, and cut to
        the public bounds of step ``after`` (`cut_to_public`).

        Args:
            idx: the batch's record indices.
            lr: the step's rounded learning rate.
            first_step: the run's first update.
            public: the public bounds of every step.
            after: the step whose public bounds cut the new boxes.
            marked: the records that could overflow, or None.

        Returns:
            The evaluator `EpochBudgetBoxes.step` calls."""
        gam = clamp_limit(self.gamma, self.fm.nominal_dtype, self.passes.dtype)
        device = self.passes.device

        def evaluate(theta, velocity, c, group, buffers, cap, units, grades):
            d = self.passes.exact_pass(theta, c, idx, group, buffers, grade=grades.to(device),
                                       marked=marked)
            w = float(nesting_allowance(len(idx), torch.tensor([cap]), gam, self.fm)[0])
            slack = (2.0 * w * units.to(BOUND_DTYPE)).to(device)
            out_theta, out_v = {}, {}
            for n in self.trainable:
                extra = slack.view(-1, *([1] * (d[n].lo.dim() - 1)))
                d[n] = Interval((d[n].lo - extra).clamp_min(-gam), (d[n].hi + extra).clamp_max(gam))
                th = theta[n].map(lambda t: t[group])
                v = None if velocity is None else velocity[n].map(lambda t: t[group])
                out_theta[n], out_v[n] = self.rule.bounds(th, v, d[n], lr, first_step, self.fm)
                out_theta[n] = cut_to_public(out_theta[n], public.params[after][n])
                if out_v[n] is not None:
                    out_v[n] = cut_to_public(out_v[n], public.velocity[after][n])
            has_v = any(v is not None for v in out_v.values())
            return out_theta, (out_v if has_v else None)
        return evaluate


def budget_hulls(budget: EpochBudgetBoxes):
    """The placement programme's k-boxes (and momentum boxes), nested in k as the
    per-batch boxes are after every step.

    Args:
        budget: the programme.

    Returns:
        name -> box (K, ...) of every parameter, and name -> momentum box or None."""
    theta, velocity = budget.boxes()
    return ({n: nested_in_k(b) for n, b in theta.items()},
            {n: (nested_in_k(velocity[n]) if velocity is not None else None) for n in theta})


def nested_in_k(box: Interval) -> Interval:
    """Make boxes nested in k (box(k) inside box(k+1)): a sound widening, exact in exact
    arithmetic where the top-k rule is already monotone; removes rounding artefacts."""
    return nested_along_first(box)
