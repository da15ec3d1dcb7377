"""The privacy ledger: the one door from certified predictions to released labels.

A ledger is an SQLite file bound to one private dataset (its sha256) and one neighbouring
relation, with a total budget (eps_T, delta_T) and an accountant (accounting.py). It holds
an append-only table of what was charged. `Ledger.release(mechanism, inputs)` is the only way
to release:

  1. the mechanism checks the inputs (kind, classes, radii and their smoothness proof) and
     states its per-query guarantee under the ledger's relation (converted by group privacy
     where the inputs are certified under another relation, guarantee.py); inputs of another
     dataset are refused (the first release binds a ledger created without a dataset);
  2. BEGIN IMMEDIATE -- SQLite's write lock: checks from concurrent processes are
     serialised (others wait up to `timeout` seconds);
  3. the accountant composes every recorded spend with the Q new ones; over (eps_T, delta_T):
     ROLLBACK and BudgetExceededError, nothing recorded, no noise drawn;
  4. INSERT one row per query and COMMIT (a batch is one transaction);
  5. only then the mechanism draws the noise, from the operating system's secure source
     unless an `insecure_*` argument (experiments) is given, which every row records.

So the recorded cost and the drawn noise come from the same object and cannot disagree, and
no answer leaves without its record. A crash after the commit loses the answer but keeps the
spend (budget spent, nothing released: the safe side); a crash before it leaves no trace.

Accountants. "standard" composition is valid for spends chosen adaptively, and so is "rdp":
every charge brings its Renyi curve on a fixed grid of orders (mechanisms/rdp.py: the
mechanism's own, or the pure-DP curve of an eps-DP one; an (eps, delta > 0) guarantee without a
curve is refused before anything is recorded), the curves add order by order, and the sum is
converted to (eps, delta_T) for the budget check (its own table `rdp_charges` holds each
charge's curve; `data_dependent` holds sanitised estimates of PATE's data-dependent costs,
mechanisms/pate_costs.py). "advanced",
"best" (the smaller of standard and advanced) and "tight" (PLD) compose a sequence fixed in
advance; such a ledger is created with a fixed per-query guarantee (per_query_epsilon,
per_query_delta) and charges every release at exactly that value (a release whose own
guarantee is smaller is charged the fixed value; a larger one is refused). Totals are rounded
up and compared without tolerance.

Files. The ledger runs in SQLite's rollback-journal mode with synchronous writes: every
committed spend is in the main file; a ``<ledger>-journal`` beside it exists only during a
transaction (or after a crash inside one, until the next open rolls it back).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import os
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import BudgetExceededError, DataError, PrivacyError
from mechanisms.accounting import ACCOUNTANTS, Accountant, Composition, SpendGroup
from mechanisms.base import Mechanism
from mechanisms.checks import check_delta, check_epsilon, privacy_problems
from mechanisms.guarantee import REPLACE_ONE, Guarantee, check_relation
from mechanisms.noise import REFUSED, make_generator
from mechanisms.rdp import compose_curves, curve_epsilon, curve_from_bytes, curve_of, curve_to_bytes

FORMAT_VERSION = 2
_TABLES = {"ledger_meta", "releases", "sqlite_sequence"}
#: tables the answering door (`Ledger.answer_batch`) adds on first use: running totals of the
#: charges, all and per client (so a budget check reads a few rows, not every charge; every
#: insert into `releases` adds to them in its transaction), the released answers (the cache:
#: asked again, a query gets its released label at no new charge) and the open
#: stability-gated sessions
_ANSWER_TABLES = {"spend_totals", "client_totals", "answers", "sessions"}
_FIXED_ACCOUNTANTS = ("best", "advanced", "tight")
#: every accountant a ledger takes: the (eps, delta) ones of accounting.py and "rdp"
LEDGER_ACCOUNTANTS: tuple[str, ...] = ACCOUNTANTS + ("rdp",)
#: the tables of an rdp ledger: each charge's curve, and the sanitised data-dependent costs
_RDP_TABLES = {"rdp_charges", "data_dependent"}
_RDP_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS rdp_charges (
        release_id INTEGER PRIMARY KEY REFERENCES releases (id),
        curve BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS data_dependent (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time TEXT NOT NULL,
        source_id TEXT NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('sanitised')),
        order_alpha REAL NOT NULL,
        value REAL NOT NULL,
        epsilon REAL NOT NULL,
        delta REAL NOT NULL,
        release_id INTEGER NOT NULL REFERENCES releases (id),
        note TEXT NOT NULL)""",
    """CREATE TRIGGER IF NOT EXISTS rdp_charges_no_update BEFORE UPDATE ON rdp_charges
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS rdp_charges_no_delete BEFORE DELETE ON rdp_charges
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS data_dependent_no_update BEFORE UPDATE ON data_dependent
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS data_dependent_no_delete BEFORE DELETE ON data_dependent
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
)

# One statement each: sqlite3's executescript would COMMIT the open transaction first.
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ledger_meta (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        format_version INTEGER NOT NULL,
        budget_epsilon REAL NOT NULL CHECK (budget_epsilon > 0),
        budget_delta REAL NOT NULL CHECK (budget_delta >= 0 AND budget_delta < 1),
        accountant TEXT NOT NULL,
        delta_prime REAL,
        per_query_epsilon REAL,
        per_query_delta REAL,
        relation TEXT NOT NULL,
        dataset_sha256 TEXT,
        created TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS releases (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time TEXT NOT NULL,
        source_id TEXT NOT NULL,
        query_hash TEXT NOT NULL,
        mechanism TEXT NOT NULL,
        epsilon REAL NOT NULL CHECK (epsilon > 0),
        delta REAL NOT NULL CHECK (delta >= 0 AND delta < 1),
        seeded INTEGER NOT NULL,
        note TEXT NOT NULL)""",
    """CREATE TRIGGER IF NOT EXISTS releases_no_update BEFORE UPDATE ON releases
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS releases_no_delete BEFORE DELETE ON releases
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
)

__all__ = ["Ledger", "Release", "LedgerEntry", "AnswerRequest", "Answered", "hash_query",
           "hash_queries", "default_ledger_path"]


def hash_query(query: ArrayLike) -> str:
    """sha256 (hex) of a query array: dtype, shape and C-order bytes, so equal arrays of
    different dtype or shape hash differently."""
    arr = np.ascontiguousarray(np.asarray(query))
    digest = hashlib.sha256()
    digest.update(f"{arr.dtype.str}|{arr.shape}|".encode())
    digest.update(arr.tobytes())
    return digest.hexdigest()


def hash_queries(queries: ArrayLike) -> list[str]:
    """`hash_query` of every row of ``queries`` (one query per row), computed together."""
    arr = np.ascontiguousarray(np.asarray(queries))
    if arr.ndim == 0:
        raise PrivacyError("hash_queries needs an array with one query per row")
    row = arr[0] if len(arr) else arr.reshape(arr.shape[1:])
    prefix = f"{row.dtype.str}|{row.shape}|".encode()
    flat = arr.reshape(len(arr), -1).view(np.uint8).reshape(len(arr), -1) if len(arr) else arr
    return [hashlib.sha256(prefix + bytes(r)).hexdigest() for r in flat]


def default_ledger_path(dataset_sha256: str) -> Path:
    """The ledger of a private dataset when none is named: one dataset, one default ledger,
    whichever bundle, ensemble or copy releases from it.

    ``$AGT_LEDGER_DIR`` (default ``~/.agt/ledgers``) / ``<name>.db`` with name = the first 20
    hex digits of HMAC-SHA256(key, dataset hash), the key 32 random bytes kept in ``.key``
    in that folder (created on first use, owner-readable only). A name derived from the raw
    dataset hash would let anyone who sees the path test candidate datasets against it."""
    base = Path(os.environ.get("AGT_LEDGER_DIR") or Path.home() / ".agt" / "ledgers").expanduser()
    try:
        base.mkdir(parents=True, exist_ok=True)
        key_file = base / ".key"
        if not key_file.exists():
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(32))
        key = key_file.read_bytes()
    except FileExistsError:          # another process created it between the two calls
        key = (base / ".key").read_bytes()
    except OSError as exc:
        raise PrivacyError(f"cannot use the default ledger folder {base} ({exc.strerror or exc}); "
                           f"set AGT_LEDGER_DIR or give --ledger") from None
    if len(key) < 16:
        raise PrivacyError(f"{base / '.key'} is damaged (too short); restore it or give --ledger")
    name = hmac.new(key, dataset_sha256.encode(), hashlib.sha256).hexdigest()[:20]
    return base / f"{name}.db"


@dataclass(frozen=True)
class Release:
    """What leaves the door: the released labels (REFUSED = -1 where the mechanism gave no
    answer) and the guarantee they come with, under the ledger's relation: per query, or for
    the whole release when `per_query` is False (a session)."""

    labels: NDArray[np.int64]
    guarantee: Guarantee
    mechanism: str
    charged_epsilon: float
    charged_delta: float
    seeded: bool
    per_query: bool = True

    @property
    def n_queries(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class LedgerEntry:
    """A recorded charge (a row of the ledger)."""

    id: int
    time: str
    source_id: str
    query_hash: str
    mechanism: str
    epsilon: float
    delta: float
    seeded: bool
    note: str


@dataclass(frozen=True)
class _Charge:
    epsilon: float
    delta: float
    mechanism: str
    source_id: str
    query_hash: str
    seeded: bool
    note: str


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class Ledger:
    """A privacy-budget ledger stored in one SQLite file; see the module docstring."""

    def __init__(self, connection: sqlite3.Connection, path: str, meta: dict):
        self._conn = connection
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
        refuses a mismatch (None: use the stored value). `timeout`: seconds to wait for
        another process's transaction.
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
        if path != ":memory:":
            parent = Path(path).expanduser().parent
            if not parent.is_dir():
                raise PrivacyError(f"cannot open the privacy ledger {path}: {parent} is not an "
                                   f"existing folder")
        try:
            conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise PrivacyError(f"cannot open the privacy ledger {path} ({exc}); give a path "
                               "in an existing, writable directory") from None
        try:
            conn.execute("PRAGMA journal_mode = DELETE").fetchone()
            conn.execute("PRAGMA synchronous = FULL")
            # up to 64 MiB of pages in memory: the answers' index is read at random
            conn.execute("PRAGMA cache_size = -65536")
            conn.execute("BEGIN IMMEDIATE")
            try:
                tables = {r[0] for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
                foreign = tables - _TABLES - _ANSWER_TABLES - _RDP_TABLES
                if foreign or (tables and "ledger_meta" not in tables):
                    raise PrivacyError(
                        f"{path} is an SQLite database of another application (tables "
                        f"{sorted(tables)[:5]}); refusing to add a ledger to it: give the path "
                        f"of a ledger or of a new file")
                for statement in _SCHEMA:
                    conn.execute(statement)
                meta = _read_meta(conn, path)
                if meta is None:
                    meta = _create(conn, path, given)
                else:
                    _compare(path, meta, given)
                if meta["accountant"] == "rdp":
                    for statement in _RDP_SCHEMA:
                        conn.execute(statement)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            conn.close()
            raise PrivacyError(f"{path} is not a usable privacy ledger ({_sqlite_reason(exc)})"
                               ) from None
        except BaseException:
            conn.close()
            raise
        return cls(conn, path, meta)

    @classmethod
    def in_memory(cls, budget_epsilon: float, budget_delta: float = 0.0,
                  accountant: str | None = None, **kwargs) -> "Ledger":
        """A ledger that lives in memory only (experiments: one per simulated deployment)."""
        return cls.open(":memory:", budget_epsilon, budget_delta, accountant, _in_memory=True,
                        **kwargs)

    def close(self) -> None:
        self._conn.close()

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
        # the running totals, kept by a trigger in the same transaction as every charge,
        # where the answering door has created them; else a scan of every charge
        if self._has_totals():
            rows = self._conn.execute("SELECT epsilon, delta, count FROM spend_totals").fetchall()
        else:
            rows = self._conn.execute("SELECT epsilon, delta, COUNT(*) FROM releases "
                                      "GROUP BY epsilon, delta").fetchall()
        return [(float(e), float(d), int(c)) for e, d, c in rows]

    def _has_totals(self) -> bool:
        return self._conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                                  "name = 'spend_totals'").fetchone() is not None

    def _compose(self, groups: Sequence[SpendGroup]) -> Composition:
        merged: dict[tuple[float, float], int] = {}
        for e, d, c in groups:
            merged[(e, d)] = merged.get((e, d), 0) + c
        return self.accountant.compose_groups(
            [(e, d, c) for (e, d), c in sorted(merged.items())], delta_budget=self.budget_delta)

    def _recorded_curves(self) -> list[tuple[tuple[float, ...], int]]:
        rows = self._conn.execute("SELECT curve, COUNT(*) FROM rdp_charges GROUP BY curve")
        return [(curve_from_bytes(c), int(n)) for c, n in rows.fetchall()]

    def _compose_curves(self, groups) -> Composition:
        eps, _ = curve_epsilon(compose_curves(groups), self.budget_delta)
        return Composition(eps, self.budget_delta, "rdp")

    def spent_curve(self) -> tuple[float, ...]:
        """An rdp ledger's composed Renyi curve (on mechanisms.rdp.ORDERS)."""
        if not self.is_rdp:
            raise PrivacyError(f"the ledger {self.path} composes (eps, delta) guarantees "
                               f"({self.accountant_name} accountant), not Renyi curves")
        return compose_curves(self._recorded_curves())

    def spent(self) -> Composition:
        """Composed guarantee of everything recorded so far (the accountant's total; for an
        rdp ledger the composed curve converted at the budget's delta)."""
        if self.is_rdp:
            return self._compose_curves(self._recorded_curves())
        return self._compose(self._recorded_groups())

    def remaining(self) -> tuple[float, float]:
        """(eps_T - spent eps, delta_T - spent delta); an rdp ledger keeps delta_T (its totals
        are converted at delta_T). Under advanced/tight/rdp composition this is not additive:
        use `fits` to ask whether a release fits."""
        spent = self.spent()
        if self.is_rdp:     # every total is converted at the budget's delta: it is not used up
            return self.budget_epsilon - spent.epsilon, self.budget_delta
        return self.budget_epsilon - spent.epsilon, self.budget_delta - spent.delta

    def fits(self, n_queries: int, epsilon: float, delta: float = 0.0) -> bool:
        """Would n_queries more charges of (epsilon, delta) stay within the budget?
        (Advisory: another process may spend in between; `release` re-checks atomically.)"""
        if self.is_rdp:
            curve = curve_of(float(epsilon), float(delta), None, "this spend")
            return self._compose_curves(self._recorded_curves() + [(curve, int(n_queries))]
                                        ).fits(self.budget_epsilon, self.budget_delta)
        groups = self._recorded_groups() + [(float(epsilon), float(delta), int(n_queries))]
        return self._compose(groups).fits(self.budget_epsilon, self.budget_delta)

    def charge_for(self, guarantee: Guarantee) -> tuple[float, float]:
        """The (eps, delta) charged per query for a release with `guarantee` (in the ledger's
        relation): the guarantee itself, or the fixed per-query guarantee (refused if the
        release's is larger)."""
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
        with self._writing() as conn:
            conn.execute("INSERT INTO data_dependent (time, source_id, kind, order_alpha, value,"
                         " epsilon, delta, release_id, note) VALUES (?, ?, 'sanitised', ?, ?, ?,"
                         " ?, ?, ?)", (_now(), estimate.source_id, float(estimate.plan.order),
                                       float(value), float(eps), float(self.budget_delta),
                                       ids[0], note))
        return value, eps

    def sanitised_estimates(self) -> list[tuple[str, float, float, float]]:
        """The recorded sanitised costs: (source id, order, estimate, eps) per release."""
        if not self.is_rdp:
            return []
        return [(str(s), float(a), float(v), float(e)) for s, a, v, e in self._conn.execute(
            "SELECT source_id, order_alpha, value, epsilon FROM data_dependent ORDER BY id")]

    @contextlib.contextmanager
    def _writing(self):
        """One write transaction (SQLite's write lock: concurrent processes are serialised):
        committed when the block ends, rolled back when it raises; a database error is a
        PrivacyError saying that nothing was released."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise PrivacyError(f"cannot write the privacy ledger {self.path} "
                               f"({_sqlite_reason(exc)}); nothing was released") from None
        try:
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise PrivacyError(f"cannot write the privacy ledger {self.path} "
                               f"({_sqlite_reason(exc)}); nothing was released") from None
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _curve_for(self, guarantee: Guarantee) -> tuple[float, ...] | None:
        """The Renyi curve an rdp ledger charges for `guarantee` (refused, before anything is
        recorded, where it has none); None for the other ledgers."""
        if not self.is_rdp:
            return None
        return curve_of(guarantee.epsilon, guarantee.delta, guarantee.rdp, guarantee.mechanism)

    def _commit(self, charges: Sequence[_Charge], dataset_sha256: str,
                curve: tuple[float, ...] | None = None) -> list[int]:
        """Check the budget and record `charges` in one transaction (no draw here); returns
        the new rows' ids."""
        with self._writing() as conn:
            row = conn.execute("SELECT dataset_sha256 FROM ledger_meta").fetchone()
            bound = row[0]
            if bound is not None and bound != dataset_sha256:
                raise PrivacyError(   # no hashes: they identify the private datasets
                    f"the ledger {self.path} accounts for another dataset than these inputs "
                    f"come from: one ledger per private dataset (use that dataset's own "
                    f"ledger)")
            # one release charges every query (or its one session) the same (eps, delta)
            self._check_budget(charges[0].epsilon, charges[0].delta, len(charges), curve)
            if bound is None:
                conn.execute("UPDATE ledger_meta SET dataset_sha256 = ?", (dataset_sha256,))
            now = _now()
            last = conn.execute("SELECT COALESCE(MAX(id), 0) FROM releases").fetchone()[0]
            conn.executemany(
                "INSERT INTO releases (time, source_id, query_hash, mechanism, epsilon, delta, "
                "seeded, note) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(now, c.source_id, c.query_hash, c.mechanism, float(c.epsilon),
                  float(c.delta), int(c.seeded), c.note) for c in charges])
            ids = [int(r[0]) for r in conn.execute(
                "SELECT id FROM releases WHERE id > ? ORDER BY id", (last,))]
            if self.is_rdp:
                blob = curve_to_bytes(curve)
                conn.executemany("INSERT INTO rdp_charges (release_id, curve) VALUES (?, ?)",
                                 [(i, blob) for i in ids])
            if self._has_totals():
                _add_totals(conn, charges[0].epsilon, charges[0].delta, len(charges))
        self._dataset = dataset_sha256
        return ids

    def _check_budget(self, epsilon: float, delta: float, count: int,
                      curve: tuple[float, ...] | None = None) -> None:
        """Raise BudgetExceededError unless `count` more charges of (epsilon, delta) (of
        `curve` in an rdp ledger) fit what is left, saying what is spent and how many of them
        would fit."""
        if self.is_rdp:
            recorded_curves = self._recorded_curves()
            recorded = [(0.0, 0.0, c) for _, c in recorded_curves]

            def total(m: int) -> Composition:
                return self._compose_curves(recorded_curves + ([(curve, m)] if m else []))
        else:
            recorded = self._recorded_groups()

            def total(m: int) -> Composition:
                return self._compose(recorded + ([(epsilon, delta, m)] if m else []))

        over = total(count)
        if over.fits(self.budget_epsilon, self.budget_delta):
            return
        def fits(m: int) -> bool:
            return total(m).fits(self.budget_epsilon, self.budget_delta)

        # the most that fit (composition is monotone in the number of charges): doubling,
        # then bisection, so the compositions stay near the answer's size (a PLD of 10^6
        # charges takes seconds)
        lo, hi = 0, 1
        # (not under `tight`: its exact check costs about a second per composition there)
        exact_count = self.accountant.name != "tight"
        while exact_count and hi < count and fits(hi):
            lo, hi = hi, min(2 * hi, count)
        while exact_count and lo + 1 < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        spent = total(0)
        if self.per_query is not None:
            advice = (f"this ledger charges every query its fixed ({self.per_query[0]!r}, "
                      f"{self.per_query[1]!r}) whatever the mechanism's own guarantee; "
                      + (f"at most {lo} such queries fit now" if exact_count else
                         "release fewer queries"))
        elif lo == 0 and recorded:
            advice = "not one of these charges fits what is left"
        elif count == 1:
            advice = "lower the session's epsilon (or delta)"
        else:
            advice = (f"at most {lo} of these queries fit; release fewer or lower the per-query "
                      f"epsilon (or delta)")
        raise BudgetExceededError(
            f"{count} release(s) at (eps={epsilon!r}, delta={delta!r}) each would bring the "
            f"total to (eps={over.epsilon!r}, delta={over.delta!r}) under {over.method} "
            f"composition, over the budget (eps={self.budget_epsilon!r}, "
            f"delta={self.budget_delta!r}) of which (eps={spent.epsilon!r}, "
            f"delta={spent.delta!r}) is spent; nothing was released: {advice}")

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

    # -- the answering door (a prediction service) ------------------------------------------

    def answer(self, mechanism: Mechanism, inputs, *, client: str = "",
               client_budget: tuple[float, float] | None = None,
               insecure_rng: np.random.Generator | None = None) -> "Answered":
        """`answer_batch` for one request; raises its refusal instead of returning it."""
        out = self.answer_batch([AnswerRequest(mechanism, inputs, client, client_budget)],
                                insecure_rng=insecure_rng)[0]
        if isinstance(out, Exception):
            raise out
        return out

    def answer_batch(self, requests: Sequence["AnswerRequest"], *,
                     insecure_rng: np.random.Generator | None = None
                     ) -> list["Answered | Exception"]:
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
            Per request, its `Answered`, or the exception that refused it.
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
        with self._writing() as conn:
            _ensure_answer_tables(conn)
            for item in prepared:
                if isinstance(item, Exception):
                    out.append(item)
                    continue
                # each request is all or nothing within the batch: a refusal or a failed
                # draw undoes what the request had recorded
                conn.execute("SAVEPOINT request")
                try:
                    out.append(self._answer_one(item, rng, seeded))
                except (PrivacyError, DataError) as exc:
                    conn.execute("ROLLBACK TO request")
                    out.append(exc)
                conn.execute("RELEASE request")
        if any(isinstance(a, Answered) and a.charges for a in out):
            self._dataset = conn.execute("SELECT dataset_sha256 FROM ledger_meta").fetchone()[0]
        return out

    def _prepare_answer(self, request: "AnswerRequest") -> "_Prepared":
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
        if ids is None or len(ids) != inputs.n_queries or not all(ids):
            raise PrivacyError("answering needs every query's hash (inputs.query_ids, "
                               "hash_query of its bytes): the answers are kept by it")
        if not isinstance(request.client, str):
            raise PrivacyError("client must be a string (the key's id)")
        if request.client_budget is not None:
            problems = privacy_problems(f"client {request.client!r}")
            eps_b, delta_b = request.client_budget
            check_epsilon(eps_b, problems, name="budget_epsilon")
            check_delta(delta_b, problems, name="budget_delta", allow_zero=True)
            problems.raise_if_any()
        return _Prepared(request, guarantee, eps_c, delta_c)

    def _answer_one(self, item: "_Prepared", rng: np.random.Generator,
                    seeded: bool) -> "Answered":
        conn = self._conn
        mechanism, inputs = item.request.mechanism, item.request.inputs
        source = inputs.source
        row = conn.execute("SELECT dataset_sha256 FROM ledger_meta").fetchone()
        if row[0] is not None and row[0] != source.dataset_sha256:
            raise PrivacyError(f"the ledger {self.path} accounts for another dataset than these "
                               f"inputs come from: one ledger per private dataset")
        ids = list(inputs.query_ids)
        cached = _cached_labels(conn, source.source_id, mechanism.name, ids)
        labels = np.full(len(ids), REFUSED, dtype=np.int64)
        hit = np.zeros(len(ids), dtype=bool)
        first: dict[str, int] = {}
        for i, h in enumerate(ids):
            if h in cached:
                labels[i], hit[i] = cached[h], True
            else:
                first.setdefault(h, i)
        new = np.array(sorted(first.values()), dtype=np.int64)
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
        if mechanism.per_query:
            fresh, charges = self._answer_per_query(item, inputs.subset(new), rng, seeded, note)
            sessions_opened, closed = 0, False
        else:
            fresh, charges, sessions_opened, closed = self._answer_session(
                item, inputs.subset(new), rng, seeded, note)
        if row[0] is None:
            conn.execute("UPDATE ledger_meta SET dataset_sha256 = ?", (source.dataset_sha256,))
        labels[new] = fresh
        by_hash = {ids[i]: int(labels[i]) for i in new}
        for i, h in enumerate(ids):            # repeats within the request: the first's label
            if not hit[i]:
                labels[i] = by_hash[h]
        return dataclasses.replace(answered, charges=charges, sessions_opened=sessions_opened,
                                   session_closed=closed)

    def _record(self, item: "_Prepared", hashes: Sequence[str], count: int, seeded: bool,
                note: str) -> list[int]:
        """Charge `count` rows (after the budget checks) and return their ids."""
        request = item.request
        eps, delta = float(item.eps_c), float(item.delta_c)
        self._check_budget(eps, delta, count)
        if request.client_budget is not None:
            self._check_client_budget(request.client, request.client_budget, eps, delta,
                                      count)
        conn, now = self._conn, _now()
        # ids are consecutive within this write transaction (AUTOINCREMENT, one writer)
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'releases'").fetchone()
        start = 0 if row is None else int(row[0])
        conn.executemany(
            "INSERT INTO releases (time, source_id, query_hash, mechanism, epsilon, delta, "
            "seeded, note) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(now, request.inputs.source.source_id, h, request.mechanism.name, eps, delta,
              int(seeded), note) for h in hashes])
        end = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'releases'"
                           ).fetchone()[0]
        if end != start + len(hashes):
            raise PrivacyError("internal: the ledger's charge ids are not consecutive")
        _add_totals(conn, eps, delta, len(hashes), request.client)
        return list(range(start + 1, end + 1))

    def _answer_per_query(self, item, inputs, rng, seeded, note):
        hashes = list(inputs.query_ids)
        release_ids = self._record(item, hashes, len(hashes), seeded, note)
        labels = self._draw(item.request.mechanism, inputs, rng)
        _store_answers(self._conn, inputs.source.source_id, item.request.mechanism.name,
                       hashes, labels, release_ids)
        return labels, len(hashes)

    def _answer_session(self, item, inputs, rng, seeded, note):
        """Queries of a stability-gated session mechanism, within the client's open session,
        opening (and charging) a new one whenever the last one closed."""
        conn, mechanism = self._conn, item.request.mechanism
        client, source_id = item.request.client, inputs.source.source_id
        params = repr(mechanism)
        labels = np.full(inputs.n_queries, REFUSED, dtype=np.int64)
        charges = opened = 0
        closed = False
        done = 0
        row = conn.execute("SELECT params, release_id, rho, tops FROM sessions WHERE client = ? "
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
                session_id = self._record(item, [session_hash], 1, seeded,
                                          f"{note}; a session across requests")[0]
                state = mechanism.open_session(rng)
                charges, opened = charges + 1, opened + 1
            try:
                part, state, answered = mechanism.continue_session(rest, state, rng)
            except Exception as exc:
                raise PrivacyError(f"{mechanism.name}: drawing the labels failed "
                                   f"({type(exc).__name__})") from None
            labels[done:done + answered] = part[:answered]
            _store_answers(conn, source_id, mechanism.name,
                           list(rest.query_ids)[:answered], part[:answered],
                           [session_id] * answered)
            done += answered
            if mechanism.session_closed(state):
                closed = True
                conn.execute("INSERT OR REPLACE INTO sessions (client, source_id, mechanism, "
                             "params, release_id, rho, tops) VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (client, source_id, mechanism.name, params, session_id,
                              state.rho, state.tops))
                state = None
        if state is not None:
            conn.execute("INSERT OR REPLACE INTO sessions (client, source_id, mechanism, params, "
                         "release_id, rho, tops) VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (client, source_id, mechanism.name, params, session_id, state.rho,
                          state.tops))
        return labels, charges, opened, closed

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

    def _check_client_budget(self, client: str, budget: tuple[float, float], epsilon: float,
                             delta: float, count: int) -> None:
        """Raise BudgetExceededError unless `count` more charges fit the client's own budget
        (composed by the ledger's accountant, like the ledger's)."""
        rows = self._conn.execute("SELECT epsilon, delta, count FROM client_totals WHERE "
                                  "client = ?", (client,)).fetchall()
        recorded = [(float(e), float(d), int(c)) for e, d, c in rows]
        eps_b, delta_b = float(budget[0]), float(budget[1])
        total = self.accountant.compose_groups(
            sorted(recorded + [(float(epsilon), float(delta), int(count))]), delta_budget=delta_b)
        if total.fits(eps_b, delta_b):
            return
        spent = self.accountant.compose_groups(sorted(recorded), delta_budget=delta_b) \
            if recorded else None
        raise BudgetExceededError(
            f"client {client}: {count} charge(s) at (eps={epsilon!r}, delta={delta!r}) would "
            f"bring its total to (eps={total.epsilon!r}, delta={total.delta!r}), over its "
            f"budget (eps={eps_b!r}, delta={delta_b!r}) of which (eps="
            f"{0.0 if spent is None else spent.epsilon!r}, delta="
            f"{0.0 if spent is None else spent.delta!r}) is spent; nothing was released")

    def client_spent(self, client: str) -> Composition | None:
        """A client's composed charges (None before the answering door recorded any)."""
        if not self._has_totals():
            return None
        rows = self._conn.execute("SELECT epsilon, delta, count FROM client_totals WHERE "
                                  "client = ?", (client,)).fetchall()
        if not rows:
            return None
        return self.accountant.compose_groups(sorted((float(e), float(d), int(c))
                                                     for e, d, c in rows),
                                              delta_budget=self.budget_delta)

    def check_release(self, mechanism: Mechanism, inputs) -> None:
        """Every check `release` makes before it records anything (inputs, relation, the
        fixed per-query guarantee, the budget), recording nothing: a dry run, e.g. on an
        in-memory ledger with a new file ledger's settings before that file is created."""
        guarantee, eps_c, delta_c = self._charge(mechanism, inputs)
        self._check_budget(eps_c, delta_c, inputs.n_queries if mechanism.per_query else 1,
                           self._curve_for(guarantee))

    def entries(self) -> list[LedgerEntry]:
        """Every recorded charge, oldest first."""
        rows = self._conn.execute("SELECT id, time, source_id, query_hash, mechanism, epsilon, "
                                  "delta, seeded, note FROM releases ORDER BY id").fetchall()
        return [LedgerEntry(*row[:7], bool(row[7]), row[8]) for row in rows]


