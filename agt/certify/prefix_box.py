"""The certifier's feature boxes behind a frozen prefix: one midpoint product and one radius
product per layer (midpoint-radius arithmetic), instead of the training pass's interval rules.

A frozen prefix is a point computation: exact (float) weights, an exact query. Its box only
has to hold what rounding can do, so it is carried as a midpoint and a radius (Rump,
"Fast and parallel interval arithmetic", BIT 39, 1999: midpoint-radius products), with
the rounding of every float evaluation bounded a priori (Higham, "Accuracy and Stability
of Numerical Algorithms", 2nd ed., Thm 3.1 and Sec. 3.1: any summation order, with or
without FMA, underflow as an absolute term per operation, which covers flush-to-zero).
The box of each layer's output holds (1) the exact result for every point of the input
box and (2) whatever the served model's float pass (dtype with unit roundoff u, any
summation order or batch layout) returns for every served input in the input box; the
certifier's reference test and both screens read these boxes (`Certifier._features`), so
they decide on the same box. Training keeps `Network.feature_boxes` (the interval rules of
agt/bounded/layers.py): both are sound; this one is about as tight (one rounding bound per
layer instead of the widening of three products) and several times cheaper.

A linear or convolution layer (convolution: an unfold, which copies exactly, then a
product; here channels-last, each patch's n terms in (kh, kw, C) order with the weights'
columns permuted alike, which the bound below allows since it holds for any order of the
terms) with weights W and bias b (exact floats), n terms per output (fan-in times the
kernel area; zero padding counts), input box [am - ar, am + ar] (ar = 0 for the query):

    g   = gamma(n + 2, u) + gamma(n + 2, v) + 4 v,            v = 2^-53,
    mid = fl64(W am + b),
    t   = fl64(ar c1 + |am| c2),  c1 = (1 + g)(1 + 8 v),  c2 = g (1 + 8 v),
    t32 = t cast up to float32 (t (1 + 2^-22) + tiny32, then rounded to nearest),
    P   = fl32(|W| t32)                          (the radius product in float32),
    R   = fl64((P + |b| c2) c3 + A),  c3 = (1 + 2 gamma(n + 4, 2^-24))(1 + 8 v),
    A   = 4 (n + 4)(tiny(u) + tiny32 + tiny64),
    box = [fl64(mid - R), fl64(mid + R)].

The bias counts as one more term of the sum, so a served pass that fuses it (addmm,
bias first) is covered too; where biases are large next to |W| |am| this makes the box a
little wider than the interval rules' (which add the bias as a separate rounded sum):
median width +3% on an OctMNIST-shaped random prefix.

Claim: the box holds W y + b for every real y with |y - am| <= ar, and fl_u(W y + b) (the
served pass, any order) for every such y.

Proof. (i) Targets: |W y + b - (W am + b)| <= |W| ar, and the served pass errs by at most
gamma(n + 1, u)(|W| |y| + |b|) + (n + 1) tiny(u) (Higham Thm 3.1, the bias one more term),
|y| <= |am| + ar; so both lie within |W| ar + g0 (|W| (|am| + ar) + |b|) + (n + 1) tiny(u)
of W am + b, g0 = gamma(n + 2, u). (ii) The midpoint errs by at most gamma(n + 1, v)
(|W| |am| + |b|) + (n + 1) tiny64. (iii) The ends: fl64(mid + R) >= mid + R - v (|mid| +
R) (the lower end is symmetric), and v |mid| <= 2 v (|W| |am| + |b|) + tiny64 by (ii).
Since g >= g0 + gamma(n + 2, v) + 2 v, the box holds both targets once
    R (1 - v) >= |W| (ar (1 + g) + g |am|) + g |b| + (n + 2)(tiny(u) + tiny64).      (*)
(iv) R satisfies (*): t errs by v relative per operation and tiny64 per underflow, and
(1 + 8 v)(1 - v)^2 >= 1, so t >= ar (1 + g) + g |am| - 2 tiny64; the cast rounds
t (1 + 2^-22) + tiny32 (a normal float32 value) to nearest, at most 2^-24 relative, so
t32 >= t + tiny32 / 4 >= ar (1 + g) + g |am|. P sums n non-negative products in float32:
P >= (1 - gamma(n, 2^-24)) |W| t32 - 2 n tiny32. The last four float64 operations err by
v relative each, and c3 (1 - v)^5 (1 - gamma(n, 2^-24)) >= 1 + 2 v, so R (1 - v) >=
|W| t32 + g |b| + A (1 - v)^2 - 3 n tiny32, and A (1 - v)^2 - 3 n tiny32 >= (n + 2)
(tiny(u) + tiny64). ReLU (exact on the ends, monotone) and flatten (a view) map boxes to
boxes; the next layer's [am - ar, am + ar] holds [lo, hi] (`Interval.midrad`). By
induction the last box holds the exact features and the served pass's. Non-finite values
make a box non-finite, never a small one; the certifier refuses any query whose served
pass could overflow (`Certifier._fits_dtype`).

The float32 product's bound needs IEEE float32 arithmetic: the certifier runs it under
`agt.tensors.strict_kernels` (no TF32 on CUDA, no bf16 in oneDNN's matmuls).

Which bundles: a float32 served dtype (the radius product in float32 then cannot overflow
where the dtype does not); a float64 model keeps `Network.feature_boxes`. Determinism: a
record's floats depend on the query chunk only, the same in the runs on D and D' (the
chunks of `Certifier.certify` are fixed), as the graded nesting needs (agt/interval.py).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from agt.interval import BOUND_DTYPE, Interval, gamma
from agt.models import LayerSpec

_V = 2.0**-53
_U32 = 2.0**-24
_TINY32 = float(torch.finfo(torch.float32).tiny)
_TINY64 = float(torch.finfo(torch.float64).tiny)
_UP32 = 2.0**-22


def supported(layers: tuple[LayerSpec, ...] | list[LayerSpec], dtype: torch.dtype) -> bool:
    """Whether `feature_boxes` covers this prefix: float32 served, linear, conv2d, ReLU and
    flatten layers."""
    return dtype == torch.float32 and all(
        layer.kind in ("linear", "conv2d", "relu", "flatten") for layer in layers)


def _cast_up32(t: torch.Tensor) -> torch.Tensor:
    """float32 upper bounds of non-negative float64 values (module docstring, (iv))."""
    return (t * (1.0 + _UP32) + _TINY32).to(torch.float32)


def _prepared(layer: LayerSpec, w: torch.Tensor, b: torch.Tensor | None, u: float,
              tiny_u: float) -> tuple:
    """One layer's constants and weight copies, once per `feature_boxes` call (module
    docstring): (n, c1, c2, c3, A, W float64 transposed, |W| float32 transposed,
    b float64, |b| c2)."""
    # a convolution's weights in the order of its channels-last patches (kh, kw, C): the
    # same n products per output, summed in another order, which the bound allows
    w_mat = w.permute(0, 2, 3, 1).reshape(w.shape[0], -1) if layer.kind == "conv2d" else w
    n = int(w_mat.shape[1])
    g = gamma(n + 2, u) + gamma(n + 2, _V) + 4 * _V
    c2 = g * (1.0 + 8 * _V)
    b64 = b.to(BOUND_DTYPE) if b is not None else None
    return (n, (1.0 + g) * (1.0 + 8 * _V), c2,
            (1.0 + 2.0 * gamma(n + 4, _U32)) * (1.0 + 8 * _V),
            4.0 * (n + 4) * (tiny_u + _TINY32 + _TINY64),
            w_mat.to(BOUND_DTYPE).T, w_mat.abs().to(torch.float32).T,
            b64, b64.abs() * c2 if b64 is not None else None)


def _affine(layer: LayerSpec, prep: tuple, am: torch.Tensor,
            ar: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) of one linear or convolution layer's output box (module docstring); the
    in-place steps round exactly as the expressions they stand for. A convolution takes
    and returns channels-last boxes (rows, H, W, C) (`feature_boxes`)."""
    n, c1, c2, c3, big_a, w64_t, wabs32_t, b64, babs_c2 = prep
    if layer.kind == "conv2d":
        out_c = w64_t.shape[1]
        rows, h, wd, _ = am.shape
        oh = (h + 2 * layer.padding - layer.kernel) // layer.stride + 1
        ow = (wd + 2 * layer.padding - layer.kernel) // layer.stride + 1

        def flat(x):                                    # (rows, H, W, C) -> (rows L, KKC)
            # the unfold as one gather of pixels (an exact copy, as F.unfold):
            # channels-last, each pixel is C contiguous values, 5-10x faster to copy than
            # the channels-first patches on the OctMNIST prefix's shapes
            if layer.padding:
                x = F.pad(x, (0, 0) + (layer.padding,) * 4)
            idx = _patch_pixels(x.shape[1], x.shape[2], layer.kernel, layer.stride,
                                x.device)
            pixels = x.reshape(rows, x.shape[1] * x.shape[2], x.shape[3])
            return pixels.index_select(1, idx).view(-1, n)

        def back(z):                                    # (rows L, Cout) -> (rows, oh, ow, Cout)
            return z.view(rows, oh, ow, out_c)
    else:
        def flat(x):
            return x

        def back(z):
            return z
    mid = flat(am) @ w64_t
    t = am.abs().mul_(c2)
    if ar is not None:
        t = (ar * c1).add_(t)
    t32 = t.mul_(1.0 + _UP32).add_(_TINY32).to(torch.float32)    # `_cast_up32`
    p = (flat(t32) @ wabs32_t).to(BOUND_DTYPE)
    if b64 is not None:
        mid.add_(b64)
        p.add_(babs_c2)
    r = p.mul_(c3).add_(big_a)
    mid, r = back(mid), back(r)
    return mid - r, mid.add_(r)


