"""Poisoning attacks: upper bounds on a query's true stability radius (owner-side analysis).

A certificate at k claims that every dataset D' within distance k of D trains, by the
engine's nominal rule, a model that predicts the query as the served model does. The true
radius of a query is the largest such k; a sound certificate never exceeds it. One explicit
D' at distance k whose retrained model (``train_nominal``, the served code path) predicts the
query differently proves that the true radius is below k, for *every* sound method. So an
attack measures from above what certificates measure from below:

    certified k*  <=  true radius  <  flip k (the attack's)

The gap between the two says how much any tighter bound could still gain on that query, and
a certified k* >= flip k is a soundness failure (the test suite uses it as one).

The attack (replace-one; ``n`` and the batch order are unchanged) targets one query x_q
whose served class is c, for any model the engine trains without a frozen prefix (linear
heads, MLPs, conv nets). Let m(theta) = z_c - z_t be the query's margin (t: the runner-up
class; for one logit, m = s z with s = +1 for class 1 and -1 for class 0) and d its gradient
at the served parameters. A gradient step theta -= lr * mean_i g_i changes m by about
-lr / b * sum_i d . g_i (exactly, for one linear layer), so record i supports the margin by
-d . g_i and a record whose clamped (or clipped) gradient g' maximises d . g' erodes it
fastest. The attack scores every training record by its support at the initial and at the
served parameters (the engine's per-record gradients, `Network.grads_nominal`, in float64),
replaces the k most supportive ones by k copies of a crafted record, retrains, and searches
the k grid by bisection for the smallest k that flips the prediction. The candidates for
the crafted record are the query's direction and its sign pattern, both signs, at several
scales (inside ||x|| <= R when the config declares the input domain R of ``bound_method:
stability``), and the query itself (the classic poison of a nonlinear model), each with
every label; per scale the one that erodes the margin most at the same two points is
shortlisted, and of those the one whose neighbour at the largest k retrains to the smallest
margin is used (first-order scores misjudge records far outside the data: their first step
is large, and they stop pushing once fitted). Two points of the trajectory, a first-order
score and one crafted record are heuristics: the attack is not optimal, so the flip k is an
upper bound on the true radius, not the radius; every reported flip is a real retrained
neighbour (the datasets can be rebuilt with ``poisoned_dataset``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agt.bounded.network import Network
from agt.config import TrainConfig
from agt.data import Dataset
from agt.errors import ConfigError, DataError
from agt.models import init_params
from agt.optim import UpdateRule
from agt.stability import StabilityProblem
from agt.tensors import predicted_classes, torch_dtype
from agt.training import load_pretrained, train_nominal

#: how far inside the declared domain ||x|| <= R a crafted record is placed (the trainer
#: checks the domain on the records' float values, so they must not land on its edge)
_DOMAIN_MARGIN = 1e-6
#: crafted-record scales, relative to the largest training record norm
_SCALES = (0.5, 1.0, 3.0, 10.0, 100.0)


@dataclass(frozen=True)
class FlipResult:
    """Per query: the served class and the smallest grid k at which the attack's neighbour
    (k records replaced) retrains to another class, -1 where none in the grid did. Owner-only,
    like a certificate: it is computed from the private data."""
    prediction: np.ndarray        # (Q,) int64
    flip_k: np.ndarray            # (Q,) int64
    k_values: tuple[int, ...]
    n_retrains: int


def _check_attackable(cfg: TrainConfig, ds: Dataset):
    spec = cfg.model.with_input_shape(ds.feature_shape)
    if spec.frozen_layers:
        raise ConfigError("the poisoning attack crafts records in the input space of the "
                          "trainable layers; this model has a frozen prefix of "
                          f"{spec.frozen_layers} layer(s): attack the head on the prefix's "
                          "features instead (a dataset of those features and a model of the "
                          "trainable layers)")
    return spec


#: per-record gradients are scored this many records at a time (memory: rows x parameters)
_SCORE_ROWS = 2048


class _Scorer:
    """First-order scores from the engine's own nominal rule, evaluated in float64 (a
    heuristic only: the retraining, not this, decides whether the attack worked): the
    per-record clamped gradients (`Network.grads_nominal`; with ``clip_norm``, those of the
    clipped loss with the trainer's clip floors) and the gradient of the query's margin."""

    def __init__(self, cfg: TrainConfig, spec):
        self.cfg = cfg
        self.net = Network.trainable(spec)
        self.names = spec.trainable_param_names()
        self.gamma = float(cfg.clip_gamma)
        self.dtype = torch_dtype(cfg.dtype)
        self.problem = None
        if cfg.clip_norm is not None:        # only under stability: its clip floors
            self.problem = StabilityProblem.for_model(
                cfg, spec, UpdateRule.from_config(cfg, self.dtype).l2, n_records=1)

    def support(self, params: dict, direction: torch.Tensor, x: np.ndarray,
                y: np.ndarray) -> torch.Tensor:
        """(m,): direction . g_i(params) for the records (x, y), g_i clamped to +-gamma."""
        out = torch.zeros(len(y), dtype=torch.float64)
        for r0 in range(0, len(y), _SCORE_ROWS):
            # the records as the training dtype holds them
            xc = torch.as_tensor(x[r0:r0 + _SCORE_ROWS], dtype=self.dtype).to(torch.float64)
            yc = torch.as_tensor(y[r0:r0 + _SCORE_ROWS], dtype=torch.int64)
            floor = None if self.problem is None else self.problem.clip_floors(xc)
            src = self.net.grads_nominal(params, xc, yc, self.cfg.loss, clip_floor=floor)
            g = torch.cat([src[n].fn(0, src[n].n_rows) for n in self.names], 1)
            out[r0:r0 + len(yc)] = g.clamp(-self.gamma, self.gamma).nan_to_num_(nan=0.0) \
                @ direction
        return out

    def margin_gradient(self, params: dict, xq: np.ndarray, cls: int, rival: int):
        """d m / d theta (flattened in the order of the trainable parameters) of the margin
        m = z_cls - z_rival (one logit: the signed logit), at ``params``."""
        leaves = {n: params[n].detach().clone().requires_grad_(True) for n in self.names}
        z, _ = self.net.forward_nominal(leaves, torch.as_tensor(xq[None], dtype=torch.float64))
        z = z[0]
        m = (z[0] if cls == 1 else -z[0]) if len(z) == 1 else z[cls] - z[rival]
        grads = torch.autograd.grad(m, [leaves[n] for n in self.names], allow_unused=True)
        return torch.cat([(torch.zeros_like(leaves[n]) if g is None else g).reshape(-1)
                          for n, g in zip(self.names, grads)])


def _float64(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: v.detach().to(torch.float64) for n, v in params.items()}


class _Attack:
    def __init__(self, cfg: TrainConfig, ds: Dataset):
        self.spec = _check_attackable(cfg, ds)
        self.cfg = cfg
        self.ds = ds
        self.dtype = torch_dtype(cfg.dtype)
        self.net = Network(self.spec.layers, 0)
        self.scorer = _Scorer(cfg, self.spec)
        theta0 = init_params(self.spec, cfg.seed, self.dtype)
        if cfg.pretrained:
            theta0 = load_pretrained(cfg.pretrained, self.spec, theta0)
        self.served = train_nominal(cfg, ds)
        self.thetas = (_float64(theta0), _float64(self.served))
        self.n_classes = max(2, self.spec.n_logits)
        norms = np.linalg.norm(ds.x_train.reshape(ds.n_train, -1), axis=1)
        self.scale = float(norms.max()) if len(norms) else 1.0
        self.radius = cfg.input_norm_bound

    def predict(self, params, x) -> np.ndarray:
        with torch.no_grad():
            z, _ = self.net.forward_nominal({k: v.to(self.dtype) for k, v in params.items()},
                                            torch.as_tensor(x, dtype=self.dtype))
        return predicted_classes(z).cpu().numpy()

    def _candidates(self, xq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Crafted (x', y') candidates with their scale tags: the query's direction and its
        sign pattern, both signs, at several scales, and the query itself (scale tag 0: the
        classic poison of a nonlinear model, the query with another label); every label."""
        dirs = []
        for u in (xq, np.sign(xq)):
            n = float(np.linalg.norm(u))
            if n > 0:
                dirs += [u / n, -u / n]
        if not dirs:
            first = np.zeros_like(xq)
            first.reshape(-1)[0] = 1.0
            dirs = [first, -first]
        if self.radius is not None:
            scales = [self.radius * (1 - _DOMAIN_MARGIN), self.radius / 2]
        else:
            scales = [s * max(self.scale, 1.0) for s in _SCALES]
        pts = [s * u for u in dirs for s in scales]
        tags = [s for _ in dirs for s in scales]
        if self.radius is None or np.linalg.norm(xq) <= self.radius * (1 - _DOMAIN_MARGIN):
            pts.append(xq.copy())
            tags.append(0.0)
        labels = np.arange(self.n_classes)
        return (np.repeat(np.array(pts), len(labels), 0), np.tile(labels, len(pts)),
                np.repeat(np.array(tags), len(labels)))

    def _rival(self, xq: np.ndarray, cls: int) -> int:
        """The served model's runner-up class for the query (unused with one logit)."""
        with torch.no_grad():
            z, _ = self.net.forward_nominal(self.thetas[1],
                                            torch.as_tensor(xq[None], dtype=torch.float64))
        z = z[0].clone()
        if len(z) == 1:
            return 1 - cls
        z[cls] = -torch.inf
        return int(torch.argmax(z))

    def shortlist(self, xq: np.ndarray, cls: int):
        """(records ordered by their support of the query's margin, and per candidate scale
        the crafted (x', y') that erodes the margin most, to first order: -lr / b d . g of
        one step, d the margin's gradient at the served parameters, g a record's gradient
        at the initial and at the served parameters)."""
        d = self.scorer.margin_gradient(self.thetas[1], xq, cls, self._rival(xq, cls))
        support = torch.zeros(self.ds.n_train, dtype=torch.float64)
        cand_x, cand_y, cand_scale = self._candidates(xq)
        erosion = torch.zeros(len(cand_y), dtype=torch.float64)
        for theta in self.thetas:
            support -= self.scorer.support(theta, d, self.ds.x_train, self.ds.y_train)
            erosion += self.scorer.support(theta, d, cand_x, cand_y)
        order = np.argsort(-support.numpy(), kind="stable")
        picks = []
        for scale in np.unique(cand_scale):
            idx = np.flatnonzero(cand_scale == scale)
            best = int(idx[int(torch.argmax(erosion[idx]))])
            picks.append((cand_x[best], int(cand_y[best])))
        return order, picks

    def margin(self, params, xq: np.ndarray, cls: int) -> float:
        """The served class's margin over the best other class (one logit: signed logit)."""
        with torch.no_grad():
            z, _ = self.net.forward_nominal({k: v.to(self.dtype) for k, v in params.items()},
                                            torch.as_tensor(xq[None], dtype=self.dtype))
        z = z[0].double()
        if len(z) == 1:
            return float(z[0]) if cls == 1 else -float(z[0])
        others = torch.cat([z[:cls], z[cls + 1:]])
        return float(z[cls] - others.max())

    def plan(self, xq: np.ndarray, probe_k: int, cls: int):
        """The shortlisted crafted record whose neighbour at ``probe_k`` retrains to the
        smallest margin (first-order scores misjudge records far outside the data)."""
        order, picks = self.shortlist(xq, cls)
        if len(picks) == 1:
            return (order,) + picks[0], 0
        margins = [self.margin(train_nominal(self.cfg, self.poisoned((order,) + p, probe_k)),
                               xq, cls) for p in picks]
        return (order,) + picks[int(np.argmin(margins))], len(picks)

    def poisoned(self, plan, k: int) -> Dataset:
        order, x_new, y_new = plan
        x, y = self.ds.x_train.copy(), self.ds.y_train.copy()
        x[order[:k]] = x_new
        y[order[:k]] = y_new
        return Dataset(self.ds.name, x, y, self.ds.x_test, self.ds.y_test, self.ds.n_classes,
                       dict(self.ds.meta))


def poisoned_dataset(cfg: TrainConfig, ds: Dataset, query, k: int, *,
                     probe_k: int | None = None) -> Dataset:
    """The attack's neighbour of ``ds`` for one query: k training records replaced (n and
    the batch order unchanged), so it lies at replace-one distance <= k. ``probe_k``: the
    distance at which the shortlisted crafted records are compared by retraining (default
    k; `flip_radius` compares them at the largest k of its grid)."""
    if not 0 <= int(k) <= ds.n_train:
        raise DataError(f"k = {k} must lie in 0..{ds.n_train} (the number of training records)")
    attack = _Attack(cfg, ds)
    xq = np.asarray(query, dtype=np.float64).reshape(ds.feature_shape)
    cls = int(attack.predict(attack.served, xq[None])[0])
    plan, _ = attack.plan(xq, int(k if probe_k is None else probe_k), cls)
    return attack.poisoned(plan, int(k))


def flip_radius(cfg: TrainConfig, ds: Dataset, queries, k_values, *,
                progress: bool = False) -> FlipResult:
    """For each query, the smallest k of ``k_values`` (searched by bisection, after checking
    the largest) at which the attack's neighbour retrains to another class; -1 if even the
    largest k does not flip it. Each flip is an upper bound on the query's true radius under
    replace-one: no sound certificate may certify the query at that k."""
    grid = sorted({int(k) for k in k_values if int(k) > 0})
    if not grid:
        raise DataError("k_values needs at least one k > 0 (k = 0 is D itself, which never flips)")
    if grid[-1] > ds.n_train:
        raise DataError(f"k = {grid[-1]} exceeds the {ds.n_train} training records")
    attack = _Attack(cfg, ds)
    xq_all = np.asarray(queries, dtype=np.float64)
    if xq_all.shape[1:] != tuple(ds.feature_shape):
        raise DataError(f"queries need shape (Q, {', '.join(map(str, ds.feature_shape))}); got "
                        f"{xq_all.shape}")
    served = attack.predict(attack.served, xq_all)
    flip = np.full(len(xq_all), -1, dtype=np.int64)
    retrains = 0
    rows = range(len(xq_all))
    if progress:
        from tqdm import tqdm
        rows = tqdm(rows, desc="attack", unit="query")
    for q in rows:
        plan, probes = attack.plan(xq_all[q], grid[-1], int(served[q]))
        retrains += probes

        def flips(k: int) -> bool:
            nonlocal retrains
            retrains += 1
            params = train_nominal(attack.cfg, attack.poisoned(plan, k))
            return int(attack.predict(params, xq_all[q:q + 1])[0]) != int(served[q])

        if not flips(grid[-1]):
            continue
        lo, hi = -1, len(grid) - 1          # grid[hi] flips; below lo nothing is known to flip
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if flips(grid[mid]):
                hi = mid
            else:
                lo = mid
        flip[q] = grid[hi]
    return FlipResult(served.astype(np.int64), flip, tuple(grid), retrains)
