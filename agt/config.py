"""Training configuration: one flat mapping (YAML or Python keywords), loaded into a frozen,
validated dataclass.

Every problem of a config (unknown keys, wrong types, impossible values) is collected and
raised as one `ConfigError` naming the keys. Derived values (the resolved k grid, the input
shape) live in the bundle, never in a mutated config. From Python, `TrainConfig.create(
model=nn.Sequential(...) or ModelSpec, loss=..., **settings)` builds one; the ``data`` section
is needed only when the CLI loads the data itself.

``batch_size: full`` trains on the whole dataset as one batch whatever its size: the nominal
rule on a neighbour with one record more or less is then still one batch with the mean over
the actual size, and the bundle certifies add-remove as well as replace-one (agt/training.py).
An integer batch size certifies replace-one only, whatever n: the relations a bundle claims
depend on the config alone, never on the private dataset's size (agt/training.py).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agt.errors import ConfigError, Problems
from agt.kgrid import KGrid
from agt.models import ModelSpec

LOSSES = ("binary_cross_entropy", "cross_entropy")
OPTIMIZERS = ("sgd", "sgdm")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "float64")
SELECTIONS = ("exact", "threshold")
#: selection rules whose boxes provably nest (box(D', k-1) inside box(D, k)): their radii
#: satisfy r(D') >= r(D) - 1 and may feed smooth-sensitivity releases (agt/topk.py)
SMOOTH_SELECTIONS = ("exact",)
BOUND_METHODS = ("served-k0", "interval", "stability")
K_BOXES = ("interval", "ball")
K_PLACEMENTS = ("per-batch", "per-epoch")
#: bound methods whose radii satisfy r(D') >= r(D) - 1 with a smooth selection rule
#: (`agt.training.served_k0_box` proves it for served-k0; agt/stability.py for the balls)
SMOOTH_BOUND_METHODS = ("served-k0", "interval", "stability")

# Bundle versions that gate behaviour (the one place): a bundle's radii are smooth only if
# the agt that wrote it graded its interval passes (agt/interval.py), from GRADED_SINCE on,
# and for the per-epoch placement, whose programme compares neighbours' boxes through the
# same number of replaced records, only once those passes were graded by the programme's
# state too (agt/placement.py, Rounding). Earlier bundles keep valid certificates, but
# releases that spend radii refuse them (`agt.store.Bundle.smooth_radii`).
#: placement -> the first agt version whose bundles of that placement have smooth radii
SMOOTH_PLACEMENTS = {"per-batch": (0, 0, 0), "per-epoch": (0, 3, 8)}
#: the first agt version whose interval passes are graded
GRADED_SINCE = (0, 3, 6)
DEFAULT_BOUND_METHOD = "served-k0"
FULL = "full"
MAX_SEED = 2**32
MAX_EPOCHS = 100_000
MAX_BATCH = 10**9


def parse_k_values(spec: Any) -> tuple[int, ...]:
    """The k grid of a spec (see `agt.kgrid.KGrid.parse`) as a tuple."""
    return KGrid.parse(spec).values


@dataclass(frozen=True)
class DataSpec:
    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_config(value: Any, problems: Problems) -> "DataSpec | None":
        if value is None:
            return None
        if isinstance(value, str):
            return DataSpec(value, {})
        if not isinstance(value, dict) or "name" not in value:
            problems.add("data must be a mapping with a 'name' (blobs, npz, octmnist, imdb, "
                         "digits, mnist) and its options, e.g. {name: blobs}")
            return None
        return DataSpec(str(value["name"]), {k: v for k, v in value.items() if k != "name"})


def _key(default: Any, doc: str, *, choices: tuple[str, ...] | None = None) -> Any:
    """A config key: its default and its documentation (the configuration reference of the
    docs is generated from these, `config_reference`)."""
    meta = {"doc": doc}
    if choices is not None:
        meta["choices"] = choices
    if isinstance(default, (dict, list, KGrid)):
        return field(default_factory=lambda: default, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainConfig:
    """A validated training configuration: one flat mapping of the keys below.

    Build one with `TrainConfig.create` (Python) or `load_config` (YAML); both validate every
    key and report all problems of a config at once in one `ConfigError`. Configs are never
    mutated: `replace` returns a new validated one. The docs' configuration reference is
    generated from the field documentation here (`config_reference`).
    """

    model: ModelSpec = field(metadata={"doc": (
        "The model: a list of layers, `{linear: {in, out, bias}}`, "
        "`{conv2d: {in, out, kernel, stride, padding, bias}}`, `{relu: {}}`, `{flatten: {}}` "
        "(from Python also an `nn.Sequential` of these, or a `ModelSpec`). Required.")})
    loss: str = field(metadata={"doc": (
        "`binary_cross_entropy` (one logit) or `cross_entropy` (C >= 2 logits). Required."),
        "choices": LOSSES})
    data: DataSpec | None = _key(None, (
        "Where the CLI reads the private data: `{name: blobs|npz|digits|mnist|octmnist|imdb, "
        "...options}` (docs: Data). Not needed from Python, which passes a `Dataset`."))
    optimizer: str = _key("sgd", (
        "`sgd`, or `sgdm` (SGD with `momentum`, `dampening`, `nesterov` in "
        "`torch.optim.SGD`'s semantics)."), choices=OPTIMIZERS)
    learning_rate: float = _key(0.1, (
        "lr in lr_t = max(lr / (1 + lr_decay t), lr_min), t the step index from 0."))
    lr_decay: float = _key(0.0, "Decay of the learning rate (see learning_rate).")
    lr_min: float = _key(0.0, "Floor of the learning rate (see learning_rate).")
    momentum: float = _key(0.0, "Momentum of `sgdm`, in [0, 1].")
    dampening: float = _key(0.0, "Dampening of `sgdm` (needs momentum > 0).")
    nesterov: bool = _key(False, "Nesterov momentum of `sgdm` (needs momentum, no dampening).")
    l2_reg: float = _key(0.0, (
        "L2 weight decay; learning_rate * l2_reg must be <= 1 (a monotone interval update)."))
    n_epochs: int = _key(1, "Passes over the data, at most 10^5.")
    batch_size: int | str = _key(FULL, (
        "`full` (one batch of the whole dataset, whatever its size; certifies add-remove as "
        "well as replace-one) or an integer (minibatches; replace-one only, and every k of the "
        "grid below it)."))
    clip_gamma: float = _key(1.0, (
        "Per-sample gradients are clamped elementwise to [-gamma, gamma]; every bound charges "
        "a replaced record gamma per coordinate (AGT paper, Thm 4.6)."))
    seed: int = _key(0, "Seed of the initial weights and of the record order, below 2^32.")
    k_values: KGrid = _key(KGrid((0,)), (
        "The k grid: `0..199`, `0,1,2,5,10` or `0..10,20,50` (0 is always included; at most "
        "100,000 values). A query's radius is the grid *index* of its largest certified k."))
    fragment_size: int = _key(10_000, (
        "Records per streamed fragment of a batch: memory does not grow with the batch."))
    device: str = _key("auto", "`auto`, `cpu` or `cuda`.", choices=DEVICES)
    dtype: str = _key("float64", (
        "Arithmetic of the nominal (served) model; bounds are always float64."),
        choices=DTYPES)
    frozen_layers: int = _key(0, (
        "Leading layers kept fixed at their initial (pretrained) values: a public feature "
        "extractor in front of the trained head."))
    pretrained: str | None = _key(None, (
        "A `.pt` or `.npz` state dict of initial weights (a relative path resolves against "
        "the config's folder)."))
    selection: str = _key("exact", (
        "`exact`: the top-k rule of the AGT paper's Thm 4.6; boxes provably nest, so radii "
        "may feed smooth releases. `threshold`: the variational form with thresholds from the "
        "nominal gradients; sound, but with no nesting proof, so releases that spend radii "
        "refuse such bundles."), choices=SELECTIONS)
    bound_method: str = _key(DEFAULT_BOUND_METHOD, (
        "`served-k0`: the k = 0 box is the served model itself, so float rounding cannot "
        "take k = 0 certificates away (boxes of k >= 1 as under `interval`). `interval`: the "
        "paper's interval box for every k. `stability`: also one L2 ball per k for a linear "
        "head trained by gradient descent inside a declared input domain (`agt.stability`; "
        "replace-one only)."), choices=BOUND_METHODS)
    input_norm_bound: float | None = _key(None, (
        "`stability` only: the declared input domain, an L2 bound on every record of every "
        "neighbouring dataset; a public choice (such as sqrt(64) for 64 pixels in [0, 1]), "
        "never read off the private data. Training refuses records outside it."))
    k_boxes: str = _key("interval", (
        "How the boxes of k >= 1 are computed: `interval` (the AGT interval pass through "
        "every step) or, under `stability` only and its default there, `ball` (the boxes "
        "enclosing the L2 balls: no interval pass, about the cost of a nominal run)."),
        choices=K_BOXES)
    k_placement: str = _key("per-batch", (
        "`per-batch` (the paper: every batch may hold k replaced records) or `per-epoch` (the "
        "batches of an epoch hold at most k together, as a replace-one neighbour has them; "
        "tighter on minibatches and costlier; `agt.placement`)."), choices=K_PLACEMENTS)
    clip_norm: float | None = _key(None, (
        "`stability` with `k_boxes: ball` only: train each record on a clipped loss whose "
        "gradient has L2 norm <= C (DP-SGD's clipping for binary models), so a replaced "
        "record moves a step by at most 2 C lr / b (`agt.stability`)."))
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------------------
    @staticmethod
    def create(model, loss: str, **settings: Any) -> "TrainConfig":
        """A validated config from Python.

        Args:
            model: an ``nn.Sequential`` of supported layers, a `ModelSpec` or the YAML list of
                layers.
            loss: "cross_entropy" or another loss of `agt.config.LOSSES`.
            **settings: any other config keys (docs/reference/configuration.md), e.g.
                learning_rate, n_epochs, batch_size, clip_gamma, k_values.

        Returns:
            The validated `TrainConfig`.

        Raises:
            ConfigError: one error naming every bad key.
        """
        if isinstance(model, ModelSpec):
            layers = model.to_config()
            settings.setdefault("frozen_layers", model.frozen_layers)
        elif isinstance(model, list):
            layers = model
        else:
            spec = ModelSpec.from_module(model)
            layers = spec.to_config()
        if "k_values" in settings and not isinstance(settings["k_values"], (str, int)):
            settings["k_values"] = list(settings["k_values"])
        return config_from_dict({"model": layers, "loss": loss, **settings})

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of a step: lr_t = max(lr / (1 + lr_decay * t), lr_min).

        Args:
            step: t, the step index from 0.

        Returns:
            lr_t.
        """
        return max(self.learning_rate / (1.0 + self.lr_decay * step), self.lr_min)

    @property
    def full_batch(self) -> bool:
        """True for ``batch_size: full``: one batch of the whole dataset, whatever its size."""
        return self.batch_size == FULL

    def batch_for(self, n: int) -> int:
        """The size of the first batch on n records (every batch but the last).

        Args:
            n: the number of records.

        Returns:
            n for full batches, else min(batch_size, n).
        """
        return n if self.full_batch else min(int(self.batch_size), n)

    def to_json_dict(self) -> dict[str, Any]:
        """The config as a JSON-friendly mapping (as bundles store it).

        Returns:
            The raw keys, with k_values as a list.
        """
        out = dict(self.raw)
        out["k_values"] = list(self.k_values)
        return out

    def replace(self, **changes: Any) -> "TrainConfig":
        """A new validated config with some keys changed (configs are never mutated).

        Args:
            **changes: config keys and their new values.

        Returns:
            The new `TrainConfig`.

        Raises:
            ConfigError: a changed value is invalid.
        """
        raw = dict(self.raw)
        for key, value in changes.items():
            raw[key] = list(value) if isinstance(value, (tuple, KGrid)) else value
        return config_from_dict(raw)


