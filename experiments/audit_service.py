"""A black-box audit of two RUNNING prediction services (`agt serve`) started on two
neighbouring bundles: the deployed code path (HTTP, certifier, ledger, mechanism, secure
draws) audited end to end through `agt.client`. What ``agt audit --service-a/--service-b``
runs.

The difficulty. A service answers a query it released before with that first label, at no
charge, so one query cannot be drawn many times. The design: exchangeable distinct queries.
  1. The owner's candidate queries are certified on both services (``/v1/owner/radii``,
     owner key: certification only, nothing released or charged); the query c whose two
     certified inputs (c_A, c_B) = ((prediction, radius) on A, on B) promise the largest
     lower bound under the claimed mechanism's exact laws is chosen
     (`mechanisms.audit.cases.choose_pair`; with no law known, the first whose inputs
     differ).
  2. Jittered copies c + u (u ~ N(0, s^2 I), s = `jitter` times c's largest |coordinate|,
     at least `jitter`) are certified on both services; only copies whose certified inputs
     are identical to c's on A and on B are kept. A per-query mechanism's release depends
     on a query only through its certified inputs (and a fresh draw), so the kept copies'
     labels on A are i.i.d. draws of M(c_A), and on B of M(c_B): each copy is a new query
     for the service's cache, so each is a fresh, charged release.
  3. The kept copies are sent in large requests to ``/v1/predict`` with a client key on
     each service; any copy answered from the cache (an earlier release: a repeated audit
     seed) is refused, not counted. The test of mechanisms/audit/stats.py then runs on the
     two label samples: with the claimed law known, the event fixed from it before any
     release (every sample evaluates it), else chosen on half the samples.

What it needs. Owner keys (to see the certified inputs that make copies exchangeable) and a
client key on each service whose budget, and the dataset's, can pay for `samples` fresh
releases: the audit checks that up front (``/v1/budget``) and refuses with the amount
before releasing anything. It audits a single-model service with a per-query mechanism:
an ensemble service's owner endpoint returns the aggregate vote and its radius, not the
vote histograms an ensemble mechanism consumes, so exchangeable copies cannot be verified.

Every label the audit receives is a real release recorded in each service's ledger (the
privacy cost is real); the statistics it reports are owner-only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from agt.errors import BudgetExceededError, ConfigError, DataError

__all__ = ["ServiceSide", "audit_services"]


@dataclass(frozen=True)
class ServiceSide:
    """One service under audit: its address, an owner key and a client key.

    Attributes:
        url: the service's base URL (``http://127.0.0.1:8000``).
        owner_key: an owner key of that service (certified inputs of the copies).
        client_key: a client key whose budget pays for the audit's releases.
    """

    url: str
    owner_key: str
    client_key: str


def _certified(client, queries: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(prediction, radius) of the queries from the owner endpoint, `chunk` per request."""
    preds, radii = [], []
    for start in range(0, len(queries), chunk):
        got = client.radii(queries[start:start + chunk])
        preds.append(np.asarray(got["prediction"], dtype=np.int64))
        radii.append(np.asarray(got["radius"], dtype=np.int64))
    return np.concatenate(preds), np.concatenate(radii)


def _check_services(info_a: dict, info_b: dict) -> None:
    same = ("mechanism", "input_shape", "classes", "relation", "guarantee")
    differ = [k for k in same if info_a.get(k) != info_b.get(k)]
    if differ:
        raise ConfigError(f"the two services differ in {', '.join(differ)}: start both with "
                          f"the same mechanism and settings on the two neighbouring bundles")
    if info_a.get("source") != "model":
        raise ConfigError("the black-box audit needs single-model services (--bounds): an "
                          "ensemble service's owner endpoint shows the aggregate vote, not the "
                          "vote histograms its mechanism consumes, so exchangeable copies "
                          "cannot be checked; audit the ensembles with agt audit --config "
                          "--teachers instead")
    if info_a["guarantee"].get("per") != "query":
        raise ConfigError(f"{info_a['mechanism']} answers as a session: its releases of "
                          f"several queries are not independent draws; the black-box audit "
                          f"needs a per-query mechanism")


