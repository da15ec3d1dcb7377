"""Run the experiments of one dataset in order, with progress, and summarise them."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from agt.errors import ConfigError

from experiments import budget, ensembles, heatmap, kgrid, single, teacher
from experiments.context import Context, Outcome, markdown_table
from experiments.plan import default_plan_path, load_plan

EXPERIMENTS = {m.NAME: m for m in (heatmap, single, ensembles, budget, kgrid, teacher)}


def select(plan_experiments: tuple[str, ...], only: list[str] | None) -> list[str]:
    """The plan's experiments, restricted to `only` (in the plan's order)."""
    if not only:
        return list(plan_experiments)
    unknown = [e for e in only if e not in EXPERIMENTS]
    if unknown:
        raise ConfigError(f"--only: unknown experiment(s) {unknown}; choose from "
                          f"{', '.join(EXPERIMENTS)}")
    missing = [e for e in only if e not in plan_experiments]
    if missing:
        raise ConfigError(f"--only: {missing} not in this dataset's plan (it runs "
                          f"{', '.join(plan_experiments)})")
    return [e for e in plan_experiments if e in only]


def reproduce(dataset: str, *, quick: bool = False, data_dir: str | Path | None = None,
              out: str | Path = "artifacts", only: list[str] | None = None,
              seed: int | None = None, plan_path: str | Path | None = None,
              progress: bool = True, device: str = "cpu", workers: int = 1,
              threads: int | None = None) -> list[Outcome]:
    """Run the plan's experiments for `dataset`; returns one Outcome per experiment and
    writes ``<out>/<dataset>/summary.md``. `workers` / `threads`: how the ensembles' teachers
    are trained (agt.ensemble.train_ensemble; the results do not depend on `workers`)."""
    plan = load_plan(plan_path or default_plan_path(dataset), quick=quick, dataset=dataset)
    names = select(plan.experiments, only)
    ctx = Context(plan, out=out, data_dir=data_dir, seed=seed, progress=progress,
                  device=device, workers=workers, threads=threads)
    t0 = time.perf_counter()
    _ = ctx.prepared  # load (and for OctMNIST pre-train) before any experiment: fail early
    outcomes = []
    bar = tqdm(names, desc=f"agt reproduce {dataset}{' --quick' if quick else ''}",
               unit="experiment", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        outcome = EXPERIMENTS[name].run(ctx)
        outcomes.append(outcome)
        if progress:
            bar.write(f"[{name}] {outcome.seconds:.1f} s: {outcome.headline}", file=sys.stderr)
    bar.close()
    total = time.perf_counter() - t0
    summary = summary_table(dataset, outcomes, total, quick)
    path = ctx.out_dir / "summary.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(summary + "\n")
    outcomes.append(Outcome("total", f"wrote {ctx.out_dir}", total, [str(path)]))
    return outcomes


def summary_table(dataset: str, outcomes: list[Outcome], total: float, quick: bool) -> str:
    rows = [[o.name, o.headline, f"{o.seconds:.1f}"] for o in outcomes]
    rows.append(["total", "", f"{total:.1f}"])
    return (f"# agt reproduce {dataset}{' --quick' if quick else ''}\n\n"
            + markdown_table(["experiment", "result", "seconds"], rows))