# -- creation and comparison ---------------------------------------------------------------

def _check_given(given: dict) -> None:
    problems = privacy_problems("privacy ledger")
    if given["budget_epsilon"] is not None:
        check_epsilon(given["budget_epsilon"], problems, name="budget_epsilon")
    if given["budget_delta"] is not None:
        check_delta(given["budget_delta"], problems, name="budget_delta", allow_zero=True)
    if given["accountant"] is not None and given["accountant"] not in LEDGER_ACCOUNTANTS:
        problems.add(f"accountant must be one of {LEDGER_ACCOUNTANTS}, got "
                     f"{given['accountant']!r}")
    if given["relation"] is not None:
        check_relation(given["relation"], problems)
    if given["per_query_epsilon"] is not None:
        check_epsilon(given["per_query_epsilon"], problems, name="per_query_epsilon")
    if given["per_query_delta"] is not None:
        check_delta(given["per_query_delta"], problems, name="per_query_delta",
                    allow_zero=True)
    if given["delta_prime"] is not None:
        check_delta(given["delta_prime"], problems, name="delta_prime")
    sha = given["dataset_sha256"]
    if sha is not None and (not isinstance(sha, str) or len(sha) != 64):
        problems.add(f"dataset_sha256 must be a 64-digit hex string, got {sha!r}")
    problems.raise_if_any()


