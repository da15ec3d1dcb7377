"""Hyperparameters of the trade-off study's AGT and DP-SGD rows, chosen on public data only.

The study must not choose a hyperparameter by accuracy on the private digits (the guide's rule:
no guarantee covers such a choice). The AGT model (learning rate, epochs, clipping) and DP-SGD
(learning rate) still need settings. The rule here:

1. Build *surrogates*: synthetic records of the private set's public shape (`PublicShape`:
   numbers of training and test records, features, classes, and the declared pixel range),
   drawn from seeded generators. The code is given the shape record only, never the
   dataset, so no record or label can reach the choice. The shape is public in the study's
   threat model (the querier knows the input format; N is what every guarantee is stated for).
2. Score every candidate of a fixed grid on each surrogate seed with the criterion the study
   cares about: for AGT, the exact expected accuracy of the `exp-radius` release on the
   surrogate's test queries, averaged over the plan's total epsilons x inference budgets
   (delta = 0); for DP-SGD, the surrogate test accuracy at the plan's (epsilon, delta).
3. Take the best mean score over the surrogate seeds; ties go to the earlier candidate.

Every candidate's per-seed scores land in results.json and summary.md, so a reader sees the
whole grid, not only the winner. The surrogate generator: C class prototypes whose pixels
are "ink" (the top of the range) with probability `ink` and background otherwise; a record
copies its class prototype and replaces each pixel, with probability `noise`, by a uniform
draw over the range.

What this does not make independent of the digits (said in docs/results.md too): the grid ranges
and the two generator constants were set after earlier probes that had looked at digits test
accuracy (the constants aim at a linear accuracy of about 0.9 on the 10-class surrogate,
which is close to the digits' own). The choice *within* the grid reads no digits data.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from agt.certify import Certifier
from agt.config import TrainConfig
from agt.data.dataset import Dataset, validate_dataset
from agt.errors import ConfigError, DataError, PrivacyError
from agt.store import from_result
from agt.training import train
from experiments.accuracy import RELATION, expected_accuracy
from mechanisms import MECHANISMS, Certified, Mechanism, make_mechanism
from mechanisms.accounting import plan_queries

INK = 0.3          # a prototype pixel is ink with this probability
NOISE = 0.7        # a record pixel is redrawn uniformly over the range with this probability


@dataclass(frozen=True)
class PublicShape:
    """What the tuning may know about the private data: sizes, classes, the declared range."""

    n_train: int
    n_test: int
    n_features: int
    n_classes: int
    feature_range: tuple[float, float]
    task: str | None = None

    @staticmethod
    def of(ds: Dataset) -> "PublicShape":
        """The public shape of `ds` (array shapes, class count, meta["feature_range"], and
        the task name the loader was asked for, from meta["options"])."""
        low, high = (float(v) for v in ds.meta["feature_range"])
        task = ds.meta.get("options", {}).get("task", ds.meta.get("task"))
        return PublicShape(ds.n_train, ds.n_test, int(np.prod(ds.feature_shape)),
                           int(ds.n_classes), (low, high), task)


def surrogate_like(shape: PublicShape, seed: int, *, ink: float = INK,
                   noise: float = NOISE) -> Dataset:
    """A synthetic dataset of the given public shape, from a generator seeded by `seed`."""
    low, high = shape.feature_range
    d, c = shape.n_features, shape.n_classes
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5EED]))
    prototypes = np.where(rng.random((c, d)) < ink, high, low)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, c, n)
        x = prototypes[y].copy()
        redraw = rng.random((n, d)) < noise
        x[redraw] = rng.uniform(low, high, int(redraw.sum()))
        return x, y

    x_tr, y_tr = draw(shape.n_train)
    x_te, y_te = draw(shape.n_test)
    meta = {"task": shape.task, "feature_range": [low, high],
            "source": f"public surrogate (seed {seed}, ink {ink}, noise {noise})"}
    return validate_dataset(Dataset("public-surrogate", x_tr, y_tr, x_te, y_te, c, meta))


def grid(spec: dict) -> list[dict]:
    """Every combination of a {key: [values]} grid, in the order the values are listed."""
    keys = list(spec)
    for k in keys:
        if not isinstance(spec[k], (list, tuple)) or not spec[k]:
            raise ValueError(f"tuning grid {k!r} must be a non-empty list, got {spec[k]!r}")
    return [dict(zip(keys, combo)) for combo in itertools.product(*(spec[k] for k in keys))]


@dataclass(frozen=True)
class Choice:
    """The chosen candidate and every candidate's per-seed and mean scores (grid order)."""

    chosen: dict
    table: list[dict]
    criterion: str

    def as_dict(self) -> dict:
        return {"chosen": self.chosen, "criterion": self.criterion, "candidates": self.table}