def _check_budget(client, name: str, samples: int, eps: float, delta: float) -> None:
    """Refuse before any release when the client's or the dataset's remaining budget
    cannot pay for `samples` charges of (eps, delta) (standard composition; other
    accountants charge no more, and the ledger's own check decides what this misses)."""
    need_eps, need_delta = samples * eps, samples * delta
    got = client.budget()
    for who, remaining in (("its client key", got.get("remaining")),
                           ("its dataset", (got.get("dataset") or {}).get("remaining"))):
        if remaining is None:
            continue
        if remaining["epsilon"] < need_eps * (1 - 1e-12) or \
                remaining["delta"] < need_delta * (1 - 1e-12):
            raise BudgetExceededError(
                f"service {name}: the audit needs {samples} fresh releases at (eps={eps:g}, "
                f"delta={delta:g}) each, (eps={need_eps:g}, delta={need_delta:g}) in all, but "
                f"{who} has (eps={remaining['epsilon']:g}, delta={remaining['delta']:g}) "
                f"left; raise that budget or lower the samples. Nothing was released.")


def _claimed_mechanism(info: dict, mechanism):
    """The mechanism whose exact laws pick the query and the event: `mechanism` if given,
    else the registry's of the service's name at its guarantee (None if not registered)."""
    if mechanism is not None:
        return mechanism
    from mechanisms import make_mechanism
    from mechanisms.base import load_registry

    entry = load_registry().get(info["mechanism"])
    if entry is None:
        return None
    g = info["guarantee"]
    return make_mechanism(info["mechanism"], float(g["epsilon"]),
                          float(g["delta"]) if entry.needs_delta else None)


