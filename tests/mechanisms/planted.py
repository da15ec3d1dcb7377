"""Test-only mechanisms with planted privacy bugs, for the audit's power tests. Each is a
registry mechanism with one line changed; none is registered."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mechanisms.global_sens import GlobalSensitivity
from mechanisms.guarantee import RELATIONS, Guarantee
from mechanisms.noise import laplace_scale_up, ptr_draw, threshold_draw
from mechanisms.radius import ExponentialRadius, RadiusPTR, exp_draw


@dataclass(frozen=True)
class RadiusOffByOne(ExponentialRadius):
    """exp-radius reading the radius one too high: utility -(r + 2) for the other classes
    (the correct -(r + 1) with r + 1 taken for the radius)."""

    @property
    def name(self) -> str:
        return "planted-radius-off-by-one"

    def _draw(self, inputs, rng):
        return exp_draw(inputs.prediction, inputs.radius + 1, self.epsilon, inputs.n_classes,
                        rng)


@dataclass(frozen=True)
class HalvedNoise(GlobalSensitivity):
    """gs with its Laplace scale halved (1 / (2 eps)) under the same eps claim."""

    @property
    def name(self) -> str:
        return "planted-halved-noise"

    def _draw(self, inputs, rng):
        return threshold_draw(inputs.prediction, laplace_scale_up(1.0, self.epsilon) / 2,
                              "laplace", rng)


@dataclass(frozen=True)
class SessionOfExpRadius(ExponentialRadius):
    """exp-radius at eps on every query, released as one session (one ledger entry).
    `composed`: its claim is Q eps for Q queries (correct); else eps (composition ignored
    for the second query: the planted bug)."""

    composed: bool = False
    per_query = False

    @property
    def name(self) -> str:
        return "session-exp-radius" if self.composed else "planted-composition-ignored"

    def guarantee_for(self, inputs, relation):
        g = super().guarantee_for(inputs, relation)
        if self.composed:
            return Guarantee(g.epsilon * inputs.n_queries, 0.0, relation, self.name)
        return g


@dataclass(frozen=True)
class ReplaceOneOnAddRemove(ExponentialRadius):
    """exp-radius that states its native guarantee under every relation, also for inputs
    certified under add-remove only (the correct one converts: 2 eps under replace-one)."""

    def relations(self, inputs):
        return RELATIONS

    @property
    def name(self) -> str:
        return "planted-replace-one-claim"


@dataclass(frozen=True)
class ThresholdOneStepLow(RadiusPTR):
    """ptr with its threshold ln(1/delta)/eps one radius step too low."""

    @property
    def name(self) -> str:
        return "planted-ptr-threshold-low"

    def _draw(self, inputs, rng):
        return ptr_draw(inputs.prediction, inputs.radius + 1, self.epsilon, self.delta, rng)


def certified(pairs, n_classes=2, relations=("replace-one",)):
    """Certified inputs of (prediction, radius) pairs."""
    from mechanisms.inputs import Certified, Source

    pred, radius = zip(*pairs)
    return Certified(np.array(pred), np.array(radius), n_classes,
                     Source("planted", "0" * 64, tuple(relations), True))