def _read_meta(conn: sqlite3.Connection, path: str) -> dict | None:
    cols = [r[1] for r in conn.execute("PRAGMA table_info(ledger_meta)")]
    row = conn.execute("SELECT * FROM ledger_meta").fetchone()
    if row is None:
        return None
    meta = dict(zip(cols, row))
    if meta.get("format_version") != FORMAT_VERSION:
        raise PrivacyError(f"{path} is a ledger of format {meta.get('format_version')!r}; this "
                           f"code reads format {FORMAT_VERSION} (ledgers bound to one dataset "
                           f"and relation); start a new ledger file")
    return meta


def _create(conn: sqlite3.Connection, path: str, given: dict) -> dict:
    eps_t = given["budget_epsilon"]
    if eps_t is None:
        raise PrivacyError(f"{path} is a new ledger: give its total budget (budget_epsilon, "
                           f"and budget_delta, default 0 for pure eps-DP releases)")
    delta_t = 0.0 if given["budget_delta"] is None else float(given["budget_delta"])
    pq_eps, pq_delta = given["per_query_epsilon"], given["per_query_delta"]
    if pq_eps is None and pq_delta is not None:
        raise PrivacyError("per_query_delta needs per_query_epsilon")
    if pq_eps is not None and pq_delta is None:
        pq_delta = 0.0
    accountant = given["accountant"] or ("standard" if pq_eps is None else "best")
    if accountant in _FIXED_ACCOUNTANTS and pq_eps is None:
        raise PrivacyError(
            f"the {accountant} accountant composes a sequence of per-query guarantees fixed in "
            f"advance, not epsilons chosen release by release: create the ledger with a fixed "
            f"per-query (epsilon, delta), or use the standard accountant")
    if accountant in ("standard", "rdp") and pq_eps is not None:
        pq_eps = pq_delta = None       # standard and Renyi composition need no fixed plan
    if accountant == "rdp" and delta_t == 0:
        raise PrivacyError("the rdp accountant converts Renyi curves to (eps, delta)-DP and "
                           "needs budget_delta > 0 (e.g. 1e-5); use 'standard' for a pure-eps "
                           "budget")
    delta_prime = given["delta_prime"]
    if accountant == "rdp" and delta_prime is not None:
        raise PrivacyError("the rdp accountant takes no delta_prime (its conversion uses the "
                           "whole budget_delta)")
    Accountant("standard" if accountant == "rdp" else accountant, delta_prime)
    if delta_prime is not None and delta_prime >= delta_t:
        raise PrivacyError(f"delta_prime={delta_prime!r} must be below budget_delta="
                           f"{delta_t!r}; lower delta_prime or leave it unset")
    if accountant == "advanced" and delta_t == 0:
        raise PrivacyError("the advanced accountant needs budget_delta > 0 (its slack delta' "
                           "comes out of it); use 'standard' for a pure-eps budget")
    if pq_eps is not None and (pq_eps > eps_t or pq_delta > delta_t):
        raise PrivacyError(f"the per-query guarantee ({pq_eps!r}, {pq_delta!r}) exceeds the "
                           f"total budget ({eps_t!r}, {delta_t!r})")
    meta = {"format_version": FORMAT_VERSION, "budget_epsilon": float(eps_t),
            "budget_delta": delta_t, "accountant": accountant, "delta_prime": delta_prime,
            "per_query_epsilon": None if pq_eps is None else float(pq_eps),
            "per_query_delta": None if pq_delta is None else float(pq_delta),
            "relation": given["relation"] or REPLACE_ONE,
            "dataset_sha256": given["dataset_sha256"], "created": _now()}
    conn.execute("INSERT INTO ledger_meta (id, " + ", ".join(meta) + ") VALUES (1, "
                 + ", ".join("?" * len(meta)) + ")", tuple(meta.values()))
    return meta


