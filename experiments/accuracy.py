"""Accuracy of private releases: exact expectations and seeded sampled draws.

Every mechanism here releases a binary label, and the probability that it releases the
*true* label is known in closed form from the mechanism's own flip / release probabilities
(mechanisms/*.py). The expected accuracy over the queries is the mean of those per-query
probabilities: an exact number, no Monte Carlo error. The sampled accuracies draw the real
releases (the same `release_*` functions a deployment calls) with seeded generators; their
mean over repeats matches the expectation up to sampling error, and their spread is what the
paper's error bands show. Experiments report both.

These draws bypass the privacy ledger on purpose: an experiment measures the accuracy of
many hypothetical releases of the same queries, which no deployment would be allowed to make.

Mechanisms (per query, calibrated by the per-query epsilon):
  single model  gs          1[f + Laplace(1/eps) > 1/2]                    eps-DP
                ss-laplace  Laplace(2S/eps), S = exp(-beta r), beta = eps/(2 ln(2/delta))
                ss-cauchy   Cauchy(6S/eps), beta = eps/6                     eps-DP
  ensemble      gs          noisy argmax, Laplace(2/eps) per vote count      eps-DP
                ss-*        the single-model SS release with the Thm 5.3 ensemble radius
                ptr         propose-test-release on the ensemble radius; "no answer" (-1)
                            counts as wrong                                 (eps, delta)-DP
                ptr+gs      the paper's variant: PTR at eps/2; where it answers nothing, the
                            GS release of the ensemble answer at eps/2 (basic composition:
                            (eps, delta)-DP)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mechanisms import ensemble as me
from mechanisms.global_sens import flip_probability_gs, release_global
from mechanisms.smooth import flip_probability_ss, release_smooth

SINGLE_MECHANISMS = ("gs", "ss-laplace", "ss-cauchy")
ENSEMBLE_MECHANISMS = ("gs", "ss-laplace", "ss-cauchy", "ptr", "ptr+gs")


def correct_probability(released_from: np.ndarray, y: np.ndarray, flip) -> np.ndarray:
    """P(release == y) when the release flips `released_from` with probability `flip`."""
    flip = np.broadcast_to(np.asarray(flip, dtype=np.float64), released_from.shape)
    return np.where(released_from == y, 1.0 - flip, flip)


def _noise(mechanism: str) -> str:
    return mechanism.split("-")[1]


# ------------------------------------------------------------------------------------------
# Single model

def single_expected(mechanism: str, prediction: np.ndarray, radius: np.ndarray, y: np.ndarray,
                    epsilon: float, delta: float | None) -> np.ndarray:
    """Per-query P(release == y) for a single model's release."""
    if mechanism == "gs":
        return correct_probability(prediction, y, flip_probability_gs(epsilon))
    if mechanism in ("ss-laplace", "ss-cauchy"):
        noise = _noise(mechanism)
        d = delta if noise == "laplace" else None
        return correct_probability(prediction, y, flip_probability_ss(epsilon, d, radius, noise))
    raise ValueError(f"unknown single-model mechanism {mechanism!r}")


def single_release(mechanism: str, prediction: np.ndarray, radius: np.ndarray,
                   epsilon: float, delta: float | None, relation: str,
                   rng: np.random.Generator) -> np.ndarray:
    """One seeded draw of the single-model release (labels)."""
    if mechanism == "gs":
        return release_global(prediction, epsilon, relation=relation, rng=rng)[0]
    noise = _noise(mechanism)
    d = delta if noise == "laplace" else None
    return release_smooth(prediction, radius, epsilon, d, noise=noise, relation=relation,
                          rng=rng)[0]


# ------------------------------------------------------------------------------------------
# Ensembles

@dataclass(frozen=True)
class Votes:
    """What the ensemble releases are computed from: (Q, T) votes and teacher radii."""

    votes: np.ndarray
    radii: np.ndarray
    rule: str = "thm5.3"

    @property
    def answer(self) -> np.ndarray:
        return me.aggregate(self.votes)


def ensemble_expected(mechanism: str, v: Votes, y: np.ndarray, epsilon: float,
                      delta: float | None) -> np.ndarray:
    """Per-query P(release == y) for an ensemble release (PTR: no answer counts as wrong)."""
    answer = v.answer
    if mechanism == "gs":
        p_one = me.gnmax_probability_one(me.vote_counts(v.votes), epsilon)
        return np.where(y == 1, p_one, 1.0 - p_one)
    if mechanism in ("ss-laplace", "ss-cauchy"):
        noise = _noise(mechanism)
        d = delta if noise == "laplace" else None
        flip = me.ss_ensemble_flip_probability(v.votes, v.radii, epsilon, d, noise, v.rule)
        return correct_probability(answer, y, flip)
    if mechanism == "ptr":
        passed = me.ptr_release_probability(me.ptr_distance(v.votes, v.radii), epsilon, delta)
        return np.where(answer == y, passed, 0.0)
    if mechanism == "ptr+gs":
        half = epsilon / 2.0
        passed = me.ptr_release_probability(me.ptr_distance(v.votes, v.radii), half, delta)
        fallback = correct_probability(answer, y, flip_probability_gs(half))
        return np.where(answer == y, passed, 0.0) + (1.0 - passed) * fallback
    raise ValueError(f"unknown ensemble mechanism {mechanism!r}")


def ensemble_release(mechanism: str, v: Votes, epsilon: float, delta: float | None,
                     relation: str, rng: np.random.Generator) -> np.ndarray:
    """One seeded draw of an ensemble release (labels; -1 = PTR gave no answer)."""
    if mechanism == "gs":
        return me.release_gnmax(v.votes, epsilon, relation=relation, rng=rng)[0]
    if mechanism in ("ss-laplace", "ss-cauchy"):
        noise = _noise(mechanism)
        d = delta if noise == "laplace" else None
        return me.release_ss_ensemble(v.votes, v.radii, epsilon, d, noise=noise,
                                      relation=relation, rule=v.rule, rng=rng)[0]
    if mechanism == "ptr":
        return me.release_ptr(v.votes, epsilon, delta, relation=relation,
                              teacher_radii=v.radii, rng=rng)[0]
    if mechanism == "ptr+gs":
        half = epsilon / 2.0
        labels = me.release_ptr(v.votes, half, delta, relation=relation,
                                teacher_radii=v.radii, rng=rng)[0]
        fallback = release_global(v.answer, half, relation=relation, rng=rng)[0]
        return np.where(labels >= 0, labels, fallback)
    raise ValueError(f"unknown ensemble mechanism {mechanism!r}")


# ------------------------------------------------------------------------------------------
# Summaries

def mean_std(values) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std())


def sampled_accuracy(draw, y: np.ndarray, rngs) -> list[float]:
    """Accuracy of `draw(rng)` against y for each generator (one per repeat)."""
    return [float(np.mean(draw(rng) == y)) for rng in rngs]