_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)} - {"raw"}


@dataclass(frozen=True)
class ConfigKey:
    """One row of the configuration reference."""

    name: str
    default: str        # as it would be written in YAML; "required" for model and loss
    choices: tuple[str, ...]
    doc: str


def config_reference() -> list[ConfigKey]:
    """Every config key with its default, its choices and its documentation, in the order
    of `TrainConfig` (the docs' configuration reference is generated from this)."""
    rows = []
    for f in dataclasses.fields(TrainConfig):
        if f.name == "raw":
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        if value is None and f.name in ("model", "loss"):
            default = "required"
        elif isinstance(value, KGrid):
            default = ",".join(map(str, value))
        elif isinstance(value, bool):
            default = str(value).lower()
        else:
            default = "null" if value is None else str(value)
        rows.append(ConfigKey(f.name, default, tuple(f.metadata.get("choices", ())),
                              f.metadata["doc"]))
    return rows


class _Reader:
    """Typed reads of a raw config mapping; problems are collected, defaults returned."""

    def __init__(self, raw: dict, problems: Problems):
        self.raw = raw
        self.problems = problems

    def number(self, key: str, default: float, *, low: float | None = None,
               high: float | None = None, low_open: bool = False) -> float:
        value = self.raw.get(key, default)
        if isinstance(value, str):
            # YAML 1.1 reads 1e-3 (no dot) as a string; accept plain numeric strings.
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not math.isfinite(value):
            self.problems.add(f"{key} must be a finite number, got {value!r}")
            return default
        value = float(value)
        if low is not None and (value < low or (low_open and value == low)):
            self.problems.add(f"{key} must be {'>' if low_open else '>='} {low}, got {value}")
            return default
        if high is not None and value > high:
            self.problems.add(f"{key} must be <= {high}, got {value}")
            return default
        return value

    def optional_number(self, key: str, *, low: float | None = None,
                        low_open: bool = False) -> float | None:
        """A number, or None when the key is absent or null, or when the value is invalid
        (the problem is recorded; None keeps checks that depend on it from adding a second,
        spurious one)."""
        if self.raw.get(key) is None:
            return None
        value = self.number(key, math.nan, low=low, low_open=low_open)
        return None if math.isnan(value) else value

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
                or not low <= value < high:
            self.problems.add(f"{key} must be an integer in [{low}, {high}), got {value!r}")
            return default
        return int(value)

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.raw.get(key, default)
        if value not in choices:
            self.problems.add(f"{key} must be one of {', '.join(choices)}, got {value!r}")
            return default
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            self.problems.add(f"{key} must be true or false, got {value!r}")
            return default
        return value


