"""Accuracy of private releases: exact expectations and simulated deployments.

Every mechanism object knows the exact probability that its release equals a given label
(`Mechanism.correct_probability`); the expected accuracy over the queries is the mean of
those per-query probabilities, an exact number without Monte Carlo error. The laws and the
simulated release live in mechanisms/expectation.py (release plans use them too).

The sampled accuracies simulate deployments: each draw releases the queries through a fresh
in-memory `Ledger` (the one door of mechanisms/ledger/) of the experiment's relation,
bound to the private dataset, with exactly the budget the released queries compose to under
standard composition (Renyi composition, in an rdp ledger, for gnmax and
confident-gnmax), and with a seeded experiment generator (recorded as insecure in the
ledger). So no experiment draws noise outside the ledger, and the recorded cost and the
drawn noise come from the same mechanism object. Their mean over repeats matches the
expectation up to sampling error; their spread is what the paper's error bands show.

Every comparison is under one neighbouring relation, replace-one (`RELATION`): ensembles
certify only replace-one, full-batch single models certify it too, and DP-SGD's add-remove
guarantee converts (experiments/context.py).
"""

from __future__ import annotations

import numpy as np

from mechanisms import REPLACE_ONE, Mechanism
from mechanisms.expectation import expected_accuracy, simulate

RELATION = REPLACE_ONE


__all__ = ["RELATION", "expected_accuracy", "simulate", "sampled_accuracy", "mean_std",
           "evaluate", "evaluate_seeds"]


def sampled_accuracy(mechanism: Mechanism, inputs, y: np.ndarray, rngs) -> list[float]:
    """Accuracy of one simulated deployment per generator."""
    return [float(np.mean(simulate(mechanism, inputs, rng, RELATION) == y)) for rng in rngs]


def mean_std(values) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std())


def evaluate(mechanism: Mechanism, inputs, y: np.ndarray, rngs) -> dict:
    """{"expected", "sampled", "sampled_mean", "sampled_std"} of one mechanism."""
    draws = sampled_accuracy(mechanism, inputs, y, rngs)
    m, sd = mean_std(draws)
    return {"expected": expected_accuracy(mechanism, inputs, y), "sampled_mean": m,
            "sampled_std": sd, "sampled": draws}


def evaluate_seeds(mechanism: Mechanism, inputs_by_seed, y: np.ndarray, rngs) -> dict:
    """One mechanism over the models of every training seed: the exact expected accuracy per
    seed, its mean and std over seeds (what the tables and plots show), and the simulated
    deployments of the first seed's model (a check of the exact numbers)."""
    first = evaluate(mechanism, inputs_by_seed[0], y, rngs)
    by_seed = [first["expected"]] + [expected_accuracy(mechanism, i, y)
                                     for i in inputs_by_seed[1:]]
    m, sd = mean_std(by_seed)
    return {"expected": m, "expected_std": sd, "expected_by_seed": by_seed,
            "sampled_mean": first["sampled_mean"], "sampled_std": first["sampled_std"],
            "sampled": first["sampled"]}
