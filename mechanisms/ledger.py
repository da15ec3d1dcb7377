"""Persistent privacy ledger (SQLite): check, then commit, then release.

A ledger holds one total budget (eps_T, delta_T), an accountant (accounting.py) and an
append-only table of releases. `Ledger.spend(entries, release_fn)` is the only way to release:

  1. BEGIN IMMEDIATE -- takes SQLite's write lock, so checks from concurrent processes are
     serialised (others wait up to `timeout` seconds instead of failing);
  2. compose every recorded spend plus the new entries with the accountant; if the total is
     over (eps_T, delta_T), roll back and raise BudgetExceededError: nothing is recorded and
     release_fn is never called;
  3. INSERT the entries and COMMIT (a batch of Q releases is one transaction);
  4. only then call release_fn() and return its answer.

So an answer is never returned without its record. A crash after the commit loses the answer
but keeps the spend (budget spent, nothing released: the safe side); a crash before the commit
leaves no trace. Totals are rounded up (accounting.py) and compared without tolerance, so
rounding can refuse a release that is exactly at the budget in real arithmetic, never allow
one that is over it.

The epsilons recorded are with respect to the neighbouring relation of the bundles whose
releases they account for (the caller records it in `note`); one ledger should serve one
relation. Advanced and tight accounting assume spends planned in advance (see accounting.py);
for adaptively chosen heterogeneous epsilons use the "standard" accountant.
"""

from __future__ import annotations

import hashlib
import os
import random
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TypeVar

import numpy as np
from numpy.typing import ArrayLike

from agt.errors import BudgetExceededError, PrivacyError

from mechanisms._checks import Problems, check_delta, check_epsilon
from mechanisms.accounting import Accountant, Composition, SpendGroup
from mechanisms.guarantee import Guarantee

T = TypeVar("T")

FORMAT_VERSION = 1

# One statement each: sqlite3's executescript would COMMIT the open transaction first.
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS ledger_meta (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        format_version INTEGER NOT NULL,
        budget_epsilon REAL NOT NULL CHECK (budget_epsilon > 0),
        budget_delta REAL NOT NULL CHECK (budget_delta >= 0 AND budget_delta < 1),
        accountant TEXT NOT NULL,
        delta_prime REAL,
        created TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS releases (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time TEXT NOT NULL,
        bundle_id TEXT NOT NULL,
        query_hash TEXT NOT NULL,
        mechanism TEXT NOT NULL,
        epsilon REAL NOT NULL CHECK (epsilon > 0),
        delta REAL NOT NULL CHECK (delta >= 0 AND delta < 1),
        note TEXT NOT NULL)""",
    """CREATE TRIGGER IF NOT EXISTS releases_no_update BEFORE UPDATE ON releases
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
    """CREATE TRIGGER IF NOT EXISTS releases_no_delete BEFORE DELETE ON releases
        BEGIN SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END""",
)


