"""Loss perturbation (objective perturbation) as a mechanism: van der Maaten & Hannun Alg. 4
(delta = 0) and Alg. 5 (Gaussian, delta > 0); Chaudhuri, Monteleoni & Sarwate 2011, Alg. 2;
Kifer, Smith & Thakurta 2012, Thm 2. Re-derived for replace-one, the relation the trade-off
study compares under.

Layering. The mechanism draws the perturbation B and states the guarantee; the minimisation
of the perturbed objective is training and lives in agt/baselines/loss_perturbation.py. The
owner hands the mechanism a `PerturbedObjective`: a solver W = solve(B, rho) of the objective
below on the private data (owner-only, like every input of a release) and the queries. The
release is the labels argmax_c (W_priv z)_c of the queries: post-processing of one private
model, so a *session* (one ledger entry, any number of queries).

Release. With B a random (C, d) matrix and rho >= 0,

    W_priv = argmin_W  J(W; D) + (1/N) <B, W> + (rho / (2N)) ||W||_F^2,
    J(W; D) = (1/N) sum_i l(W z_i, y_i) + (lambda/2) ||W||_F^2,   ||z_i||_2 <= 1,

l the multi-class logistic loss (gradient in the logits softmax(a) - e_y, norm < K = sqrt 2;
Hessian diag(p) - p p^T, eigenvalues <= L = 1/2, rank <= C - 1). Multiplying by N, W_priv
minimises F_D(W) + <B, W> with F_D = sum_i l_i + ((N lambda + rho)/2) ||W||^2, so
b_D(W) = -grad F_D(W) is a bijection between B and W_priv, and the density of the output is
g_D(W) = mu(b_D(W)) |det Hess F_D(W)| (change of variables, Chaudhuri et al. Thm 9).

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

Calibration for a target (eps, delta) (`calibrate`). Without rho the Jacobian costs eps_J0 =
(C - 1) ln(1 + L/(N lambda)) (the data-independent regulariser counts: N is public under
replace-one). If eps_J0 <= eps/2 (the study's split), rho = 0 and eps_N = eps - eps_J0;
otherwise eps_J = eps/2 and rho = L / (exp(eps/(2(C - 1))) - 1) - N lambda, the smallest rho with
(1 + L / (N lambda + rho))^(C-1) <= e^(eps/2). Either way the noise gets eps_N >= eps/2.
A given rho below that is refused (PrivacyError); a larger one is used (it pays less eps_J,
leaving more for the noise). The study's rule rho >= 2LC/eps always passes: (1 + L/rho)^(C-1)
<= (1 + eps/(2C))^C <= e^(eps/2).

What differs from the study's statement. (1) Its proof is for add/remove neighbours (one
record added) and needs the regulariser lambda R / N of its objective (18); with the
(lambda/2) ||W||^2 of J, N lambda changes with N. Under replace-one its constants (rho >=
2LC/eps, beta = eps/(2K)) give 1.5 eps (Jacobian eps/2, noise 2 beta K = eps), not the 2 eps of
group privacy. We calibrate to replace-one directly instead. (2) Rank C - 1 (not C) and the
exact inverse of the determinant bound: a smaller rho, equally sound. (3) Alg. 5's sigma =
(K/eps) sqrt(8 log(2/delta) + 4 eps) comes from a one-dimensional Gaussian tail, which is
right for binary GLMs (g is a scalar times z) but not for C > 2 classes: <b, s> involves the
C - 1 dimensional P B z, whose norm exceeds the 1-D quantile far more often than delta
(tests/mechanisms/test_loss_perturbation.py); we use the chi_{C-1} quantile.

Exactness. The proof assumes the exact minimiser; the solver stops at ||grad|| <= tol (1e-9 by
default), so the released point lies within tol / (lambda + rho/N) of it (the caveat of every
objective-perturbation implementation). Where the solver stops short of tol it returns its
last iterate, gradient norm g > tol and within g / (lambda + rho/N) of the minimiser (recorded
in `PerturbedSolver.fits`, owner-only), rather than raise: the solve runs after the spend, and
a failure that depends on the data would be an output the guarantee does not cover. No
configuration in the tests or the trade-off study stops short at the default tol.

The probability of a correct label has no closed form: `correct_probability` is a Monte Carlo
estimate over `estimate_draws` solves with a fixed generator (not a release, recorded nowhere).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np
from numpy.typing import NDArray

from agt.errors import DataError, PrivacyError, Problems
from mechanisms.base import Mechanism, register
from mechanisms.checks import check_params, is_real
from mechanisms.guarantee import REPLACE_ONE, Guarantee
from mechanisms.inputs import Source, check_query_ids

__all__ = ["PerturbedObjective", "LossPerturbation", "Calibration", "calibrate",
           "minimum_rho", "jacobian_epsilon", "chi_quantile", "gaussian_sigma",
           "sample_frobenius_noise", "LIPSCHITZ", "HESSIAN_BOUND", "JACOBIAN_SHARE"]

# The loss's constants (agt/baselines/convex.py proves them; mechanisms/ imports nothing of
# agt but its errors, so they are restated here and a test checks that both sides agree).
LIPSCHITZ = math.sqrt(2.0)     # K: sup ||softmax(a) - e_y||_2
HESSIAN_BOUND = 0.5            # L: sup lambda_max(diag(p) - p p^T)
JACOBIAN_SHARE = 0.5           # the study's split of eps between the Jacobian and the noise
_UNIT = 1.0 + 1e-9             # query rows may exceed norm 1 by float rounding only

Solver = Callable[[NDArray[np.float64], float], NDArray[np.float64]]


def _rank(n_classes: int) -> int:
    """Rank bound of the logit Hessian diag(p) - p p^T: C - 1 (ones vector in its kernel)."""
    return int(n_classes) - 1


def jacobian_epsilon(n_classes: int, curvature: float) -> float:
    """(C - 1) ln(1 + L / curvature): the Jacobian factor's cost when the common part of the
    Hessian is >= curvature * I (curvature = N lambda + rho), rounded up."""
    return math.nextafter(_rank(n_classes) * math.log1p(HESSIAN_BOUND / curvature), math.inf)


def minimum_rho(epsilon: float, n_classes: int, n_train: int, lam: float) -> float:
    """The smallest rho of the calibration rule (module docstring), rounded up."""
    base = n_train * lam
    if base > 0 and jacobian_epsilon(n_classes, base) <= JACOBIAN_SHARE * epsilon:
        return 0.0
    share = JACOBIAN_SHARE * epsilon / _rank(n_classes)
    if share > 700:
        # expm1 overflows near 709.8: curvature e^-700 already suffices, since its Jacobian
        # cost (C - 1) ln(1 + L e^700) < (C - 1) 700 < (C - 1) share
        need = math.exp(-700.0) - base
    else:
        need = HESSIAN_BOUND / math.expm1(share) - base
    return max(0.0, math.nextafter(need * (1 + 1e-12), math.inf))


def chi_quantile(n_classes: int, delta: float) -> float:
    """q with P(chi_{C-1} > q) = delta / 2 (the union over the two changed records)."""
    from scipy.stats import chi  # heavy; loaded only when a loss perturbation is built

    return float(chi(_rank(n_classes)).isf(delta / 2.0))


def gaussian_sigma(epsilon_noise: float, delta: float, n_classes: int) -> float:
    """K (q + sqrt(q^2 + 2 eps_N)) / eps_N, rounded up: the Gaussian noise of Alg. 5 under
    replace-one (module docstring: the positive root of eps_N s^2 - 2Kq s - 2K^2 = 0)."""
    q = chi_quantile(n_classes, delta)
    s = LIPSCHITZ * (q + math.sqrt(q * q + 2.0 * epsilon_noise)) / epsilon_noise
    return math.nextafter(s, math.inf)


def sample_frobenius_noise(shape: tuple[int, ...], beta: float, rng: np.random.Generator
                           ) -> NDArray[np.float64]:
    """One draw with density proportional to exp(-beta ||B||_F) over `shape`: norm ~
    Gamma(D, 1/beta), D = prod(shape) (its density is proportional to t^(D-1) e^(-beta t)),
    direction uniform on the sphere (a normalised standard normal)."""
    d = int(np.prod(shape))
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    return (direction * rng.gamma(d, 1.0 / beta)).reshape(shape)


@dataclass(frozen=True)
class Calibration:
    """The numbers of one calibrated loss perturbation (all data-independent: N, C, d and
    lambda are public under replace-one)."""

    epsilon: float
    delta: float
    rho: float
    curvature: float           # N lambda + rho
    epsilon_jacobian: float
    epsilon_noise: float
    beta: float | None         # Alg. 4: density ~ exp(-beta ||B||_F), beta = eps_N / (2K)
    sigma: float | None        # Alg. 5: i.i.d. N(0, sigma^2) entries

    def to_json_dict(self) -> dict:
        return dict(self.__dict__)


def calibrate(epsilon: float, delta: float, n_train: int, n_classes: int, lam: float,
              rho: float | None = None) -> Calibration:
    """Calibrate to (epsilon, delta) under replace-one (module docstring); refuses a rho
    below the smallest sound value with a PrivacyError naming it."""
    p = Problems("loss perturbation", PrivacyError)
    p.check(is_real(epsilon) and math.isfinite(epsilon) and epsilon > 0,
            f"epsilon must be a finite number > 0, got {epsilon!r}")
    p.check(is_real(delta) and 0 <= delta < 1, f"delta must be in [0, 1), got {delta!r}")
    p.check(isinstance(n_train, (int, np.integer)) and not isinstance(n_train, bool)
            and n_train >= 1, f"n_train must be an integer >= 1, got {n_train!r}")
    p.check(isinstance(n_classes, (int, np.integer)) and not isinstance(n_classes, bool)
            and n_classes >= 2, f"n_classes must be an integer >= 2, got {n_classes!r}")
    p.check(is_real(lam) and math.isfinite(lam) and lam >= 0,
            f"lambda must be a finite number >= 0, got {lam!r}")
    p.check(rho is None or (is_real(rho) and math.isfinite(rho) and rho >= 0),
            f"rho must be None or a finite number >= 0, got {rho!r}")
    p.raise_if_any()
    need = minimum_rho(float(epsilon), int(n_classes), int(n_train), float(lam))
    if rho is not None and rho < need:
        raise PrivacyError(
            f"loss perturbation: rho = {rho!r} is below the smallest sound value {need!r} for "
            f"eps = {epsilon!r}, N = {n_train}, lambda = {lam!r}, C = {n_classes} (the Jacobian "
            f"factor (1 + L/(N lambda + rho))^(C-1) must stay within e^(eps/2)); leave rho "
            f"unset or raise it (the study's 2LC/eps = {2 * HESSIAN_BOUND * n_classes / epsilon:g}"
            f" always passes)")
    rho_used = need if rho is None else float(rho)
    curvature = n_train * lam + rho_used
    if curvature <= 0:
        raise PrivacyError("loss perturbation needs N lambda + rho > 0 (a unique minimiser)")
    eps_j = jacobian_epsilon(int(n_classes), curvature)
    left = epsilon - eps_j
    if left <= 0:               # only reachable through rounding; refuse rather than cheat
        raise PrivacyError("loss perturbation: no epsilon is left for the noise")
    eps_n = math.nextafter(left, 0.0)
    beta = math.nextafter(eps_n / (2.0 * LIPSCHITZ), 0.0) if delta == 0 else None
    sigma = gaussian_sigma(eps_n, float(delta), int(n_classes)) if delta > 0 else None
    return Calibration(float(epsilon), float(delta), rho_used, curvature, eps_j, eps_n, beta,
                       sigma)


@dataclass(frozen=True, eq=False)
class PerturbedObjective:
    """What a loss-perturbation release spends (owner-only): `solve(B, rho)` returns the
    minimiser W (C, d) of the perturbed objective on the private data (module docstring;
    agt.baselines.loss_perturbation.PerturbedSolver), `queries` (Q, d) in the unit ball, and
    the public sizes N, C and lambda the calibration needs."""

    solve: Solver
    queries: NDArray[np.float64]
    n_train: int
    n_classes: int
    lam: float
    source: Source
    query_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        problems = Problems("loss perturbation inputs", DataError)
        problems.check(callable(self.solve), "solve must be callable: (B, rho) -> weights")
        x = np.asarray(self.queries, dtype=np.float64)
        if x.ndim != 2 or not np.isfinite(x).all():
            problems.add(f"queries must be a finite (Q, d) array, got shape {x.shape}")
        elif x.size and np.linalg.norm(x, axis=1).max() > _UNIT:
            problems.add(f"every query must have ||z||_2 <= 1 (as the training inputs), the "
                         f"largest has {np.linalg.norm(x, axis=1).max():.6g}; map the features "
                         f"with agt.baselines.unit_ball.UnitBallMap")
        problems.check(isinstance(self.n_train, (int, np.integer)) and self.n_train >= 1,
                       f"n_train must be an integer >= 1, got {self.n_train!r}")
        problems.check(isinstance(self.n_classes, (int, np.integer)) and self.n_classes >= 2,
                       f"n_classes must be an integer >= 2, got {self.n_classes!r}")
        problems.check(is_real(self.lam) and math.isfinite(self.lam) and self.lam >= 0,
                       f"lambda must be a finite number >= 0, got {self.lam!r}")
        problems.check(isinstance(self.source, Source), "source must be a mechanisms.Source")
        check_query_ids(self.query_ids, x.shape[0] if x.ndim == 2 else None, problems)
        problems.raise_if_any()
        object.__setattr__(self, "queries", x)

    @property
    def n_queries(self) -> int:
        return int(self.queries.shape[0])

    @property
    def dim(self) -> int:
        return int(self.queries.shape[1])

    def subset(self, index) -> "PerturbedObjective":
        ids = None if self.query_ids is None else tuple(np.asarray(self.query_ids)[index])
        return PerturbedObjective(self.solve, self.queries[index], self.n_train,
                                  self.n_classes, self.lam, self.source, ids)


@dataclass(frozen=True)
class LossPerturbation(Mechanism):
    """Alg. 4 (gaussian=False, eps-DP) / Alg. 5 (gaussian=True, (eps, delta)-DP) under
    replace-one: one private model per release, its labels for every query (a session).
    `rho`: None for the smallest sound value per inputs, else a value >= it (checked against
    the inputs' N, lambda and C: a smaller one is refused)."""

    epsilon: float
    delta: float | None = None
    gaussian: bool = False
    rho: float | None = None

    input_type = PerturbedObjective
    per_query = False
    estimate_draws = 16

    def __post_init__(self) -> None:
        check_params(self.name, self.epsilon, self.delta, self.gaussian)
        if self.rho is not None and not (is_real(self.rho) and math.isfinite(self.rho)
                                         and self.rho >= 0):
            raise PrivacyError(f"{self.name}: rho must be None or a finite number >= 0, got "
                               f"{self.rho!r}")

    @property
    def name(self) -> str:
        return "loss-pert-gauss" if self.gaussian else "loss-pert"

    def relations(self, inputs) -> tuple[str, ...]:
        # the proof above is for replace-one whatever the source says (N stays fixed)
        return (REPLACE_ONE,)

    def calibration(self, inputs: PerturbedObjective) -> Calibration:
        return calibrate(float(self.epsilon), float(self.delta or 0.0), int(inputs.n_train),
                         int(inputs.n_classes), float(inputs.lam), self.rho)

    def check(self, inputs) -> None:
        super().check(inputs)
        self.calibration(inputs)            # refuses a rho below the sound minimum

    def guarantee(self, relation: str) -> Guarantee:
        if relation != REPLACE_ONE:
            raise PrivacyError(f"{self.name} is proven under replace-one only, not {relation}")
        alg = ("Alg. 5: Gaussian B, sigma from the chi_{C-1} tail" if self.gaussian else
               "Alg. 4: B with density ~ exp(-beta ||B||_F), beta = eps_N / (2K)")
        return Guarantee(float(self.epsilon), float(self.delta or 0.0), relation, self.name,
                         f"loss perturbation (van der Maaten-Hannun {alg}; rho from "
                         f"(1 + L/(N lambda + rho))^(C-1) <= e^(eps/2), re-derived for "
                         f"replace-one): one private model, labels are post-processing")

    def sample(self, inputs: PerturbedObjective, rng: np.random.Generator
               ) -> NDArray[np.float64]:
        """One perturbation matrix B (C, d) for these inputs."""
        cal = self.calibration(inputs)
        shape = (int(inputs.n_classes), inputs.dim)
        if cal.sigma is None:
            return sample_frobenius_noise(shape, cal.beta, rng)
        return rng.normal(0.0, cal.sigma, size=shape)

    def _weights(self, inputs: PerturbedObjective, rng) -> NDArray[np.float64]:
        cal = self.calibration(inputs)
        w = np.asarray(inputs.solve(self.sample(inputs, rng), cal.rho), dtype=np.float64)
        if w.shape != (inputs.n_classes, inputs.dim) or not np.isfinite(w).all():
            raise DataError(f"{self.name}: the solver returned weights of shape {w.shape} "
                            f"(expected finite ({inputs.n_classes}, {inputs.dim}))")
        return w

    def _draw(self, inputs: PerturbedObjective, rng):
        return (inputs.queries @ self._weights(inputs, rng).T).argmax(axis=1)

    def _correct(self, inputs: PerturbedObjective, y):
        rng = np.random.default_rng(20240618)     # a fixed estimator, not a release
        hits = np.zeros(inputs.n_queries)
        for _ in range(self.estimate_draws):
            hits += self._draw(inputs, rng) == y
        return hits / self.estimate_draws


register("loss-pert", inputs=PerturbedObjective, needs_delta=False,
         summary="loss perturbation: one privately trained linear model, eps-DP (a session)")(
    partial(LossPerturbation, gaussian=False))
register("loss-pert-gauss", inputs=PerturbedObjective, needs_delta=True,
         summary="loss perturbation, Gaussian noise, (eps, delta) (a session)")(
    partial(LossPerturbation, gaussian=True))
