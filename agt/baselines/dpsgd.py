"""DP-SGD baseline (private *training*), built on Opacus.

This is the private-training baseline the paper compares AGT's private *prediction* with
(paper section 6, Fig. 5 and the teacher table). The model, the loss and the data are those
of the AGT run; only the training rule differs:

    for each step t = 1 .. T:
        B_t  <- Poisson subsample of D (each record independently with probability q)
        g_t  <- ( sum_{i in B_t} clip_C(grad l(theta; x_i, y_i)) + N(0, sigma^2 C^2 I) ) / (q n)
        theta <- optimizer step with g_t                                  (SGD or Adam)

with clip_C(g) = g * min(1, C / ||g||_2) (flat clipping over all trainable parameters) and
noise multiplier sigma calibrated so that the whole run is (target_epsilon, target_delta)-DP
(Abadi et al. 2016, "Deep Learning with Differential Privacy", Alg. 1; cs208 slides "DP SGD").
Per-sample clipping, the Gaussian noise, Poisson sampling and the accountant are Opacus'
(``PrivacyEngine.make_private_with_epsilon``); nothing of it is written here.

Accounting. ``accountant='prv'``: privacy-loss random variables (Gopi, Lee, Wutschitz 2021,
"Numerical Composition of Differential Privacy"); Opacus returns the *upper* end of its
epsilon error band. ``accountant='rdp'``: Renyi DP of the subsampled Gaussian (Mironov,
Talwar, Zhang 2019) converted to (epsilon, delta). Opacus calibrates sigma by bisection for
``steps = int(epochs / q)`` and keeps the sigma whose epsilon is *below* the target (within
a tolerance, here min(0.01, 1% of the target)); the reported epsilon is
``privacy_engine.get_epsilon(delta)`` after training (the engine's accountant over the steps
actually taken, asked with the calibration's options: see `_accountant_kwargs` for the PRV
error band and the extended Renyi orders that small targets need). Opacus' sampler makes
``int(1 / q)`` steps per epoch, which float rounding can make one less than
``ceil(n / batch_size)``; fewer steps only lower epsilon.

Sampling rate. Opacus sets q = 1 / ceil(n / batch_size) (``1 / len(data_loader)``), so the
expected batch size q n is ``batch_size`` up to that rounding; a ``batch_size >= n`` gives
q = 1 (no amplification by subsampling).

Neighbouring relation. The guarantee is for **add-remove** neighbours (one record added or
removed; unbounded DP): it is what Poisson subsampling and both accountants analyse. An AGT
bundle that certifies replace-one is not directly comparable at equal epsilon: replacing a
record is a removal plus an addition, so by group privacy the DP-SGD model is
(2 eps, (1 + e^eps) delta)-DP for replace-one neighbours.

No inference budget. DP-SGD makes the *model* private; predictions are post-processing and
cost nothing, so its accuracy is flat in the number of queries Q (unlike private prediction,
whose per-query epsilon shrinks as Q grows under a fixed total budget).

Randomness. By default (``seed=None``) the seed of the model initialisation (for a bare
ModelSpec), the Poisson sampler and the noise is drawn from the operating system's secure
source (`secrets`), and the result says the run was not seeded. A given seed makes the run
reproducible, for experiments only: anyone who knows it can regenerate the noise; the result
records ``seeded=True``. Opacus runs with ``secure_mode=False`` in both cases (its secure mode
needs the ``torchcsprng`` package, whose last release (0.2.1, 2021) predates torch 2; with
torch 2.13 ``secure_mode=True`` raises a `ConfigError` saying so rather than silently
falling back) and warns "Secure RNG turned off"; we silence that one warning. A secure-source
seed for torch's generator is not a cryptographically secure generator; say so where it
matters (docs/privacy.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import numbers
import secrets
import time
import warnings
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from agt.config import LOSSES, TrainConfig
from agt.data import Dataset, validate_dataset
from agt.errors import ConfigError, DataError, PrivacyError, Problems
from agt.models import ModelSpec, init_params
from agt.tensors import predicted_classes, resolve_device

__all__ = ["DPSGDConfig", "DPSGDResult", "train_dpsgd", "evaluate", "predict",
           "DPSGD_OPTIMIZERS", "DPSGD_ACCOUNTANTS", "DPSGD_RELATION"]

DPSGD_OPTIMIZERS: tuple[str, ...] = ("sgd", "adam")
DPSGD_ACCOUNTANTS: tuple[str, ...] = ("prv", "rdp")
DPSGD_RELATION = "add-remove"
_EVAL_CHUNK = 4096
# Seed offsets: sampling, noise and (for a bare ModelSpec) the initialisation get
# independent streams from one seed.
_SAMPLER_STREAM, _NOISE_STREAM = 1, 2
# Renyi orders for the RDP accountant: Opacus' defaults (1.1 .. 63) plus larger orders, which
# small target epsilons need (see `_accountant_options`).
RDP_ORDERS: list[float] = ([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
                           + list(range(64, 256, 8)) + [256, 320, 384, 512, 768, 1024])


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


@dataclass(frozen=True, kw_only=True)
class DPSGDConfig:
    """A DP-SGD run: the privacy target and the training hyper-parameters.

    target_epsilon, target_delta: the (eps, delta)-DP guarantee of the whole training run
        (add-remove neighbours), eps > 0, 0 < delta < 1 (use delta << 1 / n).
    max_grad_norm: the per-sample clipping norm C (L2 over all trainable parameters), > 0.
    epochs: passes over the data (Opacus makes ``int(1/q)`` Poisson steps per epoch), >= 1.
    batch_size: expected batch size of Poisson sampling (q = 1 / ceil(n / batch_size)), >= 1.
    learning_rate: step size of the optimizer, > 0.
    optimizer: 'sgd' (plain) or 'adam'; Opacus wraps it (clipping + noise before the step).
    accountant: 'prv' (tight, numerical) or 'rdp' (Renyi DP, slightly looser).
    seed: seeds the sampler and the noise (and the initialisation for a bare ModelSpec);
        None (default) draws a seed from the operating system's secure source.

    Every invalid field is reported at once; a bad epsilon/delta raises `PrivacyError`,
    any other bad field `ConfigError` (both are `ValueError`s).
    """

    target_epsilon: float
    target_delta: float
    epochs: int
    batch_size: int
    learning_rate: float
    max_grad_norm: float = 1.0
    optimizer: str = "sgd"
    accountant: str = "prv"
    seed: int | None = None

    def __post_init__(self) -> None:
        problems = Problems("invalid DPSGDConfig", ConfigError)
        eps, delta = self.target_epsilon, self.target_delta
        problems.check(_is_real(eps) and math.isfinite(eps) and eps > 0,
                       f"target_epsilon must be a finite number > 0, got {eps!r}", PrivacyError)
        problems.check(_is_real(delta) and math.isfinite(delta) and 0 < delta < 1,
                       f"target_delta must be a number in (0, 1), got {delta!r}", PrivacyError)
        for name in ("max_grad_norm", "learning_rate"):
            v = getattr(self, name)
            problems.check(_is_real(v) and math.isfinite(v) and v > 0,
                           f"{name} must be a finite number > 0, got {v!r}")
        for name in ("epochs", "batch_size"):
            v = getattr(self, name)
            problems.check(_is_int(v) and v >= 1, f"{name} must be an integer >= 1, got {v!r}")
        problems.check(self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2**62),
                       f"seed must be None or an integer in [0, 2**62), got {self.seed!r}")
        problems.check(self.optimizer in DPSGD_OPTIMIZERS,
                       f"optimizer must be one of {', '.join(DPSGD_OPTIMIZERS)}, got "
                       f"{self.optimizer!r}")
        problems.check(self.accountant in DPSGD_ACCOUNTANTS,
                       f"accountant must be one of {', '.join(DPSGD_ACCOUNTANTS)}, got "
                       f"{self.accountant!r}")
        problems.raise_if_any()

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> "DPSGDConfig":
        """Build from a mapping (e.g. a YAML section); unknown keys are a `ConfigError`."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"the DP-SGD config must be a mapping, got {type(raw).__name__}")
        allowed = set(DPSGDConfig.__dataclass_fields__)
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ConfigError(f"unknown DP-SGD config key(s) {unknown}; allowed keys: "
                              f"{', '.join(sorted(allowed))}")
        missing = sorted(k for k in ("target_epsilon", "target_delta", "epochs", "batch_size",
                                     "learning_rate") if k not in raw)
        if missing:
            raise ConfigError(f"missing DP-SGD config key(s) {missing}")
        return DPSGDConfig(**dict(raw))

    def to_json_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DPSGDResult:
    """What a DP-SGD run produced and the guarantee it comes with.

    state_dict: every parameter of the full model (frozen prefix included), names as in
        ``spec.build().state_dict()``, on the CPU.
    epsilon: achieved epsilon (``privacy_engine.get_epsilon(delta)``) for `delta`, with
        respect to `relation` ("add-remove"), for the whole run; any number of predictions
        of the released model is post-processing and costs nothing more.
    noise_multiplier: sigma (noise std / max_grad_norm) calibrated by Opacus.
    sample_rate: Poisson sampling probability q; expected_batch_size = q * n_train.
    steps: optimizer steps taken (= steps the accountant composed).
    test_accuracy: accuracy on the dataset's labelled test split, else None.
    secure_mode: False for seeded (reproducible, experiment-only) randomness.
    """

    config: DPSGDConfig
    spec: ModelSpec
    loss: str
    state_dict: dict[str, torch.Tensor] = field(repr=False)
    epsilon: float
    delta: float
    accountant: str
    noise_multiplier: float
    sample_rate: float
    expected_batch_size: float
    steps: int
    n_train: int
    test_accuracy: float | None
    seconds: float
    relation: str = DPSGD_RELATION
    trained_params: tuple[str, ...] = ()
    secure_mode: bool = False
    seeded: bool = True

    def to_json_dict(self) -> dict[str, Any]:
        """Every number of the run (no tensors), for results.json."""
        return {
            "mechanism": "dp-sgd", "config": self.config.to_json_dict(),
            "model": json_model(self.spec), "loss": self.loss, "epsilon": self.epsilon,
            "delta": self.delta, "target_epsilon": self.config.target_epsilon,
            "accountant": self.accountant, "relation": self.relation,
            "noise_multiplier": self.noise_multiplier, "sample_rate": self.sample_rate,
            "expected_batch_size": self.expected_batch_size, "steps": self.steps,
            "n_train": self.n_train, "test_accuracy": self.test_accuracy,
            "seconds": self.seconds, "trained_params": list(self.trained_params),
            "secure_mode": self.secure_mode, "seeded": self.seeded,
        }