def audit_services(a: ServiceSide, b: ServiceSide, candidates, *, samples: int = 2000,
                   mechanism=None, jitter: float = 1e-7, seed: int = 0,
                   confidence: float = 0.95, chunk: int = 1000,
                   max_rounds: int = 20, timeout: float = 120.0):
    """Audit two running services on neighbouring bundles (module docstring).

    Args:
        a: the service on the first bundle.
        b: the service on its neighbour.
        candidates: queries to choose the audited one from (one per row, the services'
            input shape).
        samples: fresh releases per service (each one charged by its ledger).
        mechanism: the claimed mechanism whose exact laws choose the query and the event
            (default: the registry's mechanism the services name, at their guarantee).
        jitter: the copies' relative noise scale (module docstring, step 2).
        seed: the audit's seed (its copies and hence its reproducibility; a repeated seed
            meets its own cached answers and is refused).
        confidence: 1 - the false-alarm probability.
        chunk: queries per request.
        max_rounds: rounds of copies before giving up on a query too close to a
            certificate's edge.
        timeout: seconds per request.

    Returns:
        A `mechanisms.audit.AuditResult` against the services' stated per-query guarantee;
        ``extra`` holds the URLs, the chosen query's certified inputs on both sides
        (owner-only), the copies tried and kept, and the charged releases per service.

    Raises:
        ConfigError: services that differ or cannot be audited this way, bad arguments;
        BudgetExceededError: a budget that cannot pay (nothing released);
        DataError: no usable query; agt.client.ServiceError: a refused request.
    """
    from agt.client import Client
    from mechanisms.audit.cases import Pair, choose_pair
    from mechanisms.audit.core import AuditResult, evaluate_releases, output_law
    from mechanisms.audit.stats import exact_loss
    from mechanisms.inputs import Certified, Source

    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 100:
        raise ConfigError(f"samples must be an integer >= 100, got {samples!r}")
    if not 0.5 <= confidence < 1:
        raise ConfigError(f"confidence must be in [0.5, 1), got {confidence!r}")
    if not 0 < jitter < 1e-2:
        raise ConfigError(f"jitter must be in (0, 0.01), got {jitter!r}")
    start = time.perf_counter()
    owners = [Client(s.url, s.owner_key, timeout=timeout) for s in (a, b)]
    clients = [Client(s.url, s.client_key, timeout=timeout) for s in (a, b)]
    try:
        info_a, info_b = owners[0].info(), owners[1].info()
        _check_services(info_a, info_b)
        shape, c = tuple(info_a["input_shape"]), int(info_a["classes"])
        g = info_a["guarantee"]
        eps, delta, relation = float(g["epsilon"]), float(g["delta"]), info_a["relation"]
        x = np.asarray(candidates, dtype=np.float64)
        if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != shape or len(x) == 0:
            raise DataError(f"candidate queries must have shape (n, {', '.join(map(str, shape))})"
                            f", got {x.shape}")
        for name, client in zip("AB", clients):
            _check_budget(client, name, samples, eps, delta)
        law = _claimed_mechanism(info_a, mechanism)
        source = Source("service-audit", "0" * 64, (relation,), True)
        (pa, ra), (pb, rb) = (_certified(o, x, chunk) for o in owners)

        def one(p, r):
            return Certified(np.array([p]), np.array([r]), max(2, c), source)

        pairs = [Pair(one(pa[i], ra[i]), one(pb[i], rb[i]), f"candidate {i}")
                 for i in range(len(x))]
        if law is not None:
            pair, predicted, _ = choose_pair(law, pairs, delta, samples, split=False)
            index = pairs.index(pair)
        else:
            differ = np.flatnonzero((pa != pb) | (ra != rb))
            index, predicted = (int(differ[0]) if len(differ) else 0), None
        target = (pa[index], ra[index], pb[index], rb[index])
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 45]))
        base = x[index]
        scale = jitter * max(1.0, float(np.abs(base).max()))
        kept, tried = [], 0
        for _ in range(max_rounds):
            need = samples - sum(len(k) for k in kept)
            if need <= 0:
                break
            copies = base[None] + rng.normal(0.0, scale, size=(need + need // 4 + 8, *shape))
            tried += len(copies)
            (qa, sa), (qb, sb) = (_certified(o, copies, chunk) for o in owners)
            same = (qa == target[0]) & (sa == target[1]) & (qb == target[2]) & \
                (sb == target[3])
            kept.append(copies[same])
        kept_x = np.concatenate(kept)[:samples]
        if len(kept_x) < samples:
            raise DataError(f"only {len(kept_x)} of {tried} copies of candidate {index} kept "
                            f"its certified inputs on both services: it sits on a "
                            f"certificate's edge; lower the jitter or give other candidates")
        labels, charged = [], []
        for name, client in zip("AB", clients):
            got, spent = [], 0
            for begin in range(0, samples, chunk):
                answer = client.predict(kept_x[begin:begin + chunk])
                if any(answer.cached):
                    raise DataError(f"service {name} answered {sum(answer.cached)} copies from "
                                    f"earlier releases (an audit with seed {seed} ran against "
                                    f"it before): rerun with another seed")
                got += [-1 if y is None else int(y) for y in answer.labels]
                spent += int(answer.charged.get("count") or 0)
            labels.append(np.asarray(got, dtype=np.int64)[:, None])
            charged.append(spent)
    finally:
        for client in owners + clients:
            client.close()
    alpha = 1.0 - confidence
    first, second = pairs[index].first, pairs[index].second
    planned, loss = None, None
    if law is not None:
        law_a, law_b = output_law(law, first), output_law(law, second)
        if law_a is not None and law_b is not None:
            from mechanisms.audit.stats import law_event

            keys = sorted(set(law_a) | set(law_b))
            pv, qv = [law_a.get(k, 0.0) for k in keys], [law_b.get(k, 0.0) for k in keys]
            chosen = law_event(pv, qv, samples, delta, alpha)
            planned = ([keys[i] for i in chosen.outcomes], chosen.first)
            loss = exact_loss(pv, qv, delta)
    fields = evaluate_releases(labels[0], labels[1], max(2, c), delta, alpha, planned)
    bound = fields.pop("bound")
    extra = {"service_a": a.url, "service_b": b.url, "query": int(index),
             "first": {"prediction": int(target[0]), "radius": int(target[1])},
             "second": {"prediction": int(target[2]), "radius": int(target[3])},
             "copies_tried": int(tried), "copies_kept": int(samples),
             "charged_releases": charged, "predicted_bound": predicted,
             "law": None if law is None else law.name}
    return AuditResult(
        mechanism=info_a["mechanism"], relation=relation, claim_epsilon=eps,
        claim_delta=delta, lower_bound=bound, confidence=confidence,
        violated=bound > eps, samples=samples, n_queries=1,
        seconds=time.perf_counter() - start, exact_loss=loss, seed=int(seed), extra=extra,
        **fields)

