"""Small torch conventions used across the engine: devices, dtypes, the class decision."""

from __future__ import annotations

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


def predicted_classes(logits: torch.Tensor) -> torch.Tensor:
    """The class a model with these logits (..., C) predicts, int64.

    One logit: 1[z > 0] (z = 0 gives class 0). C >= 2 logits: argmax, the lowest index
    among equal maxima (torch.argmax's rule)."""
    if logits.shape[-1] == 1:
        return (logits[..., 0] > 0).to(torch.int64)
    return logits.argmax(dim=-1)
