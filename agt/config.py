"""Training configuration: one flat YAML mapping, loaded into a frozen, validated dataclass.

Unknown keys and impossible values are `ConfigError`s that name the key. Derived values
(the resolved k grid, the input shape) live in the bundle, never in a mutated config.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agt.errors import ConfigError
from agt.models import ModelSpec

LOSSES = ("binary_cross_entropy", "cross_entropy")
OPTIMIZERS = ("sgd", "sgdm")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "float64")
SELECTIONS = ("exact", "threshold")


def parse_k_values(spec: Any) -> tuple[int, ...]:
    """Parse a k grid: a list of ints, or a string like ``"0..199"``, ``"0,1,2,5"`` or
    ``"0..10,20,50"``. Returns the sorted unique values; 0 is always included (the nominal
    model is the k = 0 member of every grid)."""
    values: list[int] = []
    if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):
        values = [int(spec)]
    elif isinstance(spec, (list, tuple)):
        for v in spec:
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ConfigError(f"k_values entries must be integers, got {v!r}")
            values.append(int(v))
    elif isinstance(spec, str):
        for part in spec.replace(" ", "").split(","):
            if not part:
                continue
            m = re.fullmatch(r"(\d+)\.\.(\d+)(?::(\d+))?", part)
            if m:
                a, b, step = int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)
                if b < a or step < 1:
                    raise ConfigError(f"k_values range '{part}' is empty; write low..high")
                values.extend(range(a, b + 1, step))
            elif re.fullmatch(r"\d+", part):
                values.append(int(part))
            else:
                raise ConfigError(f"k_values: cannot parse '{part}'; use e.g. '0..199' or "
                                  f"'0,1,2,5,10'")
    else:
        raise ConfigError(f"k_values must be a list of integers or a string like '0..199', "
                          f"got {spec!r}")
    if not values:
        raise ConfigError("k_values is empty; give e.g. '0..199' or [0, 1, 2, 5]")
    if any(v < 0 for v in values):
        raise ConfigError("k_values must be non-negative")
    return tuple(sorted(set(values) | {0}))


@dataclass(frozen=True)
class DataSpec:
    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_config(value: Any) -> "DataSpec":
        if isinstance(value, str):
            return DataSpec(value, {})
        if not isinstance(value, dict) or "name" not in value:
            raise ConfigError("data must be a mapping with a 'name' (blobs, npz, octmnist, "
                              "imdb) and its options, e.g. {name: blobs}")
        opts = {k: v for k, v in value.items() if k != "name"}
        return DataSpec(str(value["name"]), opts)


@dataclass(frozen=True)
class TrainConfig:
    model: ModelSpec
    loss: str
    data: DataSpec
    optimizer: str = "sgd"
    learning_rate: float = 0.1
    lr_decay: float = 0.0
    lr_min: float = 0.0
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    l2_reg: float = 0.0
    n_epochs: int = 1
    batch_size: int = 1_000_000_000
    clip_gamma: float = 1.0
    seed: int = 0
    k_values: tuple[int, ...] = (0,)
    fragment_size: int = 10_000
    device: str = "auto"
    dtype: str = "float64"
    frozen_layers: int = 0
    pretrained: str | None = None
    selection: str = "exact"
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------------------
    def learning_rate_at(self, step: int) -> float:
        """lr_t = max(lr / (1 + lr_decay * t), lr_min), t the step index from 0."""
        return max(self.learning_rate / (1.0 + self.lr_decay * step), self.lr_min)

    def to_json_dict(self) -> dict[str, Any]:
        out = dict(self.raw)
        out["k_values"] = list(self.k_values)
        return out

    def replace(self, **changes: Any) -> "TrainConfig":
        """A new validated config with some keys changed (configs are never mutated)."""
        raw = dict(self.raw)
        for key, value in changes.items():
            raw[key] = list(value) if isinstance(value, tuple) else value
        return config_from_dict(raw)


_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)} - {"raw"}


def _number(raw: dict, key: str, default: float, *, low: float | None = None,
            high: float | None = None, low_open: bool = False) -> float:
    value = raw.get(key, default)
    if isinstance(value, str):
        # YAML 1.1 reads 1e-3 (no dot) as a string; accept plain numeric strings.
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{key} must be a finite number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    value = float(value)
    if low is not None and (value < low or (low_open and value == low)):
        raise ConfigError(f"{key} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and value > high:
        raise ConfigError(f"{key} must be <= {high}, got {value}")
    return value


def _integer(raw: dict, key: str, default: int, low: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{key} must be an integer >= {low}, got {value!r}")
    return value


def _choice(raw: dict, key: str, default: str, choices: tuple[str, ...]) -> str:
    value = raw.get(key, default)
    if value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
    return value


def config_from_dict(raw: Any) -> TrainConfig:
    if not isinstance(raw, dict):
        raise ConfigError("the config must be a YAML mapping of keys to values")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise ConfigError(f"unknown config key(s) {sorted(unknown)}; allowed keys: "
                          f"{', '.join(sorted(_FIELDS))}")
    for key in ("model", "loss", "data"):
        if key not in raw:
            raise ConfigError(f"missing required config key '{key}'")
    frozen = raw.get("frozen_layers", 0)
    model = ModelSpec.from_config(raw["model"], frozen)
    loss = _choice(raw, "loss", "", LOSSES)
    optimizer = _choice(raw, "optimizer", "sgd", OPTIMIZERS)
    lr = _number(raw, "learning_rate", 0.1, low=0.0, low_open=True)
    lr_decay = _number(raw, "lr_decay", 0.0, low=0.0)
    lr_min = _number(raw, "lr_min", 0.0, low=0.0)
    if lr_min > lr:
        raise ConfigError(f"lr_min ({lr_min}) must not exceed learning_rate ({lr})")
    momentum = _number(raw, "momentum", 0.0, low=0.0, high=1.0)
    dampening = _number(raw, "dampening", 0.0, low=0.0, high=1.0)
    nesterov = raw.get("nesterov", False)
    if not isinstance(nesterov, bool):
        raise ConfigError(f"nesterov must be true or false, got {nesterov!r}")
    if optimizer == "sgd" and (momentum != 0.0 or nesterov or dampening != 0.0):
        raise ConfigError("momentum, dampening and nesterov need optimizer: sgdm")
    if nesterov and (momentum <= 0.0 or dampening != 0.0):
        raise ConfigError("nesterov needs momentum > 0 and dampening = 0 (PyTorch semantics)")
    l2 = _number(raw, "l2_reg", 0.0, low=0.0)
    if lr * l2 > 1.0:
        raise ConfigError(f"learning_rate * l2_reg must be <= 1 for a sound and monotone "
                          f"interval update, got {lr} * {l2} = {lr * l2}")
    gamma_ = _number(raw, "clip_gamma", 1.0, low=0.0, low_open=True)
    batch = _integer(raw, "batch_size", 1_000_000_000, 1)
    fragment = _integer(raw, "fragment_size", 10_000, 1)
    k_values = parse_k_values(raw.get("k_values", [0]))
    pretrained = raw.get("pretrained")
    if pretrained is not None and not isinstance(pretrained, str):
        raise ConfigError(f"pretrained must be a path to a .pt or .npz state dict, got {pretrained!r}")
    clean = dict(raw)
    clean["k_values"] = list(k_values)
    return TrainConfig(
        model=model, loss=loss, data=DataSpec.from_config(raw["data"]), optimizer=optimizer,
        learning_rate=lr, lr_decay=lr_decay, lr_min=lr_min, momentum=momentum,
        dampening=dampening, nesterov=nesterov, l2_reg=l2,
        n_epochs=_integer(raw, "n_epochs", 1, 1), batch_size=batch, clip_gamma=gamma_,
        seed=_integer(raw, "seed", 0, 0), k_values=k_values, fragment_size=fragment,
        device=_choice(raw, "device", "auto", DEVICES), dtype=_choice(raw, "dtype", "float64", DTYPES),
        frozen_layers=frozen, pretrained=pretrained,
        selection=_choice(raw, "selection", "exact", SELECTIONS), raw=clean)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a UTF-8 text file; is it a YAML config?") from None
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
    return config_from_dict(raw)