def json_model(spec: ModelSpec) -> Any:
    return json.loads(spec.to_json())


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------


def _stream_seed(seed: int, stream: int) -> int:
    """An independent torch seed per stream (sampler, noise) from one run seed."""
    return (seed * 1_000_003 + stream) % (2**64)


def _default_loss(spec: ModelSpec) -> str:
    # The only pairing agt accepts (agt.bounded.losses.check_logits).
    return "binary_cross_entropy" if spec.n_logits == 1 else "cross_entropy"


def _resolve_model(model: ModelSpec | TrainConfig, dataset: Dataset, dp: DPSGDConfig,
                   loss: str | None, dtype: torch.dtype | None,
                   initial_params: Mapping[str, torch.Tensor] | None):
    """(spec with input shape, loss, dtype, initial parameters) as the AGT run has them."""
    if isinstance(model, TrainConfig):
        spec = model.model.with_input_shape(dataset.feature_shape)
        loss = model.loss if loss is None else loss
        # The AGT run's initialisation: init_params(cfg.seed) (+ pretrained file), so a frozen
        # prefix computes the same features as in the AGT bundle.
        params = init_params(spec, model.seed, torch.float64)
        if model.pretrained:
            from agt.training import load_pretrained
            params = load_pretrained(model.pretrained, spec, params)
    elif isinstance(model, ModelSpec):
        spec = model.with_input_shape(dataset.feature_shape)
        params = init_params(spec, dp.seed, torch.float64)
    else:
        raise ConfigError(f"model must be a ModelSpec or a TrainConfig, got {type(model).__name__}")
    if initial_params is not None:
        unknown = sorted(set(initial_params) - set(params))
        if unknown:
            raise ConfigError(f"initial_params has parameter(s) {unknown} the model does not "
                              f"have; model parameters: {sorted(params)}")
        for name, value in initial_params.items():
            value = torch.as_tensor(value)
            if tuple(value.shape) != tuple(params[name].shape):
                raise ConfigError(f"initial_params['{name}'] has shape {tuple(value.shape)}, "
                                  f"the model needs {tuple(params[name].shape)}")
            params[name] = value.detach().to(torch.float64).clone()
    dtype = torch.float32 if dtype is None else dtype
    if dtype not in (torch.float32, torch.float64):
        raise ConfigError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    params = {name: value.to(dtype) for name, value in params.items()}
    loss = _default_loss(spec) if loss is None else loss
    if loss not in LOSSES:
        raise ConfigError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    n_logits = spec.n_logits
    if loss == "binary_cross_entropy" and n_logits != 1:
        raise ConfigError(f"loss binary_cross_entropy needs a model with 1 output logit, this "
                          f"model has {n_logits}")
    if loss == "cross_entropy" and n_logits < 2:
        raise ConfigError("loss cross_entropy needs a model with >= 2 output logits")
    n_labels = 2 if loss == "binary_cross_entropy" else n_logits
    if int(dataset.y_train.max(initial=0)) >= n_labels:
        raise DataError(f"labels go up to {int(dataset.y_train.max())} but the model/loss "
                        f"supports {n_labels} classes")
    return spec, loss, dtype, params


