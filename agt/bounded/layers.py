"""Per-layer rules: nominal pass (training dtype) and interval pass (float64 bounds).

Each supported layer type has one rule object, registered by kind;
an unregistered layer raises instead of falling back.

Shapes. Nominal activations are ``(b, ...)`` in the training dtype. In the interval pass
an activation is either an exact float64 tensor ``(b, ...)`` (the data, shared by every box)
or an `Interval` ``(G, b, ...)``, one slice per parameter box of the group being bounded;
interval parameters are ``(G, *param_shape)``.

Backward passes return, besides the gradient w.r.t. the layer input, a `GradSource` per
parameter that materialises per-sample gradients for a range of rows (output units /
output channels) only when asked: per-sample weight gradients of a wide layer are the
dominant memory cost and are consumed chunk by chunk (see agt/topk.py).

Rounding: the nominal code below is the *definition* of the nominal computation the bounds
enclose. Each interval operation is widened for the nominal rounding of the matching
nominal operation (agt/interval.py), so the two must stay in step: a change to a nominal
formula needs the matching change to its interval twin.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Union

import torch
import torch.nn.functional as F

from agt import interval as iv
from agt.errors import ConfigError
from agt.interval import BOUND_DTYPE, FloatModel, Interval
from agt.models import LayerSpec

Act = Union[torch.Tensor, Interval]


@dataclass(frozen=True)
class OuterBounds:
    """Per-sample bounds of a linear layer's weight gradient delta_s a_s^T, given by their
    factors: for box g, output unit o, input i and sample s, in the compute dtype,

    * an exact input a (the data, or exact features), ``a_hi`` None, with a+ = max(a, 0)
      and a- = min(a, 0):

            lo[g, o, i, s] = d_lo[g, o, s] a+[i, s] + d_hi[g, o, s] a-[i, s]
            hi[g, o, i, s] = d_hi[g, o, s] a+[i, s] + d_lo[g, o, s] a-[i, s]

      (exactly one of the two products is non-zero, so each bound is one rounded product);
    * an interval input [a, a_hi] (a hidden layer's activations, or features of a prefix
      computed with rounding): lo (hi) = the least (greatest) of the four corner products
      d_lo a, d_lo a_hi, d_hi a and d_hi a_hi.

    ``d`` is widened so that each product's rounding stays outward
    (`agt.interval.product_factor`); this is the interval product of Moore's four-corner
    rule with that rounding.

    O(b (in + G out)) numbers for the b G out in bounds: a consumer that computes the bounds
    where it uses them (`agt.topk.DescentAccumulator.add_outer`) never writes them to
    memory. `values` is the one torch definition of the formula; the compiled merge of
    agt/topk_kernel.py repeats it and is tested against it.

    Attributes:
        d_lo: (G, out, b) lower bounds of the widened output gradient, compute dtype.
        d_hi: (G, out, b) upper bounds.
        a: the exact input (in, b), or the input's lower bounds (G or 1, in, b).
        a_hi: None, or the input's upper bounds (G or 1, in, b)."""

    d_lo: torch.Tensor
    d_hi: torch.Tensor
    a: torch.Tensor
    a_hi: torch.Tensor | None = None

    @property
    def n_samples(self) -> int:
        return int(self.a.shape[-1])

    @property
    def exact(self) -> bool:
        return self.a_hi is None

    @property
    def in_features(self) -> int:
        return int(self.a.shape[-2])

    @cached_property
    def _a_parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a.clamp_min(0.0).unsqueeze(0), self.a.clamp_max(0.0).unsqueeze(0)

    def values(self, start: int, stop: int) -> Interval:
        """The bounds of output rows [start, stop): Interval (G, (stop - start) * in, b)."""
        lo, hi = self.block((start, stop), (0, self.in_features), (0, self.n_samples))
        g, b = lo.shape[0], lo.shape[-1]
        return Interval(lo.reshape(g, -1, b), hi.reshape(g, -1, b))

    def block(self, outputs: tuple[int, int], inputs: tuple[int, int],
              samples: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The bounds of output units [o0, o1), inputs [i0, i1) and samples [s0, s1), by the
        formulas above, on the factors' device: (lo, hi), each (G, o1 - o0, i1 - i0, s1 - s0)
        (G = 1 where every factor is shared by the boxes). Elementwise in the factors, so a
        block holds, value for value, the entries of `values` at the same indices (this is
        the one torch definition; `values` is its whole-input block)."""
        (o0, o1), (i0, i1), (s0, s1) = outputs, inputs, samples
        dl = self.d_lo[:, o0:o1, s0:s1].unsqueeze(2)                    # (G, rows, 1, n)
        dh = self.d_hi[:, o0:o1, s0:s1].unsqueeze(2)
        if self.a_hi is None:
            a_pos, a_neg = self._a_parts                                # (1, in, b)
            a_pos, a_neg = a_pos[:, i0:i1, s0:s1], a_neg[:, i0:i1, s0:s1]
            # exactly one of the two products is non-zero: no extra rounding
            lo = (dl * a_pos).addcmul_(dh, a_neg)
            hi = (dh * a_pos).addcmul_(dl, a_neg)
        else:
            a_lo = self.a[..., i0:i1, s0:s1].unsqueeze(-3)              # (G|1, 1, in, n)
            a_hi = self.a_hi[..., i0:i1, s0:s1].unsqueeze(-3)
            p1, p2, p3, p4 = dl * a_lo, dl * a_hi, dh * a_lo, dh * a_hi
            lo = torch.minimum(torch.minimum(p1, p2), torch.minimum(p3, p4))
            hi = torch.maximum(torch.maximum(p1, p2), torch.maximum(p3, p4))
        return lo, hi


@dataclass(frozen=True)
class GradSource:
    """Per-sample gradients of one parameter, produced ``rows`` at a time.

    ``fn(start, stop)`` returns a tensor (nominal) or Interval (bounds) with trailing shape
    ``(b, (stop - start) * row_size)`` (bounds have a leading group dim); rows index the
    parameter's first dimension, so a row chunk is a contiguous slice of the flattened
    parameter. Bound sources also offer ``samples_last(start, stop)``: the same bounds laid
    out ``(G, n, b)`` (what the top-k accumulator consumes) in the compute dtype.
    """

    n_rows: int
    row_size: int
    fn: Callable[[int, int], object]
    samples_last_fn: Callable[[int, int], object] | None = None
    outer: OuterBounds | None = None

    @staticmethod
    def bounds(n_rows: int, row_size: int, samples_last: Callable[[int, int], Interval],
               outer: OuterBounds | None = None) -> "GradSource":
        def fn(start, stop):
            return samples_last(start, stop).map(lambda t: t.transpose(-1, -2))
        return GradSource(n_rows, row_size, fn, samples_last, outer)

    def samples_last(self, start: int, stop: int) -> Interval:
        if self.samples_last_fn is None:
            raise RuntimeError("internal: samples_last is only defined for bound sources")
        return self.samples_last_fn(start, stop)


# ------------------------------------------------------------------------------------------
class LinearRule:
    def forward_nominal(self, layer, p, x):
        z = x @ p["weight"].T
        if "bias" in p:
            z = z + p["bias"]
        return z, x

    def backward_nominal(self, layer, p, a, delta, need_input_grad):
        grad_in = delta @ p["weight"] if need_input_grad else None
        out_f, in_f = p["weight"].shape
        b = delta.shape[0]

        def weight(start, stop):
            return (delta[:, start:stop, None] * a[:, None, :]).reshape(b, -1)

        sources = {"weight": GradSource(out_f, in_f, weight)}
        if "bias" in p:
            sources["bias"] = GradSource(out_f, 1, lambda s, e: delta[:, s:e])
        return grad_in, sources

    def forward_bounds(self, layer, p, x: Act, fm: FloatModel):
        w_t = p["weight"].map(lambda t: t.transpose(-1, -2))          # (G, in, out)
        if isinstance(x, Interval):
            z = iv.matmul(x, w_t, fm)                                   # (G, b, out)
        else:
            z = iv.matmul_exact_left(x, w_t, fm)                        # (G, b, out)
        if "bias" in p:
            z = iv.add(z, p["bias"].map(lambda t: t.unsqueeze(-2)), fm)
        return z, x

    def backward_bounds(self, layer, p, a: Act, delta: Interval, fm, need_input_grad):
        grad_in = iv.matmul(delta, p["weight"], fm) if need_input_grad else None
        out_f = delta.shape[-1]
        in_f = p["weight"].shape[-1]
        cdtype = fm.nominal_dtype
        # per-sample outer products delta_i a_i^T as their factors (OuterBounds), in the
        # nominal dtype: delta is widened so each rounded product stays a bound
        d_wide = iv.to_dtype_outward(iv.product_factor(delta, fm), cdtype)
        d_lo = d_wide.lo.transpose(1, 2).contiguous()                     # (G, out, b)
        d_hi = d_wide.hi.transpose(1, 2).contiguous()
        if isinstance(a, Interval):
            a_c = iv.to_dtype_outward(a, cdtype)
            outer = OuterBounds(d_lo, d_hi, a_c.lo.transpose(-1, -2).contiguous(),
                                a_c.hi.transpose(-1, -2).contiguous())     # (G|1, in, b)
        else:
            outer = OuterBounds(d_lo, d_hi, a.to(cdtype).transpose(0, 1).contiguous())

        sources = {"weight": GradSource.bounds(out_f, in_f, outer.values, outer)}
        if "bias" in p:
            bias_grad = iv.to_dtype_outward(delta, cdtype).map(
                lambda t: t.transpose(1, 2).contiguous())
            sources["bias"] = GradSource.bounds(out_f, 1, lambda s, e: bias_grad[:, s:e])
        return grad_in, sources


# ------------------------------------------------------------------------------------------
class Conv2dRule:
    """Convolution as unfold (an exact copy) followed by a matrix product, so its rounding
    error obeys the dot-product bound whatever the backend; the nominal pass uses the same
    formulation."""

    @staticmethod
    def _unfold(layer: LayerSpec, x: torch.Tensor) -> torch.Tensor:
        """F.unfold's (b, C k k, L) patches, bit for bit and in its (contiguous) layout, as
        a strided view and one copy: im2col on the CPU is about 5x slower on the OctMNIST
        prefix's shapes (the certifier's served pass runs it on every query). Zero padding
        is F.pad's exact zeros, as F.unfold's."""
        k, st = layer.kernel, layer.stride
        if layer.padding:
            x = F.pad(x, (layer.padding,) * 4)
        b, c = x.shape[0], x.shape[1]
        view = x.unfold(2, k, st).unfold(3, k, st)                 # (b, C, oh, ow, k, k)
        oh, ow = view.shape[2], view.shape[3]
        return view.permute(0, 1, 4, 5, 2, 3).reshape(b, c * k * k, oh * ow).contiguous()

    @staticmethod
    def _out_hw(layer: LayerSpec, h: int, w: int) -> tuple[int, int]:
        return ((h + 2 * layer.padding - layer.kernel) // layer.stride + 1,
                (w + 2 * layer.padding - layer.kernel) // layer.stride + 1)

    def forward_nominal(self, layer, p, x):
        b, _, h, w = x.shape
        oh, ow = self._out_hw(layer, h, w)
        patches = self._unfold(layer, x)                                 # (b, CKK, L)
        z = p["weight"].reshape(layer.out_features, -1) @ patches        # (b, Cout, L)
        if "bias" in p:
            z = z + p["bias"][:, None]
        return z.reshape(b, layer.out_features, oh, ow), (patches, (h, w))

    def backward_nominal(self, layer, p, cache, delta, need_input_grad):
        patches, (h, w) = cache
        b = delta.shape[0]
        d = delta.reshape(b, layer.out_features, -1)                     # (b, Cout, L)
        grad_in = None
        if need_input_grad:
            gp = p["weight"].reshape(layer.out_features, -1).T @ d       # (b, CKK, L)
            grad_in = F.fold(gp, (h, w), layer.kernel, padding=layer.padding, stride=layer.stride)
        patches_t = patches.transpose(1, 2)                              # (b, L, CKK)
        ckk = patches.shape[1]

        def weight(start, stop):
            return (d[:, start:stop, :] @ patches_t).reshape(b, -1)

        sources = {"weight": GradSource(layer.out_features, ckk, weight)}
        if "bias" in p:
            sources["bias"] = GradSource(layer.out_features, 1,
                                         lambda s, e: d[:, s:e, :].sum(-1))
        return grad_in, sources

    def forward_bounds(self, layer, p, x: Act, fm):
        w_mat = p["weight"].map(lambda t: t.reshape(t.shape[0], 1, layer.out_features, -1))
        if isinstance(x, Interval):
            g, b, c, h, w = x.shape
            patches = x.map(lambda t: self._unfold(layer, t.reshape(g * b, c, h, w))
                            .reshape(g, b, -1, self._unfold_len(layer, h, w)))
            z = iv.matmul(w_mat, patches, fm)                              # (G, b, Cout, L)
        else:
            b, c, h, w = x.shape
            patches = self._unfold(layer, x)                               # (b, CKK, L)
            z = iv.matmul_exact_right(w_mat, patches, fm)                  # (G, b, Cout, L)
        if "bias" in p:
            z = iv.add(z, p["bias"].map(lambda t: t[:, None, :, None]), fm)
        oh, ow = self._out_hw(layer, h, w)
        z = z.map(lambda t: t.reshape(t.shape[0], t.shape[1], layer.out_features, oh, ow))
        return z, (patches, (h, w))

    def _unfold_len(self, layer, h, w):
        oh, ow = self._out_hw(layer, h, w)
        return oh * ow

    def backward_bounds(self, layer, p, cache, delta: Interval, fm, need_input_grad):
        patches, (h, w) = cache
        g, b = delta.shape[0], delta.shape[1]
        d = delta.map(lambda t: t.reshape(g, b, layer.out_features, -1))  # (G, b, Cout, L)
        grad_in = None
        if need_input_grad:
            w_t = p["weight"].map(lambda t: t.reshape(g, 1, layer.out_features, -1)
                                  .transpose(-1, -2))                      # (G, 1, CKK, Cout)
            gp = iv.matmul(w_t, d, fm)                                     # (G, b, CKK, L)
            ckk, length = gp.shape[-2], gp.shape[-1]

            def fold(t):
                return F.fold(t.reshape(g * b, ckk, length), (h, w), layer.kernel,
                              padding=layer.padding, stride=layer.stride)

            n_overlap = layer.kernel * layer.kernel

            def boxes_first(t):             # (G b, ...) -> (G, b, ...): grades per box
                return t.reshape(g, b, *t.shape[1:])

            grad_in = fm.widen(boxes_first(fold(gp.lo)), boxes_first(fold(gp.hi)),
                               boxes_first(fold(gp.magnitude())), n_overlap)
        exact_patches = not isinstance(patches, Interval)
        ckk = patches.shape[-2]

        cdtype = fm.nominal_dtype

        def weight(start, stop):
            dd = d[:, :, start:stop, :]                                    # (G, b, r, L)
            if exact_patches:
                prod = iv.matmul_exact_right(dd, patches.transpose(-1, -2), fm)
            else:
                prod = iv.matmul(dd, patches.map(lambda t: t.transpose(-1, -2)), fm)
            prod = prod.map(lambda t: t.reshape(t.shape[0], b, -1).transpose(1, 2))
            return iv.to_dtype_outward(prod, cdtype)                       # (G, n, b)

        def bias(start, stop):
            summed = iv.sum_intervals(d[:, :, start:stop, :], -1, fm)      # (G, b, r)
            return iv.to_dtype_outward(summed.map(lambda t: t.transpose(1, 2)), cdtype)

        sources = {"weight": GradSource.bounds(layer.out_features, ckk, weight)}
        if "bias" in p:
            sources["bias"] = GradSource.bounds(layer.out_features, 1, bias)
        return grad_in, sources


# ------------------------------------------------------------------------------------------
class ReLURule:
    def forward_nominal(self, layer, p, x):
        return torch.relu(x), x

    def backward_nominal(self, layer, p, z, delta, need_input_grad):
        return delta * (z > 0).to(delta.dtype), {}

    def forward_bounds(self, layer, p, x: Act, fm):
        if isinstance(x, Interval):
            return iv.relu(x), x
        return torch.relu(x), x

    def backward_bounds(self, layer, p, z: Act, delta: Interval, fm, need_input_grad):
        if isinstance(z, Interval):
            return iv.mask_product(delta, iv.heaviside_mask(z)), {}
        mask = (z > 0).to(BOUND_DTYPE)
        return iv.mask_product(delta, Interval(mask, mask)), {}


class FlattenRule:
    def forward_nominal(self, layer, p, x):
        return x.reshape(x.shape[0], -1), x.shape

    def backward_nominal(self, layer, p, shape, delta, need_input_grad):
        return delta.reshape(shape), {}

    def forward_bounds(self, layer, p, x: Act, fm):
        if isinstance(x, Interval):
            return x.map(lambda t: t.reshape(t.shape[0], t.shape[1], -1)), tuple(x.shape[1:])
        return x.reshape(x.shape[0], -1), tuple(x.shape)

    def backward_bounds(self, layer, p, shape, delta: Interval, fm, need_input_grad):
        # shape = (b, ...) of the layer input without the group dim
        g = delta.shape[0]
        return delta.map(lambda t: t.reshape(g, *shape)), {}


RULES = {"linear": LinearRule(), "conv2d": Conv2dRule(), "relu": ReLURule(),
         "flatten": FlattenRule()}


def rule_for(layer: LayerSpec):
    try:
        return RULES[layer.kind]
    except KeyError:
        raise ConfigError(f"no bound rule registered for layer '{layer.kind}'") from None