@functools.lru_cache(maxsize=64)
def _patch_pixels(h: int, w: int, k: int, stride: int, device: torch.device) -> torch.Tensor:
    """Pixel indices (into an h x w image, row-major) of every k x k patch at the given
    stride, patch by patch (row-major positions) and in each patch row-major: gathering
    them from a channels-last image gives the patch matrix (positions, k k C)."""
    oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    top = (torch.arange(oh) * stride)[:, None] * w + torch.arange(ow)[None, :] * stride
    inner = torch.arange(k)[:, None] * w + torch.arange(k)[None, :]
    return (top.reshape(-1, 1) + inner.reshape(1, -1)).reshape(-1).to(device)


def _channels_first(t: torch.Tensor) -> torch.Tensor:
    """(rows, H, W, C) -> (rows, C, H, W), the layout the model's flatten reads."""
    return t.permute(0, 3, 1, 2)


def feature_boxes(layers: tuple[LayerSpec, ...] | list[LayerSpec], first: int,
                  params: dict[str, torch.Tensor], x: torch.Tensor, dtype: torch.dtype,
                  rows_per_pass: int) -> Interval:
    """Boxes (1, b, ...) of the frozen prefix's outputs for the queries x (module docstring).

    Args:
        layers: the prefix's layers (`supported`).
        first: the global index of its first layer (parameter names "{index}.weight").
        params: the prefix's exact parameters, in the served dtype.
        x: (b, ...) the queries as the served dtype holds them.
        dtype: the served dtype (float32).
        rows_per_pass: queries per pass (a fixed chunking: a record's floats depend on it).

    Returns:
        The float64 Interval (1, b, ...) of the features.

    Raises:
        ValueError: a prefix or dtype `supported` refuses.
    """
    if not supported(layers, dtype):
        raise ValueError("the midpoint-radius prefix box needs a float32 model of linear, "
                         "conv2d, relu and flatten layers; use Network.feature_boxes")
    finfo = torch.finfo(dtype)
    u, tiny_u = finfo.eps / 2.0, float(finfo.tiny)
    step = max(1, int(rows_per_pass))
    preps = [_prepared(layer, params[f"{first + j}.weight"], params.get(f"{first + j}.bias"),
                       u, tiny_u) if layer.kind in ("linear", "conv2d") else None
             for j, layer in enumerate(layers)]
    out = None                          # the boxes of all queries, filled chunk by chunk
    for i in range(0, max(1, x.shape[0]), step):
        # a fresh (aligned) copy, as Network.feature_boxes: the floats of a record must not
        # depend on its offset in the batch tensor
        exact = x[i:i + step].to(BOUND_DTYPE, copy=True)
        box = None                      # (lo, hi) once a layer has rounded
        # 4-d values travel channels-last through convolutions (copies of their patches
        # are then runs of contiguous values); linear, flatten and the end read
        # channels-first; ReLU reads either
        last = False
        for j, layer in enumerate(layers):
            if layer.kind != "relu" and (layer.kind == "conv2d") != last:
                order = (0, 2, 3, 1) if layer.kind == "conv2d" else (0, 3, 1, 2)
                last = layer.kind == "conv2d"
                if box is None:
                    exact = exact.permute(order)
                else:
                    box = (box[0].permute(order), box[1].permute(order))
            if layer.kind in ("linear", "conv2d"):
                am, ar = (exact, None) if box is None else Interval(*box).midrad()
                box = _affine(layer, preps[j], am, ar)
            elif layer.kind == "relu":
                if box is None:
                    exact = exact.clamp_min(0.0)
                else:
                    box = (box[0].clamp_min_(0.0), box[1].clamp_min_(0.0))
            elif box is None:                                           # flatten
                exact = exact.reshape(exact.shape[0], -1)
            elif j < len(layers) - 1:
                box = (box[0].reshape(box[0].shape[0], -1), box[1].reshape(box[1].shape[0], -1))
        lo, hi = (exact, exact) if box is None else box
        if last:
            lo, hi = _channels_first(lo), _channels_first(hi)
        # a final flatten of a box is done by the copy into `out` (one copy, not two)
        flat = layers[-1].kind == "flatten" and box is not None
        if out is None:
            shape = (math.prod(lo.shape[1:]),) if flat else tuple(lo.shape[1:])
            out = Interval(*(lo.new_empty((1, x.shape[0]) + shape) for _ in range(2)))
        out.lo[0, i:i + step].view(lo.shape).copy_(lo)
        out.hi[0, i:i + step].view(hi.shape).copy_(hi)
    return out