class _BinaryLogitLoss(nn.Module):
    """binary_cross_entropy with one logit: BCEWithLogits(z[:, 0], y), mean over the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.BCEWithLogitsLoss(reduction="mean")

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.inner(z[:, 0], y.to(z.dtype))


def _criterion(loss: str) -> nn.Module:
    return _BinaryLogitLoss() if loss == "binary_cross_entropy" else nn.CrossEntropyLoss()


@torch.no_grad()
def _apply(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if len(module) == 0:
        return x
    return torch.cat([module(x[i:i + _EVAL_CHUNK]) for i in range(0, x.shape[0], _EVAL_CHUNK)])


def _accountant_kwargs(dp: DPSGDConfig) -> dict[str, Any]:
    """Options of the accountant's ``get_epsilon``, used both to calibrate and to report.

    prv: ``eps_error`` (the half-width of PRV's error band; Opacus reports the upper end).
        Its default 0.01 is absolute: at a target of 0.02 it would make the reported epsilon
        half error and force twice the noise. We use min(0.01, 1% of the target).
    rdp: ``alphas``. Opacus' default Renyi orders stop at 63, and the RDP -> (eps, delta)
        conversion cannot go below roughly log(1/delta) / (alpha_max - 1), so with
        delta = 1e-5 a target under ~0.2 fails with "The privacy budget is too low". We use
        `RDP_ORDERS`, a superset of the defaults (the bound can only get tighter).
    """
    if dp.accountant == "prv":
        return {"eps_error": _relative_tolerance(dp)}
    return {"alphas": RDP_ORDERS}


def _relative_tolerance(dp: DPSGDConfig) -> float:
    return min(0.01, 0.01 * float(dp.target_epsilon))


def _accountant_options(dp: DPSGDConfig) -> dict[str, Any]:
    """Extra options for Opacus' calibration (``get_noise_multiplier``), passed through
    ``make_private_with_epsilon(**kwargs)``: Opacus forwards them to ``get_noise_multiplier``
    and from there to the accountant's ``get_epsilon`` (its DPOptimizer ignores unknown
    keywords). ``epsilon_tolerance``: the bisection stops once
    ``target - eps(sigma) <= tolerance`` with eps(sigma) <= target; Opacus' default 0.01 is
    absolute (10% of a target of 0.1), we use min(0.01, 1% of the target)."""
    return {"epsilon_tolerance": _relative_tolerance(dp), **_accountant_kwargs(dp)}


def _frozen(options: Mapping[str, Any]) -> tuple:
    """Accountant options as a hashable key (lists become tuples)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))


