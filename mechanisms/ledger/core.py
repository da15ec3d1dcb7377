"""The `Ledger` class: opening, the accounting reads, and the release doors (`release`,
`release_estimate`; the answering door is in answers.py). Every spend goes through the charge
path (charge.py)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from agt.errors import PrivacyError
from mechanisms.accounting import Accountant, Composition, SpendGroup
from mechanisms.base import Mechanism
from mechanisms.guarantee import Guarantee
from mechanisms.ledger.answers import AnsweringDoor
from mechanisms.ledger.charge import ChargePath
from mechanisms.ledger.index import AnswerIndex
from mechanisms.ledger.records import LedgerEntry, Release, _Charge, _now
from mechanisms.ledger.schema import (
    _ANSWER_TABLES,
    _ANSWERS_FROZEN_SQLITE,
    _BLOCKS_SQLITE,
    _RDP_SCHEMA,
    _RDP_TABLES,
    _SCHEMA,
    _TABLES,
    HASH_BYTES,
    MIGRATES_FROM,
    POSTGRES_TABLES,
    _check_given,
    _compare,
    _create,
    _read_meta,
    newer_check,
)
from mechanisms.ledger.stores import StoreError, is_url, open_store
from mechanisms.noise import make_generator
from mechanisms.rdp import compose_curves, curve_epsilon, curve_from_bytes, curve_of


class Ledger(ChargePath, AnsweringDoor):
    """A privacy-budget ledger stored in one SQLite file or one PostgreSQL database; see the
    package docstring (mechanisms/ledger/__init__.py).

    Open one with `Ledger.open` (a path or a ``postgresql://`` URL) or `Ledger.in_memory`.
    """

    def __init__(self, store, path: str, meta: dict):
        self._db = store
        #: the ledger's name: its file's path, or its URL without the password
        self.path = path
        self.budget_epsilon: float = meta["budget_epsilon"]
        self.budget_delta: float = meta["budget_delta"]
        #: an rdp ledger composes Renyi curves (its (eps, delta) accountant only words messages)
        self.is_rdp: bool = meta["accountant"] == "rdp"
        self.accountant = Accountant("standard" if self.is_rdp else meta["accountant"],
                                     meta["delta_prime"])
        self.accountant_name: str = meta["accountant"]
        self.relation: str = meta["relation"]
        self.per_query: tuple[float, float] | None = (
            None if meta["per_query_epsilon"] is None
            else (meta["per_query_epsilon"], meta["per_query_delta"]))
        self._dataset: str | None = meta["dataset_sha256"]
        #: tables seen to exist outside a transaction (`_table_exists`)
        self._tables_seen: set[str] = set()
        #: the answers cache in memory (index.py), caught up in every answering transaction
        self._answer_index = AnswerIndex()
        self._pending = None

    @property
    def _conn(self):
        """The driver's connection (an SQLite ledger's, for tests that swap it)."""
        return self._db.conn

    @_conn.setter
    def _conn(self, connection) -> None:
        self._db.conn = connection

    @property
    def backend(self) -> str:
        """Where the ledger lives: ``"SQLite"`` or ``"PostgreSQL"``."""
        return self._db.kind

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], budget_epsilon: float | None = None,
             budget_delta: float | None = None, accountant: str | None = None, *,
             relation: str | None = None, dataset_sha256: str | None = None,
             per_query_epsilon: float | None = None, per_query_delta: float | None = None,
             delta_prime: float | None = None, timeout: float = 60.0,
             _in_memory: bool = False) -> "Ledger":
        """Open the ledger at `path`, creating it if it does not exist (or is empty).

        Creating needs budget_epsilon > 0; budget_delta defaults to 0 (pure eps-DP),
        relation to replace-one, accountant to "standard" without a per-query guarantee and
        to "best" with one. Re-opening checks every value given against the stored one and
        refuses a mismatch (None: use the stored value).

        Args:
            path: an SQLite file's path, or a PostgreSQL URL (``postgresql://user@host/db``:
                the database must exist; its tables are created on first open, and a
                database holding other tables is refused).
            budget_epsilon: a new ledger's total epsilon.
            budget_delta: a new ledger's total delta (default 0).
            accountant: a new ledger's accountant (`LEDGER_ACCOUNTANTS`).
            relation: a new ledger's neighbouring relation.
            dataset_sha256: the private dataset (else bound by the first release).
            per_query_epsilon: the fixed per-query epsilon of the advanced, best and
                tight accountants.
            per_query_delta: their fixed per-query delta.
            delta_prime: the advanced accountant's slack.
            timeout: seconds to wait for another process's write transaction.

        Returns:
            The open ledger (a context manager that closes it).

        Raises:
            PrivacyError: invalid settings, settings that differ from the stored ones, a
                database of another application or of another format version, or a ledger
                that cannot be reached or written.
        """
        path = os.fspath(path)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if path in (":memory:", "") and not _in_memory:
            raise PrivacyError(f"the privacy ledger needs a file (got {path!r}): a ledger in "
                               f"memory forgets its spends when the process ends "
                               f"(Ledger.in_memory is for simulations)")
        given = dict(budget_epsilon=budget_epsilon, budget_delta=budget_delta,
                     accountant=accountant, relation=relation, dataset_sha256=dataset_sha256,
                     per_query_epsilon=per_query_epsilon, per_query_delta=per_query_delta,
                     delta_prime=delta_prime)
        _check_given(given)
        if path != ":memory:" and not is_url(path):
            parent = Path(path).expanduser().parent
            if not parent.is_dir():
                raise PrivacyError(f"cannot open the privacy ledger {path}: {parent} is not an "
                                   f"existing folder")
        store = open_store(path, timeout)
        name = store.name
        try:
            store.begin_schema()
            try:
                meta = _open_schema(store, name, given)
                store.commit()
            finally:
                store.rollback()
            store.opened()
        except StoreError as exc:
            store.close()
            raise PrivacyError(f"{name} is not a usable privacy ledger ({exc})") from None
        except BaseException:
            store.close()
            raise
        return cls(store, name, meta)

    @classmethod
    def in_memory(cls, budget_epsilon: float, budget_delta: float = 0.0,
                  accountant: str | None = None, **kwargs) -> "Ledger":
        """A ledger that lives in memory only (experiments: one per simulated deployment).

        Args:
            budget_epsilon: the total epsilon.
            budget_delta: the total delta.
            accountant: as `open`.
            **kwargs: the other settings of `open`.

        Returns:
            A new SQLite ledger in memory.
        """
        return cls.open(":memory:", budget_epsilon, budget_delta, accountant, _in_memory=True,
                        **kwargs)

    def close(self) -> None:
        """Close the database connection (the ledger object is unusable afterwards)."""
        self._db.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def dataset_sha256(self) -> str | None:
        """The private dataset this ledger accounts for (None until the first release)."""
        return self._dataset

    # -- accounting -----------------------------------------------------------------------

    def _recorded_groups(self) -> list[SpendGroup]:
        # the running totals, added to in the same transaction as every charge, where the
        # answering door has created them (within a write transaction, the store's copy of
        # what it read and added under the lock: stores.py); else a scan of every charge
        if self._has_totals():
            return self._db.spend_groups()
        rows = self._db.execute("SELECT epsilon, delta, COUNT(*) FROM releases "
                                "GROUP BY epsilon, delta").fetchall()
        return [(float(e), float(d), int(c)) for e, d, c in rows]

    def _has_totals(self) -> bool:
        return self._table_exists("spend_totals")

    def _table_exists(self, name: str) -> bool:
        """Whether the table exists, remembered once it was seen outside a transaction: the
        ledger's tables are only ever added (a table created inside a transaction that may
        still roll back is asked again), so the reads of every request need not ask."""
        if name in self._tables_seen:
            return True
        found = self._db.has_table(name)
        if found and not getattr(self._db.conn, "in_transaction", True):
            self._tables_seen.add(name)
        return found

    def _compose(self, groups: Sequence[SpendGroup]) -> Composition:
        merged: dict[tuple[float, float], int] = {}
        for e, d, c in groups:
            merged[(e, d)] = merged.get((e, d), 0) + c
        return self.accountant.compose_groups(
            [(e, d, c) for (e, d), c in sorted(merged.items())], delta_budget=self.budget_delta)

    def _recorded_curves(self) -> list[tuple[tuple[float, ...], int]]:
        rows = self._db.execute("SELECT curve, COUNT(*) FROM rdp_charges GROUP BY curve")
        return [(curve_from_bytes(bytes(c)), int(n)) for c, n in rows.fetchall()]

    def _compose_curves(self, groups) -> Composition:
        eps, _ = curve_epsilon(compose_curves(groups), self.budget_delta)
        return Composition(eps, self.budget_delta, "rdp")

    def spent_curve(self) -> tuple[float, ...]:
        """An rdp ledger's composed Renyi curve.

        Returns:
            The sum of every recorded charge's curve, on mechanisms.rdp.ORDERS.

        Raises:
            PrivacyError: the ledger is not an rdp ledger, or its database cannot be read.
        """
        if not self.is_rdp:
            raise PrivacyError(f"the ledger {self.path} composes (eps, delta) guarantees "
                               f"({self.accountant_name} accountant), not Renyi curves")
        return compose_curves(self._recorded_curves())

    def spent(self) -> Composition:
        """Composed guarantee of everything recorded so far.

        Returns:
            The accountant's total (rounded up); for an rdp ledger the composed curve
            converted at the budget's delta.

        Raises:
            PrivacyError: the ledger's database cannot be read (`StoreError`).
        """
        if self.is_rdp:
            return self._compose_curves(self._recorded_curves())
        return self._compose(self._recorded_groups())

    def remaining(self) -> tuple[float, float]:
        """What is left of the budget. Under advanced/tight/rdp composition this is not
        additive: use `fits` to ask whether a release fits.

        Returns:
            (eps_T - spent eps, delta_T - spent delta); an rdp ledger keeps delta_T (its
            totals are converted at delta_T).

        Raises:
            PrivacyError: the ledger's database cannot be read (`StoreError`).
        """
        spent = self.spent()
        if self.is_rdp:     # every total is converted at the budget's delta: it is not used up
            return self.budget_epsilon - spent.epsilon, self.budget_delta
        return self.budget_epsilon - spent.epsilon, self.budget_delta - spent.delta

    def fits(self, n_queries: int, epsilon: float, delta: float = 0.0, *,
             known: bool = False) -> bool:
        """Would n_queries more charges of (epsilon, delta) stay within the budget?
        (Advisory: another process may spend in between; `release` re-checks atomically.)

        Args:
            n_queries: the number of charges.
            epsilon: each charge's epsilon.
            delta: each charge's delta.
            known: compose the running totals this object's last write transaction
                committed, where it has them, instead of reading the database (the
                prediction service asks once per batch). They are at most the recorded
                totals (charges are only added, and every accountant's total grows with
                them), so a False holds for the recorded charges too; a True, like every
                answer here, is for the write transaction's own check to confirm. With one
                process writing the ledger they are the recorded totals.

        Returns:
            Whether they fit now.

        Raises:
            PrivacyError: the ledger's database cannot be read (`StoreError`).
        """
        if self.is_rdp:
            curve = curve_of(float(epsilon), float(delta), None, "this spend")
            return self._compose_curves(self._recorded_curves() + [(curve, int(n_queries))]
                                        ).fits(self.budget_epsilon, self.budget_delta)
        recorded = self._db.committed_totals(("spend",)) if known else None
        if recorded is None:
            recorded = self._recorded_groups()
        groups = recorded + [(float(epsilon), float(delta), int(n_queries))]
        return self._compose(groups).fits(self.budget_epsilon, self.budget_delta)

    def has_open_session(self, client: str, source_id: str, mechanism: Mechanism) -> bool:
        """Whether the client has a session of this stability-gated mechanism open: the
        answering door would continue it (at no charge) before it charges a new one. Reads
        only the client's own session row.

        Args:
            client: the client's id.
            source_id: the source (bundle or ensemble) the session answers from.
            mechanism: the session mechanism (its parameters must be the session's).

        Returns:
            True when a session with these parameters is recorded and has not reached its
            cutoff; False otherwise (none, another parameters' session, a closed one, or a
            per-query mechanism).

        Raises:
            PrivacyError: the ledger's database cannot be read (`StoreError`).
        """
        if mechanism.per_query or not self._table_exists("sessions"):
            return False
        row = self._db.execute("SELECT params, rho, tops FROM sessions WHERE client = ? AND "
                               "source_id = ? AND mechanism = ?",
                               (client, source_id, mechanism.name)).fetchone()
        return row is not None and row[0] == repr(mechanism) and \
            mechanism.session_state(int(row[1]), int(row[2])) is not None

    def charge_for(self, guarantee: Guarantee) -> tuple[float, float]:
        """The (eps, delta) charged per query for a release with `guarantee`.

        Args:
            guarantee: the release's guarantee, in the ledger's relation.

        Returns:
            The guarantee itself, or the ledger's fixed per-query guarantee.

        Raises:
            PrivacyError: another relation, or a guarantee larger than the fixed one.
        """
        if guarantee.relation != self.relation:
            raise PrivacyError(f"internal: a {guarantee.relation} guarantee offered to a "
                               f"{self.relation} ledger")
        if self.per_query is None:
            return guarantee.epsilon, guarantee.delta
        eps_q, delta_q = self.per_query
        if guarantee.epsilon > eps_q or guarantee.delta > delta_q:
            raise PrivacyError(
                f"this ledger fixes every release at ({eps_q!r}, {delta_q!r}) per query (its "
                f"{self.accountant_name} accountant composes a sequence fixed in advance); "
                f"{guarantee.mechanism} at ({guarantee.epsilon!r}, {guarantee.delta!r}) does "
                f"not fit it: release at most that much per query, or use a ledger with the "
                f"standard accountant")
        return eps_q, delta_q

    # -- the door -------------------------------------------------------------------------

    def release(self, mechanism: Mechanism, inputs, *, insecure_seed: int | None = None,
                insecure_rng: np.random.Generator | None = None) -> Release:
        """Check, record, then draw: the released labels of `mechanism` on `inputs`.

        Raises before anything is recorded or drawn for: inputs the mechanism refuses,
        inputs of another dataset, a guarantee that does not hold under the ledger's
        relation or does not fit its fixed per-query guarantee, and a budget that would be
        exceeded (BudgetExceededError). `insecure_seed` / `insecure_rng` replace the
        operating system's secure randomness (experiments and tests only: anyone who knows
        the seed can remove the noise); every row of such a release records it.

        Args:
            mechanism: the release mechanism (`mechanisms.make_mechanism`).
            inputs: its inputs (`Certified` or `Votes`).
            insecure_seed: a seed for the noise (experiments only; recorded).
            insecure_rng: a generator for the noise (experiments only; recorded).

        Returns:
            The `Release`: labels and their guarantee.

        Raises:
            BudgetExceededError: the release does not fit the budget (nothing recorded).
            PrivacyError: refused inputs or guarantee, another dataset, a ledger that
                cannot be written, or a failed draw after the spend (said so).
        """
        guarantee, eps_c, delta_c = self._charge(mechanism, inputs)
        curve = self._curve_for(guarantee)
        if insecure_seed is not None and insecure_rng is not None:
            raise PrivacyError("give insecure_seed or insecure_rng, not both")
        if insecure_seed is not None and (isinstance(insecure_seed, bool) or
                                          not isinstance(insecure_seed, (int, np.integer))
                                          or insecure_seed < 0):
            raise PrivacyError(f"insecure_seed must be an integer >= 0, got {insecure_seed!r}")
        if insecure_rng is not None and not isinstance(insecure_rng, np.random.Generator):
            raise PrivacyError("insecure_rng must be a numpy Generator")
        seeded = insecure_seed is not None or insecure_rng is not None
        rng = insecure_rng if insecure_rng is not None else make_generator(insecure_seed)
        n = inputs.n_queries
        ids = inputs.query_ids or ("",) * n
        note = f"relation={self.relation}; {guarantee.note}"
        if (eps_c, delta_c) != (guarantee.epsilon, guarantee.delta):
            note += (f"; own guarantee ({guarantee.epsilon!r}, {guarantee.delta!r}) charged at "
                     f"the ledger's fixed ({eps_c!r}, {delta_c!r})")
        if seeded:
            note += (f"; INSECURE seeded noise (seed {insecure_seed})" if insecure_seed is not None
                     else "; INSECURE seeded noise (experiment generator)")
        if mechanism.per_query:
            charges = [_Charge(eps_c, delta_c, mechanism.name, inputs.source.source_id, ids[i],
                               seeded, note) for i in range(n)]
        else:   # one guarantee for the whole session: one entry, the hash of its queries
            session = hashlib.sha256("|".join(ids).encode()).hexdigest()
            charges = [_Charge(eps_c, delta_c, mechanism.name, inputs.source.source_id,
                               session, seeded, f"{note}; session of {n} queries")]
        self._commit(charges, inputs.source.dataset_sha256, curve)
        try:
            labels = mechanism.release(inputs, rng)
        except Exception as exc:
            # Every parameter and input is checked before the spend (a test drives every
            # mechanism through extreme parameters); this is the last line. The message names
            # only the error's type: its text may hold private values.
            raise PrivacyError(
                f"{mechanism.name}: drawing the labels failed ({type(exc).__name__}) after the "
                f"ledger recorded the spend of {n} queries: the budget is spent and nothing was "
                f"released (please report this)") from None   # (still in __context__)
        except BaseException as exc:        # Ctrl-C, SIGTERM: say what the ledger holds
            exc.add_note("the ledger had recorded the spend: the budget is spent and the "
                         "labels are lost")
            raise
        return Release(labels, guarantee, mechanism.name, eps_c, delta_c, seeded,
                       mechanism.per_query)

    def release_estimate(self, estimate, *, insecure_rng: np.random.Generator | None = None
                         ) -> tuple[float, float]:
        """Charge, draw and record a sanitised data-dependent cost (an rdp ledger only): the
        release's own Renyi curve (`estimate.plan.curve`, PATE 2018 Thm 23) is charged like
        any release, then the estimate is drawn and recorded in `data_dependent` beside the
        eps it gives (`mechanisms.pate_costs.sanitised_epsilon`). Returns (estimate, eps):
        both are releasable (post-processing of a DP release); a session may stop on them.

        Args:
            estimate: a `mechanisms.pate_costs.SanitisedCost` prepared by the owner.
            insecure_rng: seeded noise for experiments and tests only (recorded).

        Returns:
            (the sanitised estimate, the eps it gives).

        Raises:
            BudgetExceededError: its curve does not fit the budget.
            PrivacyError: not an rdp ledger, not a SanitisedCost, or the ledger cannot be
                written.
        """
        from mechanisms.pate_costs import SanitisedCost, sanitised_epsilon

        if type(estimate) is not SanitisedCost:   # (a subclass could draw otherwise)
            raise PrivacyError(f"release_estimate needs a mechanisms.pate_costs.SanitisedCost "
                               f"(SanitisedCost.prepare), got {type(estimate).__name__}")
        if not self.is_rdp:
            raise PrivacyError(f"a sanitised Renyi cost is composed by an rdp ledger; "
                               f"{self.path} has the {self.accountant_name} accountant")
        if insecure_rng is not None and not isinstance(insecure_rng, np.random.Generator):
            raise PrivacyError("insecure_rng must be a numpy Generator")
        curve = estimate.plan.curve
        eps_c, _ = curve_epsilon(curve, self.budget_delta)
        seeded = insecure_rng is not None
        note = (f"relation={self.relation}; sanitised data-dependent cost at order "
                f"{estimate.plan.order!r} (beta {estimate.plan.beta!r}, sigma "
                f"{estimate.plan.sigma!r}, {'AGT' if estimate.use_radii else 'plain'} "
                f"distance), PATE 2018 Thm 23")
        if seeded:
            note += "; INSECURE seeded noise (experiment generator)"
        charge = _Charge(eps_c, self.budget_delta, estimate.name, estimate.source_id,
                         "", seeded, note)
        ids = self._commit([charge], estimate.dataset_sha256, curve)
        rng = insecure_rng if seeded else make_generator(None)
        value = estimate.draw(rng)
        eps = sanitised_epsilon(value, estimate.plan, self.budget_delta)
        with self._writing() as db:
            db.execute("INSERT INTO data_dependent (time, source_id, kind, order_alpha, value,"
                         " epsilon, delta, release_id, note) VALUES (?, ?, 'sanitised', ?, ?, ?,"
                         " ?, ?, ?)", (_now(), estimate.source_id, float(estimate.plan.order),
                                       float(value), float(eps), float(self.budget_delta),
                                       ids[0], note))
        return value, eps

    def sanitised_estimates(self) -> list[tuple[str, float, float, float]]:
        """The recorded sanitised costs.

        Returns:
            (source id, order, estimate, eps) per release, oldest first ([] outside rdp).

        Raises:
            PrivacyError: the ledger's database cannot be read (`StoreError`).
        """
        if not self.is_rdp:
            return []
        return [(str(s), float(a), float(v), float(e)) for s, a, v, e in self._db.execute(
            "SELECT source_id, order_alpha, value, epsilon FROM data_dependent ORDER BY id")]

    def _curve_for(self, guarantee: Guarantee) -> tuple[float, ...] | None:
        """The Renyi curve an rdp ledger charges for `guarantee` (refused, before anything is
        recorded, where it has none); None for the other ledgers."""
        if not self.is_rdp:
            return None
        return curve_of(guarantee.epsilon, guarantee.delta, guarantee.rdp, guarantee.mechanism)

    def _charge(self, mechanism: Mechanism, inputs) -> tuple[Guarantee, float, float]:
        """The checks before anything is recorded (inputs, relation, the fixed per-query
        guarantee): the guarantee and the (eps, delta) charged per query (session)."""
        if not isinstance(mechanism, Mechanism):
            raise PrivacyError(f"release needs a mechanism object (mechanisms.make_mechanism), "
                               f"got {type(mechanism).__name__}")
        mechanism.check(inputs)
        guarantee = mechanism.guarantee_for(inputs, self.relation)
        eps_c, delta_c = self.charge_for(guarantee)
        if inputs.n_queries == 0:
            raise PrivacyError("nothing to release: the inputs hold no query")
        return guarantee, eps_c, delta_c

    def check_release(self, mechanism: Mechanism, inputs) -> None:
        """Every check `release` makes before it records anything (inputs, relation, the
        fixed per-query guarantee, the budget), recording nothing: a dry run, e.g. on an
        in-memory ledger with a new file ledger's settings before that file is created.

        Args:
            mechanism: the release mechanism.
            inputs: its inputs.

        Raises:
            BudgetExceededError: the release would not fit the budget.
            PrivacyError: any other refusal `release` would make before its spend.
        """
        guarantee, eps_c, delta_c = self._charge(mechanism, inputs)
        self._check_budget(eps_c, delta_c, inputs.n_queries if mechanism.per_query else 1,
                           self._curve_for(guarantee))

    def entries(self) -> list[LedgerEntry]:
        """Every recorded charge, oldest first.

        Returns:
            One `LedgerEntry` per charge: per row of ``releases``, and per charge of a
            ``charge_runs`` row (the answering door's: the run's i-th query hash with the id
            ``id + i``), in the order of their ids.

        Raises:
            PrivacyError: the ledger's database cannot be read (`StoreError`).
        """
        rows = self._db.execute("SELECT id, time, source_id, query_hash, mechanism, epsilon, "
                                  "delta, seeded, note FROM releases ORDER BY id").fetchall()
        out = [LedgerEntry(int(row[0]), *row[1:5], float(row[5]), float(row[6]), bool(row[7]),
                           row[8]) for row in rows]
        if self._db.has_table("charge_runs"):
            runs = self._db.execute("SELECT id, count, time, source_id, mechanism, epsilon, "
                                    "delta, seeded, note, query_hashes FROM charge_runs "
                                    "ORDER BY id").fetchall()
            for first, count, time, source, mech, eps, delta, seeded, note, raw in runs:
                raw = bytes(raw) if isinstance(raw, (bytes, bytearray, memoryview)) else b""
                if len(raw) != HASH_BYTES * int(count):
                    raise PrivacyError(f"the ledger {self.path} is damaged: a run of {count} "
                                       f"charges holds {len(raw)} bytes of query hashes")
                text = raw.hex()
                hashes = [text[64 * i:64 * i + 64] for i in range(int(count))]
                out.extend(LedgerEntry(int(first) + i, time, source, h, mech, float(eps),
                                       float(delta), bool(seeded), note)
                           for i, h in enumerate(hashes))
            if runs:
                out.sort(key=lambda e: e.id)
        return out


def _open_schema(store, name: str, given: dict) -> dict:
    """Inside the store's schema transaction: refuse a database of another application,
    create the tables where they are missing, then create or compare the settings."""
    tables = store.tables()
    if "ledger_meta" in tables:
        # a newer agt's ledger holds tables this code does not know: say so, not "another
        # application"
        row = store.execute("SELECT format_version FROM ledger_meta").fetchone()
        if row is not None:
            newer_check(store, name, row[0])
    if store.kind == "SQLite":
        foreign = tables - _TABLES - _ANSWER_TABLES - _RDP_TABLES
        what = "an SQLite database"
        want = "the path of a ledger or of a new file"
    else:
        foreign = tables - POSTGRES_TABLES
        what = "a PostgreSQL database"
        want = "the URL of a ledger or of a new, empty database"
    # (a database holding only the service's keys, added before the ledger, is not foreign)
    if foreign or (tables - {"api_keys"} and "ledger_meta" not in tables):
        raise PrivacyError(f"{name} is {what} of another application (tables "
                           f"{sorted(tables)[:5]}); refusing to add a ledger to it: give {want}")
    if store.kind == "SQLite":
        for statement in _SCHEMA:
            store.execute(statement)
        if "answers" in tables:
            # a ledger that answered before the blocks: they start now, and its old answers
            # table takes no new rows (schema.py: _ANSWERS_FROZEN_SQLITE)
            for statement in (*_BLOCKS_SQLITE, *_ANSWERS_FROZEN_SQLITE):
                store.execute(statement)
    else:
        if "ledger_meta" in tables:
            row = store.execute("SELECT format_version FROM ledger_meta").fetchone()
            if row is not None and row[0] not in MIGRATES_FROM[store.kind]:
                _read_meta(store, name)   # another version's tables are refused, not changed
        if tables != POSTGRES_TABLES:
            # (only where something is missing: creating a trigger would wait for, and
            # hold up, the other replicas' write transactions)
            store.create_schema()
    meta = _read_meta(store, name, migrate=True)
    if meta is None:
        meta = _create(store, name, given)
    else:
        _compare(name, meta, given)
    if meta["accountant"] == "rdp" and store.kind == "SQLite":
        for statement in _RDP_SCHEMA:
            store.execute(statement)
    return meta
