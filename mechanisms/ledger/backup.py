"""Backing up and restoring an SQLite ledger while it may be in use (SQLite's online backup).

An SQLite ledger runs in write-ahead-log mode (stores.py): a committed charge may sit in the
``<ledger>-wal`` file beside the main file until SQLite copies it back (a checkpoint), so a
copy of the main file alone can lack committed charges, and copying a file over a ledger
whose ``-wal`` is left beside it mixes two databases. Both operations here go through SQLite
itself, page by page under its locks:

* `backup_ledger` reads one snapshot of the ledger (every transaction committed before the
  read began, none after: a read in WAL mode neither waits for nor holds up the writers) into
  a new, self-contained file in rollback-journal mode (no ``-wal`` to carry), synced and then
  renamed into place, so a copy that exists is complete.
* `restore_ledger` writes a backup into the ledger through SQLite's pager: the ledger's own
  write-ahead log is honoured and replaced, never mixed in. It refuses while another
  process holds the ledger open (leaving write-ahead-log mode needs SQLite's exclusive
  lock); a process that held it open during a restore made otherwise notices at its next
  answer if the answer blocks went back (index.py) and refuses.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from agt.errors import PrivacyError
from mechanisms.ledger.stores import is_url


def _sqlite_only(name: str | os.PathLike[str]) -> None:
    """Refuse a PostgreSQL URL: such a ledger is backed up by the server's own tools."""
    if isinstance(name, str) and is_url(name):
        raise PrivacyError("a PostgreSQL ledger is backed up with the server's own tools "
                           "(docs/operations.md, Backups)")


def _connect_existing(path: Path, timeout: float, what: str) -> sqlite3.Connection:
    """A connection to an existing SQLite ledger (refused: a missing file, another
    application's database)."""
    if not path.is_file() or path.stat().st_size == 0:
        raise PrivacyError(f"{what} {path} is not an existing ledger file")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=timeout,
                               isolation_level=None)
        tables = {r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error as exc:
        raise PrivacyError(f"{what} {path} is not a usable ledger ({exc})") from None
    if "ledger_meta" not in tables:
        conn.close()
        raise PrivacyError(f"{what} {path} is not an agt ledger (no ledger_meta table)")
    return conn


def _check(conn: sqlite3.Connection, path: Path) -> None:
    rows = conn.execute("PRAGMA integrity_check").fetchall()
    if rows != [("ok",)]:
        raise PrivacyError(f"{path} fails SQLite's integrity check ({rows[0][0]})")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def backup_ledger(ledger: str | os.PathLike[str], copy: str | os.PathLike[str], *,
                  timeout: float = 60.0) -> int:
    """Copy an SQLite ledger, in use or not, into a new file.

    The copy holds exactly the transactions committed before its read began (SQLite's
    backup API in one step: one read snapshot). It is written to a temporary file beside
    `copy`, checked (``PRAGMA integrity_check``), put in rollback-journal mode, synced, and
    renamed to `copy` (the folder synced too): after a crash there is either no copy or a
    whole one.

    Args:
        ledger: the ledger file (not a PostgreSQL URL: use the server's own backups).
        copy: the new file; refused if it exists.
        timeout: seconds to wait for a lock (only a writer switching the journal mode
            holds one that a reader waits for).

    Returns:
        The number of charges in the copy.

    Raises:
        PrivacyError: the ledger is a PostgreSQL URL, missing or not an agt ledger, the
            copy exists, or a check failed (the partial copy is removed).
    """
    _sqlite_only(ledger)
    src_path, dst_path = Path(ledger), Path(copy)
    if dst_path.exists():
        raise PrivacyError(f"{dst_path} exists; give a new file for the backup")
    if not dst_path.parent.is_dir():
        raise PrivacyError(f"{dst_path.parent} is not an existing folder")
    tmp = dst_path.with_name(f".{dst_path.name}.partial-{os.getpid()}")
    src = _connect_existing(src_path, timeout, "the ledger")
    try:
        tmp.unlink(missing_ok=True)
        dst = sqlite3.connect(tmp, isolation_level=None)
        try:
            src.backup(dst)                       # pages=-1: every page in one snapshot
            dst.execute("PRAGMA journal_mode = DELETE").fetchone()
            _check(dst, dst_path)
            charges = _charges(dst)
        finally:
            dst.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst_path)
        _fsync_dir(dst_path.parent)
        return charges
    except sqlite3.Error as exc:
        raise PrivacyError(f"the backup of {src_path} failed ({exc}); nothing was "
                           f"written") from None
    finally:
        src.close()
        tmp.unlink(missing_ok=True)


