"""The AGT training loop (paper Algorithm 1 with the privacy rule of Thm 4.6).

One pass trains the nominal model and, for every k of the grid, interval bounds on the
parameters any dataset within distance k could produce. The k values share the nominal
trajectory, the data pipeline and (while their boxes coincide, i.e. at the first step) the
interval pass itself; afterwards the boxes of a group of k values are stacked and bounded
in one vectorised pass (agt/bound_pass.py).

The pieces: the training records and the features of a frozen prefix (agt/features.py),
the nominal descent direction (agt/nominal.py), the interval pass (agt/bound_pass.py), the
k-box updates under each placement (agt/box_updates.py, agt/placement.py), the overflow
guards (agt/overflow.py). This module prepares them from the config (`prepare`) and runs
the steps (`run`).

Nominal training rule (what the bundle's nominal parameters are; anyone can re-run it):
the descent direction of agt/nominal.py (per-sample gradients clamped elementwise to
[-gamma, gamma], their mean summed in float64, rounded once to the training dtype and
clamped again); update by agt/optim.py with lr_t = max(lr / (1 + lr_decay t), lr_min);
batches: epoch e uses the permutation ``torch.randperm(n, generator=seed * 1000003 + e)``
cut into consecutive batches of ``batch_size`` (the last one may be smaller);
``batch_size: full`` makes every epoch one batch of all n records, whatever n is. The
order each epoch used is stored in the bundle (``/order``).

Bound method (config ``bound_method``): "served-k0" (default) stores the served parameters
themselves as the k = 0 box (`served_k0_box`: valid, nested and smooth); "interval" keeps
the paper's interval box at k = 0 too. Boxes of k >= 1 are the interval pass's under all
methods; "stability" (a linear head trained by gradient descent, full-batch or on
minibatches, inside a declared input domain) adds one L2 ball per k around the served
parameters (agt/stability.py), a query is certified at k when its box or its ball
certifies, and with ``k_boxes: ball`` (its default) the boxes of k >= 1 are those enclosing
the balls and no interval pass runs.

Overflow: the bounds model rounding, not overflow; training refuses, from the config alone,
a run that could overflow whatever the data, and bounds a record that could by the whole
clamp range (agt/overflow.py).

Placement (config ``k_placement``): "per-batch" (default, the paper) lets every batch hold up
to k replaced records; "per-epoch" lets the batches of one epoch hold at most k together,
which is what a replace-one neighbour does (agt/placement.py: a dynamic programme over the
replaced records met so far in the epoch). Tighter on minibatches, the same boxes with one
batch per epoch, and it costs sum over the grid of (k + 1) boxes per step after the first
epoch instead of one per grid value. Its passes are graded by the programme's state, so
its computed boxes nest and its radii are smooth (agt/placement.py).

Neighbouring relations certified. Batches are a function of the record index, so replacing
up to k records keeps every batch slot: every bundle certifies ``replace-one``. With
``batch_size: full`` every dataset is trained as one batch per epoch, the divisor is the
actual dataset size and the top-k rule also covers removing r and adding a records with
a + r <= k (agt/topk.py), so such bundles certify ``add-remove`` too. An integer batch
size never does, even one >= n + max(k) that makes every neighbour one batch: whether it
does would depend on n, which add-remove neighbours do not share, so D could claim
add-remove where D plus one record refuses (a refusal that reveals the data). A smaller
integer batch with b >= n could not anyway: a neighbour with more than b records is
trained as two batches, in another order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from agt.bound_pass import IntervalPass
from agt.bounded.losses import check_logits
from agt.bounded.network import Network
from agt.box_updates import BoxUpdate, budget_hulls
from agt.config import TrainConfig
from agt.data import Dataset, validate_dataset
from agt.errors import ConfigError, DataError, SoundnessError
from agt.features import FrozenPrefix, TrainingRecords
from agt.interval import BOUND_DTYPE, FloatModel, Interval
from agt.models import ModelSpec, init_params
from agt.nominal import NominalGradient
from agt.optim import UpdateRule, round_to
from agt.overflow import OverflowGuard
from agt.placement import EpochBudgetBoxes
from agt.stability import (
    StabilityProblem,
    StabilityStep,
    ball_boxes,
    check_domain,
    parameter_norm,
)
from agt.tensors import resolve_device, strict_kernels, torch_dtype

REPLACE = "replace-one"
ADD_REMOVE = "add-remove"


@dataclass
class TrainResult:
    """A run's nominal parameters, and its bounds for every k of the grid."""
    config: TrainConfig
    spec: ModelSpec
    k_values: tuple[int, ...]
    init: dict[str, torch.Tensor]
    nominal: dict[str, torch.Tensor]
    lower: dict[str, torch.Tensor] | None          # name -> (K, *shape) float64
    upper: dict[str, torch.Tensor] | None
    order: np.ndarray                              # (epochs, n) record indices
    relations: tuple[str, ...]
    dataset_sha256: str
    n_train: int
    seconds: float
    extra: dict = field(default_factory=dict)
    ball_radius: np.ndarray | None = None          # (K,) bound method "stability"


