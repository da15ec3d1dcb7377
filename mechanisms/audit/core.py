"""`audit`: an empirical privacy audit of a release mechanism on two neighbouring inputs.

The audit draws many releases of `mechanism` on each of two inputs that the caller states
are neighbours under a relation, chooses a distinguishing event on half of them and turns
the other half into a lower bound on eps at the claim's delta (stats.py states the test):
"claim violated" when that bound exceeds the claimed eps, which a mechanism that keeps its
claim shows with probability at most 1 - confidence.

What is audited. One release is the labels of all the inputs' queries (REFUSED included);
its outcome is that tuple. The claim is the mechanism's guarantee for that release: a
per-query mechanism's (eps, delta) composed over the Q queries by basic composition (Q eps,
Q delta; Dwork-Roth Thm 3.16), a session's (per_query False) as stated. Per-query mechanisms
are drawn in batches (the inputs repeated n times in one release call: their queries are
independent by the per-query contract); a session is drawn once per sample.

What is not. The audit draws from seeded generators, for its own reproducibility: it is an
owner-only test bench and never a release path (nothing it returns is a released label, and
its frequencies are functions of the private inputs). A lower bound is evidence about these
two inputs only: "claim holds" means no violation was seen at this sample size, not a proof
(docs/auditing.md).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agt.errors import ConfigError, DataError, Problems
from mechanisms.audit.stats import (
    Event,
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_lower_bound,
    exact_loss,
    law_event,
    select_event,
)
from mechanisms.base import REFUSED
from mechanisms.guarantee import Guarantee

__all__ = ["AuditResult", "audit", "claim_for", "output_law", "query_laws", "outcome_codes",
           "evaluate_releases"]

#: queries per release call when per-query inputs are repeated (memory stays small)
BATCH_QUERIES = 200_000


@dataclass(frozen=True)
class AuditResult:
    """The verdict of one audit (owner-only: it describes the private inputs' laws).

    Attributes:
        mechanism: the audited mechanism's name.
        relation: the neighbouring relation the claim is stated under.
        claim_epsilon: the claimed eps for one release of all queries.
        claim_delta: the claimed delta for it.
        lower_bound: eps_lo at `confidence` (stats.py).
        confidence: 1 - the false-alarm probability.
        violated: lower_bound > claim_epsilon.
        samples: releases per side (half select the event, half evaluate it).
        n_queries: queries per release.
        seconds: wall time of the audit.
        outcomes: the outcomes seen, each a tuple of labels (-1 = REFUSED).
        frequencies_a: their empirical frequencies over the first input's samples.
        frequencies_b: the same over the neighbour's.
        event: the chosen event's outcomes.
        event_first: True when the event favours the first input.
        p_lower: the evaluation half's lower Clopper-Pearson bound on the favoured side.
        q_upper: its upper bound on the other side.
        exact_loss: the exact label-channel loss of these inputs at claim_delta where the
            mechanism states its law (`output_law`), else None.
        seed: the audit's seed.
        extra: what the caller adds (the sweep: the change audited, the predicted bound).
        selection: how the event was chosen: "half" (on the first half of the samples,
            the second half evaluates it) or "law" (from the stated exact laws before any
            draw; every sample evaluates it).
    """

    mechanism: str
    relation: str
    claim_epsilon: float
    claim_delta: float
    lower_bound: float
    confidence: float
    violated: bool
    samples: int
    n_queries: int
    seconds: float
    outcomes: tuple[tuple[int, ...], ...]
    frequencies_a: tuple[float, ...]
    frequencies_b: tuple[float, ...]
    event: tuple[tuple[int, ...], ...]
    event_first: bool
    p_lower: float
    q_upper: float
    exact_loss: float | None = None
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    selection: str = "half"

    @property
    def verdict(self) -> str:
        """"claim violated" or "claim holds" (no violation seen at this sample size)."""
        return "claim violated" if self.violated else "claim holds"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the verdict included; an infinite loss written as null)."""
        out = asdict(self)
        out["verdict"] = self.verdict
        for key in ("exact_loss", "lower_bound"):
            if out[key] is not None and not math.isfinite(out[key]):
                out[key] = None
        return out

    def summary(self) -> str:
        """One line: verdict, bound against claim, samples and time."""
        exact = "" if self.exact_loss is None else f", exact loss {self.exact_loss:.4f}"
        return (f"{self.mechanism}: {self.verdict}: eps >= {self.lower_bound:.4f} at "
                f"{self.confidence:.0%} confidence against the claim eps = "
                f"{self.claim_epsilon:.4g}, delta = {self.claim_delta:.3g} ({self.relation})"
                f"{exact}; {self.samples} releases per side, {self.seconds:.1f} s")

    def write_json(self, path: str | Path) -> Path:
        """Write `to_dict()` to `path` (parents created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def plot(self, path: str | Path) -> Path:
        """Bar chart of the two label distributions, the chosen event marked (matplotlib)."""
        from mechanisms.audit.plot import plot_distributions

        return plot_distributions(self, path)


def claim_for(mechanism, inputs, neighbour, relation: str) -> Guarantee:
    """The mechanism's claim for one release of all queries of either input, under
    `relation`: the weaker of the two inputs' guarantees (each converted to `relation` as the
    ledger would), composed over the queries for a per-query mechanism.

    Args:
        mechanism: the mechanism (registry protocol).
        inputs: the first input.
        neighbour: the second.
        relation: "replace-one" or "add-remove".

    Returns:
        A Guarantee (eps, delta) for the whole release.

    Raises:
        PrivacyError: where the inputs' certificates give no guarantee under `relation`.
    """
    a = mechanism.guarantee_for(inputs, relation)
    b = mechanism.guarantee_for(neighbour, relation)
    eps, delta = max(a.epsilon, b.epsilon), max(a.delta, b.delta)
    if getattr(mechanism, "per_query", True) and inputs.n_queries > 1:
        eps, delta = eps * inputs.n_queries, min(1.0, delta * inputs.n_queries)
        note = f"{a.note}; basic composition over {inputs.n_queries} queries"
    else:
        note = a.note
    return Guarantee(eps, delta, relation, a.mechanism, note)


def _repeat(inputs, n: int):
    """The inputs' Q queries repeated n times (n Q queries), for one batched release."""
    if not hasattr(inputs, "subset"):
        raise DataError(f"{type(inputs).__name__} has no subset(index): a per-query mechanism's "
                        f"inputs must offer it for batched audit releases")
    return inputs.subset(np.tile(np.arange(inputs.n_queries), n))


