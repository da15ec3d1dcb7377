"""Forward and backward passes over a sequential model: nominal and interval.

`Network` owns the list of layers of the *trainable* part of a model (the frozen prefix is
applied once to the data, see agt/features.py) and chains the per-layer rules of
agt/bounded/layers.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agt.bounded.layers import GradSource, rule_for
from agt.bounded.losses import clipped_loss_grad_nominal, loss_grad_bounds, loss_grad_nominal
from agt.interval import BOUND_DTYPE, FloatModel, Interval
from agt.models import LayerSpec, ModelSpec, infer_shapes


def _layer_params(params: dict, index: int) -> dict:
    out = {}
    for short in ("weight", "bias"):
        key = f"{index}.{short}"
        if key in params:
            out[short] = params[key]
    return out


@dataclass(frozen=True)
class Network:
    """The layers ``layers[first:]`` of a model, with global layer indices."""

    layers: tuple[LayerSpec, ...]
    first: int = 0

    @staticmethod
    def trainable(spec: ModelSpec) -> "Network":
        return Network(spec.layers[spec.frozen_layers:], spec.frozen_layers)

    @staticmethod
    def prefix(spec: ModelSpec) -> "Network":
        return Network(spec.layers[:spec.frozen_layers], 0)

    def _indexed(self):
        for offset, layer in enumerate(self.layers):
            yield self.first + offset, layer, rule_for(layer)

    # -- nominal -----------------------------------------------------------------------
    def forward_nominal(self, params: dict[str, torch.Tensor], x: torch.Tensor):
        caches = []
        for idx, layer, rule in self._indexed():
            x, cache = rule.forward_nominal(layer, _layer_params(params, idx), x)
            caches.append(cache)
        return x, caches

    def grads_nominal(self, params, x, y, loss, clip_floor=None) -> dict[str, GradSource]:
        """Per-sample gradient sources of every parameter, nominal dtype; with
        ``clip_floor`` (b,) those of the clipped loss (`clipped_loss_grad_nominal`)."""
        z, caches = self.forward_nominal(params, x)
        delta = (loss_grad_nominal(loss, z, y) if clip_floor is None
                 else clipped_loss_grad_nominal(loss, z, y, clip_floor))
        return self._backward(params, caches, delta, nominal=True, fm=None)

    def forward_magnitudes(self, param_mags: dict, x_mag) -> torch.Tensor:
        """A-priori magnitudes of the nominal forward pass, for parameters with |p| <=
        ``param_mags[name]`` (floats, or float64 tensors that broadcast: one bound per
        query) and inputs with |x| <= ``x_mag`` (likewise). A layer of fan-in f (times the
        kernel area) gives every activation *and every partial sum* of its dot products
        <= f |W| A + |b|; ReLU and flatten keep the bound. Returns the largest such bound
        over the layers (the input's included), a float64 tensor."""
        act = torch.as_tensor(x_mag, dtype=torch.float64)
        worst = act
        for idx, layer, _ in self._indexed():
            if layer.kind not in ("linear", "conv2d"):
                continue
            area = layer.kernel ** 2 if layer.kind == "conv2d" else 1
            w = torch.as_tensor(param_mags.get(f"{idx}.weight", 0.0), dtype=torch.float64)
            act = layer.in_features * area * w * act + param_mags.get(f"{idx}.bias", 0.0)
            worst = torch.maximum(worst, act)
        return worst

    def gradient_magnitudes(self, param_mags: dict, x_mag, input_shape: tuple[int, ...]):
        """A-priori bound on every intermediate of the nominal per-sample gradient
        computation, for parameters with |p| <= ``param_mags[name]`` (floats) and inputs
        with |x| <= ``x_mag`` (a float or float64 tensor, one bound per record), under a loss
        whose gradient in each logit is <= 1 in magnitude (both losses: softmax - onehot and
        sigmoid - y).

        Forward as `forward_magnitudes`. Backward: the delta at the output of the last layer
        is <= 1; a ReLU mask and a flatten keep the bound; a parametrised layer above the
        first multiplies it by its factor fan-out |W| (every partial sum of W^T delta, and
        of a conv's fold, included). Per-sample parameter gradients: a weight entry is a sum
        over the layer's P output positions (P = 1 for a linear layer) of delta times an
        input entry, so it and its partial sums are <= P delta A_in; a bias entry <= P
        delta. Returns the largest bound, a float64 tensor shaped like ``x_mag``."""
        shapes = infer_shapes(self.layers, tuple(input_shape))
        act = torch.as_tensor(x_mag, dtype=torch.float64)
        worst = act
        params = []                        # (input bound, fan-out factor, positions)
        for pos, (idx, layer, _) in enumerate(self._indexed()):
            if layer.kind not in ("linear", "conv2d"):
                continue
            area = layer.kernel ** 2 if layer.kind == "conv2d" else 1
            positions = shapes[pos + 1][1] * shapes[pos + 1][2] if layer.kind == "conv2d" else 1
            w = float(param_mags.get(f"{idx}.weight", 0.0))
            params.append((act, layer.out_features * area * w, positions))
            act = layer.in_features * area * w * act + float(param_mags.get(f"{idx}.bias", 0.0))
            worst = torch.maximum(worst, act)
        delta = 1.0
        for i in range(len(params) - 1, -1, -1):
            a_in, fan, positions = params[i]
            worst = torch.maximum(worst, positions * delta * a_in)
            worst = torch.clamp_min(worst, positions * delta)
            if i > 0:
                delta *= fan
                worst = torch.clamp_min(worst, delta)
        return worst

    # -- bounds ------------------------------------------------------------------------
    def forward_bounds(self, params: dict[str, Interval], x: torch.Tensor, fm: FloatModel):
        """x: exact float64 (b, ...) data; params: Interval (G, ...). Returns logits
        Interval (G, b, C) and the caches."""
        act = x
        caches = []
        for idx, layer, rule in self._indexed():
            act, cache = rule.forward_bounds(layer, _layer_params(params, idx), act, fm)
            caches.append(cache)
        if not isinstance(act, Interval):
            g = next(iter(params.values())).shape[0]
            act = Interval.exact(act.unsqueeze(0).expand(g, *act.shape))
        return act, caches

    def feature_boxes(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                      fm: FloatModel, rows_per_pass: int) -> Interval:
        """Boxes (1, b, ...) of a frozen prefix's outputs for the records x (b, ...), from
        its exact parameters ``params`` (the prefix's tensors), ``rows_per_pass`` records
        per pass (the last pass may hold fewer).

        These boxes are shared by every k, outside the graded passes (agt/interval.py), so
        a kept record's must be the same floats in the runs on D and on D'. A record's
        floats can depend on the row count of the matrix products it takes part in (an
        adversarial review: a record that crossed a fragment boundary when an add-remove
        neighbour lost a record got other floats), but not on the other rows' values.
        So one record per pass where records can move (add-remove); under replace-one every
        record keeps its place and its pass's shape, and larger passes are as good (and
        about 10x faster behind a dense prefix layer)."""
        exact = {k: Interval.exact(v.to(BOUND_DTYPE).unsqueeze(0)) for k, v in params.items()}
        step = max(1, int(rows_per_pass))
        lo, hi = [], []
        for i in range(0, x.shape[0], step):
            # a fresh (aligned) copy: a BLAS kernel may sum a row in another order when it
            # starts at another offset in memory, and a record sits at another offset of
            # the batch tensor in the run on a neighbour with one record more or less
            rows = x[i:i + step].to(BOUND_DTYPE, copy=True)
            box, _ = self.forward_bounds(exact, rows, fm)
            lo.append(box.lo[0])
            hi.append(box.hi[0])
        if not lo:
            shapes = infer_shapes(self.layers, tuple(x.shape[1:]))
            empty = torch.zeros((0, *shapes[-1]), dtype=BOUND_DTYPE, device=x.device)
            return Interval(empty[None], empty[None].clone())
        return Interval(torch.cat(lo)[None], torch.cat(hi)[None])

    def grads_bounds(self, params, x, y, loss, fm) -> dict[str, GradSource]:
        z, caches = self.forward_bounds(params, x, fm)
        delta = loss_grad_bounds(loss, z, y, fm)
        return self._backward(params, caches, delta, nominal=False, fm=fm)

    # -- shared backward driver ----------------------------------------------------------
    def _backward(self, params, caches, delta, nominal: bool, fm):
        sources: dict[str, GradSource] = {}
        entries = list(self._indexed())
        first_param = min((i for i, (_, layer, _) in enumerate(entries) if layer.has_params),
                          default=len(entries))
        for pos in range(len(entries) - 1, first_param - 1, -1):
            idx, layer, rule = entries[pos]
            p = _layer_params(params, idx)
            need_input = pos > first_param
            if nominal:
                delta, src = rule.backward_nominal(layer, p, caches[pos], delta, need_input)
            else:
                delta, src = rule.backward_bounds(layer, p, caches[pos], delta, fm, need_input)
            for short, source in src.items():
                sources[f"{idx}.{short}"] = source
        return sources
