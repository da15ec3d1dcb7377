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

Fewer round trips, the same reads. Inside the write transaction (i) the store keeps a copy
of what it read of the ledger's few hot rows (the bound dataset, the running totals) and
adds its own writes to it (`_Savepoints`): by the proof, no other writer changes them until
the commit, so the copy equals what a new read would return, and a rollback to a request's
savepoint puts the copy back as the database puts back the rows; (ii) PostgreSQL's
answering transaction runs in pipeline mode: BEGIN, the lock and the first reads are sent
together, and writes whose results are not read are sent with the next read or the COMMIT.
The server runs a pipeline's statements one after the other, each read with its own
snapshot taken when it starts, so every read still runs after the lock was granted and after
every write before it; an error of any queued statement is raised at the next read or at the
COMMIT, before anything is released, and the whole transaction is rolled back.
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
    run_hashes_from_json,
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

    def blocks_since(self, seen: int) -> tuple[int, list[tuple]]:
        """The largest answer block id (0 for none) and (id, source_id, mechanism, params,
        seeded, count, digests, labels) of block `seen` itself (if it exists: the caller
        checks it is the block it read before) and of the blocks after it, in id order: one
        statement (one snapshot, one round trip to a server)."""
        if not self.has_table("answer_blocks"):
            return 0, []
        rows = self.execute(
            "SELECT top.last, b.id, b.source_id, b.mechanism, b.params, b.seeded, b.count, "
            "b.digests, b.labels FROM (SELECT COALESCE(MAX(id), 0) AS last FROM "
            "answer_blocks) AS top LEFT JOIN answer_blocks AS b ON b.id >= ? ORDER BY b.id",
            (int(seen),)).fetchall()
        last = int(rows[0][0])
        self.next_block = last + 1
        return last, [tuple(r[1:]) for r in rows if r[1] is not None]

    def legacy_answers(self) -> list[tuple[bytes, int]]:
        """(key, label) of the ``answers`` table (ledgers answered before the blocks)."""
        if not self.has_table("answers"):
            return []
        return self.execute("SELECT key, label FROM answers").fetchall()


def _totals_of(rows) -> dict[tuple[float, float], int]:
    """Rows (epsilon, delta, count) of a totals table as {(epsilon, delta): count}."""
    totals: dict[tuple[float, float], int] = {}
    for e, d, c in rows:
        totals[(float(e), float(d))] = totals.get((float(e), float(d)), 0) + int(c)
    return totals


