"""The answering door: requests answered through the ledger as a prediction service does
(`Ledger.answer_batch`), with the answers cache, stability-gated sessions across requests,
per-client budgets and idempotent retries. Every charge goes through the charge path
(charge.py) inside one write transaction per batch.

The answers cache. A request's new answers are one append-only ``answer_blocks`` row
(schema.py), written in the transaction of its charges; lookups go to an in-memory index
per `Ledger` object (index.py), never to a per-answer table. Why two objects on one
database (two processes, two replicas) never release two labels for one query:

1. Every block is written inside a write transaction, which holds the ledger's write lock
   from before its first read to its commit or rollback (stores.py: SQLite's BEGIN
   IMMEDIATE; PostgreSQL's row lock on ``ledger_meta``). So the writers are serial, and a
   block's id (the largest plus one, chosen under the lock) grows with the commit order.
2. `answer_batch` opens its transaction, takes the lock, and only then catches the index
   up: it reads every block with an id above the last one it holds (with the largest id,
   in one statement). Under the lock, that read sees every committed block (SQLite: the
   lock excludes other writers and the read is of the file as committed; PostgreSQL, READ
   COMMITTED: the statement's snapshot is taken after the lock was granted, hence after the
   commit of every earlier holder; in pipeline mode too, where the server runs the
   statements one after the other: stores.py), and
   no block is committed until this transaction ends. Every block committed before has an
   id at most the largest read (1.), so the index then holds every released answer.
3. Every lookup that decides a release is made after that catch-up, inside the same
   transaction (blocks of its own earlier requests are consulted from the pending list).
   A query answered before is therefore always found, served its label and not charged or
   drawn again.
4. A block enters the index only after its transaction committed; a rollback (of the
   whole batch, or of one request's savepoint) drops its pending blocks, so the index never
   holds an answer the database does not. After the commit the index's last id is the
   largest of its own blocks: every block below it was read at the catch-up or written
   here (1.), so nothing is skipped at the next catch-up.

Assumptions the argument rests on, and what checks them: blocks are never removed, so ids
never go back and a block never changes (append-only triggers; a ledger restored from a
backup under an open object would break it, so a catch-up that finds the largest id below
the last one read, or that block missing or with other digests or labels, refuses,
`AnswerIndex.catch_up`); PostgreSQL transactions run at READ COMMITTED (asked for in every
write transaction's BEGIN, whatever the database's default). "The same query" means the
same source, noise kind and mechanism with the same parameter values (`canonical_params`:
``1``, ``1.0`` and ``np.float64(1.0)`` are one epsilon).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from agt.errors import DataError, PrivacyError
from mechanisms.base import Mechanism
from mechanisms.checks import check_delta, check_epsilon, privacy_problems
from mechanisms.ledger.index import BLOCK_INT, DIGEST, digests_of, hash_bytes_of
from mechanisms.ledger.records import (
    Answered,
    AnswerRequest,
    IdempotencyError,
    _now,
    _Prepared,
    idempotency_key_problem,
)
from mechanisms.ledger.schema import run_hashes
from mechanisms.ledger.stores import StoreError
from mechanisms.noise import REFUSED, make_generator

#: what separates the fields of an answer's key: refused inside them (`_prepare_answer`), so
#: two different (source, mechanism, query) never make one key
_KEY_SEPARATOR = "|"


def _answer_key(source_id: str, mechanism: str, query_hash: str, seeded: bool = False
                ) -> bytes:
    """The answers table's key: the first 16 bytes of SHA-256(source | mechanism | hash),
    the mechanism marked ``#seeded`` for answers drawn with seeded test noise, so that such a
    label (whose noise anyone with the seed can remove) is never served to a request drawn
    with secure noise, nor the other way round."""
    name = f"{mechanism}#seeded" if seeded else mechanism
    return hashlib.sha256(_KEY_SEPARATOR.join((source_id, name, query_hash)).encode()
                          ).digest()[:16]


def canonical_params(mechanism: Mechanism) -> str:
    """The mechanism's name and parameters in one canonical form: the answers cache's
    namespace. Equal values give equal strings whatever their Python type (``1``, ``1.0``
    and ``np.float64(1.0)`` are one epsilon; booleans stay booleans), so a label released at
    some parameters is served again to every request at the same values, and never to a
    request at other values. Mechanisms that are not dataclasses fall back to ``repr``.

    Args:
        mechanism: the mechanism.

    Returns:
        ``name(field=value, ...)`` with numbers written as ``repr(float(value))``.
    """
    if not dataclasses.is_dataclass(mechanism):
        return repr(mechanism)

    def value(v):
        if isinstance(v, (bool, np.bool_)):
            return repr(bool(v))
        if isinstance(v, (int, float, np.integer, np.floating)):
            return repr(float(v))
        return repr(v)

    fields = ", ".join(f"{f.name}={value(getattr(mechanism, f.name))}"
                       for f in dataclasses.fields(mechanism))
    return f"{type(mechanism).__name__}({fields})"


class AnsweringDoor:
    """`answer`, `answer_batch` and `client_spent` of `Ledger` (a mixin)."""

    def answer(self, mechanism: Mechanism, inputs, *, client: str = "",
               client_budget: tuple[float, float] | None = None,
               insecure_rng: np.random.Generator | None = None) -> Answered:
        """`answer_batch` for one request; raises its refusal instead of returning it.

        Args:
            mechanism: a per-query or stability-gated session mechanism.
            inputs: its inputs, with every query's hash as ``query_ids``.
            client: the client's id ("" for none).
            client_budget: the client's own (epsilon, delta) budget, or None.
            insecure_rng: seeded noise for tests only (recorded).

        Returns:
            The request's `Answered`.

        Raises:
            BudgetExceededError: over the client's or the dataset's budget.
            PrivacyError: refused inputs, or a ledger that cannot be written.
        """
        out = self.answer_batch([AnswerRequest(mechanism, inputs, client, client_budget)],
                                insecure_rng=insecure_rng)[0]
        if isinstance(out, Exception):
            raise out
        return out

    def answer_batch(self, requests: Sequence[AnswerRequest], *,
                     insecure_rng: np.random.Generator | None = None
                     ) -> list[Answered | Exception]:
        """Answer several requests in one transaction: cached answers, charge, draw, record.

        Per request, in order: queries whose hash (``inputs.query_ids``, required) was
        answered before by this source and mechanism get the label released then, at no
        charge (post-processing of that release; the same query asked twice within a request
        is one query). The other queries are charged against the ledger's budget and the
        client's own (``client_budget``; the ledger's budget caps every client together),
        their labels drawn, and the charges, the client and the labels recorded. A
        stability-gated session mechanism (`per_query` False) keeps one session per client,
        source and mechanism across requests: its state is loaded, advanced and stored, and
        a new session is charged when the last one reached its cutoff.

        The labels are drawn *before* the commit and returned only after it, so a crash at
        any moment leaves either no record and no label, or a record whose label a retry
        gets from the answers: never a label without its record, never two charges for one
        query. A request that is refused (its inputs, a budget) returns its exception in its
        place and records and draws nothing; the others go on. A failure of the database
        itself rolls back every request and raises.

        Args:
            requests: the requests (`AnswerRequest`), answered in this order.
            insecure_rng: seeded noise for tests only (every row records it).

        Returns:
            Per request, its `Answered`, or the exception that refused it
            (`BudgetExceededError`, `IdempotencyError`, `PrivacyError`, `DataError`).

        Raises:
            PrivacyError: the ledger is an rdp ledger, or its database failed (every
                request of the batch rolled back, nothing released).
        """
        if self.is_rdp:
            raise PrivacyError(f"the ledger {self.path} composes Renyi curves (rdp accountant); "
                               f"the answering door keeps running totals of (eps, delta) "
                               f"charges and takes standard, advanced, best or tight ledgers "
                               f"only: release through Ledger.release, or serve from a ledger "
                               f"of another accountant")
        rng = insecure_rng if insecure_rng is not None else make_generator(None)
        seeded = insecure_rng is not None
        prepared = []
        for request in requests:
            try:
                prepared.append(self._prepare_answer(request))
            except (PrivacyError, DataError, ValueError) as exc:
                prepared.append(exc)
        out: list[Answered | Exception] = []
        # the blocks this transaction writes: in the index only once it committed
        pending: list[tuple[int, tuple, NDArray, NDArray]] = []
        self._pending = pending
        try:
            with self._writing(pipelined=True) as db:
                db.ensure_answer_tables()
                # under the write lock (module docstring): every block committed before
                # this transaction is in the index before anything is decided
                self._answer_index.catch_up(db)
                committed = self._committed_answers(prepared, seeded)
                for item, found in zip(prepared, committed):
                    if isinstance(item, Exception):
                        out.append(item)
                        continue
                    # each request is all or nothing within the batch: a refusal or a
                    # failed draw undoes what the request had recorded
                    db.savepoint()
                    mark = len(pending)
                    try:
                        out.append(self._answer_idempotent(item, rng, seeded, found))
                    except StoreError:
                        raise              # the database failed: every request rolls back
                    except (PrivacyError, DataError) as exc:
                        db.rollback_to_savepoint()
                        del pending[mark:]
                        out.append(exc)
                    db.release_savepoint()
                if any(isinstance(a, Answered) and a.charges for a in out):
                    self._dataset = db.read_dataset()
        finally:
            self._pending = None
        # committed (a rollback raised above and left the index as it was): the blocks
        # follow every block the catch-up read, so the index now holds every block up to
        # the last one written here
        index = self._answer_index
        for block_id, namespace, digests, labels in pending:
            index.add(namespace, digests, labels)
            index.advance(block_id, digests, labels)
        return out

    def _committed_answers(self, prepared: list, seeded: bool) -> list:
        """Per prepared request, its namespace and what the index holds for each of its
        queries (found, label), looked up for every request of a namespace at once. Asked
        after the catch-up, inside the write transaction: the index changes only after the
        commit (`answer_batch`), so this is what each request's own lookup would find; the
        answers of the transaction's earlier requests are its pending blocks
        (`_cached_labels`)."""
        params: dict[int, str] = {}          # one canonical form per mechanism object
        spaces: dict[tuple, list[int]] = {}
        namespaces: list = [None] * len(prepared)
        for i, item in enumerate(prepared):
            if isinstance(item, Exception):
                continue
            mechanism = item.request.mechanism
            if id(mechanism) not in params:
                params[id(mechanism)] = canonical_params(mechanism)
            namespace = (item.request.inputs.source.source_id, mechanism.name,
                         params[id(mechanism)], seeded)
            namespaces[i] = namespace
            spaces.setdefault(namespace, []).append(i)
        out: list = [None] * len(prepared)
        for namespace, members in spaces.items():
            digests = [prepared[i].digests for i in members]
            found, labels = self._answer_index.lookup(namespace, np.concatenate(digests))
            start = 0
            for i, d in zip(members, digests):
                out[i] = (namespace, found[start:start + len(d)], labels[start:start + len(d)])
                start += len(d)
        return out

    def _prepare_answer(self, request: AnswerRequest) -> _Prepared:
        """The checks that read nothing of the ledger's records (before the transaction)."""
        if not isinstance(request, AnswerRequest):
            raise PrivacyError(f"answer_batch takes AnswerRequest objects, got "
                               f"{type(request).__name__}")
        mechanism, inputs = request.mechanism, request.inputs
        guarantee, eps_c, delta_c = self._charge(mechanism, inputs)
        if not mechanism.per_query and not hasattr(mechanism, "continue_session"):
            raise PrivacyError(f"{mechanism.name} answers one release as one session; the "
                               f"answering door serves per-query mechanisms and stability-gated "
                               f"sessions (svt, ens-svt), which continue across requests")
        ids = inputs.query_ids
        if ids is None or len(ids) != inputs.n_queries:
            raise PrivacyError("answering needs every query's hash (inputs.query_ids, "
                               "hash_query of its bytes): the answers are kept by it")
        # 64 lowercase hex digits each (checked once here: the digests, the charge run's
        # bytes), so no hash is empty or holds the key separator
        hash_bytes = hash_bytes_of(ids)
        if "#" in mechanism.name or any(_KEY_SEPARATOR in str(v) for v in
                                        (inputs.source.source_id, mechanism.name)):
            raise PrivacyError(f"source ids, mechanism names and query hashes of the answering "
                               f"door may not contain {_KEY_SEPARATOR!r} (nor a mechanism name "
                               f"'#'): they form the answers' keys")
        if not isinstance(request.client, str):
            raise PrivacyError("client must be a string (the key's id)")
        if request.client_budget is not None:
            problems = privacy_problems(f"client {request.client!r}")
            eps_b, delta_b = request.client_budget
            check_epsilon(eps_b, problems, name="budget_epsilon")
            check_delta(delta_b, problems, name="budget_delta", allow_zero=True)
            problems.raise_if_any()
        key = request.idempotency_key
        if key is not None and idempotency_key_problem(key):
            raise IdempotencyError(idempotency_key_problem(key))
        return _Prepared(request, guarantee, eps_c, delta_c, hash_bytes,
                         digests_of(hash_bytes))

    def has_idempotent_answer(self, client: str, key: str) -> bool:
        """Whether the client's idempotency key has a recorded answer (a retry of it is
        answered from the record, charged nothing). Reads only that client's own record.

        Args:
            client: the client's id.
            key: its idempotency key.

        Returns:
            True when an answer is recorded for (client, key); False otherwise, and where
            the ledger has no idempotency records at all.

        Raises:
            PrivacyError: the ledger's database cannot be read (`StoreError`).
        """
        if not self._db.has_table("idempotency"):
            return False
        return self._db.execute("SELECT 1 FROM idempotency WHERE client = ? AND key = ?",
                                (client, key)).fetchone() is not None

    def _answer_idempotent(self, item: _Prepared, rng: np.random.Generator,
                           seeded: bool, committed: tuple) -> Answered:
        """`_answer_one`, or the answer recorded for the client's idempotency key: the
        request's digest (mechanism, parameters, source, query hashes) must match the one
        recorded with it. A new key's answer is recorded in this same transaction as its
        charges and labels, so a retry after any crash finds both or neither."""
        request = item.request
        if request.idempotency_key is None:
            return self._answer_one(item, rng, seeded, committed)
        mechanism, inputs = request.mechanism, request.inputs
        # an unambiguous encoding (JSON), not a joined string: ("a|b",) and ("a", "b") differ
        digest = hashlib.sha256(json.dumps(
            [mechanism.name, repr(mechanism), inputs.source.source_id,
             list(inputs.query_ids)]).encode()).hexdigest()
        row = self._db.execute("SELECT request_sha256, answer FROM idempotency WHERE "
                               "client = ? AND key = ?",
                               (request.client, request.idempotency_key)).fetchone()
        if row is not None:
            if row[0] != digest:
                raise IdempotencyError(
                    "this Idempotency-Key was used before for another request (other queries "
                    "or another mechanism); nothing was charged or released: use a new key "
                    "for a new request")
            try:
                saved = json.loads(row[1])
                replay = Answered(
                    np.asarray(saved["labels"], dtype=np.int64), item.guarantee,
                    mechanism.name, float(saved["charged_epsilon"]),
                    float(saved["charged_delta"]), bool(saved["seeded"]), mechanism.per_query,
                    cached=np.asarray(saved["cached"], dtype=bool),
                    charges=int(saved["charges"]), sessions_opened=int(saved["sessions_opened"]),
                    session_closed=bool(saved["session_closed"]))
                ok = replay.labels.shape == (inputs.n_queries,) == replay.cached.shape
            except (ValueError, KeyError, TypeError):
                ok = False
            if not ok:            # this request alone is refused, not the batch
                raise IdempotencyError("the answer recorded for this Idempotency-Key is "
                                       "damaged; nothing was charged or released: use a new key")
            return replay
        answered = self._answer_one(item, rng, seeded, committed)
        saved = {"labels": answered.labels.tolist(), "cached": answered.cached.tolist(),
                 "charged_epsilon": answered.charged_epsilon,
                 "charged_delta": answered.charged_delta, "seeded": answered.seeded,
                 "charges": answered.charges, "sessions_opened": answered.sessions_opened,
                 "session_closed": answered.session_closed}
        self._db.write("INSERT INTO idempotency (client, key, request_sha256, answer, time) "
                       "VALUES (?, ?, ?, ?, ?)", (request.client, request.idempotency_key,
                                                  digest, json.dumps(saved), _now()))
        return answered

    def _answer_one(self, item: _Prepared, rng: np.random.Generator, seeded: bool,
                    committed: tuple) -> Answered:
        """One request inside the batch's transaction; `committed`: its namespace and
        what the index holds for each of its queries (`_committed_answers`)."""
        db = self._db
        mechanism, inputs = item.request.mechanism, item.request.inputs
        source = inputs.source
        unbound = self._bind_dataset(source.dataset_sha256)
        ids = inputs.query_ids
        namespace, in_index, index_labels = committed
        # each query once per request: its digest (the first 16 bytes of its hash)
        digests = item.digests
        unique, first, inverse = np.unique(digests, return_index=True, return_inverse=True)
        found, known = self._cached_labels(namespace, unique, ids, first,
                                           (in_index[first], index_labels[first]))
        hit = found[inverse]
        labels = np.where(hit, known[inverse], REFUSED).astype(np.int64)
        # the new queries in the order they were asked (their first occurrences)
        new = np.sort(first[~found])
        answered = Answered(labels, item.guarantee, mechanism.name, item.eps_c, item.delta_c,
                            seeded, mechanism.per_query, cached=hit)
        if len(new) == 0:
            return answered
        # a short note per row (the mechanism's full statement is its name and parameters:
        # `Mechanism.guarantee`); the answering door writes one row per query
        g = item.guarantee
        note = (f"relation={self.relation}; answered by {mechanism.name} at "
                f"({g.epsilon!r}, {g.delta!r}) per {'query' if mechanism.per_query else 'session'}")
        if seeded:
            note += "; INSECURE seeded noise (test generator)"
        if item.request.client:
            note += f"; client {item.request.client}"
        fresh_inputs = inputs.subset(new)
        if mechanism.per_query:
            # the run's hashes: the new queries' bytes, checked when prepared
            release_ids = np.asarray(self._record(item, item.hash_bytes[new].tobytes(),
                                                  len(new), seeded, note), dtype=np.int64)
            fresh = np.asarray(self._draw(mechanism, fresh_inputs, rng), dtype=np.int64)
            charges, sessions_opened, closed = len(new), 0, False
        else:
            fresh, release_ids, charges, sessions_opened, closed = self._answer_session(
                item, fresh_inputs, rng, seeded, note)
        self._store_answers(namespace, digests[new], fresh, release_ids)
        if unbound:
            db.bind_dataset(source.dataset_sha256)
        # repeats within the request get their first occurrence's label
        known[np.searchsorted(unique, digests[new])] = fresh
        labels = np.where(hit, labels, known[inverse]).astype(np.int64)
        return dataclasses.replace(answered, labels=labels, charges=charges,
                                   sessions_opened=sessions_opened, session_closed=closed)

    def _answer_session(self, item, inputs, rng, seeded, note):
        """Queries of a stability-gated session mechanism, within the client's open session,
        opening (and charging) a new one whenever the last one closed. Returns the labels,
        each query's release id (its session's), the charges, the sessions opened and
        whether one closed."""
        db, mechanism = self._db, item.request.mechanism
        client, source_id = item.request.client, inputs.source.source_id
        params = repr(mechanism)
        labels = np.full(inputs.n_queries, REFUSED, dtype=np.int64)
        release_ids = np.zeros(inputs.n_queries, dtype=np.int64)
        charges = opened = 0
        closed = False
        done = 0
        row = db.execute("SELECT params, release_id, rho, tops FROM sessions WHERE client = ? "
                           "AND source_id = ? AND mechanism = ?",
                           (client, source_id, mechanism.name)).fetchone()
        state = session_id = None
        if row is not None and row[0] == params:
            session_id, state = row[1], mechanism.session_state(int(row[2]), int(row[3]))
        while done < inputs.n_queries:
            rest = inputs.subset(slice(done, None))
            if state is None:
                session_hash = hashlib.sha256(
                    "|".join(rest.query_ids).encode()).hexdigest()
                # a session that cannot be paid refuses the whole request (the caller's
                # savepoint undoes its earlier sessions): no partial answer that a retry
                # would answer otherwise
                session_id = self._record(item, run_hashes([session_hash]), 1, seeded,
                                          f"{note}; a session across requests")[0]
                state = mechanism.open_session(rng)
                charges, opened = charges + 1, opened + 1
            try:
                part, state, answered = mechanism.continue_session(rest, state, rng)
            except Exception as exc:
                raise PrivacyError(f"{mechanism.name}: drawing the labels failed "
                                   f"({type(exc).__name__})") from None
            labels[done:done + answered] = part[:answered]
            release_ids[done:done + answered] = session_id
            done += answered
            if mechanism.session_closed(state):
                closed = True
                self._store_session(client, source_id, mechanism.name, params, session_id,
                                    state)
                state = None
        if state is not None:
            self._store_session(client, source_id, mechanism.name, params, session_id, state)
        return labels, release_ids, charges, opened, closed

    @staticmethod
    def _draw(mechanism: Mechanism, inputs, rng) -> NDArray[np.int64]:
        try:
            return mechanism.release(inputs, rng)
        except Exception as exc:
            # every parameter and input was checked before; the message names only the
            # error's type: its text may hold private values. The transaction rolls back.
            raise PrivacyError(f"{mechanism.name}: drawing the labels failed "
                               f"({type(exc).__name__}); nothing was recorded or released"
                               ) from None

    def _cached_labels(self, namespace: tuple, unique: NDArray, ids: Sequence[str],
                       first: NDArray, committed: tuple[NDArray, NDArray]
                       ) -> tuple[NDArray, NDArray]:
        """(found, label) per digest of `unique`: the answers released before in the
        namespace (committed: the index, caught up under the lock, as `committed` gives
        them, fresh arrays; or earlier in this transaction: its pending blocks), else, in a
        ledger answered before the blocks, its ``answers`` table under the old key (the
        first 16 bytes of SHA-256(source | mechanism name | hash)); `ids[first[i]]` is the
        hash of `unique[i]`."""
        found, labels = committed
        for _, space, digests, block_labels in self._pending or ():
            if space != namespace or found.all():
                continue
            order = np.argsort(digests)
            pos = np.minimum(np.searchsorted(digests[order], unique), len(digests) - 1)
            hit = (digests[order][pos] == unique) & ~found
            labels[hit] = block_labels[order][pos[hit]]
            found |= hit
        legacy = self._answer_index.legacy
        if legacy is not None and len(legacy) and not found.all():
            # (answers of the old table carry no parameters: served by mechanism name, as
            # they were before the blocks)
            source_id, name, _, seeded = namespace
            miss = np.flatnonzero(~found)
            keys = np.array([_answer_key(source_id, name, ids[first[i]], seeded)
                             for i in miss], dtype=DIGEST)
            old_found = np.zeros(len(miss), dtype=bool)
            old_labels = np.zeros(len(miss), dtype=np.int64)
            legacy.lookup(keys, old_found, old_labels)
            found[miss[old_found]] = True
            labels[miss[old_found]] = old_labels[old_found]
        return found, labels

    def _store_answers(self, namespace: tuple, digests: NDArray, labels: NDArray,
                       release_ids: NDArray) -> None:
        """Append the request's new answers as one block (one row), pending in the index
        until the transaction commits."""
        source_id, name, params, seeded = namespace
        labels = np.asarray(labels, dtype=BLOCK_INT)
        block_id = self._db.insert_block((
            source_id, name, params, int(seeded), len(digests), digests.tobytes(),
            labels.tobytes(), np.asarray(release_ids, dtype=BLOCK_INT).tobytes()))
        self._pending.append((block_id, namespace, np.asarray(digests, dtype=DIGEST),
                              labels.astype(np.int64)))

    def recorded_answers(self) -> list[tuple[int, int]]:
        """Every released answer the ledger keeps (owner-only: labels with their charges).

        Returns:
            (release id, label) per answer, of the answer blocks and of the ``answers``
            table of ledgers answered before them, in release-id order.

        Raises:
            PrivacyError: the ledger's database cannot be read (`StoreError`).
        """
        out: list[tuple[int, int]] = []
        if self._db.has_table("answers"):
            out.extend((int(r), int(v)) for v, r in
                       self._db.execute("SELECT label, release_id FROM answers"))
        if self._db.has_table("answer_blocks"):
            for labels, ids in self._db.execute("SELECT labels, release_ids FROM "
                                                "answer_blocks ORDER BY id"):
                out.extend(zip(np.frombuffer(bytes(ids), dtype=BLOCK_INT).tolist(),
                               np.frombuffer(bytes(labels), dtype=BLOCK_INT).tolist()))
        return sorted(out)

    def _store_session(self, client: str, source_id: str, mechanism: str, params: str,
                       session_id: int, state) -> None:
        self._db.write(
            "INSERT INTO sessions (client, source_id, mechanism, params, release_id, rho, tops) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (client, source_id, mechanism) DO UPDATE "
            "SET params = excluded.params, release_id = excluded.release_id, "
            "rho = excluded.rho, tops = excluded.tops",
            (client, source_id, mechanism, params, int(session_id), int(state.rho),
             int(state.tops)))

    def client_spent(self, client: str):
        """A client's composed charges.

        Args:
            client: the client's id (an API key's id).

        Returns:
            Its `Composition` under the ledger's accountant (at the ledger's delta), or None
            before the answering door recorded any charge of it.

        Raises:
            PrivacyError: the ledger's database cannot be read (`StoreError`).
        """
        if not self._has_totals():
            return None
        groups = self._client_groups(client)
        if not groups:
            return None
        return self.accountant.compose_groups(sorted(groups), delta_budget=self.budget_delta)