@dataclass(frozen=True)
class StepBounds:
    """What the interval pass knows before update ``step``: its batch (record indices), the
    rounded learning rate, and the boxes (K, ...) of every trainable parameter and of the
    momentum buffer (None before the first sgdm step and for plain sgd) for every k."""
    step: int
    batch: np.ndarray
    lr: float
    theta: dict[str, Interval]
    velocity: dict[str, Interval | None] | None


def epoch_orders(n: int, n_epochs: int, seed: int) -> np.ndarray:
    """The record order of every epoch (module docstring, nominal training rule).

    Args:
        n: the number of training records.
        n_epochs: the number of epochs.
        seed: the config's seed.

    Returns:
        (n_epochs, n) int64: row e is ``torch.randperm(n)`` under the generator seeded
        ``seed * 1000003 + e``."""
    orders = np.empty((n_epochs, n), dtype=np.int64)
    for e in range(n_epochs):
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + e)
        orders[e] = torch.randperm(n, generator=gen).numpy()
    return orders


def _batches(order: np.ndarray, batch_size: int) -> list[np.ndarray]:
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def load_pretrained(path: str | Path, spec: ModelSpec, params: dict[str, torch.Tensor]) -> dict:
    """Overwrite initial parameters with those of a state dict (.pt or .npz).

    Args:
        path: the state dict's file: a torch .pt (loaded with weights_only) or a numpy .npz.
        spec: the model (not read: names and shapes come from ``params``).
        params: the initial parameters, name -> tensor.

    Returns:
        A new dict: ``params`` with every tensor of the file in its place, cast to that
        parameter's dtype.

    Raises:
        ConfigError: the file is missing or unreadable, or a parameter's name, shape or
            values do not fit the model."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"pretrained file not found: {path}")
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as f:
                state = {k: torch.as_tensor(f[k]) for k in f.files}
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch/numpy raise many types for a file that is not theirs
        raise ConfigError(f"pretrained file {path} is not a readable .pt or .npz state dict "
                          f"({type(exc).__name__})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ConfigError(f"pretrained file {path} must hold a state dict (parameter name -> "
                          f"tensor)")
    out = dict(params)
    for name, value in state.items():
        if name not in params:
            raise ConfigError(f"pretrained parameter '{name}' does not exist in the model; "
                              f"model parameters: {sorted(params)}")
        if tuple(value.shape) != tuple(params[name].shape):
            raise ConfigError(f"pretrained parameter '{name}' has shape {tuple(value.shape)}, "
                              f"the model needs {tuple(params[name].shape)}")
        if not bool(torch.isfinite(value).all()):
            raise ConfigError(f"pretrained parameter '{name}' has NaN or infinite values")
        out[name] = value.to(params[name].dtype).clone()
    return out


def certified_relations(cfg: TrainConfig) -> tuple[str, ...]:
    """The neighbouring relations a bundle of ``cfg`` certifies (module docstring), decided
    from the config alone: a test on n would make the claim depend on the data.

    Args:
        cfg: the training config.

    Returns:
        (REPLACE, ADD_REMOVE) under ``batch_size: full``, else (REPLACE,); bound method
        stability always (REPLACE,): its balls hold for a fixed divisor n
        (agt/stability.py)."""
    if cfg.bound_method == "stability":
        return (REPLACE,)
    return (REPLACE, ADD_REMOVE) if cfg.full_batch else (REPLACE,)


@dataclass(frozen=True)
class TrainingSetup:
    """What a run derives from its config and dataset before the first step (`prepare`).

    ``trainable``: the trainable parameters' names; ``init``: every parameter's initial
    value on the training device; ``stability``: the balls' problem (bound method
    stability) or None; ``nominal``, ``passes``, ``boxes``, ``overflow``: the nominal
    direction, the interval pass, the k-box updates and the overflow guards on these
    records."""
    cfg: TrainConfig
    device: torch.device
    dtype: torch.dtype
    spec: ModelSpec
    n: int
    batch_size: int
    relations: tuple[str, ...]
    rule: UpdateRule
    init: dict[str, torch.Tensor]
    trainable: tuple[str, ...]
    prefix: FrozenPrefix
    records: TrainingRecords
    stability: StabilityProblem | None
    nominal: NominalGradient
    passes: IntervalPass
    boxes: BoxUpdate
    overflow: OverflowGuard


def prepare(cfg: TrainConfig, ds: Dataset, device: torch.device) -> TrainingSetup:
    """Check ``cfg`` against ``ds`` and prepare a run.

    Args:
        cfg: the training config.
        ds: the dataset (validated).
        device: the training device.

    Returns:
        The run's `TrainingSetup`.

    Raises:
        ConfigError, DataError: the config does not fit the data (labels, logits, a k not
            below an integer batch size, a record outside the declared input domain)."""
    dtype = torch_dtype(cfg.dtype)
    fm = FloatModel(dtype)
    spec = cfg.model.with_input_shape(ds.feature_shape)
    check_logits(cfg.loss, spec.n_logits)
    check_labels(ds, spec.n_classes)
    n = ds.n_train
    batch_size = cfg.batch_for(n)
    if not cfg.full_batch:
        # under `full` the batch is n, which add-remove neighbours do not share: k >= n
        # is allowed there (the bound is then the clamp range, agt/topk.py)
        cfg.k_values.require_below(batch_size)
    relations = certified_relations(cfg)
    gamma = cfg.clip_gamma
    rule = UpdateRule.from_config(cfg, dtype)
    params = init_params(spec, cfg.seed, dtype)
    if cfg.pretrained:
        params = load_pretrained(cfg.pretrained, spec, params)
    init = {k: v.to(device) for k, v in params.items()}
    trainable = tuple(spec.trainable_param_names())
    net = Network.trainable(spec)
    prefix = FrozenPrefix.of_model(spec, init, fm, cfg.fragment_size, ADD_REMOVE in relations)
    records = TrainingRecords.prepare(ds, prefix, dtype, device)
    stability = clip_floor = None
    # per-sample arithmetic of the nominal rule: the training dtype, or float64 where the
    # stability radii charge float64's rounding for it (``compute64``; the records are then
    # x_bounds, already their exact float64 copy: no frozen prefix)
    compute_dtype, x_compute = dtype, records.x_nominal
    if cfg.bound_method == "stability":
        check_domain(records.x_bounds.cpu().numpy(), cfg.input_norm_bound)
        stability = StabilityProblem.for_model(cfg, spec, rule.l2, n)
        if stability.compute64:
            compute_dtype, x_compute = torch.float64, records.x_bounds
        if cfg.clip_norm is not None:
            clip_floor = stability.clip_floors(records.x_nominal)
    nominal = NominalGradient(net, x_compute, records.y, cfg.loss, gamma, dtype, compute_dtype,
                              cfg.fragment_size, clip_floor, device)
    passes = IntervalPass(net, records, cfg.loss, gamma, fm,
                          {name: init[name].shape for name in trainable}, cfg.fragment_size,
                          device)
    overflow = OverflowGuard(rule, net, {name: init[name] for name in trainable}, gamma, dtype,
                             records.input_shape, records.magnitudes)
    return TrainingSetup(cfg, device, dtype, spec, n, batch_size, relations, rule, init,
                         trainable, prefix, records, stability, nominal, passes,
                         BoxUpdate(rule, passes, trainable, gamma, fm), overflow)


class _BallSteps:
    """The steps of the stability balls' recursion (agt/stability.py), recorded as the run
    goes: per step its epoch, learning rate, batch size, the batch's feature bound beta and
    the norm of the parameters before it."""

    def __init__(self, problem: StabilityProblem, x: torch.Tensor, n: int):
        self.problem, self.x, self.n = problem, x, n
        self.steps: list[StabilityStep] = []
        self._whole_beta = None

    def record(self, epoch: int, lr: float, idx: torch.Tensor, theta: dict) -> None:
        if len(idx) < self.n:
            beta = self.problem.batch_beta(self.x[idx])
        else:                       # one batch of all records: the same every epoch
            if self._whole_beta is None:
                self._whole_beta = self.problem.batch_beta(self.x)
            beta = self._whole_beta
        self.steps.append(StabilityStep(epoch, lr, len(idx), beta, parameter_norm(theta)))


def run(setup: TrainingSetup, with_bounds: bool, progress: bool, ds_sha: str,
        step_callback: Callable | None = None,
        bounds_callback: Callable | None = None) -> TrainResult:
    """Train the nominal model and, with ``with_bounds``, the bounds of every k.

    Args:
        setup: the prepared run (`prepare`).
        with_bounds: compute the bounds (else the grid is (0,) and only the nominal
            parameters are meaningful).
        progress: show a progress bar.
        ds_sha: the dataset's hash, stored in the result.
        step_callback, bounds_callback: as in `train`.

    Returns:
        The `TrainResult`."""
    t_start = time.perf_counter()
    cfg, trainable = setup.cfg, setup.trainable
    k_list = tuple(cfg.k_values) if with_bounds else (0,)
    theta = {n: setup.init[n].clone() for n in trainable}
    buf: dict[str, torch.Tensor | None] = {n: None for n in trainable}
    orders = epoch_orders(setup.n, cfg.n_epochs, cfg.seed)
    plan = [(e, b) for e in range(cfg.n_epochs) for b in _batches(orders[e], setup.batch_size)]
    lrs = [round_to(cfg.learning_rate_at(step), setup.dtype) for step in range(len(plan))]
    # k_boxes "ball": the boxes of k >= 1 come from the stability balls after the run
    boxes = (_KBoxes(setup, k_list, theta, lrs, plan)
             if with_bounds and cfg.k_boxes == "interval" else None)
    balls = (_BallSteps(setup.stability, setup.records.x_bounds, setup.n)
             if setup.stability is not None and with_bounds else None)
    k_max = int(max(k_list)) if boxes is not None and cfg.selection == "threshold" else 0
    bar = tqdm(plan, desc=f"AGT train (K={len(k_list)})" if with_bounds else "train",
               unit="step", disable=not progress, leave=False)
    for step, (epoch, batch) in enumerate(bar):
        idx = torch.as_tensor(batch, device=setup.device)
        lr = lrs[step]
        if balls is not None:
            balls.record(epoch, lr, idx, theta)
        direction, stats = setup.nominal.direction(theta, idx, k_max=k_max)
        if boxes is not None:
            if bounds_callback is not None:
                bounds_callback(StepBounds(step, batch, lr, boxes.theta, boxes.velocity))
            boxes.update(step, epoch, idx, lr, stats)
        for n in trainable:
            theta[n], buf[n] = setup.rule.nominal(theta[n], buf[n], direction[n], lr)
        if boxes is not None:
            boxes.check(theta, step)
        if step_callback is not None:
            step_callback(step, theta, None if boxes is None else boxes.theta)
    bar.close()
    nominal = {k: v.clone() for k, v in setup.init.items()}
    nominal.update(theta)
    lower = upper = ball = None
    if balls is not None:
        setup.stability.check_overflow(balls.steps)
        ball = setup.stability.radii(k_list, balls.steps)
    if with_bounds:
        lower, upper = _final_bounds(setup, k_list, nominal,
                                     None if boxes is None else boxes.theta, ball)
    return TrainResult(cfg, setup.spec, k_list, setup.init, nominal, lower, upper, orders,
                       setup.relations, ds_sha, setup.n, time.perf_counter() - t_start,
                       ball_radius=ball)


class _KBoxes:
    """The interval pass's k-boxes through a run: ``theta`` and ``velocity`` (name -> box
    (K, ...), momentum boxes None before the first sgdm step and for plain sgd), updated
    per batch (the paper) or by the per-epoch placement programme (agt/placement.py)."""

    def __init__(self, setup: TrainingSetup, k_list: tuple[int, ...],
                 theta0: dict[str, torch.Tensor], lrs: list[float], plan: list):
        self.setup, self.plan = setup, plan
        self.k = torch.tensor(k_list, dtype=torch.int64, device=setup.device)
        K = len(k_list)
        self.theta = {n: Interval.exact(t.unsqueeze(0).expand(K, *t.shape).clone())
                      for n, t in theta0.items()}
        self.velocity: dict[str, Interval | None] = {n: None for n in theta0}
        # bounds on every run's parameters from the config alone: the overflow refusal and
        # the records marked at each step read nothing else (docs/privacy.md)
        self.public = setup.overflow.public_bounds(lrs)
        # per-epoch placement budget (agt/placement.py); with one batch per epoch it gives
        # the paper's boxes, which the paper pass computes faster
        self.budget = None
        if setup.cfg.k_placement == "per-epoch" and setup.batch_size < setup.n:
            self.budget = EpochBudgetBoxes(k_list, theta0,
                                           setup.passes.boxes_per_pass(k_list, setup.batch_size))

    def update(self, step: int, epoch: int, idx: torch.Tensor, lr: float, stats) -> None:
        """The boxes after update ``step`` on batch ``idx`` (of ``epoch``); ``stats``: the
        threshold rule's nominal buffers, or None."""
        marked = self.setup.overflow.marked_records(self.public.params[step])
        if self.budget is None:
            self.theta, self.velocity = self.setup.boxes.per_batch(
                self.theta, self.velocity, self.k, idx, lr, step == 0, stats, self.public,
                step + 1, marked)
            return
        self.budget.step(self.setup.boxes.per_epoch_evaluator(idx, lr, step == 0, self.public,
                                                              step + 1, marked))
        if step + 1 == len(self.plan) or self.plan[step + 1][0] != epoch:
            self.budget.end_epoch()
        self.theta, self.velocity = budget_hulls(self.budget)

    def check(self, theta: dict[str, torch.Tensor], step: int) -> None:
        """Refuse unless the nominal parameters after ``step`` lie in every k-box."""
        for name, box in self.theta.items():
            inside = box.contains(theta[name].unsqueeze(0))
            if not bool(inside.all()):
                raise SoundnessError(f"internal soundness check failed at step {step}: "
                                     f"nominal '{name}' left its k-box; refusing to write "
                                     "certificates")


