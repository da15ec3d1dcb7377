"""The index-mod-T partition of an ensemble (AGT Sec. 5.2) and the rules that follow from
it: teacher t trains on records i with i mod T == t with seed ``config seed + t``; replacing
one record changes one teacher's part only, so ensembles certify replace-one only."""

from __future__ import annotations

import numpy as np

from agt.config import TrainConfig
from agt.data import Dataset
from agt.errors import ConfigError
from agt.training import REPLACE

PARTITION_RULE = "index-mod-T"
SEED_RULE = "config seed + teacher index"
ENSEMBLE_RELATIONS = (REPLACE,)


def teacher_of(index: int | np.ndarray, n_teachers: int) -> int | np.ndarray:
    """The teacher that trains on training record `index`: index mod T."""
    return index % n_teachers


def part_sizes(n_train: int, n_teachers: int) -> list[int]:
    """Records per teacher under index-mod-T: ceil((n - t) / T) for teacher t."""
    return [(n_train - t + n_teachers - 1) // n_teachers for t in range(n_teachers)]


def partition_indices(n_train: int, n_teachers: int) -> list[np.ndarray]:
    """Record indices of each teacher's part, ascending (disjoint, covering 0..n-1)."""
    _check_count(n_teachers, n_train)
    return [np.arange(t, n_train, n_teachers, dtype=np.int64) for t in range(n_teachers)]


def teacher_seed(base_seed: int, t: int) -> int:
    return int(base_seed) + int(t)


def teacher_dataset(ds: Dataset, t: int, n_teachers: int) -> Dataset:
    """Teacher t's training data (records i with i mod T == t, in index order); the test
    split is kept for evaluation."""
    idx = partition_indices(ds.n_train, n_teachers)[t]
    meta = {"ensemble_parent": ds.name, "teacher": t, "n_teachers": n_teachers,
            "partition": PARTITION_RULE}
    return Dataset(f"{ds.name}[teacher {t}/{n_teachers}]",
                   np.ascontiguousarray(ds.x_train[idx]), np.ascontiguousarray(ds.y_train[idx]),
                   ds.x_test, ds.y_test, ds.n_classes, meta)


def teacher_parent(dataset_sha256: str, n_teachers: int, teacher: int) -> dict:
    """The record a teacher bundle keeps of its ensemble."""
    return {"dataset_sha256": dataset_sha256, "n_teachers": int(n_teachers),
            "teacher": int(teacher), "partition": PARTITION_RULE}


def _check_count(n_teachers: object, n_train: int) -> None:
    if isinstance(n_teachers, bool) or not isinstance(n_teachers, (int, np.integer)) \
            or n_teachers < 1:
        raise ConfigError(f"the number of teachers T must be an integer >= 1, got {n_teachers!r}")
    if n_teachers > n_train:
        raise ConfigError(f"T = {n_teachers} teachers need at least one record each, but the "
                          f"training split has {n_train} records; use T <= {n_train}")


def check_ensemble_plan(cfg: TrainConfig, n_train: int, n_teachers: int) -> None:
    """Raise ConfigError if some teacher could not run the k grid (k must stay below its
    batch size): checked before any teacher is trained."""
    _check_count(n_teachers, n_train)
    smallest = min(part_sizes(n_train, n_teachers))
    batch = cfg.batch_for(smallest)
    cfg.k_values.require_below(
        batch, "every teacher's batch size",
        f" (T = {n_teachers} parts of {n_train} records have {smallest} records at least, "
        f"batch_size {cfg.batch_size}; or use fewer teachers)")
