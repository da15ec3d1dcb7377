"""Small torch conventions used across the engine: devices, dtypes, the class decision."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from agt.errors import ConfigError

DTYPES = {"float32": torch.float32, "float64": torch.float64}
DEVICES = ("auto", "cpu", "cuda")


def overflow_limit(dtype: torch.dtype) -> float:
    """max(dtype) / 16: the magnitude below which every a-priori bound on a nominal
    computation must stay (training's refusals and marked records, the certifier's query
    test, the stability balls). The bounds model rounding, not overflow; the factor 16 is
    headroom for the rounding of the bounds themselves."""
    return float(torch.finfo(dtype).max) / 16.0


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a config name ("float32" or "float64")."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}") from None


def resolve_device(name: str | torch.device) -> torch.device:
    """"auto" -> cuda when available else cpu; "cuda" without a GPU is a ConfigError."""
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in DEVICES and not str(name).startswith("cuda:"):
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    if str(name).startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device: cuda requested but no CUDA device is available; use auto or cpu")
    return torch.device(name)


@contextlib.contextmanager
def strict_kernels(device: torch.device) -> Iterator[None]:
    """While the block runs: IEEE float products, and deterministic kernels off the CPU.

    * TF32 off (matmul and cuDNN) and float32 matmul precision "highest": the rounding
      model of the bounds (agt/interval.py) is IEEE arithmetic in the dtype; TF32's 10-bit
      mantissa products would leave it.
    * On a non-CPU device, ``torch.use_deterministic_algorithms(True)`` and cuDNN's
      deterministic, non-benchmarking algorithms. Two claims compare computations at the same
      grade and so rest on run-to-run determinism (the same operations on the same operands
      and shapes give the same floats): a frozen prefix's features of a kept record on D
      and on D', and the first epoch of `k_placement: per-epoch` (agt/placement.py). CPU
      kernels were checked to have it (README, Soundness); CUDA's atomics-based reductions
      and cuDNN's timed algorithm choice do not without these switches. cuBLAS also needs
      ``CUBLAS_WORKSPACE_CONFIG`` set before it starts; ``import agt`` sets ":4096:8" unless
      the user set it.

    Every switch is restored on exit, also on error."""
    cuda, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (cuda.allow_tf32, cudnn.allow_tf32, torch.get_float32_matmul_precision(),
             torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             cudnn.benchmark, cudnn.deterministic)
    cuda.allow_tf32 = False
    cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if torch.device(device).type != "cpu":
        torch.use_deterministic_algorithms(True)
        cudnn.benchmark = False
        cudnn.deterministic = True
    try:
        yield
    finally:
        cuda.allow_tf32, cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])
        torch.use_deterministic_algorithms(saved[3], warn_only=saved[4])
        cudnn.benchmark, cudnn.deterministic = saved[5], saved[6]


def predicted_classes(logits: torch.Tensor) -> torch.Tensor:
    """The class a model with these logits (..., C) predicts, int64.

    One logit: 1[z > 0] (z = 0 gives class 0). C >= 2 logits: argmax, the lowest index
    among equal maxima (torch.argmax's rule)."""
    if logits.shape[-1] == 1:
        return (logits[..., 0] > 0).to(torch.int64)
    return logits.argmax(dim=-1)
