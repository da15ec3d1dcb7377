"""The AGT training loop (paper Algorithm 1 with the privacy rule of Thm 4.6).

One pass trains the nominal model and, for every k of the grid, interval bounds on the
parameters any dataset within distance k could produce. The k values share the nominal
trajectory, the data pipeline and (while their boxes coincide, i.e. at the first step) the
interval pass itself; afterwards the boxes of a group of k values are stacked and bounded
in one vectorised pass.

Nominal training rule (what the bundle's nominal parameters are; anyone can re-run it):
per-sample gradients of the loss (agt/bounded; with config ``clip_norm`` C, bound method
stability only, of each record's clipped loss, whose gradient has L2 norm <= C:
agt/stability.py), clamped elementwise to [-gamma, gamma],
summed in float64 and divided by the batch size, rounded once to the training dtype and
clamped to [-gamma, gamma] again (an ulp of rounding; since 0.3.7) (under
stability with ``k_boxes: ball`` the logits and per-sample gradients are computed in
float64 too, from the dtype parameters and records);
update by agt/optim.py with lr_t = max(lr / (1 + lr_decay t), lr_min); batches: epoch e
uses the permutation ``torch.randperm(n, generator=seed * 1000003 + e)`` cut into
consecutive batches of ``batch_size`` (the last one may be smaller); ``batch_size: full``
makes every epoch one batch of all n records, whatever n is. The order each epoch used is
stored in the bundle (``/order``).

Bound method (config ``bound_method``): "served-k0" (default) stores the served parameters
themselves as the k = 0 box (`served_k0_box`: valid, nested and smooth); "interval" keeps
the paper's interval box at k = 0 too. Boxes of k >= 1 are the interval pass's under all
methods; "stability" (a linear head trained by gradient descent, full-batch or on
minibatches, inside a declared input domain) adds one L2 ball per k around the served
parameters (agt/stability.py), a query is certified at k when its box or its ball
certifies, and with ``k_boxes: ball`` (its default) the boxes of k >= 1 are those enclosing
the balls and no interval pass runs.

Overflow (since 0.3.7). The bounds model rounding, not overflow. Bounds on the nominal
run's parameters and velocities at every step hold for every dataset, from the config alone
(`UpdateRule.public_magnitudes`: the nominal mean is clamped to gamma). Training
refuses when they, or the gradient of a record of zeros under them, could come near
max(dtype) (`_public_magnitudes`): a refusal that reads no record, so D and its neighbours
refuse alike. A record whose own gradient could overflow under them is marked at that step
(`_mark_records`) and bounded by the whole clamp range, which holds whatever the overflow
does; the boxes are cut to the public bounds after every update (`_within`), which keeps
the float64 bound arithmetic far from overflow however loose they grow.

Placement (config ``k_placement``): "per-batch" (default, the paper) lets every batch hold up
to k replaced records; "per-epoch" lets the batches of one epoch hold at most k together,
which is what a replace-one neighbour does (agt/placement.py: a dynamic programme over the
replaced records met so far in the epoch). Tighter on minibatches, the same boxes with one
batch per epoch, and it costs sum over the grid of (k + 1) boxes per step after the first
epoch instead of one per grid value. Its passes are graded by the programme's state, so
since 0.3.8 its computed boxes nest and its radii are smooth (agt/placement.py).

Neighbouring relations certified. Batches are a function of the record index, so replacing
up to k records keeps every batch slot: every bundle certifies ``replace-one``. With
``batch_size: full`` every dataset is trained as one batch per epoch, the divisor is the
actual dataset size and the top-k rule also covers removing r and adding a records with
a + r <= k (agt/topk.py), so such bundles certify ``add-remove`` too. An integer batch
size never does, even one >= n + max(k) that makes every neighbour one batch: whether it
does would depend on n, which add-remove neighbours do not share, so D could claim
add-remove where D plus one record refuses (a refusal that reveals the data; since
0.3.7). A smaller integer batch with b >= n could not anyway: a neighbour with more than
b records is trained as two batches, in another order.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from agt.bounded.losses import check_logits
from agt.bounded.network import Network
from agt.config import TrainConfig
from agt.data import Dataset, validate_dataset
from agt.errors import ConfigError, DataError, SoundnessError
from agt.interval import BOUND_DTYPE, FloatModel, Interval, nested_along_first
from agt.models import ModelSpec, infer_shapes, init_params
from agt.optim import UpdateRule, round_to
from agt.placement import EpochBudgetBoxes
from agt.stability import StabilityProblem, StabilityStep, ball_boxes, check_domain, parameter_norm
from agt.tensors import overflow_limit, resolve_device, strict_kernels, torch_dtype
from agt.topk import (
    DescentAccumulator,
    ThresholdAccumulator,
    clamp_limit,
    nesting_allowance,
    order_statistics,
)

# Memory budgets (elements of float64 temporaries per chunk; bytes of top-k buffers).
WORK_ELEMENTS = 1 << 21
BUFFER_BYTES = 768 << 20

REPLACE = "replace-one"
ADD_REMOVE = "add-remove"


@dataclass
class TrainResult:
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
    orders = np.empty((n_epochs, n), dtype=np.int64)
    for e in range(n_epochs):
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + e)
        orders[e] = torch.randperm(n, generator=gen).numpy()
    return orders


def _batches(order: np.ndarray, batch_size: int) -> list[np.ndarray]:
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def load_pretrained(path: str | Path, spec: ModelSpec, params: dict[str, torch.Tensor]) -> dict:
    """Overwrite initial parameters with those of a state dict (.pt or .npz)."""
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


class _Trainer:
    def __init__(self, cfg: TrainConfig, ds: Dataset, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.dtype = torch_dtype(cfg.dtype)
        self.fm = FloatModel(self.dtype)
        self.spec = cfg.model.with_input_shape(ds.feature_shape)
        check_logits(cfg.loss, self.spec.n_logits)
        check_labels(ds, self.spec.n_classes)
        self.n = ds.n_train
        self.batch_size = cfg.batch_for(self.n)
        if not cfg.full_batch:
            # under `full` the batch is n, which add-remove neighbours do not share: k >= n
            # is allowed there (the bound is then the clamp range, agt/topk.py)
            cfg.k_values.require_below(self.batch_size)
        # from the config alone: a test on n would make the claim depend on the data
        self.relations = (REPLACE, ADD_REMOVE) if cfg.full_batch else (REPLACE,)
        self.stability = None
        if cfg.bound_method == "stability":
            # the balls hold for a fixed divisor n: replace-one only (agt/stability.py)
            self.relations = (REPLACE,)
        self.gamma = cfg.clip_gamma
        self.rule = UpdateRule.from_config(cfg, self.dtype)
        params = init_params(self.spec, cfg.seed, self.dtype)
        if cfg.pretrained:
            params = load_pretrained(cfg.pretrained, self.spec, params)
        self.init = {k: v.to(device) for k, v in params.items()}
        self.trainable = self.spec.trainable_param_names()
        self.net = Network.trainable(self.spec)
        self.prefix = Network.prefix(self.spec)
        x = torch.as_tensor(ds.x_train, dtype=self.dtype, device=device)
        self.y = torch.as_tensor(ds.y_train, dtype=torch.int64, device=device)
        self.x_nominal, self.x_bounds = self._features(x)
        self.feature_magnitude = self._feature_magnitudes(x)
        # records whose nominal gradient could overflow at the current step (`_mark_records`)
        self.beyond: torch.Tensor | None = None
        self.clip_floor = None
        # per-sample arithmetic of the nominal rule: the training dtype, or float64 where
        # the stability radii charge float64's rounding for it (``compute64``, below; the
        # records are then x_bounds, already their exact float64 copy: no frozen prefix)
        self.compute_dtype = self.dtype
        self.x_compute = self.x_nominal
        if cfg.bound_method == "stability":
            check_domain(self.x_bounds.cpu().numpy(), cfg.input_norm_bound)
            self.stability = StabilityProblem.for_model(cfg, self.spec, self.rule.l2, self.n)
            if self.stability.compute64:
                self.compute_dtype, self.x_compute = torch.float64, self.x_bounds
            if cfg.clip_norm is not None:
                self.clip_floor = self.stability.clip_floors(self.x_nominal)

    def _features(self, x: torch.Tensor):
        """Inputs of the trainable part: nominal (dtype) and for the bound pass an exact
        float64 tensor, or, behind a frozen prefix, a rounding-widened Interval (1, n, ...)
        that holds whatever the float prefix returns for a record in any batch layout, and
        is the same floats for a kept record in the run on any neighbour (`feature_boxes`)."""
        if not self.prefix.layers:
            return x, x.to(BOUND_DTYPE)
        frozen = {k: v for k, v in self.init.items() if k not in self.trainable}
        step = max(1, self.cfg.fragment_size)
        with torch.no_grad():
            nom = [self.prefix.forward_nominal(frozen, x[i:i + step])[0]
                   for i in range(0, x.shape[0], step)]
            # add-remove moves records between passes: one record per pass (feature_boxes)
            rows = 1 if ADD_REMOVE in self.relations else step
            boxes = self.prefix.feature_boxes(frozen, x, self.fm, rows)
        return torch.cat(nom), boxes

    def _feature_magnitudes(self, x: torch.Tensor) -> torch.Tensor:
        """Per record, a bound on every entry (and partial sum) of the frozen prefix's
        nominal pass and its output (`Network.forward_magnitudes` from the record's largest
        |entry| as the dtype holds it; without a prefix that entry itself). inf or NaN for a
        record that is not finite in the dtype."""
        n = x.shape[0]
        raw = (x.reshape(n, -1).abs().amax(1).to(torch.float64) if x[0].numel()
               else torch.zeros(n, dtype=torch.float64, device=x.device))
        if not self.prefix.layers:
            return raw
        frozen = {k: float(v.abs().max()) for k, v in self.init.items()
                  if k not in self.trainable}
        return self.prefix.forward_magnitudes(frozen, raw)

    def _public_magnitudes(self, lrs: list[float]):
        """Bounds on the nominal run's parameters at every step, from the config alone
        (`UpdateRule.public_magnitudes`), and the refusal they decide: training refuses
        when an intermediate of some update, or of the gradient of a record of zeros, could
        come near the dtype's largest value. Nothing here reads a record, so D and every
        neighbour refuse or train alike (records that could overflow are `_mark_records`'
        business)."""
        # the nominal mean is clamped to gamma as the dtype holds it (`nominal_direction`)
        d_max = round_to(self.gamma, self.dtype)
        start = {n: float(self.init[n].abs().max()) if self.init[n].numel() else 0.0
                 for n in self.trainable}
        public = self.rule.public_magnitudes(start, lrs, d_max, self.dtype)
        for t, lr in enumerate(lrs):
            if not self.rule.check_coefficients(lr, t == 0):
                raise DataError(f"the learning rate at step {t} ({lr:.3g}) times the "
                                "optimizer's constants underflows float64, which the interval "
                                "update does not model: raise learning_rate or lr_min")
        limit = overflow_limit(self.dtype)
        shape = tuple(self.x_nominal.shape[1:])
        for t, worst_update in enumerate(public.worst):
            worst = max(float(self.net.gradient_magnitudes(public.params[t], 0.0, shape)),
                        worst_update)
            if not worst <= limit:
                raise DataError(f"the {self.cfg.dtype} training computation could overflow "
                                f"(at step {t}, an intermediate of magnitude up to {worst:.3g} "
                                f"whatever the data; the bounds hold below {limit:.3g}): lower "
                                "the learning rate, clip_gamma or the number of steps, or "
                                "train in float64")
        return public

    def _mark_records(self, params: dict[str, float]) -> None:
        """Records whose nominal per-sample gradient could overflow the dtype for some
        parameters with |theta| <= ``params`` (`Network.gradient_magnitudes` from their
        prefix bound): their gradient bounds are the whole clamp range (`_stream_bounds`),
        which holds whatever the overflow does (the nominal rule sends +-inf to +-gamma and
        counts a NaN as 0). The test reads the record and public bounds only, so a record
        kept by a neighbour is marked in both runs."""
        limit = overflow_limit(self.dtype)
        worst = self.net.gradient_magnitudes(params, self.feature_magnitude,
                                             tuple(self.x_nominal.shape[1:]))
        beyond = ~(worst <= limit)
        self.beyond = beyond if bool(beyond.any()) else None

    def _bound_inputs(self, idx: torch.Tensor, beyond: torch.Tensor | None = None):
        """The bound pass's inputs for records ``idx``; rows flagged in ``beyond`` are
        zeros (their bounds are replaced anyway, and an overflowing row would only make
        NaN)."""
        xb = self.x_bounds
        if isinstance(xb, Interval):
            out = Interval(xb.lo[:, idx], xb.hi[:, idx])
            if beyond is not None:
                out.lo[:, beyond] = 0.0
                out.hi[:, beyond] = 0.0
            return out
        out = xb[idx]
        if beyond is not None:
            out[beyond] = 0.0
        return out

    # -- nominal ---------------------------------------------------------------------------
    def nominal_direction(self, theta: dict, idx: torch.Tensor, k_max: int = 0):
        """Nominal clamped mean gradient; with ``k_max`` also the streamed top-k_max
        buffers of the nominal per-sample gradients (thresholds for selection=threshold)."""
        sums = {n: torch.zeros(theta[n].numel(), dtype=torch.float64, device=self.device)
                for n in self.trainable}
        theta_c = {n: t.to(self.compute_dtype) for n, t in theta.items()}
        frag = self.cfg.fragment_size
        # Thresholds only need to be good, not exact (any threshold is sound): take the order
        # statistics of the first fragment (the batch is a random permutation), at ranks
        # scaled to the fragment, so this costs one selection over one fragment.
        first = min(frag, len(idx))
        # at most the fragment: a k >= n (batch_size full) must not size a buffer by k
        k_frag = min(first, math.ceil(k_max * first / len(idx))) if k_max else 0
        stats = ({n: DescentAccumulator(1, theta[n].numel(), k_frag, self.gamma, self.device,
                                        self.dtype) for n in self.trainable} if k_max else None)
        for f0 in range(0, len(idx), frag):
            fidx = idx[f0:f0 + frag]
            floor = None if self.clip_floor is None else self.clip_floor[fidx]
            sources = self.net.grads_nominal(
                theta_c, self.x_compute[fidx], self.y[fidx],
                self.cfg.loss, clip_floor=floor)
            for name, src in sources.items():
                for r0, r1 in self._row_chunks(src, len(fidx), 1):
                    # a record far outside the data can overflow the logits (softmax of an
                    # infinite logit is NaN): the clamp sends +-inf to +-gamma and a NaN
                    # counts as 0, so every record's clamped gradient lies in [-gamma, gamma]
                    # as the bounds assume (finite gradients are unchanged)
                    g = src.fn(r0, r1).clamp(-self.gamma, self.gamma).nan_to_num_(nan=0.0)
                    sums[name][r0 * src.row_size:r1 * src.row_size] += g.to(torch.float64).sum(0)
                    if stats is not None and f0 == 0:
                        gt = g.T.unsqueeze(0)
                        stats[name].add(r0 * src.row_size, r1 * src.row_size, Interval(gt, gt))
            if stats is not None and f0 == 0:
                for acc in stats.values():
                    acc.samples_seen(len(fidx))
        b = len(idx)
        # the mean of values in [-gamma, gamma] lies there too, but its float64 rounding
        # can exceed gamma by an ulp (0.1 three times); clamped in the dtype, as the bounds'
        # final clamp and `UpdateRule.public_magnitudes` assume (since 0.3.7)
        direction = {n: (s / b).to(self.dtype).clamp(-self.gamma, self.gamma).reshape(theta[n].shape)
                     for n, s in sums.items()}
        return direction, stats

    @staticmethod
    def _row_chunks(src, n_samples: int, n_groups: int):
        per_row = max(1, n_samples * n_groups * src.row_size)
        rows = max(1, WORK_ELEMENTS // per_row)
        for r0 in range(0, src.n_rows, rows):
            yield r0, min(src.n_rows, r0 + rows)

    # -- bounds ----------------------------------------------------------------------------
    def descent_bounds(self, boxes: dict[str, Interval], k_values: torch.Tensor,
                       idx: torch.Tensor, shared: bool, stats=None) -> dict[str, Interval]:
        """Interval of the clamped mean gradient for every box (K, ...), batch ``idx``.

        ``shared``: all K boxes are identical; under the threshold rule one interval pass
        serves every k. The exact rule grades each box's pass by its k (agt/interval.py:
        computed boxes of neighbours nest without an assumption on the kernels), so it
        runs one pass per k also on the first step.
        ``stats``: nominal top-k buffers -> threshold rule (selection: threshold)."""
        K = k_values.shape[0]
        if stats is not None:
            first = next(iter(stats.values()))
            scale = first.count / len(idx)
            # ranks beyond the buffered fragment (k >= n under batch_size full) take its last:
            # any threshold is sound
            k_frag = torch.where(k_values > 0, torch.ceil(k_values * scale).long().clamp_min(1),
                                 k_values).clamp_max(first.k_max)
            taus = {n: order_statistics(acc, k_frag) for n, acc in stats.items()}

            def bound_pass(sub_boxes, g0, g1):
                sub_taus = {n: (t[0][g0:g1], t[1][g0:g1]) for n, t in taus.items()}
                return self._threshold_pass(sub_boxes, k_values[g0:g1], idx, sub_taus)
        else:
            def bound_pass(sub_boxes, g0, g1):
                ks = k_values[g0:g1]
                return self._group_pass(sub_boxes, ks, idx, None, ks.tolist(), grade=ks)
        if shared and stats is not None:
            return bound_pass({n: box[:1] for n, box in boxes.items()}, 0, K)
        parts = [bound_pass({n: box[g0:g1] for n, box in boxes.items()}, g0, g1)
                 for g0, g1 in self._groups(k_values, len(idx), buffers=stats is None)]
        return {n: Interval(torch.cat([p[n].lo for p in parts]), torch.cat([p[n].hi for p in parts]))
                for n in boxes}

    def _groups(self, k_values: torch.Tensor, batch: int, buffers: bool = True):
        """Consecutive groups of k values sized to the memory budgets."""
        frag = min(batch, self.cfg.fragment_size)
        shapes = infer_shapes(self.net.layers, tuple(self.x_nominal.shape[1:]))
        act = sum(math.prod(s) for s in shapes)
        p_total = sum(self.init[n].numel() for n in self.trainable)
        # two buffers (lower, upper) of k entries per parameter and box, compute dtype
        slot_bytes = 2 * self.dtype.itemsize * p_total
        K = k_values.shape[0]
        g0 = 0
        while g0 < K:
            g1 = g0 + 1
            while g1 < K:
                size = g1 + 1 - g0
                if size * frag * act * 8 > WORK_ELEMENTS * 4 or \
                        (buffers and int(k_values[g0:g1 + 1].clamp_max(batch).sum()) * slot_bytes
                         > BUFFER_BYTES):
                    break
                g1 += 1
            yield g0, g1
            g0 = g1

    def _threshold_pass(self, boxes, k_values, idx, taus):
        """Threshold rule for M = len(k_values) distances over G boxes (G = M, or G = 1
        shared by all)."""
        accs = {n: ThresholdAccumulator(k_values, taus[n][0], taus[n][1], self.gamma)
                for n in self.trainable}
        self._stream_bounds(boxes, idx, accs, n_groups=k_values.shape[0])
        return {n: self._reshape(n, acc.bounds(self.fm)) for n, acc in accs.items()}

    def _group_pass(self, boxes, k_values, idx, group_index, k_buffers, grade=None):
        """Exact top-k rule for the distances ``k_values`` of G boxes (group_index maps each
        distance to its box; None: one box each); ``k_buffers``: top-k buffer size per box;
        ``grade`` (G,): the grade of each box's interval pass (agt/interval.py), or None."""
        G = next(iter(boxes.values())).shape[0]
        # a buffer never needs more slots than the batch has records: k >= b (batch_size
        # full, k up to 10^9) selects them all (DescentAccumulator.bounds)
        k_buffers = [min(int(k), len(idx)) for k in k_buffers]
        accs = {n: DescentAccumulator(G, self.init[n].numel(), k_buffers, self.gamma, self.device,
                                      self.dtype)
                for n in self.trainable}
        fm = self.fm if grade is None else self.fm.graded(grade)
        self._stream_bounds(boxes, idx, accs, n_groups=G, fm=fm)
        return {n: self._reshape(n, acc.bounds(k_values, self.fm, group_index))
                for n, acc in accs.items()}

    def _stream_bounds(self, boxes, idx, accs, n_groups: int, fm: FloatModel | None = None) -> None:
        """Feed the per-sample gradient bounds of batch ``idx`` to the accumulators,
        fragment by fragment and in parameter-row chunks sized to the memory budget."""
        frag = self.cfg.fragment_size
        fm = self.fm if fm is None else fm
        for f0 in range(0, len(idx), frag):
            fidx = idx[f0:f0 + frag]
            beyond = None if self.beyond is None else self.beyond[fidx]
            if beyond is not None and not bool(beyond.any()):
                beyond = None
            sources = self.net.grads_bounds(boxes, self._bound_inputs(fidx, beyond),
                                            self.y[fidx], self.cfg.loss, fm)
            for name, src in sources.items():
                for r0, r1 in self._row_chunks(src, len(fidx), n_groups):
                    grads = src.samples_last(r0, r1)
                    if beyond is not None:
                        # the accumulators clamp these to the clamp range
                        grads = Interval(grads.lo.masked_fill(beyond, -math.inf),
                                         grads.hi.masked_fill(beyond, math.inf))
                    accs[name].add(r0 * src.row_size, r1 * src.row_size, grads)
            for acc in accs.values():
                acc.samples_seen(len(fidx))

    def _reshape(self, name: str, flat: Interval) -> Interval:
        shape = self.init[name].shape
        return flat.map(lambda t: t.reshape(t.shape[0], *shape))

    def _budget_boxes_per_pass(self, k_values: tuple[int, ...]) -> int:
        """How many boxes one interval pass of the placement programme may hold: the
        memory budgets of `_groups`, with every box's selection buffer as large as max(k),
        and its max(k) + 1 successor boxes within the buffer budget."""
        frag = min(self.batch_size, self.cfg.fragment_size)
        shapes = infer_shapes(self.net.layers, tuple(self.x_nominal.shape[1:]))
        act = sum(math.prod(s) for s in shapes)
        p_total = sum(self.init[n].numel() for n in self.trainable)
        slot_bytes = 2 * self.dtype.itemsize * p_total
        by_work = (WORK_ELEMENTS * 4) // max(1, frag * act * 8)
        k_big = min(max(k_values), self.batch_size)      # buffers hold at most a batch
        by_buffers = BUFFER_BYTES // max(1, (k_big + 1) * slot_bytes)
        # each box yields up to max(k) + 1 successors: descent, parameter and velocity boxes
        # (lo and hi, float64) and the gathered source boxes of the update
        by_outputs = BUFFER_BYTES // max(1, 8 * (max(k_values) + 1) * 8 * p_total)
        return max(1, min(by_work, by_buffers, by_outputs))

    def _budget_evaluator(self, idx: torch.Tensor, lr: float, first_step: bool,
                          public, after: int):
        """Step_b of agt/placement.py on batch ``idx``: for boxes (G, ...) and pairs
        (c[l], group[l]) the update bounds from box group[l] with up to c[l] of the batch's
        records replaced (the exact top-k rule: one selection buffer per box), the descent
        bound widened by the transition slack 2 w_cap units[l] of that module, and cut to
        the public bounds of step ``after`` (`_within`)."""
        gam = clamp_limit(self.gamma, self.fm.nominal_dtype, self.dtype)

        def evaluate(theta, velocity, c, group, buffers, cap, units, grades):
            d = self._group_pass(theta, c, idx, group, buffers, grade=grades.to(self.device))
            w = float(nesting_allowance(len(idx), torch.tensor([cap]), gam, self.fm)[0])
            slack = (2.0 * w * units.to(BOUND_DTYPE)).to(self.device)
            out_theta, out_v = {}, {}
            for n in self.trainable:
                extra = slack.view(-1, *([1] * (d[n].lo.dim() - 1)))
                d[n] = Interval((d[n].lo - extra).clamp_min(-gam), (d[n].hi + extra).clamp_max(gam))
                th = theta[n].map(lambda t: t[group])
                v = None if velocity is None else velocity[n].map(lambda t: t[group])
                out_theta[n], out_v[n] = self.rule.bounds(th, v, d[n], lr, first_step, self.fm)
                out_theta[n] = _within(out_theta[n], public.params[after][n])
                if out_v[n] is not None:
                    out_v[n] = _within(out_v[n], public.velocity[after][n])
            has_v = any(v is not None for v in out_v.values())
            return out_theta, (out_v if has_v else None)
        return evaluate

    # -- the loop ----------------------------------------------------------------------------
    def run(self, with_bounds: bool, progress: bool, ds_sha: str,
            step_callback: Callable | None = None,
            bounds_callback: Callable | None = None) -> TrainResult:
        t_start = time.perf_counter()
        cfg = self.cfg
        k_list = tuple(cfg.k_values) if with_bounds else (0,)
        k_tensor = torch.tensor(k_list, dtype=torch.int64, device=self.device)
        K = len(k_list)
        theta = {n: self.init[n].clone() for n in self.trainable}
        buf: dict[str, torch.Tensor | None] = {n: None for n in self.trainable}
        boxes = vboxes = None
        # k_boxes "ball": the boxes of k >= 1 come from the stability balls after the run
        interval_pass = with_bounds and cfg.k_boxes == "interval"
        if interval_pass:
            boxes = {n: Interval.exact(theta[n].unsqueeze(0).expand(K, *theta[n].shape).clone())
                     for n in self.trainable}
            vboxes = {n: None for n in self.trainable}
        orders = epoch_orders(self.n, cfg.n_epochs, cfg.seed)
        plan = [(e, b) for e in range(cfg.n_epochs) for b in _batches(orders[e], self.batch_size)]
        lrs = [round_to(cfg.learning_rate_at(step), self.dtype) for step in range(len(plan))]
        # bounds on every run's parameters from the config alone: the overflow refusal and
        # the records marked at each step read nothing else (README, What is private)
        public = self._public_magnitudes(lrs) if interval_pass else None
        # per-epoch placement budget (agt/placement.py); with one batch per epoch it gives
        # the paper's boxes, which the paper pass computes faster
        budget = None
        if interval_pass and cfg.k_placement == "per-epoch" and self.batch_size < self.n:
            budget = EpochBudgetBoxes(k_list, theta, self._budget_boxes_per_pass(k_list))
        bar = tqdm(plan, desc=f"AGT train (K={K})" if with_bounds else "train",
                   unit="step", disable=not progress, leave=False)
        ball_steps, whole_beta = [], None
        for step, (epoch, batch) in enumerate(bar):
            idx = torch.as_tensor(batch, device=self.device)
            lr = lrs[step]
            if self.stability is not None and with_bounds:
                if len(batch) < self.n:
                    beta = self.stability.batch_beta(self.x_bounds[idx])
                else:                       # one batch of all records: the same every epoch
                    if whole_beta is None:
                        whole_beta = self.stability.batch_beta(self.x_bounds)
                    beta = whole_beta
                ball_steps.append(StabilityStep(epoch, lr, len(batch), beta,
                                                parameter_norm(theta)))
            use_thresholds = interval_pass and cfg.selection == "threshold"
            direction, stats = self.nominal_direction(
                theta, idx, k_max=int(k_tensor.max()) if use_thresholds else 0)
            # with the placement budget, boxes / vboxes are its hulls, taken after the
            # previous update (at step 0 the exact initial boxes, which equal them)
            if interval_pass and bounds_callback is not None:
                bounds_callback(StepBounds(step, batch, lr, boxes, vboxes))
            if interval_pass:
                self._mark_records(public.params[step])
            if budget is not None:
                budget.step(self._budget_evaluator(idx, lr, step == 0, public, step + 1))
                if step + 1 == len(plan) or plan[step + 1][0] != epoch:
                    budget.end_epoch()
            elif interval_pass:
                d_boxes = self.descent_bounds(boxes, k_tensor, idx, shared=(step == 0), stats=stats)
                new_boxes, new_v = {}, {}
                for n in self.trainable:
                    new_boxes[n], new_v[n] = self.rule.bounds(boxes[n], vboxes[n], d_boxes[n],
                                                              lr, step == 0, self.fm)
                boxes = {n: _within(_monotone_in_k(b), public.params[step + 1][n])
                         for n, b in new_boxes.items()}
                vboxes = {n: (_within(_monotone_in_k(v), public.velocity[step + 1][n])
                              if v is not None else None) for n, v in new_v.items()}
            for n in self.trainable:
                theta[n], buf[n] = self.rule.nominal(theta[n], buf[n], direction[n], lr)
            if budget is not None:
                boxes, vboxes = _budget_hulls(budget)
            if interval_pass:
                _check_contains(boxes, theta, step)
            if step_callback is not None:
                step_callback(step, theta, boxes)
        bar.close()
        self.beyond = None
        nominal = {k: v.clone() for k, v in self.init.items()}
        nominal.update(theta)
        lower = upper = ball = None
        if with_bounds and self.stability is not None:
            self.stability.check_overflow(ball_steps)
            ball = self.stability.radii(k_list, ball_steps)
        if with_bounds and not all(bool(torch.isfinite(v).all()) for v in nominal.values()):
            raise DataError(f"training diverged: the served parameters are not finite in "
                            f"{cfg.dtype}; lower the learning rate or clip_gamma, rescale the "
                            "features, or train in float64")
        if with_bounds:
            if not interval_pass:
                boxes = {n: ball_boxes(nominal[n], ball) for n in self.trainable}
            lower, upper = {}, {}
            for name, value in nominal.items():
                if name in boxes:
                    lower[name], upper[name] = boxes[name].lo, boxes[name].hi
                else:  # frozen: exact
                    v = value.to(BOUND_DTYPE).unsqueeze(0).expand(K, *value.shape)
                    lower[name], upper[name] = v.clone(), v.clone()
            if cfg.bound_method in ("served-k0", "stability"):
                lower, upper = served_k0_box(k_list, nominal, lower, upper)
        return TrainResult(cfg, self.spec, k_list, self.init, nominal, lower, upper, orders,
                           self.relations, ds_sha, self.n, time.perf_counter() - t_start,
                           ball_radius=ball)


