"""Training settings and a release chosen on public data: the library behind ``agt tune``.

Given public records of the private task's shape (or a public surrogate, an npz the owner
names), a training config template (a YAML like configs/blobs.yaml) and the planned release
(B queries within a total (eps, delta) under one neighbouring relation), `tune` picks the
training settings (learning rate, epochs, clipping gamma, batch size, k grid, bound method)
and the mechanism that maximise the *expected released accuracy* at that budget, and
`tuned_config_text` writes the template with those settings (a config `agt train` takes).

The rule, in the order it runs:

1. Candidates. The template's own settings first, then every combination of the search
   space (`search_space`: a preset scales the template's learning rate, epochs and clipping
   gamma by fixed factors; ``overrides`` give absolute values of any tunable key). Under
   bound method stability the clamp never acts (clip_gamma = max(R, 1, template gamma)) and
   the boxes of k >= 1 are the balls' (``k_boxes: ball``), as in the trade-off study. A
   candidate the config validation refuses stays in the table with its reason.
2. Releases. Every per-query mechanism for a single model with an exact law
   (`MECHANISMS_TRIED`) that the task admits (binary-only ones need two classes; (eps,
   delta) ones need delta_total > 0), calibrated to the budget by
   `experiments.public_tuning.budgeted_mechanism`: the largest per-query (eps, delta) whose
   B-fold composition fits (standard composition at delta = 0, else the better of standard
   and advanced). Sessions (svt) are left out: their accuracy depends on the query order.
3. The k grid ``auto``: contiguous 0..K with K the smallest radius at which a tried
   release gives the certified answer with probability >= 0.99 by its own law
   (`auto_k_max`), capped by ``max_k`` and below the batch size: a larger grid costs
   training time and raises that release's score by under 0.01.
4. Public split. The public records (training and labelled test splits of the npz pooled)
   are permuted by a generator seeded with (seed, split index); the first
   ceil(validation_fraction * n) records are the public validation part, the rest (in file
   order, since AGT batches by record index) the public training part. ``splits`` such
   permutations.
5. Score. Each valid candidate trains on each public training part and certifies the
   validation part (given the private set's size N, a full-batch candidate's radii are
   extrapolated from the public part's size to N, `extrapolated_radius`); each release is
   scored by `experiments.public_tuning.score_release` (its exact expected accuracy on the
   validation labels), through
   `experiments.public_tuning.release_scores`, the function the trade-off study's tuning
   uses too. A (candidate, mechanism) pair's score is its mean over the splits; the best
   pair wins, ties to the earlier one (`experiments.public_tuning.choose`).

Nothing here reads the private data: the template's ``data`` section is carried into the
written config untouched (relative paths made absolute), never opened. The choice is a
function of the public records, the template and the budget only, so it is public too; the
radii behind the scores are radii of models trained on public records.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import yaml

from agt.config import TrainConfig, config_from_dict
from agt.data import load_dataset
from agt.data.dataset import Dataset, validate_dataset
from agt.errors import AGTError, ConfigError, DataError, SoundnessError
from experiments.accuracy import RELATION
from experiments.public_tuning import (
    BudgetedRelease,
    budgeted_mechanism,
    choose,
    grid,
    release_scores,
)
from mechanisms import RELATIONS, Certified, Source

#: the settings the search may change
TUNABLE = ("learning_rate", "n_epochs", "clip_gamma", "batch_size", "k_values", "bound_method")
#: per-query releases of one model with an exact law, in the order ties are broken
MECHANISMS_TRIED = ("exp-radius", "ss-argmax", "ptr", "gs", "ss-cauchy", "ss-laplace")
#: presets: factors applied to the template's learning rate, epochs and clipping gamma
SPACES: dict[str, dict[str, tuple[float, ...]]] = {
    "small": {"learning_rate": (0.5, 1.0, 2.0), "clip_gamma": (0.5, 1.0, 2.0)},
    "default": {"learning_rate": (0.25, 1.0, 4.0), "n_epochs": (1.0, 3.0),
                "clip_gamma": (0.25, 1.0, 4.0)},
}
#: the probability with which the auto k grid's largest radius gives the certified answer
AUTO_K_CONFIDENCE = 0.99
MAX_K = 199


@dataclass(frozen=True)
class ReleaseBudget:
    """The planned release: B queries within a total (eps, delta) under one relation."""

    queries: int
    epsilon_total: float
    delta_total: float = 0.0
    relation: str = RELATION

    def validate(self) -> None:
        """Raise ConfigError naming the first impossible value."""
        if isinstance(self.queries, bool) or not isinstance(self.queries, (int, np.integer)) \
                or self.queries < 1:
            raise ConfigError(f"the number of queries B must be an integer >= 1, got "
                              f"{self.queries!r}")
        if not (math.isfinite(self.epsilon_total) and self.epsilon_total > 0):
            raise ConfigError(f"epsilon_total must be a finite number > 0, got "
                              f"{self.epsilon_total!r}")
        if not 0 <= self.delta_total < 1:
            raise ConfigError(f"delta_total must be in [0, 1), got {self.delta_total!r}")
        if self.relation not in RELATIONS:
            raise ConfigError(f"relation must be one of {', '.join(RELATIONS)}, got "
                              f"{self.relation!r}")


@dataclass(frozen=True)
class TuneResult:
    """The choice and every candidate's scores.

    ``settings``: the chosen candidate's values of the tunable keys (empty: the template's
    own); ``mechanism`` with its per-query ``epsilon``, ``delta`` and ``accountant``;
    ``score``: its expected released accuracy on the public validation parts (mean over the
    splits); ``config``: the template with the settings; ``candidates``: one row per
    candidate (``settings``, ``scores`` {mechanism: mean or None}, ``per_split``,
    ``best_mechanism``, ``score``, ``error``); ``split``: how the public data was divided.
    """

    settings: dict
    mechanism: str
    epsilon: float
    delta: float
    accountant: str
    score: float
    config: TrainConfig
    candidates: list[dict]
    split: dict
    budget: ReleaseBudget
    criterion: str = ""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """A JSON-ready mapping (the ``--json`` output of ``agt tune``)."""
        return {"chosen": {"settings": self.settings, "mechanism": self.mechanism,
                           "epsilon_per_query": self.epsilon, "delta_per_query": self.delta,
                           "accountant": self.accountant, "score": self.score},
                "budget": {"queries": self.budget.queries,
                           "epsilon_total": self.budget.epsilon_total,
                           "delta_total": self.budget.delta_total,
                           "relation": self.budget.relation},
                "criterion": self.criterion, "split": self.split,
                "candidates": self.candidates, "notes": self.notes}


# -- public data --------------------------------------------------------------------------

def load_public(path: str | Path) -> Dataset:
    """The public records of an npz (keys as `agt.data.npz`: ``x_train``/``y_train`` and,
    if present, ``x_test``/``y_test``), both splits pooled into one training split.

    Args:
        path: the public npz (public records of the private task's shape, or a surrogate).

    Returns:
        A dataset whose training split holds every labelled record (no test split).

    Raises:
        ConfigError, DataError: the file is missing or not a valid labelled npz.
    """
    ds = load_dataset("npz", {"path": str(path)})
    xs, ys = [ds.x_train], [ds.y_train]
    if ds.x_test is not None and ds.y_test is not None and ds.n_test:
        xs.append(ds.x_test)
        ys.append(ds.y_test)
    return validate_dataset(Dataset("public", np.concatenate(xs), np.concatenate(ys), None,
                                    None, ds.n_classes, {"source": str(path)}))


def split_public(public: Dataset, validation_fraction: float, seed: int,
                 split: int) -> Dataset:
    """One public train / validation division (module docstring, step 4).

    Args:
        public: the pooled public records (`load_public`).
        validation_fraction: the share of records held out for validation, in (0, 1).
        seed: the tuning's seed.
        split: the division's index.

    Returns:
        A dataset whose training split is the public training part (file order) and whose
        test split is the validation part.

    Raises:
        ConfigError: either part would be empty.
    """
    if not 0 < validation_fraction < 1:
        raise ConfigError(f"validation_fraction must be in (0, 1), got {validation_fraction!r}")
    n = public.n_train
    n_val = math.ceil(validation_fraction * n)
    if n_val < 1 or n - n_val < 2:
        raise ConfigError(f"the public data has {n} records: too few to hold out "
                          f"{validation_fraction:g} for validation and train on the rest "
                          f"(at least 3 needed)")
    order = np.random.default_rng(np.random.SeedSequence([int(seed), int(split)])).permutation(n)
    val, tr = order[:n_val], np.sort(order[n_val:])
    return validate_dataset(Dataset(f"public-split-{split}", public.x_train[tr],
                                    public.y_train[tr], public.x_train[val],
                                    public.y_train[val], public.n_classes,
                                    {"split": int(split), "seed": int(seed)}))


# -- the search space -----------------------------------------------------------------------

def search_space(template: TrainConfig, preset: str = "small",
                 overrides: Mapping[str, Sequence] | None = None,
                 input_norm_bound: float | None = None) -> dict[str, list]:
    """The candidate values of each tunable key.

    Args:
        template: the config whose settings the preset scales.
        preset: ``small`` or ``default`` (`SPACES`), or ``none`` (overrides only).
        overrides: {key: [absolute values]} replacing the preset's list for that key
            (``k_values`` may list ``auto`` and grid specs; ``batch_size`` ``full``).
        input_norm_bound: a declared L2 bound on every record (public, never read off the
            data); with a linear-head template it adds bound method ``stability``.

    Returns:
        {key: [values]} in the order the grid combines them; ``k_values`` defaults to
        ``["auto"]``, ``bound_method`` to the template's (and ``stability`` where the
        template is a linear head and `input_norm_bound` is given).

    Raises:
        ConfigError: an unknown preset or key, or an empty list.
    """
    if preset not in (*SPACES, "none"):
        raise ConfigError(f"unknown search space {preset!r}; choose one of "
                          f"{', '.join((*SPACES, 'none'))}")
    space: dict[str, list] = {}
    for key, factors in SPACES.get(preset, {}).items():
        base = getattr(template, key)
        if key == "n_epochs":
            space[key] = sorted({max(1, round(base * f)) for f in factors})
        else:
            space[key] = [float(base * f) for f in factors]
    space["k_values"] = ["auto"]
    methods = [template.bound_method]
    linear_head = len(template.model.layers) == 1 and template.model.layers[0].kind == "linear"
    if template.bound_method != "stability" and linear_head and input_norm_bound is not None:
        methods.append("stability")
    space["bound_method"] = methods
    for key, values in (overrides or {}).items():
        if key not in TUNABLE:
            raise ConfigError(f"cannot tune {key!r}; tunable keys: {', '.join(TUNABLE)}")
        values = list(values)
        if not values:
            raise ConfigError(f"the search space of {key} is empty; give at least one value")
        space[key] = values
    return space


def parse_override(text: str) -> tuple[str, list]:
    """``KEY=V1,V2,...`` as (key, values): numbers become int or float, ``full`` and grid
    specs (``0..50``; separate several with ``;``) stay strings.

    Args:
        text: one ``--grid`` value.

    Returns:
        The key and its values.

    Raises:
        ConfigError: no ``=``, an unknown key or an empty list.
    """
    key, sep, rest = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise ConfigError(f"--grid wants KEY=V1,V2 (e.g. learning_rate=0.5,2), got {text!r}")
    if key not in TUNABLE:
        raise ConfigError(f"--grid: cannot tune {key!r}; tunable keys: {', '.join(TUNABLE)}")
    parts = rest.split(";") if key == "k_values" else rest.split(",")
    values: list = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if key in ("k_values", "bound_method"):
            values.append(part)
            continue
        if key == "batch_size" and part == "full":
            values.append(part)
            continue
        try:
            values.append(int(part) if key in ("n_epochs", "batch_size") else float(part))
        except ValueError:
            raise ConfigError(f"--grid {key}: {part!r} is not a number") from None
    if not values:
        raise ConfigError(f"--grid {key}: give at least one value")
    return key, values


def auto_k_max(releases: Mapping[str, BudgetedRelease], n_classes: int, cap: int) -> int:
    """The largest k of the ``auto`` grid (module docstring, step 3).

    Args:
        releases: the calibrated releases that will be scored.
        n_classes: C.
        cap: the largest k allowed (``max_k``, and below the batch size).

    Returns:
        The smallest radius r <= cap at which some release that spends radii gives the
        certified answer with probability >= `AUTO_K_CONFIDENCE` (by its exact law); `cap`
        where none reaches it. Releases that need a larger radius are scored on the same
        grid: below that radius they are behind the one that reached it.
    """
    radius = np.arange(cap + 1, dtype=np.int64)
    probe = Certified(np.zeros(cap + 1, dtype=np.int64), radius, int(n_classes),
                      Source("auto k grid", "none", RELATIONS, True))
    need = cap
    for planned in releases.values():
        mech = planned.mechanism
        if mech.max_classes is not None and n_classes > mech.max_classes:
            continue
        if not mech.uses_radii:
            continue
        p = mech.correct_probability(probe, np.zeros(cap + 1, dtype=np.int64))
        hits = np.flatnonzero(p >= AUTO_K_CONFIDENCE)
        if hits.size:
            need = min(need, int(hits[0]))
    return need


def grid_spec(values: Sequence[int]) -> str:
    """A k grid as its shortest spec: runs of consecutive values as ``a..b``."""
    values = sorted(int(v) for v in values)
    parts, start = [], values[0]
    for prev, cur in zip(values, values[1:] + [None]):
        if cur is None or cur != prev + 1:
            parts.append(str(start) if prev == start else f"{start}..{prev}")
            start = cur
    return ",".join(parts)


def _candidate_raw(template: TrainConfig, cand: dict, k_auto: Callable[[Any], int],
                   norm_bound: float | None) -> dict:
    """The template's mapping with a candidate's values (k grid resolved, bound method's
    companion keys set or removed)."""
    raw = {k: v for k, v in template.raw.items() if k != "data"}
    raw.update({k: v for k, v in cand.items() if k != "k_values"})
    if "k_values" in cand:
        k = cand["k_values"]
        raw["k_values"] = f"0..{k_auto(raw.get('batch_size', 'full'))}" if k == "auto" else k
    if raw.get("bound_method") == "stability":
        if template.bound_method != "stability" and norm_bound is not None:
            bias = template.model.layers[0].bias
            raw["input_norm_bound"] = float(norm_bound)
            raw["clip_gamma"] = max(float(norm_bound), 1.0 if bias else 0.0,
                                    float(template.clip_gamma))
            raw["k_boxes"] = "ball"
    elif template.bound_method == "stability":
        for key in ("input_norm_bound", "clip_norm", "k_boxes"):
            raw.pop(key, None)
    return raw


def _label(settings: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in settings.items()) or "the template's settings"


# -- the search ------------------------------------------------------------------------------

def tune(public: Dataset, template: TrainConfig, budget: ReleaseBudget, *,
         space: Mapping[str, Sequence] | None = None, splits: int = 2,
         validation_fraction: float = 0.25, seed: int = 0, max_k: int = MAX_K,
         input_norm_bound: float | None = None, private_records: int | None = None,
         device: str = "cpu", progress: bool = False) -> TuneResult:
    """Choose the training settings and the release with the best expected released
    accuracy on public data (module docstring).

    Args:
        public: the pooled public records (`load_public`); never the private data.
        template: the training config whose model, loss and other keys are kept.
        budget: B, the total (eps, delta) and the relation of the planned release.
        space: {key: [values]} (`search_space`; default the ``small`` preset).
        splits: public train / validation divisions each candidate is scored on.
        validation_fraction: the share of public records held out for validation.
        seed: seeds the divisions.
        max_k: the largest k an ``auto`` grid may reach.
        input_norm_bound: the declared input domain of ``stability`` candidates (public).
        private_records: N, the private training set's size (public in the threat model:
            every guarantee is stated for it); given, the auto grid is sized for N and the
            radii of full-batch candidates are extrapolated from the public training part's
            size to N (`extrapolated_radius`); None scores the radii as certified.
        device: where candidates train and certify.
        progress: draw a progress bar over the trainings.

    Returns:
        The choice, every candidate's scores and the tuned config (`TuneResult`).

    Raises:
        ConfigError: a bad budget, space or split, or no candidate that any release can
            score (every row of the table says why).
        DataError: the public data does not fit the template's model.
    """
    from tqdm.auto import tqdm

    budget.validate()
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise ConfigError(f"splits must be an integer >= 1, got {splits!r}")
    if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 0:
        raise ConfigError(f"max_k must be an integer >= 0, got {max_k!r}")
    if private_records is not None and (isinstance(private_records, bool) or not isinstance(
            private_records, (int, np.integer)) or private_records < 2):
        raise ConfigError(f"private_records must be an integer >= 2, got {private_records!r}")
    c = int(public.n_classes)
    try:
        model_classes = template.model.with_input_shape(public.feature_shape).n_classes
    except ConfigError as exc:
        raise DataError(f"the public records (feature shape {public.feature_shape}) do not "
                        f"fit the template's model: {exc}") from None
    if c > model_classes:
        raise DataError(f"the public labels have {c} classes but the template's model "
                        f"predicts {model_classes}; is this public data of the same task?")
    c = model_classes
    if public.n_classes != c:       # a class the public records lack is still a class
        public = validate_dataset(dataclasses.replace(public, n_classes=c))
    space = dict(space if space is not None else search_space(template))
    releases = {}
    for name in MECHANISMS_TRIED:
        planned = _try_budget(name, budget)
        if planned is None:
            continue
        mech = planned.mechanism
        if mech.max_classes is not None and c > mech.max_classes:
            continue
        releases[name] = planned
    if not releases:
        raise ConfigError("no release mechanism fits this budget and task")
    parts = [split_public(public, validation_fraction, seed, i) for i in range(splits)]
    n_train = min(p.n_train for p in parts)

    n_target = n_train if private_records is None else int(private_records)

    def k_auto(batch_size) -> int:
        batch = n_target if batch_size == "full" else min(int(batch_size), n_target)
        return auto_k_max(releases, c, max(0, min(max_k, batch - 1)))

    combos = [{}] + grid(space)
    rows, configs, seen = [], [], set()
    for cand in combos:
        settings = {k: v for k, v in cand.items()
                    if k == "k_values" or getattr(template, k, None) != v}
        raw = _candidate_raw(template, cand, k_auto, input_norm_bound)
        key = yaml.safe_dump(raw, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        row = {"candidate": len(rows), "settings": settings,
               "resolved": {k: grid_spec(v) if k == "k_values" and isinstance(v, list) else v
                            for k, v in raw.items() if k in TUNABLE}, "scores": {},
               "per_split": {}, "best_mechanism": None, "score": None, "error": None}
        try:
            cfg = config_from_dict(raw)
            configs.append(cfg)
            row["resolved"] = {k: grid_spec(cfg.k_values) if k == "k_values" else
                               getattr(cfg, k) for k in TUNABLE}
        except ConfigError as exc:
            configs.append(None)
            row["error"] = str(exc).splitlines()[0]
        rows.append(row)
    mechs = {name: planned.mechanism for name, planned in releases.items()}
    bar = tqdm(total=sum(cfg is not None for cfg in configs) * splits, desc="agt tune",
               unit="training", disable=not progress)
    try:
        for row, cfg in zip(rows, configs):
            if cfg is None:
                continue
            per_split: dict[str, list] = {name: [] for name in mechs}
            try:
                run, radius_map = _public_run(cfg, n_train, private_records)
                for part in parts:
                    scores = release_scores(run.replace(device=device), part, mechs,
                                            relation=budget.relation, device=device,
                                            radius_map=radius_map)
                    for name, s in scores.items():
                        per_split[name].append(s)
                    bar.update(1)
            except AGTError as exc:      # this candidate cannot train here: say why
                if isinstance(exc, SoundnessError):     # a broken bound is never a row
                    raise
                row["error"] = str(exc).splitlines()[0]
                continue
            row["per_split"] = {n: v for n, v in per_split.items() if None not in v}
            row["scores"] = {n: (float(np.mean(v)) if None not in v else None)
                             for n, v in per_split.items()}
            scored = {n: s for n, s in row["scores"].items() if s is not None}
            if scored:
                best = max(scored, key=scored.get)       # ties: the earlier mechanism
                row["best_mechanism"], row["score"] = best, scored[best]
    finally:
        bar.close()
    pairs = [{"candidate": row["candidate"], "mechanism": name}
             for row in rows for name in row["per_split"]]
    if not pairs:
        reasons = "; ".join(sorted({r["error"] for r in rows if r["error"]})) or \
            "no release holds under the relation for any candidate"
        raise ConfigError(f"no candidate could be scored ({reasons})")
    by_id = {row["candidate"]: row for row in rows}
    criterion = (f"expected released accuracy (exact law) at B = {budget.queries}, total "
                 f"(eps, delta) = ({budget.epsilon_total:g}, {budget.delta_total:g}), "
                 f"{budget.relation}, on the public validation parts; mean over {splits} "
                 f"split(s)")
    pick = choose(pairs, lambda p: by_id[p["candidate"]]["per_split"][p["mechanism"]],
                  criterion)
    chosen = by_id[pick.chosen["candidate"]]
    mech_name = pick.chosen["mechanism"]
    planned = releases[mech_name]
    config = configs[chosen["candidate"]]
    config = config.replace(**({"data": template.raw["data"]} if "data" in template.raw
                               else {}))
    notes = []
    if private_records is not None:
        notes.append(f"radii of full-batch candidates extrapolated from {n_train} public "
                     f"training records to {private_records} private ones (an estimate)")
    elif n_train < 100:
        notes.append(f"the public training part has {n_train} records; radii grow with the "
                     f"training set's size, so the scores are pessimistic for a larger "
                     f"private set")
    split_info = {"records": public.n_train, "train": n_train,
                  "validation": parts[0].n_test, "splits": splits, "seed": seed,
                  "rule": "records of the public npz (train and labelled test splits pooled) "
                          "permuted by a generator seeded with (seed, split index); the first "
                          "ceil(fraction * n) validate, the rest train in file order",
                  "validation_fraction": validation_fraction}
    return TuneResult(chosen["settings"], mech_name, planned.epsilon, planned.delta,
                      planned.accountant, float(np.mean(chosen["per_split"][mech_name])),
                      config, rows, split_info, budget, criterion, notes)


def extrapolated_radius(radius: np.ndarray, scale: float, grid: Sequence[int]) -> np.ndarray:
    """Radii certified on a contiguous grid with n training records, extrapolated to a
    training set of scale * n records and to `grid`.

    Under full-batch training the k replaced records move the batch mean by at most
    2 k gamma / N per coordinate, so the same settings on scale times the records stand k
    about scale times larger at equal effect: k* -> floor(scale * k*), then the grid index of
    the largest grid value <= that k (certificates nest, so every smaller value holds too).
    An estimate for scoring, not a certificate: the radii `agt certify` gives after
    training are the ones that count.

    Args:
        radius: certified radii on a contiguous grid 0..K (= k*; -1: not even k = 0).
        scale: N_private / n_public.
        grid: the private config's k grid (ascending, from 0).

    Returns:
        The extrapolated grid indices (-1 stays -1).
    """
    radius = np.asarray(radius, dtype=np.int64)
    k_star = np.floor(np.maximum(radius, 0) * float(scale)).astype(np.int64)
    index = np.searchsorted(np.asarray(grid, dtype=np.int64), k_star, side="right") - 1
    return np.where(radius < 0, -1, index)


def _public_run(cfg: TrainConfig, n_public: int, private_records: int | None):
    """The config a candidate trains on the public parts and the map of its radii: itself
    and None, or, given the private set's size and a full batch, the contiguous grid that
    reaches the private grid's largest k after extrapolation (`extrapolated_radius`)."""
    if private_records is None or not cfg.full_batch:
        return cfg, None
    scale = private_records / n_public
    grid = tuple(cfg.k_values)
    k_pub = max(0, min(n_public - 1, math.ceil(grid[-1] / scale)))
    return cfg.replace(k_values=f"0..{k_pub}"), (
        lambda radius: extrapolated_radius(radius, scale, grid))