class _Savepoints:
    """What one write transaction knows of the ledger, and the savepoints of its requests.

    Under the write lock this connection is the only writer (module docstring), so what it
    read of the ledger's few hot rows -- the dataset it is bound to, the running totals of
    the charges, all and per client -- stays true until it commits, changed only by its own
    writes, which go through `bind_dataset` and `add_totals` and change the copy here with
    the rows. A later read in the same transaction is answered from the copy: the same
    values the database would return, without a round trip. The copy and the id counters
    (the next answer block id, read by the catch-up; PostgreSQL's next charge id) exist only
    between `begin_write` and the commit or rollback; a rollback to a request's savepoint
    puts them back as they were at the savepoint, as the database does with its rows."""

    #: the next answer block id, known under the write lock (None: ask the table)
    next_block: int | None = None
    #: the write transaction's copy of what it read or wrote (None: outside one)
    known: dict | None = None
    _saved: tuple | None = None

    #: the running totals this connection's last committed write transactions knew (read
    #: under their lock, with their own writes: the recorded totals at their commits), by
    #: key as in `known`; totals only grow, so from then on they are at most the recorded
    #: ones (`committed_totals`)
    _committed: dict | None = None

    def _counters(self) -> tuple:
        # (a deep copy: the values are the dataset's hash or dicts of numbers)
        known = None if self.known is None else {
            key: dict(value) if isinstance(value, dict) else value
            for key, value in self.known.items()}
        return (self.next_block, known)

    def _keep_committed(self, known: dict | None) -> None:
        """After a commit: keep what the transaction knew of the running totals."""
        if known:
            totals = {key: dict(value) for key, value in known.items()
                      if isinstance(key, tuple)}
            self._committed = {**(self._committed or {}), **totals}

    def committed_totals(self, key: tuple) -> list[tuple[float, float, int]] | None:
        """(epsilon, delta, count) of the running totals `key` (``("spend",)``, or
        ``("client", id)``) as of the last commit of this connection that read them, or None
        where none did. At most the recorded totals (charges are only added): a budget they
        do not fit is not fitted by the recorded ones either; one they fit is for the write
        transaction's own check to confirm."""
        totals = (self._committed or {}).get(key)
        return None if totals is None else [(e, d, c) for (e, d), c in totals.items()]

    def _restore(self, counters: tuple) -> None:
        self.next_block, self.known = counters

    def _forget(self) -> None:
        """At the start and end of every transaction: nothing is known outside the lock."""
        self.next_block = None
        self.known = None
        self._saved = None

    def read_dataset(self) -> str | None:
        """The dataset the ledger is bound to (None: not yet)."""
        known = self.known
        if known is not None and "dataset" in known:
            return known["dataset"]
        value = self.execute("SELECT dataset_sha256 FROM ledger_meta").fetchone()[0]
        if known is not None:
            known["dataset"] = value
        return value

    def bind_dataset(self, dataset_sha256: str) -> None:
        """Bind the ledger to its dataset (inside the write transaction)."""
        self.write("UPDATE ledger_meta SET dataset_sha256 = ?", (dataset_sha256,))
        if self.known is not None:
            self.known["dataset"] = dataset_sha256

    def _totals(self, key: tuple, sql: str, params: Sequence) -> dict:
        known = self.known
        if known is not None and key in known:
            return known[key]
        totals = _totals_of(self.execute(sql, params).fetchall())
        if known is not None:
            known[key] = totals
        return totals

    def spend_groups(self) -> list[tuple[float, float, int]]:
        """(epsilon, delta, count) of the running totals of every charge."""
        totals = self._totals(("spend",), "SELECT epsilon, delta, count FROM spend_totals", ())
        return [(e, d, c) for (e, d), c in totals.items()]

    def client_groups(self, client: str) -> list[tuple[float, float, int]]:
        """(epsilon, delta, count) of the running totals of one client's charges."""
        totals = self._totals(("client", client), "SELECT epsilon, delta, count FROM "
                              "client_totals WHERE client = ?", (client,))
        return [(e, d, c) for (e, d), c in totals.items()]

    def add_totals(self, epsilon: float, delta: float, count: int, client: str = "") -> None:
        """Add `count` charges of (epsilon, delta) to the running totals (and the client's),
        inside the write transaction."""
        epsilon, delta, count = float(epsilon), float(delta), int(count)
        self.write("INSERT INTO spend_totals (epsilon, delta, count) VALUES (?, ?, ?) "
                   "ON CONFLICT (epsilon, delta) DO UPDATE SET count = spend_totals.count + "
                   "excluded.count", (epsilon, delta, count))
        if client:
            self.write("INSERT INTO client_totals (client, epsilon, delta, count) VALUES "
                       "(?, ?, ?, ?) ON CONFLICT (client, epsilon, delta) DO UPDATE SET count "
                       "= client_totals.count + excluded.count",
                       (client, epsilon, delta, count))
        known = self.known
        if known is None:
            return
        for key in (("spend",), ("client", client)) if client else (("spend",),):
            if key in known:
                known[key][(epsilon, delta)] = known[key].get((epsilon, delta), 0) + count

    def savepoint(self) -> None:
        self.write("SAVEPOINT request")
        self._saved = self._counters()

    def rollback_to_savepoint(self) -> None:
        self.write("ROLLBACK TO SAVEPOINT request")
        self._restore(self._saved)

    def release_savepoint(self) -> None:
        self.write("RELEASE SAVEPOINT request")

    def insert_block(self, row: tuple) -> int:
        """Append an answer block (source_id, mechanism, params, seeded, count, digests,
        labels, release_ids) inside the write transaction; returns its id, the largest so
        far plus one (the write lock makes this the only writer, so ids follow the order of
        the commits): the one the catch-up read under this lock (`blocks_since`) and counted
        on, else asked of the table."""
        if self.next_block is None:
            block_id = self._insert_block_after_last(row)
        else:
            block_id = self.next_block
            self.write("INSERT INTO answer_blocks (id, source_id, mechanism, params, seeded, "
                         "count, digests, labels, release_ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?, "
                         "?)", (block_id, *row))
        self.next_block = block_id + 1
        return block_id