def _compare(path: str, meta: dict, given: dict) -> None:
    stored, new = meta.get("dataset_sha256"), given.get("dataset_sha256")
    if stored is not None and new is not None and stored != new:
        raise PrivacyError(f"the ledger {path} accounts for another private dataset; one ledger "
                           f"per private dataset (use that dataset's own ledger)")
    mismatch = []
    for key, value in given.items():
        if value is None:
            continue
        stored = meta.get(key)
        if key == "dataset_sha256" and stored is None:
            continue           # bound by the first release
        if key in ("per_query_epsilon", "per_query_delta") and \
                meta["accountant"] in ("standard", "rdp"):
            continue           # a standard ledger fixes no per-query guarantee
        if value != stored:
            mismatch.append(f"{key}={value!r} (stored {stored!r})")
    if mismatch:
        raise PrivacyError(f"{path} was created with other settings: {', '.join(mismatch)}; "
                           f"omit these arguments to use the stored values, or use another "
                           f"ledger file")


def _sqlite_reason(exc: sqlite3.Error) -> str:
    text = str(exc)
    if "readonly" in text or "read-only" in text:
        return "the file or its folder is read-only"
    if "locked" in text:
        return "another process holds it locked; try again"
    return text


# -- the answering door's records ----------------------------------------------------------