def _try_budget(name: str, budget: ReleaseBudget) -> BudgetedRelease | None:
    """`budgeted_mechanism`, or None where the mechanism needs a delta the budget lacks."""
    from mechanisms import MECHANISMS

    if MECHANISMS[name].needs_delta and budget.delta_total == 0:
        return None
    return budgeted_mechanism(name, budget.epsilon_total, budget.delta_total, budget.queries)


# -- the written config ----------------------------------------------------------------------

def tuned_config_text(result: TuneResult, template_path: str | Path, out_path: str | Path,
                      public_path: str | Path) -> str:
    """The YAML of the tuned config: the template's keys with the chosen settings, its
    ``data`` section unchanged except that relative paths become absolute (they resolved
    against the template's folder), and comments saying how it was chosen.

    Args:
        result: `tune`'s result.
        template_path: the template YAML (for its folder).
        out_path: where the text will be written (named in the header).
        public_path: the public npz (named in the header).

    Returns:
        The YAML text; `agt.config.load_config` reads it back into ``result.config``.
    """
    base = Path(template_path).resolve().parent
    raw = dict(result.config.raw)
    data = raw.get("data")
    if isinstance(data, Mapping):
        data = dict(data)
        for key in ("path", "data_dir"):
            value = data.get(key)
            if isinstance(value, str) and value and not Path(value).expanduser().is_absolute():
                data[key] = os.path.normpath(base / Path(value).expanduser())
        raw["data"] = data
    raw["k_values"] = grid_spec(result.config.k_values)
    b = result.budget
    header = [
        f"# Written by agt tune from {Path(template_path).name}: settings chosen on the "
        f"public data {Path(public_path).name}, never on the private data.",
        f"# Planned release: B = {b.queries} queries, total (eps, delta) = "
        f"({b.epsilon_total:g}, {b.delta_total:g}), {b.relation}.",
        f"# Chosen: {_label(result.settings)}.",
        f"# Release: {result.mechanism} at per-query (eps, delta) = ({result.epsilon:.6g}, "
        f"{result.delta:.3g}) ({result.accountant} composition); expected released "
        f"accuracy {result.score:.4f} on the public validation parts.",
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(raw, sort_keys=False,
                                                     default_flow_style=None)
