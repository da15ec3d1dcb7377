"""Overflow guards of a training run.

The bounds model rounding, not overflow. Bounds on the nominal run's parameters and
velocities at every step hold for every dataset, from the config alone
(`UpdateRule.public_magnitudes`: the nominal mean is clamped to gamma, agt/nominal.py).
Training refuses when they, or the gradient of a record of zeros under them, could come
near max(dtype) (`OverflowGuard.public_bounds`): a refusal that reads no record, so D and
its neighbours refuse alike. A record whose own gradient could overflow under them is
marked at that step (`OverflowGuard.marked_records`) and bounded by the whole clamp range
(agt/bound_pass.py), which holds whatever the overflow does; the boxes are cut to the
public bounds after every update (`cut_to_public`), which keeps the float64 bound
arithmetic far from overflow however loose they grow.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agt.bounded.network import Network
from agt.errors import DataError
from agt.interval import Interval
from agt.optim import PublicMagnitudes, UpdateRule, round_to
from agt.tensors import overflow_limit


@dataclass(frozen=True)
class OverflowGuard:
    """The overflow checks of one run.

    ``rule``: the update rule; ``net``: the trainable part; ``theta0``: its initial
    parameters (name -> tensor); ``gamma``: the clamp; ``dtype``: the training dtype;
    ``input_shape``: one record's input to the trainable part; ``record_magnitudes`` (n,):
    per record a bound on its input entries (`agt.features.TrainingRecords.magnitudes`)."""
    rule: UpdateRule
    net: Network
    theta0: dict[str, torch.Tensor]
    gamma: float
    dtype: torch.dtype
    input_shape: tuple[int, ...]
    record_magnitudes: torch.Tensor

    def public_bounds(self, lrs: list[float]) -> PublicMagnitudes:
        """Bounds on the nominal run's parameters at every step, from the config alone
        (`UpdateRule.public_magnitudes`), and the refusal they decide: training refuses
        when an intermediate of some update, or of the gradient of a record of zeros, could
        come near the dtype's largest value. Nothing here reads a record, so D and every
        neighbour refuse or train alike (records that could overflow are `marked_records`'
        business).

        Args:
            lrs: the rounded learning rate of every step.

        Returns:
            The public bounds of every step (``params[t]`` before update t).

        Raises:
            DataError: the run could overflow whatever the data, or a learning rate times
                the optimizer's constants underflows float64."""
        # the nominal mean is clamped to gamma as the dtype holds it (agt/nominal.py)
        d_max = round_to(self.gamma, self.dtype)
        start = {n: float(t.abs().max()) if t.numel() else 0.0 for n, t in self.theta0.items()}
        public = self.rule.public_magnitudes(start, lrs, d_max, self.dtype)
        for t, lr in enumerate(lrs):
            if not self.rule.check_coefficients(lr, t == 0):
                raise DataError(f"the learning rate at step {t} ({lr:.3g}) times the "
                                "optimizer's constants underflows float64, which the interval "
                                "update does not model: raise learning_rate or lr_min")
        limit = overflow_limit(self.dtype)
        dtype_name = str(self.dtype).removeprefix("torch.")
        for t, worst_update in enumerate(public.worst):
            worst = max(float(self.net.gradient_magnitudes(public.params[t], 0.0,
                                                           self.input_shape)),
                        worst_update)
            if not worst <= limit:
                raise DataError(f"the {dtype_name} training computation could overflow "
                                f"(at step {t}, an intermediate of magnitude up to {worst:.3g} "
                                f"whatever the data; the bounds hold below {limit:.3g}): lower "
                                "the learning rate, clip_gamma or the number of steps, or "
                                "train in float64")
        return public

    def marked_records(self, params: dict[str, float]) -> torch.Tensor | None:
        """Records whose nominal per-sample gradient could overflow the dtype for some
        parameters with |theta| <= ``params`` (`Network.gradient_magnitudes` from their
        input bound): the bound pass gives them the whole clamp range, which holds whatever
        the overflow does (the nominal rule sends +-inf to +-gamma and counts a NaN as 0,
        agt/nominal.py). The test reads the record and public bounds only, so a record kept
        by a neighbour is marked in both runs.

        Args:
            params: a bound on every entry of each trainable parameter (one step's
                `PublicMagnitudes.params`).

        Returns:
            A boolean mask (n,) of the marked records, or None when none is."""
        limit = overflow_limit(self.dtype)
        worst = self.net.gradient_magnitudes(params, self.record_magnitudes, self.input_shape)
        marked = ~(worst <= limit)
        return marked if bool(marked.any()) else None


def cut_to_public(box: Interval, bound: float) -> Interval:
    """``box`` cut to [-bound, bound], a bound that every run's value satisfies
    (`UpdateRule.public_magnitudes`): still sound, exact (a clamp), and the same cut for D
    and every neighbour, so computed boxes that nest still nest. It keeps the float64 bound
    arithmetic of later steps far from overflow however loose the boxes grow.

    Args:
        box: a box (K, ...) of one parameter or velocity.
        bound: that tensor's public bound at the same step.

    Returns:
        The cut box."""
    return Interval(box.lo.clamp(-bound, bound), box.hi.clamp(-bound, bound))
