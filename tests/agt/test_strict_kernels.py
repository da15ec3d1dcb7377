"""IEEE products and deterministic kernels while training and certifying (agt.tensors.
strict_kernels). CUDA itself cannot run here; the switches it flips can, and so can the
check that every entry point runs under them."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys

import pytest
import torch

from agt.certify import Certifier
from agt.store import from_result
from agt.tensors import strict_kernels
from agt.training import train
from tests.helpers import LOGISTIC, blobs, config


def switches() -> tuple:
    cudnn = torch.backends.cudnn
    return (torch.backends.cuda.matmul.allow_tf32, cudnn.allow_tf32,
            torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled(),
            cudnn.benchmark, cudnn.deterministic)


@contextlib.contextmanager
def lax_switches():
    """TF32 on, matmul precision 'medium', cuDNN benchmarking: what a user's script may
    have set before calling agt (restored afterwards so other tests see the defaults)."""
    before = switches()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("medium")
    torch.backends.cudnn.benchmark = True
    try:
        yield switches()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[:2]
        torch.set_float32_matmul_precision(before[2])
        torch.use_deterministic_algorithms(before[3])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[4:]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_strict_kernels_switch_and_restore_even_on_error(device):
    with lax_switches() as lax:
        with pytest.raises(RuntimeError, match="inside"):
            with strict_kernels(torch.device(device)):
                inside = switches()
                raise RuntimeError("inside")
        assert switches() == lax
    assert inside[:3] == (False, False, "highest")
    if device == "cuda":
        # deterministic algorithms, cuDNN without timed algorithm choice
        assert inside[3:] == (True, False, True)
    else:
        # CPU kernels are deterministic already; the switch would only cost time
        assert inside[3:] == lax[3:]


def test_training_and_certifying_run_under_strict_kernels(monkeypatch):
    """The switches hold for the whole of training (seen from inside every step) and of
    certification, for the device that runs them, and the caller's settings come back."""
    seen = []

    def spy(module):
        real = module.strict_kernels

        @contextlib.contextmanager
        def recording(device):
            with real(device):
                seen.append((module.__name__, torch.device(device).type))
                yield
        monkeypatch.setattr(module, "strict_kernels", recording)

    # (agt.certify the attribute is the function; the module is in sys.modules)
    spy(importlib.import_module("agt.training"))
    spy(importlib.import_module("agt.certify"))
    ds = blobs(n=200)
    steps = []
    with lax_switches() as lax:
        res = train(config(LOGISTIC, "binary_cross_entropy", n_epochs=2), ds,
                    step_callback=lambda step, theta, boxes: steps.append(switches()[:3]))
        cert = Certifier(from_result(res)).certify(ds.x_test[:5])
        assert switches() == lax
    assert steps and all(s == (False, False, "highest") for s in steps)
    assert seen == [("agt.training", "cpu"), ("agt.certify", "cpu")]
    assert cert.max_certified_k is not None


def test_importing_agt_sets_a_cublas_workspace_unless_the_user_did():
    """Deterministic cuBLAS needs CUBLAS_WORKSPACE_CONFIG before cuBLAS starts; agt is
    imported before any CUDA work, so it sets the documented value, and a user's wins."""
    code = "import os, agt; print(os.environ.get('CUBLAS_WORKSPACE_CONFIG'))"
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    for extra, expected in (({}, ":4096:8"), ({"CUBLAS_WORKSPACE_CONFIG": ":16:8"}, ":16:8")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**env, **extra}, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().splitlines()[-1] == expected