def _budget_hulls(budget: EpochBudgetBoxes):
    """The placement programme's k-boxes (and momentum boxes), nested in k as the paper
    path's boxes are after every step."""
    theta, velocity = budget.boxes()
    return ({n: _monotone_in_k(b) for n, b in theta.items()},
            {n: (_monotone_in_k(velocity[n]) if velocity is not None else None) for n in theta})


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
    most k = 0 certificates fail although nothing about the data is uncertain (issue 12:
    rounding masquerading as instability).

    Soundness (validity, Def. 4.3). The only dataset within distance 0 of D is D, and the
    only model trained on D that is ever served or released is theta_f (readers refuse a
    served model whose parameters differ from /nominal). So {theta_f} is valid at k = 0.
    The exact-arithmetic run, or a re-run of the nominal rule with another summation order
    (another device or thread count), is not served; it is still contained in every box of
    k >= 1, since those contain every float evaluation of training on every dataset within
    distance k, D itself included.

    Nesting in k. theta_f lies in every k-box (checked after every step by
    `_check_contains` and on load by `agt.store.validate_bundle`), so box(D, 0) is inside
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
    """Training and test labels must be classes the model can predict."""
    for split, y in (("y_train", ds.y_train), ("y_test", ds.y_test)):
        if y is not None and y.size and int(y.max()) >= n_classes:
            raise DataError(f"{split} has labels up to {int(y.max())} but the model predicts "
                            f"{n_classes} classes (0..{n_classes - 1}); fix the labels or the "
                            f"model's output layer")


