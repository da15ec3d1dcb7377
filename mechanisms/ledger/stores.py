"""The ledger's backends: one SQLite file (the embedded default) or one PostgreSQL database
(several processes, several machines), behind the same few operations.

A store runs SQL written with ``?`` placeholders (PostgreSQL's are rewritten), opens the
one kind of write transaction the ledger uses (`begin_write`: every budget check and every
charge happen inside it, and no two such transactions of one ledger ever overlap), inserts
charges with consecutive ids, and turns every error of its driver into `StoreError` (a
`PrivacyError` that says nothing was released), so a caller never sees a driver's type.

The write lock, and why it makes check-then-commit sound:

* SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock before the first read. In
  write-ahead-log mode (the ledger's) the transaction's read snapshot is taken with the
  lock, at the newest commit (SQLite refuses to start a write transaction on an older
  snapshot), so what follows holds as in rollback mode; readers outside a write
  transaction neither wait for it nor hold it up.
* PostgreSQL: ``BEGIN`` (READ COMMITTED) then ``SELECT ... FROM ledger_meta WHERE id = 1
  FOR UPDATE``: a row lock on the ledger's one meta row, which every write transaction
  takes first and holds until its COMMIT or ROLLBACK (PostgreSQL releases row locks only
  at the end of a transaction, and a terminated connection's transaction is rolled back).
  Row locks rather than SERIALIZABLE with retries: a serialization failure would surface
  after the labels were drawn (a retry loop would have to redraw them), and a budget near
  its end would make the replicas retry each other; one lock makes the writers a queue.

Proof (both backends). Let T1, T2 be two write transactions of one ledger. Each takes the
lock before it reads anything it decides on, so one of them, say T1, holds it first and T2
reads nothing until T1 has committed or rolled back. In READ COMMITTED every statement of
T2 sees a snapshot taken when the statement starts, hence after T1's commit: T2's budget
check composes every charge T1 recorded. By induction over the order in which the lock is
granted, the writers are serial, and each check composes every charge committed before it;
a check that passes keeps (every recorded charge + its own) within the budget, so the
recorded total never exceeds the budget under any interleaving of processes or replicas.
Reads outside a write transaction (`Ledger.spent`, `/v1/budget`) may be a moment old: they
decide nothing.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit, urlunsplit

from agt.errors import PrivacyError
from mechanisms.ledger.schema import (
    _ANSWER_SCHEMA,
    _ANSWERS_FROZEN_SQLITE,
    _BLOCKS_SQLITE,
    _CHARGE_RUNS_SQLITE,
    _IDEMPOTENCY_SQLITE,
    FORMAT_VERSION,
    POSTGRES_FORMAT_VERSION,
    POSTGRES_SCHEMA,
    POSTGRES_TABLES,
)

#: how a ledger is named by URL (anything else is an SQLite file's path)
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class StoreError(PrivacyError):
    """The ledger's database failed (unreachable, read-only, locked, a lost connection):
    what was being written is rolled back; nothing was released."""


def is_url(name: str) -> bool:
    """Whether a ledger name is a PostgreSQL URL (else an SQLite file's path).

    Args:
        name: a path or a URL.

    Returns:
        True for ``postgresql://...`` and ``postgres://...``.
    """
    return isinstance(name, str) and name.startswith(POSTGRES_SCHEMES)


def public_url(url: str) -> str:
    """A PostgreSQL URL without its password (for messages and logs).

    Args:
        url: a ``postgresql://`` URL.

    Returns:
        The URL with ``user:***@`` where a password was given.
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class _BlockReads:
    """The answer blocks' reads, the same SQL on both backends (`has_table` of a
    PostgreSQL store answers True for every table of its schema)."""

    def last_block_id(self) -> int:
        """The largest answer block id (0 for none)."""
        if not self.has_table("answer_blocks"):
            return 0
        return int(self.execute("SELECT COALESCE(MAX(id), 0) FROM answer_blocks").fetchone()[0])

    def blocks_after(self, seen: int) -> list[tuple]:
        """(id, source_id, mechanism, params, seeded, count, digests, labels) of the answer
        blocks after id `seen`, in id order."""
        if not self.has_table("answer_blocks"):
            return []
        return self.execute("SELECT id, source_id, mechanism, params, seeded, count, digests, "
                            "labels FROM answer_blocks WHERE id > ? ORDER BY id",
                            (int(seen),)).fetchall()

    def legacy_answers(self) -> list[tuple[bytes, int]]:
        """(key, label) of the ``answers`` table (ledgers answered before the blocks)."""
        if not self.has_table("answers"):
            return []
        return self.execute("SELECT key, label FROM answers").fetchall()


class SqliteStore(_BlockReads):
    """A ledger in one SQLite file, in write-ahead-log mode with synchronous commits."""

    kind = "SQLite"
    format_version = FORMAT_VERSION

    def __init__(self, conn: sqlite3.Connection, name: str):
        self.conn = conn
        self.name = name
        self._answer_tables_current = False

    @classmethod
    def connect(cls, path: str, timeout: float) -> "SqliteStore":
        try:
            conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise PrivacyError(f"cannot open the privacy ledger {path} ({exc}); give a path "
                               "in an existing, writable directory") from None
        store = cls(conn, path)
        try:
            # FULL: a commit returns once it is on the disk, in either journal mode (the
            # write-ahead log is taken only once the file is known to be a ledger: `opened`)
            store.execute("PRAGMA synchronous = FULL")
            # up to 64 MiB of pages in memory: the answers' index is read at random
            store.execute("PRAGMA cache_size = -65536")
        except StoreError as exc:
            conn.close()
            raise PrivacyError(f"{path} is not a usable privacy ledger ({exc})") from None
        return store

    def opened(self) -> None:
        """Put a file known to be a ledger (its schema transaction committed) in
        write-ahead-log mode, once: the mode is kept in the file (module docstring,
        "SQLite files"). Where SQLite cannot switch (a file in memory, another process of an
        older agt holding the file in rollback mode) the file keeps its mode: with
        ``synchronous = FULL`` every commit is durable in both."""
        if self.name != ":memory:":
            try:
                self.execute("PRAGMA journal_mode = WAL").fetchone()
            except StoreError:      # busy: the file stays in its mode, durable as well
                pass

    @staticmethod
    def reason(exc: BaseException) -> str:
        text = str(exc)
        if "readonly" in text or "read-only" in text:
            return "the file or its folder is read-only"
        if "locked" in text:
            return "another process holds it locked; try again"
        return text

    def execute(self, sql: str, params: Sequence = ()):
        try:
            return self.conn.execute(sql, params)
        except sqlite3.Error as exc:
            raise StoreError(self.reason(exc)) from None

    def executemany(self, sql: str, rows: Iterable[Sequence]) -> None:
        try:
            self.conn.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise StoreError(self.reason(exc)) from None

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def begin_schema(self) -> None:
        self.execute("BEGIN IMMEDIATE")

    def begin_write(self) -> None:
        self.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def tables(self) -> set[str]:
        return {r[0] for r in self.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}

    def has_table(self, name: str) -> bool:
        return self.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                            (name,)).fetchone() is not None

    def ensure_answer_tables(self) -> None:
        """Create the answering door's tables on first use (inside the caller's
        transaction), the running totals filled from the charges already recorded."""
        if not self.has_table("answers"):
            for statement in _ANSWER_SCHEMA:
                self.execute(statement)
        elif not self._answer_tables_current:
            # a ledger answered before these existed
            for statement in _IDEMPOTENCY_SQLITE:     # (IF NOT EXISTS: the triggers too)
                self.execute(statement)
            if not self.has_table("charge_runs"):
                for statement in _CHARGE_RUNS_SQLITE:
                    self.execute(statement)
            for statement in (*_BLOCKS_SQLITE, *_ANSWERS_FROZEN_SQLITE):
                self.execute(statement)
        # (another process may have created them in the meantime: IF NOT EXISTS, and this
        # flag only saves the lookups once they are known to exist)
        self._answer_tables_current = True

    def insert_releases(self, rows: Sequence[tuple]) -> list[int]:
        """Insert charges (time, source_id, query_hash, mechanism, epsilon, delta, seeded,
        note) inside the write transaction; returns their ids (consecutive: one writer)."""
        row = self.execute("SELECT seq FROM sqlite_sequence WHERE name = 'releases'").fetchone()
        start = 0 if row is None else int(row[0])
        self.executemany(
            "INSERT INTO releases (time, source_id, query_hash, mechanism, epsilon, delta, "
            "seeded, note) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
        end = self.execute("SELECT seq FROM sqlite_sequence WHERE name = 'releases'"
                           ).fetchone()[0]
        if end != start + len(rows):
            raise PrivacyError("internal: the ledger's charge ids are not consecutive")
        return list(range(start + 1, end + 1))

    def insert_run(self, row: tuple) -> int:
        """Insert a run of charges (count, time, source_id, mechanism, epsilon, delta, seeded,
        note, query_hashes) inside the write transaction; returns its first id. The run
        takes the next `count` ids of the ``releases`` sequence (AUTOINCREMENT never gives
        an id at or below the sequence's value again, so releases and runs never share
        one)."""
        count = int(row[0])
        seq = self.execute("SELECT seq FROM sqlite_sequence WHERE name = 'releases'").fetchone()
        if seq is None:
            start = 0
            self.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('releases', ?)",
                         (count,))
        else:
            start = int(seq[0])
            self.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'releases'",
                         (start + count,))
        self.execute("INSERT INTO charge_runs (id, count, time, source_id, mechanism, epsilon, "
                     "delta, seeded, note, query_hashes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (start + 1, *row))
        return start + 1

    def insert_block(self, row: tuple) -> int:
        """Append an answer block (source_id, mechanism, params, seeded, count, digests,
        labels, release_ids) inside the write transaction; returns its id (the largest so
        far plus one: ids follow the order of the commits, one writer at a time)."""
        cursor = self.execute(
            "INSERT INTO answer_blocks (id, source_id, mechanism, params, seeded, count, "
            "digests, labels, release_ids) SELECT COALESCE(MAX(id), 0) + 1, ?, ?, ?, ?, ?, ?, "
            "?, ? FROM answer_blocks", row)
        return int(cursor.lastrowid)

    def close(self) -> None:
        self.conn.close()


class PostgresStore(_BlockReads):
    """A ledger in one PostgreSQL database (psycopg 3), shared by every process that opens
    its URL. The connection is opened again after it was lost (a restarted server, a
    terminated backend): the transaction it was in is rolled back by the server, so the
    request in it fails whole and a retry starts afresh."""

    kind = "PostgreSQL"
    format_version = POSTGRES_FORMAT_VERSION

    def __init__(self, url: str, timeout: float):
        self.url = url
        self.name = public_url(url)
        self.timeout = float(timeout)
        self.conn = None
        self._sql: dict[str, str] = {}
        self._connect()

    @classmethod
    def connect(cls, url: str, timeout: float) -> "PostgresStore":
        return cls(url, timeout)

    def opened(self) -> None:
        """Nothing to set once the schema is there (the server's settings rule)."""

    def _connect(self) -> None:
        try:
            import psycopg
        except ImportError:
            raise PrivacyError('a PostgreSQL ledger needs psycopg 3: pip install -e '
                               '".[postgres]"') from None
        self._psycopg = psycopg
        try:
            self.conn = psycopg.connect(self.url, autocommit=True,
                                        connect_timeout=max(1, int(min(self.timeout, 30))))
            # wait for another writer's lock at most `timeout`, as SQLite's busy timeout
            self.conn.execute(f"SET lock_timeout = {int(self.timeout * 1000)}")
        except psycopg.Error as exc:
            self.conn = None
            raise StoreError(f"cannot connect to {self.name} ({self.reason(exc)})") from None

    def reason(self, exc: BaseException) -> str:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return text.replace(self.url, self.name)

    def _usable(self):
        if self.conn is None or self.conn.closed or self.conn.broken:
            if self.conn is not None:
                self.conn.close()
            self._connect()
        return self.conn

    def _pg(self, sql: str) -> str:
        out = self._sql.get(sql)
        if out is None:
            out = self._sql[sql] = sql.replace("?", "%s")
        return out

    def execute(self, sql: str, params: Sequence = ()):
        conn = self.conn if self.in_transaction else self._usable()
        try:
            return conn.execute(self._pg(sql), params or None)
        except self._psycopg.Error as exc:
            raise StoreError(self.reason(exc)) from None

    def executemany(self, sql: str, rows: Iterable[Sequence]) -> None:
        try:
            with self.conn.cursor() as cursor:
                cursor.executemany(self._pg(sql), list(rows))
        except self._psycopg.Error as exc:
            raise StoreError(self.reason(exc)) from None

    @property
    def in_transaction(self) -> bool:
        if self.conn is None or self.conn.closed or self.conn.broken:
            return False
        from psycopg.pq import TransactionStatus
        return self.conn.info.transaction_status != TransactionStatus.IDLE

    def begin_schema(self) -> None:
        # creating tables races between first openers: one advisory lock orders them
        self.execute("BEGIN")
        self.execute("SELECT pg_advisory_xact_lock(4242001)")

    def begin_write(self) -> None:
        self._usable()
        try:
            # READ COMMITTED whatever the database's default: each statement after the lock
            # sees every transaction committed before it was granted (module docstring)
            self.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        except StoreError:
            # a connection lost while idle shows only now; nothing was done yet: once more
            # on a new connection
            if not self.conn.broken:
                raise
            self._usable()
            self.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        # the budget lock (module docstring): every writer queues on the one meta row
        self.execute("SELECT id FROM ledger_meta WHERE id = 1 FOR UPDATE")

    def commit(self) -> None:
        self.execute("COMMIT")

    def rollback(self) -> None:
        if self.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except self._psycopg.Error:
                pass

    def tables(self) -> set[str]:
        return {r[0] for r in self.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}

    def has_table(self, name: str) -> bool:
        return name in POSTGRES_TABLES        # all created with the ledger

    def create_schema(self) -> None:
        for statement in POSTGRES_SCHEMA:
            self.execute(statement)

    def ensure_answer_tables(self) -> None:
        """Nothing to do: a PostgreSQL ledger is created with every table."""

    def _copy(self, table: str, columns: str, types: Sequence[str],
              rows: Iterable[Sequence]) -> None:
        try:
            with self.conn.cursor() as cursor:
                with cursor.copy(f"COPY {table} ({columns}) FROM STDIN (FORMAT BINARY)"
                                 ) as copy:
                    copy.set_types(types)
                    for row in rows:
                        copy.write_row(row)
        except self._psycopg.Error as exc:
            raise StoreError(self.reason(exc)) from None

    def insert_releases(self, rows: Sequence[tuple]) -> list[int]:
        """Insert charges inside the write transaction (one COPY); returns their ids,
        consecutive after the largest recorded (the budget lock makes this the only
        writer; the primary key would refuse a second)."""
        start = self._last_id()
        ids = list(range(start + 1, start + 1 + len(rows)))
        self._copy("releases", "id, time, source_id, query_hash, mechanism, epsilon, delta, "
                   "seeded, note", ("int8", "text", "text", "text", "text", "float8", "float8",
                                    "int4", "text"), ((i, *row) for i, row in zip(ids, rows)))
        return ids

    def _last_id(self) -> int:
        """The largest charge id recorded, of a ``releases`` row or of a run's last charge
        (inside the write transaction: the budget lock makes this the only writer)."""
        return int(self.execute(
            "SELECT GREATEST((SELECT COALESCE(MAX(id), 0) FROM releases), (SELECT "
            "COALESCE(MAX(id + count - 1), 0) FROM (SELECT id, count FROM charge_runs "
            "ORDER BY id DESC LIMIT 1) AS last))").fetchone()[0])

    def insert_run(self, row: tuple) -> int:
        """Insert a run of charges (count, time, source_id, mechanism, epsilon, delta, seeded,
        note, query_hashes) inside the write transaction; returns its first id, after the
        largest recorded (the budget lock makes this the only writer)."""
        start = self._last_id() + 1
        self.execute("INSERT INTO charge_runs (id, count, time, source_id, mechanism, epsilon, "
                     "delta, seeded, note, query_hashes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (start, *row))
        return start

    def insert_block(self, row: tuple) -> int:
        """Append an answer block (source_id, mechanism, params, seeded, count, digests,
        labels, release_ids) inside the write transaction: one INSERT of bytea columns;
        returns its id, the largest so far plus one (the budget lock makes this the only
        writer, so ids follow the order of the commits)."""
        return int(self.execute(
            "INSERT INTO answer_blocks (id, source_id, mechanism, params, seeded, count, "
            "digests, labels, release_ids) SELECT COALESCE(MAX(id), 0) + 1, ?, ?, ?, ?, ?, "
            "?::bytea, ?::bytea, ?::bytea FROM answer_blocks RETURNING id", row
        ).fetchone()[0])

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def open_store(name: str, timeout: float):
    """The store a ledger name points to: a PostgreSQL URL or an SQLite file's path.

    Args:
        name: ``postgresql://...`` or a path (``:memory:`` for simulations).
        timeout: seconds to wait for another writer's lock.

    Returns:
        A `SqliteStore` or a `PostgresStore`.

    Raises:
        PrivacyError: the database cannot be reached or opened.
    """
    if is_url(name):
        return PostgresStore.connect(name, timeout)
    return SqliteStore.connect(os.fspath(name), timeout)


def postgres_ledger_exists(url: str, timeout: float = 10.0) -> bool:
    """Whether the PostgreSQL database at `url` already holds a ledger (its settings row).

    Args:
        url: a ``postgresql://`` URL.
        timeout: seconds to wait for the server.

    Returns:
        True once a ledger was created there.

    Raises:
        PrivacyError: the database cannot be reached.
    """
    store = PostgresStore.connect(url, timeout)
    try:
        if "ledger_meta" not in store.tables():
            return False
        return store.execute("SELECT 1 FROM ledger_meta").fetchone() is not None
    finally:
        store.close()
