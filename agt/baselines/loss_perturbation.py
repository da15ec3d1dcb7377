"""Loss perturbation (objective perturbation): a private *training* method (van der Maaten &
Hannun Alg. 4 and 5; Chaudhuri, Monteleoni & Sarwate 2011, Alg. 2; Kifer, Smith & Thakurta
2012, Thm 2), re-derived for the relation the trade-off study compares under, replace-one.

Release. With B a random (C, d) matrix and rho >= 0,

    W_priv = argmin_W  J(W; D) + (1/N) <B, W> + (rho / (2N)) ||W||_F^2,
    J(W; D) = (1/N) sum_i l(W z_i, y_i) + (lambda/2) ||W||_F^2        (agt/baselines/convex.py)

Multiplying by N, W_priv minimises F_D(W) + <B, W> with F_D = sum_i l_i + ((N lambda + rho)/2)
||W||^2, so b(W) = -grad F_D(W) is a bijection between B and W_priv, and the density of the
output is g_D(W) = mu(b_D(W)) |det Hess F_D(W)| (change of variables, Chaudhuri et al. Thm 9).

Replace-one analysis. D' replaces (z, y) by (z', y'); N is unchanged. Write Hess F_D =
A + E with A = (N lambda + rho) I + sum over the common records (A >= (N lambda + rho) I) and
E = (diag p - p p^T) kron z z^T (PSD, rank <= C - 1, lambda_max <= L = 1/2 for ||z|| <= 1).

  Jacobian factor.  det(A + E') / det(A + E) <= det(A + E') / det(A) <= (1 + L/(N lambda +
      rho))^(C-1), and the same the other way (E >= 0). So it costs
      eps_J = (C - 1) ln(1 + L / (N lambda + rho)).
  Noise factor.  b_D(W) - b_D'(W) = g' z'^T - g z^T with g = softmax(W z) - e_y, so its norm
      is at most 2K = 2 sqrt(2) (two records change, not one as under add/remove).
      * Alg. 4 (delta = 0): mu(b) ~ exp(-beta ||b||_F); the ratio is at most exp(2 beta K).
        With beta = eps_N / (2K) the noise costs eps_N.
      * Alg. 5 (delta > 0): B with i.i.d. N(0, sigma^2) entries. ln mu(b)/mu(b + s) =
        (2 <b, s> + ||s||^2) / (2 sigma^2) with s = g' z'^T - g z^T, ||s|| <= 2K, and
        <b, s> = g'^T (B z') - g^T (B z). g depends on W_priv (so on B): its direction can
        follow B z. It lies in the sum-zero subspace (P = I - 11^T/C) with ||g|| <= K, so
        |g^T B z| <= K ||P B z||, and P B z ~ sigma ||z|| chi_{C-1} in distribution for the
        *fixed* record z. With q the upper delta/2 quantile of chi_{C-1}, outside an event of
        probability <= delta (union over z, z') |<b, s>| <= 2 K sigma q, and the loss is at most
        (2 K sigma q + 2 K^2) / sigma^2 =: eps_N, i.e. sigma = K (q + sqrt(q^2 + 2 eps_N)) / eps_N.
  So W_priv is (eps_J + eps_N)-DP (Alg. 4) or (eps_J + eps_N, delta)-DP (Alg. 5) under
  replace-one (a privacy loss bounded by eps outside an event of probability delta gives
  (eps, delta)-DP).

Calibration for a target (eps, delta). Without rho the Jacobian costs eps_J0 = (C - 1)
ln(1 + L/(N lambda)) (the data-independent regulariser counts: N is public under
replace-one). If eps_J0 <= eps/2 (the study's split), rho = 0 and eps_N = eps - eps_J0;
otherwise eps_J = eps/2 and rho = L / (exp(eps_J / (C - 1)) - 1) - N lambda, the smallest rho
with (1 + L / (N lambda + rho))^(C-1) <= e^(eps/2). Either way the noise gets eps_N >= eps/2.
A user-given rho smaller than that is refused; a larger one is used (and pays less eps_J).

What differs from the study's statement. (1) Its proof is for add/remove neighbours (one
record added) and needs the regulariser lambda R / N of its objective (18); with the
(lambda/2) ||W||^2 of J, N lambda changes with N. Under replace-one its constants (rho >=
2LC/eps, beta = eps/(2K)) give 1.5 eps (Jacobian eps/2, noise 2 beta K = eps), not the 2 eps of
group privacy. We calibrate to replace-one directly instead. (2) Rank C - 1 (not C) and the
exact inverse of the determinant bound: a smaller rho, equally sound. (3) Alg. 5's sigma =
(K/eps) sqrt(8 log(2/delta) + 4 eps) comes from a one-dimensional Gaussian tail, which is
right for binary GLMs (g is a scalar times z) but not for C > 2 classes: <b, s> involves the
C - 1 dimensional P B z, whose norm exceeds the 1-D quantile far more often than delta
(tests/agt/baselines/test_loss_perturbation.py); we use the chi_{C-1} quantile.

Exactness. The proof assumes the exact minimiser; the fit stops at ||grad|| <= tol (1e-9 by
default), reported with the result (the same caveat as every objective-perturbation
implementation: the released point is within tol / (lambda + rho/N) of the minimiser).

Randomness. seed=None draws the noise from the operating system's secure source
(`secrets`-seeded numpy generator, the DP-SGD baseline's convention); a given seed is for
experiments only and the result records seeded=True.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import chi

from agt.baselines.convex import (HESSIAN_BOUND, LIPSCHITZ, RELATION, ConvexFit, fit_logistic,
                                  hessian_rank)
from agt.errors import PrivacyError, Problems

__all__ = ["LossPerturbation", "LossPerturbationResult", "train_loss_perturbation",
           "sample_norm_noise", "jacobian_epsilon", "gaussian_sigma", "chi_quantile"]

JACOBIAN_SHARE = 0.5      # the study's split of eps between the Jacobian and the noise


def sample_norm_noise(shape: tuple[int, ...], beta: float, rng: np.random.Generator
                      ) -> NDArray[np.float64]:
    """A draw with density proportional to exp(-beta ||b||_2) over all entries of `shape`:
    norm ~ Gamma(D, 1/beta), D = prod(shape) (the norm's density is proportional to
    t^(D-1) e^(-beta t)), direction uniform on the sphere (a normalised standard normal).
    (mechanisms/convex.py draws the same law for model sensitivity; the layers keep agt and
    mechanisms apart, so each side has its own sampler.)"""
    d = int(np.prod(shape))
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    return (direction * rng.gamma(d, 1.0 / beta)).reshape(shape)


def jacobian_epsilon(n_classes: int, curvature: float) -> float:
    """(C - 1) ln(1 + L / curvature): the Jacobian factor's cost when the common part of the
    Hessian is >= curvature * I (curvature = N lambda + rho)."""
    return hessian_rank(n_classes) * math.log1p(HESSIAN_BOUND / curvature)


def chi_quantile(n_classes: int, delta: float) -> float:
    """q with P(chi_{C-1} > q) = delta / 2 (the union over the two changed records)."""
    return float(chi(hessian_rank(n_classes)).isf(delta / 2.0))


def gaussian_sigma(epsilon_noise: float, delta: float, n_classes: int,
                   lipschitz: float = LIPSCHITZ) -> float:
    """K (q + sqrt(q^2 + 2 eps_N)) / eps_N, rounded up: the Gaussian noise of Alg. 5 under
    replace-one (module docstring)."""
    q = chi_quantile(n_classes, delta)
    s = lipschitz * (q + math.sqrt(q * q + 2.0 * epsilon_noise)) / epsilon_noise
    return math.nextafter(s, math.inf)


@dataclass(frozen=True)
class LossPerturbation:
    """A calibrated loss perturbation for N records, C classes, d inputs and lambda, at a
    target (epsilon, delta) under replace-one (delta = 0: Alg. 4; delta > 0: Alg. 5).
    `rho`: None for the smallest sound value, else a value >= it. Invalid parameters raise
    one PrivacyError naming every problem."""

    epsilon: float
    delta: float
    n_train: int
    n_classes: int
    dim: int
    lam: float
    rho: float | None = None

    def __post_init__(self) -> None:
        p = Problems("loss perturbation", PrivacyError)
        eps, delta = self.epsilon, self.delta
        p.check(_real(eps) and eps > 0, f"epsilon must be a finite number > 0, got {eps!r}")
        p.check(_real(delta) and 0 <= delta < 1, f"delta must be in [0, 1), got {delta!r}")
        for name in ("n_train", "n_classes", "dim"):
            v = getattr(self, name)
            low = 2 if name == "n_classes" else 1
            p.check(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= low,
                    f"{name} must be an integer >= {low}, got {v!r}")
        p.check(_real(self.lam) and self.lam >= 0, f"lambda must be >= 0, got {self.lam!r}")
        p.check(self.rho is None or (_real(self.rho) and self.rho >= 0),
                f"rho must be None or a number >= 0, got {self.rho!r}")
        p.raise_if_any()
        need = self.minimum_rho()
        if self.rho is not None and self.rho < need:
            raise PrivacyError(
                f"loss perturbation: rho = {self.rho!r} is below the smallest sound value "
                f"{need!r} for eps = {eps!r} (the Jacobian factor (1 + L/(N lambda + rho))^(C-1) "
                f"must stay within e^(eps/2)); leave rho unset or raise it")
        if self.curvature() <= 0:
            raise PrivacyError("loss perturbation needs N lambda + rho > 0 (a unique minimiser)")

    # -- calibration ------------------------------------------------------------------------
    def minimum_rho(self) -> float:
        """The smallest rho of the calibration rule (module docstring), rounded up."""
        base = self.n_train * self.lam
        if base > 0 and jacobian_epsilon(self.n_classes, base) <= JACOBIAN_SHARE * self.epsilon:
            return 0.0
        share = JACOBIAN_SHARE * self.epsilon / hessian_rank(self.n_classes)
        need = HESSIAN_BOUND / math.expm1(share) - base
        return max(0.0, math.nextafter(need, math.inf))

    @property
    def rho_used(self) -> float:
        return self.minimum_rho() if self.rho is None else float(self.rho)

    def curvature(self) -> float:
        """N lambda + rho: the lower bound on the common part of the Hessian of F_D."""
        return self.n_train * self.lam + self.rho_used

    @property
    def epsilon_jacobian(self) -> float:
        return jacobian_epsilon(self.n_classes, self.curvature())

    @property
    def epsilon_noise(self) -> float:
        left = self.epsilon - self.epsilon_jacobian
        if left <= 0:           # only reachable through rounding; refuse rather than cheat
            raise PrivacyError("loss perturbation: no epsilon is left for the noise")
        return math.nextafter(left, 0.0)

    @property
    def noise_sensitivity(self) -> float:
        """2K: the replace-one bound on ||b_D(W) - b_D'(W)||_F (module docstring)."""
        return 2.0 * LIPSCHITZ

    @property
    def beta(self) -> float:
        """Alg. 4: beta = eps_N / (2K) (density ~ exp(-beta ||B||_F))."""
        return math.nextafter(self.epsilon_noise / self.noise_sensitivity, 0.0)

    @property
    def sigma(self) -> float:
        """Alg. 5: the Gaussian standard deviation (module docstring)."""
        if self.delta == 0:
            raise PrivacyError("sigma is for delta > 0 (Alg. 5)")
        return gaussian_sigma(self.epsilon_noise, self.delta, self.n_classes)

    @property
    def noise(self) -> str:
        return "laplace-norm" if self.delta == 0 else "gaussian"

    def sample(self, rng: np.random.Generator) -> NDArray[np.float64]:
        """One noise matrix B of shape (C, d)."""
        shape = (self.n_classes, self.dim)
        if self.delta == 0:
            return sample_norm_noise(shape, self.beta, rng)
        return rng.normal(0.0, self.sigma, size=shape)

    def to_json_dict(self) -> dict:
        out = {"epsilon": self.epsilon, "delta": self.delta, "relation": RELATION,
               "n_train": self.n_train, "n_classes": self.n_classes, "dim": self.dim,
               "lambda": self.lam, "rho": self.rho_used, "curvature": self.curvature(),
               "epsilon_jacobian": self.epsilon_jacobian, "epsilon_noise": self.epsilon_noise,
               "noise": self.noise, "noise_sensitivity": self.noise_sensitivity}
        out.update({"beta": self.beta} if self.delta == 0 else
                   {"sigma": self.sigma, "chi_quantile": chi_quantile(self.n_classes,
                                                                      self.delta)})
        return out