def _final_bounds(setup: TrainingSetup, k_list: tuple[int, ...],
                  nominal: dict[str, torch.Tensor], boxes: dict[str, Interval] | None,
                  ball: np.ndarray | None):
    """The (lower, upper) bounds (K, ...) of every parameter after the run: the interval
    pass's boxes, or those enclosing the balls (``boxes`` None), exact points for frozen
    parameters, and the served parameters at k = 0 under served-k0 and stability."""
    if not all(bool(torch.isfinite(v).all()) for v in nominal.values()):
        raise DataError(f"training diverged: the served parameters are not finite in "
                        f"{setup.cfg.dtype}; lower the learning rate or clip_gamma, rescale "
                        "the features, or train in float64")
    if boxes is None:
        boxes = {n: ball_boxes(nominal[n], ball) for n in setup.trainable}
    K = len(k_list)
    lower, upper = {}, {}
    for name, value in nominal.items():
        if name in boxes:
            lower[name], upper[name] = boxes[name].lo, boxes[name].hi
        else:  # frozen: exact
            v = value.to(BOUND_DTYPE).unsqueeze(0).expand(K, *value.shape)
            lower[name], upper[name] = v.clone(), v.clone()
    if setup.cfg.bound_method in ("served-k0", "stability"):
        lower, upper = served_k0_box(k_list, nominal, lower, upper)
    return lower, upper


