"""The prediction service's core: a release source, one mechanism and the ledger, answering
requests as they arrive, with concurrent requests batched into one ledger transaction.

`PredictionService` is library code (the HTTP layer, `agt.service.app`, is a thin shell on
top of it): ``submit(principal, queries)`` returns a future of the request's `Answered`
(from `mechanisms.Ledger.answer_batch`, the same door as every release). One worker thread
owns the ledger connection and the certifier; it takes every request waiting in its queue
(up to a number of queries), certifies their queries in one pass, and answers them in one
transaction, so one disk sync serves many requests. Every label leaves only after that
transaction committed (`Ledger.answer_batch`).
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agt.errors import AGTError, DataError, PrivacyError
from agt.service.keys import Principal

#: the most queries the worker takes into one batch (requests are never split)
BATCH_QUERIES = 4096
#: seconds the worker waits for more requests to join a batch
BATCH_WAIT = 0.002


@dataclass(frozen=True)
class _Task:
    kind: str              # "predict", "radii", "budget", "entries"
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

    def check_queries(self, x) -> np.ndarray:
        """The queries as a float64 array (n, *input_shape), or a DataError naming the first
        problem (shape, a value that is not a finite number, a query outside the declared
        domain)."""
        try:
            raw = np.asarray(x)
            if raw.dtype.kind not in "iuf":     # strings, booleans, ragged lists: refused
                raise TypeError
            if isinstance(x, list) and any(type(v) is bool
                                           for v in np.asarray(x, dtype=object).ravel()):
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
            self._ready.set()
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

    def _serve(self, batch: list[_Task]) -> None:
        predicts = [t for t in batch if t.kind == "predict"]
        for task in batch:
            if task.kind != "predict":
                self._settle(task, self._other, task)
        if predicts:
            try:
                answers = self._answer(predicts)
            except BaseException as exc:          # the ledger failed: every request fails
                for task in predicts:
                    task.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            for task, answer in zip(predicts, answers):
                if isinstance(answer, Exception):
                    task.future.set_exception(answer)
                else:
                    task.future.set_result(answer)

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

    def _answer(self, tasks: list[_Task]) -> list:
        from mechanisms.ledger import AnswerRequest

        x = np.concatenate([t.payload for t in tasks])
        inputs, _ = self._inputs_for(x, radii=self.mechanism.uses_radii)
        requests, start = [], 0
        for task in tasks:
            n = len(task.payload)
            requests.append(AnswerRequest(self.mechanism, inputs.subset(slice(start, start + n)),
                                          task.principal.id, task.principal.budget,
                                          task.idempotency_key))
            start += n
        return self._ledger.answer_batch(requests)

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