@dataclass(frozen=True)
class AnswerRequest:
    """One request to `Ledger.answer_batch`: a mechanism, its inputs (with every query's
    hash as ``query_ids``), the client who asks (a key's id; "" for none) and the client's
    own budget (None: only the ledger's caps it)."""

    mechanism: Mechanism
    inputs: object
    client: str = ""
    client_budget: tuple[float, float] | None = None


@dataclass(frozen=True)
class Answered(Release):
    """What `answer_batch` released for one request: a `Release` (a label per query, REFUSED
    = -1 where the mechanism gave no answer, and the guarantee), which labels came from
    earlier releases (``cached``), and what was recorded: ``charges`` new charges of
    (charged_epsilon, charged_delta) each, one per new query or one per session opened
    (``sessions_opened``); ``session_closed``: a session reached its cutoff within this
    request."""

    cached: NDArray[np.bool_] | None = None
    charges: int = 0
    sessions_opened: int = 0
    session_closed: bool = False


@dataclass(frozen=True)
class _Prepared:
    request: AnswerRequest
    guarantee: Guarantee
    eps_c: float
    delta_c: float


# One statement each (sqlite3's executescript would COMMIT the open transaction first).
_ANSWER_SCHEMA = (
    """CREATE TABLE spend_totals (epsilon REAL NOT NULL, delta REAL NOT NULL,
        count INTEGER NOT NULL, PRIMARY KEY (epsilon, delta))""",
    """INSERT INTO spend_totals (epsilon, delta, count)
        SELECT epsilon, delta, COUNT(*) FROM releases GROUP BY epsilon, delta""",
    """CREATE TABLE client_totals (client TEXT NOT NULL, epsilon REAL NOT NULL,
        delta REAL NOT NULL, count INTEGER NOT NULL, PRIMARY KEY (client, epsilon, delta))""",
    # key: the first 16 bytes of SHA-256(source id | mechanism | query hash); small keys
    # in one B-tree (no rowid) keep a commit's page writes few
    """CREATE TABLE answers (key BLOB PRIMARY KEY, label INTEGER NOT NULL,
        release_id INTEGER NOT NULL) WITHOUT ROWID""",
    """CREATE TABLE sessions (client TEXT NOT NULL, source_id TEXT NOT NULL,
        mechanism TEXT NOT NULL, params TEXT NOT NULL, release_id INTEGER NOT NULL,
        rho INTEGER NOT NULL, tops INTEGER NOT NULL,
        PRIMARY KEY (client, source_id, mechanism))""",
    """CREATE TRIGGER answers_no_update BEFORE UPDATE ON answers
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER answers_no_delete BEFORE DELETE ON answers
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
)


def _add_totals(conn: sqlite3.Connection, epsilon: float, delta: float, count: int,
                client: str = "") -> None:
    """Add `count` charges of (epsilon, delta) to the running totals (and the client's)."""
    conn.execute("INSERT INTO spend_totals (epsilon, delta, count) VALUES (?, ?, ?) "
                 "ON CONFLICT (epsilon, delta) DO UPDATE SET count = count + excluded.count",
                 (float(epsilon), float(delta), int(count)))
    if client:
        conn.execute("INSERT INTO client_totals (client, epsilon, delta, count) VALUES "
                     "(?, ?, ?, ?) ON CONFLICT (client, epsilon, delta) DO UPDATE SET "
                     "count = count + excluded.count",
                     (client, float(epsilon), float(delta), int(count)))


def _ensure_answer_tables(conn: sqlite3.Connection) -> None:
    """Create the answering door's tables on first use (inside the caller's transaction),
    the running totals filled from the charges already recorded."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'answers'"
                    ).fetchone() is not None:
        return
    for statement in _ANSWER_SCHEMA:
        conn.execute(statement)


def _answer_key(source_id: str, mechanism: str, query_hash: str) -> bytes:
    return hashlib.sha256(f"{source_id}|{mechanism}|{query_hash}".encode()).digest()[:16]


def _cached_labels(conn: sqlite3.Connection, source_id: str, mechanism: str,
                   hashes: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    keys = {_answer_key(source_id, mechanism, h): h for h in dict.fromkeys(hashes)}
    unique = list(keys)
    for start in range(0, len(unique), 500):
        chunk = unique[start:start + 500]
        rows = conn.execute(f"SELECT key, label FROM answers WHERE key IN "
                            f"({', '.join('?' * len(chunk))})", chunk)
        out.update((keys[k], int(label)) for k, label in rows)
    return out


def _store_answers(conn: sqlite3.Connection, source_id: str, mechanism: str,
                   hashes: Sequence[str], labels: ArrayLike, release_ids: Sequence[int]) -> None:
    conn.executemany("INSERT INTO answers (key, label, release_id) VALUES (?, ?, ?)",
                     [(_answer_key(source_id, mechanism, h), int(label), int(r))
                      for h, label, r in zip(hashes, np.asarray(labels), release_ids)])
