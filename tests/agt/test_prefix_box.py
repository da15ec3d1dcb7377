"""The certifier's midpoint-radius feature boxes behind a frozen prefix
(agt/certify/prefix_box.py) hold the exact features (rational arithmetic) and the served
float32 pass's in several summation orders, on adversarial queries (wide dynamic range,
cancellation, subnormals); a box without the served rounding term is caught; and they are
about as tight as the training pass's interval boxes."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from agt.bounded.network import Network
from agt.certify import prefix_box
from agt.interval import FloatModel
from agt.models import parse_layer

PREFIX = [{"conv2d": {"in": 1, "out": 2, "kernel": 2, "stride": 1, "padding": 1}},
          {"relu": {}}, {"conv2d": {"in": 2, "out": 3, "kernel": 3, "stride": 2}},
          {"relu": {}}, {"flatten": {}}, {"linear": {"in": 12, "out": 4}}]


def _prefix(seed: int):
    layers = tuple(parse_layer(e, i) for i, e in enumerate(PREFIX))
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for i, layer in enumerate(layers):
        if layer.kind == "conv2d":
            shape = (layer.out_features, layer.in_features, layer.kernel, layer.kernel)
        elif layer.kind == "linear":
            shape = (layer.out_features, layer.in_features)
        else:
            continue
        params[f"{i}.weight"] = torch.randn(shape, generator=gen, dtype=torch.float32)
        params[f"{i}.bias"] = torch.randn(shape[0], generator=gen, dtype=torch.float32)
    return layers, params


def _queries(seed: int, n: int = 12) -> torch.Tensor:
    """Adversarial 1 x 4 x 4 queries: wide dynamic range, near-cancelling entries,
    subnormals and exact zeros, plus ordinary ones."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, 1, 4, 4))
    q[0] *= 10.0 ** rng.integers(-30, 30, size=(1, 4, 4))                # dynamic range
    q[1] = 1e20 * np.sign(q[1]) + q[1]                                   # cancellation
    q[2] = rng.choice([0.0, 1e-40, -1e-42, 1.0, -1.0], size=(1, 4, 4))   # float32 subnormals
    q[3] = 1e-38 * q[3]
    q[4, 0, :, ::2] = 3e7
    q[4, 0, :, 1::2] = -3e7 + 1.0
    return torch.as_tensor(q, dtype=torch.float32)


def _exact(layers, params, x: torch.Tensor) -> list[list[Fraction]]:
    """The prefix in rational arithmetic: per query, its features."""
    out = []
    for rec in x.to(torch.float64).numpy():
        act = np.vectorize(Fraction, otypes=[object])(rec)
        for i, layer in enumerate(layers):
            if layer.kind == "relu":
                act = np.vectorize(lambda v: max(v, Fraction(0)), otypes=[object])(act)
            elif layer.kind == "flatten":
                act = act.reshape(-1)
            elif layer.kind == "linear":
                w = np.vectorize(Fraction, otypes=[object])(params[f"{i}.weight"].double().numpy())
                b = np.vectorize(Fraction, otypes=[object])(params[f"{i}.bias"].double().numpy())
                act = w.dot(act) + b
            else:
                w = np.vectorize(Fraction, otypes=[object])(params[f"{i}.weight"].double().numpy())
                b = np.vectorize(Fraction, otypes=[object])(params[f"{i}.bias"].double().numpy())
                k, c_out, st, pad = layer.kernel, w.shape[0], layer.stride, layer.padding
                if pad:
                    act = np.pad(act, ((0, 0), (pad, pad), (pad, pad)),
                                 constant_values=Fraction(0))
                oh, ow = (act.shape[1] - k) // st + 1, (act.shape[2] - k) // st + 1
                z = np.empty((c_out, oh, ow), dtype=object)
                for o in range(c_out):
                    for r in range(oh):
                        for c in range(ow):
                            patch = act[:, r * st:r * st + k, c * st:c * st + k]
                            z[o, r, c] = (w[o] * patch).sum() + b[o]
                act = z
        out.append(list(act.reshape(-1)))
    return out


