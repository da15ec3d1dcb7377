"""Experiment plans: what `agt reproduce DATASET` runs, loaded from
``configs/experiments/<dataset>.yaml`` into frozen, validated dataclasses.

A plan names the AGT training config (``train_config``, a path relative to the plan file) and
holds only *experiment* settings (epsilon grids, ensemble sizes, query budgets, ...). The
``quick:`` section of the file overrides individual settings for ``--quick``; the merge
happens once, at load time, and the merged plan is what every experiment reads and what each
``results.json`` records. Experiment code never mutates a plan or a training config: it
derives new configs with ``TrainConfig.replace`` and records the overrides it used.

File layout::

    dataset: blobs                        # blobs | octmnist | imdb
    train_config: ../blobs.yaml           # AGT config of the private model (relative path)
    train_overrides: {}                   # keys of the training config to change (recorded)
    experiments: [heatmap, single, ...]   # what `agt reproduce` runs, in order
    pipeline: {...}                       # data preparation (PipelineSettings)
    settings: {single: {...}, ...}        # one mapping per experiment (see the classes below)
    quick: {pipeline: {...}, train_overrides: {...}, settings: {single: {...}, ...}}

Unknown keys and impossible values raise `ConfigError` naming the key. Reading the file,
the ``quick:`` overlay and building each settings section are the loader every study
shares (experiments/settings.py); this module says which keys a plan has.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from agt.errors import ConfigError, Problems
from experiments.settings import PLAN_DIR, apply_quick, build_settings, read_plan

DATASETS = ("blobs", "octmnist", "imdb")
EXPERIMENT_NAMES = ("heatmap", "single", "ensembles", "budget", "kgrid", "teacher")
REPO_ROOT = Path(__file__).resolve().parent.parent


def default_plan_path(dataset: str) -> Path:
    """The shipped plan of `dataset` (configs/experiments/<dataset>.yaml).

    Args:
        dataset: one of `DATASETS`.

    Returns:
        The plan file's path (not checked to exist).
    """
    return PLAN_DIR / f"{dataset}.yaml"


def display_path(path: str | Path) -> str:
    """A path as results files record it.

    Args:
        path: any path.

    Returns:
        The resolved path relative to the repository when inside it (so that committed
        artifacts do not carry a machine's absolute paths), else the resolved path.
    """
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def _positive(problems: Problems, where: str, **values: float) -> None:
    for name, v in values.items():
        problems.check(v > 0, f"{where}.{name} must be > 0, got {v!r}")


def _delta(problems: Problems, where: str, **values: float) -> None:
    for name, v in values.items():
        problems.check(0 < v < 1, f"{where}.{name} must be in (0, 1), got {v!r}")


def _int_list(problems: Problems, where: str, name: str, values: tuple, low: int) -> None:
    if not values:
        problems.add(f"{where}.{name} must not be empty")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            problems.add(f"{where}.{name} must list integers >= {low}, got {v!r}")
            return


def _names(problems: Problems, where: str, names: tuple, inputs: str) -> None:
    """Registry names of mechanisms releasing `inputs` ("Certified" or "Votes")."""
    from mechanisms import MECHANISMS
    for n in names:
        entry = MECHANISMS.get(n)
        if entry is None or entry.inputs.__name__ != inputs:
            problems.add(f"{where}.mechanisms: {n!r} is not a mechanism for "
                         f"{'one model' if inputs == 'Certified' else 'ensembles'}")


def epsilon_grid(spec: Any, where: str) -> tuple[float, ...]:
    """An epsilon grid as a plan writes it.

    Args:
        spec: a non-empty list of epsilons > 0, or ``{logspace: [low, high, count]}``
            (`count` values from `low` to `high` inclusive, log-spaced).
        where: the setting's name in messages.

    Returns:
        The epsilons as floats.

    Raises:
        ConfigError: `spec` is neither form or holds an epsilon <= 0.
    """
    if isinstance(spec, Mapping):
        if set(spec) != {"logspace"} or not isinstance(spec["logspace"], (list, tuple)) \
                or len(spec["logspace"]) != 3:
            raise ConfigError(f"{where} must be a list of numbers or {{logspace: [low, high, "
                              f"count]}}, got {spec!r}")
        low, high, count = spec["logspace"]
        low, high = float(low), float(high)
        if not (0 < low < high) or isinstance(count, bool) or not isinstance(count, int) \
                or count < 2:
            raise ConfigError(f"{where}: logspace needs 0 < low < high and count >= 2, got "
                              f"{spec['logspace']!r}")
        return tuple(float(v) for v in np.logspace(math.log10(low), math.log10(high), count))
    if isinstance(spec, (list, tuple)) and spec:
        out = []
        for v in spec:
            v = float(v) if isinstance(v, str) else v
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or v <= 0:
                raise ConfigError(f"{where} must list finite epsilons > 0, got {v!r}")
            out.append(float(v))
        return tuple(out)
    raise ConfigError(f"{where} must be a non-empty list of numbers or {{logspace: [low, high, "
                      f"count]}}, got {spec!r}")


def _set_grid(settings, problems: Problems, spec: Any, where: str) -> None:
    try:
        object.__setattr__(settings, "epsilons", epsilon_grid(spec, where))
    except ConfigError as exc:
        problems.add(str(exc))


# ------------------------------------------------------------------------------------------
# Settings per experiment

@dataclass(frozen=True)
class PipelineSettings:
    """Data preparation. max_train: keep at most this many private training records
    (stratified by label, file order kept, seeded) -- for quick runs; null keeps all.
    max_test: at most this many test records (the first ones). OctMNIST pre-training:
    pretrain_epochs / pretrain_batch_size / pretrain_learning_rate (Adam) on the public
    classes, at most max_public public records (null: all)."""

    max_train: int | None = None
    max_test: int | None = None
    pretrain_epochs: int = 20
    pretrain_batch_size: int = 100
    pretrain_learning_rate: float = 1e-3
    max_public: int | None = None

    def validate(self, where: str, problems: Problems) -> None:
        for name in ("max_train", "max_test", "max_public"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 2):
                problems.add(f"{where}.{name} must be an integer >= 2 or null, got {v!r}")
        if self.pretrain_epochs < 1 or self.pretrain_batch_size < 1:
            problems.add(f"{where}: pretrain_epochs and pretrain_batch_size must be >= 1")
        _positive(problems, where, pretrain_learning_rate=self.pretrain_learning_rate)


@dataclass(frozen=True)
class HeatmapSettings:
    """Fig. 3: smooth-sensitivity bound exp(-beta r) over a grid of the input plane.
    train_config: the 6-128-2 model's config (relative to the plan); train_overrides change
    it (recorded); variants: blobs variants, one panel each; the bound is for `noise`
    calibrated at `epsilon` (cauchy: beta = eps/6; laplace: beta = eps / (2 ln(2/delta)))."""

    train_config: str = "../blobs_mlp.yaml"
    train_overrides: dict = field(default_factory=dict)
    variants: tuple = ("separable", "overlapping")
    grid_points: int = 200
    grid_limit: float = 3.8
    epsilon: float = 1.0
    noise: str = "cauchy"
    delta: float = 1e-5
    max_scatter: int = 400

    def validate(self, where: str, problems: Problems) -> None:
        if self.grid_points < 2:
            problems.add(f"{where}.grid_points must be >= 2, got {self.grid_points}")
        _positive(problems, where, grid_limit=self.grid_limit, epsilon=self.epsilon)
        _delta(problems, where, delta=self.delta)
        if self.noise not in ("cauchy", "laplace"):
            problems.add(f"{where}.noise must be cauchy or laplace, got {self.noise!r}")
        for v in self.variants:
            if v not in ("separable", "overlapping"):
                problems.add(f"{where}.variants must list separable/overlapping, got {v!r}")
        if not self.variants:
            problems.add(f"{where}.variants must not be empty")


@dataclass(frozen=True)
class SingleSettings:
    """Fig. 2: accuracy vs per-query epsilon for one model. epsilons: list or
    {logspace: [low, high, count]}; repeats: sampled releases per epsilon (seeded);
    delta: per-query delta of SS-Laplace; tolerance: 'keeps noise-free accuracy' means
    expected accuracy >= noise-free accuracy - tolerance."""

    epsilons: Any = None
    repeats: int = 10
    delta: float = 1e-5
    tolerance: float = 0.01
    mechanisms: tuple = ("gs", "ss-laplace", "ss-cauchy", "exp-radius", "ptr")
    report_epsilons: tuple = (0.1, 1.0)

    def validate(self, where: str, problems: Problems) -> None:
        spec = {"logspace": [0.01, 10.0, 20]} if self.epsilons is None else self.epsilons
        _set_grid(self, problems, spec, f"{where}.epsilons")
        _names(problems, where, self.mechanisms, "Certified")
        for e in self.report_epsilons:
            problems.check(isinstance(e, (int, float)) and math.isfinite(e) and e > 0,
                           f"{where}.report_epsilons must list epsilons > 0, got {e!r}")
        if self.repeats < 1:
            problems.add(f"{where}.repeats must be >= 1, got {self.repeats}")
        _delta(problems, where, delta=self.delta)
        _positive(problems, where, tolerance=self.tolerance)


@dataclass(frozen=True)
class EnsembleSettings:
    """Fig. 4: accuracy vs ensemble size T at fixed per-query epsilons. Every teacher is
    trained on the training config's k grid, cut to k < floor(n / T) (its batch), a cut
    that depends on n and T only. radius_rule: tight (min-cost, the default) or thm5.3
    (the paper's, m - 1 smaller)."""

    teachers: tuple = (1, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85,
                       90, 95)
    epsilons: tuple = (1.0, 0.1)
    delta: float = 1e-5
    repeats: int = 10
    radius_rule: str = "tight"
    mechanisms: tuple = ("lnmax", "ens-ss-laplace", "ens-ss-cauchy", "ens-ptr", "ens-ptr-gs",
                         "ens-exp-radius")

    def validate(self, where: str, problems: Problems) -> None:
        _int_list(problems, where, "teachers", self.teachers, 1)
        _set_grid(self, problems, list(self.epsilons), f"{where}.epsilons")
        _names(problems, where, self.mechanisms, "Votes")
        _delta(problems, where, delta=self.delta)
        if self.repeats < 1:
            problems.add(f"{where}.repeats must be >= 1")
        if self.radius_rule not in ("thm5.3", "tight"):
            problems.add(f"{where}.radius_rule must be thm5.3 or tight")


def _default_dpsgd() -> dict:
    """DP-SGD settings of the budget and teacher experiments (the target is the total budget)."""
    return {"epochs": 10, "batch_size": 500, "learning_rate": 1.0, "max_grad_norm": 1.0,
            "accountant": "prv"}


@dataclass(frozen=True)
class BudgetSettings:
    """Fig. 5: accuracy vs number of queries Q under a total (epsilon_total, delta_total);
    per-query epsilon by the paper's composition ('best' of standard/advanced) and by the
    tight PLD accountant. SS-Laplace spends delta_total / (2 Q) per query. dpsgd: the
    DPSGDConfig fields other than the target (trained to the same total); dpsgd_seeds runs."""

    epsilon_total: float = 10.0
    delta_total: float = 1e-5
    queries: tuple = (2, 5, 10, 16, 27, 46, 77, 129, 215, 359, 599, 1000)
    teachers: int = 25
    repeats: int = 10
    accountants: tuple = ("best", "tight")
    dpsgd: dict = field(default_factory=_default_dpsgd)
    dpsgd_seeds: int = 3
    gate_cutoff: int = 5
    gate_fallback: str = "exp-radius"

    def validate(self, where: str, problems: Problems) -> None:
        _positive(problems, where, epsilon_total=self.epsilon_total)
        _delta(problems, where, delta_total=self.delta_total)
        _int_list(problems, where, "queries", self.queries, 1)
        if self.teachers < 1 or self.repeats < 1 or self.dpsgd_seeds < 1:
            problems.add(f"{where}: teachers, repeats and dpsgd_seeds must be >= 1")
        for a in self.accountants:
            if a not in ("standard", "advanced", "best", "tight"):
                problems.add(f"{where}.accountants: unknown accountant {a!r}")
        if self.gate_cutoff < 1 or self.gate_fallback not in ("exp-radius", "refuse"):
            problems.add(f"{where}: gate_cutoff must be >= 1 and gate_fallback exp-radius or "
                         f"refuse")
        bad = sorted(set(self.dpsgd) & {"target_epsilon", "target_delta", "seed"})
        if bad:
            problems.add(f"{where}.dpsgd must not set {bad}: the target is the total "
                              f"budget and seeds come from the run")


@dataclass(frozen=True)
class KGridSettings:
    """Fig. 6: tightness of the smooth bound vs the number of k values. Sub-grids of the
    trained grid with `sizes` values; the bound is for `noise` calibrated at each of
    `epsilons` (the first one is plotted)."""

    sizes: tuple = (1, 2, 3, 5, 10, 20, 50, 100, 200)
    epsilons: tuple = (1.0, 0.1)
    noise: str = "cauchy"
    delta: float = 1e-5

    def validate(self, where: str, problems: Problems) -> None:
        _int_list(problems, where, "sizes", self.sizes, 1)
        _set_grid(self, problems, list(self.epsilons), f"{where}.epsilons")
        if self.noise not in ("cauchy", "laplace"):
            problems.add(f"{where}.noise must be cauchy or laplace")
        _delta(problems, where, delta=self.delta)


@dataclass(frozen=True)
class TeacherSettings:
    """Teacher table: label n_public held-out queries within (epsilon_total, delta_total)
    and train a student on the labels. Public queries: the first max(n_public) records of
    the test split; the student is evaluated on the remaining test records. main: the
    n_public of the headline column. student_overrides: training-config keys of the student
    (a plain nominal model). accountant: composition for the per-query epsilon."""

    epsilon_total: float = 10.0
    delta_total: float = 1e-5
    n_public: tuple = (25, 100, 400)
    main: int = 100
    teachers: int = 25
    repeats: int = 5
    accountant: str = "best"
    student_overrides: dict = field(default_factory=dict)
    dpsgd: dict = field(default_factory=_default_dpsgd)
    dpsgd_seeds: int = 3
    gate_cutoff: int = 5

    def validate(self, where: str, problems: Problems) -> None:
        _positive(problems, where, epsilon_total=self.epsilon_total)
        _delta(problems, where, delta_total=self.delta_total)
        _int_list(problems, where, "n_public", self.n_public, 1)
        if self.main not in self.n_public:
            problems.add(f"{where}.main ({self.main}) must be one of n_public "
                              f"{list(self.n_public)}")
        if self.teachers < 1 or self.repeats < 1 or self.dpsgd_seeds < 1:
            problems.add(f"{where}: teachers, repeats and dpsgd_seeds must be >= 1")
        if self.accountant not in ("standard", "advanced", "best", "tight"):
            problems.add(f"{where}.accountant: unknown accountant {self.accountant!r}")


SETTINGS_CLASSES = {
    "heatmap": HeatmapSettings, "single": SingleSettings, "ensembles": EnsembleSettings,
    "budget": BudgetSettings, "kgrid": KGridSettings, "teacher": TeacherSettings,
}


# ------------------------------------------------------------------------------------------
# The plan

@dataclass(frozen=True)
class Plan:
    """A loaded plan: the ``quick:`` section already applied (`quick` says whether), paths
    resolved, each experiment's settings built. `raw` is the merged mapping it was built
    from (kept for debugging; not compared, not written)."""

    dataset: str
    path: Path
    quick: bool
    train_config: Path
    train_overrides: dict
    experiments: tuple[str, ...]
    pipeline: PipelineSettings
    settings: dict[str, Any]
    seeds: tuple[int, ...] = (0,)
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    def resolve(self, relative: str) -> Path:
        """A path of the plan (e.g. a config), relative to the plan file."""
        p = Path(relative).expanduser()
        return p if p.is_absolute() else (self.path.parent / p).resolve()

    def to_json_dict(self) -> dict[str, Any]:
        """The plan as results.json records it: plain JSON values, repository-relative
        paths."""
        def plain(obj):
            if dataclasses.is_dataclass(obj):
                return {k: plain(v) for k, v in dataclasses.asdict(obj).items()}
            if isinstance(obj, dict):
                return {k: plain(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return [plain(v) for v in obj]
            if isinstance(obj, Path):
                return display_path(obj)
            return obj
        return {"dataset": self.dataset, "plan_file": display_path(self.path),
                "quick": self.quick, "train_config": display_path(self.train_config),
                "train_overrides": plain(self.train_overrides),
                "experiments": list(self.experiments), "seeds": list(self.seeds),
                "pipeline": plain(self.pipeline),
                "settings": {k: plain(v) for k, v in self.settings.items()}}


_TOP_KEYS = {"dataset", "train_config", "train_overrides", "experiments", "pipeline",
             "settings", "quick", "seeds"}
#: what ``quick:`` may override, each with the depth `experiments.settings.overlay` merges
#: it to: pipeline and training overrides key by key (a mapping value one level further),
#: settings per experiment and then key by key; experiments and seeds replaced whole
_QUICK_SECTIONS = {"pipeline": 2, "train_overrides": 2, "settings": 3, "experiments": 0,
                   "seeds": 0}


def load_plan(path: str | Path, quick: bool = False, dataset: str | None = None) -> Plan:
    """Load and validate a plan file.

    Args:
        path: the plan file (``~`` expanded; relative paths inside it resolve against its
            folder).
        quick: apply the file's ``quick:`` overrides (`agt reproduce --quick`).
        dataset: when given, refuse a plan for another dataset.

    Returns:
        The validated `Plan`.

    Raises:
        ConfigError: naming the file and the offending key.
    """
    path = Path(path).expanduser().resolve()
    raw = read_plan(path, "experiment plan")
    unknown = sorted(set(raw) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in {path}; allowed: "
                          f"{', '.join(sorted(_TOP_KEYS))}")
    name = raw.get("dataset")
    if name not in DATASETS:
        raise ConfigError(f"{path}: dataset must be one of {', '.join(DATASETS)}, got {name!r}")
    if dataset is not None and name != dataset:
        raise ConfigError(f"{path} is a plan for dataset '{name}', not '{dataset}'")
    if "train_config" not in raw:
        raise ConfigError(f"{path}: missing train_config (the AGT config of the private model)")
    merged = apply_quick(raw, quick, str(path), _QUICK_SECTIONS)
    experiments = tuple(merged.get("experiments") or ())
    for e in experiments:
        if e not in EXPERIMENT_NAMES:
            raise ConfigError(f"{path}: unknown experiment {e!r}; known: "
                              f"{', '.join(EXPERIMENT_NAMES)}")
    if "heatmap" in experiments and name != "blobs":
        raise ConfigError(f"{path}: the heatmap experiment needs the 2-D blobs input plane")
    settings_raw = merged.get("settings") or {}
    if not isinstance(settings_raw, Mapping):
        raise ConfigError(f"{path}: settings must be a mapping (one entry per experiment)")
    unknown = sorted(set(settings_raw) - set(EXPERIMENT_NAMES))
    if unknown:
        raise ConfigError(f"{path}: settings for unknown experiment(s) {unknown}")
    settings = {e: build_settings(SETTINGS_CLASSES[e], settings_raw.get(e), f"settings.{e}")
                for e in EXPERIMENT_NAMES if e in experiments}
    overrides = merged.get("train_overrides") or {}
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{path}: train_overrides must be a mapping of training-config keys")
    seeds = merged.get("seeds")
    if seeds is not None:
        problems = Problems(kind=ConfigError)
        if not isinstance(seeds, list) or not seeds or len(set(map(str, seeds))) != len(seeds):
            problems.add(f"{path}: seeds must be a non-empty list of distinct integers")
        else:
            _int_list(problems, str(path), "seeds", tuple(seeds), 0)
        problems.raise_if_any()
    plan = Plan(dataset=name, path=path, quick=quick, train_config=Path("."),
                train_overrides=dict(overrides), experiments=experiments,
                pipeline=build_settings(PipelineSettings, merged.get("pipeline"), "pipeline"),
                settings=settings, seeds=tuple(int(v) for v in seeds) if seeds else (),
                raw=merged)
    return dataclasses.replace(plan, train_config=plan.resolve(str(raw["train_config"])))
