"""Smooth-sensitivity release of a binary prediction (Nissim-Raskhodnikova-Smith 2007).

Given the nominal prediction f(D) in {0, 1} and its stability radius r (the index of the
largest certified box; -1 where not even k = 0 certifies), the AGT paper (Thm 5.1) bounds
the beta-smooth sensitivity by
    S_beta = exp(-beta * max(r, 0)).
S is a beta-smooth upper bound on the local sensitivity (S(D) <= e^beta S(D') for
neighbours) because r(D') >= r(D) - 1 for every neighbour D' (the nesting property of the
exact selection rule; the mechanism refuses radii without that proof, base.py), and
max(r, 0) keeps that property. Release
    label = 1[ f + noise > 1/2 ]
with noise calibrated as in AGT Cor. 5.2 / NRS Sec. 2 (admissible noise distributions):
  * Laplace, (eps, delta)-DP:  beta = eps / (2 ln(2/delta)),  noise ~ Laplace(2 S / eps);
  * Cauchy,  eps-DP:           beta = eps / 6,                noise ~ (6 S / eps) * Cauchy(0, 1).
The guarantee holds under the relations the radii are certified under. With r <= 0, S = 1 and
the noise is at least the global-sensitivity noise (global_sens.py).
Flip probabilities: P(label != f) = 0.5 exp(-1 / (2 s)) (Laplace, scale s) and
1/2 - arctan(1 / (2 s)) / pi (Cauchy, scale s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.base import Mechanism, register
from mechanisms.checks import check_delta, check_epsilon, privacy_problems, radius_array
from mechanisms.guarantee import Guarantee
from mechanisms.inputs import Certified
from mechanisms.noise import NOISE_KINDS, NoiseKind, correct_from_flip, flip_probability, \
    threshold_draw

# Noise scale = SCALE_FACTOR * S / eps (NRS: S / alpha with alpha = eps/2 resp. eps/6).
SCALE_FACTOR = {"laplace": 2.0, "cauchy": 6.0}


def _check_params(epsilon: object, delta: object, noise: object, problems) -> None:
    check_epsilon(epsilon, problems)
    if noise == "laplace":
        if delta is None:
            problems.add("delta is required for Laplace smooth-sensitivity noise "
                         "((eps, delta)-DP); give delta in (0, 1) or use Cauchy noise")
        else:
            check_delta(delta, problems)
    elif noise == "cauchy":
        if delta not in (None, 0, 0.0):
            problems.add(f"Cauchy smooth-sensitivity noise is pure eps-DP and takes no "
                         f"delta (got {delta!r})")
    else:
        problems.add(f"noise must be one of {NOISE_KINDS}, got {noise!r}")


def smooth_beta(epsilon: float, delta: float | None, noise: NoiseKind) -> float:
    """Smoothness parameter beta: eps / (2 ln(2/delta)) for Laplace, eps / 6 for Cauchy."""
    problems = privacy_problems()
    _check_params(epsilon, delta, noise, problems)
    problems.raise_if_any()
    if noise == "laplace":
        return epsilon / (2.0 * math.log(2.0 / delta))
    return epsilon / 6.0


def smooth_bound(radii: ArrayLike, beta: float) -> NDArray[np.float64]:
    """S_beta = exp(-beta * max(r, 0)) for stability radii r >= -1 (AGT Thm 5.1)."""
    problems = privacy_problems()
    r = radius_array(radii, problems)
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        problems.add(f"beta must be a finite number > 0, got {beta!r}")
    problems.raise_if_any()
    return np.exp(-beta * np.maximum(r, 0).astype(np.float64))


def noise_scale(epsilon: float, delta: float | None, radii: ArrayLike, noise: NoiseKind
                ) -> NDArray[np.float64]:
    """Noise scale per query: 2 S / eps (Laplace) or 6 S / eps (Cauchy), S = exp(-beta r)."""
    beta = smooth_beta(epsilon, delta, noise)
    return SCALE_FACTOR[noise] * smooth_bound(radii, beta) / epsilon


def flip_probability_ss(epsilon: float, delta: float | None, radii: ArrayLike,
                        noise: NoiseKind) -> NDArray[np.float64]:
    """Analytical P(release != f) per query for the calibrated smooth-sensitivity noise."""
    return flip_probability(noise_scale(epsilon, delta, radii, noise), noise)


def smooth_note(epsilon: float, delta: float | None, noise: NoiseKind) -> str:
    beta = smooth_beta(epsilon, delta, noise)
    return (f"smooth sensitivity S=exp(-beta r), beta={beta!r}, {noise} noise of scale "
            f"{SCALE_FACTOR[noise]:g} S / eps per query (AGT Cor 5.2; Nissim-Raskhodnikova-Smith)")


@dataclass(frozen=True)
class SmoothSensitivity(Mechanism):
    """1[f + noise(S) > 1/2] per query with S = exp(-beta max(r, 0)) (module docstring)."""

    epsilon: float
    delta: float | None = None
    noise: str = "cauchy"

    input_type = Certified
    uses_radii = True
    max_classes = 2

    def __post_init__(self) -> None:
        problems = privacy_problems(f"ss-{self.noise}")
        _check_params(self.epsilon, self.delta, self.noise, problems)
        problems.raise_if_any()
        if self.noise == "cauchy":
            object.__setattr__(self, "delta", None)

    @property
    def name(self) -> str:
        return f"ss-{self.noise}"

    @property
    def beta(self) -> float:
        return smooth_beta(self.epsilon, self.delta, self.noise)

    def guarantee(self, relation: str) -> Guarantee:
        delta = 0.0 if self.noise == "cauchy" else float(self.delta)
        return Guarantee(float(self.epsilon), delta, relation, self.name,
                         smooth_note(self.epsilon, self.delta, self.noise))

    def scale(self, radius: ArrayLike) -> NDArray[np.float64]:
        return noise_scale(self.epsilon, self.delta, radius, self.noise)

    def _draw(self, inputs: Certified, rng: np.random.Generator):
        return threshold_draw(inputs.prediction, self.scale(inputs.radius), self.noise, rng)

    def _correct(self, inputs: Certified, y):
        flip = flip_probability(self.scale(inputs.radius), self.noise)
        return correct_from_flip(inputs.prediction, y, flip)


register("ss-laplace", inputs=Certified, needs_delta=True,
         summary="smooth sensitivity, Laplace(2S/eps), (eps, delta)-DP; binary")(
    partial(SmoothSensitivity, noise="laplace"))
register("ss-cauchy", inputs=Certified, needs_delta=False,
         summary="smooth sensitivity, Cauchy(6S/eps), eps-DP; binary")(
    partial(SmoothSensitivity, noise="cauchy"))
