"""The prediction service's core: a release source, one mechanism and the ledger, answering
requests as they arrive, with concurrent requests batched into one ledger transaction.

`PredictionService` is library code (the HTTP layer, `agt.service.app`, is a thin shell on
top of it): ``submit(principal, queries)`` returns a future of the request's `Answered`
(from `mechanisms.Ledger.answer_batch`, the same door as every release). One worker thread
owns the ledger connection and the certifier; it takes every request waiting in its queue
(up to a number of queries), certifies their queries in one pass, and answers them in one
transaction, so one disk sync serves many requests. Every label leaves only after that
transaction committed (`Ledger.answer_batch`).

Two things happen before any certification. At start, the worker certifies one all-zero
query (released to no one) so that the first request does not pay for loading the model
(`ready` turns true after it). Per request, a client whose budget (or the dataset's) cannot
pay for one more charge -- one more query of a per-query mechanism; a new session of a
stability-gated one, where the client has no session open -- is refused from the ledger's
records alone (`_unpayable`), under every accountant: it costs the server no certification,
and the refusal depends only on that client's own charges, its open session and the
dataset's total, never on its queries.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agt.errors import AGTError, BudgetExceededError, DataError, PrivacyError
from agt.service.keys import Principal

#: the most queries the worker takes into one batch (requests are never split)
BATCH_QUERIES = 4096
#: seconds the worker waits for more requests to join a batch
BATCH_WAIT = 0.002
#: the most points of the owner's spend-over-time curve (each one is a composition)
CURVE_POINTS = 48


@dataclass(frozen=True)
class _Task:
    kind: str              # "predict", "radii", "budget", "entries", "overview"
    principal: Principal | None
    payload: object
    future: Future
    idempotency_key: str | None = None


class PredictionService:
    """Answer prediction queries from one bundle or ensemble through one ledger.

    Args:
        source: a `agt.store.Bundle` (single-model mechanisms) or an `agt.ensemble.Ensemble`
            (ensemble mechanisms).
        mechanism: the release mechanism (`mechanisms.make_mechanism`).
        ledger: the ledger file's path or a PostgreSQL URL (replicas share one); a new
            ledger needs ``budget_epsilon``.
        budget_epsilon: a new ledger's total epsilon (an existing ledger keeps its own
            settings; values that differ from them are refused).
        budget_delta: a new ledger's total delta.
        accountant: a new ledger's accountant.
        relation: a new ledger's neighbouring relation.
        device: where to certify.
        max_batch_queries: the most queries answered in one ledger transaction.
        batch_wait: seconds to wait for more requests to join a batch.
    """

    def __init__(self, source, mechanism, ledger: str | Path, *,
                 budget_epsilon: float | None = None, budget_delta: float | None = None,
                 accountant: str | None = None, relation: str | None = None,
                 device: str = "cpu", max_batch_queries: int = BATCH_QUERIES,
                 batch_wait: float = BATCH_WAIT):
        from agt.certify import Certifier
        from agt.ensemble import Ensemble, EnsembleCertifier
        from agt.store import Bundle
        from mechanisms import Certified, Votes

        self.mechanism = mechanism
        if isinstance(source, Ensemble):
            self.kind, self._inputs = "ensemble", Votes
            self._certifier = EnsembleCertifier(source, device=device)
            spec, config = source.spec, source.config
            self.n_teachers = source.n_teachers
        elif isinstance(source, Bundle):
            self.kind, self._inputs = "model", Certified
            self._certifier = Certifier(source, device=device)
            spec, config = source.spec, source.config
            self.n_teachers = 1
        else:
            raise DataError(f"the service answers from a bundle or an ensemble, got "
                            f"{type(source).__name__}")
        if not mechanism.per_query and not hasattr(mechanism, "continue_session"):
            raise PrivacyError(f"{mechanism.name} answers one release as one session; serve "
                               f"a per-query mechanism or a stability-gated session (svt, "
                               f"ens-svt)")
        if mechanism.input_type is not self._inputs:
            wanted = "an ensemble (--ensemble)" if mechanism.input_type is Votes else \
                "one bundle (--bounds)"
            raise PrivacyError(f"{mechanism.name} releases from {wanted}")
        self.input_shape = tuple(int(s) for s in spec.require_input_shape())
        self.n_classes = max(2, int(spec.n_logits))
        bound = config.get("input_norm_bound")
        #: the declared input domain (an L2 norm bound), where the bundle declares one
        self.input_norm_bound = None if bound is None else float(bound)
        self.max_batch_queries = int(max_batch_queries)
        self.batch_wait = float(batch_wait)
        self._ledger_args = dict(budget_epsilon=budget_epsilon, budget_delta=budget_delta,
                                 accountant=accountant, relation=relation)
        self._ledger_path = str(ledger)
        self._queue: queue.Queue[_Task | None] = queue.Queue()
        self._ready = threading.Event()
        self._warm = threading.Event()
        # owner-only counts since this process started (the worker alone writes them): per
        # client [queries answered anew, queries answered from the cache, requests refused],
        # and how many answered queries had each stability radius
        self._counts: dict[str, list[int]] = {}
        self._radius_counts: Counter[int] = Counter()
        self.started = time.time()
        #: the dataset's budget cannot pay for one more query: True, False, None (ask)
        self._dataset_spent: bool | None = None
        #: (client, its budget, the charge) whose budget cannot pay for one more charge: a
        #: verdict that holds for good (`_unpayable`)
        self._spent_clients: set[tuple[str, tuple[float, float], tuple[float, float]]] = set()
        #: the source's id (sessions are kept per client, source and mechanism), known once
        #: the model certified a query
        self._source_id: str | None = None
        self._failed: BaseException | None = None
        self._worker = threading.Thread(target=self._run, name="agt-serve-ledger", daemon=True)
        self._worker.start()
        self._ready.wait()
        if self._failed is not None:
            raise self._failed

    # -- public, for the HTTP layer -----------------------------------------------------------

    def info(self) -> dict:
        """What any client may know: nothing here depends on the private data."""
        g = self.guarantee
        return {"mechanism": self.mechanism.name, "source": self.kind,
                "teachers": self.n_teachers, "input_shape": list(self.input_shape),
                "classes": self.n_classes, "relation": self.relation,
                "input_norm_bound": self.input_norm_bound,
                "guarantee": {"epsilon": g.epsilon, "delta": g.delta, "relation": g.relation,
                              "per": "query" if self.mechanism.per_query else "session",
                              "statement": g.note}}

    @property
    def ready(self) -> bool:
        """True once the model has answered its warm-up query (requests sent before then
        wait in the queue; nothing is refused for it)."""
        return self._warm.is_set()

    def check_queries(self, x, *, booleans: bool = True) -> np.ndarray:
        """The queries as a float64 array (n, *input_shape), or a DataError naming the first
        problem (shape, a value that is not a finite number, a query outside the declared
        domain).

        Args:
            x: the queries (nested lists of numbers, or an array).
            booleans: False where the caller knows ``x`` holds no bool (a UTF-8 JSON body
                without the bytes ``true`` and ``false``): the walk over every value that refuses
                them is skipped.
        """
        try:
            raw = np.asarray(x)
            if raw.dtype.kind not in "iuf":     # strings, booleans, ragged lists: refused
                raise TypeError
            if booleans and isinstance(x, list) and any(
                    type(v) is bool for v in np.asarray(x, dtype=object).ravel()):
                raise TypeError                  # true and false are not numbers
            # + 0.0 makes -0.0 the query 0.0 (one query, one hash, one charge)
            arr = raw.astype(np.float64) + 0.0
        except (TypeError, ValueError, OverflowError):
            raise DataError("queries must be a list of arrays of numbers") from None
        if arr.ndim == len(self.input_shape):
            raise DataError(f"queries must be a list of queries of shape "
                            f"{list(self.input_shape)}: wrap a single query in a list")
        if arr.shape[1:] != self.input_shape or arr.ndim != len(self.input_shape) + 1:
            raise DataError(f"each query must have shape {list(self.input_shape)}, got "
                            f"{list(arr.shape[1:])}")
        if len(arr) == 0:
            raise DataError("no queries given")
        bad = ~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1)
        if bad.any():
            raise DataError(f"query {int(np.flatnonzero(bad)[0])} has a NaN or infinite value")
        if self.input_norm_bound is not None:
            norms = np.linalg.norm(arr.reshape(len(arr), -1), axis=1)
            out = norms > self.input_norm_bound
            if out.any():
                raise DataError(f"query {int(np.flatnonzero(out)[0])} lies outside the declared "
                                f"input domain (L2 norm <= {self.input_norm_bound:g})")
        return np.ascontiguousarray(arr)

    def submit(self, principal: Principal, queries: np.ndarray, *,
               idempotency_key: str | None = None) -> Future:
        """Answer checked queries (`check_queries`) for a client: a future of `Answered`.
        With an ``idempotency_key``, a retry of the same request (by this client) gets the
        answer recorded the first time, charged once (`mechanisms.ledger.AnswerRequest`)."""
        return self._put("predict", principal, queries, idempotency_key)

    def radii(self, queries: np.ndarray) -> Future:
        """Owner-only: predictions and radii (a future of a dict)."""
        return self._put("radii", None, queries)

    def budget(self, principal: Principal) -> Future:
        """A client's own spend and what remains to it and to the dataset."""
        return self._put("budget", principal, None)

    def entries(self, limit: int) -> Future:
        """Owner-only: the ledger's newest entries."""
        return self._put("entries", None, int(limit))

    def overview(self, clients: list[dict]) -> Future:
        """Owner-only: what the owner's page shows (a future of a dict): the guarantee, the
        dataset's spend over time, per client (``clients``: dicts with ``id``, ``name``,
        ``role``, ``budget``) its spend and charges (the ledger's) and its answered, cached
        and refused counts since this process started, and the radii of answered queries."""
        return self._put("overview", None, list(clients))

    def close(self) -> None:
        """Finish the queued requests, then stop the worker and close the ledger."""
        self._queue.put(None)
        self._worker.join()

    # -- the worker -----------------------------------------------------------------------

    def _put(self, kind: str, principal, payload, idempotency_key=None) -> Future:
        if not self._worker.is_alive():
            raise PrivacyError("the prediction service has stopped")
        future: Future = Future()
        self._queue.put(_Task(kind, principal, payload, future, idempotency_key))
        return future

    def _run(self) -> None:
        from mechanisms import Ledger

        try:
            ledger = Ledger.open(self._ledger_path, **self._ledger_args)
            if ledger.is_rdp:    # refused at start, not on every request
                ledger.close()
                raise PrivacyError(f"{self._ledger_path} is an rdp ledger; the service answers "
                                   f"through ledgers of the standard, best, advanced or tight "
                                   f"accountant (their running totals)")
        except BaseException as exc:
            self._failed = exc
            self._ready.set()
            return
        with ledger:
            self.relation = ledger.relation
            try:
                self.guarantee = self.mechanism.guarantee(ledger.relation)
            except AGTError as exc:
                self._failed = exc
                self._ready.set()
                return
            self._ledger = ledger
            #: the ledger's name for messages (a URL without its password)
            self.ledger_name = ledger.path
            self._charge = self._charge_per_query(ledger)
            self._ready.set()
            self._warm_up()
            while True:
                task = self._queue.get()
                if task is None:
                    return
                batch = [task]
                size = len(task.payload) if task.kind == "predict" else 0
                # requests that arrive within a moment of the first share its transaction
                # (one disk sync) and its certification pass
                deadline = time.monotonic() + self.batch_wait
                while size < self.max_batch_queries:
                    try:
                        nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    if nxt is None:
                        self._queue.put(None)     # stop after this batch
                        break
                    batch.append(nxt)
                    if nxt.kind == "predict":
                        size += len(nxt.payload)
                self._serve(batch)

    def _warm_up(self) -> None:
        """Certify one all-zero query (its result is dropped) so that the model's first use
        (loading, compiling) is paid before the service says it is ready."""
        try:
            inputs, _ = self._inputs_for(np.zeros((1, *self.input_shape)),
                                         radii=self.mechanism.uses_radii)
            self._source_id = inputs.source.source_id
        except Exception:   # noqa: BLE001 - a first request will meet (and report) the same
            pass
        finally:
            self._warm.set()

    def _charge_per_query(self, ledger) -> tuple[float, float] | None:
        """The (eps, delta) the ledger charges per new query of a per-query mechanism, or per
        new session of a stability-gated one (`Ledger.charge_for`), or None where the
        guarantee is one the ledger refuses anyway (no pre-certification check then)."""
        try:
            return ledger.charge_for(self.guarantee)
        except AGTError:
            return None

    def _dataset_can_pay(self) -> bool:
        """Whether the dataset's budget can pay for one more query (`Ledger.fits`), asked
        once per batch, of the totals the ledger committed last (``known``: no read of the
        database; they are at most the recorded ones, so a False is final, and a True is
        confirmed by the ledger inside its write transaction); of the database itself at
        the first batch and after the ledger refused a request on the dataset's budget (its
        totals then may be other replicas' newer ones). A ledger of the tight accountant
        composes a privacy-loss distribution for it (about as costly as certifying a
        batch), so there the answer is asked only at start and after such a refusal; once
        the budget cannot pay it never can again (spends only grow)."""
        if self._charge is None or self._dataset_spent is True:
            return self._charge is None
        if self._ledger.accountant_name == "tight" and self._dataset_spent is False:
            return True
        self._dataset_spent = not self._ledger.fits(1, *self._charge,
                                                    known=self._dataset_spent is False)
        return not self._dataset_spent

    def _unpayable(self, principal: Principal, dataset_fits: bool) -> BudgetExceededError | None:
        """The refusal of a client that cannot pay for one more charge, decided before any
        certification from the ledger's records (or None: let the ledger decide).

        What would be charged: one more query of a per-query mechanism (a request of n new
        queries costs n such charges; if one does not fit, n do not: every accountant's total
        grows with the charges). For a stability-gated session mechanism, nothing while the
        client has a session open (`Ledger.has_open_session`: the answering door continues it
        at no charge), else one session's charge. Queries answered before (the answers cache)
        cost nothing, but a client refused here cannot pay for any new one.

        The dataset: `Ledger.fits` (one more charge composed with every recorded one, the
        ledger's own accountant). The client: `Ledger.client_fits`, the charge path's own
        composition and comparison (`ChargePath._check_client_budget`) over the same
        recorded charges, under every accountant; so no client the ledger would charge is
        refused here (the ledger's check, inside its write transaction, still decides every
        request let through). A refusal is remembered per (client, budget, charge): recorded
        charges are never removed and an accountant's total only grows with them, so the
        verdict holds for good, also across replicas, which only add charges; a budget
        changed in the keys (an edited keys file or keys table) is a new key of the cache and
        is asked again. So under the tight accountant the costly composition is paid once per
        spent client, not once per request.

        What the refused client learns: that its own budget (or the dataset's, which every
        429 reports anyway) cannot pay for one more charge, and for a session mechanism
        whether its own session is open (the ``session.closed`` of its last answer already
        said so). All three are functions of released outputs and of its own key, never of
        the queries in the request, which are not looked at.
        """
        if self._charge is None:
            return None
        ledger, (eps, delta) = self._ledger, self._charge
        what = "one more query"
        if not self.mechanism.per_query:
            if self._source_id is None or ledger.has_open_session(
                    principal.id, self._source_id, self.mechanism):
                return None
            what = "a new session"
        if not dataset_fits:
            return BudgetExceededError(f"the dataset's budget cannot pay for {what}")
        if principal.budget is None:
            return None
        verdict = (principal.id, principal.budget, self._charge)
        if verdict not in self._spent_clients:
            if ledger.client_fits(principal.id, principal.budget, 1, eps, delta):
                return None
            self._spent_clients.add(verdict)
        return BudgetExceededError(
            f"client {principal.id}: its budget cannot pay for {what} at "
            f"(eps={eps!r}, delta={delta!r}); nothing was certified or released")

    def _serve(self, batch: list[_Task]) -> None:
        predicts, dataset_fits = [], None
        for task in batch:
            if task.kind != "predict":
                self._settle(task, self._other, task)
                continue
            try:
                if task.idempotency_key is not None and self._ledger.has_idempotent_answer(
                        task.principal.id, task.idempotency_key):
                    # a retry of an answered request: the ledger replays what was paid for
                    # (charging nothing), even once the budget is spent
                    refusal = None
                else:
                    if dataset_fits is None:
                        dataset_fits = self._dataset_can_pay()
                    refusal = self._unpayable(task.principal, dataset_fits)
            except Exception as exc:             # the ledger cannot be read: as in _settle
                refusal = PrivacyError(f"cannot read the privacy ledger ({type(exc).__name__})")
            if refusal is None:
                predicts.append(task)
            else:
                self._count(task.principal.id, refused=1)
                task.future.set_exception(refusal)
        if predicts:
            try:
                answers, radii = self._answer(predicts)
            except BaseException as exc:          # the ledger failed: every request fails
                for task in predicts:
                    task.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            for task, answer, radius in zip(predicts, answers, radii):
                if isinstance(answer, Exception):
                    if isinstance(answer, BudgetExceededError) and \
                            not str(answer).startswith("client "):
                        self._dataset_spent = None     # the dataset's budget: ask again
                    self._count(task.principal.id, refused=1)
                    task.future.set_exception(answer)
                else:
                    fresh = ~np.asarray(answer.cached, dtype=bool)
                    self._count(task.principal.id, answered=int(fresh.sum()),
                                cached=int((~fresh).sum()))
                    if radius is not None:
                        self._radius_counts.update(int(r) for r in radius[fresh])
                    task.future.set_result(answer)

    def _count(self, client: str, answered: int = 0, cached: int = 0, refused: int = 0) -> None:
        row = self._counts.setdefault(client, [0, 0, 0])
        row[0] += answered
        row[1] += cached
        row[2] += refused

    @staticmethod
    def _settle(task: _Task, fn, *args) -> None:
        import sqlite3

        try:
            task.future.set_result(fn(*args))
        except sqlite3.Error as exc:
            task.future.set_exception(PrivacyError(f"cannot read the privacy ledger "
                                                   f"({type(exc).__name__})"))
        except Exception as exc:
            task.future.set_exception(exc)

    def _inputs_for(self, x: np.ndarray, radii: bool = True):
        from mechanisms.ledger import hash_queries

        cert = self._certifier.certify(x, radii=radii)
        hashes = hash_queries(x)
        return self._inputs.from_certificate(cert, hashes, with_radii=radii), cert

    def _answer(self, tasks: list[_Task]) -> tuple[list, list]:
        """The ledger's answers to the tasks, and per task its queries' stability radii
        (owner-only, for the owner's page; None where the mechanism computes none)."""
        from mechanisms.ledger import AnswerRequest

        x = np.concatenate([t.payload for t in tasks])
        inputs, cert = self._inputs_for(x, radii=self.mechanism.uses_radii)
        self._source_id = inputs.source.source_id
        radius = self._radius_of(inputs, cert)
        requests, radii, start = [], [], 0
        for task in tasks:
            n = len(task.payload)
            requests.append(AnswerRequest(self.mechanism, inputs.subset(slice(start, start + n)),
                                          task.principal.id, task.principal.budget,
                                          task.idempotency_key))
            radii.append(None if radius is None else radius[start:start + n])
            start += n
        return self._ledger.answer_batch(requests), radii

    def _radius_of(self, inputs, cert) -> np.ndarray | None:
        """Each query's stability radius where it was computed: the model's, or the ensemble's
        vote radius (`mechanisms.votes.ensemble_radius`)."""
        if self.kind == "ensemble":
            if getattr(inputs, "radii", None) is None:
                return None
            from mechanisms.votes import ensemble_radius
            return np.asarray(ensemble_radius(inputs.votes, inputs.radii, "tight",
                                              inputs.n_classes))
        return None if cert.radius is None else np.asarray(cert.radius)

    def _other(self, task: _Task):
        ledger = self._ledger
        if task.kind == "radii":
            inputs, cert = self._inputs_for(task.payload)
            if self.kind == "ensemble":
                from mechanisms.votes import aggregate, ensemble_radius
                answer = aggregate(inputs.votes, inputs.n_classes)
                radius = ensemble_radius(inputs.votes, inputs.radii, "tight", inputs.n_classes)
                return {"prediction": answer.tolist(), "radius": radius.tolist()}
            return {"prediction": cert.prediction.tolist(), "radius": cert.radius.tolist(),
                    "max_certified_k": cert.max_certified_k.tolist()}
        if task.kind == "entries":
            rows = ledger.entries()[-task.payload:] if task.payload > 0 else []
            return [{"id": e.id, "time": e.time, "mechanism": e.mechanism, "epsilon": e.epsilon,
                     "delta": e.delta, "seeded": e.seeded, "note": e.note} for e in rows]
        if task.kind == "budget":
            return self._budget(task.principal)
        if task.kind == "overview":
            return self._overview(task.payload)
        raise PrivacyError(f"internal: unknown task {task.kind!r}")

    def _budget(self, principal: Principal) -> dict:
        ledger = self._ledger
        mine = ledger.client_spent(principal.id)
        spent = ledger.spent()
        out = {"client": principal.id,
               "spent": {"epsilon": 0.0 if mine is None else mine.epsilon,
                         "delta": 0.0 if mine is None else mine.delta},
               "budget": None, "remaining": None,
               "dataset": {"budget": {"epsilon": ledger.budget_epsilon,
                                      "delta": ledger.budget_delta},
                           "remaining": {"epsilon": max(0.0, ledger.budget_epsilon
                                                        - spent.epsilon),
                                         "delta": max(0.0, ledger.budget_delta - spent.delta)},
                           "accountant": ledger.accountant_name}}
        if principal.budget is not None:
            eps_b, delta_b = principal.budget
            out["budget"] = {"epsilon": eps_b, "delta": delta_b}
            out["remaining"] = {"epsilon": max(0.0, eps_b - out["spent"]["epsilon"]),
                                "delta": max(0.0, delta_b - out["spent"]["delta"])}
        return out

    def _overview(self, clients: list[dict]) -> dict:
        ledger = self._ledger
        entries = ledger.entries()
        # the composed spend after the first m charges, at up to CURVE_POINTS values of m
        # (the ledger's accountant composes; each point is one composition)
        steps = sorted({round(i * len(entries) / CURVE_POINTS)
                        for i in range(1, CURVE_POINTS + 1)} - {0})
        curve, groups, done = [], Counter(), 0
        for m in steps:
            groups.update((e.epsilon, e.delta) for e in entries[done:m])
            done = m
            total = ledger.accountant.compose_groups(
                sorted((eps, delta, c) for (eps, delta), c in groups.items()),
                delta_budget=ledger.budget_delta)
            curve.append({"charges": m, "time": entries[m - 1].time,
                          "epsilon": total.epsilon, "delta": total.delta})
        # a charge's note names its client ("; client ID"): the ledger's record of who
        charges = Counter(m.group(1) for e in entries
                          for m in [re.search(r"; client (\w+)", e.note)] if m)
        rows = []
        for client in clients:
            spent = ledger.client_spent(client["id"])
            answered, cached, refused = self._counts.get(client["id"], (0, 0, 0))
            rows.append({**client, "charges": charges.get(client["id"], 0),
                         "spent": {"epsilon": 0.0 if spent is None else spent.epsilon,
                                   "delta": 0.0 if spent is None else spent.delta},
                         "answered": answered, "cached": cached, "refused": refused})
        spent = ledger.spent()
        return {"info": self.info(), "started": self.started,
                "ledger": {"budget": {"epsilon": ledger.budget_epsilon,
                                      "delta": ledger.budget_delta},
                           "spent": {"epsilon": spent.epsilon, "delta": spent.delta},
                           "accountant": ledger.accountant_name, "charges": len(entries)},
                "curve": curve, "clients": rows,
                "radii": dict(sorted(self._radius_counts.items()))
                if self.mechanism.uses_radii else None}
