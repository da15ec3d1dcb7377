"""Hyperparameters of the trade-off study's AGT and DP-SGD rows, chosen on public data only.

The study must not choose a hyperparameter by accuracy on the private digits (the guide's rule:
no guarantee covers such a choice). The AGT model (learning rate, epochs, clipping) and DP-SGD
(learning rate) still need settings. The rule here:

1. Build a *surrogate*: synthetic records of the private set's public shape (number of
   training and test records, features, classes, the public pixel range), drawn from a seeded
   generator that never reads the private data (`surrogate_like`). Only sizes and the
   declared range are taken from the dataset; both are public in the study's threat model (the
   querier knows the input format, and N is what every guarantee is stated for).
2. Score every candidate of a fixed grid on the surrogate with the criterion the study cares
   about: for AGT, the exact expected accuracy of the `exp-radius` release on the surrogate's
   test queries at the plan's total epsilon over B queries (delta = 0); for DP-SGD, the
   surrogate test accuracy at the plan's (epsilon, delta).
3. Take the best score; ties go to the earlier candidate in grid order.

Every candidate's score lands in results.json, so a reader sees the whole grid, not only the
winner. The surrogate generator: C class prototypes whose pixels are "ink" (the top of the
range) with probability `ink` and background otherwise; a record copies its class prototype
and replaces each pixel, with probability `noise`, by a uniform draw over the range. The two
constants were fixed before any score was read, aiming at a task a linear model solves
imperfectly (about 0.9 accuracy on the 10-class surrogate); they are not fitted to the digits.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from agt.data.dataset import Dataset, validate_dataset

INK = 0.3          # a prototype pixel is ink with this probability
NOISE = 0.7        # a record pixel is redrawn uniformly over the range with this probability


def surrogate_like(ds: Dataset, seed: int, *, ink: float = INK,
                   noise: float = NOISE) -> Dataset:
    """A synthetic dataset with the public shape of `ds` (sizes, classes, feature range).

    Reads only ds.n_train, ds.n_test, the feature count, ds.n_classes and
    ds.meta["feature_range"]; never a record or a label of `ds`."""
    low, high = (float(v) for v in ds.meta["feature_range"])
    d = int(np.prod(ds.feature_shape))
    c = int(ds.n_classes)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5EED]))
    prototypes = np.where(rng.random((c, d)) < ink, high, low)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, c, n)
        x = prototypes[y].copy()
        redraw = rng.random((n, d)) < noise
        x[redraw] = rng.uniform(low, high, int(redraw.sum()))
        return x, y

    x_tr, y_tr = draw(ds.n_train)
    x_te, y_te = draw(ds.n_test)
    meta = {"task": ds.meta.get("task"), "feature_range": [low, high],
            "source": f"public surrogate (seed {seed}, ink {ink}, noise {noise})"}
    return validate_dataset(Dataset(f"surrogate-of-{ds.name}", x_tr, y_tr, x_te, y_te, c,
                                    meta))


def grid(spec: dict) -> list[dict]:
    """Every combination of a {key: [values]} grid, in the order the values are listed."""
    keys = list(spec)
    for k in keys:
        if not isinstance(spec[k], (list, tuple)) or not spec[k]:
            raise ValueError(f"tuning grid {k!r} must be a non-empty list, got {spec[k]!r}")
    return [dict(zip(keys, combo)) for combo in itertools.product(*(spec[k] for k in keys))]


@dataclass(frozen=True)
class Choice:
    """The chosen candidate and every candidate's score (grid order)."""

    chosen: dict
    table: list[dict]
    criterion: str

    def as_dict(self) -> dict:
        return {"chosen": self.chosen, "criterion": self.criterion, "candidates": self.table}


def choose(candidates: list[dict], score, criterion: str) -> Choice:
    """Score each candidate (score(candidate) -> float); best wins, ties to the first."""
    table = []
    best, best_score = None, -math.inf
    for cand in candidates:
        s = float(score(cand))
        table.append({**cand, "score": s})
        if s > best_score:
            best, best_score = cand, s
    return Choice(dict(best), table, criterion)