def restore_ledger(copy: str | os.PathLike[str], ledger: str | os.PathLike[str], *,
                   timeout: float = 60.0) -> int:
    """Write a backup (`backup_ledger`) into a ledger file, replacing its content.

    Stop every process serving from the ledger first (docs/operations.md, "Backups"): the
    restore refuses while another connection holds the ledger open (`_alone`). It is one
    SQLite write transaction in rollback-journal mode (a crash in the middle leaves the
    ledger as it was), after which the ledger is put back in write-ahead-log mode.

    Args:
        copy: the backup file.
        ledger: the ledger file (created if missing).
        timeout: seconds to wait for another process's write transaction.

    Returns:
        The number of charges in the restored ledger.

    Raises:
        PrivacyError: the ledger is a PostgreSQL URL, the backup is not a whole agt
            ledger, another process holds the ledger open, or the ledger cannot be written.
    """
    _sqlite_only(ledger)
    src_path, dst_path = Path(copy), Path(ledger)
    src = _connect_existing(src_path, timeout, "the backup")
    try:
        _check(src, src_path)
        if dst_path.exists() and dst_path.stat().st_size > 0:
            _connect_existing(dst_path, timeout, "the ledger").close()
        dst = sqlite3.connect(dst_path, timeout=timeout, isolation_level=None)
        try:
            _alone(dst, dst_path)
            dst.execute("PRAGMA synchronous = FULL")
            src.backup(dst)
            dst.execute("PRAGMA journal_mode = WAL").fetchone()
            _check(dst, dst_path)
            return _charges(dst)
        finally:
            dst.close()
    except sqlite3.Error as exc:
        raise PrivacyError(f"the restore into {dst_path} failed ({exc})") from None
    finally:
        src.close()


def _alone(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse to restore while another connection holds the ledger open (a process still
    serving from it, or the backup being the ledger itself): such a process would keep
    answers in memory that the restored ledger no longer records (its index's guard,
    index.py, refuses its next answer; refusing the restore tells the operator now). SQLite
    leaves write-ahead-log mode only with an exclusive
    lock, granted while no other connection has the file open, so switching the ledger to
    rollback-journal mode for the restore is the check (waiting at most 2 seconds: with
    every process stopped nothing holds it); the restore then runs in that mode and
    `restore_ledger` switches it back. A ledger already in rollback mode (never opened by
    this agt) cannot be checked this way.

    Raises:
        PrivacyError: another connection holds the ledger open; nothing was changed.
    """
    busy = conn.execute("PRAGMA busy_timeout").fetchone()[0]
    conn.execute(f"PRAGMA busy_timeout = {min(int(busy), 2000)}")
    try:
        mode = conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc) and "busy" not in str(exc):
            raise
        mode = "wal"
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(busy)}")
    if str(mode).lower() != "delete":
        raise PrivacyError(f"{path} is open in another process (or is the backup itself): "
                           f"stop every process serving from it first (docs/operations.md, "
                           f"Backups); nothing was changed")


def _charges(conn: sqlite3.Connection) -> int:
    """How many charges a ledger records (rows of releases, plus the runs' counts)."""
    n = conn.execute("SELECT COUNT(*) FROM releases").fetchone()[0]
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'charge_runs'").fetchone():
        n += conn.execute("SELECT COALESCE(SUM(count), 0) FROM charge_runs").fetchone()[0]
    return int(n)
