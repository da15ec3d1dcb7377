"""What a release is expected to return, before it is drawn: exact laws, or Monte Carlo.

Every mechanism knows the exact probability that its release equals a given label
(`Mechanism.correct_probability`, the law of its noise; a refusal counts as wrong). From it,
for a release of Q queries with answers c_i (the served model's class, or the ensemble's
plurality), true labels y_i and released labels L_i:

    expected agreement  A = (1/Q) sum_i P(L_i = c_i)
    expected accuracy   E = (1/Q) sum_i P(L_i = y_i)
    expected answered   N = (1/Q) sum_i P(L_i != REFUSED) = (1/Q) sum_i sum_y P(L_i = y)

(the last because the release is one of the C classes or a refusal;
`Mechanism.answered_probability`). These are expectations over the noise only: exact up to
the float rounding of the law (and its quadrature where the law is an integral), with no
sampling error.

A stability-gated session (svt, ens-svt) answers its queries in order and its law depends
on that order and on the session's length. `deployments` cuts the query sample into the
sessions of B queries a release of B would run: consecutive chunks of B when the sample
is at least B long (the last one shorter), else the sample repeated in order up to B (the
sample stands for the queries to come). Per-query mechanisms do not depend on the cut.

Monte Carlo (`simulate_expectation`) draws real releases through an in-memory ledger (the
one door, mechanisms/ledger.py) with a given generator and reports the means over draws
with their standard errors: the check of the exact laws, and the law of any mechanism
whose `correct_probability` has no closed form.

Everything here reads owner-only inputs (radii, votes): its results are owner-only too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import ConfigError, DataError
from mechanisms.base import Mechanism
from mechanisms.guarantee import REPLACE_ONE
from mechanisms.inputs import Votes

__all__ = ["Expectation", "expected_accuracy", "answers", "deployments", "expect",
           "simulate", "simulate_expectation"]

EXACT = "exact"
MONTE_CARLO = "monte-carlo"


@dataclass(frozen=True)
class Expectation:
    """Expected fractions of one release (module docstring; owner-only).

    Attributes:
        answered: expected fraction of queries that get a label (not REFUSED).
        agreement: expected fraction released equal to the served model's answer.
        accuracy: expected fraction released equal to the true label; None without labels.
        law: "exact" (closed form) or "monte-carlo".
        standard_error: 0 for an exact law; for Monte Carlo, the largest standard error of
            the three means (the standard deviation over draws / sqrt(draws)).
        draws: Monte Carlo releases drawn (0 for an exact law).
    """

    answered: float
    agreement: float
    accuracy: float | None
    law: str = EXACT
    standard_error: float = 0.0
    draws: int = 0


def expected_accuracy(mechanism: Mechanism, inputs, y: ArrayLike) -> float:
    """Expected accuracy of releasing `inputs` against labels y.

    E = (1/Q) sum_i P(L_i = y_i), from the mechanism's exact law (a refusal counts as wrong).

    Args:
        mechanism: a registry mechanism.
        inputs: its `Certified` or `Votes` inputs (Q queries).
        y: (Q,) labels.

    Returns:
        E in [0, 1].

    Raises:
        DataError: y does not have shape (Q,) or the inputs do not suit the mechanism.
    """
    return float(mechanism.correct_probability(inputs, y).mean())


def answers(inputs) -> NDArray[np.int64]:
    """The answer a release is compared with for its agreement.

    Args:
        inputs: `Certified` (the served model's class) or `Votes` (the plurality of the
            teachers' votes, ties to the smallest class).

    Returns:
        (Q,) int64 classes.
    """
    if isinstance(inputs, Votes):
        from mechanisms.votes import aggregate
        return aggregate(inputs.votes, inputs.n_classes)
    return np.asarray(inputs.prediction, dtype=np.int64)


def deployments(n_sample: int, n_queries: int) -> list[NDArray[np.int64]]:
    """The sessions of `n_queries` queries that a sample of `n_sample` queries stands for.

    Args:
        n_sample: queries in the sample (>= 1).
        n_queries: B, the queries of one release (>= 1).

    Returns:
        Index arrays into the sample: consecutive chunks of B when n_sample >= B (the last
        one shorter when B does not divide it), else one session of the sample repeated in
        order up to B queries.

    Raises:
        ConfigError: a count below 1.
    """
    if n_sample < 1 or n_queries < 1:
        raise ConfigError(f"need at least one query in the sample and in the release, got "
                          f"{n_sample} and {n_queries}")
    if n_sample < n_queries:
        return [np.arange(n_queries) % n_sample]
    return [np.arange(i, min(n_sample, i + n_queries)) for i in range(0, n_sample, n_queries)]


def _per_query_law(mechanism: Mechanism, inputs, target, labels) -> tuple:
    """(answered, agreement, accuracy or None), each (Q,), over the queries of `inputs`."""
    answered = mechanism.answered_probability(inputs)
    agreement = mechanism.correct_probability(inputs, target)
    accuracy = None if labels is None else mechanism.correct_probability(inputs, labels)
    return answered, agreement, accuracy


def expect(mechanism: Mechanism, inputs, labels: ArrayLike | None = None,
           n_queries: int | None = None) -> Expectation:
    """Exact expected answered fraction, agreement and accuracy of a release.

    A per-query mechanism: the means over the sample of the per-query laws (module
    docstring). A session (``mechanism.per_query`` false): the same means over the sessions
    of `deployments(Q, n_queries)`, each a release of its own.

    Args:
        mechanism: a registry mechanism at the per-query (or session) parameters to plan.
        inputs: its `Certified` or `Votes` inputs for the query sample (Q queries).
        labels: optional (Q,) true labels.
        n_queries: B, the queries of one release (default Q); only sessions depend on it.

    Returns:
        An exact `Expectation`.

    Raises:
        DataError: labels of the wrong shape, or inputs the mechanism refuses.
        NotImplementedError: the mechanism has no closed-form law (use
            `simulate_expectation`).
    """
    mechanism.check(inputs)
    q = inputs.n_queries
    y = None if labels is None else _labels(labels, q)
    target = answers(inputs)
    if mechanism.per_query or n_queries in (None, q):
        parts = [_per_query_law(mechanism, inputs, target, y)]
    else:
        parts = [_per_query_law(mechanism, inputs.subset(idx), target[idx],
                                None if y is None else y[idx])
                 for idx in deployments(q, int(n_queries))]
    answered = np.concatenate([p[0] for p in parts])
    agreement = np.concatenate([p[1] for p in parts])
    accuracy = None if y is None else float(np.concatenate([p[2] for p in parts]).mean())
    return Expectation(float(np.clip(answered.mean(), 0.0, 1.0)), float(agreement.mean()),
                       accuracy)


def _labels(labels: ArrayLike, q: int) -> NDArray[np.int64]:
    y = np.asarray(labels)
    if y.shape != (q,) or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"labels must be {q} integer classes (one per query), got shape "
                        f"{y.shape} of {y.dtype}")
    return y.astype(np.int64)


def simulate(mechanism: Mechanism, inputs, rng: np.random.Generator,
             relation: str = REPLACE_ONE) -> NDArray[np.int64]:
    """One real release of `inputs`, drawn through a fresh in-memory ledger.

    The ledger's budget is what the release composes to: standard composition of the
    per-query guarantee (Dwork-Roth Thm 3.16), Renyi composition in an rdp ledger for
    mechanisms with a Renyi curve (gnmax, confident-gnmax), a session's own guarantee.

    Args:
        mechanism: a registry mechanism.
        inputs: its inputs.
        rng: the generator of the noise (recorded as insecure in the throw-away ledger).
        relation: the neighbouring relation of the ledger.

    Returns:
        (Q,) released labels, REFUSED (-1) where the mechanism gave no answer.
    """
    from mechanisms.accounting import standard_composition
    from mechanisms.ledger import Ledger
    from mechanisms.rdp import compose_curves, curve_epsilon

    g = mechanism.guarantee_for(inputs, relation)
    accountant = "standard"
    if g.rdp is not None and mechanism.per_query:
        # standard composition of a Renyi mechanism's per-query (eps, delta) can exceed
        # delta = 1: its ledger composes curves
        accountant, delta_t = "rdp", g.delta
        eps_t = curve_epsilon(compose_curves([(g.rdp, inputs.n_queries)]), delta_t)[0]
    elif mechanism.per_query:
        eps_t, delta_t = standard_composition(g.epsilon, g.delta, inputs.n_queries)
    else:
        eps_t, delta_t = g.epsilon, g.delta
    with Ledger.in_memory(eps_t, delta_t, accountant, relation=relation,
                          dataset_sha256=inputs.source.dataset_sha256) as ledger:
        return ledger.release(mechanism, inputs, insecure_rng=rng).labels


def simulate_expectation(mechanism: Mechanism, inputs, rng: np.random.Generator,
                         draws: int, labels: ArrayLike | None = None,
                         n_queries: int | None = None,
                         relation: str = REPLACE_ONE) -> Expectation:
    """Monte Carlo estimate of `expect`: `draws` real releases of every deployment.

    Each draw releases every session of `deployments` (the whole sample for a per-query
    mechanism) through `simulate` and records the fractions answered, equal to the answer
    and equal to the label; the estimate is their mean over draws, and its standard error
    s / sqrt(draws) with s the standard deviation over draws (ddof 1).

    Args:
        mechanism: a registry mechanism.
        inputs: its inputs (Q queries).
        rng: the generator of every draw.
        draws: releases to draw (>= 2).
        labels: optional (Q,) true labels.
        n_queries: B (default Q); only sessions depend on it.
        relation: the relation of the throw-away ledgers.

    Returns:
        A Monte Carlo `Expectation` (law "monte-carlo").

    Raises:
        ConfigError: draws < 2.
    """
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 2:
        raise ConfigError(f"draws must be an integer >= 2, got {draws!r}")
    q = inputs.n_queries
    y = None if labels is None else _labels(labels, q)
    target = answers(inputs)
    cuts = ([np.arange(q)] if mechanism.per_query or n_queries in (None, q)
            else deployments(q, int(n_queries)))
    stats = np.zeros((draws, 3))
    for d in range(draws):
        released = np.concatenate([simulate(mechanism, inputs.subset(idx), rng, relation)
                                   for idx in cuts])
        index = np.concatenate(cuts)
        stats[d] = ((released >= 0).mean(), (released == target[index]).mean(),
                    (released == y[index]).mean() if y is not None else 0.0)
    mean = stats.mean(axis=0)
    se = stats.std(axis=0, ddof=1) / math.sqrt(draws)
    return Expectation(float(mean[0]), float(mean[1]), None if y is None else float(mean[2]),
                       MONTE_CARLO, float(se[:3 if y is not None else 2].max()), draws)
