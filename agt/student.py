"""Students: plain (non-AGT) models trained on privately released labels.

A student is post-processing of the released labels: training it on public queries and
their released labels costs no privacy beyond the release itself (the teacher-labels
command and the teacher experiment).
"""

from __future__ import annotations

import numpy as np
import torch

from agt.config import TrainConfig
from agt.data import Dataset
from agt.errors import DataError
from agt.tensors import predicted_classes, torch_dtype
from agt.training import train

__all__ = ["train_student"]


def train_student(cfg: TrainConfig, x: np.ndarray, labels: np.ndarray, x_test=None,
                  y_test=None, n_classes: int = 2) -> tuple[float | None, int]:
    """Train the nominal model of `cfg` (no bounds) on the answered public queries (labels
    >= 0); return its test accuracy (None without a labelled test set) and the number of
    labels used."""
    keep = labels >= 0
    if not keep.any():
        raise DataError("no public query was answered (all labels are -1): nothing to train a "
                        "student on")
    ds = Dataset("student", np.ascontiguousarray(x[keep], dtype=np.float64),
                 np.ascontiguousarray(labels[keep], dtype=np.int64),
                 None if x_test is None else np.ascontiguousarray(x_test, dtype=np.float64),
                 None if y_test is None else np.ascontiguousarray(y_test, dtype=np.int64),
                 n_classes)
    result = train(cfg.replace(k_values=[0]), ds, with_bounds=False)
    if x_test is None or y_test is None:
        return None, int(keep.sum())
    dtype = torch_dtype(cfg.dtype)
    model = result.spec.build(dtype)
    model.load_state_dict({k: v.detach().cpu() for k, v in result.nominal.items()})
    with torch.no_grad():
        z = model(torch.as_tensor(x_test, dtype=dtype))
    return float((predicted_classes(z).numpy() == y_test).mean()), int(keep.sum())
