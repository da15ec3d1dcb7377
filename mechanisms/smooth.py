"""Smooth-sensitivity release of a binary prediction (Nissim-Raskhodnikova-Smith 2007).

Given the nominal prediction f(D) in {0, 1} and its smooth radius r (the largest certified
stable distance, as a contiguous grid index), the AGT paper (Thm 5.1) bounds the beta-smooth
sensitivity by
    S_beta = exp(-beta * r).
S is a beta-smooth upper bound on the local sensitivity (S(D) <= e^beta S(D') for neighbours)
only if r(D') >= r(D) - 1 for every neighbour D'; the caller must pass radii with that
property (grid *indices* of a contiguous grid, ensemble sums over the winning voters; see
DESIGN.md section 3). Release
    label = 1[ f + noise > 1/2 ]
with noise calibrated as in AGT Cor. 5.2 / NRS Sec. 2 (admissible noise distributions):
  * Laplace, (eps, delta)-DP:  beta = eps / (2 ln(2/delta)),  noise ~ Laplace(2 S / eps);
  * Cauchy,  eps-DP:           beta = eps / 6,                noise ~ (6 S / eps) * Cauchy(0, 1).
The guarantee is per query and with respect to the neighbouring relation the bundle that
produced r certifies (passed in as `relation`). With r = 0, S = 1 and the noise is at least
the global-sensitivity noise (global_sens.py).
Flip probabilities: P(label != f) = 0.5 exp(-1 / (2 s)) (Laplace, scale s) and
1/2 - arctan(1 / (2 s)) / pi (Cauchy, scale s).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms._checks import Problems, binary_array, check_delta, check_epsilon, radius_array
from mechanisms.guarantee import Guarantee, check_relation
from mechanisms.noise import (NOISE_KINDS, NoiseKind, flip_probability, make_generator,
                              threshold_release)

# Noise scale = SCALE_FACTOR * S / eps (NRS: S / alpha with alpha = eps/2 resp. eps/6).
_SCALE_FACTOR = {"laplace": 2.0, "cauchy": 6.0}


def _check_params(epsilon: object, delta: object, noise: object, problems: Problems) -> None:
    check_epsilon(epsilon, problems)
    if noise == "laplace":
        if delta is None:
            problems.privacy.append("delta is required for Laplace smooth-sensitivity noise "
                                    "((eps, delta)-DP); give delta in (0, 1) or use noise='cauchy'")
        else:
            check_delta(delta, problems)
    elif noise == "cauchy":
        if delta is not None:
            problems.privacy.append(f"Cauchy smooth-sensitivity noise is pure eps-DP and takes no "
                                    f"delta; pass delta=None (got {delta!r})")
    else:
        problems.privacy.append(f"noise must be one of {NOISE_KINDS}, got {noise!r}")


def mechanism_name(noise: NoiseKind) -> str:
    """'ss-laplace' or 'ss-cauchy', the name recorded in guarantees and the ledger."""
    return f"ss-{noise}"


def smooth_beta(epsilon: float, delta: float | None, noise: NoiseKind) -> float:
    """Smoothness parameter beta: eps / (2 ln(2/delta)) for Laplace, eps / 6 for Cauchy."""
    problems = Problems()
    _check_params(epsilon, delta, noise, problems)
    problems.raise_if_any()
    if noise == "laplace":
        return epsilon / (2.0 * math.log(2.0 / delta))
    return epsilon / 6.0


def smooth_bound(radii: ArrayLike, beta: float) -> NDArray[np.float64]:
    """S_beta = exp(-beta * r) for validated radii r (AGT Thm 5.1)."""
    problems = Problems()
    r = radius_array(radii, problems)
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        problems.privacy.append(f"beta must be a finite number > 0, got {beta!r}")
    problems.raise_if_any()
    return np.exp(-beta * r.astype(np.float64))


def noise_scale(epsilon: float, delta: float | None, radii: ArrayLike, noise: NoiseKind
                ) -> NDArray[np.float64]:
    """Noise scale per query: 2 S / eps (Laplace) or 6 S / eps (Cauchy), S = exp(-beta r)."""
    beta = smooth_beta(epsilon, delta, noise)
    return _SCALE_FACTOR[noise] * smooth_bound(radii, beta) / epsilon


def flip_probability_ss(epsilon: float, delta: float | None, radii: ArrayLike,
                        noise: NoiseKind) -> NDArray[np.float64]:
    """Analytical P(release != f) per query for the calibrated smooth-sensitivity noise."""
    return flip_probability(noise_scale(epsilon, delta, radii, noise), noise)


def smooth_guarantee(epsilon: float, delta: float | None, noise: NoiseKind, relation: str
                     ) -> Guarantee:
    """Per-query guarantee of `release_smooth`: (eps, delta)-DP (Laplace) or eps-DP (Cauchy)."""
    beta = smooth_beta(epsilon, delta, noise)
    delta_value = 0.0 if noise == "cauchy" else float(delta)
    return Guarantee(
        epsilon=float(epsilon), delta=delta_value, relation=relation,
        mechanism=mechanism_name(noise),
        note=f"smooth sensitivity S=exp(-beta r), beta={beta!r}, {noise} noise of scale "
             f"{_SCALE_FACTOR[noise]:g} S / eps per query "
             "(AGT Cor 5.2; Nissim-Raskhodnikova-Smith)")


def release_smooth(predictions: ArrayLike, radii: ArrayLike, epsilon: float,
                   delta: float | None = None, *, noise: NoiseKind, relation: str,
                   rng: np.random.Generator | None = None
                   ) -> tuple[NDArray[np.int64], Guarantee]:
    """Release 1[f + noise > 1/2] per query with smooth-sensitivity calibrated noise.

    predictions: nominal labels f in {0, 1}; radii: smooth radii r >= 0 (integers, same
    shape; each must satisfy r(D') >= r(D) - 1 on neighbours). Laplace needs delta in (0, 1),
    Cauchy takes none. Returns the labels (int64) and the per-query Guarantee w.r.t.
    `relation`. rng None draws from a fresh OS-seeded generator (the default for real
    releases). Every problem with the inputs is reported in one error before any noise is drawn.
    """
    problems = Problems()
    _check_params(epsilon, delta, noise, problems)
    check_relation(relation, problems)
    values = binary_array(predictions, problems)
    r = radius_array(radii, problems, name="radii")
    if values is not None and r is not None and values.shape != r.shape:
        problems.data.append(f"predictions and radii must have the same shape, got "
                             f"{values.shape} and {r.shape}")
    problems.raise_if_any()
    guarantee = smooth_guarantee(epsilon, delta, noise, relation)
    scale = noise_scale(epsilon, delta, r, noise)
    rng = make_generator(None) if rng is None else rng
    return threshold_release(values, scale, noise, rng), guarantee
