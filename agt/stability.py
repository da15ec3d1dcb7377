"""L2 stability balls (bound method "stability"): parameter certificates that grow linearly,
not exponentially, with the number of gradient steps, for a linear model trained by
gradient descent, full-batch or on minibatches.

Setting (checked by `agt.config`): the model is one trainable linear layer (logits
a = W x + b, no frozen prefix), loss cross_entropy or binary_cross_entropy, optimizer sgd
without momentum (L2 allowed), any batch size (agt/training.py cuts each epoch's
data-independent permutation of the record indices into consecutive batches), and a
*declared input domain* ``input_norm_bound`` R: every record of every dataset in the
relation, as the training dtype holds it, has ||x||_2 <= R (the training data are checked
exactly). ``clip_gamma >= max(R, 1)`` (R without a bias) makes the clamp provably inactive: an
exact per-sample gradient entry is g_c x~_j with |g_c| < 1 and |x~_j| <= R (x~ = (x, 1)
with a bias), so step t is exact gradient descent on the batch objective
F_t(theta) = (1/b_t) sum_{i in B_t} l(theta; z_i) + (l2/2) ||theta||^2.

Certificate. For every dataset D'' that replaces at most k records of D, the parameters
the float training rule computes on D'' lie in the Frobenius ball B(theta_T(D), rho_k)
around the served parameters. Derivation (Hardt, Recht & Singer 2016, "Train faster,
generalize better", Lemmas 3.6-3.7 and their SGD argument, made float-sound). Replacing
records keeps every index in its batch slot, so the batch B_t(D'') differs from B_t(D) in
the m_t replaced records it holds; every index appears once per epoch, so the m_t of one
epoch sum to at most k. With d_t = theta_t(D'') - theta_t(D) and
Phi_t(theta) = theta - lr_t grad F_t(theta) the exact step on D's batch,

    d_{t+1} = [Phi_t(theta'') - Phi_t(theta)]                       (expansion)
            + lr_t [grad F_t - grad F_t''](theta'')                 (replaced records)
            + (float error of the step on D'') - (that on D).

* Expansion: Phi_t(a) - Phi_t(b) = (I - lr (Hbar + l2 I)) (a - b), Hbar the Hessian of the
  batch's data term averaged over the segment [b, a]: symmetric with 0 <= Hbar <=
  h lambda_max(X~_B^T X~_B / b_t), h = 1/2 for cross-entropy (diag(p) - p p^T <= 1/2,
  agt/baselines/convex.py) and 1/4 for the logistic loss. So ||.|| <= L_t ||d_t||,
  L_t = max(|1 - lr l2|, |1 - lr (beta + l2)|) for any beta >= h lambda_max: <= 1 when
  lr (beta + l2) <= 2.
* Replaced records: each one in the batch contributes lr/b_t ||g(z'') x~''^T - g(z_i)
  x~_i^T|| <= c_t = 2 M lr_t / b_t, M = G R~ (without clipping), G = sqrt(2)
  (cross-entropy: ||softmax - e_y|| < sqrt 2) or 1 (logistic), R~ = sqrt(R'^2 + 1)
  (R' = R (1 + 2u): the records as the training dtype rounds them).
* Float error: `step_float_error` bounds, for any in-domain batch and any parameters of
  Frobenius norm <= N, the distance of the float step (agt/training.py's nominal rule) from
  the exact step; every operation is charged with Higham's gamma bounds and the engine's
  one transcendental assumption (agt/bounded/losses.py). With ``k_boxes: ball`` (no
  interval pass) the nominal rule computes the logits, per-sample gradients and their mean
  in float64 from the dtype parameters and records, and rounds the mean once to the dtype
  (``compute64``): in float32 that removes most of this term (the softmax slack and the
  65-term dot products at float32's u were most of it), which the nesting argument charges
  once per unit of k.
* Per-record clipping (config ``clip_norm`` C). The nominal rule then trains on a clipped
  loss psi_a(z) per record, a = min(1, C / (G ||x~||)) (`clip_floors`), whose logit
  gradient is
    logistic:       clip(sigmoid(z) - y, -a, a);
    cross-entropy:  softmax(z) - e_y while softmax_y(z) >= 1 - a, else the true class's
                    probability held at 1 - a and the rest a softmax_{-y}(z) (softmax over
                    the other logits): (a softmax_{-y}(z), -a at y).
  Every entry of such a per-sample gradient is at most its norm (<= C, below) and at most
  R* = max(R, 1) with a bias (R without), so ``clip_gamma >= min(C, R*)`` keeps the clamp
  inactive. Both are gradients of convex functions with the curvature bound h of the
  unclipped loss.
  Cross-entropy: psi_a = (f* + indicator{p_y >= 1 - a})* with f* the negative entropy on
  e_y-shifted probability vectors; its gradient is the maximiser over that set of
  <p, z> + H(p), the two cases above, and f* is 2-strongly convex in L2 on the simplex
  (v^T diag(1/p) v >= ||v||_1^2 >= 2 ||v||_2^2 for sum v = 0), so psi_a is 1/2-smooth.
  Logistic: psi_a' = clip(sigmoid - y) is nondecreasing and 1/4-Lipschitz. A convex
  function with an h-Lipschitz logit gradient makes the batch data term convex and
  h lambda_max(X~^T X~ / b)-smooth (sum the quadratic upper bounds), which is all the
  expansion bound (co-coercivity) and the nesting argument use. Its gradient norm is
  ||g|| ||x~|| <= G a ||x~|| <= C (||g||^2 <= (1 - p'_y)^2 + (sum_{j != y} p'_j)^2 <= 2 a^2
  for cross-entropy), so M = min(G R~, C) replaces G R~ in c_t and in Npub_t. For two
  logits and for the logistic loss the rule is exactly DP-SGD's projection of the record's
  gradient onto the C-ball; for more classes it clips harder (||g|| <= sqrt 2 (1 - p_y)),
  and the projection itself would not do: the projected cross-entropy field's Jacobian is
  not symmetric, so it is no gradient step. Float error: the exact clipped gradient at the
  float logits is h-Lipschitz, so dz carries over as before; at those logits each entry of
  the float result (softmax outputs within tau, a within eps_a = gamma64(d~ + 10), one
  rounding to the arithmetic's precision u: the dtype's, or float64's under ``compute64``)
  is within 2 tau + 2 eps_a + 2 u of the exact one whichever branch
  each side takes (near the switch both branches nearly agree: p_j = (1 - p_y) q_j), and
  the float gradient's norm is <= (min(G R~, C) + ||dg|| R~)(1 + u), u as before.

beta: lambda_max(X~^T X~ / b) <= ||X~^T X~||_{S4} / b (the Schatten-4 norm,
(sum lambda^4)^(1/4), computed as ||A^2||_F^(1/2) with a-priori rounding bounds on the
smaller of X~^T X~ and X~ X~^T: `gram_eigen_bound`); it is within 1 % of lambda_max on
scikit-learn digits and on an IMDB-like 768-d head.

Recursion (every k of the grid; N_t = ||theta_t(D)|| the served run's norm; beta_t the
bound of D's batch t), for a placement m (m_t >= 0, at most k per epoch; more than b_t in
one batch is allowed, which only over-counts):

    beta_tk  = beta_t + k h R~^2 (1 + s) / b_t + k s h R~^2
    A_0 = 0,  A_{t+1} = (L_t(beta_tk) A_t + c_t m_t
                         + k 2 eps_t(N_t + (1 + s) A_t + k xi_t)) (1 + 1e-12)
    rho_k    = (1 + s) max_m A_T(m) + k xi_T,       xi_t = s (Npub_t + 1),   s = 1e-9,

Npub_t a public bound on the parameter norm of any in-domain run (`public_norm_bounds`).
A_{t+1} is nondecreasing in A_t and in m_t, so the maximum over placements is exact by
dynamic programming over "records placed so far in this epoch" (the larger A_t dominates
for the same count); with ``batch_size: full`` every epoch is one step and the recursion
is A_{t+1} = L_t A_t + c_t k + k 2 eps_t. Validity: by induction ||d_t|| <= A_t(m) for the
placement m of D'' (the two float errors are each <= eps_t at the norms N_t and N_t + A_t,
and 2 eps <= 2 k eps for k >= 1). k = 0 is the served point.

Nesting (what r(D') >= r(D) - 1 needs, docs/design.md): B(theta(D'), rho_{k-1}(D')) lies inside
B(theta(D), rho_k(D)) with room xi_T to spare, for D' a neighbour of D (record i replaced).
For a placement m' of k - 1 records, m' + e_i (e_i: record i in its batch of every epoch)
places k records, and by induction on t A_t(k-1, m'; D') + ||theta_t(D') - theta_t(D)||
<= A_t(k, m' + e_i; D): beta_t(D') <= beta_t(D) + h R~^2 / b_t (the S4 norm is a norm and
monotone on PSD matrices: removing a record cannot increase it, adding one adds at most
R~^2 / b_t), so L_t(D', k-1) <= L_t(D, k); N_t(D') <= N_t(D) + A_t(1; D) makes every eps
argument of D' at k-1 at most that of D at k; the replaced-record terms add up exactly
(c_t m'_t + c_t (e_i)_t); the maximum over m' on the left is then at most the maximum over
placements of k on the right. The relative slack s and the per-unit-k slack xi absorb the
float64 rounding of the recursion (1e-12 relative per step), of the norms and of beta
(a gamma_m of float64 sums of m <= max(n, P) terms each, P the parameter count: below s/10
while max(n, P) <= MAX_TERMS, about 9e5, which `StabilityProblem.build` checks) and the
rounding of the certifier's margin at the centre (agt/certify/certifier.py,
`Certifier._ball_certified`), whose test is then isotone under this inclusion. Add-remove
is not covered (the divisor b_t and the batch slots change): stability bundles certify
replace-one only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from agt.bounded.losses import transcendental_slack
from agt.errors import DataError
from agt.interval import BOUND_DTYPE, FloatModel, Interval, gamma
from agt.tensors import overflow_limit, torch_dtype

#: sup of lambda_max of the loss Hessian in the logits
HESSIAN_BOUND = {"cross_entropy": 0.5, "binary_cross_entropy": 0.25}
#: sup of ||dL/dz||_2 over logits and labels (not attained)
LOGIT_GRADIENT_BOUND = {"cross_entropy": math.sqrt(2.0), "binary_cross_entropy": 1.0}
SLACK = 1e-9
#: the longest float64 sum (records, parameters) whose rounding gamma_m stays below SLACK / 10
MAX_TERMS = int(SLACK / 10 / 2.0**-53 * (1 - 1e-6)) - 2
_U64 = 2.0**-53
_UP = 1.0 + 1e-12


def padded_norm_bound(norm: float, bias: bool, unit_roundoff: float) -> float:
    """R~ = sqrt((R (1 + 2u))^2 + bias): the norm of (x, 1) for a record of norm <= R after
    rounding to the training dtype."""
    r = norm * (1.0 + 2.0 * unit_roundoff)
    return math.sqrt(r * r + (1.0 if bias else 0.0)) * _UP


def check_domain(x: np.ndarray, norm: float, what: str = "training record") -> None:
    """Every row of ``x`` (n, ...), the records exactly as the training dtype holds them,
    must have L2 norm <= ``norm`` (the declared domain). Decided exactly: rows whose float64
    squared norm is not clearly inside are summed again in rational arithmetic, so a record
    on the boundary (e.g. 64 pixels of value 1 with R = 8) is accepted and none outside is."""
    flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    sq = np.einsum("ij,ij->i", flat, flat)
    limit = Fraction(norm) ** 2
    # the float filter is exact enough only while R^2 is a normal float far from underflow
    # and overflow; otherwise every record is decided exactly
    near = (sq > norm * norm * (1.0 - 1e-9) if 1e-290 < norm * norm < 1e290
            else np.ones(len(flat), bool))
    for i in np.nonzero(near)[0]:
        if sum(Fraction(float(v)) ** 2 for v in flat[i]) > limit:
            raise DataError(f"{what} {int(i)} has L2 norm {math.sqrt(sq[i]):.10g} > "
                            f"input_norm_bound {norm:g} (checked exactly, on the values the "
                            f"training dtype holds); scale the features or raise "
                            f"input_norm_bound, e.g. by 1e-6 for features normalised to norm "
                            f"{norm:g} in float arithmetic (bound_method: stability needs every "
                            f"record inside it)")


def gram_eigen_bound(x: torch.Tensor, bias: bool) -> float:
    """A rigorous upper bound on lambda_max(X~^T X~ / n) for exact float64 data x (n, d).

    ||A||_{S4} = ||A^2||_F^(1/2) >= lambda_max(A) for symmetric A. X~^T X~ and X~ X~^T share
    their nonzero eigenvalues, so the smaller one (m x m, m = min(n, d~); the other
    dimension p is the inner one) is formed. With G^ its float64 value (mirrored from the
    upper triangle, so exactly symmetric), |G^ - G| <= gamma_p |X~||X~|^T (or |X~|^T|X~|)
    entrywise, whose Frobenius norm is <= gamma_p sum_i ||x~_i||^2; with C^ the float64
    product G^ G^, |C^ - G^^2| <= gamma_m |G^|^2. So
    ||G||_{S4} <= (||C^||_F + gamma_m || |G^| ||_F^2)^(1/2) + gamma_p sum_i ||x~_i||^2."""
    x = x.to(torch.float64).reshape(x.shape[0], -1)
    if bias:
        x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], dim=1)
    n, d = x.shape
    gram, m, inner = (x @ x.T, n, d) if n < d else (x.T @ x, d, n)
    gram = torch.triu(gram) + torch.triu(gram, 1).T
    sq_norms = float((x * x).sum()) * (1.0 + gamma(n * d + 2, _U64))
    err_gram = gamma(inner + 2, _U64) * sq_norms
    square = gram @ gram
    fro_square = float(torch.linalg.norm(square)) * (1.0 + gamma(m * m + 4, _U64))
    fro_abs = float(torch.linalg.norm(gram)) * (1.0 + gamma(m * m + 4, _U64))
    s4 = math.sqrt((fro_square + gamma(m + 2, _U64) * fro_abs * fro_abs) * _UP) * _UP
    return (s4 + err_gram) * _UP / n * _UP


@dataclass(frozen=True)
class StabilityStep:
    """What the recursion needs of one training step t of the served run on D."""

    epoch: int
    lr: float                   # the learning rate the nominal rule used
    batch_size: int             # b_t
    beta: float                 # h lambda_max bound of the batch's data Hessian (on D)
    norm: float                 # >= ||theta_t(D)||_F before the step


@dataclass(frozen=True)
class StabilityProblem:
    """The constants of the recursion (module docstring)."""

    loss: str
    n_logits: int
    in_features: int
    bias: bool
    l2: float
    padded_norm: float          # R~
    fm: FloatModel
    clip_norm: float | None = None     # C: per-record clipped losses, gradient norm <= C
    compute64: bool = False            # per-sample gradients and their mean in float64

    @property
    def h(self) -> float:
        return HESSIAN_BOUND[self.loss]

    @property
    def grad_bound(self) -> float:
        return LOGIT_GRADIENT_BOUND[self.loss]

    @property
    def record_norm(self) -> float:
        """M >= ||exact per-record gradient||: G R~, or min(G R~, C) for the clipped losses
        of config ``clip_norm`` C (module docstring)."""
        m = self.grad_bound * self.padded_norm
        return (m if self.clip_norm is None else min(m, self.clip_norm)) * _UP

    @staticmethod
    def build(loss: str, n_logits: int, in_features: int, bias: bool, l2: float,
              input_norm_bound: float, dtype: torch.dtype,
              n_records: int = 0, clip_norm: float | None = None,
              compute64: bool = False) -> "StabilityProblem":
        """The constants; ``n_records`` (the training set size) and the parameter count must
        stay within MAX_TERMS, where the nesting slack covers the float64 roundings."""
        n_params = n_logits * (in_features + (1 if bias else 0))
        if max(n_records, n_params) > MAX_TERMS:
            raise DataError(f"bound_method: stability covers at most {MAX_TERMS} training "
                            f"records and parameters (its nesting slack {SLACK:g} must absorb "
                            f"the float64 rounding of sums that long); got {n_records} records "
                            f"and {n_params} parameters")
        fm = FloatModel(dtype)
        r = padded_norm_bound(input_norm_bound, bias, fm.unit_roundoff)
        return StabilityProblem(loss, n_logits, in_features, bias, float(l2), r, fm,
                                None if clip_norm is None else float(clip_norm),
                                bool(compute64))

    @staticmethod
    def for_model(cfg, spec, l2: float, n_records: int) -> "StabilityProblem":
        """The constants of a ``bound_method: stability`` config whose model ``spec`` (with
        its input shape) is one trainable linear layer; ``l2`` the update rule's (rounded)
        L2 coefficient, ``n_records`` the training set size."""
        return StabilityProblem.build(
            cfg.loss, spec.n_logits, int(np.prod(spec.input_shape)), spec.layers[0].bias, l2,
            cfg.input_norm_bound, torch_dtype(cfg.dtype), n_records=n_records,
            clip_norm=cfg.clip_norm, compute64=cfg.k_boxes == "ball")

    def clip_floors(self, x: torch.Tensor) -> torch.Tensor:
        """a_i = min(1, C / (G ||x~_i||)) (n,) float64 for the records ``x`` (n, ...) as the
        training dtype holds them: the clipped loss psi_{a_i} keeps each record's gradient
        norm ||g|| ||x~_i|| <= G a_i ||x~_i|| <= C (module docstring). Relative rounding
        below gamma64(d~ + 8), which `step_float_error` charges."""
        flat = x.to(torch.float64).reshape(x.shape[0], -1)
        sq = (flat * flat).sum(1) + (1.0 if self.bias else 0.0)
        return (self.clip_norm / (self.grad_bound * sq.sqrt())).clamp(max=1.0)

    def batch_beta(self, x_batch: torch.Tensor) -> float:
        """beta(B) >= h lambda_max(X~_B^T X~_B / b): the curvature bound of a batch's data
        term, from the exact float64 records of the batch."""
        return self.h * gram_eigen_bound(x_batch, self.bias) * _UP

    # -- one step ---------------------------------------------------------------------------
    def step_float_error(self, norm, lr: float, batch_size: int):
        """eps(N): ||float step - exact step|| for any in-domain batch of ``batch_size``
        records and any parameters theta with ||theta||_F <= N (agt/training.py's nominal
        rule, sgd). Affine in N; ``norm`` may be a float64 array (elementwise).

        logits (d~ terms each): ||dz|| <= coeff(d~) N R~ + sqrt(C) abs(d~);
        dL/dz: ||dg|| <= h ||dz|| + sqrt(C) tau (softmax/sigmoid are h-Lipschitz in l2; tau
        the transcendental slack); per-sample gradient g x~^T: ||dG|| <= ||dg|| R~ +
        u (G + ||dg||) R~ (one product rounding; the clamp is non-expansive towards the exact
        value, which lies inside [-gamma, gamma]); float64 sum of b, division by b, cast:
        (gamma64_b + u64 + u) M, M = (G + ||dg||) R~ (1 + u); with ``clip_norm`` C the
        clipped gradient's ||dg|| <= h ||dz|| + sqrt(C) (2 tau + 2 eps_a + 2 u) and
        M = (min(G R~, C) + ||dg|| R~)(1 + u) (module docstring), and sqrt(P) (abs + abs_c)
        for underflow of the products and of the cast; update theta - lr (d + l2 theta):
        u (l2 N + ||d + l2 theta||) lr + u lr ||.|| + u (N + lr ||.||). With
        ``compute64`` everything before the cast of the mean runs in float64 (coeff, abs,
        tau and the product and logit-gradient roundings at float64's u), the cast and the
        update in the dtype."""
        fm = self.fm
        u = fm.unit_roundoff
        cfm = FloatModel(torch.float64) if self.compute64 else fm    # per-sample arithmetic
        uc = cfm.unit_roundoff
        C = self.n_logits
        d_terms = self.in_features + (1 if self.bias else 0)
        P = C * d_terms
        r = self.padded_norm
        dz = cfm.coeff(d_terms) * norm * r + math.sqrt(C) * cfm.absolute(d_terms)
        tau = transcendental_slack(cfm, C)
        if self.clip_norm is None:
            dg = self.h * dz + math.sqrt(C) * tau
            per_record = (self.grad_bound + dg) * r * (1.0 + uc)
        else:
            # the clipped gradient is h-Lipschitz in z; at the float logits each entry is off
            # by <= 2 tau + 2 eps_a + 2 u in every branch case (module docstring)
            eps_a = gamma(d_terms + 10, _U64)
            dg = self.h * dz + math.sqrt(C) * (2.0 * tau + 2.0 * eps_a + 2.0 * uc)
            per_record = (min(self.grad_bound * r, self.clip_norm) + dg * r) * (1.0 + uc)
        d_rec = dg * r + uc * per_record
        # plus absolute terms: per-sample products and the cast of the mean may underflow
        # (an error up to half a subnormal step per entry that no relative term covers; an
        # adversarial review's subnormal domain with lr 1e38 left the ball by 2.5x when
        # this was charged outside the lr factor only)
        d_mean = d_rec + (gamma(int(batch_size) + 2, _U64) + _U64 + u) * per_record \
            * (1.0 + 2 * u) + math.sqrt(P) * (fm.absolute(1) + cfm.absolute(1))
        direction = (per_record + self.l2 * norm) * (1.0 + 4 * u)
        d_update = u * (self.l2 * norm + direction) * lr + u * lr * direction \
            + u * (norm + lr * direction) * (1.0 + 4 * u)
        tiny = 8.0 * P * fm.absolute(1)
        return (lr * d_mean + d_update) * (1.0 + 1e-6) + tiny

    def expansion(self, beta, lr: float):
        """L = max(|1 - lr l2|, |1 - lr (beta + l2)|): the Lipschitz constant of the exact
        gradient step of an objective whose Hessian lies in [l2, beta + l2] (``beta`` may be
        a float64 array)."""
        return np.maximum(abs(1.0 - lr * self.l2), np.abs(1.0 - lr * (beta + self.l2))) * _UP

    def replacement_term(self, lr: float, batch_size: int) -> float:
        """c_t = 2 M lr_t / b_t: what one replaced record of the batch moves a step by."""
        return lr * 2.0 * self.record_norm / batch_size * _UP

    # -- the whole run ----------------------------------------------------------------------
    def public_norm_bounds(self, init_norm: float, steps: list[StabilityStep]) -> list[float]:
        """Npub_t >= ||theta_t|| for the float run on any in-domain dataset (t = 0..T):
        ||theta_{t+1}|| <= |1 - lr l2| N + lr M + eps(N)."""
        out = [init_norm * (1.0 + SLACK)]
        for s in steps:
            n = out[-1]
            nxt = abs(1.0 - s.lr * self.l2) * n + s.lr * self.record_norm \
                + self.step_float_error(n, s.lr, s.batch_size)
            out.append(nxt * (1.0 + SLACK))
        return out

    def check_overflow(self, steps: list[StabilityStep]) -> None:
        """Refuse when the float run on some in-domain dataset could overflow the dtype: the
        radii model rounding, not overflow (an adversarial review trained D to finite
        float32 weights while a one-record neighbour overflowed to inf, far outside every
        ball). With N_t = Npub_t >= ||theta_t|| for every in-domain run (|entry| <= norm):
        logits and every partial sum <= N_t R~, per-record gradients <= M, the update's
        terms <= N_t + lr_t (M + l2 N_t); each must stay below max(dtype) / 16, as the
        interval pass's public bounds (`agt.overflow.OverflowGuard.public_bounds`) ask."""
        if not steps:
            return
        pub = self.public_norm_bounds(steps[0].norm, steps)
        worst = max([self.record_norm] + [p * self.padded_norm for p in pub]
                    + [pub[t] + s.lr * (self.record_norm + self.l2 * pub[t])
                       for t, s in enumerate(steps)])
        limit = overflow_limit(self.fm.nominal_dtype)
        if not worst <= limit:
            raise DataError(f"bound_method: stability: the {self.fm.nominal_dtype} training "
                            f"computation could overflow on a dataset of the declared domain "
                            f"(a parameter norm or logit up to {worst:.3g}; the radii hold below "
                            f"{limit:.3g}): lower the learning rate or input_norm_bound, or "
                            "train in float64")

    def radii(self, k_values, steps: list[StabilityStep]) -> np.ndarray:
        """rho_k for every k of the grid (module docstring): the recursion maximised over
        the placements of the k replaced records (at most k per epoch, any number per
        batch) by dynamic programming over "records placed so far in this epoch", all k of
        the grid at once (row j: k_j; column m: m records placed, valid for m <= k_j)."""
        if not steps:
            raise ValueError("radii needs at least one training step")
        out = np.zeros(len(k_values), dtype=np.float64)
        rows = [j for j, k in enumerate(k_values) if k > 0]
        if not rows:
            return out
        pub = self.public_norm_bounds(steps[0].norm, steps)
        xi = [SLACK * (p + 1.0) for p in pub]
        r2 = self.padded_norm ** 2
        ks = np.array([float(k_values[j]) for j in rows])[:, None]          # (K, 1)
        placed = np.arange(int(ks.max()) + 1, dtype=np.float64)[None, :]    # (1, M)
        valid = placed <= ks

        def largest(a: np.ndarray) -> np.ndarray:                           # over m <= k
            return np.where(valid, a, -math.inf).max(axis=1, keepdims=True)

        # worst[j, m]: the largest A_t over placements of m records in this epoch so far
        worst = np.zeros((len(rows), placed.shape[1]))
        with np.errstate(over="ignore", invalid="ignore"):     # a radius may overflow to inf
            for t, s in enumerate(steps):
                if t > 0 and s.epoch != steps[t - 1].epoch:
                    worst = np.broadcast_to(largest(worst), worst.shape).copy()  # records recur
                beta_k = s.beta + ks * self.h * r2 * (1.0 + SLACK) / s.batch_size \
                    + ks * SLACK * self.h * r2
                arg = s.norm * _UP + (1.0 + SLACK) * worst + ks * xi[t]
                moved = (self.expansion(beta_k, s.lr) * worst
                         + ks * 2.0 * self.step_float_error(arg, s.lr, s.batch_size)) * _UP
                c = self.replacement_term(s.lr, s.batch_size)
                # after[m] = max over m' <= m of moved[m'] + c (m - m'), as a running maximum;
                # the absolute term covers the rounding of subtracting and adding c m back
                after = np.maximum.accumulate(moved - c * placed, axis=1) + c * placed
                worst = after * _UP + 8.0 * _U64 * (largest(moved) + c * ks)
            rho = (1.0 + SLACK) * largest(worst)[:, 0] + ks[:, 0] * xi[len(steps)]
        out[rows] = np.where(np.isfinite(rho), rho, math.inf)
        return out


def ball_boxes(centre: torch.Tensor, radii: np.ndarray) -> Interval:
    """The boxes (K, ...) enclosing the balls B(centre, rho_k) (config ``k_boxes: ball``):
    |theta''_j - c_j| <= ||theta'' - c|| <= rho_k, rounded outwards in float64. They nest
    as the balls do: coordinatewise |c'_j - c_j| + rho_{k-1}(D') <= rho_k(D) - xi, and xi
    is far above the one rounding of each bound."""
    c = centre.to(BOUND_DTYPE).unsqueeze(0)
    rho = torch.as_tensor(np.asarray(radii, dtype=np.float64), device=c.device)
    rho = rho.reshape(-1, *([1] * centre.dim()))
    lo = torch.nextafter(c - rho, torch.tensor(-math.inf, dtype=BOUND_DTYPE, device=c.device))
    hi = torch.nextafter(c + rho, torch.tensor(math.inf, dtype=BOUND_DTYPE, device=c.device))
    return Interval(lo, hi)


def parameter_norm(theta: dict[str, torch.Tensor]) -> float:
    """An upper bound on the Frobenius norm of all trainable parameters together."""
    total = sum(float((t.to(torch.float64) ** 2).sum()) for t in theta.values())
    count = sum(t.numel() for t in theta.values())
    return math.sqrt(total * (1.0 + gamma(count + 2, _U64))) * _UP
