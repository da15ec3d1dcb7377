"""IEEE products and deterministic kernels while training and certifying (agt.tensors.
strict_kernels). The switches it flips for CUDA are checked on any machine, and so is the
check that every entry point runs under them; with a GPU (benchmarks/gpu_check.py), the
"cuda" cases run on it and tests/agt/test_cuda.py adds the CUDA code path itself."""

from __future__ import annotations

import contextlib
import importlib
import threading

import pytest
import torch

from agt.certify import Certifier
from agt.errors import ConfigError
from agt.store import from_result
from agt.tensors import strict_kernels
from agt.training import train
from tests.helpers import LOGISTIC, blobs, config, environ_seen_by_the_command_line

PRECISIONS = (torch.backends, torch.backends.cuda.matmul, torch.backends.cudnn.conv,
              torch.backends.mkldnn.matmul)


def switches() -> tuple:
    cudnn = torch.backends.cudnn
    return (tuple(b.fp32_precision for b in PRECISIONS),
            torch.are_deterministic_algorithms_enabled(), cudnn.benchmark, cudnn.deterministic)


IEEE = ("ieee",) * len(PRECISIONS)


@contextlib.contextmanager
def lax_switches():
    """TF32 on CUDA, bf16 in oneDNN's CPU matmuls, cuDNN benchmarking: what a user's script
    may have set before calling agt (restored afterwards so other tests see the defaults)."""
    before = switches()
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    torch.backends.cudnn.benchmark = True
    try:
        yield switches()
    finally:
        for b, value in zip(PRECISIONS, before[0]):
            b.fp32_precision = value
        torch.use_deterministic_algorithms(before[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before[2:]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_strict_kernels_switch_and_restore_even_on_error(device):
    with lax_switches() as lax:
        with pytest.raises(RuntimeError, match="inside"):
            with strict_kernels(torch.device(device)):
                inside = switches()
                raise RuntimeError("inside")
        assert switches() == lax
    assert inside[0] == IEEE
    if device == "cuda":
        # deterministic algorithms, cuDNN without timed algorithm choice
        assert inside[1:] == (True, False, True)
    else:
        # CPU kernels are deterministic already; the switch would only cost time
        assert inside[1:] == lax[1:]


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
    spy(importlib.import_module("agt.certify.certifier"))
    ds = blobs(n=200)
    steps = []
    with lax_switches() as lax:
        res = train(config(LOGISTIC, "binary_cross_entropy", n_epochs=2), ds,
                    step_callback=lambda step, theta, boxes: steps.append(switches()[0]))
        cert = Certifier(from_result(res)).certify(ds.x_test[:5])
        assert switches() == lax
    assert steps and all(s == IEEE for s in steps)
    assert seen == [("agt.training", "cpu"), ("agt.certify.certifier", "cpu")]
    assert cert.max_certified_k is not None


def test_concurrent_trainings_both_run_strict_and_the_last_restores():
    """A review's find: each block restored the settings it had found, so a training that
    started while another ran finished under the caller's lax settings once the first
    ended. The first block in saves, the last out restores."""
    ds = blobs(200)
    started, first_done = threading.Event(), threading.Event()
    seen = {"a": [], "b": []}

    def hold(step, theta, boxes):
        seen["a"].append(switches()[0])
        started.wait(timeout=60)             # the other training has begun

    def watch(step, theta, boxes):
        started.set()
        if step == 1:
            first_done.wait(timeout=60)      # the first training has ended meanwhile
        seen["b"].append(switches()[0])

    def run(callback, epochs):
        train(config(LOGISTIC, "binary_cross_entropy", n_epochs=epochs), ds,
              step_callback=callback)

    with lax_switches() as lax:
        a = threading.Thread(target=lambda: (run(hold, 1), first_done.set()))
        b = threading.Thread(target=lambda: run(watch, 4))
        a.start()
        b.start()
        a.join()
        b.join()
        assert switches() == lax
    assert first_done.is_set() and len(seen["b"]) == 4
    assert all(s == IEEE for s in seen["a"] + seen["b"])


def test_strict_kernels_work_after_the_legacy_precision_api():
    """A review's find: reading the legacy getters raised once a user had mixed the legacy
    and per-backend precision APIs (this legacy order alone does it), so training failed to
    start; the per-backend API reads and restores whatever was set."""
    before = switches()
    try:
        torch.set_float32_matmul_precision("medium")
        torch.backends.cuda.matmul.allow_tf32 = True
        lax = switches()
        with strict_kernels(torch.device("cpu")):
            assert switches()[0] == IEEE
        assert switches() == lax
    finally:
        for b, value in zip(PRECISIONS, before[0]):
            b.fp32_precision = value


def test_the_command_line_sets_a_cublas_workspace_unless_the_user_did():
    """Deterministic cuBLAS needs CUBLAS_WORKSPACE_CONFIG before cuBLAS starts; the command
    line sets the documented value before anything loads torch, and a user's wins."""
    assert environ_seen_by_the_command_line("CUBLAS_WORKSPACE_CONFIG") == ":4096:8"
    assert environ_seen_by_the_command_line("CUBLAS_WORKSPACE_CONFIG", ":16:8") == ":16:8"


def test_cuda_work_without_a_deterministic_cublas_workspace_is_refused():
    """A library user who did not set the variable gets a one-line error naming it, not
    kernels that may differ run to run (which a frozen prefix's shared boxes rely on)."""
    from agt.tensors import check_cublas_workspace

    for ok in (":4096:8", ":16:8"):
        check_cublas_workspace({"CUBLAS_WORKSPACE_CONFIG": ok})
    for bad in ({}, {"CUBLAS_WORKSPACE_CONFIG": ""}, {"CUBLAS_WORKSPACE_CONFIG": ":0:0"}):
        with pytest.raises(ConfigError, match="CUBLAS_WORKSPACE_CONFIG=:4096:8"):
            check_cublas_workspace(bad)
