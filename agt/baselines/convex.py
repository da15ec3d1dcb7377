"""L2-regularised multi-class logistic regression minimised to optimality, and the
sensitivity of its minimiser (van der Maaten & Hannun App. A and D; Chaudhuri, Monteleoni &
Sarwate 2011, "Differentially private empirical risk minimization", Lemma 7 and Cor. 8).

Model and objective. A linear model without a separate bias, logits a = W z with W (C, d);
inputs z in the unit ball (a bias is a coordinate of z: agt/baselines/unit_ball.py). With
l(a, y) = log sum_c exp(a_c) - a_y (the multi-class logistic loss),

    J(W; D) = (1/N) sum_i l(W z_i, y_i) + (lambda/2) ||W||_F^2 (+ <G, W> + (mu/2) ||W||_F^2,
              the optional terms loss perturbation adds: agt/baselines/loss_perturbation.py)

is lambda-strongly convex; it is minimised by L-BFGS (scipy) and, where the gradient is not
yet below the tolerance, polished by Newton steps (conjugate gradients on exact
Hessian-vector products), judged by the gradient norm. The fit *refuses* (ConvexFitError)
to return a point whose gradient norm ||grad J||_F exceeds `tol`, and reports the norm it
reached. (Run it with one BLAS thread on small problems: threadpoolctl; on a busy 2-core
machine a multi-threaded 1438 x 64 matmul was measured 80x slower than a single-threaded one.)

Constants (the no-bias, unit-ball setting; every z with ||z||_2 <= 1):
  K = sqrt(2)  the loss's gradient in the logits is g = softmax(a) - e_y; ||g||_2^2 =
               (1 - p_y)^2 + sum_{c != y} p_c^2 <= 2 (1 - p_y)^2 < 2, so ||g||_2 < sqrt(2)
               (Thm 9 of the study), and the gradient in W, g z^T, has Frobenius norm
               ||g|| ||z|| < sqrt(2).
  L = 1/2      the Hessian in the logits is diag(p) - p p^T; by Gershgorin every eigenvalue
               is at most p_i (1 - p_i) + p_i (1 - p_i) <= 1/2 (Thm 10), attained at p = (1/2,
               1/2, 0, ...); in W it is (diag(p) - p p^T) kron z z^T, also <= 1/2.
  rank C - 1   diag(p) - p p^T has the all-ones vector in its kernel (rows sum to 0), so its
               rank, and that of the Kronecker product with the rank-1 z z^T, is <= C - 1 (the
               study uses C, which is also an upper bound).

Sensitivity (replace-one: D' replaces one record (z, y) of D by (z', y'), same N). With
G = J(.; D) and g = J(.; D') - J(.; D) = (1/N)(l(W z', y') - l(W z, y)), both lambda-strongly
convex, Chaudhuri et al.'s Lemma 7 gives ||W(D) - W(D')||_F <= max_W ||grad g(W)||_F / lambda
and ||grad g||_F <= (1/N)(||g z^T|| + ||g' z'^T||) <= 2K/N, so

    ||W(D) - W(D')||_F <= 2 K / (N lambda)        (Lemma 1 of the study).

It needs the minimisers themselves; a fit stopped at ||grad J|| <= tol is within tol/lambda
of the minimiser (strong convexity: lambda ||W - W*|| <= ||grad J(W)||), on D and, by the
same stopping rule, on any neighbour, so `sensitivity_bound` adds 2 tol / lambda. With a bias
coordinate *not* scaled into the ball (||[x, 1]|| up to sqrt(2)) the bound would need K = 2;
tests/agt/baselines/test_convex.py shows the gradient of g then exceeds 2 sqrt(2)/N.

Add/remove is not covered: with D' = D plus a record, N changes and so does the weight of
every term; this module and the study compare under replace-one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import minimize
from scipy.sparse.linalg import LinearOperator, cg
from scipy.special import logsumexp, softmax

from agt.baselines.unit_ball import check_unit_ball
from agt.errors import ConfigError, DataError, SoundnessError

__all__ = ["LIPSCHITZ", "HESSIAN_BOUND", "hessian_rank", "ConvexFit", "ConvexFitError",
           "fit_logistic", "sensitivity_bound", "objective", "hessian_vector", "predict",
           "accuracy", "logit_gradient"]

LIPSCHITZ = math.sqrt(2.0)     # K: sup ||softmax(a) - e_y||_2 (not attained)
HESSIAN_BOUND = 0.5            # L: sup lambda_max(diag(p) - p p^T)
RELATION = "replace-one"


def hessian_rank(n_classes: int) -> int:
    """Rank bound of the logit Hessian diag(p) - p p^T: C - 1 (the ones vector is in its
    kernel)."""
    return int(n_classes) - 1


class ConvexFitError(SoundnessError):
    """The optimiser did not reach the gradient tolerance the sensitivity bound assumes."""


def logit_gradient(a: NDArray[np.float64], y: NDArray[np.int64]) -> NDArray[np.float64]:
    """d l / d a = softmax(a) - e_y, per row."""
    g = softmax(a, axis=1)
    g[np.arange(len(y)), y] -= 1.0
    return g


def objective(w_flat: NDArray[np.float64], z: NDArray[np.float64], y: NDArray[np.int64],
              n_classes: int, lam: float, linear: NDArray[np.float64] | None = None,
              extra_l2: float = 0.0) -> tuple[float, NDArray[np.float64]]:
    """(J(W), grad J(W) flattened) with W = w_flat.reshape(C, d) (module docstring)."""
    n, d = z.shape
    w = w_flat.reshape(n_classes, d)
    a = z @ w.T
    lse = logsumexp(a, axis=1)
    value = float(np.mean(lse - a[np.arange(n), y]))
    g = logit_gradient(a, y)
    grad = g.T @ z / n + (lam + extra_l2) * w
    value += 0.5 * (lam + extra_l2) * float(np.sum(w * w))
    if linear is not None:
        value += float(np.sum(linear * w))
        grad = grad + linear
    return value, grad.ravel()


def hessian_vector(w_flat: NDArray[np.float64], v_flat: NDArray[np.float64],
                   z: NDArray[np.float64], n_classes: int, reg: float) -> NDArray[np.float64]:
    """Hessian of J at W times V: (1/N) sum_i [(diag p_i - p_i p_i^T) V z_i] z_i^T + reg V."""
    n, d = z.shape
    w = w_flat.reshape(n_classes, d)
    v = v_flat.reshape(n_classes, d)
    p = softmax(z @ w.T, axis=1)
    av = z @ v.T
    s = p * av - p * np.sum(p * av, axis=1, keepdims=True)
    return (s.T @ z / n + reg * v).ravel()


@dataclass(frozen=True)
class ConvexFit:
    """A fitted model (owner-only: a deterministic function of the private data).

    weights: (C, d); grad_norm: ||grad J||_F at the returned point (<= tol, unless fitted
    with require_tol=False); sensitivity:
    the replace-one bound on ||W(D) - W(D')||_F, 2K/(N lambda) + 2 tol/lambda (for the
    plain objective; loss perturbation does not use it)."""

    weights: NDArray[np.float64]
    lam: float
    n_train: int
    n_classes: int
    objective: float
    grad_norm: float
    tol: float
    iterations: int
    polish_iterations: int
    seconds: float

    @property
    def sensitivity(self) -> float:
        return sensitivity_bound(self.n_train, self.lam, grad_tol=self.tol)

    def to_json_dict(self) -> dict:
        return {"lambda": self.lam, "n_train": self.n_train, "n_classes": self.n_classes,
                "objective": self.objective, "grad_norm": self.grad_norm, "tol": self.tol,
                "lbfgs_iterations": self.iterations,
                "newton_cg_iterations": self.polish_iterations, "seconds": self.seconds,
                "sensitivity": self.sensitivity, "relation": RELATION}


def sensitivity_bound(n_train: int, lam: float, *, lipschitz: float = LIPSCHITZ,
                      input_norm: float = 1.0, grad_tol: float = 0.0) -> float:
    """2 K X / (N lambda) + 2 tol / lambda: the replace-one bound on ||W(D) - W(D')||_F for
    inputs of norm <= X fitted to gradient norm <= tol (module docstring)."""
    problems = []
    if not isinstance(n_train, (int, np.integer)) or n_train < 1:
        problems.append(f"n_train must be an integer >= 1, got {n_train!r}")
    for name, v in (("lambda", lam), ("lipschitz", lipschitz), ("input_norm", input_norm)):
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            problems.append(f"{name} must be a finite number > 0, got {v!r}")
    if not isinstance(grad_tol, (int, float)) or not math.isfinite(grad_tol) or grad_tol < 0:
        problems.append(f"grad_tol must be a finite number >= 0, got {grad_tol!r}")
    if problems:
        raise ConfigError("sensitivity_bound: " + "; ".join(problems))
    bound = 2.0 * lipschitz * input_norm / (n_train * lam) + 2.0 * grad_tol / lam
    return math.nextafter(bound, math.inf)


def _check(z, y, n_classes, lam, extra_l2, tol) -> tuple[NDArray, NDArray]:
    problems = []
    if not isinstance(n_classes, (int, np.integer)) or isinstance(n_classes, bool) \
            or n_classes < 2:
        problems.append(f"n_classes must be an integer >= 2, got {n_classes!r}")
    for name, v in (("lambda", lam), ("extra_l2", extra_l2)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                or v < 0:
            problems.append(f"{name} must be a finite number >= 0, got {v!r}")
    if isinstance(lam, (int, float)) and isinstance(extra_l2, (int, float)) \
            and lam + extra_l2 <= 0:
        problems.append("lambda + extra_l2 must be > 0 (strong convexity: a unique minimiser)")
    if not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol <= 0:
        problems.append(f"tol must be a finite number > 0, got {tol!r}")
    if problems:
        raise ConfigError("fit_logistic: " + "; ".join(problems))
    z = check_unit_ball(z, "training inputs")
    y = np.asarray(y)
    if y.shape != (z.shape[0],) or y.dtype.kind not in "iu":
        raise DataError(f"labels must be integers of shape ({z.shape[0]},), got {y.shape} "
                        f"{y.dtype}")
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise DataError(f"labels must be in [0, {n_classes}), got {y.min()}..{y.max()}")
    if z.shape[0] < 1:
        raise DataError("the training set is empty")
    return z, y.astype(np.int64)


def fit_logistic(z: ArrayLike, y: ArrayLike, n_classes: int, lam: float, *,
                 linear: ArrayLike | None = None, extra_l2: float = 0.0, tol: float = 1e-9,
                 w0: ArrayLike | None = None, max_iter: int = 20_000,
                 require_tol: bool = True) -> ConvexFit:
    """Minimise J (module docstring) to ||grad J||_F <= tol; raise ConvexFitError otherwise,
    or with ``require_tol=False`` return the last iterate (its ConvexFit records the
    gradient norm reached): for solves inside a mechanism, after the spend, where a failure
    that depends on the data would itself be an output (mechanisms/loss_perturbation.py).

    z: (N, d) inputs, every row ||z|| <= 1 (refused otherwise); y: (N,) labels in [0, C).
    linear: optional (C, d) matrix G of the term <G, W>; extra_l2: optional mu of
    (mu/2)||W||^2 (both for loss perturbation). w0: starting point (default 0)."""
    z, y = _check(z, y, n_classes, lam, extra_l2, tol)
    t0 = time.perf_counter()
    n, d = z.shape
    lin = None if linear is None else np.asarray(linear, dtype=np.float64).reshape(n_classes, d)
    x0 = np.zeros(n_classes * d) if w0 is None else \
        np.asarray(w0, dtype=np.float64).reshape(-1).copy()
    if x0.shape != (n_classes * d,):
        raise ConfigError(f"w0 must have {n_classes * d} entries, got {x0.shape}")
    args = (z, y, n_classes, float(lam), lin, float(extra_l2))
    res = minimize(objective, x0, args=args, jac=True, method="L-BFGS-B",
                   options={"maxiter": max_iter, "maxcor": 30, "gtol": tol / 10.0,
                            "ftol": 1e-15, "maxls": 50})
    w = res.x
    value, grad = objective(w, *args)
    gnorm = float(np.linalg.norm(grad))
    iterations, polish = int(res.nit), 0
    if gnorm > tol:
        w, gnorm, polish = _newton_polish(w, args, z, n_classes, float(lam) + float(extra_l2),
                                          tol)
        value, grad = objective(w, *args)
    if not gnorm <= tol and require_tol:
        raise ConvexFitError(f"the logistic fit stopped at gradient norm {gnorm:.3g} > tol "
                             f"{tol:g} (lambda {lam:g}); the sensitivity bound needs the "
                             f"minimiser: raise tol or lambda")
    return ConvexFit(np.ascontiguousarray(w.reshape(n_classes, d)), float(lam), int(n),
                     int(n_classes), float(value), gnorm, float(tol), iterations, polish,
                     time.perf_counter() - t0)


def _newton_polish(w, args, z, n_classes: int, reg: float, tol: float
                   ) -> tuple[NDArray[np.float64], float, int]:
    """Newton steps with the exact Hessian (conjugate gradients on Hessian-vector products),
    judged by the gradient norm alone: near the minimiser the objective's value cannot resolve
    the progress (its rounding error exceeds the decrease), the gradient can. A step that does
    not lower the gradient norm is halved (the Hessian is >= reg I, so Newton's direction is
    one of descent for ||grad||^2 near the minimiser)."""
    size = w.size
    grad = objective(w, *args)[1]
    gnorm = float(np.linalg.norm(grad))
    steps = 0
    for steps in range(1, 51):
        if gnorm <= tol / 2.0:
            break
        op = LinearOperator((size, size), dtype=np.float64,
                            matvec=lambda v: hessian_vector(w, v, z, n_classes, reg))
        delta, _ = cg(op, -grad, rtol=1e-12, atol=0.0, maxiter=10 * size)
        t = 1.0
        for _ in range(40):
            cand = w + t * delta
            cand_grad = objective(cand, *args)[1]
            cand_norm = float(np.linalg.norm(cand_grad))
            if cand_norm < gnorm:
                break
            t *= 0.5
        else:
            break
        w, grad, gnorm = cand, cand_grad, cand_norm
    return w, gnorm, steps


def predict(weights: ArrayLike, z: ArrayLike) -> NDArray[np.int64]:
    """argmax_c (W z)_c per row (post-processing of a released model)."""
    return np.asarray(np.asarray(z) @ np.asarray(weights).T).argmax(axis=1).astype(np.int64)


def accuracy(weights: ArrayLike, z: ArrayLike, y: ArrayLike) -> float:
    y = np.asarray(y)
    if y.size == 0:
        raise DataError("cannot evaluate accuracy on an empty set")
    return float(np.mean(predict(weights, z) == y))
