"""Releases from a linear model trained to optimality on an L2-regularised convex loss
(van der Maaten & Hannun, "The trade-offs of private prediction", App. B.1 and C.1).

Input: `LinearModel` -- the weights W (C x d) of a multi-class linear model minimising
J(W) = (1/N) sum_i l(W; x_i, y_i) + (lambda/2) ||W||_F^2 with a K-Lipschitz loss and inputs
||x||_2 <= 1, the queries X (Q x d, each row ||x||_2 <= 1, a bias coordinate included if
the model has one) and `sensitivity`, a bound on ||W(D) - W(D')||_F over neighbouring
datasets (2K / (N lambda) for replace-one, Chaudhuri-Monteleoni-Sarwate 2011, Cor. 8 in
their notation; agt/baselines/convex.py fits W and computes it). Everything in it is
owner-only; the logits z = W x of a query move by at most ||W - W'||_F ||x||_2 <= sensitivity.
Every mechanism here states its guarantee under replace-one only, whatever relations the
source claims: the sensitivity keeps N fixed (removing a record would need 2K/((N-1) lambda)).

model-sens (Alg. 1): release labels argmax((W + B) x) with p(B) ~ exp(-beta ||B||_F),
  beta = eps / sensitivity: the noisy model is eps-DP (the density ratio at any B is at most
  exp(beta ||W - W'||_F) <= e^eps, Lemma 1 of the study), and its labels for any number of
  queries are post-processing. One release = one noisy model = one ledger entry (a session).
  Sampling in d = C x d dimensions: ||B|| ~ Gamma(d, 1/beta) (the density of the norm is
  proportional to t^(d-1) e^(-beta t)), direction uniform on the sphere.
model-sens-gauss (Alg. 3): B with i.i.d. N(0, sigma^2) entries, sigma the smallest value
  for which the Gaussian mechanism of L2 sensitivity `sensitivity` is (eps, delta)-DP by the
  exact condition of Balle & Wang 2018, Thm 8 (the analytic Gaussian mechanism):
      Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D) <= delta,
  solved by bisection and rounded up. A session, like model-sens.
pred-sens (Alg. 6): per query, argmax(z + b) with p(b) ~ exp(-beta ||b||_2) in C dimensions,
  beta = eps / (sensitivity max_i ||x_i||): eps-DP per query; the ledger composes the B
  queries of a budget (the study's beta = N lambda eps / (2 K B) is this with eps / B per
  query under standard composition).
pred-sens-gauss (Alg. 7): per query, z + N(0, sigma^2 I) with sigma of the analytic Gaussian
  mechanism for L2 sensitivity `sensitivity max ||x||` at (eps, delta) per query; the ledger
  composes.
The probability of a correct label has no closed form for these; `correct_probability`
estimates it with a fixed number of Monte-Carlo draws from a fixed generator
(`estimate_draws`), not a release and recorded nowhere: experiments report it as an estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from agt.errors import DataError, PrivacyError, Problems
from mechanisms.base import Mechanism, register
from mechanisms.checks import check_delta, check_epsilon, check_params, privacy_problems
from mechanisms.guarantee import REPLACE_ONE, Guarantee
from mechanisms.inputs import Source, check_query_ids

if TYPE_CHECKING:      # annotations only: the exact checks import it when they run
    import mpmath

__all__ = ["LinearModel", "analytic_gaussian_sigma", "gaussian_delta", "sample_norm_noise"]

_UNIT = 1.0 + 1e-9          # rows may exceed norm 1 by float rounding only


@dataclass(frozen=True, eq=False)
class LinearModel:
    """A linear model's weights and the queries to label (owner-only; module docstring)."""

    weights: NDArray[np.float64]
    queries: NDArray[np.float64]
    sensitivity: float
    n_classes: int
    source: Source
    query_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        problems = Problems("linear model inputs", DataError)
        w = np.asarray(self.weights, dtype=np.float64)
        x = np.asarray(self.queries, dtype=np.float64)
        if w.ndim != 2 or x.ndim != 2 or w.shape[1] != x.shape[1]:
            problems.add(f"weights (C, d) and queries (Q, d) must agree, got {w.shape} and "
                         f"{x.shape}")
        elif w.shape[0] not in (1, self.n_classes):
            problems.add(f"weights have {w.shape[0]} rows for {self.n_classes} classes")
        if not (np.isfinite(w).all() and np.isfinite(x).all()):
            problems.add("weights and queries must be finite")
        elif x.ndim == 2 and x.size and np.linalg.norm(x, axis=1).max() > _UNIT:
            problems.add(f"every query must have ||x||_2 <= 1 (the sensitivity bound assumes "
                         f"it), the largest has {np.linalg.norm(x, axis=1).max():.6g}; scale the "
                         f"features as the model was trained")
        s = self.sensitivity
        problems.check(isinstance(s, (int, float)) and math.isfinite(s) and s > 0,
                       f"sensitivity must be a finite number > 0, got {s!r}")
        problems.check(isinstance(self.n_classes, (int, np.integer)) and self.n_classes >= 2,
                       f"n_classes must be an integer >= 2, got {self.n_classes!r}")
        problems.check(isinstance(self.source, Source), "source must be a mechanisms.Source")
        check_query_ids(self.query_ids, x.shape[0] if x.ndim == 2 else None, problems)
        problems.raise_if_any()
        object.__setattr__(self, "weights", w)
        object.__setattr__(self, "queries", x)

    @property
    def n_queries(self) -> int:
        return int(self.queries.shape[0])

    @property
    def logits(self) -> NDArray[np.float64]:
        return self.queries @ self.weights.T

    @property
    def answer(self) -> NDArray[np.int64]:
        z = self.logits
        return (z[:, 0] > 0).astype(np.int64) if z.shape[1] == 1 else z.argmax(axis=1)

    @property
    def logit_sensitivity(self) -> float:
        """Bound on ||z(D) - z(D')||_2 for every query: sensitivity x max ||x||."""
        norm = float(np.linalg.norm(self.queries, axis=1).max(initial=0.0))
        return self.sensitivity * max(norm, 1e-300)

    def subset(self, index) -> "LinearModel":
        ids = None if self.query_ids is None else tuple(np.asarray(self.query_ids)[index])
        return LinearModel(self.weights, self.queries[index], self.sensitivity, self.n_classes,
                           self.source, ids)


