"""Run the trade-off study and write its artifacts: results.json, the figures' PNGs and
summary.md."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import time
from pathlib import Path

import numpy as np

from agt.data.dataset import Dataset
from agt.io import atomic_write
from agt.version import __version__
from experiments.accuracy import RELATION
from experiments.context import dumps, to_jsonable
from experiments.plan import display_path
from experiments.tradeoffs.methods import methods
from experiments.tradeoffs.report import plot_task, summary_markdown
from experiments.tradeoffs.settings import TradeoffSettings
from experiments.tradeoffs.study import Study
from experiments.tradeoffs.sweeps import regimes, run_figures

NAME = "tradeoffs"


def run_study(settings: TradeoffSettings, out_dir: str | Path, *, quick: bool = False,
              dataset_by_task: dict[str, Dataset] | None = None,
              progress: bool = False, threads: int | None = None) -> dict:
    """Run every task's figures and regimes; write results.json, PNGs and summary.md.

    Args:
        settings: the loaded plan (`load_settings`).
        out_dir: the output folder (created).
        quick: whether `settings` is the quick plan (recorded).
        dataset_by_task: datasets to use instead of loading ``settings.data`` (tests).
        progress: passed to the `Study`.
        threads: torch and BLAS threads during the run (default 1; restored afterwards).

    Returns:
        The results as results.json holds them, plus ``files`` (every file written,
        summary.md and results.json last) and ``timing`` (seconds).
    """
    import torch

    # Small problems (64 features, <= 1438 records): one thread each for torch and BLAS is
    # faster than two on a shared 2-core machine (threads spin against other jobs);
    # restored afterwards.
    before = torch.get_num_threads()
    torch.set_num_threads(threads or 1)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:            # optional: only a speed matter
        limits = None
    else:
        limits = threadpool_limits(threads or 1)
    try:
        return _run_study(settings, out_dir, quick=quick, dataset_by_task=dataset_by_task,
                          progress=progress)
    finally:
        torch.set_num_threads(before)
        if limits is not None:
            limits.restore_original_limits()


def _run_study(settings: TradeoffSettings, out_dir: str | Path, *, quick: bool,
               dataset_by_task: dict[str, Dataset] | None, progress: bool) -> dict:
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    study = Study(settings, quick=quick, dataset_by_task=dataset_by_task, progress=progress)
    tasks = {}
    files: list[Path] = []
    for task in settings.tasks:
        ds = study.dataset(task)
        base = study.setup(task)
        figures = run_figures(study, task)
        radius_median = float(np.median(np.concatenate([np.maximum(m.radius, 0)
                                                        for m in base.agt_single])))
        tasks[task] = {"n_classes": ds.n_classes, "n_train": ds.n_train, "n_test": ds.n_test,
                       "methods": list(methods(task)), "nonprivate": base.nonprivate,
                       "agt_radius_median": radius_median,
                       "tuning": study.tuning(task),
                       "figures": figures, "regimes": regimes(study, task)}
        files += plot_task(task, figures, out_dir, settings)
    total = time.perf_counter() - t0
    results = {
        "experiment": NAME, "quick": quick, "agt_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "owner_only": "research output on the owner's data (aggregate accuracies of models "
                      "trained on it): not a private release; every simulated release went "
                      "through an in-memory ledger; no radius, vote or logit is included",
        "relation": RELATION, "settings": dataclasses.asdict(settings),
        "seeds": {"noise_seed": settings.noise_seed,
                  "agt_training_seeds": list(settings.agt_seeds),
                  "dpsgd_seeds": list(settings.dpsgd_seeds),
                  "tuning_seeds": list(settings.tuning_seeds),
                  "data_split_seed": settings.data.get("seed", 0),
                  "rule": "noise generators: SeedSequence(noise_seed, crc32 of the point's "
                          "description, method); every listed seed is reported, none "
                          "chosen by accuracy; AGT and DP-SGD settings chosen on a public "
                          "surrogate (tasks.<task>.tuning), never on the digits"},
        "preprocessing": "z = UnitBallMap(x) from the public pixel range [0, 16]; convex "
                         "models add a bias coordinate ([u, 1]/sqrt 2); Fig. 5's PCA basis is "
                         "fit on the unlabelled test inputs (public queries), not on the "
                         "private training set",
        "tasks": tasks,
        "timing": {"total_seconds": total, "training_seconds": study.timer.training,
                   "releasing_seconds": study.timer.releasing,
                   "tuning_seconds": study.timer.tuning},
    }
    results["files"] = [display_path(p) for p in files]
    md = summary_markdown(results)
    atomic_write(out_dir / "summary.md", lambda p: p.write_text(md))
    atomic_write(out_dir / "results.json",
                 lambda p: p.write_text(dumps(to_jsonable(results)) + "\n"))
    results["files"] += [display_path(out_dir / "summary.md"),
                         display_path(out_dir / "results.json")]
    return results