@lru_cache(maxsize=256)
def _calibrated_noise(mechanism: str, epsilon: float, delta: float, sample_rate: float,
                      epochs: int, options: tuple) -> float:
    """Opacus' noise multiplier for (epsilon, delta) after `epochs` at `sample_rate`
    (``get_noise_multiplier``, the bisection ``make_private_with_epsilon`` runs), memoised:
    it is a deterministic function of these arguments, and studies that train several seeds
    or learning rates at one target ask for the same one again.

    Args:
        mechanism: the accountant's name (``rdp``, ``prv``).
        epsilon, delta: the add-remove target.
        sample_rate: Poisson sampling rate (1 / batches per epoch).
        epochs: epochs of training.
        options: `_frozen` `_accountant_options`.

    Returns:
        The noise multiplier.
    """
    from opacus.accountants.utils import get_noise_multiplier

    kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in options}
    return get_noise_multiplier(target_epsilon=epsilon, target_delta=delta,
                                sample_rate=sample_rate, epochs=epochs, accountant=mechanism,
                                **kwargs)


def _achieved_epsilon(engine, dp: DPSGDConfig) -> float:
    """``privacy_engine.get_epsilon(delta)`` after training, i.e. the engine's accountant
    over the steps actually taken, asked with the same options as the calibration (the
    engine's facade passes none; with Opacus' defaults the reported epsilon would be looser
    than the one the noise was calibrated to)."""
    return float(engine.accountant.get_epsilon(delta=float(dp.target_delta),
                                               **_accountant_kwargs(dp)))


