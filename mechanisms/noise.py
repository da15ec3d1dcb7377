"""Random generators, the threshold release that draws DP noise, and its flip probabilities.

Every noisy release in this package goes through `threshold_release`:
    label = 1[ f + scale * Z > 1/2 ],   Z ~ Laplace(0, 1) or standard Cauchy,
for a nominal binary prediction f in {0, 1}. The release differs from f ("flips") exactly
when the noise crosses 1/2 towards the other label; by symmetry of Z,
    Laplace, scale s:  P(flip) = P(s Z > 1/2) = 0.5 * exp(-1 / (2 s))
    Cauchy,  scale s:  P(flip) = P(s Z > 1/2) = 1/2 - arctan(1 / (2 s)) / pi.
The privacy guarantee comes from how the caller calibrates `scale` (global_sens.py,
smooth.py) and is stated with respect to the neighbouring relation the caller certifies.
"""

from __future__ import annotations

import math
import secrets
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

NoiseKind = Literal["laplace", "cauchy"]
NOISE_KINDS: tuple[str, ...] = ("laplace", "cauchy")


def make_generator(seed: int | None = None) -> np.random.Generator:
    """Return the generator that draws release noise.

    seed given: `np.random.default_rng(seed)`, reproducible, for experiments and tests only.
    seed None (the default for real releases): a PCG64 generator seeded with 128 bits from
    the operating system's secure source (`secrets`), so the noise cannot be replayed.
    """
    if seed is None:
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))
    return np.random.default_rng(seed)


def threshold_release(values: NDArray[np.int64], scale: ArrayLike | float, noise: NoiseKind,
                      rng: np.random.Generator) -> NDArray[np.int64]:
    """Release 1[values + scale * Z > 1/2] with Z i.i.d. Laplace(0, 1) or standard Cauchy.

    `values` (0/1) and `scale` (>= 0, broadcastable to values) are validated by the callers.
    """
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), values.shape)
    if noise == "laplace":
        z = rng.laplace(0.0, 1.0, size=values.shape)
    elif noise == "cauchy":
        z = rng.standard_cauchy(size=values.shape)
    else:  # callers validate; never draw from an unknown distribution
        raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
    # scale 0 (an underflowed smooth bound) means no noise, even for an infinite draw.
    perturbation = np.where(scale > 0, scale * z, 0.0)
    return (values + perturbation > 0.5).astype(np.int64)


def laplace_flip_probability(scale: ArrayLike | float) -> NDArray[np.float64]:
    """P(Laplace(0, s) > 1/2) = 0.5 * exp(-1 / (2 s)); 0 for s = 0."""
    s = np.asarray(scale, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return 0.5 * np.exp(-1.0 / (2.0 * s))


def cauchy_flip_probability(scale: ArrayLike | float) -> NDArray[np.float64]:
    """P(Cauchy(0, s) > 1/2) = 1/2 - arctan(1 / (2 s)) / pi; 0 for s = 0."""
    s = np.asarray(scale, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return 0.5 - np.arctan(1.0 / (2.0 * s)) / math.pi


def flip_probability(scale: ArrayLike | float, noise: NoiseKind) -> NDArray[np.float64]:
    """P(threshold_release(f) != f) for noise scale `scale` (the same for f = 0 and f = 1)."""
    if noise == "laplace":
        return laplace_flip_probability(scale)
    if noise == "cauchy":
        return cauchy_flip_probability(scale)
    raise ValueError(f"noise must be one of {NOISE_KINDS}, got {noise!r}")
