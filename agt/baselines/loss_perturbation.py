"""The training half of loss perturbation (objective perturbation; van der Maaten & Hannun
Alg. 4 and 5, Chaudhuri, Monteleoni & Sarwate 2011, Alg. 2): minimise the perturbed objective

    J(W; D) + (1/N) <B, W> + (rho / (2N)) ||W||_F^2,
    J(W; D) = (1/N) sum_i l(W z_i, y_i) + (lambda/2) ||W||_F^2     (agt/baselines/convex.py)

for a given perturbation matrix B (C, d) and rho >= 0, to optimality (gradient norm <= tol).

The engine draws no release noise: the mechanism `loss-pert` / `loss-pert-gauss`
(mechanisms/loss_perturbation.py) calibrates rho and the law of B, draws B, and calls a
`PerturbedSolver` through its owner-only `PerturbedObjective` input; the privacy proof
(re-derived for replace-one) is in that module. Every training input must lie in the unit
ball (refused otherwise, agt/baselines/unit_ball.py), which the proof assumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.baselines.convex import ConvexFit, _check, fit_logistic
from agt.errors import ConfigError, DataError

__all__ = ["PerturbedSolver"]


@dataclass
class PerturbedSolver:
    """solve(B, rho) -> W_priv (C, d): the minimiser of the perturbed objective on (z, y)
    to ||grad||_F <= tol, or the solver's last iterate where it stops short: never an
    error, since the mechanism solves after the spend and a failure that depends on the data
    would be an output of its own. The guarantee is the exact minimiser's, as for any
    numerical solve (tol > 0 either way). Owner-only: a function of the private data; hand
    it to the mechanism, never release it. Each solve starts from the unperturbed minimiser
    (a warm start only: the result is the unique minimiser whatever the start). `fits`
    records each solve's ConvexFit (gradient norm reached, iterations, seconds; compare
    with `tol` to see a solve that stopped short); `seconds` their total."""

    z: NDArray[np.float64]
    y: NDArray[np.int64]
    n_classes: int
    lam: float
    tol: float = 1e-9
    fits: list[ConvexFit] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.lam, (int, float)) or isinstance(self.lam, bool) \
                or not math.isfinite(self.lam) or self.lam < 0:
            raise ConfigError(f"lambda must be a finite number >= 0, got {self.lam!r}")
        # lambda = 0 is allowed here: rho / N (known per solve) then gives strong convexity
        self.z, self.y = _check(self.z, self.y, self.n_classes, self.lam,
                                0.0 if self.lam > 0 else 1.0, self.tol)
        self._start: NDArray[np.float64] | None = None

    @property
    def n_train(self) -> int:
        return int(self.z.shape[0])

    @property
    def dim(self) -> int:
        return int(self.z.shape[1])

    @property
    def seconds(self) -> float:
        return float(sum(f.seconds for f in self.fits))

    def __call__(self, noise: ArrayLike, rho: float) -> NDArray[np.float64]:
        b = np.asarray(noise, dtype=np.float64)
        if b.shape != (self.n_classes, self.dim) or not np.isfinite(b).all():
            raise DataError(f"the perturbation must be a finite ({self.n_classes}, {self.dim}) "
                            f"matrix, got {b.shape}")
        if not isinstance(rho, (int, float)) or not math.isfinite(rho) or rho < 0:
            raise ConfigError(f"rho must be a finite number >= 0, got {rho!r}")
        if self.lam == 0 and rho == 0:
            raise ConfigError("lambda + rho / N must be > 0 (a unique minimiser)")
        n = self.n_train
        if self._start is None and self.lam > 0:
            self._start = fit_logistic(self.z, self.y, self.n_classes, self.lam,
                                       tol=max(self.tol, 1e-6), require_tol=False).weights
        # never raises for want of convergence: the mechanism calls this after the spend,
        # where a failure that depends on D would be an output of its own (a review's find)
        fit = fit_logistic(self.z, self.y, self.n_classes, self.lam, linear=b / n,
                           extra_l2=float(rho) / n, tol=self.tol, w0=self._start,
                           require_tol=False)
        self.fits.append(fit)
        return fit.weights