# ---------------------------------------------------------------------------------------------
# Noise and calibration

def sample_norm_noise(m: int, d: int, beta: float, rng: np.random.Generator
                      ) -> NDArray[np.float64]:
    """m draws in d dimensions with density proportional to exp(-beta ||b||_2): the norm is
    Gamma(d, 1/beta) (its density is proportional to t^(d-1) e^(-beta t)), the direction
    uniform on the sphere (a normalised standard normal)."""
    direction = rng.standard_normal((m, d))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    return direction * rng.gamma(d, 1.0 / beta, size=(m, 1))


def gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """The exact delta of the Gaussian mechanism (Balle & Wang 2018, Thm 8):
    Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D)."""
    from scipy.special import log_ndtr, ndtr  # heavy; loaded only when calibrating

    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return float(ndtr(a - b) - math.exp(min(epsilon + float(log_ndtr(-a - b)), 700.0)))


def analytic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """The smallest sigma (rounded up) with gaussian_delta(sigma) <= delta."""
    problems = privacy_problems()
    check_epsilon(epsilon, problems)
    check_delta(delta, problems)
    problems.raise_if_any()
    lo, hi = 1e-12 * sensitivity, sensitivity
    while gaussian_delta(hi, sensitivity, epsilon) > delta:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if gaussian_delta(mid, sensitivity, epsilon) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    # The float formula cancels at small eps (an adversarial review found the returned sigma
    # over delta by up to 1.9e-4 relative at eps ~ 1e-6, and without bound below): accept
    # sigma only once the exact delta, evaluated with enough digits to resolve it, fits.
    sigma, step = math.nextafter(hi, math.inf), 1e-9
    while _gaussian_delta_exact(sigma, sensitivity, epsilon, delta) > delta:
        sigma, step = sigma * (1.0 + step), 2.0 * step
    return sigma


def _gaussian_delta_exact(sigma: float, sensitivity: float, epsilon: float,
                          delta: float) -> "mpmath.mpf":
    """`gaussian_delta` in decimal arithmetic with 40 digits beyond delta's magnitude."""
    import mpmath

    digits = 40 + int(max(0.0, -math.log10(delta)))
    with mpmath.workdps(digits):
        s, d, e = mpmath.mpf(sigma), mpmath.mpf(sensitivity), mpmath.mpf(epsilon)
        a, b = d / (2 * s), e * s / d
        return mpmath.ncdf(a - b) - mpmath.exp(e) * mpmath.ncdf(-a - b)


def _labels(z: NDArray[np.float64]) -> NDArray[np.int64]:
    return (z[..., 0] > 0).astype(np.int64) if z.shape[-1] == 1 else z.argmax(axis=-1)


# ---------------------------------------------------------------------------------------------
# Mechanisms

def _replace_one_only(name: str, relation: str) -> None:
    if relation != REPLACE_ONE:
        raise PrivacyError(f"{name}: the sensitivity 2K / (N lambda) is proven under "
                           f"replace-one only, not {relation}")


