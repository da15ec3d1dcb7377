"""Train an ensemble's teachers (one AGT pass each) through agt/parallel.py: serially, in
local processes or on Ray, with byte-identical bundles whichever way they ran."""

from __future__ import annotations

import datetime as _dt

from agt.config import TrainConfig
from agt.data import Dataset, validate_dataset
from agt.ensemble.partition import (
    ENSEMBLE_RELATIONS,
    PARTITION_RULE,
    SEED_RULE,
    check_ensemble_plan,
    part_sizes,
    teacher_dataset,
    teacher_parent,
    teacher_seed,
)
from agt.ensemble.store import FORMAT, FORMAT_VERSION, Ensemble
from agt.parallel import DEFAULT_RETRIES, plan_execution, run_tasks
from agt.store import Bundle, from_result
from agt.threads import TEACHER_THREADS
from agt.training import train
from agt.version import __version__


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def train_teacher(cfg: TrainConfig, ds: Dataset, t: int, n_teachers: int,
                  dataset_sha256: str | None = None) -> tuple[Bundle, float]:
    """Teacher t of T: AGT on its index-mod-T part with seed ``cfg.seed + t``; returns its
    bundle (replace-one only, naming its ensemble) and its training seconds. The one
    definition every backend runs (`train_ensemble`)."""
    dataset_sha256 = dataset_sha256 or ds.sha256()
    result = train(cfg.replace(seed=teacher_seed(cfg.seed, t)), teacher_dataset(ds, t, n_teachers))
    bundle = from_result(result, parent=teacher_parent(dataset_sha256, n_teachers, t))
    bundle.relations = ENSEMBLE_RELATIONS
    return bundle, result.seconds


def _teacher_task(shared: tuple, t: int) -> tuple[Bundle, float]:
    """Task function of agt.parallel (module level: worker processes import it by name)."""
    cfg, ds, n_teachers, dataset_sha256 = shared
    return train_teacher(cfg, ds, t, n_teachers, dataset_sha256)


def train_ensemble(cfg: TrainConfig, ds: Dataset, n_teachers: int, *,
                   workers: int | None = None, backend: str | None = None,
                   threads: int | None = None, ray_address: str | None = None,
                   retries: int = DEFAULT_RETRIES, progress: bool = False) -> Ensemble:
    """Train T teachers with AGT on the index-mod-T parts of `ds` (one pass each over the
    config's k grid).

    Execution (agt/parallel.py): `backend` "serial" (default), "process" (`workers` local
    processes; the default when workers > 1) or "ray" (the default with a `ray_address`;
    None or "local" starts a private local Ray instance, "auto" or "ray://host:port" joins a
    cluster). Every teacher trains with the same number of intra-op threads: `threads`, else
    OMP_NUM_THREADS, else 1 (agt/threads.py); workers x threads must fit in this machine's
    cores when the workers run here.

    Guarantee: the bundles depend on (cfg, ds, T) and the per-teacher thread count only --
    the same nominal parameters, bounds and order, byte for byte, and the same bundle ids
    and ensemble id, whichever backend and number of workers trained them (tests/agt/
    test_parallel_ensemble.py). The manifest records how it ran (``execution``: backend,
    workers, threads_per_teacher, re-runs). A teacher whose worker fails is re-run (at most
    `retries` times, then WorkerError); a user error in a teacher (AGTError) is raised once,
    unretried; either way nothing is returned, so nothing half-trained can be written.

    Args:
        cfg: the training configuration of every teacher.
        ds: the private training data (split by record index mod T).
        n_teachers: T >= 1.
        workers: parallel workers (processes or Ray tasks).
        backend: "serial", "process" or "ray" (default: from `workers` and `ray_address`).
        threads: intra-op threads per teacher.
        ray_address: "local", "auto" or "ray://host:port" for the Ray backend.
        retries: re-runs of a teacher after a worker failure.
        progress: a progress bar over teachers.

    Returns:
        The `Ensemble` in memory (``path`` None); `write_ensemble` stores it.
    """
    validate_dataset(ds)
    check_ensemble_plan(cfg, ds.n_train, n_teachers)
    execution = plan_execution(n_teachers, workers=workers, backend=backend, threads=threads,
                               ray_address=ray_address, default_threads=TEACHER_THREADS)
    dataset_sha = ds.sha256()
    report = run_tasks(_teacher_task, (cfg, ds, n_teachers, dataset_sha), n_teachers, execution,
                       retries=retries, progress=progress,
                       desc=f"AGT teachers (T={n_teachers})", unit="teacher")
    entries, bundles = [], []
    for t, (bundle, seconds) in enumerate(report.results):
        bundles.append(bundle)
        entries.append({"index": t, "file": f"teacher_{t:03d}.h5",
                        "seed": teacher_seed(cfg.seed, t),
                        "n_train": bundle.n_train, "dataset_sha256": bundle.dataset_sha256,
                        "bundle_id": bundle.bundle_id, "relations": list(bundle.relations),
                        "seconds": round(seconds, 6)})
    relations = list(ENSEMBLE_RELATIONS)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "n_teachers": n_teachers,
        "partition": {"rule": PARTITION_RULE, "n_train": ds.n_train,
                      "sizes": part_sizes(ds.n_train, n_teachers)},
        "seed_rule": SEED_RULE, "teachers": entries, "k_values": list(cfg.k_values),
        "relations": relations, "config": cfg.to_json_dict(),
        "dataset_sha256": dataset_sha, "n_classes": int(ds.n_classes), "dataset": ds.name,
        "created": _now(), "agt_version": __version__,
        "execution": {"backend": execution.backend, "workers": execution.workers,
                      "threads_per_teacher": execution.threads,
                      "reruns": [{"teacher": r.index, "attempt": r.attempt, "reason": r.reason}
                                 for r in report.reruns]},
    }
    return Ensemble(None, manifest, bundles)