def served_k0_box(k_values: tuple[int, ...], nominal: dict[str, torch.Tensor],
                  lower: dict[str, torch.Tensor], upper: dict[str, torch.Tensor]):
    """The k = 0 box of bound method "served-k0": the served parameters themselves.

    Returns new (lower, upper) dicts whose grid entry k = 0 is [theta_f, theta_f], theta_f =
    ``nominal`` (the parameters the nominal training rule computed in the nominal dtype on
    this run: what the bundle stores under /nominal and serves); the entries k >= 1 are the
    interval boxes, unchanged. Exact: theta_f is float32 or float64 and the bounds float64.

    Why. The interval method's k = 0 box contains, besides theta_f, the exact-arithmetic
    training run on D, so its width is the float rounding of every step amplified by the
    interval wrapping effect; after 10 full-batch float32 steps it is wide enough to make
    most k = 0 certificates fail although nothing about the data is uncertain (rounding
    masquerading as instability).

    Soundness (validity, Def. 4.3). The only dataset within distance 0 of D is D, and the
    only model trained on D that is ever served or released is theta_f (readers refuse a
    served model whose parameters differ from /nominal). So {theta_f} is valid at k = 0.
    The exact-arithmetic run, or a re-run of the nominal rule with another summation order
    (another device or thread count), is not served; it is still contained in every box of
    k >= 1, since those contain every float evaluation of training on every dataset within
    distance k, D itself included.

    Nesting in k. theta_f lies in every k-box (checked after every step by
    `_KBoxes.check` and on load by `agt.store.validate_bundle`), so box(D, 0) is inside
    box(D, k) for every k: the boxes stay nested and certification stays monotone in k.

    Smoothness (r(D') >= r(D) - 1 for neighbours D, D' under the certified relation, r the
    grid-index radius, with a smooth selection rule). r(D) <= 0: r(D') >= -1 always holds.
    r(D) = j >= 2: the certificate of D at g_j is decided on box(D, g_j), a box of k >= 1,
    and the nesting argument of the interval method (box(D', g_{j-1}) inside box(D, g_j),
    agt/topk.py) involves boxes of k >= 1 only, which this method leaves unchanged.
    r(D) = 1: box(D, g_1) (g_1 >= 1) certifies the served class c of D. It is valid at
    distance 1, so it contains theta_f(D'), the served parameters of D' (float runs
    included, see above), and the certifier's interval evaluation over a point inside a box
    is at least as decisive as over the box (inclusion isotonicity of interval arithmetic,
    the same property the interval method's nesting proof rests on). So the point box
    {theta_f(D')} certifies, and the class it certifies is the class theta_f(D') serves,
    which is c: r(D') >= 0 = r(D) - 1. In the k = 0 grid entry the two methods differ only
    by the k = 0 box shrinking to a point inside the interval k = 0 box, so every k = 0
    certificate of the interval method is one of this method as well. QED
    """
    if not k_values or k_values[0] != 0:
        raise ConfigError("the k grid must start at 0 (agt/kgrid.py)")
    lower = {n: t.clone() for n, t in lower.items()}
    upper = {n: t.clone() for n, t in upper.items()}
    for name, value in nominal.items():
        point = value.detach().to(lower[name].device, BOUND_DTYPE)
        if not torch.equal(point.to(value.dtype), value.to(point.device)):
            raise SoundnessError(f"internal: the served parameters '{name}' are not exactly "
                                 f"representable in the bound dtype; refusing the k = 0 box")
        lower[name][0] = point
        upper[name][0] = point
    return lower, upper