def hash_query(query: ArrayLike) -> str:
    """sha256 (hex) of a query array: dtype, shape and C-order bytes, so equal arrays of
    different dtype or shape hash differently."""
    arr = np.ascontiguousarray(np.asarray(query))
    digest = hashlib.sha256()
    digest.update(f"{arr.dtype.str}|{arr.shape}|".encode())
    digest.update(arr.tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class Spend:
    """One release to record: it is (epsilon, delta)-DP; who/what it was for."""

    epsilon: float
    delta: float = 0.0
    mechanism: str = "unspecified"
    bundle_id: str = ""
    query_hash: str = ""
    note: str = ""

    def __post_init__(self) -> None:
        problems = Problems()
        check_epsilon(self.epsilon, problems)
        check_delta(self.delta, problems, allow_zero=True)
        for name in ("mechanism", "bundle_id", "query_hash", "note"):
            if not isinstance(getattr(self, name), str):
                problems.privacy.append(f"{name} must be a string, got {getattr(self, name)!r}")
        problems.raise_if_any()

    @classmethod
    def from_guarantee(cls, guarantee: Guarantee, bundle_id: str = "", query_hash: str = ""
                       ) -> Spend:
        """The spend of one query released with `guarantee` (relation kept in the note)."""
        note = f"relation={guarantee.relation}; {guarantee.note}".rstrip("; ")
        return cls(guarantee.epsilon, guarantee.delta, guarantee.mechanism, bundle_id,
                   query_hash, note)


@dataclass(frozen=True)
class Release:
    """A recorded release (a row of the ledger)."""

    id: int
    time: str
    bundle_id: str
    query_hash: str
    mechanism: str
    epsilon: float
    delta: float
    note: str


def _as_spend(entry: Spend | tuple[float, float]) -> Spend:
    if isinstance(entry, Spend):
        return entry
    if isinstance(entry, tuple) and len(entry) == 2:
        return Spend(entry[0], entry[1])
    raise PrivacyError(f"a spend must be a Spend or an (epsilon, delta) pair, got {entry!r}")


class Ledger:
    """A privacy-budget ledger stored in one SQLite file; see the module docstring."""

    def __init__(self, connection: sqlite3.Connection, path: str, budget_epsilon: float,
                 budget_delta: float, accountant: Accountant):
        self._conn = connection
        self.path = path
        self.budget_epsilon = budget_epsilon
        self.budget_delta = budget_delta
        self.accountant = accountant

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], budget_epsilon: float | None = None,
             budget_delta: float | None = None, accountant: str | None = None,
             delta_prime: float | None = None, timeout: float = 60.0) -> Ledger:
        """Open the ledger at `path`, creating it with the given budget if it does not exist.

        Creating needs budget_epsilon > 0 and budget_delta in [0, 1); accountant defaults to
        "best"; delta_prime None means the slack of advanced/tight composition is whatever
        delta budget the spends leave. Re-opening checks every value given against the stored
        one and refuses a mismatch (None means: use the stored value).
        `timeout`: seconds to wait for another process's transaction.
        """
        path = os.fspath(path)
        problems = Problems()
        if budget_epsilon is not None:
            check_epsilon(budget_epsilon, problems, name="budget_epsilon")
        if budget_delta is not None:
            check_delta(budget_delta, problems, name="budget_delta", allow_zero=True)
        problems.raise_if_any()
        if accountant is not None or delta_prime is not None:
            Accountant(accountant or "best", delta_prime)  # validates both
        try:
            conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise PrivacyError(f"cannot open the privacy ledger {path} ({exc}); give a path "
                               "in an existing, writable directory") from exc
        try:
            _set_wal(conn, timeout)
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    conn.execute(statement)
                row = conn.execute("SELECT format_version, budget_epsilon, budget_delta, "
                                   "accountant, delta_prime FROM ledger_meta").fetchone()
                if row is None:
                    stored = cls._create(conn, path, budget_epsilon, budget_delta,
                                         accountant, delta_prime)
                else:
                    stored = cls._reopen(path, row, budget_epsilon, budget_delta, accountant,
                                         delta_prime)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise PrivacyError(f"{path} is not a usable privacy ledger ({exc}); give the path "
                               "of a ledger file or of a new file") from exc
        except BaseException:
            conn.close()
            raise
        eps_t, delta_t, acc = stored
        return cls(conn, path, eps_t, delta_t, acc)

    @staticmethod
    def _create(conn: sqlite3.Connection, path: str, budget_epsilon: float | None,
                budget_delta: float | None, accountant: str | None,
                delta_prime: float | None) -> tuple[float, float, Accountant]:
        if budget_epsilon is None or budget_delta is None:
            raise PrivacyError(f"{path} is a new ledger: give budget_epsilon and budget_delta "
                               "(0 for pure eps-DP releases)")
        acc = Accountant(accountant or "best", delta_prime)
        if delta_prime is not None and delta_prime >= budget_delta:
            raise PrivacyError(f"delta_prime={delta_prime!r} must be below budget_delta="
                               f"{budget_delta!r}; lower delta_prime or leave it None")
        if acc.name == "advanced" and budget_delta == 0:
            raise PrivacyError("the advanced accountant needs budget_delta > 0 (its slack "
                               "delta' comes out of it); use 'standard' for a pure-eps budget")
        conn.execute("INSERT INTO ledger_meta VALUES (1, ?, ?, ?, ?, ?, ?)",
                     (FORMAT_VERSION, float(budget_epsilon), float(budget_delta), acc.name,
                      None if delta_prime is None else float(delta_prime), _now()))
        return float(budget_epsilon), float(budget_delta), acc

    @staticmethod
    def _reopen(path: str, row: tuple, budget_epsilon: float | None,
                budget_delta: float | None, accountant: str | None,
                delta_prime: float | None) -> tuple[float, float, Accountant]:
        version, eps_t, delta_t, acc_name, stored_prime = row
        if version != FORMAT_VERSION:
            raise PrivacyError(f"{path} has ledger format {version}, this code reads "
                               f"{FORMAT_VERSION}; use a matching version of mechanisms")
        given = {"budget_epsilon": (budget_epsilon, eps_t), "budget_delta": (budget_delta, delta_t),
                 "accountant": (accountant, acc_name), "delta_prime": (delta_prime, stored_prime)}
        mismatch = [f"{k}={new!r} (stored {old!r})" for k, (new, old) in given.items()
                    if new is not None and new != old]
        if mismatch:
            raise PrivacyError(f"{path} was created with a different budget: "
                               f"{', '.join(mismatch)}; omit these arguments to use the "
                               "stored values, or use a new ledger file")
        return eps_t, delta_t, Accountant(acc_name, stored_prime)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- accounting -----------------------------------------------------------------------

    def _recorded_groups(self) -> list[SpendGroup]:
        rows = self._conn.execute("SELECT epsilon, delta, COUNT(*) FROM releases "
                                  "GROUP BY epsilon, delta").fetchall()
        return [(float(e), float(d), int(c)) for e, d, c in rows]

    def _compose(self, groups: Sequence[SpendGroup]) -> Composition:
        merged: dict[tuple[float, float], int] = {}
        for e, d, c in groups:
            merged[(e, d)] = merged.get((e, d), 0) + c
        return self.accountant.compose_groups(
            [(e, d, c) for (e, d), c in sorted(merged.items())], delta_budget=self.budget_delta)

    def spent(self) -> Composition:
        """Composed guarantee of everything recorded so far (accountant's total)."""
        return self._compose(self._recorded_groups())

    def remaining(self) -> tuple[float, float]:
        """(eps_T - spent eps, delta_T - spent delta). Under advanced/tight composition this
        is not additive: ask `can_spend` whether a release fits."""
        spent = self.spent()
        return self.budget_epsilon - spent.epsilon, self.budget_delta - spent.delta

    def can_spend(self, entries: Sequence[Spend | tuple[float, float]]) -> bool:
        """Would recording `entries` on top of the recorded spends stay within the budget?
        (Advisory: another process may spend in between; `spend` re-checks atomically.)"""
        new = _groups_of([_as_spend(e) for e in entries])
        return self._compose(self._recorded_groups() + new).fits(self.budget_epsilon,
                                                                 self.budget_delta)

    # -- the release path -----------------------------------------------------------------

    def spend(self, entries: Sequence[Spend | tuple[float, float]],
              release_fn: Callable[[], T]) -> T:
        """Record `entries` if they fit the budget, then return release_fn().

        Check and insert happen in one BEGIN IMMEDIATE transaction; release_fn is called only
        after the COMMIT. Raises BudgetExceededError (nothing recorded, release_fn not called)
        if the composed total would exceed (eps_T, delta_T). An exception from release_fn
        propagates; its spend stays recorded.
        """
        spends = [_as_spend(e) for e in entries]
        if not spends:
            raise PrivacyError("spend needs at least one entry; pass one Spend per release")
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            total = self._compose(self._recorded_groups() + _groups_of(spends))
            if not total.fits(self.budget_epsilon, self.budget_delta):
                raise BudgetExceededError(
                    f"{len(spends)} release(s) would bring the total to (eps={total.epsilon!r}, "
                    f"delta={total.delta!r}) under {total.method} composition, over the "
                    f"budget (eps={self.budget_epsilon!r}, delta={self.budget_delta!r}); nothing "
                    "was released: lower the per-query epsilon or use a ledger with more budget")
            now = _now()
            conn.executemany(
                "INSERT INTO releases (time, bundle_id, query_hash, mechanism, epsilon, delta, "
                "note) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(now, s.bundle_id, s.query_hash, s.mechanism, float(s.epsilon),
                  float(s.delta), s.note) for s in spends])
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return release_fn()

    def releases(self) -> list[Release]:
        """All recorded releases, oldest first."""
        rows = self._conn.execute("SELECT id, time, bundle_id, query_hash, mechanism, epsilon, "
                                  "delta, note FROM releases ORDER BY id").fetchall()
        return [Release(*row) for row in rows]


def _groups_of(spends: Sequence[Spend]) -> list[SpendGroup]:
    counts: dict[tuple[float, float], int] = {}
    for s in spends:
        key = (float(s.epsilon), float(s.delta))
        counts[key] = counts.get(key, 0) + 1
    return [(e, d, c) for (e, d), c in counts.items()]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _set_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Switch to WAL journaling; the switch can report 'locked' without waiting for the busy
    handler while another process opens the file, so retry until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.01, 0.05))
