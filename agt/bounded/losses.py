"""Per-sample loss gradients with respect to the logits: nominal and interval bounds.

binary_cross_entropy (one logit z, label y in {0,1}): dL/dz = sigmoid(z) - y, monotone in z,
so [sigmoid(z_L) - y, sigmoid(z_U) - y] (paper App. B).

cross_entropy (C >= 2 logits, label y): dL/dz = softmax(z) - onehot(y). Over a logit box,
softmax_j is increasing in z_j and decreasing in every z_i, i != j, so

    softmax_j in [ e^{zL_j} / (e^{zL_j} + sum_{i!=j} e^{zU_i}),
                   e^{zU_j} / (e^{zU_j} + sum_{i!=j} e^{zL_i}) ].

Rounding: these use the transcendental functions exp/sigmoid/softmax, whose accuracy
PyTorch does not document. We assume each is accurate to within 16 units in the last place
relative to a value in [0, 1] (PyTorch's CPU and CUDA kernels are within a few ulps) and
widen by that absolute amount for both the nominal dtype and float64. This is the one
documented floating-point assumption of the engine.
"""

from __future__ import annotations

import torch

from agt.errors import ConfigError
from agt.interval import BOUND_DTYPE, GRADE_FACTOR, FloatModel, Interval

_TRANSCENDENTAL_ULPS = 16


def transcendental_slack(fm: FloatModel, n_classes: int, nominal: bool = True) -> float:
    """Absolute error allowed for a nominal (or float64) softmax/sigmoid output in [0, 1];
    ``nominal=False``: the float64 evaluation's share alone (what grading multiplies)."""
    u64 = 2.0**-53
    per_op = _TRANSCENDENTAL_ULPS * ((fm.unit_roundoff if nominal else 0.0) + u64)
    return (n_classes + 4) * 2.0 * per_op


def check_logits(loss: str, n_logits: int) -> None:
    if loss == "binary_cross_entropy" and n_logits != 1:
        raise ConfigError(f"loss binary_cross_entropy needs a model with 1 output logit, "
                          f"this model has {n_logits}; use cross_entropy or out: 1")
    if loss == "cross_entropy" and n_logits < 2:
        raise ConfigError("loss cross_entropy needs a model with >= 2 output logits; use "
                          "binary_cross_entropy for a single logit")


def loss_grad_nominal(loss: str, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Nominal per-sample dL/dz in the logits' dtype. z: (b, C), y: (b,) int64."""
    if loss == "binary_cross_entropy":
        return torch.sigmoid(z) - y.to(z.dtype)[:, None]
    onehot = torch.nn.functional.one_hot(y, z.shape[-1]).to(z.dtype)
    return torch.softmax(z, dim=-1) - onehot


def clipped_loss_grad_nominal(loss: str, z: torch.Tensor, y: torch.Tensor,
                              floor: torch.Tensor) -> torch.Tensor:
    """Nominal per-sample gradient of the clipped loss psi_a (agt/stability.py, config
    ``clip_norm``) in the logits' dtype; ``floor`` (b,) float64 holds each record's a in
    (0, 1]. binary_cross_entropy: clip(sigmoid(z) - y, -a, a). cross_entropy: softmax(z) -
    onehot(y) while softmax_y(z) >= 1 - a; otherwise the true class's probability is held at
    1 - a and the other classes share a by softmax over their own logits:
    (a softmax_{-y}(z), -a at y). Formed in float64 from the dtype softmax outputs, rounded
    once to the dtype."""
    delta = loss_grad_nominal(loss, z, y).to(torch.float64)
    a = floor.to(torch.float64)[:, None]
    if loss == "binary_cross_entropy":
        return torch.minimum(torch.maximum(delta, -a), a).to(z.dtype)
    rows = y[:, None]
    p_true = torch.softmax(z, dim=-1).gather(1, rows).to(torch.float64)
    others = torch.softmax(z.scatter(1, rows, -torch.inf), dim=-1).to(torch.float64)
    held = (a * others).scatter(1, rows, -a)
    return torch.where(p_true < 1.0 - a, held, delta).to(z.dtype)


def loss_grad_bounds(loss: str, z: Interval, y: torch.Tensor, fm: FloatModel) -> Interval:
    """Interval dL/dz for logit boxes z (G, b, C) and labels y (b,)."""
    n_classes = z.shape[-1]
    slack = transcendental_slack(fm, n_classes)
    if loss == "binary_cross_entropy":
        yy = y.to(BOUND_DTYPE)[None, :, None]
        lo = torch.sigmoid(z.lo) - yy
        hi = torch.sigmoid(z.hi) - yy
    else:
        lo_p, hi_p = softmax_bounds(z)
        onehot = torch.nn.functional.one_hot(y, n_classes).to(BOUND_DTYPE)[None]
        lo, hi = lo_p - onehot, hi_p - onehot
    # graded boxes (agt/interval.py): the formulas above are isotone in the logit box, and
    # their float64 evaluation is within the float64 share of the slack
    g = fm.grade_like(lo)
    if g is not None:
        slack = slack + GRADE_FACTOR * g * transcendental_slack(fm, n_classes, nominal=False)
    return Interval(lo - slack, hi + slack)


def softmax_bounds(z: Interval) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise bounds on softmax over a logit box (see module docstring), as

        lower_j = 1 / (1 + sum_{i != j} exp(zU_i - zL_j)),
        upper_j = 1 / (1 + sum_{i != j} exp(zL_i - zU_j)),

    which never subtracts nearly equal sums (cancellation there made the lower bound
    wrong when one class dominated). exp overflow gives inf and the bound 0, which is safe.
    """
    lo, hi = z.lo, z.hi
    n = lo.shape[-1]
    off = ~torch.eye(n, dtype=torch.bool, device=lo.device)
    # pairwise[..., j, i] = z_i - z_j at the extreme corners, diagonal excluded
    to_lower = torch.where(off, hi.unsqueeze(-2) - lo.unsqueeze(-1), -torch.inf)
    to_upper = torch.where(off, lo.unsqueeze(-2) - hi.unsqueeze(-1), -torch.inf)
    lower = 1.0 / (1.0 + torch.exp(to_lower).sum(-1))
    upper = 1.0 / (1.0 + torch.exp(to_upper).sum(-1))
    return lower.clamp(0.0, 1.0), upper.clamp(0.0, 1.0)