@contextlib.contextmanager
def _quiet_opacus(accountant: str, calibrating: bool = True):
    """Silence Opacus warnings that do not apply here, and nothing else:
    "Secure RNG turned off" (documented in the module docstring: seeded generators for
    experiments) and "Optimal order is the largest alpha" while calibrating (the bisection
    probes small-epsilon noise levels whose optimal order is naturally the largest) and, for
    PRV, always (there it comes from the RDP bound PRV uses to size its discretisation
    domain, not from the reported epsilon). For the final RDP epsilon the warning is kept:
    there it means the bound (still a valid upper bound) could be tighter."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        if calibrating or accountant == "prv":
            warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        yield


def _run_steps(model: nn.Module, optimizer, loader, criterion: nn.Module, epochs: int,
               device: torch.device, desc: str, progress: bool) -> int:
    """The DP-SGD loop over Opacus' Poisson batches; returns the number of steps taken."""
    steps = 0
    bar = tqdm(total=epochs * len(loader), desc=desc, unit="step", disable=not progress,
               leave=False)
    with warnings.catch_warnings():
        # The first trainable layer's input (data or frozen features) does not require grad,
        # so torch notes that Opacus' full backward hooks see gradients w.r.t. module outputs
        # only; that is all Opacus uses (activations x grad_output), so silence the note.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        model.train()
        for _ in range(epochs):
            for xb, yb in loader:
                xb, yb = xb.to(device), yb.to(device)
                optimizer.zero_grad(set_to_none=True)
                out = model(xb)
                # An empty Poisson batch still takes a (noise-only) step: the accountant
                # counts every step, and so must the training.
                batch_loss = criterion(out, yb) if xb.shape[0] else out.sum() * 0.0
                batch_loss.backward()
                optimizer.step()
                steps += 1
                bar.update(1)
    bar.close()
    return steps


