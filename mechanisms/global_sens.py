"""Global-sensitivity release of a single model's binary prediction (Laplace mechanism).

A binary prediction f(D) in {0, 1} has global sensitivity 1 under any neighbouring relation,
so releasing f + Laplace(1/eps) is eps-DP (Dwork-McSherry-Nissim-Smith 2006; Dwork-Roth 2014,
Thm 3.6), and so is its post-processing
    label = 1[ f + Laplace(1/eps) > 1/2 ].
The data-independent noise needs no certificate (the guarantee holds under every relation);
this is the baseline that smooth sensitivity (smooth.py) improves on.
    P(label != f) = P(Laplace(1/eps) > 1/2) = 0.5 * exp(-eps / 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mechanisms.base import Mechanism, register
from mechanisms.checks import check_epsilon, privacy_problems
from mechanisms.guarantee import Guarantee
from mechanisms.inputs import Certified
from mechanisms.noise import (
    correct_from_flip,
    laplace_flip_probability,
    laplace_scale_up,
    threshold_draw,
)


def flip_probability_gs(epsilon: float) -> float:
    """P(release != f) = P(Laplace(1/eps) > 1/2) = 0.5 * exp(-eps / 2)."""
    problems = privacy_problems()
    check_epsilon(epsilon, problems)
    problems.raise_if_any()
    return float(laplace_flip_probability(laplace_scale_up(1.0, epsilon)))


@register("gs", inputs=Certified, needs_delta=False,
          summary="global sensitivity, Laplace(1/eps) threshold, eps-DP; binary")
@dataclass(frozen=True)
class GlobalSensitivity(Mechanism):
    """1[f + Laplace(1/eps) > 1/2] per query: eps-DP under every relation, binary models."""

    epsilon: float
    delta: float | None = None

    input_type = Certified
    max_classes = 2
    relation_free = True

    def __post_init__(self) -> None:
        problems = privacy_problems("gs")
        check_epsilon(self.epsilon, problems)
        problems.check(self.delta in (None, 0, 0.0),
                       f"gs is pure eps-DP and takes no delta, got {self.delta!r}")
        problems.raise_if_any()

    @property
    def name(self) -> str:
        return "gs"

    def guarantee(self, relation: str) -> Guarantee:
        return Guarantee(float(self.epsilon), 0.0, relation, self.name,
                         f"global sensitivity 1, Laplace(1/eps) noise, eps={self.epsilon!r} "
                         f"per query (Dwork-Roth Thm 3.6)")

    def _draw(self, inputs: Certified, rng: np.random.Generator):
        return threshold_draw(inputs.prediction, laplace_scale_up(1.0, self.epsilon), "laplace",
                              rng)

    def _correct(self, inputs: Certified, y):
        return correct_from_flip(inputs.prediction, y, flip_probability_gs(self.epsilon))
