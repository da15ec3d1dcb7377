"""Students: plain (non-AGT) models trained on privately released labels.

A student is post-processing of the released labels: training it on public queries and
their released labels costs no privacy beyond the release itself (the teacher-labels
command and the teacher experiment).
"""

from __future__ import annotations

import numpy as np
import torch

from agt.bounded.losses import check_logits
from agt.config import TrainConfig
from agt.data import Dataset
from agt.errors import ConfigError, DataError
from agt.tensors import predicted_classes, torch_dtype
from agt.training import train

__all__ = ["check_student", "train_student"]


def check_student(cfg: TrainConfig, feature_shape: tuple[int, ...], n_classes: int) -> None:
    """Refuse a student config that cannot train on queries of `feature_shape` labelled in
    [0, n_classes): the checks training makes first, for a release command to make before
    it spends (a review found a bad student config refused only after the spend)."""
    spec = cfg.model.with_input_shape(tuple(feature_shape))
    check_logits(cfg.loss, spec.n_logits)
    if spec.n_classes < n_classes:
        raise ConfigError(f"the student model has {spec.n_logits} output logit(s) for "
                          f"{spec.n_classes} classes; the teachers' labels take {n_classes}")


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