def _releases(mechanism, inputs, n: int, rng: np.random.Generator,
              progress: bool) -> NDArray[np.int64]:
    """(n, Q) released labels: n releases of all queries (module docstring: batching)."""
    q = inputs.n_queries
    out = np.empty((n, q), dtype=np.int64)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, desc=f"audit {mechanism.name}", unit="release", leave=False)
    if getattr(mechanism, "per_query", True):
        per_call = max(1, BATCH_QUERIES // q)
        for start in range(0, n, per_call):
            m = min(per_call, n - start)
            labels = mechanism.release(_repeat(inputs, m), rng)
            out[start:start + m] = np.asarray(labels, dtype=np.int64).reshape(m, q)
            if bar is not None:
                bar.update(m)
    else:
        for i in range(n):
            out[i] = mechanism.release(inputs, rng)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return out


def outcome_codes(labels: NDArray[np.int64], n_classes: int) -> NDArray[np.int64]:
    """One integer per release: the labels (REFUSED = -1 shifted to 0) as base-(C + 1)
    digits."""
    shifted = labels + 1
    if shifted.min(initial=0) < 0 or shifted.max(initial=0) > n_classes:
        raise DataError(f"the mechanism released labels outside [-1, {n_classes - 1}]")
    weights = (n_classes + 1) ** np.arange(labels.shape[1], dtype=np.int64)
    return shifted @ weights


def _decode(code: int, n_classes: int, q: int) -> tuple[int, ...]:
    digits = []
    for _ in range(q):
        code, d = divmod(code, n_classes + 1)
        digits.append(d - 1)
    return tuple(digits)


def output_law(mechanism, inputs) -> dict[tuple[int, ...], float] | None:
    """The exact law of one release's label tuple, from the mechanism's
    `correct_probability` (P(label = y) per query; REFUSED takes the rest): the product of
    the queries' laws for a per-query mechanism, the one query's law for a session of one
    query. None where it cannot be stated (a session of several queries, or a mechanism
    without exact probabilities).

    Args:
        mechanism: the mechanism.
        inputs: its inputs.

    Returns:
        {label tuple: probability}, or None.
    """
    c, q = inputs.n_classes, inputs.n_queries
    if not getattr(mechanism, "per_query", True) and q > 1:
        return None
    law = query_laws(mechanism, inputs)
    if law is None:
        return None
    joint = {(): 1.0}
    for i in range(q):
        joint = {key + (y - 1,): p * float(law[i, y]) for key, p in joint.items()
                 for y in range(c + 1) if law[i, y] > 0}
    return joint


def query_laws(mechanism, inputs) -> NDArray[np.float64] | None:
    """(Q, C + 1): P(query i's label = y) for y = REFUSED, 0, ..., C - 1, from
    `correct_probability` (REFUSED takes the rest; a rest below 1e-12 is the rounding of a
    law without refusals). None where the mechanism states no exact probabilities.

    Args:
        mechanism: the mechanism.
        inputs: its inputs.
    """
    c, q = inputs.n_classes, inputs.n_queries
    try:
        per_label = np.stack([mechanism.correct_probability(inputs, np.full(q, y))
                              for y in range(c)], axis=1)              # (Q, C)
    except (NotImplementedError, AttributeError):
        return None
    refused = np.clip(1.0 - per_label.sum(axis=1), 0.0, 1.0)
    refused = np.where(refused < 1e-12, 0.0, refused)
    return np.concatenate([refused[:, None], per_label], axis=1)


def _exact(mechanism, inputs, neighbour, delta: float) -> float | None:
    law_a, law_b = output_law(mechanism, inputs), output_law(mechanism, neighbour)
    if law_a is None or law_b is None:
        return None
    keys = sorted(set(law_a) | set(law_b))
    return exact_loss([law_a.get(k, 0.0) for k in keys], [law_b.get(k, 0.0) for k in keys],
                      delta)


def _validate(mechanism, inputs, neighbour, samples, confidence) -> None:
    problems = Problems("audit", ConfigError)
    for attr in ("release", "guarantee_for", "name"):
        problems.check(hasattr(mechanism, attr),
                       f"the mechanism must implement the registry's protocol "
                       f"(mechanisms.base.Mechanism); it has no {attr}")
    problems.check(type(inputs) is type(neighbour),
                   f"the two inputs must be of one type, got {type(inputs).__name__} and "
                   f"{type(neighbour).__name__}", DataError)
    for attr in ("n_queries", "n_classes"):
        problems.check(getattr(inputs, attr, None) == getattr(neighbour, attr, None),
                       f"the two inputs must have the same {attr}", DataError)
    problems.check(isinstance(samples, (int, np.integer)) and not isinstance(samples, bool)
                   and samples >= 100,
                   f"samples must be an integer >= 100 (releases per side), got {samples!r}")
    problems.check(isinstance(confidence, float) and 0.5 <= confidence < 1.0,
                   f"confidence must be a float in [0.5, 1), got {confidence!r}")
    problems.raise_if_any()


def audit(mechanism, inputs, neighbour, *, relation: str | None = None,
          samples: int = 20_000, confidence: float = 0.95, seed: int = 0,
          claim: Guarantee | None = None, exact: bool = True,
          event_from_law: bool = False, progress: bool = False) -> AuditResult:
    """Audit `mechanism` on two neighbouring inputs (module docstring; the test is in
    mechanisms/audit/stats.py).

    Args:
        mechanism: any object with the registry's protocol (a registry mechanism or one of
            the user's): name, per_query, release(inputs, rng), guarantee_for(inputs,
            relation); correct_probability for the exact loss.
        inputs: the first input (Certified, Votes or the mechanism's own type).
        neighbour: the second input, a neighbour of the first under `relation` (the caller
            vouches for that: the audit tests the claim on the pair it is given).
        relation: the relation of the claim; default: the first the first input's
            certificates hold under.
        samples: releases per side, >= 100 (split in halves: selection, evaluation).
        confidence: 1 - the false-alarm probability, in [0.5, 1).
        seed: the audit's seed (its own reproducibility; never a release's).
        claim: the guarantee to test for one release of all queries; default `claim_for`.
        exact: compute the exact label-channel loss where the mechanism states its law.
        event_from_law: fix the event from the mechanism's stated exact laws before drawing
            (`stats.law_event`) and evaluate it on every sample, instead of choosing it on
            half of them: the same confidence, a tighter bound; needs `output_law`.
        progress: show a progress bar.

    Returns:
        The AuditResult.

    Raises:
        ConfigError, DataError: bad arguments; PrivacyError: no claim under `relation`.
    """
    _validate(mechanism, inputs, neighbour, samples, confidence)
    start = time.perf_counter()
    if relation is None:
        relation = mechanism.relations(inputs)[0]
    if claim is None:
        claim = claim_for(mechanism, inputs, neighbour, relation)
    alpha = 1.0 - confidence
    c, q = inputs.n_classes, inputs.n_queries
    planned = None
    if event_from_law:      # fixed before any draw: the samples never see the choice
        law_a, law_b = output_law(mechanism, inputs), output_law(mechanism, neighbour)
        if law_a is None or law_b is None:
            raise ConfigError(f"{mechanism.name} states no exact output law for these inputs: "
                              f"leave event_from_law off (the event is then chosen on half "
                              f"of the samples)")
        keys = sorted(set(law_a) | set(law_b))
        chosen = law_event([law_a.get(k, 0.0) for k in keys],
                           [law_b.get(k, 0.0) for k in keys], int(samples), claim.delta, alpha)
        planned = ([keys[i] for i in chosen.outcomes], chosen.first)
    seq_a, seq_b = np.random.SeedSequence(int(seed)).spawn(2)
    labels_a = _releases(mechanism, inputs, int(samples), np.random.default_rng(seq_a), progress)
    labels_b = _releases(mechanism, neighbour, int(samples), np.random.default_rng(seq_b),
                         progress)
    result = evaluate_releases(labels_a, labels_b, c, claim.delta, alpha, planned)
    loss = _exact(mechanism, inputs, neighbour, claim.delta) if exact else None
    return AuditResult(
        mechanism=mechanism.name, relation=relation, claim_epsilon=float(claim.epsilon),
        claim_delta=float(claim.delta), lower_bound=result["bound"], confidence=confidence,
        violated=result["bound"] > claim.epsilon, samples=int(samples), n_queries=q,
        seconds=time.perf_counter() - start, exact_loss=loss, seed=int(seed),
        **{k: v for k, v in result.items() if k != "bound"})


def evaluate_releases(labels_a: NDArray[np.int64], labels_b: NDArray[np.int64],
                      n_classes: int, delta: float, alpha: float,
                      planned: tuple[list, bool] | None = None) -> dict:
    """The test of stats.py on (n, Q) released labels of each side (REFUSED = -1): the event
    chosen on the first half and evaluated on the second, or, with `planned`, that event
    (fixed before the releases were drawn) evaluated on all of them.

    Args:
        labels_a: (n, Q) labels released on the first input.
        labels_b: (n, Q) labels released on the second.
        n_classes: the classes C.
        delta: the claim's delta.
        alpha: 1 - confidence.
        planned: (the event's outcome tuples, True when it favours the first side), or None.

    Returns:
        The AuditResult fields it decides (outcomes, frequencies, event, p_lower, q_upper,
        selection), and ``bound``: the lower bound on eps.
    """
    c, q, samples = n_classes, labels_a.shape[1], len(labels_a)
    codes_a, codes_b = outcome_codes(labels_a, c), outcome_codes(labels_b, c)
    weights = (c + 1) ** np.arange(q, dtype=np.int64)
    planned_codes = [] if planned is None else \
        [int((np.asarray(o) + 1) @ weights) for o in planned[0]]
    vocab, index = np.unique(np.concatenate([codes_a, codes_b, planned_codes]).astype(np.int64),
                             return_inverse=True)
    idx_a, idx_b = index[:samples], index[samples:2 * samples]
    k = len(vocab)

    def counts(idx):
        return np.bincount(idx, minlength=k)

    if planned is None:
        half = samples // 2
        event = select_event(counts(idx_a[:half]), counts(idx_b[:half]), half, delta, alpha)
        eval_a, eval_b = counts(idx_a[half:]), counts(idx_b[half:])
        m, selection = samples - half, "half"
    else:
        event = Event(tuple(int(i) for i in np.searchsorted(vocab, planned_codes)), planned[1])
        eval_a, eval_b = counts(idx_a), counts(idx_b)
        m, selection = samples, "law"
    in_a, in_b = int(eval_a[list(event.outcomes)].sum()), int(eval_b[list(event.outcomes)].sum())
    k_p, k_q = (in_a, in_b) if event.first else (in_b, in_a)
    outcomes = tuple(_decode(int(v), c, q) for v in vocab)
    return dict(
        bound=float(epsilon_lower_bound(k_p, k_q, m, delta, alpha)), outcomes=outcomes,
        frequencies_a=tuple((counts(idx_a) / samples).tolist()),
        frequencies_b=tuple((counts(idx_b) / samples).tolist()),
        event=tuple(outcomes[i] for i in event.outcomes), event_first=event.first,
        p_lower=float(clopper_pearson_lower(k_p, m, alpha / 2)),
        q_upper=float(clopper_pearson_upper(k_q, m, alpha / 2)), selection=selection)


# REFUSED is -1: the code shift above relies on it
assert REFUSED == -1