def _real(x: object) -> bool:
    return isinstance(x, (int, float, np.floating)) and not isinstance(x, bool) \
        and math.isfinite(float(x))


@dataclass(frozen=True)
class LossPerturbationResult:
    """A privately trained model: weights (C, d) and the guarantee of the whole training
    run, (epsilon, delta) under replace-one. Predictions are post-processing (no inference
    budget). `fit` reports the optimiser's gradient norm."""

    weights: NDArray[np.float64]
    calibration: LossPerturbation
    fit: ConvexFit
    seeded: bool
    seconds: float

    @property
    def epsilon(self) -> float:
        return self.calibration.epsilon

    @property
    def delta(self) -> float:
        return self.calibration.delta

    @property
    def relation(self) -> str:
        return RELATION

    def to_json_dict(self) -> dict:
        return {"mechanism": "loss-perturbation" + ("-gauss" if self.delta else ""),
                **self.calibration.to_json_dict(), "grad_norm": self.fit.grad_norm,
                "tol": self.fit.tol, "seeded": self.seeded, "seconds": self.seconds}


def train_loss_perturbation(z: ArrayLike, y: ArrayLike, n_classes: int, lam: float,
                            epsilon: float, delta: float = 0.0, *, rho: float | None = None,
                            seed: int | None = None, rng: np.random.Generator | None = None,
                            tol: float = 1e-9, w0: ArrayLike | None = None
                            ) -> LossPerturbationResult:
    """Train a loss-perturbed model that is (epsilon, delta)-DP under replace-one.

    z: (N, d) inputs in the unit ball (refused otherwise), y: labels in [0, C). The noise
    comes from `rng` if given (experiments), else from a generator seeded with `seed`
    (experiments), else from the operating system's secure source."""
    t0 = time.perf_counter()
    z_arr = np.asarray(z, dtype=np.float64)
    if z_arr.ndim != 2:
        raise PrivacyError(f"inputs must have shape (N, d), got {z_arr.shape}")
    cal = LossPerturbation(float(epsilon), float(delta), int(z_arr.shape[0]), int(n_classes),
                           int(z_arr.shape[1]), float(lam), rho)
    if rng is not None and seed is not None:
        raise PrivacyError("give seed or rng, not both")
    seeded = rng is not None or seed is not None
    if rng is None:
        rng = np.random.default_rng(secrets.randbits(128) if seed is None else seed)
    noise = cal.sample(rng)
    n = cal.n_train
    fit = fit_logistic(z_arr, y, n_classes, float(lam), linear=noise / n,
                       extra_l2=cal.rho_used / n, tol=tol, w0=w0)
    return LossPerturbationResult(fit.weights, cal, fit, seeded, time.perf_counter() - t0)
