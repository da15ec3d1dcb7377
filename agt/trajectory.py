"""Trajectory certificates for a linear head: the query's margin bounded along the whole
training run, with one choice of replaced records for every step.

Setting: a model of one trainable linear layer (no frozen prefix) whose bundle comes from
the engine's interval pass (bound methods ``interval`` and ``served-k0``), with any update
the engine supports (sgd, momentum, nesterov, L2), full batch or minibatches, any dtype.
The certificate needs the training data (owner-side, like every certificate): it re-runs
the interval pass, checks that it reproduces the bundle bit for bit, and keeps the boxes
every step started from. Relation: replace-one (batch sizes stay fixed).

Math. One update is affine in (theta_t, v_{t-1}, d_t) with scalar coefficients
(agt/optim.py; d_t the step's mean clamped gradient), so in exact arithmetic over the float
values the run produced,

    theta_T = Lambda theta_0 + sum_t alpha_t d_t + sum_t (beta_t e_t + beta'_t e'_t),

with e_t, e'_t the rounding residues of the update of theta and of the momentum buffer
(each coordinate within the interval pass's own allowance mag coeff(8) + abs(8), mag the
magnitudes of the update's intermediates from the step's boxes and |d_t| <= gamma +
rounding: agt/optim.py) and (Lambda, alpha, beta, beta') from the coefficients by the
adjoint recursion. That recursion runs in float64; the same recursion on absolute values
bounds its rounding (a sum of products is off by at most gamma_m times the sum of their
magnitudes), and those bounds are charged wherever a coefficient is used. For a query x~ (bias
input 1 appended) served as class c and a competitor j, the margin m(theta) = <D, theta>,
D = (e_c - e_j) x~^T (one logit: D = s x~, s = +1 for class 1, -1 for class 0), is linear in theta,
and d_t = (1/b_t) sum_{i in B_t} g_i(t) + eps_t with g_i(t) record i's clamped float gradient
and |eps_t| <= the engine's mean allowance. Take D' that replaces a set S, |S| <= k. A kept
record's gradient lies in the engine's per-sample interval at the step's k-box (that box
holds theta_t(D') for every D' within k), so <D, g_i(t)> lies in [L_it, U_it], the exact
range of a linear function over that box; a replaced record's clamped gradient has
|<D, g>| <= M = gamma ||D||_1. With w_it the lower end of (alpha_t / b_t) [L_it, U_it] and
w'_t = -|alpha_t| M / b_t, the margin of the served float model on D' is at least

    m_k = <D, Lambda theta_0> + sum_i W_i - (sum of the k largest P_i) - A_k,
    W_i = sum_{t: i in B_t} w_it,   P_i = sum_{t: i in B_t} (w_it - w'_t) >= 0,

where A_k collects the update residues, the mean roundings and the served float logits'
rounding (all bounded through the k-boxes, so non-decreasing in k). The interval boxes
charge every step and every coordinate its own worst records; here the same k records are
charged at every step, through the query's own direction. m_k is non-increasing in k
(boxes nest, so w_it shrinks; each replacement costs P_i >= 0), so certification is
monotone in k.

Float64 evaluation: every term is bounded by a quantity that depends on the query, the
configuration and theta_0 only (|w_it| <= |alpha_t| M / b_t), so the float64 evaluation of
m_k is within an a-priori err of the formula; a query is certified at k when the computed
value exceeds err (2k + 1).

Nesting (r(D') >= r(D) - 1 for D' one record away): the engine's boxes nest,
box_t(D', k - 1) inside box_t(D, k), and every bound here is inclusion-isotone in them, so
each kept record's w_it for D' at k - 1 is at least D's at k; D' at k - 1 may replace any
k - 1 records, which together with the changed record is a choice D has at k, whose term
the bound for D charges w'_t <= the new record's. So the formula for D' at k - 1 is at
least D's at k, the allowances are no larger, and with computed values within err of the
formula the per-k slack err (2k + 1) turns "D certified at k" into "D' certified at k - 1".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agt.bounded.network import Network
from agt.config import config_from_dict
from agt.data import Dataset
from agt.errors import BundleError, ConfigError, DataError
from agt.interval import BOUND_DTYPE, FloatModel, Interval
from agt.interval import gamma as gamma_n
from agt.optim import _N_OPS, UpdateRule
from agt.store import Bundle
from agt.tensors import torch_dtype
from agt.topk import clamp_limit, rounding_allowance
from agt.training import StepBounds, train
from agt.version import __version__

_U64 = 2.0 ** -53
#: float64 values kept: steps x k values x parameters x 4 (theta and buffer boxes)
_MAX_KEPT = 1 << 27
#: float64 elements of one (queries x records x logits) work array
_WORK = 1 << 24


@dataclass(frozen=True)
class _Step:
    batch: torch.Tensor          # record indices
    lo: torch.Tensor             # (K, C, d~) box of theta before the update
    hi: torch.Tensor
    alpha: float                 # coefficient of the step's mean gradient in theta_T


def check_trajectory_bundle(bundle: Bundle) -> None:
    """Refuse what the trajectory certificate does not cover, with the reason."""
    spec = bundle.spec
    if len(spec.layers) != 1 or spec.layers[0].kind != "linear" or spec.frozen_layers:
        raise ConfigError("the trajectory certificate needs a model of exactly one trainable "
                          "linear layer (a logistic or softmax head over fixed features)")
    if bundle.bound_method not in ("interval", "served-k0"):
        raise ConfigError(f"the trajectory certificate re-runs the interval pass; bound_method "
                          f"'{bundle.bound_method}' has none (use interval or served-k0)")
    if "replace-one" not in bundle.relations:
        raise ConfigError("the trajectory certificate holds under replace-one only")


class TrajectoryBounds:
    """The interval pass's per-step boxes of a linear head, re-run from the training data,
    and the margin bound of the module docstring on top of them."""

    def __init__(self, bundle: Bundle, dataset: Dataset, *, progress: bool = False):
        check_trajectory_bundle(bundle)
        if dataset.sha256() != bundle.dataset_sha256:
            raise DataError("this dataset is not the one the bundle was trained on (its "
                            "sha256 differs from the bundle's dataset_sha256): pass the "
                            "bundle's training data (agt certify --trajectory reloads the "
                            "file its config names, relative to the working directory: has "
                            "it changed since?)")
        cfg = config_from_dict(bundle.config)
        self.bundle_id = bundle.bundle_id
        self.spec = bundle.spec
        self.dtype = torch_dtype(bundle.dtype)
        self.fm = FloatModel(self.dtype)
        self.names = self.spec.trainable_param_names()
        self.bias = len(self.names) == 2
        self.n_logits = self.spec.n_logits
        self.k_values = tuple(int(k) for k in bundle.k_values)
        n_params = sum(int(bundle.nominal[n].numel()) for n in self.names)
        steps_total = _count_steps(cfg, dataset.n_train)
        if steps_total * len(self.k_values) * n_params * 4 > _MAX_KEPT:
            raise ConfigError(f"the trajectory certificate would keep {steps_total} steps x "
                              f"{len(self.k_values)} k values x {n_params} parameters of "
                              "boxes; use fewer steps or k values")
        kept: list[StepBounds] = []
        res = train(cfg.replace(device="cpu"), dataset, progress=progress,
                    bounds_callback=kept.append)
        for name in bundle.nominal:
            same = torch.equal(res.nominal[name].cpu(), bundle.nominal[name].cpu())
            if name in res.lower:
                same = same and torch.equal(res.lower[name].cpu(), bundle.lower[name].cpu()) \
                    and torch.equal(res.upper[name].cpu(), bundle.upper[name].cpu())
            if not same:
                cause = ("another torch build or thread count?"
                         if bundle.agt_version == __version__ else
                         f"the bundle was made by agt {bundle.agt_version}, this is "
                         f"{__version__}: retrain it")
                raise BundleError(f"re-running the training did not reproduce the bundle's "
                                  f"'{name}' ({cause}); the trajectory certificate needs "
                                  "the run that made the bundle")
        self.gamma = float(cfg.clip_gamma)
        self.gam = clamp_limit(self.gamma, self.dtype)
        self.loss = cfg.loss
        self.x = torch.as_tensor(dataset.x_train, dtype=self.dtype).to(BOUND_DTYPE)
        self.y = torch.as_tensor(dataset.y_train, dtype=torch.int64)
        self.net = Network.trainable(self.spec)
        rule = UpdateRule.from_config(cfg, self.dtype)
        theta0 = self._flat({n: bundle.init[n].to(BOUND_DTYPE) for n in self.names})
        self._build(kept, rule, theta0, bundle)

    @staticmethod
    def from_config_data(bundle: Bundle, base_dir=None, *, progress: bool = False
                         ) -> "TrajectoryBounds":
        """Load the training data named in the bundle's config (relative paths from
        ``base_dir``, default the working directory) and re-run the interval pass."""
        from agt.data import load_dataset
        check_trajectory_bundle(bundle)
        data = config_from_dict(bundle.config).data
        if data is None or not data.name:
            raise ConfigError("the bundle's config names no dataset; build TrajectoryBounds "
                              "with the training data")
        try:
            ds = load_dataset(data.name, data.options, base_dir)
        except (DataError, ConfigError) as exc:
            where = base_dir if base_dir is not None else "the working directory"
            raise type(exc)(f"the trajectory certificate reloads the training data the "
                            f"bundle's config names (dataset '{data.name}', relative paths from "
                            f"{where}; agt train resolved them from its config's folder): "
                            f"{exc}") from None
        return TrajectoryBounds(bundle, ds, progress=progress)

    # -- set-up -----------------------------------------------------------------------------
    def _flat(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """(..., C, d~): weight rows with the bias as last column."""
        w = params[self.names[0]]
        if not self.bias:
            return w
        return torch.cat([w, params[self.names[1]].unsqueeze(-1)], -1)

    def _build(self, kept: list[StepBounds], rule: UpdateRule, theta0: torch.Tensor,
               bundle: Bundle) -> None:
        T = len(kept)
        coefs = [rule.coefficients(s.lr, s.step == 0) for s in kept]
        mags = [rule.magnitude_coefficients(s.lr, s.step == 0) for s in kept]
        # adjoint recursion: (lam_theta, lam_v) is the coefficient of (theta_{t+1}, v_t) in
        # theta_T; the same recursion on absolute values bounds its float64 rounding (the
        # error of a sum of products is <= gamma_m times the sum of their magnitudes)
        lam = (1.0, 0.0)
        lam_abs = (1.0, 0.0)
        alpha, beta, beta_v, alpha_bar = [0.0] * T, [0.0] * T, [0.0] * T, [0.0] * T
        beta_bar, beta_v_bar = [0.0] * T, [0.0] * T
        for t in range(T - 1, -1, -1):
            ct, cv = coefs[t][0], coefs[t][1] or {}
            alpha[t] = lam[0] * ct.get("d", 0.0) + lam[1] * cv.get("d", 0.0)
            alpha_bar[t] = lam_abs[0] * abs(ct.get("d", 0.0)) + lam_abs[1] * abs(cv.get("d", 0.0))
            beta[t], beta_v[t] = lam
            beta_bar[t], beta_v_bar[t] = lam_abs
            lam = (lam[0] * ct.get("theta", 0.0) + lam[1] * cv.get("theta", 0.0),
                   lam[0] * ct.get("v", 0.0) + lam[1] * cv.get("v", 0.0))
            lam_abs = (lam_abs[0] * abs(ct.get("theta", 0.0))
                       + lam_abs[1] * abs(cv.get("theta", 0.0)),
                       lam_abs[0] * abs(ct.get("v", 0.0)) + lam_abs[1] * abs(cv.get("v", 0.0)))
        # each coefficient is a sum of products along <= T + 1 steps of 2 terms each
        self.eta = gamma_n(4 * (T + 4), _U64)
        self.theta0 = lam[0] * theta0                         # (C, d~), Lambda theta_0
        self.lam0_abs = lam_abs[0] * theta0.abs()
        self.steps: list[_Step] = []
        residue = None
        self.mean_eps, self.alpha_abs_gamma = 0.0, 0.0
        for t, s in enumerate(kept):
            lo = self._flat({n: s.theta[n].lo for n in self.names})
            hi = self._flat({n: s.theta[n].hi for n in self.names})
            self.steps.append(_Step(torch.as_tensor(s.batch, dtype=torch.int64), lo, hi, alpha[t]))
            b = len(s.batch)
            eps = rounding_allowance(b, b + 8, self.gam, self.fm)
            d_mag = self.gam + eps
            self.mean_eps += (abs(alpha[t]) + self.eta * alpha_bar[t]) * eps
            self.alpha_abs_gamma += alpha_bar[t] * d_mag
            theta_mag = Interval(lo, hi).magnitude()
            v_mag = None
            if s.velocity is not None and s.velocity.get(self.names[0]) is not None:
                v_mag = self._flat({n: s.velocity[n].magnitude() for n in self.names})
            # the update's own rounding, as the interval pass charges it (agt/optim.py:
            # magnitudes of the nominal computation's intermediates), carried to theta_T
            for cf, weight, bar in ((mags[t][0], beta[t], beta_bar[t]),
                                    (mags[t][1], beta_v[t], beta_v_bar[t])):
                if cf is None or bar == 0.0:
                    continue
                mag = cf.get("theta", 0.0) * theta_mag + cf.get("d", 0.0) * d_mag
                if cf.get("v", 0.0) != 0.0:
                    mag = mag + cf["v"] * v_mag
                weight = abs(weight) + self.eta * bar
                allowance = weight * (mag * self.fm.coeff(_N_OPS) + self.fm.absolute(_N_OPS))
                residue = allowance if residue is None else residue + allowance
        # (K, C, d~): bound on |theta_T - the exact formula| per coordinate (times 1 + 1e-9
        # for its own float64 evaluation: a few hundred operations at most)
        self.residue = (residue * (1.0 + 1e-9)) * (1.0 + self.eta)
        final = self._flat({n: Interval(bundle.lower[n], bundle.upper[n]).magnitude()
                            for n in self.names})
        self.final_mag = final                                # (K, C, d~)
        self.n_records = int(self.x.shape[0])
        self.n_terms = sum(len(s.batch) for s in self.steps) + self.n_records + T + 16

    # -- per-step record intervals ----------------------------------------------------------
    def _record_bounds(self, step: _Step, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Clamped per-sample gradient intervals of the step's batch at box j: (b, C, d~)."""
        params = {}
        w_lo, w_hi = step.lo[j], step.hi[j]
        d_in = w_lo.shape[-1] - (1 if self.bias else 0)
        params[self.names[0]] = Interval(w_lo[None, :, :d_in], w_hi[None, :, :d_in])
        if self.bias:
            params[self.names[1]] = Interval(w_lo[None, :, d_in], w_hi[None, :, d_in])
        sources = self.net.grads_bounds(params, self.x[step.batch], self.y[step.batch],
                                        self.loss, self.fm)
        parts_lo, parts_hi = [], []
        for name in self.names:
            src = sources[name]
            box = src.samples_last(0, src.n_rows)               # (1, rows * row_size, b)
            lo = torch.clamp(box.lo[0], -self.gamma, self.gamma).to(BOUND_DTYPE)
            hi = torch.clamp(box.hi[0], -self.gamma, self.gamma).to(BOUND_DTYPE)
            parts_lo.append(lo.T.reshape(-1, src.n_rows, src.row_size))
            parts_hi.append(hi.T.reshape(-1, src.n_rows, src.row_size))
        return torch.cat(parts_lo, -1), torch.cat(parts_hi, -1)

    # -- the certificate ----------------------------------------------------------------------
    def certified(self, xq: torch.Tensor, pred: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Whether the margin bound certifies query q at grid index j[q]; xq: (Q, d) float64
        holding the served dtype's values of the queries."""
        out = torch.zeros(len(pred), dtype=torch.bool)
        for jj in torch.unique(j).tolist():
            rows = (j == jj).nonzero().flatten()
            step = max(1, _WORK // max(1, self.n_records * self.n_logits))
            for r0 in range(0, len(rows), step):
                sel = rows[r0:r0 + step]
                out[sel] = self._certified_at(xq[sel], pred[sel], int(jj))
        return out

    def _replaced_bound(self, row_norm: torch.Tensor, rows: int) -> torch.Tensor:
        """M = max |<D, g>| over clamped gradients g: gamma ||D||_1 (D has ``rows`` rows
        equal to +-x~)."""
        return rows * self.gam * row_norm

    def _selected(self, P: torch.Tensor, k: int) -> torch.Tensor:
        """Sum of the k largest replacement costs per query and competitor."""
        if k == 0:
            return torch.zeros_like(P[:, 0])
        return torch.topk(P, min(k, P.shape[1]), dim=1).values.sum(1)

    def _certified_at(self, xq: torch.Tensor, pred: torch.Tensor, j: int) -> torch.Tensor:
        Q, C = xq.shape[0], self.n_logits
        k = self.k_values[j]
        xt = torch.cat([xq, torch.ones(Q, 1, dtype=BOUND_DTYPE)], 1) if self.bias else xq
        x_abs = xt.abs()
        x_pos, x_neg = xt.clamp_min(0.0), (-xt).clamp_min(0.0)
        d_len = xt.shape[1]
        row_norm = x_abs.sum(1)                                   # ||x~||_1
        rows_in_d = 1 if C == 1 else 2
        M = self._replaced_bound(row_norm, rows_in_d)             # (Q,)
        # float64 rounding of one record's interval sums (two matmul sums of 2 d~ terms)
        e1 = rows_in_d * 2.0 * gamma_n(2 * d_len + 4, _U64) * self.gam * row_norm
        n, ar = self.n_records, torch.arange(Q)
        W = torch.zeros(Q, n, max(C, 1), dtype=BOUND_DTYPE)     # per competitor j (C = 1: one)
        P = torch.zeros_like(W)
        for st in self.steps:
            lo, hi = self._record_bounds(st, j)                   # (b, C, d~)
            b = lo.shape[0]
            # per row r: upper / lower of <x~, clamped g_i[r]> over the record's box
            up = torch.einsum("ql,brl->qbr", x_pos, hi) - torch.einsum("ql,brl->qbr", x_neg, lo)
            low = torch.einsum("ql,brl->qbr", x_pos, lo) - torch.einsum("ql,brl->qbr", x_neg, hi)
            if C == 1:
                s = torch.where(pred == 1, 1.0, -1.0).to(BOUND_DTYPE)[:, None, None]
                U = torch.where(s > 0, up, -low)
                L = torch.where(s > 0, low, -up)
            else:
                up_c = up[ar, :, pred][:, :, None]               # (Q, b, 1)
                low_c = low[ar, :, pred][:, :, None]
                U = up_c - low                                    # margin c - j, per j
                L = low_c - up
            a = st.alpha / b
            w = torch.minimum(a * L, a * U)
            w_rep = -abs(a) * M[:, None, None]
            W.index_add_(1, st.batch, w)
            P.index_add_(1, st.batch, w - w_rep)
        base_rows = xt @ self.theta0.T                            # (Q, C): <x~, Lambda theta_0[r]>
        served_rows = x_abs @ self.final_mag[j].T                 # (Q, C)
        resid_rows = x_abs @ self.residue[j].T
        lam_rows = x_abs @ self.lam0_abs.T
        if C == 1:
            s = torch.where(pred == 1, 1.0, -1.0).to(BOUND_DTYPE)
            base_m = (s * base_rows[:, 0])[:, None]
            served_mag = served_rows[:, :1]
            resid = resid_rows[:, :1]
            lam_abs = lam_rows[:, :1]
        else:
            base_m = base_rows[ar, pred][:, None] - base_rows
            served_mag = served_rows[ar, pred][:, None] + served_rows
            resid = resid_rows[ar, pred][:, None] + resid_rows
            lam_abs = lam_rows[ar, pred][:, None] + lam_rows
        margin = base_m + W.sum(1) - self._selected(P, k)
        # allowances: update residues, mean roundings, coefficients' rounding, served logits
        d_norm = (rows_in_d * row_norm)[:, None]
        n_in = d_len + 2
        served = 2.0 * (served_mag * self.fm.coeff(n_in) + self.fm.absolute(n_in))
        allow = (resid + d_norm * self.mean_eps
                 + self.eta * (d_norm * self.alpha_abs_gamma + lam_abs)
                 + served) * (1.0 + 1e-9)
        # float64 evaluation of margin: data-independent bound (see the module docstring)
        alpha_abs = sum(abs(st.alpha) for st in self.steps)
        size = lam_abs + 4.0 * alpha_abs * (M + 2.0 * e1)[:, None]
        err = 4.0 * gamma_n(self.n_terms, _U64) * size + 4.0 * alpha_abs * e1[:, None]
        ok = margin - allow - err * (2 * k + 1) > 0
        if C > 1:
            ok[ar, pred] = True
        return ok.all(1)


def _count_steps(cfg, n: int) -> int:
    batch = cfg.batch_for(n)
    return cfg.n_epochs * -(-n // batch)