@dataclass(frozen=True)
class _Convex(Mechanism):
    epsilon: float
    delta: float | None = None
    gaussian: bool = False

    input_type = LinearModel
    relation_free = False
    estimate_draws = 2000

    def __post_init__(self) -> None:
        check_params(self.name, self.epsilon, self.delta, self.gaussian)

    def _correct(self, inputs: LinearModel, y):
        rng = np.random.default_rng(20240617)     # a fixed estimator, not a release
        hits = np.zeros(inputs.n_queries)
        per = max(1, (1 << 22) // max(1, inputs.n_queries * inputs.weights.size))
        done = 0
        while done < self.estimate_draws:
            n = min(per, self.estimate_draws - done)
            hits += (self._sample_labels(inputs, rng, n) == y[None, :]).sum(axis=0)
            done += n
        return hits / self.estimate_draws

    def _draw(self, inputs: LinearModel, rng):
        return self._sample_labels(inputs, rng, 1)[0]

    def _noise_sensitivity(self, inputs: LinearModel) -> float:
        raise NotImplementedError

    def relations(self, inputs) -> tuple[str, ...]:
        # `sensitivity` is the replace-one bound 2K / (N lambda) (N fixed; agt/baselines/
        # convex.py), whatever relations the source claims: removing a record would need
        # 2K / ((N - 1) lambda), so an add-remove claim would understate eps by N / (N - 1)
        return (REPLACE_ONE,)

    def check(self, inputs) -> None:
        """The base checks, and a noise scale sensitivity / eps inside [1e-300, 1e300]: beyond
        it the rate eps / sensitivity under- or overflows (a review found a ZeroDivisionError
        after the spend, and infinite noise returning labels, at sensitivity 1e19-1e25)."""
        super().check(inputs)
        ratio = self._noise_sensitivity(inputs) / self.epsilon
        if not 1e-300 <= ratio <= 1e300:
            raise PrivacyError(f"{self.name}: the noise scale sensitivity / eps lies outside "
                               f"[1e-300, 1e300], beyond the float range of the noise; check the "
                               f"sensitivity and epsilon")


@dataclass(frozen=True)
class ModelSensitivity(_Convex):
    """Alg. 1 / Alg. 3: one noisy model per release (module docstring)."""

    per_query = False

    @property
    def name(self) -> str:
        return "model-sens-gauss" if self.gaussian else "model-sens"

    def guarantee(self, relation: str) -> Guarantee:
        _replace_one_only(self.name, relation)
        noise = ("Gaussian noise of the analytic Gaussian mechanism (Balle-Wang Thm 8)"
                 if self.gaussian else "noise with density ~ exp(-beta ||B||_F), beta = "
                 "eps / sensitivity")
        return Guarantee(float(self.epsilon), float(self.delta or 0.0), relation, self.name,
                         f"model sensitivity (van der Maaten-Hannun Alg. "
                         f"{3 if self.gaussian else 1}"
                         f"): the weights plus {noise}; labels of every query are "
                         f"post-processing of one noisy model")

    def _noise_sensitivity(self, inputs: LinearModel) -> float:
        return inputs.sensitivity

    def _sample_labels(self, inputs: LinearModel, rng, n: int):
        w = inputs.weights
        if self.gaussian:
            sigma = analytic_gaussian_sigma(inputs.sensitivity, self.epsilon, self.delta)
            noise = rng.normal(0.0, sigma, size=(n,) + w.shape)
        else:
            noise = sample_norm_noise(n, w.size, self.epsilon / inputs.sensitivity, rng)
            noise = noise.reshape((n,) + w.shape)
        z = np.einsum("qd,ncd->nqc", inputs.queries, w[None] + noise)
        return _labels(z)


@dataclass(frozen=True)
class PredictionSensitivity(_Convex):
    """Alg. 6 / Alg. 7: noise on each query's logits, per query (module docstring)."""

    @property
    def name(self) -> str:
        return "pred-sens-gauss" if self.gaussian else "pred-sens"

    def guarantee(self, relation: str) -> Guarantee:
        _replace_one_only(self.name, relation)
        noise = ("N(0, sigma^2 I), the analytic Gaussian mechanism" if self.gaussian else
                 "noise with density ~ exp(-beta ||b||_2), beta = eps / (sensitivity max||x||)")
        return Guarantee(float(self.epsilon), float(self.delta or 0.0), relation, self.name,
                         f"prediction sensitivity (van der Maaten-Hannun Alg. "
                         f"{7 if self.gaussian else 6}): the query's logits plus {noise}, per "
                         f"query")

    def _noise_sensitivity(self, inputs: LinearModel) -> float:
        return inputs.logit_sensitivity

    def _sample_labels(self, inputs: LinearModel, rng, n: int):
        z = inputs.logits
        if self.gaussian:
            sigma = analytic_gaussian_sigma(inputs.logit_sensitivity, self.epsilon, self.delta)
            noise = rng.normal(0.0, sigma, size=(n,) + z.shape)
        else:
            noise = sample_norm_noise(n * z.shape[0], z.shape[1],
                                      self.epsilon / inputs.logit_sensitivity, rng)
            noise = noise.reshape((n,) + z.shape)
        return _labels(z[None] + noise)


register("model-sens", inputs=LinearModel, needs_delta=False,
         summary="model sensitivity: one noisy linear model per release, eps-DP (a session)")(
    partial(ModelSensitivity, gaussian=False))
register("model-sens-gauss", inputs=LinearModel, needs_delta=True,
         summary="model sensitivity, analytic Gaussian noise, (eps, delta) (a session)")(
    partial(ModelSensitivity, gaussian=True))
register("pred-sens", inputs=LinearModel, needs_delta=False,
         summary="prediction sensitivity: noise on each query's logits, eps-DP per query")(
    partial(PredictionSensitivity, gaussian=False))
register("pred-sens-gauss", inputs=LinearModel, needs_delta=True,
         summary="prediction sensitivity, analytic Gaussian noise, (eps, delta) per query")(
    partial(PredictionSensitivity, gaussian=True))