class SqliteStore(_Savepoints, _BlockReads):
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

    def write(self, sql: str, params: Sequence = ()) -> None:
        """A statement whose result the caller does not read (`PostgresStore.write`)."""
        self.execute(sql, params)

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def begin_schema(self) -> None:
        self.execute("BEGIN IMMEDIATE")

    def begin_write(self, pipelined: bool = False) -> None:
        self._forget()
        self.execute("BEGIN IMMEDIATE")
        self.known = {}

    def commit(self) -> None:
        known = self.known
        self._forget()
        self.execute("COMMIT")
        self._keep_committed(known)

    def rollback(self) -> None:
        self._forget()
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def migrate_run_hashes(self) -> None:
        """Inside the migration's transaction: every run's hashes of the old form (JSON
        text) as bytes. The append-only trigger is lifted for this one conversion (the same
        hashes in another form) and put back before the transaction commits."""
        if not self.has_table("charge_runs"):
            return
        rows = self.execute("SELECT id, count, query_hashes FROM charge_runs WHERE "
                            "typeof(query_hashes) = 'text'").fetchall()
        if rows:
            self.execute("DROP TRIGGER IF EXISTS charge_runs_no_update")
            self.executemany("UPDATE charge_runs SET query_hashes = ? WHERE id = ?",
                             [(run_hashes_from_json(text, int(count)), int(i))
                              for i, count, text in rows])
        # the append-only trigger again, and the one that refuses an older agt's JSON
        for statement in _CHARGE_RUNS_SQLITE:
            self.execute(statement)

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
        self.write("INSERT INTO charge_runs (id, count, time, source_id, mechanism, epsilon, "
                   "delta, seeded, note, query_hashes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (start + 1, *row))
        return start + 1

    def _insert_block_after_last(self, row: tuple) -> int:
        cursor = self.execute(
            "INSERT INTO answer_blocks (id, source_id, mechanism, params, seeded, count, "
            "digests, labels, release_ids) SELECT COALESCE(MAX(id), 0) + 1, ?, ?, ?, ?, ?, ?, "
            "?, ? FROM answer_blocks", row)
        return int(cursor.lastrowid)

    def close(self) -> None:
        self.conn.close()


class PostgresStore(_Savepoints, _BlockReads):
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

    #: the answering door's write transaction runs in pipeline mode (`begin_write`)
    _pipeline = None
    _pipeline_context = None

    def execute(self, sql: str, params: Sequence = ()):
        conn = self.conn if self.in_transaction else self._usable()
        try:
            cursor = conn.execute(self._pg(sql), params or None)
            if self._pipeline is not None:
                # the rows now, and the outcome of every write queued before it: an error
                # of any of them raises here (and the caller rolls the transaction back)
                self._pipeline.sync()
            return cursor
        except self._psycopg.Error as exc:
            raise StoreError(self.reason(exc)) from None

    def write(self, sql: str, params: Sequence = ()) -> None:
        """A statement whose result the caller does not read: in a pipelined transaction it
        is queued and sent with the next statement that is read (`execute`) or the COMMIT,
        which raise its error if it failed; else executed at once. The ledger decides
        nothing on what a write returns, so only the round trips change: every check still
        reads, under the lock, what every write before it left."""
        if self._pipeline is None:
            self.execute(sql, params)
            return
        try:
            self.conn.execute(self._pg(sql), params or None)
        except self._psycopg.Error as exc:
            raise StoreError(self.reason(exc)) from None

    def _leave_pipeline(self, failed: bool) -> None:
        context, self._pipeline = self._pipeline_context, None
        self._pipeline_context = None
        if context is None:
            return
        try:
            context.__exit__(None, None, None)
        except self._psycopg.Error as exc:
            if not failed:
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

    #: the next charge id, known under the write lock once asked (`_next_id`)
    next_charge: int | None = None

    def _counters(self) -> tuple:
        return (*super()._counters(), self.next_charge)

    def _restore(self, counters: tuple) -> None:
        super()._restore(counters[:-1])
        self.next_charge = counters[-1]

    def _forget(self) -> None:
        super()._forget()
        self.next_charge = None

    #: the write transaction's start, in one round trip: READ COMMITTED whatever the
    #: database's default (each statement after the lock sees every transaction committed
    #: before it was granted: module docstring), then the budget lock, every writer queued
    #: on the one meta row (a statement of its own: its snapshot is taken after the BEGIN,
    #: and the next statement's after the lock was granted)
    _BEGIN_WRITE = ("BEGIN ISOLATION LEVEL READ COMMITTED; "
                    "SELECT id FROM ledger_meta WHERE id = 1 FOR UPDATE")
    #: the largest charge id recorded, of a ``releases`` row or of a run's last charge
    _LAST_ID = ("SELECT GREATEST((SELECT COALESCE(MAX(id), 0) FROM releases), (SELECT "
                "COALESCE(MAX(id + count - 1), 0) FROM (SELECT id, count FROM charge_runs "
                "ORDER BY id DESC LIMIT 1) AS last))")

    def begin_write(self, pipelined: bool = False) -> None:
        """Begin the write transaction and take the budget lock; `pipelined`: the rest of
        it in pipeline mode (`write`; not for `insert_releases`, whose COPY a pipeline does
        not take), its start in one round trip with the reads every answering transaction
        makes (`_begin_pipelined`)."""
        self._forget()
        self._leave_pipeline(failed=True)
        for attempt in (0, 1):
            self._usable()
            try:
                if pipelined:
                    self._begin_pipelined()
                else:
                    self.execute(self._BEGIN_WRITE)
                    self.known = {}
                return
            except StoreError:
                self._leave_pipeline(failed=True)
                self._forget()
                # a connection lost while idle shows only now; nothing was done yet: once
                # more on a new connection
                if attempt or not self.conn.broken:
                    raise

    def _begin_pipelined(self) -> None:
        """BEGIN, the budget lock, then the ledger's dataset, its running totals and its
        largest charge id, sent together and answered in one round trip. The server runs
        the statements of a pipeline one after the other, each read with a snapshot taken
        when it starts (READ COMMITTED), so the reads run after the lock was granted and
        see every transaction committed before (module docstring): the same values as if
        each were asked alone after the lock, as `read_dataset`, `spend_groups` and
        `_next_id` would."""
        conn = self.conn
        try:
            context = conn.pipeline()
            self._pipeline = context.__enter__()
            self._pipeline_context = context
            conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            conn.execute("SELECT id FROM ledger_meta WHERE id = 1 FOR UPDATE")
            dataset = conn.execute("SELECT dataset_sha256 FROM ledger_meta")
            spend = conn.execute("SELECT epsilon, delta, count FROM spend_totals")
            last = conn.execute(self._LAST_ID)
            self._pipeline.sync()
            self.known = {"dataset": dataset.fetchone()[0],
                          ("spend",): _totals_of(spend.fetchall())}
            self.next_charge = 1 + int(last.fetchone()[0])
        except self._psycopg.Error as exc:
            raise StoreError(self.reason(exc)) from None

    def commit(self) -> None:
        known = self.known
        self._forget()
        # (pipelined: COMMIT and the sync in one round trip, then the outcome of it and of
        # every write queued before it; only then does the caller release anything)
        self.execute("COMMIT")
        self._leave_pipeline(failed=False)
        self._keep_committed(known)

    def rollback(self) -> None:
        self._forget()
        self._leave_pipeline(failed=True)
        if self.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except self._psycopg.Error:
                pass

    def migrate_run_hashes(self) -> None:
        """Inside the migration's transaction: the runs' hashes of the old form (a JSON
        array of hex strings, TEXT) converted to their bytes (BYTEA) in place, with the
        length check of the new format; a run that does not hold `count` hashes fails the
        conversion, and nothing is changed."""
        row = self.execute("SELECT data_type FROM information_schema.columns WHERE "
                           "table_schema = current_schema() AND table_name = 'charge_runs' "
                           "AND column_name = 'query_hashes'").fetchone()
        if row is None or row[0] == "bytea":
            return
        for statement in (
                "ALTER TABLE charge_runs ALTER COLUMN query_hashes TYPE BYTEA USING "
                "decode(translate(query_hashes, '[]\", ', ''), 'hex')",
                "ALTER TABLE charge_runs ADD CONSTRAINT charge_runs_hashes_length "
                "CHECK (length(query_hashes) = 32 * count)",
                "ALTER TABLE charge_runs ALTER COLUMN query_hashes SET STORAGE EXTERNAL",
                "ALTER TABLE answer_blocks ALTER COLUMN digests SET STORAGE EXTERNAL"):
            self.execute(statement)

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
        start = self._next_id(len(rows))
        ids = list(range(start, start + len(rows)))
        self._copy("releases", "id, time, source_id, query_hash, mechanism, epsilon, delta, "
                   "seeded, note", ("int8", "text", "text", "text", "text", "float8", "float8",
                                    "int4", "text"), ((i, *row) for i, row in zip(ids, rows)))
        return ids

    def _next_id(self, count: int) -> int:
        """Take the next `count` charge ids (inside the write transaction); returns the
        first. The first call of a transaction asks the largest recorded, of a ``releases``
        row or of a run's last charge (the budget lock makes this the only writer, so what
        it read stays the largest until it commits); the later ones count on from it."""
        if self.next_charge is None:
            self.next_charge = 1 + int(self.execute(self._LAST_ID).fetchone()[0])
        start = self.next_charge
        self.next_charge += int(count)
        return start

    def insert_run(self, row: tuple) -> int:
        """Insert a run of charges (count, time, source_id, mechanism, epsilon, delta, seeded,
        note, query_hashes) inside the write transaction; returns its first id, after the
        largest recorded (the budget lock makes this the only writer)."""
        start = self._next_id(int(row[0]))
        self.write("INSERT INTO charge_runs (id, count, time, source_id, mechanism, epsilon, "
                   "delta, seeded, note, query_hashes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (start, *row))
        return start

    def _insert_block_after_last(self, row: tuple) -> int:
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
