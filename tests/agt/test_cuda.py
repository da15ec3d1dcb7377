"""The CUDA code path, run where a GPU is present (marked ``cuda``; skipped, not failed,
without one; `benchmarks/gpu_check.py` runs them on a GPU machine and records the result).

What must hold on a GPU as on the CPU:
* the k >= 1 boxes hold every float evaluation of training on datasets within distance k,
  whatever device and kernels computed it: the nominal parameters trained on CUDA lie inside
  the CPU bundle's k >= 1 boxes and vice versa (the k = 0 box is each device's own served
  point, `agt.training.served_k0_box`);
* a CUDA-trained bundle survives the retraining falsification: neighbours within k,
  retrained on CUDA and on the CPU, stay inside its k-boxes, and no prediction it certifies
  at k changes on them;
* training and certification run under deterministic kernels (`strict_kernels`), and the
  caller's switches come back afterwards.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agt.certify import Certifier
from agt.store import from_result
from agt.tensors import strict_kernels
from agt.training import train, train_nominal
from tests import helpers
from tests.helpers import CONV, MLP, blobs, classes, config, images, inside, logits, with_train

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

#: (name, model, frozen prefix layers, dataset, settings): a full-batch MLP (replace-one and
#: add-remove) and a frozen convolutional prefix trained on minibatches (replace-one)
CASES = [
    ("mlp-full-batch", MLP, 0, lambda: blobs(400, seed=3),
     dict(n_epochs=3, learning_rate=0.5, clip_gamma=0.2, k_values="0..6")),
    ("conv-prefix-minibatch", CONV, 3, lambda: images(300, seed=5),
     dict(n_epochs=2, batch_size=100, learning_rate=0.3, clip_gamma=0.3, k_values="0..6")),
]


def _config(model, frozen, device, dtype, **settings):
    return config(model, frozen_layers=frozen, device=device, dtype=dtype, **settings)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,model,frozen,make,settings", CASES, ids=[c[0] for c in CASES])
def test_each_device_nominal_lies_inside_the_other_devices_boxes(name, model, frozen, make,
                                                                 settings, dtype):
    ds = make()
    runs = {dev: train(_config(model, frozen, dev, dtype, **settings), ds)
            for dev in ("cpu", "cuda")}
    helpers.assert_each_holds_the_others_nominal(runs, f"{name} {dtype}: ")


def _neighbour(ds, j: int, rng: np.random.Generator):
    """Replace j records: half by label flips, the rest by points far outside the data."""
    x, y = ds.x_train.copy(), ds.y_train.copy()
    idx = rng.choice(len(y), size=j, replace=False)
    for n, i in enumerate(idx):
        if n % 2 == 0:
            y[i] = 1 - y[i]
        else:
            x[i] = rng.normal(size=x[i].shape) * 4.0
            y[i] = rng.integers(0, 2)
    return with_train(ds, x, y)


@pytest.mark.parametrize("name,model,frozen,make,settings", CASES, ids=[c[0] for c in CASES])
def test_a_cuda_bundle_survives_retraining_on_neighbours(name, model, frozen, make, settings):
    ds = make()
    cfg = _config(model, frozen, "cuda", "float32", **settings)
    res = train(cfg, ds)
    bundle = from_result(res)
    cert = Certifier(bundle, device="cuda").certify(ds.x_test)
    lower = {k: v.cpu() for k, v in res.lower.items()}
    upper = {k: v.cpu() for k, v in res.upper.items()}
    rng = np.random.default_rng(11)
    checked = 0
    for j in (1, 2, 3, 6):
        for _ in range(2):
            nb = _neighbour(ds, j, rng)
            for device in ("cuda", "cpu"):
                params = train_nominal(cfg.replace(device=device), nb)
                params = {k: v.cpu() for k, v in params.items()}
                ok, why = inside(params, lower, upper, list(res.k_values).index(j))
                assert ok, f"{name}: neighbour at distance {j} retrained on {device}: {why}"
                served = classes(logits(bundle.spec, params, ds.x_test, torch.float32))
                stable = cert.max_certified_k >= j
                changed = int((served[stable] != cert.prediction[stable]).sum())
                assert changed == 0, f"{name}: {changed} predictions certified at {j} changed"
                checked += 1
    assert checked == 16


def test_strict_kernels_are_active_on_cuda_and_restored():
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    seen = []
    try:
        with strict_kernels(torch.device("cuda")):
            seen.append((torch.are_deterministic_algorithms_enabled(),
                         torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
                         torch.backends.cuda.matmul.fp32_precision))
            # a cuBLAS product runs under the deterministic switch (it would raise without
            # the workspace setting the command line and the test session put in place)
            a = torch.randn(64, 64, device="cuda")
            seen.append(bool(torch.isfinite(a @ a).all()))
        assert seen == [(True, True, False, "ieee"), True]
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.benchmark
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.benchmark = False
