"""Smooth-sensitivity release of a binary prediction (Nissim-Raskhodnikova-Smith 2007).

Given the nominal prediction f(D) in {0, 1} and its stability radius r (the index of the
largest certified box; -1 where not even k = 0 certifies), the AGT paper (Thm 5.1) bounds
the beta-smooth sensitivity by
    S_beta = exp(-beta * max(r, 0))
(here with the exponent capped at 600, `smooth_bound`, so that S stays a normal float).
S is a beta-smooth upper bound on the local sensitivity (S(D) <= e^beta S(D') for
neighbours) because r(D') >= r(D) - 1 for every neighbour D' (the nesting property of the
exact selection rule; the mechanism refuses radii without that proof, base.py), and
max(r, 0) keeps that property. Release
    label = 1[ f + noise > 1/2 ]
with noise calibrated as in AGT Cor. 5.2 / NRS Sec. 2 (admissible noise distributions):
  * Laplace, (eps, delta)-DP:  beta = ln(1 + eps / (2 ln(2/delta))) (the papers'
                               eps / (2 ln(2/delta)) to first order; `smooth_beta`),
                               noise ~ Laplace(2 S / eps);
  * Cauchy,  eps-DP:           beta = eps / 6,                noise ~ (6 S / eps) * Cauchy(0, 1).
The guarantee holds under the relations the radii are certified under. With r <= 0, S = 1 and
the noise is at least the global-sensitivity noise (global_sens.py).
Flip probabilities: P(label != f) = 0.5 exp(-1 / (2 s)) (Laplace, scale s) and
1/2 - arctan(1 / (2 s)) / pi = arctan(2 s) / pi (Cauchy, scale s); the labels are drawn
from these laws exactly (mechanisms/noise.py).

ss-argmax (below): the same release for any number of classes, equal to ss-cauchy for C = 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import partial

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms.base import Mechanism, register
from mechanisms.checks import (
    check_delta,
    check_epsilon,
    check_params,
    privacy_problems,
    radius_array,
)
from mechanisms.exact import cauchy_argmax
from mechanisms.guarantee import Guarantee
from mechanisms.inputs import Certified
from mechanisms.noise import (
    NOISE_KINDS,
    NoiseKind,
    correct_from_flip,
    flip_probability,
    threshold_draw,
)

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
    """Smoothness parameter beta: min(ln(1 + eps / (2 ln(2/delta))), eps / 2) for Laplace,
    eps / 6 for Cauchy.

    Laplace, the dilation step of the proof: a neighbour's noise is e^lambda Z with
    |lambda| <= beta. For lambda < 0 the density ratio of Z against e^lambda Z at z is
    e^lambda exp(|z| (e^|lambda| - 1)) <= exp(|z| (e^beta - 1)), at most e^(eps/2) for
    |z| <= (eps / 2) / (e^beta - 1) =: t (for lambda >= 0 it is at most e^beta, so beta <=
    eps / 2 is needed too, which binds only for delta > 2/e); the rest has probability
    P(|Z| > t) = e^-t, which must be <= delta / 2, so e^beta - 1 <= eps / (2 ln(2/delta)). NRS (and
    the AGT paper) state beta = eps / (2 ln(2/delta)), which satisfies this only to first order: an
    adversarial review found the binary release above (eps, delta) at eps = 46.9-52.5 for
    delta = 1e-6 (beta = 1.65-1.83), and at eps 91-108 for delta = 1e-12. The log1p form is exact;
    it is 2 % below the papers' value at eps = 1, delta = 1e-5, and 0.02 % below at eps = 0.01; the
    float is rounded down by 2^-47 relative, beyond the rounding errors of its evaluation."""
    problems = privacy_problems()
    _check_params(epsilon, delta, noise, problems)
    problems.raise_if_any()
    if noise == "laplace":
        # ln 2 - ln delta: 2 / delta overflows for delta < 1.1e-308. The log1p form meets the
        # dilation condition with equality, so rounding must not raise beta: the three logs,
        # the sum and the division err by at most ~5 float ulps (2^-52 relative each; the
        # sum of two positive terms does not cancel), and 2^-47 relative lies beyond them.
        exact = math.log1p(epsilon / (2.0 * (math.log(2.0) - math.log(delta))))
        return min(exact * (1.0 - 2.0 ** -47), epsilon / 2.0)
    return epsilon / 6.0


# The exponent of S is capped so that S, and the noise scales built from it, stay normal
# floats: an underflowed scale (0, or a subnormal with few significant bits) would break the
# ratio of neighbouring release laws that pure eps-DP needs (an adversarial review found
# ss-cauchy's s = 0 at r = 4471 against a positive flip probability at r = 4470, eps = 1).
SMOOTH_EXPONENT_CAP = 600.0


def smooth_bound(radii: ArrayLike, beta: float) -> NDArray[np.float64]:
    """S_beta = exp(-min(beta * max(r, 0), 600)) for stability radii r >= -1 (AGT Thm 5.1).

    The cap keeps S >= e^-600 (a normal float, so every scale built from it is computed to
    a relative error of a few ulps). It changes nothing in the proof: min(beta max(r, 0), 600)
    still moves by at most beta between neighbours (a minimum with a constant keeps the
    Lipschitz bound), so S(D) <= e^beta S(D'), and S is still >= the local sensitivity (it
    equals the unscaled bound wherever r <= 0)."""
    problems = privacy_problems()
    r = radius_array(radii, problems)
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        problems.add(f"beta must be a finite number > 0, got {beta!r}")
    problems.raise_if_any()
    exponent = np.minimum(beta * np.maximum(r, 0).astype(np.float64), SMOOTH_EXPONENT_CAP)
    return np.exp(-exponent)


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


# ---------------------------------------------------------------------------------------------
# Smooth-sensitivity noisy argmax for C classes

_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(200)


@dataclass(frozen=True)
class SmoothArgmax(Mechanism):
    """ss-argmax: the smooth-sensitivity release of the certified class for any number of
    classes, with Cauchy noise; for C = 2 it is exactly ss-cauchy (mechanisms/smooth.py).

    Construction. Encode the class c by f in R^(C-1), f_j = 1[c = j] for j = 1..C-1 (class 0
    is the all-zero vector) and release y = argmax(1/2 (class 0), f_j + s Z_j (class j)) with
    Z_j i.i.d. standard Cauchy. For C = 2 this is 1[f_1 + s Z_1 > 1/2], the binary release.
    The L1 local sensitivity of f is 0 where the radius r >= 1 (every neighbour has the same
    class) and at most L (1 for C = 2, 2 otherwise) where r <= 0, so S = L exp(-beta max(r,
    0)) is a beta-smooth upper bound on it (r has sensitivity 1). With s = S / alpha,
    alpha = eps / 6 and beta = eps / (6 (C - 1)), the release is eps-DP. Proof (pointwise
    density ratio of the noisy vector, as in Nissim-Raskhodnikova-Smith): the standard Cauchy
    log-density ln h(z) = -ln(1 + z^2) - ln(pi) is 1-Lipschitz (|2z / (1 + z^2)| <= 1), so
    shifting the noise by (f - f') / s costs at most ||f - f'||_1 / s <= LS / s <= S / s =
    alpha; and rescaling a coordinate by e^lambda costs |lambda + ln((1 + e^(-2 lambda) z^2) /
    (1 + z^2))| <= |lambda| including the Jacobian, with |lambda| = |ln(S' / S)| <= beta per
    coordinate: in all alpha + (C - 1) beta = eps / 3 <= eps. These are the constants of the
    binary release (6 S / eps, beta = eps / 6), kept so that C = 2 reduces to it; the
    exponential mechanism on the radius (exp-radius) spends the same radius far better.

    P(release = y) is exact up to 200-point Gauss-Legendre quadrature after the substitution
    z = tan(theta), which maps the Cauchy density to the uniform one on (-pi/2, pi/2).
    Sampling: C = 2 draws the binary release's exact law; for C > 2 the argmax is decided
    exactly from lazily realised Cauchy noises (`mechanisms.exact.cauchy_argmax`: each Z_j is
    only compared with rational points, through rigorous enclosures of its distribution
    function), so the released label has exactly the continuous law above.
    """

    epsilon: float
    delta: float | None = None

    input_type = Certified
    uses_radii = True

    def __post_init__(self) -> None:
        check_params(self.name, self.epsilon, self.delta, False)

    @property
    def name(self) -> str:
        return "ss-argmax"

    def beta(self, n_classes: int) -> float:
        return self.epsilon / (6.0 * (n_classes - 1))

    def scale(self, radius: NDArray[np.int64], n_classes: int) -> NDArray[np.float64]:
        local = 1.0 if n_classes == 2 else 2.0
        return 6.0 * local * smooth_bound(radius, self.beta(n_classes)) / self.epsilon

    def guarantee(self, relation: str) -> Guarantee:
        return Guarantee(float(self.epsilon), 0.0, relation, self.name,
                         f"smooth-sensitivity noisy argmax over the class encoding, Cauchy "
                         f"noise of scale 6 S / eps, S = L exp(-beta r), beta = eps / (6 (C-1)), "
                         f"L = 1 (C = 2) or 2; eps={self.epsilon!r} per query")

    def _draw(self, inputs: Certified, rng):
        c, q = inputs.n_classes, inputs.n_queries
        s = self.scale(inputs.radius, c)
        if c == 2:          # the binary release, drawn from its exact law
            return threshold_draw(inputs.prediction, s, "cauchy", rng)
        # c > 2: the exact argmax of (1/2, f_j + s Z_j) from lazily realised Cauchy noises
        # s is finite and > 0 (S >= exp(-600), 1e-300 <= eps <= 1e6); fail closed otherwise
        if not (np.isfinite(s).all() and (s > 0).all()):
            raise ValueError("ss-argmax needs finite noise scales > 0")
        half, one, zero = Fraction(1, 2), Fraction(1), Fraction(0)
        out = np.empty(q, dtype=np.int64)
        for i, (pred, scale) in enumerate(zip(inputs.prediction.tolist(), s.tolist())):
            centres = [one if pred == j else zero for j in range(1, c)]
            out[i] = cauchy_argmax(half, centres, Fraction(scale), rng)
        return out

    def probabilities(self, inputs: Certified) -> NDArray[np.float64]:
        """(Q, C) exact release probabilities (module quadrature), to relative accuracy also
        where they are tiny (s down to 1e-266): the Cauchy distribution function below 0 is
        arctan(-1/x) / pi, not 1/2 + arctan(x) / pi (which cancels to 0), and class k's
        score is integrated over phi = pi/2 - theta, z_k = cot(phi), with the range
        arctan2(s, 1/2 - f_k) computed directly (a review found probabilities near 1e-23
        reported as 0 at eps = 30, r = 20)."""
        c, q = inputs.n_classes, inputs.n_queries
        s = self.scale(inputs.radius, c)
        pred = inputs.prediction
        out = np.zeros((q, c))

        def cdf(x):
            x = np.asarray(x, dtype=np.float64)      # the minimum only keeps x >= 0 finite
            return np.where(x < 0, np.arctan(-1.0 / np.minimum(x, -1e-300)) / math.pi,
                            0.5 + np.arctan(x) / math.pi)

        # class 0: every coordinate below 1/2
        lead = np.where(pred >= 1, cdf(-0.5 / s), 1.0)      # the coordinate of c (if c >= 1)
        out[:, 0] = lead * cdf(0.5 / s) ** np.where(pred >= 1, c - 2, c - 1)
        for k in range(1, c):
            fk = (pred == k).astype(np.float64)
            # z_k = cot(phi) above the point where f_k + s z_k = 1/2: phi in (0, width)
            width = np.arctan2(s, 0.5 - fk)
            phi = width[:, None] * (1 - _GL_NODES[None, :]) / 2
            value = (fk / s)[:, None] + 1.0 / np.tan(phi)            # the class-k score / s
            others_zero = np.where(pred >= 1, np.where(pred == k, c - 2, c - 3), c - 2)
            prob = cdf(value) ** others_zero[:, None]
            other_c = (pred >= 1) & (pred != k)
            prob = prob * np.where(other_c[:, None], cdf(value - (1.0 / s)[:, None]), 1.0)
            out[:, k] = (prob * _GL_WEIGHTS[None, :]).sum(axis=1) * width / 2 / math.pi
        return np.clip(out, 0.0, 1.0)

    def _correct(self, inputs: Certified, y):
        p = self.probabilities(inputs)
        valid = (y >= 0) & (y < inputs.n_classes)
        return np.where(valid, p[np.arange(len(y)), np.clip(y, 0, inputs.n_classes - 1)], 0.0)


register("ss-argmax", inputs=Certified, needs_delta=False,
         summary="smooth-sensitivity noisy argmax (Cauchy) for any number of classes, eps-DP; "
                 "ss-cauchy for C = 2")(SmoothArgmax)