def config_from_dict(raw: Any) -> TrainConfig:
    """Validate a raw config mapping (docs/reference/configuration.md).

    Args:
        raw: a mapping of config keys to values (as read from YAML).

    Returns:
        The `TrainConfig`.

    Raises:
        ConfigError: one error that names every problem.
    """
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a mapping of keys to values")
    problems = Problems(kind=ConfigError)
    unknown = set(raw) - _FIELDS
    if unknown:
        problems.add(f"unknown config key(s) {sorted(unknown)}; allowed keys: "
                     f"{', '.join(sorted(_FIELDS))}")
    for key in ("model", "loss"):
        if key not in raw:
            problems.add(f"missing required config key '{key}'")
    r = _Reader(raw, problems)
    frozen = raw.get("frozen_layers", 0)
    model = None
    if "model" in raw:
        try:
            model = ModelSpec.from_config(raw["model"], frozen)
        except ConfigError as exc:
            problems.add(str(exc))
    loss = r.choice("loss", LOSSES[0], LOSSES) if "loss" in raw else LOSSES[0]
    optimizer = r.choice("optimizer", "sgd", OPTIMIZERS)
    lr = r.number("learning_rate", 0.1, low=0.0, low_open=True)
    lr_decay = r.number("lr_decay", 0.0, low=0.0)
    lr_min = r.number("lr_min", 0.0, low=0.0)
    if lr_min > lr:
        problems.add(f"lr_min ({lr_min}) must not exceed learning_rate ({lr})")
    momentum = r.number("momentum", 0.0, low=0.0, high=1.0)
    dampening = r.number("dampening", 0.0, low=0.0, high=1.0)
    nesterov = r.boolean("nesterov", False)
    if optimizer == "sgd" and (momentum != 0.0 or nesterov or dampening != 0.0):
        problems.add("momentum, dampening and nesterov need optimizer: sgdm")
    if nesterov and (momentum <= 0.0 or dampening != 0.0):
        problems.add("nesterov needs momentum > 0 and dampening = 0 (PyTorch semantics)")
    if optimizer == "sgdm" and momentum == 0.0 and dampening != 0.0:
        problems.add("dampening without momentum: torch.optim.SGD ignores dampening when "
                     "momentum is 0; set dampening: 0 or momentum > 0")
    l2 = r.number("l2_reg", 0.0, low=0.0)
    if lr * l2 > 1.0:
        problems.add(f"learning_rate * l2_reg must be <= 1 for a sound and monotone interval "
                     f"update, got {lr} * {l2} = {lr * l2}")
    gamma_ = r.number("clip_gamma", 1.0, low=0.0, low_open=True)
    batch = raw.get("batch_size", FULL)
    if batch != FULL:
        batch = r.integer("batch_size", FULL, 1, MAX_BATCH + 1)
    fragment = r.integer("fragment_size", 10_000, 1, MAX_BATCH + 1)
    k_grid = KGrid((0,))
    try:
        k_grid = KGrid.parse(raw.get("k_values", [0]))
    except ConfigError as exc:
        problems.add(str(exc))
    pretrained = raw.get("pretrained")
    if pretrained is not None and (not isinstance(pretrained, str) or not pretrained):
        problems.add(f"pretrained must be a path to a .pt or .npz state dict, got {pretrained!r}")
        pretrained = None
    data = DataSpec.from_config(raw.get("data"), problems)
    epochs = r.integer("n_epochs", 1, 1, MAX_EPOCHS + 1)
    seed = r.integer("seed", 0, 0, MAX_SEED)
    device = r.choice("device", "auto", DEVICES)
    dtype = r.choice("dtype", "float64", DTYPES)
    dtype_max = float(np.finfo(dtype).max)
    for key, value in (("learning_rate", lr), ("clip_gamma", gamma_), ("l2_reg", l2)):
        if value > dtype_max / 16:
            problems.add(f"{key} = {value:g} is beyond what {dtype} arithmetic can train with "
                         f"(above max({dtype}) / 16 = {dtype_max / 16:.3g}); lower it")
    selection = r.choice("selection", "exact", SELECTIONS)
    bound_method = r.choice("bound_method", DEFAULT_BOUND_METHOD, BOUND_METHODS)
    norm_bound = r.optional_number("input_norm_bound", low=0.0, low_open=True)
    if norm_bound is not None and norm_bound > dtype_max / 16:
        # from the config alone: every record of the declared domain is then finite in the
        # dtype, so no record can make training refuse (docs/privacy.md)
        problems.add(f"input_norm_bound = {norm_bound:g} is beyond what {dtype} arithmetic "
                     f"can train with (above max({dtype}) / 16 = {dtype_max / 16:.3g}); "
                     "rescale the features and lower it, or train in float64")
    # under stability the clamp is off (gamma >= R), which leaves interval boxes of k >= 1
    # certifying nothing the balls do not (docs/results.md, Tightness): the fast boxes by
    # default
    k_boxes = r.choice("k_boxes", "ball" if bound_method == "stability" else "interval",
                       K_BOXES)
    clip_norm = r.optional_number("clip_norm", low=0.0, low_open=True)
    k_placement = r.choice("k_placement", "per-batch", K_PLACEMENTS)
    if k_placement == "per-epoch":
        if k_boxes != "interval":
            problems.add("k_placement: per-epoch shapes the interval pass's boxes; with "
                         "k_boxes: ball no interval pass runs (set k_boxes: interval or remove "
                         "k_placement)")
        if selection != "exact":
            problems.add("k_placement: per-epoch computes its boxes with the exact top-k "
                         "rule; remove selection: threshold")
    if bound_method == "stability":
        _check_stability(model, optimizer, momentum, gamma_, norm_bound, clip_norm,
                         k_boxes, problems, norm_given=raw.get("input_norm_bound") is not None,
                         clip_given=raw.get("clip_norm") is not None)
    else:
        if raw.get("clip_norm") is not None:
            problems.add("clip_norm (per-record gradient clipping) is supported only under "
                         "bound_method: stability, whose balls prove it; the interval pass "
                         "bounds the elementwise clamp clip_gamma only")
        if raw.get("input_norm_bound") is not None:
            problems.add("input_norm_bound is used only by bound_method: stability; remove it "
                         "or set bound_method: stability")
        if k_boxes != "interval":
            problems.add("k_boxes: ball needs bound_method: stability (the boxes of k >= 1 "
                         "are then the ones enclosing its L2 balls)")
    problems.raise_if_any()
    clean = dict(raw)
    clean["k_values"] = list(k_grid)
    if bound_method == "stability":
        clean["k_boxes"] = k_boxes
    return TrainConfig(
        model=model, loss=loss, data=data, optimizer=optimizer, learning_rate=lr,
        lr_decay=lr_decay, lr_min=lr_min, momentum=momentum, dampening=dampening,
        nesterov=nesterov, l2_reg=l2, n_epochs=epochs, batch_size=batch, clip_gamma=gamma_,
        seed=seed, k_values=k_grid, fragment_size=fragment, device=device, dtype=dtype,
        frozen_layers=model.frozen_layers, pretrained=pretrained, selection=selection,
        bound_method=bound_method, input_norm_bound=norm_bound, k_boxes=k_boxes,
        k_placement=k_placement, clip_norm=clip_norm, raw=clean)


