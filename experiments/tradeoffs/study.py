"""One run of the trade-off study: the data, the models of each setting (memoised), and one
method's accuracy at one point (`Study.point`). Nothing here writes a file.

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
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from agt.baselines.convex import accuracy as convex_accuracy
from agt.baselines.convex import fit_logistic
from agt.baselines.loss_perturbation import PerturbedSolver
from agt.baselines.unit_ball import UnitBallMap, pca_basis
from agt.certify import Certifier
from agt.config import TrainConfig
from agt.data import load_dataset
from agt.data.dataset import Dataset, validate_dataset
from agt.ensemble import EnsembleCertifier, partition_indices, train_ensemble
from agt.store import from_result
from agt.training import train
from experiments.accuracy import RELATION, simulate
from experiments.public_tuning import (
    PublicShape,
    budgeted_mechanism,
    choose,
    grid,
    release_scores,
    surrogate_like,
)
from experiments.tradeoffs.methods import SAMPLED_ONLY, family
from experiments.tradeoffs.settings import TradeoffSettings
from mechanisms import MECHANISMS, Certified, Source, Votes, make_mechanism
from mechanisms.convex import LinearModel
from mechanisms.loss_perturbation import PerturbedObjective
from mechanisms.votes import aggregate

#: the sweeps that get DP-SGD rows besides the regimes (Figs. 1-3; only at delta > 0)
DPSGD_FIGURES = ("fig1_eps_delta", "fig2_budget", "fig3_delta")

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


#: PATE 2018's releases: their noise is calibrated so that the B queries' Renyi curves
#: compose (rdp ledger) to the row's (eps, delta), the accounting they are designed for
RENYI_CALIBRATED = ("gnmax", "confident-gnmax")


def _renyi_calibrated(name: str, eps: float, delta: float, budget: int, setup):
    """gnmax / confident-gnmax whose B-query composition fits (eps, delta); confident-gnmax
    with threshold 0.8 T (PATE's MNIST ratio), T the number of teachers: public values."""
    from mechanisms.pate import sigmas_for_budget

    sigma, sigma1 = sigmas_for_budget(eps, delta, budget, confident=name != "gnmax")
    if name == "gnmax":
        return make_mechanism(name, 1e6, delta, sigma=sigma)
    teachers = setup.inputs_for(name)[0].n_teachers
    return make_mechanism(name, 1e6, delta, threshold=0.8 * teachers, sigma1=sigma1,
                          sigma2=sigma)


def _sha(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class Study:
    """One run of the study: data, memoised models per setting, and the evaluations.

    Args:
        settings: the loaded plan.
        quick: whether the plan is the quick one (stored for callers).
        dataset_by_task: datasets to use instead of loading ``settings.data`` (tests).
        progress: stored for callers; the study itself prints nothing.
    """

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
        """The task's data (``settings.data`` with ``task`` added), loaded once.

        Args:
            task: ``multiclass`` or ``binary``.

        Returns:
            The dataset.
        """
        if task not in self._data:
            opts = {k: v for k, v in self.s.data.items() if k != "name"}
            self._data[task] = load_dataset(self.s.data.get("name", "digits"),
                                            {**opts, "task": task}, None)
        return self._data[task]

    def setup(self, task: str, n: int | None = None, dim: int | None = None,
              lam: float | None = None, teachers: int | None = None) -> Setup:
        """The models of one setting, trained once (the task's tuning runs first).

        Args:
            task: ``multiclass`` or ``binary``.
            n: training records, the first ones of the split (default all).
            dim: input dimension; below the raw one, PCA on the unlabelled queries.
            lam: L2 weight of the convex fits (default the plan's ``lambda``).
            teachers: T of the vote methods (default the plan's ``teachers``).

        Returns:
            The setting's `Setup`.
        """
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
        `PublicShape` of the data only, never a record or label. Memoised per task.

        Args:
            task: ``multiclass`` or ``binary``.

        Returns:
            ``surrogate`` (what was scored), ``agt`` (the choice with every candidate's
            scores) and ``agt_params`` (the AGT training settings used); with DP-SGD on,
            ``dpsgd`` and ``dpsgd_params`` likewise.
        """
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
        releases = {(e, b): budgeted_mechanism("exp-radius", e, 0.0, b).mechanism
                    for e in self.s.epsilons for b in self.s.budgets}

        def agt_scores(cand: dict) -> list[float]:
            return [float(np.mean(list(release_scores(
                        self._agt_config(d, c, {**self.s.agt, **cand}, seed), sur,
                        releases).values())))
                    for seed, sur in surrogates]

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
        """One method's accuracy at total (eps, delta) over `budget` queries.

        Args:
            setup: the setting's models (`setup`).
            name: a method of `methods`.
            eps: total epsilon over the budget.
            delta: total delta (0: pure DP).
            budget: the inference budget B.
            key: the point's description; it seeds the noise generators, and its second
                entry (the sweep, or ``regime``) says whether DP-SGD rows are computed.

        Returns:
            The row (mean, std and how it was obtained, the per-query budget, accountant,
            relation and guarantee), or None where the method needs delta > 0 and delta = 0,
            or its inputs do not exist (a binary-only release on more classes; an AGT
            ensemble above ``agt_teachers_max`` teachers or with under 2 records each).
        """
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
        if name in RENYI_CALIBRATED:
            # calibrated on Renyi curves over the whole budget: its per-query (eps, delta)
            # under best composition can be too small for any sigma, so it is never built
            accountant = "rdp"
            mech = _renyi_calibrated(name, eps, delta, budget, setup)
            eps_q, delta_q = mech.guarantee(RELATION).epsilon, mech.guarantee(RELATION).delta
        else:
            planned = budgeted_mechanism(name, eps, delta, budget)
            mech, eps_q, delta_q, accountant = (planned.mechanism, planned.epsilon,
                                                planned.delta, planned.accountant)
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

