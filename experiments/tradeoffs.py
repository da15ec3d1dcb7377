"""The private-prediction trade-off study (van der Maaten & Hannun, section 4) on the digits,
with AGT in the race: ``agt reproduce tradeoffs [--quick]``.

Methods (registry names; every guarantee under replace-one, every budget a *total* (eps,
delta) over an inference budget of B queries):
  private training   model-sens, model-sens-gauss (noisy minimiser), loss-pert,
                     loss-pert-gauss (perturbed objective): one session for all B queries;
                     dp-sgd (Opacus, delta > 0 only; Figs. 1-3 and the regimes);
  private prediction pred-sens, pred-sens-gauss (noisy logits), df-exp (Dwork-Feldman
                     exponential mechanism on T disjoint teachers' votes, 2-beta constant),
                     lnmax (PATE-style noisy argmax, discrete Laplace) per query; df-exp-zcdp as one
                     (eps, delta) session over the B queries (Thm 8 via zCDP);
  AGT                ss-argmax, exp-radius, ptr on one AGT model's radius, ens-exp-radius on
                     an AGT ensemble's radius; binary adds gs, ss-cauchy, ss-laplace.
Per-query mechanisms get the per-query (eps, delta) of `mechanisms.accounting.plan_queries`:
standard composition when delta = 0, the better of standard and advanced composition when
delta > 0 (accountant "best"); every row records its accountant.

Models. Linear multi-class logistic regression on z = UnitBallMap(x) with a bias coordinate
([u, 1] / sqrt 2, so ||z|| <= 1 and K = sqrt 2 hold), lambda fixed a priori, minimised to a
gradient norm <= tol (agt/baselines/convex.py); the teachers are the same fit on T disjoint
partitions assigned by record index. AGT models: the engine's linear model (own bias) on u,
full-batch SGD, one model (and one ensemble per T) per training seed of `agt_seeds`; the AGT
rows are the mean over those seeds, their spread counts seeds and noise draws. Full-batch
bundles certify replace-one, and their radii are smooth (exact selection).

Hyperparameters. lambda, T and the grids are fixed in the plan a priori. The AGT settings
(learning rate, epochs, clipping: `agt_grid`; and learning rate, epochs and the
per-record gradient norm bound `clip_norm` (null: none) of plain gradient descent under
bound method stability: `agt_stability_grid`, see STABILITY_SETTINGS) and
DP-SGD's learning rate (`dpsgd_grid`) are chosen per task on a public synthetic surrogate of
the digits' shape, never on the digits (experiments/public_tuning.py); results.json lists
every candidate's surrogate score.

Data-dependent preprocessing. The unit-ball map uses only the public pixel range. Fig. 5's
PCA basis is fit on the *test inputs* (the queries, which the querier sends; their labels
are not used), never on the private training set, so no guarantee has to cover it. Fig. 4
uses the first n records of the training split (a data-independent rule).

Accuracy. Monte Carlo mechanisms (model-sens*, pred-sens*): the mean ± std over
`repeats` simulated deployments, each releasing every test query through a fresh in-memory ledger
(experiments/accuracy.py); loss perturbation: `loss_repeats` deployments (one optimisation
each). Mechanisms with an exact law (vote and radius mechanisms): the exact expectation
mean_i p_i and the exact std over noise draws sqrt(sum_i p_i (1 - p_i)) / Q (independent
noise per query), with `check_draws` ledgered deployments (on at most `check_views` B-query
sessions for df-exp-zcdp) as a check ("sampled_mean"). DP-SGD (Opacus, on the AGT model spec):
test accuracy mean ± std over `dpsgd_seeds`. Noise generators are seeded from `noise_seed` and the
point's description (listed in results.json); no seed is chosen by accuracy.

Outputs (owner-only research output, like every `agt reproduce`): results.json, fig1..fig6
PNGs per task, summary.md with the per-regime winners. No radius, vote or logit is written.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import math
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agt.baselines.convex import accuracy as convex_accuracy
from agt.baselines.convex import fit_logistic
from agt.baselines.loss_perturbation import PerturbedSolver
from agt.baselines.unit_ball import UnitBallMap, pca_basis
from agt.certify import Certifier
from agt.config import TrainConfig, load_yaml
from agt.data import load_dataset
from agt.data.dataset import Dataset, validate_dataset
from agt.ensemble import EnsembleCertifier, partition_indices, train_ensemble
from agt.errors import ConfigError, Problems
from agt.io import atomic_write
from agt.store import from_result
from agt.training import train
from agt.version import __version__
from experiments.accuracy import RELATION, simulate
from experiments.context import dumps, markdown_table, to_jsonable
from experiments.plan import PLAN_DIR, build_settings, display_path
from experiments.plotting import plt, save
from experiments.public_tuning import PublicShape, choose, grid, surrogate_like
from mechanisms import MECHANISMS, Certified, Source, Votes, make_mechanism
from mechanisms.accounting import plan_queries
from mechanisms.convex import LinearModel
from mechanisms.loss_perturbation import PerturbedObjective
from mechanisms.votes import aggregate

NAME = "tradeoffs"
TRAINING = ("model-sens", "model-sens-gauss", "loss-pert", "loss-pert-gauss", "dp-sgd")
PREDICTION = ("pred-sens", "pred-sens-gauss", "df-exp", "df-exp-zcdp", "lnmax")
AGT_MULTI = ("ss-argmax", "exp-radius", "ptr", "ens-exp-radius")
AGT_BINARY = ("gs", "ss-cauchy", "ss-laplace")
# Sampled rows: Monte Carlo mechanisms (their correct_probability is an estimate)
SAMPLED_ONLY = ("model-sens", "model-sens-gauss", "pred-sens", "pred-sens-gauss",
                "loss-pert", "loss-pert-gauss")
FIGURES = ("eps", "budget", "delta", "n", "dim", "lambda_t")
COLORS = {"model-sens": "tab:blue", "model-sens-gauss": "tab:blue", "loss-pert": "tab:cyan",
          "loss-pert-gauss": "tab:cyan", "pred-sens": "tab:orange",
          "pred-sens-gauss": "tab:orange", "df-exp": "tab:red", "df-exp-zcdp": "tab:red",
          "lnmax": "tab:pink", "ss-argmax": "tab:green", "exp-radius": "tab:brown",
          "ptr": "tab:olive", "ens-exp-radius": "tab:purple", "gs": "0.3",
          "ss-cauchy": "tab:gray", "ss-laplace": "k", "dp-sgd": "navy"}
DPSGD_FIGURES = ("fig1_eps_delta", "fig2_budget", "fig3_delta")   # and the regimes


def methods(task: str) -> tuple[str, ...]:
    """Every method of the task (binary adds the binary AGT releases)."""
    base = TRAINING + PREDICTION + AGT_MULTI
    return base + AGT_BINARY if task == "binary" else base


def family(name: str) -> str:
    return "private training" if name in TRAINING else (
        "AGT" if name in AGT_MULTI + AGT_BINARY else "private prediction")


# ------------------------------------------------------------------------------------------
# Settings

@dataclass(frozen=True)
class TradeoffSettings:
    """configs/experiments/tradeoffs.yaml (its comments say what each key means)."""

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
    """The plan file (default configs/experiments/tradeoffs.yaml), its quick: section merged
    for --quick, then `overrides` (tests)."""
    path = Path(path) if path else PLAN_DIR / "tradeoffs.yaml"
    try:
        raw = load_yaml(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the trade-off plan {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must be a mapping of settings")
    quick_part = raw.pop("quick", None) or {}
    if quick:
        raw.update(quick_part)
    raw.update(overrides or {})
    if "lambda" in raw:
        raw["lam"] = raw.pop("lambda")
    return build_settings(TradeoffSettings, raw, str(path.name))


#: what every candidate of `agt_stability_grid` adds: bound method stability (L2 balls,
#: agt/stability.py) on the unit-ball inputs, whose norm <= 1 the map guarantees from the
#: public pixel range alone (so input_norm_bound 1 is no choice), a clamp that never acts
#: (clip_gamma = max(R, 1)), and boxes of k >= 1 enclosing the balls (no interval pass)
STABILITY_SETTINGS = {"bound_method": "stability", "input_norm_bound": 1.0, "clip_gamma": 1.0,
                      "k_boxes": "ball"}


# ------------------------------------------------------------------------------------------
# Models of one setting (owner-only; never written)

@dataclass
class Timer:
    """Wall time spent training (fits, AGT) and releasing (ledgered draws and exact
    expectations, loss perturbation's solves counted as training)."""

    training: float = 0.0
    releasing: float = 0.0
    tuning: float = 0.0


@dataclass
class Setup:
    """Everything a release of one setting (task, n, dim, lambda, T) spends."""

    task: str
    n_classes: int
    y_test: np.ndarray
    nonprivate: dict
    linear: LinearModel
    objective: PerturbedObjective
    votes: Votes
    agt_single: list[Certified]          # one per training seed of agt_seeds
    agt_votes: list[Votes] | None        # the AGT ensemble of T teachers, one per seed
    n_train: int = 0

    def inputs_for(self, name: str) -> list:
        """The method's inputs: one per AGT training seed for AGT rows, else one."""
        kind = MECHANISMS[name].inputs
        if kind is LinearModel:
            return [self.linear]
        if kind is PerturbedObjective:
            return [self.objective]
        if kind is Certified:
            return self.agt_single
        return self.agt_votes if name == "ens-exp-radius" else [self.votes]


def _sha(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class Study:
    """One run of the study: data, memoised models per setting, and the evaluations."""

    def __init__(self, settings: TradeoffSettings, *, quick: bool = False,
                 dataset_by_task: dict[str, Dataset] | None = None, progress: bool = False):
        self.s = settings
        self.quick = quick
        self.progress = progress
        self.timer = Timer()
        self._data = dict(dataset_by_task or {})
        self._setups: dict[tuple, Setup] = {}
        self._agt: dict[tuple, tuple] = {}
        self._dpsgd: dict[tuple, list[float]] = {}
        self._tuning: dict[str, dict] = {}

    def dataset(self, task: str) -> Dataset:
        if task not in self._data:
            opts = {k: v for k, v in self.s.data.items() if k != "name"}
            self._data[task] = load_dataset(self.s.data.get("name", "digits"),
                                            {**opts, "task": task}, None)
        return self._data[task]

    def setup(self, task: str, n: int | None = None, dim: int | None = None,
              lam: float | None = None, teachers: int | None = None) -> Setup:
        ds = self.dataset(task)
        n = ds.n_train if n is None else int(n)
        d_raw = int(np.prod(ds.feature_shape))
        dim = d_raw if dim is None else int(dim)
        lam = self.s.lam if lam is None else float(lam)
        teachers = self.s.teachers if teachers is None else int(teachers)
        key = (task, n, dim, lam, teachers)
        if key in self._setups:
            return self._setups[key]
        self.tuning(task)           # timed on its own, not as training
        t0 = time.perf_counter()
        unit = UnitBallMap.for_dataset(ds.meta, d_raw)
        if dim < d_raw:        # Fig. 5: PCA on the unlabelled queries (module docstring)
            unit = unit.with_basis(pca_basis(ds.x_test, dim, unit))
        x_tr, y_tr = ds.x_train[:n], ds.y_train[:n]
        u_tr, u_te = unit.transform(x_tr, "training inputs"), unit.transform(ds.x_test,
                                                                            "queries")
        biased = dataclasses.replace(unit, bias=True)
        z_tr, z_te = biased.transform(x_tr, "training inputs"), biased.transform(ds.x_test,
                                                                                "queries")
        c = ds.n_classes
        sha = _sha(z_tr, y_tr)
        src = Source(f"tradeoffs/{task}/n{n}/d{dim}", sha, (RELATION,), False)
        fit = fit_logistic(z_tr, y_tr, c, lam, tol=self.s.tol)
        linear = LinearModel(fit.weights, z_te, fit.sensitivity, c, src)
        solver = PerturbedSolver(z_tr, y_tr, c, lam, tol=self.s.tol)
        objective = PerturbedObjective(solver, z_te, n, c, lam, src)
        parts = partition_indices(n, teachers)
        teacher_votes = np.stack([
            fit_logistic(z_tr[idx], y_tr[idx], c, lam, tol=max(self.s.tol, 1e-6))
            .weights.__matmul__(z_te.T).argmax(axis=0) for idx in parts], axis=1)
        votes = Votes(teacher_votes, None, c, src)
        single, agt_votes, agt_acc = self._agt_models(task, n, dim, u_tr, y_tr, u_te, c,
                                                      teachers)
        y = ds.y_test
        nonprivate = {"convex": convex_accuracy(fit.weights, z_te, y),
                      "teachers_plurality": float(np.mean(aggregate(teacher_votes, c) == y)),
                      "agt": agt_acc}
        self.timer.training += time.perf_counter() - t0
        setup = Setup(task, c, y, nonprivate, linear, objective, votes, single, agt_votes, n)
        self._setups[key] = setup
        return setup

    @staticmethod
    def _linear_config(n_features: int, c: int, seed: int, **params) -> TrainConfig:
        """The linear cross-entropy model spec shared by the AGT and DP-SGD rows."""
        return TrainConfig.create([{"linear": {"in": int(n_features), "out": int(c)}}],
                                  "cross_entropy", seed=int(seed), device="cpu", **params)

    @classmethod
    def _agt_config(cls, n_features: int, c: int, params: dict, seed: int) -> TrainConfig:
        return cls._linear_config(n_features, c, seed, fragment_size=10_000, **params)

    def tuning(self, task: str) -> dict:
        """The task's AGT and DP-SGD settings, chosen on public surrogates of the task's
        shape (experiments/public_tuning.py): this method hands the tuning the
        `PublicShape` of the data only, never a record or label. Memoised per task."""
        if task in self._tuning:
            return self._tuning[task]
        t0 = time.perf_counter()
        shape = PublicShape.of(self.dataset(task))
        d, c = shape.n_features, shape.n_classes
        unit = UnitBallMap(*shape.feature_range, d)
        surrogates = []
        for seed in self.s.tuning_seeds:
            sur = surrogate_like(shape, seed)
            u_te = unit.transform(sur.x_test, "surrogate queries")
            surrogates.append((int(seed), validate_dataset(Dataset(
                sur.name, unit.transform(sur.x_train, "surrogate inputs"), sur.y_train, u_te,
                sur.y_test, c, sur.meta))))
        # every (total eps, B) of Figs. 1-2: one point alone is often at chance for every
        # candidate (uninformative), the average over the plan's range is not
        releases = [make_mechanism("exp-radius", plan_queries(e, 0.0, b, False,
                                                              "standard")[0], None)
                    for e in self.s.epsilons for b in self.s.budgets]

        def agt_scores(cand: dict) -> list[float]:
            out = []
            for seed, sur in surrogates:
                cfg = self._agt_config(d, c, {**self.s.agt, **cand}, seed)
                cert = Certifier(from_result(train(cfg, sur)), device="cpu").certify(sur.x_test)
                inputs = Certified.from_certificate(cert)
                out.append(float(np.mean([r.correct_probability(inputs, sur.y_test).mean()
                                          for r in releases])))
            return out

        candidates = grid(self.s.agt_grid) if self.s.agt_grid else []
        if self.s.agt_stability_grid:
            # a null grid value means the engine's default (the key is left out)
            candidates += [{**{k: v for k, v in cand.items() if v is not None},
                            **STABILITY_SETTINGS}
                           for cand in grid(self.s.agt_stability_grid)]
        agt = choose(candidates or [{}], agt_scores,
                     "surrogate: exact expected accuracy of exp-radius (delta = 0), averaged "
                     "over the plan's total epsilons x inference budgets, mean over the "
                     "surrogate seeds")
        out = {"surrogate": f"public surrogates (seeds {list(self.s.tuning_seeds)})",
               "agt": agt.as_dict(), "agt_params": {**self.s.agt, **agt.chosen}}
        if self.s.dpsgd:
            from agt.baselines.dpsgd import DPSGDConfig, train_dpsgd
            from experiments.context import add_remove_target
            eps_a, delta_a = add_remove_target(self.s.epsilon, self.s.delta)

            def dpsgd_scores(cand: dict) -> list[float]:
                out = []
                for seed, sur in surrogates:
                    spec = self._linear_config(d, c, seed)
                    dp = DPSGDConfig(target_epsilon=eps_a, target_delta=delta_a, seed=seed,
                                     **{**self.s.dpsgd, **cand})
                    out.append(float(train_dpsgd(spec, sur, dp, device="cpu").test_accuracy))
                return out

            dp_choice = choose(grid(self.s.dpsgd_grid) if self.s.dpsgd_grid else [{}],
                               dpsgd_scores, f"surrogate: test accuracy at total (eps, delta) "
                                             f"= ({self.s.epsilon:g}, {self.s.delta:g}), mean "
                                             f"over the surrogate seeds")
            out["dpsgd"] = dp_choice.as_dict()
            out["dpsgd_params"] = {**self.s.dpsgd, **dp_choice.chosen}
        self._tuning[task] = out
        self.timer.tuning += time.perf_counter() - t0
        return out

    def _agt_models(self, task, n, dim, u_tr, y_tr, u_te, c, teachers):
        """Per seed of agt_seeds: the AGT single model (memoised per task, n, dim) and, for
        T <= agt_teachers_max, the AGT ensemble of T teachers: their certified inputs (radii
        stay in memory), with the settings chosen on the public surrogate."""
        params = self.tuning(task)["agt_params"]
        ds = validate_dataset(Dataset("digits-unit-ball", u_tr, y_tr, u_te, None, c,
                                      {"task": task}))
        singles, all_votes = [], []
        for seed in self.s.agt_seeds:
            cfg = self._agt_config(u_tr.shape[1], c, params, seed)
            key = (task, n, dim, int(seed))
            if key not in self._agt:
                result = train(cfg, ds)
                cert = Certifier(from_result(result), device="cpu").certify(u_te)
                self._agt[key] = (Certified.from_certificate(cert), {})
            single, ensembles = self._agt[key]
            singles.append(single)
            if teachers <= self.s.agt_teachers_max and n // teachers >= 2:
                if teachers not in ensembles:
                    batch = n // teachers
                    ks = [k for k in cfg.k_values if k < batch]
                    ens = train_ensemble(cfg.replace(k_values=ks), ds, teachers)
                    ensembles[teachers] = Votes.from_certificate(
                        EnsembleCertifier(ens, device="cpu").certify(u_te))
                all_votes.append(ensembles[teachers])
        y = self.dataset(task).y_test
        acc = float(np.mean([np.mean(s.prediction == y) for s in singles]))
        return singles, (all_votes or None), acc

    def dpsgd_point(self, task: str, n: int, eps: float, delta: float) -> dict | None:
        """DP-SGD (Opacus) on the AGT model spec and the unit-ball inputs u, one run per seed
        of `dpsgd_seeds` (seeded: experiments only), at the add-remove target whose
        replace-one conversion (group privacy) is within (eps, delta). A training method:
        its model answers any number of queries, so B does not enter. None for delta = 0."""
        if delta == 0 or not self.s.dpsgd:
            return None
        from agt.baselines.dpsgd import DPSGDConfig, train_dpsgd
        from experiments.context import add_remove_target

        key = (task, n, float(eps), float(delta))
        if key not in self._dpsgd:
            params = self.tuning(task)["dpsgd_params"]     # timed as tuning, not training
            t0 = time.perf_counter()
            ds = self.dataset(task)
            unit = UnitBallMap.for_dataset(ds.meta, int(np.prod(ds.feature_shape)))
            data = validate_dataset(Dataset("digits-unit-ball", unit.transform(ds.x_train[:n]),
                                            ds.y_train[:n], unit.transform(ds.x_test),
                                            ds.y_test, ds.n_classes, {"task": task}))
            cfg = self._linear_config(data.x_train.shape[1], ds.n_classes,
                                      self.s.dpsgd_seeds[0])
            eps_a, delta_a = add_remove_target(eps, delta)
            accs = []
            for seed in self.s.dpsgd_seeds:
                dp = DPSGDConfig(target_epsilon=eps_a, target_delta=delta_a, seed=int(seed),
                                 **params)
                accs.append(float(train_dpsgd(cfg.replace(seed=int(seed)), data, dp,
                                              device="cpu").test_accuracy))
            self._dpsgd[key] = accs
            self.timer.training += time.perf_counter() - t0
        accs = np.asarray(self._dpsgd[key])
        return {"method": "dp-sgd", "family": family("dp-sgd"), "mean": float(accs.mean()),
                "std": float(accs.std(ddof=1)) if accs.size > 1 else 0.0,
                "std_kind": "over the DP-SGD seeds",
                "expected": None, "sampled_mean": float(accs.mean()), "draws": len(accs),
                "seeds": list(self.s.dpsgd_seeds), "epsilon_total": eps,
                "delta_total": delta, "per_query_epsilon": None, "per_query_delta": None,
                "relation": RELATION,
                "accountant": f"session (Opacus {self.s.dpsgd.get('accountant', 'prv')}; "
                              f"add-remove target converted to replace-one)",
                "add_remove_target": "(eps/2, delta/(1+e^(eps/2))), group privacy gives "
                                     "(eps, delta) under replace-one",
                "guarantee": "DP-SGD training run; labels are post-processing"}

    # -- one point ---------------------------------------------------------------------------
    def rngs(self, *keys: Any, repeats: int) -> list[np.random.Generator]:
        words = [int(self.s.noise_seed)] + [zlib.crc32(repr(k).encode()) for k in keys]
        return [np.random.default_rng(c) for c in np.random.SeedSequence(words).spawn(repeats)]

    def point(self, setup: Setup, name: str, eps: float, delta: float, budget: int,
              key: tuple) -> dict | None:
        """One method at total (eps, delta) over `budget` queries; None where the method
        needs delta > 0 and delta = 0, or its inputs do not exist (AGT ensemble too large)."""
        if name == "dp-sgd":
            if key[1] not in DPSGD_FIGURES and key[1] != "regime":
                return None
            return self.dpsgd_point(setup.task, setup.n_train, eps, delta)
        entry = MECHANISMS[name]
        if (entry.needs_delta and delta == 0) or (name == "ens-exp-radius"
                                                   and setup.agt_votes is None):
            return None
        if name in ("gs", "ss-cauchy", "ss-laplace") and setup.n_classes > 2:
            return None
        probe = make_mechanism(name, 1.0, 0.5 if entry.needs_delta else None)
        session = not probe.per_query
        accountant = "session" if session else ("standard" if delta == 0 else "best")
        eps_q, delta_q = plan_queries(eps, delta, budget, entry.needs_delta,
                                      "standard" if session or delta == 0 else "best",
                                      session=session)
        mech = make_mechanism(name, eps_q, delta_q if entry.needs_delta else None)
        per_seed = setup.inputs_for(name)
        exact = name not in SAMPLED_ONLY
        if name.startswith("loss-pert"):
            repeats = self.s.loss_repeats
        elif exact:     # the exact law gives mean and spread; a few deployments check it
            repeats = self.s.check_draws
        else:
            repeats = self.s.repeats
        t0 = time.perf_counter()
        draws, expecteds, noise_vars = [], [], []
        seeds = list(self.s.agt_seeds) if len(per_seed) > 1 else [None]
        for seed, inputs in zip(seeds, per_seed):
            if name == "df-exp-zcdp":    # its beta is calibrated to the release's query
                # count: deployments of exactly B queries (test queries tiled to a multiple)
                q = inputs.n_queries
                idx = np.resize(np.arange(q), math.ceil(q / budget) * budget).reshape(-1, budget)
                views = [inputs.subset(j) for j in idx]
                y_views = [setup.y_test[j] for j in idx]
            else:
                views, y_views = [inputs], [setup.y_test]
            checked = list(zip(views, y_views))[:self.s.check_views]
            seed_key = key if seed is None else (key, int(seed))
            for rng in self.rngs(*seed_key, name, repeats=repeats):
                hits = sum(float(np.sum(simulate(mech, v, rng) == yv)) for v, yv in checked)
                draws.append(hits / sum(len(yv) for _, yv in checked))
            if exact:
                # per-query releases draw independent noise, so the deployment accuracy is
                # a mean of independent Bernoulli(p_i): exact mean and variance over noise
                p = np.concatenate([mech.correct_probability(v, yv)
                                    for v, yv in zip(views, y_views)])
                expecteds.append(float(p.mean()))
                noise_vars.append(float(np.sum(p * (1 - p))) / len(p) ** 2)
        elapsed = time.perf_counter() - t0
        if name.startswith("loss-pert"):     # its releases are optimisations: training
            self.timer.training += elapsed
        else:
            self.timer.releasing += elapsed
        d = np.asarray(draws)
        expected = spread = None
        if exact:
            # law of total variance over the training seeds (one seed: the noise alone);
            # the between-seed part is the unbiased sample variance
            expected = float(np.mean(expecteds))
            between = float(np.var(expecteds, ddof=1)) if len(expecteds) > 1 else 0.0
            spread = float(math.sqrt(between + np.mean(noise_vars)))
        if len(per_seed) > 1:
            std_kind = ("exact over AGT training seeds and noise draws" if exact
                        else "over AGT training seeds and sampled draws")
        else:
            std_kind = "exact over noise draws" if exact else "over the sampled draws"
        g = mech.guarantee_for(per_seed[0], RELATION)
        row = {"method": name, "family": family(name),
               "mean": expected if exact else float(d.mean()),
               "std": spread if exact else float(d.std()),
               "std_kind": std_kind,
               "expected": expected, "sampled_mean": float(d.mean()), "draws": len(draws),
               "epsilon_total": eps, "delta_total": delta,
               "budget": budget, "per_query_epsilon": eps_q, "per_query_delta": delta_q,
               "relation": g.relation, "accountant": accountant,
               "guarantee": g.note if hasattr(g, "note") else str(g)}
        if len(per_seed) > 1:
            row["agt_training_seeds"] = list(self.s.agt_seeds)
        return row


# ------------------------------------------------------------------------------------------
# Figures

def _sweep(study: Study, task: str, fig_key: str, x_name: str, xs, make) -> dict:
    """{method: [row or None per x]} for the points make(x) -> (setup, eps, delta, B)."""
    out: dict[str, list] = {m: [] for m in methods(task)}
    nonpriv = []
    for x in xs:
        setup, eps, delta, budget = make(x)
        nonpriv.append(setup.nonprivate)
        for m in methods(task):
            out[m].append(study.point(setup, m, eps, delta, budget, (task, fig_key, x_name, x)))
    return {"x": list(xs), "x_name": x_name, "rows": out, "nonprivate": nonpriv}


def run_figures(study: Study, task: str) -> dict:
    s = study.s
    figs = s.figures.get(task, FIGURES if task == "multiclass" else ("eps", "budget"))
    n_full = study.dataset(task).n_train
    base = study.setup(task)
    out = {}
    if "eps" in figs:
        out["fig1_eps_delta0"] = _sweep(study, task, "fig1_eps_delta0", "epsilon", s.epsilons,
                                        lambda e: (base, e, 0.0, s.budget))
        out["fig1_eps_delta"] = _sweep(study, task, "fig1_eps_delta", "epsilon", s.epsilons,
                                       lambda e: (base, e, s.delta, s.budget))
    if "budget" in figs:
        out["fig2_budget"] = _sweep(study, task, "fig2_budget", "budget", s.budgets,
                                    lambda b: (base, s.epsilon, s.delta, b))
    if "delta" in figs:
        out["fig3_delta"] = _sweep(study, task, "fig3_delta", "delta", s.deltas,
                                   lambda d: (base, s.epsilon, d, s.budget))
    if "n" in figs:
        ns = sorted({max(2 * s.teachers, int(round(f * n_full))) for f in s.train_fractions})
        out["fig4_n"] = _sweep(study, task, "fig4_n", "n_train", ns, lambda n: (
            study.setup(task, n=n), s.epsilon, s.delta, s.budget))
    if "dim" in figs:
        out["fig5_dim"] = _sweep(study, task, "fig5_dim", "pca_dim", s.dims, lambda d: (
            study.setup(task, dim=d), s.epsilon, s.delta, s.budget))
    if "lambda_t" in figs:
        out["fig6_lambda"] = _sweep(study, task, "fig6_lambda", "lambda", s.lambdas, lambda lam: (
            study.setup(task, lam=lam), s.epsilon, s.delta, s.budget))
        out["fig6_teachers"] = _sweep(study, task, "fig6_teachers", "teachers", s.teacher_grid,
                                      lambda t: (
            study.setup(task, teachers=t), s.epsilon, s.delta, s.budget))
    return out


FIG_FILES = {"fig1": ("fig1_eps_delta0", "fig1_eps_delta"), "fig2": ("fig2_budget",),
             "fig3": ("fig3_delta",), "fig4": ("fig4_n",), "fig5": ("fig5_dim",),
             "fig6": ("fig6_lambda", "fig6_teachers")}
FIG_ONLY = {"fig6_lambda": TRAINING[:4] + ("pred-sens", "pred-sens-gauss"),
            "fig6_teachers": ("df-exp", "df-exp-zcdp", "lnmax", "ens-exp-radius")}
TITLES = {"fig1_eps_delta0": "delta = 0", "fig1_eps_delta": "delta = {delta:g}",
          "fig2_budget": "eps = {eps:g}, delta = {delta:g}", "fig3_delta": "eps = {eps:g}, B = {B}",
          "fig4_n": "eps = {eps:g}, delta = {delta:g}, B = {B}",
          "fig5_dim": "eps = {eps:g}, delta = {delta:g}, B = {B}",
          "fig6_lambda": "convex methods, eps = {eps:g}, B = {B}",
          "fig6_teachers": "vote methods, eps = {eps:g}, B = {B}"}


def plot_task(task: str, figures: dict, out_dir: Path, s: TradeoffSettings) -> list[Path]:
    files = []
    for fig_name, keys in FIG_FILES.items():
        keys = [k for k in keys if k in figures]
        if not keys:
            continue
        fig, axes = plt.subplots(1, len(keys), figsize=(6.2 * len(keys), 4.6), squeeze=False)
        for ax, key in zip(axes[0], keys):
            sweep = figures[key]
            xs = np.asarray(sweep["x"], dtype=float)
            for m, rows in sweep["rows"].items():
                if key in FIG_ONLY and m not in FIG_ONLY[key]:
                    continue
                pts = [(x, r["mean"], r["std"]) for x, r in zip(xs, rows) if r is not None]
                if not pts:
                    continue
                px, pm_, ps = (np.asarray(v) for v in zip(*pts))
                gauss = m.endswith("gauss") or m in ("df-exp-zcdp", "ptr", "ss-laplace")
                ax.errorbar(px, pm_, yerr=ps, color=COLORS.get(m), capsize=2, marker=".",
                            linestyle="--" if gauss else "-", label=f"{m} ({family(m)})")
            npv = [v["convex"] for v in sweep["nonprivate"]]
            ax.plot(xs, npv, color="0.5", linestyle=":", label="non-private (convex)")
            ax.plot(xs, [v["agt"] for v in sweep["nonprivate"]], color="tab:green",
                    linestyle=":", alpha=0.6, label="non-private (AGT nominal)")
            if sweep["x_name"] in ("epsilon", "budget", "delta", "lambda", "teachers",
                                   "n_train"):
                ax.set_xscale("log")
            ax.set_xlabel({"epsilon": "total ε over the budget", "budget": "inference budget B",
                           "delta": "total δ", "n_train": "training-set size N",
                           "pca_dim": "dimension D (PCA on the unlabelled queries)",
                           "lambda": "L2 weight λ", "teachers": "teachers T"}[sweep["x_name"]])
            ax.set_ylabel("test accuracy (mean ± std; AGT and DP-SGD over seeds too)")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"digits {task}: " + TITLES[key].format(
                delta=s.delta, eps=s.epsilon, B=s.budget) + " (replace-one)", fontsize=9)
            ax.grid(alpha=0.3, which="both")
        axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
        files.append(save(fig, out_dir / f"{task}_{fig_name}.png"))
    return files


# ------------------------------------------------------------------------------------------
# Regimes and the summary

def regimes(study: Study, task: str) -> list[dict]:
    """Which method wins per regime: B small/large x delta 0/> 0 x N small/large, at the
    plan's total epsilon. Small/large = the ends of the plan's budgets and train_fractions."""
    s = study.s
    n_full = study.dataset(task).n_train
    n_small = max(2 * s.teachers, int(round(min(s.train_fractions) * n_full)))
    out = []
    for b_label, b in (("small B", min(s.budgets)), ("large B", max(s.budgets))):
        for d_label, delta in (("delta = 0", 0.0), (f"delta = {s.delta:g}", s.delta)):
            for n_label, n in (("small N", n_small), ("large N", n_full)):
                setup = study.setup(task, n=n)
                rows = [study.point(setup, m, s.epsilon, delta, b, (task, "regime", b, delta, n))
                        for m in methods(task)]
                rows = [r for r in rows if r is not None]
                best = max(rows, key=lambda r: r["mean"])
                best_of = {f: max((r for r in rows if r["family"] == f),
                                  key=lambda r: r["mean"])
                           for f in ("private training", "private prediction", "AGT")}
                out.append({"regime": f"{b_label}, {d_label}, {n_label}", "budget": b,
                            "delta_total": delta, "n_train": n, "epsilon_total": s.epsilon,
                            "winner": best["method"], "winner_family": best["family"],
                            "winner_accuracy": best["mean"],
                            "best_by_family": {f: {"method": r["method"], "mean": r["mean"],
                                                   "std": r["std"]}
                                               for f, r in best_of.items()},
                            "rows": rows})
    return out


def tuning_markdown(tuning: dict, s: dict) -> str:
    """The settings chosen on the public surrogate, with every candidate's score."""
    def fmt(choice: dict) -> str:
        # each candidate with all of its own keys (the stability ones add bound_method, ...)
        cands = "; ".join(", ".join(f"{k} {v}" for k, v in c.items()
                                    if k not in ("score", "scores"))
                          + f": {c['score']:.3f}" for c in choice["candidates"])
        return (f"chosen {choice['chosen'] or 'the fixed settings'} by {choice['criterion']}"
                + (f" (candidates: {cands})" if len(choice["candidates"]) > 1 else ""))
    text = (f"Settings chosen on {tuning['surrogate']} of the digits' public shape, never "
            f"on the digits. AGT: {fmt(tuning['agt'])}. AGT rows average the training seeds "
            f"{tuple(s['agt_seeds'])}.")
    if "dpsgd" in tuning:
        text += f" DP-SGD: {fmt(tuning['dpsgd'])}; seeds {tuple(s['dpsgd_seeds'])}."
    return text


def summary_markdown(results: dict) -> str:
    s = results["settings"]
    quick = " (quick)" if results["quick"] else ""
    lines = [f"# Trade-offs of private prediction on digits{quick}",
             "", "Every row: total (eps, delta) over B queries, replace-one; per-query "
             "mechanisms use standard composition (delta = 0) or the better of standard and "
             "advanced composition (delta > 0); sessions (model-sens*, loss-pert*, "
             "df-exp-zcdp) spend the total once. Accuracy: mean ± std over noise draws "
             f"({s['repeats']} draws; loss perturbation {s['loss_repeats']}); exact "
             "expectation as the mean where it exists; AGT rows also over the training "
             f"seeds {tuple(s['agt_seeds'])} and DP-SGD rows over its seeds "
             f"{tuple(s['dpsgd_seeds'])} "
             "(each row's std_kind in results.json says which).", ""]
    for task, block in results["tasks"].items():
        np_ = block["nonprivate"]
        lines += [f"## {task} ({block['n_classes']} classes, N = {block['n_train']}, "
                  f"{block['n_test']} queries)", "",
                  f"Non-private: convex {np_['convex']:.3f}, T = {s['teachers']} teachers' "
                  f"plurality {np_['teachers_plurality']:.3f}, AGT nominal {np_['agt']:.3f}; AGT "
                  f"radius median {block['agt_radius_median']:g} over every training seed's queries "
                  "(owner-only statistic).", "",
                  tuning_markdown(block["tuning"], s), "",
                  "### Winner per regime (eps = {:g})".format(s["epsilon"]), ""]
        header = ["regime", "winner", "accuracy", "best private training",
                  "best private prediction", "best AGT"]
        rows = []
        for r in block["regimes"]:
            b = r["best_by_family"]
            rows.append([r["regime"], f"{r['winner']} ({r['winner_family']})",
                         f"{r['winner_accuracy']:.3f}"]
                        + [f"{b[f]['method']} {b[f]['mean']:.3f} ± {b[f]['std']:.3f}"
                           for f in ("private training", "private prediction", "AGT")])
        lines += [markdown_table(header, rows), ""]
        fig1 = block["figures"].get("fig1_eps_delta")
        if fig1:
            lines += [f"### Fig. 1 (delta = {s['delta']:g}, B = {s['budget']}): accuracy vs "
                      "total eps", ""]
            hdr = ["method", "accountant"] + [f"eps {x:g}" for x in fig1["x"]]
            body = []
            for m, rs in fig1["rows"].items():
                if all(r is None for r in rs):
                    continue
                acct = next(r["accountant"] for r in rs if r is not None)
                body.append([m, acct] + ["—" if r is None else
                                         f"{r['mean']:.3f} ± {r['std']:.3f}" for r in rs])
            lines += [markdown_table(hdr, body), ""]
    lines += ["Owner-only research output: aggregate accuracies of models trained on the "
              "private digits; no radius, vote or logit is written.", ""]
    return "\n".join(lines)


def run_study(settings: TradeoffSettings, out_dir: str | Path, *, quick: bool = False,
              dataset_by_task: dict[str, Dataset] | None = None,
              progress: bool = False, threads: int | None = None) -> dict:
    """Run every task's figures and regimes; write results.json, PNGs and summary.md under
    `out_dir`. Returns the results (with `files` and `timing`). `threads`: torch and BLAS
    threads during the run (default 1, restored afterwards)."""
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
