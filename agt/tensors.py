"""Small torch conventions used across the engine: devices, dtypes, the class decision."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator, Mapping

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


#: the backends whose float32 precision torch sets one by one; "ieee" everywhere
_PRECISION_BACKENDS = ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn",
                       "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")
_STRICT_LOCK = threading.Lock()
_strict_depth = 0
_strict_saved: tuple | None = None


def _precision_switches() -> list:
    found = []
    for path in _PRECISION_BACKENDS:
        obj = torch.backends
        for part in filter(None, path.split(".")):
            obj = getattr(obj, part)
        found.append(obj)
    return found


def _save_switches() -> tuple:
    # the per-backend API (torch is pinned at 2.13): the legacy getters raise once a user
    # mixed the two APIs
    cudnn = torch.backends.cudnn
    return ([(s, s.fp32_precision) for s in _precision_switches()],
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(), cudnn.benchmark,
            cudnn.deterministic)


def _restore_switches(saved: tuple) -> None:
    precisions, deterministic, warn_only, benchmark, cudnn_deterministic = saved
    for s, value in precisions:
        s.fp32_precision = value
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.deterministic = cudnn_deterministic


#: the cuBLAS workspace settings under which its kernels are deterministic
DETERMINISTIC_CUBLAS_WORKSPACES = (":4096:8", ":16:8")


def check_cublas_workspace(environ: Mapping[str, str] | None = None) -> None:
    """Refuse to run CUDA kernels without a deterministic cuBLAS workspace setting.

    Args:
        environ: the environment to read (default ``os.environ``).

    Raises:
        ConfigError: ``CUBLAS_WORKSPACE_CONFIG`` is not one of
            `DETERMINISTIC_CUBLAS_WORKSPACES`.
    """
    environ = os.environ if environ is None else environ
    value = environ.get("CUBLAS_WORKSPACE_CONFIG")
    if value not in DETERMINISTIC_CUBLAS_WORKSPACES:
        raise ConfigError(
            f"training or certifying on CUDA needs deterministic cuBLAS kernels: set "
            f"CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment before the program starts "
            f"(found {value!r}; the agt command sets it for you)")


@contextlib.contextmanager
def strict_kernels(device: torch.device) -> Iterator[None]:
    """While the block runs: IEEE float products, and deterministic kernels off the CPU.

    * float32 precision "ieee" on every backend (no TF32 on CUDA, no bf16 in oneDNN's CPU
      matmuls, which a user's "medium" precision turns on where the CPU has them): the
      rounding model of the bounds (agt/interval.py) is IEEE arithmetic in the dtype.
    * On a non-CPU device, ``torch.use_deterministic_algorithms(True)`` and cuDNN's
      deterministic, non-benchmarking algorithms. Two claims compare computations at the same
      grade and so rest on run-to-run determinism (the same operations on the same operands
      and shapes give the same floats): a frozen prefix's features of a kept record on D
      and on D', and the first epoch of `k_placement: per-epoch` (agt/placement.py). CPU
      kernels were checked to have it (docs/design.md, Assumptions); CUDA's atomics-based reductions
      and cuDNN's timed algorithm choice do not without these switches. cuBLAS also needs
      ``CUBLAS_WORKSPACE_CONFIG`` (":4096:8" or ":16:8") set before it starts: the command
      line sets it (`agt.threads.apply_recommended_environment`), and a CUDA block without
      it is refused (`check_cublas_workspace`) rather than run on kernels that may not be
      deterministic.

    The switches are process-wide, so blocks share them: the first to enter saves the
    caller's settings, the last to leave restores them (also on error), and a block that
    starts while another runs (another thread's training) never finds them lax (a review
    found a concurrent training run under the caller's settings when each block restored
    its own)."""
    global _strict_depth, _strict_saved
    if torch.device(device).type == "cuda":
        check_cublas_workspace()
    with _STRICT_LOCK:
        if _strict_depth == 0:
            _strict_saved = _save_switches()
        _strict_depth += 1
        for s in _precision_switches():
            s.fp32_precision = "ieee"
        if torch.device(device).type != "cpu":
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.deterministic = True
    try:
        yield
    finally:
        with _STRICT_LOCK:
            _strict_depth -= 1
            if _strict_depth == 0 and _strict_saved is not None:
                saved, _strict_saved = _strict_saved, None
                _restore_switches(saved)


def predicted_classes(logits: torch.Tensor) -> torch.Tensor:
    """The class a model with these logits (..., C) predicts, int64.

    One logit: 1[z > 0] (z = 0 gives class 0). C >= 2 logits: argmax, the lowest index
    among equal maxima (torch.argmax's rule)."""
    if logits.shape[-1] == 1:
        return (logits[..., 0] > 0).to(torch.int64)
    return logits.argmax(dim=-1)


def grid_pairs(n_rows: int, n_cols: int,
               device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The (row, column) indices of every cell of an (n_rows, n_cols) grid, row-major
    (cell r n_cols + c is row r, column c): a table of every (query, box) pair flattened.

    Args:
        n_rows: the number of rows (queries).
        n_cols: the number of columns (boxes).
        device: where the indices live.

    Returns:
        (rows, cols), each an int64 tensor of n_rows n_cols entries.
    """
    rows = torch.arange(n_rows, device=device).repeat_interleave(n_cols)
    cols = torch.arange(n_cols, device=device).repeat(n_rows)
    return rows, cols
