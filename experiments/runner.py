"""Run the experiments of one dataset in order, with progress, and summarise them."""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import sys
import time
import traceback
from pathlib import Path

from tqdm.auto import tqdm

from agt.errors import ConfigError, WorkerError
from agt.threads import available_cores, requested_threads, set_threads, using_threads
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


#: Experiments that share no model with the others (the memo of Context): with two or more
#: workers they run in a process of their own while the others run here.
DETACHABLE = ("heatmap",)


def auto_workers(names: list[str], threads: int | None = None) -> int:
    """What ``workers="auto"`` means for the experiments `names`: 2 when a detachable
    experiment runs beside others and two processes of the requested threads (--threads,
    else OMP_NUM_THREADS, else 1) fit in the cores, else 1. Two, not more: the second
    process takes the heat map and the ensembles' teachers stay here, one after another
    (tiny Blobs teachers are 10x slower in worker processes, docs/benchmarks.md)."""
    per_process = requested_threads(threads, default=1)[0] or 1
    detachable = any(n in DETACHABLE for n in names) and len(names) > 1
    return 2 if detachable and 2 * per_process <= available_cores() else 1


def reproduce(dataset: str, *, quick: bool = False, data_dir: str | Path | None = None,
              out: str | Path = "artifacts", only: list[str] | None = None,
              seed: int | None = None, plan_path: str | Path | None = None,
              progress: bool = True, device: str = "cpu", workers: int | str = 1,
              threads: int | None = None) -> list[Outcome]:
    """Run the plan's experiments for `dataset`; returns one Outcome per experiment (in the
    plan's order) and writes ``<out>/<dataset>/summary.md``.

    `workers`: local processes. With 1, everything runs here, the ensembles' teachers one
    after another. With N >= 2, a detachable experiment (the heat map: it trains its own
    models) runs in a spawned process of its own beside the others, and the ensembles'
    teachers get the remaining N - 1 workers; "auto" chooses with `auto_workers`.
    `threads`: intra-op threads per process and teacher (default: the cores divided by the
    processes running at once). The results do not depend on `workers` (tests/experiments:
    identical results.json)."""
    plan_file = plan_path or default_plan_path(dataset)
    plan = load_plan(plan_file, quick=quick, dataset=dataset)
    names = select(plan.experiments, only)
    if workers == "auto":
        workers = auto_workers(names, threads)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1 or 'auto', got {workers!r}")
    detached = [n for n in names if n in DETACHABLE] if workers >= 2 and len(names) > 1 else []
    local_workers = max(1, workers - len(detached))
    ctx = Context(plan, out=out, data_dir=data_dir, seed=seed, progress=progress,
                  device=device, workers=local_workers, threads=threads)
    t0 = time.perf_counter()
    _ = ctx.prepared  # load (and for OctMNIST pre-train) before any experiment: fail early
    side = None
    if detached:
        # cores // N each here and there: with N - 1 one-thread teachers beside the heat
        # map, cores // N + N - 1 <= cores for every N <= cores (the CLI checks N x 1)
        per_process = requested_threads(threads)[0] or max(1, available_cores() // workers)
        side = _Detached(detached, dict(path=str(plan_file), quick=quick, dataset=dataset,
                                        out=str(out), data_dir=data_dir, seed=seed,
                                        device=device, threads=threads), per_process)
    done: dict[str, Outcome] = {}
    try:
        local = [n for n in names if n not in detached]
        bar = tqdm(local, desc=f"agt reproduce {dataset}{' --quick' if quick else ''}",
                   unit="experiment", disable=not progress)
        with using_threads(side.threads) if side else contextlib.nullcontext():
            for name in bar:
                bar.set_postfix_str(name)
                done[name] = EXPERIMENTS[name].run(ctx)
                if progress:
                    bar.write(f"[{name}] {done[name].seconds:.1f} s: {done[name].headline}",
                              file=sys.stderr)
        bar.close()
        if side:
            for outcome in side.results():
                done[outcome.name] = outcome
                if progress:
                    print(f"[{outcome.name}] {outcome.seconds:.1f} s (own process): "
                          f"{outcome.headline}", file=sys.stderr)
    finally:
        if side:
            side.stop()
    outcomes = [done[n] for n in names]
    total = time.perf_counter() - t0
    summary = summary_table(dataset, outcomes, total, quick)
    path = ctx.out_dir / "summary.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(summary + "\n")
    outcomes.append(Outcome("total", f"wrote {ctx.out_dir}", total, [str(path)]))
    return outcomes


def _detached_main(conn, names: list[str], args: dict, threads: int) -> None:
    """Child process: run `names` with a Context of its own; send back their Outcomes, or
    the exception (a WorkerError naming it if it cannot be pickled) and its traceback."""
    try:
        set_threads(threads)
        plan = load_plan(args["path"], quick=args["quick"], dataset=args["dataset"])
        ctx = Context(plan, out=args["out"], data_dir=args["data_dir"], seed=args["seed"],
                      progress=False, device=args["device"], workers=1,
                      threads=args["threads"])
        conn.send(("ok", [EXPERIMENTS[n].run(ctx) for n in names]))
    except BaseException as exc:          # noqa: BLE001 - reported to the parent
        tb = traceback.format_exc()
        try:   # send the exception itself only if it survives the round trip
            pickle.loads(pickle.dumps(exc))
        except Exception:                 # noqa: BLE001 - cannot travel: send its text
            exc = WorkerError(f"{type(exc).__name__}: {exc}")
        conn.send(("error", exc, tb))
    finally:
        conn.close()


class _Detached:
    """Experiments running in one spawned process (never fork: torch's threads)."""

    def __init__(self, names: list[str], args: dict, threads: int):
        self.threads = threads
        self.names = list(names)
        self._reported = False
        mp = multiprocessing.get_context("spawn")
        self._conn, child = mp.Pipe(duplex=False)
        self._proc = mp.Process(target=_detached_main, args=(child, names, args, threads),
                                name="agt-reproduce-" + "-".join(names), daemon=True)
        self._proc.start()
        child.close()

    def results(self) -> list[Outcome]:
        try:
            message = self._conn.recv()
            self._reported = True
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            self._proc.join(timeout=30)
            raise WorkerError(f"the process running {self.names} died (exit code "
                              f"{self._proc.exitcode}) before reporting "
                              f"({type(exc).__name__})") from None
        if message[0] == "ok":
            return message[1]
        _, exc, tb = message
        if isinstance(exc, WorkerError):
            exc.detail = tb
        if hasattr(exc, "add_note"):      # Python >= 3.11; WorkerError keeps it in .detail
            exc.add_note(f"raised in the process running {self.names}:\n{tb}")
        raise exc

    def stop(self) -> None:
        """Let a process that has reported exit on its own (a terminated one can leave
        its semaphores behind); terminate one that has not (the parent failed)."""
        self._proc.join(timeout=30 if self._reported else 0)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=10)
        self._conn.close()


def summary_table(dataset: str, outcomes: list[Outcome], total: float, quick: bool) -> str:
    rows = [[o.name, o.headline, f"{o.seconds:.1f}"] for o in outcomes]
    rows.append(["total", "", f"{total:.1f}"])
    return (f"# agt reproduce {dataset}{' --quick' if quick else ''}\n\n"
            + markdown_table(["experiment", "result", "seconds"], rows))
