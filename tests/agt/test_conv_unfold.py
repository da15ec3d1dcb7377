"""The convolution rule's patches: bit for bit F.unfold's, so the served pass (and every
teacher label and service answer computed from it) is unchanged by the faster unfold."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agt.bounded.layers import Conv2dRule
from agt.models import LayerSpec


@pytest.mark.parametrize("shape,kernel,stride,padding", [
    ((5, 1, 28, 28), 4, 2, 0), ((3, 16, 13, 13), 4, 1, 0), ((4, 3, 9, 7), 3, 2, 1),
    ((2, 2, 6, 6), 1, 1, 0), ((1, 4, 5, 5), 5, 1, 2), ((0, 2, 6, 6), 3, 1, 0)])
def test_unfold_equals_f_unfold(shape, kernel, stride, padding):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g, dtype=torch.float32) * 10.0 ** torch.randint(
        -30, 30, shape, generator=g)
    if x.numel():
        x.view(-1)[::7] = -0.0                            # signed zeros survive the copy
    layer = LayerSpec("conv2d", shape[1], 3, kernel, stride, padding)
    ref = F.unfold(x, kernel, padding=padding, stride=stride)
    got = Conv2dRule._unfold(layer, x)
    assert got.shape == ref.shape and got.stride() == ref.stride()
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))    # bit patterns
    # the served pass as it was computed through F.unfold: the same floats
    w = torch.randn(3, shape[1], kernel, kernel, generator=g)
    bias = torch.randn(3, generator=g)
    z, _ = Conv2dRule().forward_nominal(layer, {"weight": w, "bias": bias}, x)
    want = w.reshape(3, -1) @ ref + bias[:, None]
    assert torch.equal(z.reshape(want.shape), want)