def _served_orders(layers, params, x: torch.Tensor) -> list[torch.Tensor]:
    """The served float32 pass (the model's own code, at two batch layouts) and float32
    passes that sum every dot product forwards and backwards, one term at a time."""
    net = Network(layers, 0)
    outs = [net.forward_nominal(params, x)[0], torch.cat([net.forward_nominal(params, x[i:i + 1])[0]
                                                          for i in range(x.shape[0])])]
    for reverse in (False, True):
        act = x.numpy().astype(np.float32)
        for i, layer in enumerate(layers):
            if layer.kind == "relu":
                act = np.maximum(act, np.float32(0))
            elif layer.kind == "flatten":
                act = act.reshape(act.shape[0], -1)
            else:
                w = params[f"{i}.weight"].numpy()
                b = params[f"{i}.bias"].numpy()
                if layer.kind == "conv2d":
                    k, st, pad = layer.kernel, layer.stride, layer.padding
                    act = np.pad(act, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
                    oh, ow = (act.shape[2] - k) // st + 1, (act.shape[3] - k) // st + 1
                    cols = np.stack([act[:, :, r * st:r * st + k, c * st:c * st + k]
                                     .reshape(act.shape[0], -1)
                                     for r in range(oh) for c in range(ow)], 1)  # (b, L, CKK)
                    terms = cols[:, :, None, :] * w.reshape(w.shape[0], -1)[None, None]
                else:
                    terms = act[:, None, :] * w[None]                           # (b, out, in)
                if reverse:
                    terms = terms[..., ::-1]
                acc = np.zeros(terms.shape[:-1], dtype=np.float32)
                for t in np.moveaxis(terms, -1, 0):
                    acc = (acc + t).astype(np.float32)
                acc = (acc + (b[None, None] if layer.kind == "conv2d" else b)).astype(np.float32)
                act = (acc.transpose(0, 2, 1).reshape(act.shape[0], w.shape[0], oh, ow)
                       if layer.kind == "conv2d" else acc)
        outs.append(torch.as_tensor(act.reshape(act.shape[0], -1)))
    return outs


def _escapes(box, exact, served) -> int:
    """How many features of the exact and served passes lie outside the box."""
    lo, hi = box.lo[0].numpy(), box.hi[0].numpy()
    bad = 0
    for q, feats in enumerate(exact):
        for f, value in enumerate(feats):
            bad += not (Fraction(float(lo[q, f])) <= value <= Fraction(float(hi[q, f])))
    for s in served:
        s = s.to(torch.float64).numpy()
        bad += int((~((lo <= s) & (s <= hi))).sum())
    return bad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_box_holds_exact_and_served_features_on_adversarial_queries(seed):
    layers, params = _prefix(seed)
    x = _queries(seed)
    box = prefix_box.feature_boxes(layers, 0, params, x, torch.float32, 5)
    assert torch.isfinite(box.lo).all() and torch.isfinite(box.hi).all()
    assert _escapes(box, _exact(layers, params, x), _served_orders(layers, params, x)) == 0


def test_a_box_without_the_served_rounding_is_caught(monkeypatch):
    """The same check fails for a box that leaves out the float32 term (u = 0): the
    served pass's rounding leaves it."""
    layers, params = _prefix(0)
    x = _queries(0)
    real = prefix_box._prepared
    monkeypatch.setattr(prefix_box, "_prepared",
                        lambda layer, w, b, u, tiny_u: real(layer, w, b, 0.0, 0.0))
    box = prefix_box.feature_boxes(layers, 0, params, x, torch.float32, 5)
    assert _escapes(box, _exact(layers, params, x), _served_orders(layers, params, x)) > 0


def test_the_box_is_about_as_tight_as_the_interval_pass_and_refuses_float64():
    layers, params = _prefix(4)
    x = torch.randn((20, 1, 4, 4), generator=torch.Generator().manual_seed(4))
    new = prefix_box.feature_boxes(layers, 0, params, x, torch.float32, 7)
    old = Network(layers, 0).feature_boxes(params, x, FloatModel(torch.float32), 7)
    ratio = (new.hi - new.lo) / (old.hi - old.lo)
    assert float(ratio.max()) <= 1.05
    with pytest.raises(ValueError, match="float32"):
        prefix_box.feature_boxes(layers, 0, params, x.double(), torch.float64, 7)


@pytest.mark.parametrize("stop", [2, 4, 5])
def test_a_prefix_ending_in_a_convolution_gives_channels_first_boxes(stop):
    """Convolutions run channels-last inside `feature_boxes`; a prefix that ends after
    one, with or without a flatten, returns boxes ((1, b, C, H, W) or (1, b, C H W))
    holding the exact and served features in the model's (channels-first) order."""
    layers, params = _prefix(5)
    layers = layers[:stop]
    params = {k: v for k, v in params.items() if int(k.split(".")[0]) < stop}
    x = _queries(5, n=6)
    box = prefix_box.feature_boxes(layers, 0, params, x, torch.float32, 4)
    served = Network(layers, 0).forward_nominal(params, x)[0]
    assert box.shape == (1,) + tuple(served.shape)
    flat = box.map(lambda t: t.reshape(1, t.shape[1], -1))
    outs = [s.reshape(s.shape[0], -1) for s in _served_orders(layers, params, x)]
    assert _escapes(flat, _exact(layers, params, x), outs) == 0
    none = prefix_box.feature_boxes(layers, 0, params, x[:0], torch.float32, 4)
    assert none.shape == (1, 0) + tuple(served.shape[1:])