def choose(candidates: list[dict], scores, criterion: str) -> Choice:
    """scores(candidate) -> one score per surrogate seed; the best mean wins, ties to the
    first candidate."""
    table = []
    best, best_score = None, -math.inf
    for cand in candidates:
        per_seed = [float(v) for v in scores(cand)]
        mean = float(np.mean(per_seed))
        table.append({**cand, "scores": per_seed, "score": mean})
        if mean > best_score:
            best, best_score = cand, mean
    return Choice(dict(best), table, criterion)


@dataclass(frozen=True)
class BudgetedRelease:
    """A mechanism calibrated to a total budget: what each of the B queries (or the session)
    spends, and the accountant that composes them to the total."""

    mechanism: Mechanism
    epsilon: float
    delta: float
    accountant: str


def budgeted_mechanism(name: str, epsilon_total: float, delta_total: float,
                       queries: int) -> BudgetedRelease:
    """`name` calibrated so that `queries` releases stay within (epsilon_total, delta_total).

    Per-query mechanisms get the largest per-query (eps, delta) whose B-fold composition
    fits (`mechanisms.accounting.plan_queries`): standard composition when delta_total = 0,
    the better of standard and advanced composition ("best") when delta_total > 0; an
    (eps, delta) mechanism's per-query delta is delta_total / (2 B). A session (one
    guarantee for all its queries) spends the whole total once.

    Args:
        name: a registered mechanism.
        epsilon_total: the total epsilon over the B queries.
        delta_total: the total delta (0: pure DP).
        queries: B, the number of queries the budget must cover.

    Returns:
        The mechanism, its per-query (or session) epsilon and delta, and the accountant
        (``standard``, ``best`` or ``session``).

    Raises:
        PrivacyError: the mechanism needs delta > 0 and delta_total is 0, or the budget is
            invalid.
        ConfigError: `name` is not registered.
    """
    entry = MECHANISMS.get(name)
    if entry is None:
        raise ConfigError(f"unknown mechanism {name!r}; choose one of "
                          f"{', '.join(sorted(MECHANISMS))}")
    probe = make_mechanism(name, 1.0, 0.5 if entry.needs_delta else None)
    session = not probe.per_query
    accountant = "session" if session else ("standard" if delta_total == 0 else "best")
    eps_q, delta_q = plan_queries(epsilon_total, delta_total, queries, entry.needs_delta,
                                  "standard" if session or delta_total == 0 else "best",
                                  session=session)
    mech = make_mechanism(name, eps_q, delta_q if entry.needs_delta else None)
    return BudgetedRelease(mech, eps_q, delta_q, accountant)


def score_release(mechanism: Mechanism, inputs: Certified, y: np.ndarray) -> float:
    """The score of a release on labelled validation queries: its exact expected accuracy,
    mean_i P(release_i = y_i), from the mechanism's own law (`Mechanism.correct_probability`;
    a refusal counts as wrong). The one place the tuning scores a release: point it at
    another estimate (a release plan) here.

    Args:
        mechanism: the calibrated release.
        inputs: the validation queries' certified predictions and radii.
        y: their labels.

    Returns:
        The expected fraction of correct released labels, in [0, 1].
    """
    return expected_accuracy(mechanism, inputs, y)


def release_scores(config: TrainConfig, data: Dataset, releases: Mapping[str, Mechanism], *,
                   relation: str = RELATION, device: str = "cpu",
                   radius_map: Callable[[np.ndarray], np.ndarray] | None = None
                   ) -> dict[str, float | None]:
    """Train `config` on the training split of `data` (public records), certify its test
    split and score every release on it (`score_release`): the candidate scoring shared by
    the trade-off study's tuning and `agt tune` (experiments/tune.py).

    Args:
        config: the candidate's training config.
        data: public records: the training split trains, the labelled test split scores.
        releases: {label: calibrated mechanism}.
        relation: the neighbouring relation the release must hold under.
        device: where to train and certify.
        radius_map: maps the certified radii before scoring (`experiments.tune` extrapolates
            them to another training-set size); None scores them as certified.

    Returns:
        {label: score}, None where the release cannot serve this model (a binary-only
        mechanism on more classes, radii without a smoothness proof, no guarantee under
        `relation`).
    """
    if data.y_test is None or not data.n_test:
        raise DataError("scoring needs a labelled validation split (x_test, y_test)")
    cert = Certifier(from_result(train(config, data)), device=device).certify(data.x_test)
    inputs = Certified.from_certificate(cert)
    if radius_map is not None:
        inputs = Certified(inputs.prediction, np.asarray(radius_map(inputs.radius), np.int64),
                           inputs.n_classes, inputs.source)
    out: dict[str, float | None] = {}
    for label, mech in releases.items():
        try:
            mech.check(inputs)
            mech.guarantee_for(inputs, relation)
        except (PrivacyError, DataError):
            out[label] = None
            continue
        out[label] = score_release(mech, inputs, data.y_test)
    return out