def _monotone_in_k(box: Interval) -> Interval:
    """Make boxes nested in k (box(k) inside box(k+1)): a sound widening, exact in exact
    arithmetic where the top-k rule is already monotone; removes rounding artefacts."""
    return nested_along_first(box)


def _within(box: Interval, bound: float) -> Interval:
    """``box`` cut to [-bound, bound], a bound that every run's value satisfies
    (`UpdateRule.public_magnitudes`): still sound, exact (a clamp), and the same cut for D
    and every neighbour, so computed boxes that nest still nest. It keeps the float64 bound
    arithmetic of later steps far from overflow however loose the boxes grow."""
    return Interval(box.lo.clamp(-bound, bound), box.hi.clamp(-bound, bound))


def _check_contains(boxes: dict[str, Interval], theta: dict[str, torch.Tensor], step: int) -> None:
    for name, box in boxes.items():
        inside = box.contains(theta[name].unsqueeze(0))
        if not bool(inside.all()):
            raise SoundnessError(f"internal soundness check failed at step {step}: nominal "
                                 f"'{name}' left its k-box; refusing to write certificates")


def train(cfg: TrainConfig, ds: Dataset, *, with_bounds: bool = True, progress: bool = False,
          step_callback: Callable | None = None,
          bounds_callback: Callable | None = None) -> TrainResult:
    """Run AGT (nominal training + bounds for every k of ``cfg.k_values``).

    ``step_callback(step, theta, boxes)`` sees the nominal parameters and boxes after each
    step; ``bounds_callback(StepBounds)`` the interval pass's boxes before each update
    (agt/trajectory.py keeps them)."""
    validate_dataset(ds)
    device = resolve_device(cfg.device)
    with strict_kernels(device):
        trainer = _Trainer(cfg, ds, device)
        return trainer.run(with_bounds, progress, ds.sha256(), step_callback, bounds_callback)


def train_nominal(cfg: TrainConfig, ds: Dataset) -> dict[str, torch.Tensor]:
    """Nominal parameters only (the same code path as the AGT run's nominal)."""
    return train(cfg, ds, with_bounds=False).nominal
