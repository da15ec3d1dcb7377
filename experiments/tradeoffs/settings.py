"""The trade-off study's settings: configs/experiments/tradeoffs.yaml (its comments say what
each key means), loaded by the plan loader of every study (experiments/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from agt.errors import Problems
from experiments.public_tuning import grid
from experiments.settings import PLAN_DIR, apply_quick, build_settings, overlay, read_plan

#: the figures a task may ask for (`figures:`); each names a sweep of experiments.tradeoffs.sweeps
FIGURES = ("eps", "budget", "delta", "n", "dim", "lambda_t")


@dataclass(frozen=True)
class TradeoffSettings:
    """configs/experiments/tradeoffs.yaml (its comments say what each key means); `lam` is
    the file's ``lambda`` (a Python keyword)."""

    data: dict = field(default_factory=lambda: {"name": "digits"})
    tasks: tuple = ("multiclass", "binary")
    figures: dict = field(default_factory=dict)
    epsilons: tuple = (0.1, 1.0, 10.0)
    delta: float = 1e-5
    budget: int = 100
    epsilon: float = 1.0
    budgets: tuple = (1, 100)
    deltas: tuple = (1e-8, 1e-4)
    train_fractions: tuple = (0.25, 1.0)
    dims: tuple = (16, 64)
    lam: float = 1e-3
    lambdas: tuple = (1e-4, 1e-2)
    teachers: int = 32
    teacher_grid: tuple = (8, 32)
    agt_teachers_max: int = 64
    repeats: int = 10
    loss_repeats: int = 2
    check_draws: int = 2
    check_views: int = 4
    noise_seed: int = 0
    agt_seeds: tuple = (0,)
    agt: dict = field(default_factory=dict)
    agt_grid: dict = field(default_factory=dict)
    agt_stability_grid: dict = field(default_factory=dict)
    tol: float = 1e-8
    dpsgd: dict = field(default_factory=dict)
    dpsgd_grid: dict = field(default_factory=dict)
    dpsgd_seeds: tuple = (0,)
    tuning_seeds: tuple = (0,)

    def validate(self, where: str, problems: Problems) -> None:
        """Add every impossible value to `problems` (called by `build_settings`)."""
        def positive(name, values, integer=False):
            for v in values:
                ok = isinstance(v, int) if integer else isinstance(v, (int, float))
                if not ok or isinstance(v, bool) or not v > 0:
                    problems.add(f"{where}.{name}: every value must be a positive "
                                 f"{'integer' if integer else 'number'}, got {v!r}")
        positive("epsilons", self.epsilons)
        positive("budgets", self.budgets, True)
        positive("dims", self.dims, True)
        positive("lambdas", self.lambdas)
        positive("teacher_grid", self.teacher_grid, True)
        for name, values in (("agt_seeds", self.agt_seeds), ("dpsgd_seeds", self.dpsgd_seeds),
                             ("tuning_seeds", self.tuning_seeds)):
            if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                     for v in values) or len(set(values)) != len(values):
                problems.add(f"{where}.{name}: a non-empty list of distinct seeds >= 0, got "
                             f"{values!r}")
        for name, spec in (("agt_grid", self.agt_grid), ("dpsgd_grid", self.dpsgd_grid),
                           ("agt_stability_grid", self.agt_stability_grid)):
            try:
                grid(spec)
            except (ValueError, TypeError) as exc:
                problems.add(f"{where}.{name}: {exc}")
        positive("epsilon/budget/teachers/repeats/loss_repeats",
                 (self.epsilon, self.budget, self.teachers, self.repeats, self.loss_repeats))
        for d in (self.delta, *self.deltas):
            if not (isinstance(d, (int, float)) and 0 < float(d) < 1):
                problems.add(f"{where}: every delta must be in (0, 1), got {d!r}")
        for f in self.train_fractions:
            if not (isinstance(f, (int, float)) and 0 < f <= 1):
                problems.add(f"{where}.train_fractions: values must be in (0, 1], got {f!r}")
        for t in self.tasks:
            if t not in ("multiclass", "binary"):
                problems.add(f"{where}.tasks: unknown task {t!r} (multiclass, binary)")
        for t, figs in self.figures.items():
            bad = [f for f in figs if f not in FIGURES]
            if t not in self.tasks or bad:
                problems.add(f"{where}.figures.{t}: unknown task or figure(s) {bad}; "
                             f"figures: {', '.join(FIGURES)}")
        if not (isinstance(self.lam, (int, float)) and self.lam > 0):
            problems.add(f"{where}.lambda must be > 0, got {self.lam!r}")
        problems.raise_if_any()


def load_settings(path: str | Path | None = None, *, quick: bool = False,
                  overrides: dict | None = None) -> TradeoffSettings:
    """Load and validate the trade-off plan.

    Args:
        path: the plan file (default configs/experiments/tradeoffs.yaml).
        quick: lay the file's ``quick:`` section over it; each key given there replaces the
            plan's value whole (a mapping is not merged key by key).
        overrides: keys laid over the result the same way (tests).

    Returns:
        The validated settings.

    Raises:
        ConfigError: every problem of the file at once, naming the file and the key.
    """
    path = Path(path) if path else PLAN_DIR / "tradeoffs.yaml"
    raw = apply_quick(read_plan(path, "trade-off plan"), quick, str(path))
    raw = overlay(raw, overrides or {}, 1)
    if "lambda" in raw:
        raw["lam"] = raw.pop("lambda")
    return build_settings(TradeoffSettings, raw, str(path.name))
