"""The state one `agt reproduce` run shares between its experiments, and their outputs.

`Context` prepares the dataset pipeline once and memoises what several experiments use:
the single AGT model and its certificate on the test queries (single, budget, kgrid,
teacher), the AGT ensembles per T (ensembles, budget, teacher) and DP-SGD runs (budget,
teacher). Everything is deterministic in the run's seed: training uses the config's seed
(``--seed`` overrides it) and every sampled release draws from a generator seeded with
(seed, experiment, setting, repeat).

Each experiment writes ``<out>/<dataset>/<experiment>/``: ``results.json`` (every number,
with the plan settings, the training config, data provenance and seeds), PNG plots and
``table.md``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from tqdm.auto import tqdm

from agt.certify import Certificate, Certifier
from agt.ensemble import Ensemble, EnsembleCertificate, EnsembleCertifier, train_ensemble
from agt.io import atomic_write
from agt.store import Bundle, from_result
from agt.training import train
from agt.version import __version__
from experiments.accuracy import RELATION
from experiments.pipelines import Prepared, prepare
from experiments.plan import Plan, display_path
from mechanisms import ADD_REMOVE, Certified, Guarantee, Votes
from mechanisms.ensemble import aggregate

ENSEMBLE_SEED_STRIDE = 10_007     # > any ensemble size: teacher seeds never repeat across runs


@dataclass
class Outcome:
    """What an experiment reports for the run's summary table."""

    name: str
    headline: str
    seconds: float = 0.0
    files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SingleModel:
    bundle: Bundle
    cert: Certificate          # on the test queries (owner-only)
    inputs: Certified          # what a release of the test queries spends
    seconds: float

    @property
    def relation(self) -> str:
        return RELATION


@dataclass(frozen=True)
class EnsembleModel:
    ensemble: Ensemble
    cert: EnsembleCertificate  # on the test queries (owner-only)
    inputs: Votes
    k_values: tuple[int, ...]
    seconds: float

    @property
    def relation(self) -> str:
        return RELATION

    @property
    def answer(self) -> np.ndarray:
        return aggregate(self.inputs.votes, self.inputs.n_classes)


def to_jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else str(v)
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, Path):
        return display_path(obj)
    return obj


