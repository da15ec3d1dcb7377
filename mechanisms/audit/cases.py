"""Neighbouring inputs for the registry's mechanisms, and the registry sweep.

Which pairs are neighbours (both relations; the certificates' properties P1, P2 of
mechanisms/radius.py and the one-teacher-per-record rule of mechanisms/votes.py):
  one model (Certified): the same answer with radii r and r - 1 (P1), or different answers
      with both radii in {-1, 0} (P2);
  an ensemble (Votes): one teacher changes: the same vote with its radius r and r - 1, or
      another vote with both its radii <= 0; every other teacher's vote and radius stay.
Among a small family of such pairs the sweep audits, per mechanism, a pair whose exact
output laws (`output_law`) promise nearly the largest lower bound at the planned sample size
(`predicted_bound`: the test of stats.py with the binomial errors replaced by their normal
approximation), the one among those whose exact loss the audit can come closest to
(`choose_pair`). The laws decide the choice, the samples only the bound: the choice sees no
sample, so the audit's confidence is unchanged.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from agt.errors import ConfigError
from mechanisms.audit.core import AuditResult, audit, claim_for, output_law, query_laws
from mechanisms.audit.stats import exact_loss
from mechanisms.base import load_registry, make_mechanism
from mechanisms.guarantee import REPLACE_ONE
from mechanisms.inputs import Certified, Source, Votes

__all__ = ["Pair", "certified_pairs", "vote_pairs", "predicted_bound", "choose_pair",
           "SWEEP_EPSILON", "SWEEP_DELTA", "sweep_names", "sweep", "write_sweep"]

SWEEP_EPSILON = 1.0
SWEEP_DELTA = 1e-6
#: the audit sweep's source: certificates under replace-one with smooth radii
SOURCE = Source("audit-sweep", "0" * 64, (REPLACE_ONE,), True)
N_TEACHERS = 31          # enough votes for ens-ptr-votes' margin to reach ln(1/delta)/eps


@dataclass(frozen=True)
class Pair:
    """Two neighbouring inputs and a description of the change."""

    first: Any
    second: Any
    change: str


def certified_pairs(n_classes: int = 2, max_radius: int = 40,
                    source: Source = SOURCE) -> list[Pair]:
    """One-query Certified neighbours (module docstring): (0, r) vs (0, r - 1) for r = 0..
    max_radius, and (0, a) vs (1, b) for a, b in {-1, 0}.

    Args:
        n_classes: classes of the inputs.
        max_radius: the largest radius tried.
        source: the inputs' provenance.

    Returns:
        The pairs.
    """
    def one(c, r):
        return Certified(np.array([c]), np.array([r]), n_classes, source)

    pairs = [Pair(one(0, r), one(0, r - 1), f"radius {r} -> {r - 1}")
             for r in range(0, max_radius + 1)]
    pairs += [Pair(one(0, a), one(1, b), f"answer 0 (radius {a}) -> 1 (radius {b})")
              for a in (-1, 0) for b in (-1, 0)]
    return pairs


def vote_pairs(n_teachers: int = N_TEACHERS, radii: Iterable[int] = (0, 1, 2, 4, 8),
               splits: Iterable[int] | None = None, source: Source = SOURCE) -> list[Pair]:
    """One-query binary Votes neighbours (module docstring): k of the teachers vote 1, the
    others 0, every radius R; teacher 0 (voting v) either drops its radius to R - 1 or
    changes its vote with both its radii 0.

    Args:
        n_teachers: teachers T.
        radii: the common radii R tried.
        splits: the numbers k of class-1 voters tried (default all 0..T).
        source: the inputs' provenance.

    Returns:
        The pairs.
    """
    pairs = []
    for k in (range(n_teachers + 1) if splits is None else splits):
        votes = np.array([1] * k + [0] * (n_teachers - k))
        for r in radii:
            base = np.full(n_teachers, r)
            lowered = base.copy()
            lowered[0] = r - 1
            flipped_votes = votes.copy()
            flipped_votes[0] = 1 - votes[0]
            zero = base.copy()
            zero[0] = 0

            def one(v, rad):
                return Votes(v[None, :], rad[None, :], 2, source)

            pairs.append(Pair(one(votes, base), one(votes, lowered),
                              f"{k} of {n_teachers} vote 1, radii {r}: teacher 0's radius "
                              f"-> {r - 1}"))
            pairs.append(Pair(one(votes, zero), one(flipped_votes, zero),
                              f"{k} of {n_teachers} vote 1, radii {r}: teacher 0 (radius 0) "
                              f"changes its vote"))
    return pairs


def predicted_bound(p: dict, q: dict, delta: float, samples: int,
                    confidence: float = 0.95, split: bool = True) -> float:
    """The lower bound an audit of `samples` releases per side should reach on exact laws
    p, q: the test of stats.py on the evaluation half (samples / 2; all of them where the
    event is fixed from the laws, `split` False), each Clopper-Pearson
    bound replaced by p -/+ z sqrt(p (1 - p) / m) (z the normal quantile at (1 -
    confidence) / 2; plus 3 / m on q, the size of a bound on zero counts), maximised over the
    likelihood-ratio events of both directions.

    Args:
        p: the first law, {outcome: probability}.
        q: the second law.
        delta: the claim's delta.
        samples: releases per side.
        confidence: the audit's confidence.
        split: whether half the samples go to choosing the event.

    Returns:
        The predicted lower bound (>= 0).
    """
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
    m = samples // 2 if split else samples
    keys = sorted(set(p) | set(q))
    best = 0.0
    for x, y in ((p, q), (q, p)):
        a = np.array([x.get(k, 0.0) for k in keys])
        b = np.array([y.get(k, 0.0) for k in keys])
        order = np.argsort(-(a + 1e-300) / (b + 1e-300))
        for pa, qb in zip(np.cumsum(a[order]).tolist(), np.cumsum(b[order]).tolist()):
            lo = pa - z * math.sqrt(max(pa * (1 - pa), 0.0) / m)
            hi = qb + z * math.sqrt(max(qb * (1 - qb), 0.0) / m) + 3.0 / m
            if lo > delta:
                best = max(best, math.log((lo - delta) / hi))
    return best


def choose_pair(mechanism, pairs: list[Pair], delta: float, samples: int,
                tolerance: float = 0.05, split: bool = True) -> tuple[Pair, float, float]:
    """Among the pairs whose `predicted_bound` is within `tolerance` of the largest, the
    one the audit resolves best: the smallest gap between its exact loss and its predicted
    bound. (The largest promised bound alone favours pairs whose loss sits in rare events,
    e.g. the Gaussian tails of gnmax, where the bound stays far below the loss.)

    Args:
        mechanism: the mechanism (with exact laws, `output_law`).
        pairs: candidate neighbours.
        delta: the claim's delta.
        samples: the planned releases per side.
        tolerance: how much promised bound may be given up for a tighter pair.
        split: as `predicted_bound` (False: the audit fixes its event from the laws).

    Returns:
        (pair, predicted bound, exact loss).

    Raises:
        ConfigError: where the mechanism states no exact law.
    """
    firsts, seconds = _laws(mechanism, [x.first for x in pairs]), \
        _laws(mechanism, [x.second for x in pairs])
    scored = []
    for pair, p, q in zip(pairs, firsts, seconds):
        if p is None or q is None:
            raise ConfigError(f"{mechanism.name} states no exact output law: give the "
                              f"neighbouring inputs yourself")
        keys = sorted(set(p) | set(q))
        loss = exact_loss([p.get(k, 0.0) for k in keys], [q.get(k, 0.0) for k in keys], delta)
        scored.append((predicted_bound(p, q, delta, samples, split=split), loss, pair))
    top = max(s[0] for s in scored)
    near = [s for s in scored if s[0] >= top - tolerance and s[0] > 0]
    if not near:        # nothing measurable at this size: the pair with the largest loss
        bound, loss, pair = max(scored, key=lambda s: s[1])
    else:
        bound, loss, pair = min(near, key=lambda s: (s[1] - s[0], -s[0]))
    return pair, bound, loss


def _laws(mechanism, inputs: list) -> list[dict | None]:
    """`output_law` of each one-query input; a per-query mechanism's in one call on the
    inputs stacked (the same law per query)."""
    if not getattr(mechanism, "per_query", True) or not inputs or \
            any(x.n_queries != 1 for x in inputs):
        return [output_law(mechanism, x) for x in inputs]
    first = inputs[0]
    if isinstance(first, Certified):
        stacked = Certified(np.concatenate([x.prediction for x in inputs]),
                            np.concatenate([x.radius for x in inputs]), first.n_classes,
                            first.source)
    elif isinstance(first, Votes):
        stacked = Votes(np.concatenate([x.votes for x in inputs]),
                        np.concatenate([x.radii for x in inputs]), first.n_classes,
                        first.source)
    else:
        return [output_law(mechanism, x) for x in inputs]
    law = query_laws(mechanism, stacked)
    if law is None:
        return [None] * len(inputs)
    return [{(y - 1,): float(law[i, y]) for y in range(law.shape[1]) if law[i, y] > 0}
            for i in range(len(inputs))]


def sweep_names() -> tuple[str, ...]:
    """The registry names the sweep audits: every mechanism on one model's or an
    ensemble's inputs (the linear-model and loss-perturbation mechanisms release from a
    trained model's weights, whose neighbours need the owner's solver)."""
    return tuple(n for n, e in load_registry().items() if e.inputs in (Certified, Votes))


def _candidates(name: str, session: bool) -> list[Pair]:
    entry = load_registry()[name]
    if entry.inputs is Certified:
        pairs = certified_pairs(3 if name == "ss-argmax" else 2)
        return pairs[::4] + pairs[-4:] if session else pairs
    if session:     # sessions' laws are computed one input at a time: fewer candidates
        return vote_pairs(radii=(0, 2, 8), splits=range(0, N_TEACHERS + 1, 3))
    return vote_pairs()


def sweep(names: Iterable[str] | None = None, *, samples: int = 100_000,
          session_samples: int | None = None, seed: int = 0, confidence: float = 0.95,
          progress: bool = False) -> list[AuditResult]:
    """Audit registry mechanisms at eps = 1 (delta = 1e-6 where they take one), each on the
    neighbours `choose_pair` picks for it, with the event fixed from the pair's exact laws
    before drawing (`audit(event_from_law=True)`): every release evaluates it, none is
    spent on choosing it (for gnmax, whose loss sits in Gaussian tails, that halves the
    variance that kept the bound 0.11 below the exact loss).

    Args:
        names: registry names (default `sweep_names()`).
        samples: releases per side.
        session_samples: releases per side for sessions (drawn one by one); default samples.
        seed: the audits' seed.
        confidence: the audits' confidence.
        progress: progress bars.

    Returns:
        One AuditResult per mechanism; `extra` holds the change audited and the prediction.
    """
    out = []
    for name in (sweep_names() if names is None else tuple(names)):
        entry = load_registry()[name]
        mech = make_mechanism(name, SWEEP_EPSILON, SWEEP_DELTA if entry.needs_delta else None)
        session = not mech.per_query
        n = int(session_samples or samples) if session else int(samples)
        start = time.perf_counter()
        candidates = _candidates(name, session)
        delta = claim_for(mech, candidates[0].first, candidates[0].second, REPLACE_ONE).delta
        pair, predicted, _ = choose_pair(mech, candidates, delta, n, split=False)
        chosen = time.perf_counter() - start
        result = audit(mech, pair.first, pair.second, relation=REPLACE_ONE, samples=n,
                       seed=seed, confidence=confidence, event_from_law=True,
                       progress=progress)
        result.extra.update(change=pair.change, predicted_bound=predicted,
                            choice_seconds=chosen)
        out.append(result)
    return out


def write_sweep(results: list[AuditResult], path: str | Path) -> Path:
    """The sweep's artifact: {"epsilon", "delta", "mechanisms": {name: result dict}}.

    Args:
        results: `sweep`'s results.
        path: the JSON file (parents created).

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"epsilon": SWEEP_EPSILON, "delta": SWEEP_DELTA,
           "what": "agt audit --registry: each mechanism at eps 1 on the neighbours whose "
                   "exact laws promise the largest lower bound, the event fixed from "
                   "those laws",
           "mechanisms": {r.mechanism: r.to_dict() for r in results}}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