def _check_stability(model, optimizer, momentum, gamma_, norm_bound, clip_norm, k_boxes,
                     problems, norm_given: bool = False, clip_given: bool = False) -> None:
    """The setting agt/stability.py proves its balls for."""
    why = "bound_method: stability"
    if model is not None and (len(model.layers) != 1 or model.layers[0].kind != "linear"
                              or model.frozen_layers):
        problems.add(f"{why} needs a model of exactly one trainable linear layer (a linear "
                     f"head on fixed features); use served-k0 for other models")
    if optimizer != "sgd" or momentum != 0.0:
        problems.add(f"{why} needs optimizer: sgd without momentum (gradient descent)")
    if clip_norm is not None:
        if k_boxes != "ball":
            problems.add("clip_norm needs k_boxes: ball (the interval pass does not model "
                         "per-record gradient clipping)")
    if norm_bound is None or (clip_given and clip_norm is None):
        if norm_bound is None and not norm_given:   # an invalid value has its own message
            problems.add(f"{why} needs input_norm_bound: an L2 norm bound R that every record "
                         f"of every dataset in the relation satisfies (the declared input "
                         f"domain)")
        return
    bias = model is None or model.layers[0].bias
    need = max(norm_bound, 1.0 if bias else 0.0)
    if clip_norm is not None and clip_norm < need:
        if gamma_ < clip_norm:
            problems.add(f"{why} with clip_norm {clip_norm:g} needs clip_gamma >= {clip_norm:g} "
                         f"so that the clamp never acts on a clipped gradient; got clip_gamma "
                         f"{gamma_:g}")
    elif gamma_ < need:
        what = "max(input_norm_bound, 1 for the bias)" if bias else "input_norm_bound"
        problems.add(f"{why} needs clip_gamma >= {need:g} ({what}) so that the clamp never "
                     f"acts; got clip_gamma {gamma_:g}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last
    silently: a learning_rate appended at the end of a config overrode the one above)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue      # "<<: *anchor": its keys may be overridden here, as YAML says
            key = self.construct_object(key_node, deep=True)
            plain = key is None or isinstance(key, (str, int, float, bool))
            if plain and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping",
                    key_node.start_mark)
            seen.add(key if plain else id(key_node))
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """yaml.safe_load, refusing duplicate keys (configs and experiment plans)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a YAML config.

    Relative paths inside it (``data.path``, ``data.data_dir``, ``pretrained``) resolve
    against the config file's folder.

    Args:
        path: the YAML file.
        overrides: keys that replace the file's (e.g. ``{"k_values": "0..9"}``).

    Returns:
        The validated `TrainConfig`.

    Raises:
        ConfigError: a missing or unreadable file, malformed YAML, or invalid keys.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a UTF-8 text file; is it a YAML config?") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"malformed YAML in {path}{where}: "
                          f"{getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must contain a YAML mapping of config keys, got "
                          f"{type(raw).__name__}")
    if overrides:
        raw = {**raw, **overrides}
    base = path.resolve().parent
    pretrained = raw.get("pretrained")
    if (isinstance(pretrained, str) and pretrained
            and not Path(pretrained).expanduser().is_absolute()):
        raw = {**raw, "pretrained": str(base / Path(pretrained).expanduser())}
    return config_from_dict(raw)