def dumps(obj: Any, indent: int = 1, level: int = 0) -> str:
    """JSON with nested objects indented and lists of scalars kept on one line (grids of
    radii stay compact)."""
    pad, inner = " " * (indent * level), " " * (indent * (level + 1))
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k)}: {dumps(v, indent, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list):
        if all(not isinstance(v, (dict, list)) for v in obj):
            return json.dumps(obj, separators=(",", ":"))
        if all(isinstance(v, list) and all(not isinstance(u, (dict, list)) for u in v)
               for v in obj):
            rows = [inner + json.dumps(v, separators=(",", ":")) for v in obj]
            return "[\n" + ",\n".join(rows) + "\n" + pad + "]"
        items = [inner + dumps(v, indent, level + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj)


class Context:
    def __init__(self, plan: Plan, *, out: str | Path = "artifacts",
                 data_dir: str | Path | None = None,
                 seed: int | None = None, progress: bool = False, device: str = "cpu",
                 workers: int = 1, threads: int | None = None):
        self.plan = plan
        self.out_dir = Path(out) / plan.dataset
        self.data_dir = data_dir
        self.seed_override = seed
        self.progress = progress
        self.device = device
        self.workers = workers      # teachers trained at once (local processes); 1: serially
        self.threads = threads      # intra-op threads per teacher (None: agt's default)
        self._prepared: Prepared | None = None
        self._single: dict[int, SingleModel] = {}
        self._ensembles: dict[tuple[int, int], EnsembleModel] = {}
        self._dpsgd: dict[tuple, list] = {}

    # -- shared inputs ---------------------------------------------------------------------
    @property
    def prepared(self) -> Prepared:
        if self._prepared is None:
            self._prepared = prepare(self.plan, data_dir=self.data_dir, seed=self.seed_override,
                                     out_dir=self.out_dir, progress=self.progress)
        return self._prepared

    @property
    def config(self):
        return self.prepared.config

    @property
    def dataset(self):
        return self.prepared.dataset

    @property
    def seeds(self) -> tuple[int, ...]:
        """Training seeds of the models every experiment reports over (mean +- std): --seed
        alone if given, else the plan's seeds, else the training config's seed. Never
        chosen by accuracy."""
        if self.seed_override is not None:
            return (int(self.seed_override),)
        return tuple(self.plan.seeds) or (int(self.config.seed),)

    @property
    def seed(self) -> int:
        """The first training seed; also the base seed of the sampled releases."""
        return self.seeds[0]

    def rngs(self, *keys: Any, repeats: int) -> list[np.random.Generator]:
        """`repeats` independent generators for the setting named by `keys`."""
        words = [self.seed] + [zlib.crc32(repr(k).encode()) for k in keys]
        children = np.random.SeedSequence(words).spawn(repeats)
        return [np.random.default_rng(c) for c in children]

    def bar(self, iterable: Iterable, desc: str, total: int | None = None):
        return tqdm(iterable, desc=desc, total=total, disable=not self.progress, leave=False)

    # -- memoised models ---------------------------------------------------------------------
    def single(self, seed: int | None = None) -> SingleModel:
        """The single AGT model of training seed `seed` (default: the first) on the whole
        private set, certified on the test queries."""
        seed = self.seed if seed is None else int(seed)
        if seed not in self._single:
            t0 = time.perf_counter()
            result = train(self.config.replace(seed=seed), self.dataset, progress=self.progress)
            bundle = from_result(result)
            cert = Certifier(bundle, device=self.device).certify(self.dataset.x_test)
            self._single[seed] = SingleModel(bundle, cert, Certified.from_certificate(cert),
                                             time.perf_counter() - t0)
        return self._single[seed]

    def singles(self) -> list[SingleModel]:
        """One single model per training seed."""
        return [self.single(s) for s in self.seeds]

    def ensemble_k_values(self, n_teachers: int) -> tuple[int, ...]:
        """The config's k grid cut to k < every teacher's batch, min(batch, floor(n / T)):
        a function of n and T only (never of how many points certify)."""
        batch = self.config.batch_for(self.dataset.n_train // n_teachers)
        return tuple(self.config.k_values.below(batch))

    def ensemble(self, n_teachers: int, seed: int | None = None,
                 keep: bool = True) -> EnsembleModel:
        """T teachers trained with AGT and certified on the test queries; training seed
        `seed` (default: the first) gives teacher t the seed ENSEMBLE_SEED_STRIDE * seed + t,
        so the ensembles of different seeds share no initialisation. `keep`: memoise it for
        later experiments (teachers' bounds can be large: T x K x parameters)."""
        seed = self.seed if seed is None else int(seed)
        if (n_teachers, seed) in self._ensembles:
            return self._ensembles[(n_teachers, seed)]
        t0 = time.perf_counter()
        ks = self.ensemble_k_values(n_teachers)
        cfg = self.config.replace(k_values=list(ks), seed=ENSEMBLE_SEED_STRIDE * seed)
        ens = train_ensemble(cfg, self.dataset, n_teachers, workers=self.workers,
                             threads=self.threads, progress=self.progress)
        cert = EnsembleCertifier(ens, device=self.device).certify(self.dataset.x_test)
        model = EnsembleModel(ens, cert, Votes.from_certificate(cert), ks,
                              time.perf_counter() - t0)
        if keep:
            self._ensembles[(n_teachers, seed)] = model
        return model

    def ensembles(self, n_teachers: int, keep: bool = True) -> list[EnsembleModel]:
        """One T-teacher ensemble per training seed."""
        return [self.ensemble(n_teachers, s, keep) for s in self.seeds]

    def dpsgd(self, epsilon: float, delta: float, settings: dict, n_seeds: int) -> list:
        """DP-SGD runs (Opacus) of the AGT model that are (epsilon, delta)-DP under the
        experiments' relation, replace-one: DP-SGD's guarantee is add-remove, so each run
        targets (epsilon / 2, delta / (1 + e^(epsilon / 2))), which group privacy turns into
        (epsilon, delta) under replace-one (mechanisms/guarantee.py). Seeds seed .. seed+n-1
        (experiments only)."""
        from agt.baselines.dpsgd import DPSGDConfig, train_dpsgd

        eps_a, delta_a = add_remove_target(epsilon, delta)
        key = (float(epsilon), float(delta), json.dumps(settings, sort_keys=True), n_seeds)
        if key not in self._dpsgd:
            runs = []
            for s in range(n_seeds):
                dp = DPSGDConfig(target_epsilon=eps_a, target_delta=delta_a,
                                 seed=self.seed + s, **settings)   # seeded: experiments only
                runs.append(train_dpsgd(self.config.replace(seed=self.seed + s), self.dataset,
                                        dp, device=self.device,
                                        progress=self.progress))
            self._dpsgd[key] = runs
        return self._dpsgd[key]

    # -- outputs -----------------------------------------------------------------------------
    def experiment_dir(self, name: str) -> Path:
        d = self.out_dir / name
        d.mkdir(parents=True, exist_ok=True)
        return d

    def header(self, name: str) -> dict:
        """Provenance every results.json starts with."""
        cfg = self.config.to_json_dict()
        if cfg.get("pretrained"):
            cfg["pretrained"] = display_path(cfg["pretrained"])
        data = dict(cfg.get("data") or {})
        for key in ("data_dir", "path"):
            if key in data:
                data[key] = display_path(data[key])
        cfg["data"] = data
        return {
            "experiment": name, "dataset": self.plan.dataset, "quick": self.plan.quick,
            "seed": self.seed, "training_seeds": list(self.seeds), "agt_version": __version__,
            "owner_only": "research output on the owner's data (accuracies, radii and bound "
                          "statistics of the trained models): not a private release; every "
                          "simulated release in it went through an in-memory ledger",
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "settings": self.plan.to_json_dict()["settings"].get(name),
            "plan_file": display_path(self.plan.path),
            "train_config": cfg, "train_config_file": display_path(self.plan.train_config),
            "train_config_overrides": self.prepared.config_overrides,
            "data": self.prepared.info,
        }

    def write_results(self, name: str, payload: dict) -> Path:
        path = self.experiment_dir(name) / "results.json"
        body = {**self.header(name), **payload}
        return atomic_write(path, lambda p: p.write_text(dumps(to_jsonable(body)) + "\n"))

    def write_table(self, name: str, markdown: str) -> Path:
        path = self.experiment_dir(name) / "table.md"
        return atomic_write(path, lambda p: p.write_text(markdown.rstrip() + "\n"))


def add_remove_target(epsilon: float, delta: float) -> tuple[float, float]:
    """The add-remove (eps_a, delta_a) whose replace-one conversion is within (eps, delta)."""
    eps_a = epsilon / 2.0
    # below the conversion's padding (mechanisms/guarantee.py pads up by 1e-15 and an ulp)
    delta_a = math.nextafter(delta / (1.0 + math.exp(eps_a)) * (1.0 - 1e-14), 0.0)
    g = Guarantee(eps_a, delta_a, ADD_REMOVE, "dp-sgd").in_relation(RELATION)
    if g.epsilon > epsilon or g.delta > delta:
        raise AssertionError("internal: DP-SGD target does not convert within the budget")
    return eps_a, delta_a


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def pm(mean: float, std: float, digits: int = 3) -> str:
    return f"{mean:.{digits}f} ± {std:.{digits}f}"