def train_dpsgd(model: ModelSpec | TrainConfig, dataset: Dataset, dp_config: DPSGDConfig,
                device: str | torch.device = "cpu", progress: bool = False, *,
                loss: str | None = None, dtype: torch.dtype | None = None,
                initial_params: Mapping[str, torch.Tensor] | None = None,
                secure_mode: bool = False) -> DPSGDResult:
    """Train the AGT run's model with DP-SGD to the target (epsilon, delta) and evaluate it.

    model: a `TrainConfig` (its model, loss, initialisation ``init_params(cfg.seed)`` and
        ``pretrained`` file: exactly the AGT run's starting point; its optimizer, lr
        schedule, gamma and dtype are AGT's and not used) or a bare `ModelSpec` (loss from
        the number of logits: 1 -> binary_cross_entropy, else cross_entropy; initialisation
        ``init_params(dp_config.seed)``).
    dataset: the private training split (and optional test split) as for AGT.
    loss, initial_params: optional overrides (e.g. pre-trained conv weights held in
        memory); initial_params may name any subset of the parameters.
    dtype: training precision, float32 by default whatever the AGT config says: AGT needs
        float64 for sound bounds, DP-SGD does not, and Opacus' per-sample gradients (one
        copy of the trainable parameters per record of the batch) cost half the memory and
        about 2.5x less time in float32 (measured on a 3200-100-1 head). The float64 initial
        values are rounded once to it.
    secure_mode: False (experiments): seeded sampler and noise, reproducible. True (real
        use): Opacus' secure RNG (needs torchcsprng; see the module docstring).

    A frozen prefix (``spec.frozen_layers > 0``) stays frozen as in the AGT run: its features
    are computed once, then only the trainable layers are trained (and clipped, and
    noised) on them; the frozen parameters come back unchanged. They must not depend on the
    private data (random or pre-trained on public data), or the guarantee does not cover them.

    Losses: binary_cross_entropy (one logit) is ``BCEWithLogitsLoss``, cross_entropy is
    ``CrossEntropyLoss``, both averaged over the batch (Opacus' "mean" reduction divides the
    noisy sum by the expected batch size q n).

    The returned epsilon is with respect to add-remove neighbours and covers the whole run:
    private training has no inference budget, so the model's accuracy is flat in the number
    of queries answered (see the module docstring for replace-one, accounting and RNG).
    """
    if not isinstance(dp_config, DPSGDConfig):
        raise ConfigError(f"dp_config must be a DPSGDConfig, got {type(dp_config).__name__}")
    if not isinstance(dataset, Dataset):
        raise DataError(f"dataset must be an agt.data.Dataset, got {type(dataset).__name__}")
    validate_dataset(dataset)
    if not isinstance(secure_mode, bool):
        raise ConfigError(f"secure_mode must be True or False, got {secure_mode!r}")
    try:
        from opacus import PrivacyEngine
    except ImportError as exc:  # pragma: no cover - opacus is a dependency
        raise ConfigError("DP-SGD needs the 'opacus' package: pip install opacus") from exc

    t_start = time.perf_counter()
    requested = dp_config              # what the result records: never a drawn secret seed
    seeded = dp_config.seed is not None
    if not seeded:
        dp_config = dataclasses.replace(dp_config, seed=secrets.randbits(62))
    dev = resolve_device(device)
    spec, loss_name, dtype, params = _resolve_model(model, dataset, dp_config, loss, dtype,
                                                    initial_params)
    n = dataset.n_train
    if dp_config.target_delta >= 1.0 / n:
        warnings.warn(f"target_delta = {dp_config.target_delta} is not below 1/n = {1.0 / n}: "
                      f"a mechanism that publishes a random record meets such a guarantee; "
                      f"use delta << 1/n", stacklevel=2)

    full = spec.build(dtype)
    full.load_state_dict(params)
    full = full.to(dev)
    k = spec.frozen_layers
    prefix, head = full[:k], full[k:]   # share the parameter objects with `full`
    for p in prefix.parameters():
        p.requires_grad_(False)
    x = torch.as_tensor(dataset.x_train, dtype=dtype, device=dev)
    features = _apply(prefix, x)        # computed once, as in the AGT run
    y = torch.as_tensor(dataset.y_train, dtype=torch.int64, device=dev)
    frozen_before = {name: v.detach().clone() for name, v in full.state_dict().items()
                     if name not in spec.trainable_param_names()}

    if secure_mode:   # Opacus draws both from its secure generator and refuses a seeded one
        sampler_gen = noise_gen = None
    else:
        sampler_gen = torch.Generator(device="cpu").manual_seed(
            _stream_seed(dp_config.seed, _SAMPLER_STREAM))
        noise_gen = torch.Generator(device=dev).manual_seed(
            _stream_seed(dp_config.seed, _NOISE_STREAM))
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(features.cpu(), y.cpu()),   # batches move to `dev`
        batch_size=dp_config.batch_size, generator=sampler_gen)
    opt_cls = torch.optim.SGD if dp_config.optimizer == "sgd" else torch.optim.Adam
    optimizer = opt_cls(head.parameters(), lr=dp_config.learning_rate)
    criterion = _criterion(loss_name)

    with _quiet_opacus(dp_config.accountant):
        try:
            engine = PrivacyEngine(accountant=dp_config.accountant, secure_mode=secure_mode)
        except ImportError as exc:
            raise ConfigError(
                "secure_mode=True needs Opacus' secure RNG, which needs the 'torchcsprng' "
                "package (it could not be imported; its last release targets torch 1.x). "
                "Install a torchcsprng built for this torch, or use secure_mode=False for "
                "experiments "
                f"only ({exc})") from None
        # what Opacus' make_private_with_epsilon does, with the calibration memoised
        noise = _calibrated_noise(engine.accountant.mechanism(),
                                  float(dp_config.target_epsilon),
                                  float(dp_config.target_delta), 1 / len(loader),
                                  dp_config.epochs, _frozen(_accountant_options(dp_config)))
        private_head, dp_optimizer, dp_loader = engine.make_private(
            module=head, optimizer=optimizer, data_loader=loader, noise_multiplier=noise,
            max_grad_norm=float(dp_config.max_grad_norm), poisson_sampling=True,
            noise_generator=noise_gen, clipping="flat", grad_sample_mode="hooks",
            **_accountant_options(dp_config))

    try:
        steps = _run_steps(private_head, dp_optimizer, dp_loader, criterion, dp_config.epochs,
                           dev, f"DP-SGD ({dp_config.accountant})", progress)
    finally:
        private_head.cleanup()  # remove Opacus' hooks and per-sample gradient buffers

    with _quiet_opacus(dp_config.accountant, calibrating=False):
        epsilon = _achieved_epsilon(engine, dp_config)
    state = {name: v.detach().cpu().clone() for name, v in full.state_dict().items()}
    for name, before in frozen_before.items():
        if not torch.equal(state[name], before.cpu()):  # never expected: a loud internal check
            raise RuntimeError(f"internal error: frozen parameter '{name}' changed in DP-SGD")

    test_acc = None
    if dataset.x_test is not None and dataset.y_test is not None and dataset.n_test:
        test_acc = evaluate(state, spec, dataset.x_test, dataset.y_test)
    sample_rate = float(dp_loader.sample_rate)
    return DPSGDResult(
        config=requested, spec=spec, loss=loss_name, state_dict=state, epsilon=epsilon,
        delta=float(dp_config.target_delta), accountant=dp_config.accountant,
        noise_multiplier=float(dp_optimizer.noise_multiplier), sample_rate=sample_rate,
        expected_batch_size=sample_rate * n, steps=steps, n_train=n, test_accuracy=test_acc,
        seconds=time.perf_counter() - t_start,
        trained_params=tuple(spec.trainable_param_names()), secure_mode=secure_mode,
        seeded=seeded)


