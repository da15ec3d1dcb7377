"""Model specifications: a sequential list of layers, validated, buildable as torch.nn.

A model is written in YAML as a list of one-key mappings, e.g.::

    model: [{linear: {in: 6, out: 2}}]
    model: [{conv2d: {in: 1, out: 16, kernel: 4, stride: 2}}, {relu: {}}, {flatten: {}},
            {linear: {in: 3200, out: 100}}, {relu: {}}, {linear: {in: 100, out: 1}}]

Parameter names follow ``nn.Sequential(...).state_dict()``: ``"<layer index>.weight"`` and
``"<layer index>.bias"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from agt.errors import ConfigError, Problems

LAYER_KINDS = ("linear", "conv2d", "relu", "flatten")
_LAYER_KEYS = {
    "linear": {"in", "out", "bias"},
    "conv2d": {"in", "out", "kernel", "stride", "padding", "bias"},
    "relu": set(),
    "flatten": set(),
}


@dataclass(frozen=True)
class LayerSpec:
    kind: str
    in_features: int = 0
    out_features: int = 0
    kernel: int = 0
    stride: int = 1
    padding: int = 0
    bias: bool = True

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "linear":
            return {"linear": {"in": self.in_features, "out": self.out_features, "bias": self.bias}}
        if self.kind == "conv2d":
            return {"conv2d": {"in": self.in_features, "out": self.out_features,
                               "kernel": self.kernel, "stride": self.stride,
                               "padding": self.padding, "bias": self.bias}}
        return {self.kind: {}}

    @property
    def has_params(self) -> bool:
        return self.kind in ("linear", "conv2d")


MAX_WIDTH = 10**7            # units / channels / kernel size of one layer
MAX_PARAMS = 2 * 10**8       # parameters of a whole model (bounds hold K copies of them)


def _positive_int(value: Any, where: str, minimum: int = 1, maximum: int = MAX_WIDTH) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigError(f"{where} must be an integer in [{minimum}, {maximum}], got {value!r}")
    return value


def parse_layer(entry: Any, index: int) -> LayerSpec:
    where = f"model[{index}]"
    if not isinstance(entry, dict) or len(entry) != 1:
        raise ConfigError(f"{where} must be a one-key mapping like {{linear: {{in: 6, out: 2}}}},"
                          f" got {entry!r}")
    (kind, opts), = entry.items()
    if kind not in _LAYER_KEYS:
        raise ConfigError(f"{where}: unknown layer '{kind}'; supported layers: "
                          f"{', '.join(LAYER_KINDS)}")
    opts = {} if opts is None else opts
    if not isinstance(opts, dict):
        raise ConfigError(f"{where}.{kind} options must be a mapping, got {opts!r}")
    unknown = set(opts) - _LAYER_KEYS[kind]
    if unknown:
        raise ConfigError(f"{where}.{kind}: unknown option(s) {sorted(unknown)}; allowed: "
                          f"{sorted(_LAYER_KEYS[kind])}")
    if kind == "linear":
        for key in ("in", "out"):
            if key not in opts:
                raise ConfigError(f"{where}.linear needs '{key}'")
        return LayerSpec("linear", _positive_int(opts["in"], f"{where}.linear.in"),
                         _positive_int(opts["out"], f"{where}.linear.out"),
                         bias=_bool(opts.get("bias", True), f"{where}.linear.bias"))
    if kind == "conv2d":
        for key in ("in", "out", "kernel"):
            if key not in opts:
                raise ConfigError(f"{where}.conv2d needs '{key}'")
        return LayerSpec("conv2d", _positive_int(opts["in"], f"{where}.conv2d.in"),
                         _positive_int(opts["out"], f"{where}.conv2d.out"),
                         kernel=_positive_int(opts["kernel"], f"{where}.conv2d.kernel"),
                         stride=_positive_int(opts.get("stride", 1), f"{where}.conv2d.stride"),
                         padding=_positive_int(opts.get("padding", 0), f"{where}.conv2d.padding",
                                               0),
                         bias=_bool(opts.get("bias", True), f"{where}.conv2d.bias"))
    return LayerSpec(kind)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class ModelSpec:
    """A sequential model; ``frozen_layers`` leading layers are not trained (fixed features)."""

    layers: tuple[LayerSpec, ...]
    frozen_layers: int = 0
    input_shape: tuple[int, ...] | None = None
    param_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False)

    @staticmethod
    def from_config(entries: Any, frozen_layers: int = 0) -> "ModelSpec":
        """A validated spec from the YAML list of layers.

        Args:
            entries: e.g. ``[{linear: {in: 6, out: 2}}]``; layers linear, conv2d, relu, flatten.
            frozen_layers: how many leading layers stay fixed (a public pretrained prefix).

        Returns:
            The `ModelSpec`, its input shape still unknown (`with_input_shape`).

        Raises:
            ConfigError: every bad layer in one message, a bad `frozen_layers`, nothing to
                train, or too many parameters.
        """
        if not isinstance(entries, list) or not entries:
            raise ConfigError("model must be a non-empty list of layers, e.g. "
                              "[{linear: {in: 6, out: 2}}]")
        problems = Problems(kind=ConfigError)
        layers = []
        for i, entry in enumerate(entries):
            try:
                layers.append(parse_layer(entry, i))
            except ConfigError as exc:        # every bad layer in one message
                problems.add(str(exc))
        problems.raise_if_any()
        layers = tuple(layers)
        if isinstance(frozen_layers, bool) or not isinstance(frozen_layers, int) \
                or not 0 <= frozen_layers < len(layers):
            raise ConfigError(f"frozen_layers must be an integer in [0, {len(layers) - 1}], "
                              f"got {frozen_layers!r}")
        if not any(layer.has_params for layer in layers[frozen_layers:]):
            raise ConfigError("the trainable part of the model (after frozen_layers) has no "
                              "linear or conv2d layer")
        n_params = sum(_layer_params(layer) for layer in layers)
        if n_params > MAX_PARAMS:
            raise ConfigError(f"the model has {n_params:,} parameters; AGT stores K boxes of "
                              f"them, so at most {MAX_PARAMS:,} are supported")
        return ModelSpec(layers, frozen_layers)

    @staticmethod
    def from_module(module: nn.Module, frozen_layers: int = 0) -> "ModelSpec":
        """The spec of a PyTorch ``nn.Sequential`` of supported layers.

        Supported: Linear, Conv2d with square kernel, stride and padding, ReLU, Flatten with
        default dims. Initial weights are not taken from the module: a bundle's initialisation
        is `init_params(spec, seed)` (or a `pretrained` file).

        Args:
            module: the ``nn.Sequential``.
            frozen_layers: how many leading layers stay fixed.

        Returns:
            The `ModelSpec`.

        Raises:
            ConfigError: not an ``nn.Sequential``, or a layer or option (dilation, groups, ...)
                the bound rules do not cover, named in the message.
        """
        if not isinstance(module, nn.Sequential):
            raise ConfigError(f"ModelSpec.from_module needs an nn.Sequential, got "
                              f"{type(module).__name__}")
        entries = []
        for i, layer in enumerate(module):
            where = f"layer {i} ({type(layer).__name__})"
            if isinstance(layer, nn.Linear):
                entries.append({"linear": {"in": layer.in_features, "out": layer.out_features,
                                           "bias": layer.bias is not None}})
            elif isinstance(layer, nn.Conv2d):
                k, st, pd = layer.kernel_size, layer.stride, layer.padding
                if isinstance(pd, str) or len({*k}) != 1 or len({*st}) != 1 or len({*pd}) != 1 \
                        or layer.dilation != (1, 1) or layer.groups != 1 \
                        or layer.padding_mode != "zeros":
                    raise ConfigError(f"{where}: only square kernels, strides and zero paddings "
                                      f"without dilation or groups are supported")
                entries.append({"conv2d": {"in": layer.in_channels, "out": layer.out_channels,
                                           "kernel": k[0], "stride": st[0], "padding": pd[0],
                                           "bias": layer.bias is not None}})
            elif isinstance(layer, nn.ReLU):
                entries.append({"relu": {}})
            elif isinstance(layer, nn.Flatten):
                if (layer.start_dim, layer.end_dim) != (1, -1):
                    raise ConfigError(f"{where}: only Flatten() (start_dim 1, end_dim -1) is "
                                      f"supported")
                entries.append({"flatten": {}})
            else:
                raise ConfigError(f"{where} has no interval bound rule; supported layers: "
                                  f"Linear, Conv2d, ReLU, Flatten")
        return ModelSpec.from_config(entries, frozen_layers)

    def to_config(self) -> list[dict[str, Any]]:
        """The YAML list of layers of this spec.

        Returns:
            A list of one-key mappings, as `from_config` takes.
        """
        return [layer.to_dict() for layer in self.layers]

    def with_input_shape(self, input_shape: tuple[int, ...]) -> "ModelSpec":
        """Check the layer dimensions against the data's feature shape and record it.

        Args:
            input_shape: the shape of one record.

        Returns:
            A new `ModelSpec` with the input shape and parameter shapes.

        Raises:
            ConfigError: the layers do not fit the shape, or the output is not a logit vector.
        """
        shape = tuple(int(s) for s in input_shape)
        shapes = infer_shapes(self.layers, shape)
        params = {}
        for i, layer in enumerate(self.layers):
            if layer.kind == "linear":
                params[f"{i}.weight"] = (layer.out_features, layer.in_features)
            elif layer.kind == "conv2d":
                params[f"{i}.weight"] = (layer.out_features, layer.in_features,
                                         layer.kernel, layer.kernel)
            if layer.has_params and layer.bias:
                params[f"{i}.bias"] = (layer.out_features,)
        out = shapes[-1]
        if len(out) != 1:
            raise ConfigError(f"the model must end in a vector of logits, but its output "
                              f"has shape {out}; end with a linear layer")
        return ModelSpec(self.layers, self.frozen_layers, shape, params)

    @property
    def n_logits(self) -> int:
        """The length of the model's output (1: a binary model with one logit)."""
        return infer_shapes(self.layers, self.require_input_shape())[-1][0]

    @property
    def n_classes(self) -> int:
        """Classes the model predicts: 2 for one logit (1[z > 0]), else the logit count."""
        return max(2, self.n_logits)

    def require_input_shape(self) -> tuple[int, ...]:
        """The input shape, which must be known.

        Returns:
            The shape of one record.

        Raises:
            ConfigError: the spec has no input shape yet (`with_input_shape`).
        """
        if self.input_shape is None:
            raise ConfigError("model input shape unknown (internal: call with_input_shape)")
        return self.input_shape

    def trainable_param_names(self) -> list[str]:
        """The parameters AGT trains and bounds (those after the frozen prefix).

        Returns:
            Names as in ``nn.Sequential.state_dict()``, e.g. ``["0.weight", "0.bias"]``.
        """
        names = []
        for i, layer in enumerate(self.layers):
            if i >= self.frozen_layers and layer.has_params:
                names.append(f"{i}.weight")
                if layer.bias:
                    names.append(f"{i}.bias")
        return names

    def to_json(self) -> str:
        """The spec as JSON (layers, frozen layers, input shape), as bundles store it.

        Returns:
            A JSON string that `from_json` reads.
        """
        return json.dumps({"layers": [layer.to_dict() for layer in self.layers],
                           "frozen_layers": self.frozen_layers,
                           "input_shape": list(self.require_input_shape())}, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "ModelSpec":
        """The spec stored by `to_json`.

        Args:
            text: the JSON string.

        Returns:
            The `ModelSpec` with its input shape.
        """
        data = json.loads(text)
        spec = ModelSpec.from_config(data["layers"], data.get("frozen_layers", 0))
        return spec.with_input_shape(tuple(data["input_shape"]))

    def build(self, dtype: torch.dtype = torch.float64) -> nn.Sequential:
        """An ``nn.Sequential`` of this architecture (fresh PyTorch initialisation).

        Args:
            dtype: the parameters' dtype.

        Returns:
            The module.
        """
        return build_module(self.layers).to(dtype)


def _layer_params(layer: LayerSpec) -> int:
    if layer.kind == "linear":
        return layer.out_features * (layer.in_features + int(layer.bias))
    if layer.kind == "conv2d":
        return layer.out_features * (layer.in_features * layer.kernel ** 2 + int(layer.bias))
    return 0


def infer_shapes(layers: tuple[LayerSpec, ...],
                 input_shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Shapes (without batch dim) after each layer; raises ConfigError on a mismatch."""
    shape = tuple(input_shape)
    shapes = [shape]
    for i, layer in enumerate(layers):
        where = f"model[{i}] ({layer.kind})"
        if layer.kind == "linear":
            if len(shape) != 1 or shape[0] != layer.in_features:
                raise ConfigError(f"{where} expects {layer.in_features} input features but "
                                  f"receives shape {shape}; fix 'in' or add a flatten layer")
            shape = (layer.out_features,)
        elif layer.kind == "conv2d":
            if len(shape) != 3 or shape[0] != layer.in_features:
                raise ConfigError(f"{where} expects input (channels={layer.in_features}, H, W)"
                                  f" but receives shape {shape}")
            h = (shape[1] + 2 * layer.padding - layer.kernel) // layer.stride + 1
            w = (shape[2] + 2 * layer.padding - layer.kernel) // layer.stride + 1
            if h < 1 or w < 1:
                raise ConfigError(f"{where}: kernel {layer.kernel} does not fit input {shape}")
            shape = (layer.out_features, h, w)
        elif layer.kind == "flatten":
            n = 1
            for s in shape:
                n *= s
            shape = (n,)
        shapes.append(shape)
    return shapes


def build_module(layers: tuple[LayerSpec, ...]) -> nn.Sequential:
    mods: list[nn.Module] = []
    for layer in layers:
        if layer.kind == "linear":
            mods.append(nn.Linear(layer.in_features, layer.out_features, bias=layer.bias))
        elif layer.kind == "conv2d":
            mods.append(nn.Conv2d(layer.in_features, layer.out_features, layer.kernel,
                                  stride=layer.stride, padding=layer.padding, bias=layer.bias))
        elif layer.kind == "relu":
            mods.append(nn.ReLU())
        else:
            mods.append(nn.Flatten())
    return nn.Sequential(*mods)


def init_params(spec: ModelSpec, seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Deterministic initial parameters: PyTorch's default init under ``manual_seed(seed)``."""
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        module = build_module(spec.layers)
    finally:
        torch.random.set_rng_state(gen_state)
    return {k: v.detach().to(dtype).clone() for k, v in module.state_dict().items()}


__all__ = ["LayerSpec", "ModelSpec", "init_params", "infer_shapes", "build_module"]