def check_labels(ds: Dataset, n_classes: int) -> None:
    """Training and test labels must be classes the model can predict.

    Args:
        ds: the dataset.
        n_classes: the classes the model predicts.

    Raises:
        DataError: a label of either split is ``n_classes`` or more."""
    for split, y in (("y_train", ds.y_train), ("y_test", ds.y_test)):
        if y is not None and y.size and int(y.max()) >= n_classes:
            raise DataError(f"{split} has labels up to {int(y.max())} but the model predicts "
                            f"{n_classes} classes (0..{n_classes - 1}); fix the labels or the "
                            f"model's output layer")


def train(cfg: TrainConfig, ds: Dataset, *, with_bounds: bool = True, progress: bool = False,
          step_callback: Callable | None = None,
          bounds_callback: Callable | None = None) -> TrainResult:
    """Run AGT (nominal training + bounds for every k of ``cfg.k_values``).

    Args:
        cfg: the training config.
        ds: the dataset (validated here).
        with_bounds: compute the bounds; False trains the nominal model only.
        progress: show a progress bar.
        step_callback: ``step_callback(step, theta, boxes)`` sees the nominal parameters
            and boxes after each step.
        bounds_callback: ``bounds_callback(StepBounds)`` sees the interval pass's boxes
            before each update (agt/trajectory.py keeps them).

    Returns:
        The `TrainResult`."""
    validate_dataset(ds)
    device = resolve_device(cfg.device)
    with strict_kernels(device):
        setup = prepare(cfg, ds, device)
        return run(setup, with_bounds, progress, ds.sha256(), step_callback, bounds_callback)


def train_nominal(cfg: TrainConfig, ds: Dataset) -> dict[str, torch.Tensor]:
    """Nominal parameters only (the same code path as the AGT run's nominal).

    Args:
        cfg: the training config.
        ds: the dataset.

    Returns:
        name -> nominal parameter tensor."""
    return train(cfg, ds, with_bounds=False).nominal