# --------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------


def _state_and_spec(state_or_result, spec: ModelSpec | None, x: np.ndarray):
    if isinstance(state_or_result, DPSGDResult):
        state = state_or_result.state_dict
        spec = state_or_result.spec if spec is None else spec
    elif isinstance(state_or_result, Mapping):
        state = state_or_result
    else:
        raise ConfigError(f"expected a DPSGDResult or a state dict, got "
                          f"{type(state_or_result).__name__}")
    if not isinstance(spec, ModelSpec):
        raise ConfigError("evaluate needs the model's ModelSpec (or a DPSGDResult)")
    feature_shape = tuple(int(s) for s in np.shape(x)[1:])
    if spec.input_shape is None or spec.input_shape != feature_shape:
        spec = spec.with_input_shape(feature_shape)
    return state, spec


def predict(state_or_result, spec: ModelSpec | None, x) -> np.ndarray:
    """Labels of the model for queries x (n, *features): 1[logit > 0] for one logit, else
    argmax. Plain post-processing of the private model: no privacy cost."""
    x_arr = np.asarray(x)
    if x_arr.ndim < 2:
        raise DataError(f"x must have shape (n, *features), got {x_arr.shape}")
    state, spec = _state_and_spec(state_or_result, spec, x_arr)
    dtype = next(iter(state.values())).dtype if state else torch.float64
    module = spec.build(dtype)
    module.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    module.eval()
    logits = _apply(module, torch.as_tensor(x_arr, dtype=dtype))
    return predicted_classes(logits).numpy()


def evaluate(state_or_result, spec: ModelSpec | None, x, y) -> float:
    """Accuracy of the model (a `DPSGDResult` or a state dict with its `spec`) on (x, y)."""
    y_arr = np.asarray(y).reshape(-1)
    pred = predict(state_or_result, spec, x)
    if y_arr.shape[0] != pred.shape[0]:
        raise DataError(f"x has {pred.shape[0]} records but y has {y_arr.shape[0]} labels")
    if y_arr.shape[0] == 0:
        raise DataError("cannot evaluate accuracy on an empty set")
    return float(np.mean(pred == y_arr))
