"""An SQLite ledger in write-ahead-log mode: a writer killed with SIGKILL under load loses
no answer it returned (the commits in ``-wal`` are replayed at the next open), and
`backup_ledger` / `restore_ledger` (``agt ledger backup|restore``) taken while a process
writes keep every charge committed before the backup began."""

from __future__ import annotations

import contextlib
import signal
import sqlite3

import pytest

from agt.cli.main import main as agt
from agt.errors import PrivacyError
from mechanisms import Ledger
from mechanisms.ledger import backup_ledger, restore_ledger
from tests.mechanisms.test_ledger import python
from tests.mechanisms.test_ledger_backends import ANSWERER


def read_answers(proc, lines: int) -> dict[str, int]:
    """`lines` lines of the ANSWERER's output: each request's query hash -> label, printed
    only after its transaction committed."""
    got: dict[str, int] = {}
    for _ in range(lines):
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        got.update((h, int(v)) for h, v in (p.split(":") for p in line.split()))
    return got


def recorded(path) -> dict[str, int]:
    """Query hash -> recorded label of an SQLite ledger, each answer with its charge."""
    with Ledger.open(path) as ledger:
        charges = {e.id: e.query_hash for e in ledger.entries()}
        assert len(set(charges.values())) == len(charges)            # charged once each
        answers = {charges[r]: label for r, label in ledger.recorded_answers()}
    assert len(answers) == len(charges)
    with contextlib.closing(sqlite3.connect(path)) as conn:    # closed: a restore refuses
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"   # while open
    return answers


def test_backup_under_load_then_sigkill_then_restore(tmp_path):
    path, copy = tmp_path / "l.db", tmp_path / "copy.db"
    Ledger.open(path, 1e6).close()
    proc = python(ANSWERER, str(path))
    try:
        before = read_answers(proc, 3)            # committed before the backup began
        n = backup_ledger(path, copy)             # the writer goes on meanwhile
        after = read_answers(proc, 3)
        assert (tmp_path / "l.db-wal").exists()   # commits live in the log, not the file
    finally:
        proc.send_signal(signal.SIGKILL)          # mid-load: the next request in flight
        proc.communicate(timeout=30)
    assert (tmp_path / "l.db-wal").exists()       # left by the kill, replayed at open
    # every answer the writer returned is recorded, with the label it returned
    ledger = recorded(path)
    assert len(ledger) >= len(before) + len(after) == 300
    assert all(ledger[h] == v for h, v in {**before, **after}.items())
    # the backup: one file, every charge committed before it began, a whole ledger
    assert not (tmp_path / "copy.db-wal").exists()
    backed = recorded(copy)
    assert len(backed) == n >= len(before)
    assert all(backed[h] == v for h, v in before.items())
    assert all(ledger[h] == v for h, v in backed.items())
    # restored over the ledger (its -wal of later commits is replaced, not mixed in)
    assert restore_ledger(copy, path) == n
    assert recorded(path) == backed
    with Ledger.open(path) as again:             # a usable ledger: it answers on
        assert len(again.entries()) == n


def test_backup_and_restore_refusals_and_the_command(tmp_path, capsys):
    path = tmp_path / "l.db"
    with pytest.raises(PrivacyError, match="not an existing ledger"):
        backup_ledger(path, tmp_path / "c.db")
    Ledger.open(path, 1.0).close()
    assert agt(["ledger", "backup", str(path), str(tmp_path / "c.db")]) == 0
    assert "0 charges" in capsys.readouterr().out
    assert agt(["ledger", "backup", str(path), str(tmp_path / "c.db")]) == 2   # exists
    assert "exists" in capsys.readouterr().err
    other = tmp_path / "app.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER)")
    with pytest.raises(PrivacyError, match="not an agt ledger"):
        backup_ledger(other, tmp_path / "d.db")
    with pytest.raises(PrivacyError, match="not an agt ledger"):
        restore_ledger(other, path)              # the ledger is left as it was
    with pytest.raises(PrivacyError, match="not an agt ledger"):
        restore_ledger(tmp_path / "c.db", other)  # another application's file: untouched
    assert agt(["ledger", "restore", str(tmp_path / "c.db"), str(path)]) == 0
    assert agt(["ledger", "backup", "postgresql://u@h/db", str(tmp_path / "e.db")]) == 2
    assert not (tmp_path / "d.db").exists() and not (tmp_path / "e.db").exists()
    assert not list(tmp_path.glob(".*partial*"))


def test_a_restore_is_refused_while_a_process_holds_the_ledger_open(tmp_path):
    """A replica left running through a restore would keep answers the restored ledger
    forgot, and once another replica wrote as many answer blocks again its index's guard
    (fewer blocks than seen) no longer fires: it would release a second label for a query
    the other replica answered. So the restore refuses while any other connection has the
    ledger open (the backup itself, given as the ledger, included), changing nothing; with
    every process stopped it restores."""
    from mechanisms import make_mechanism
    from tests.mechanisms.test_answers import certified

    path, copy = tmp_path / "l.db", tmp_path / "copy.db"
    mech = make_mechanism("exp-radius", 0.5)
    with Ledger.open(str(path), 100.0) as ledger:
        ledger.answer(mech, certified(3, 1))
        backup_ledger(path, copy)
        ledger.answer(mech, certified(3, 2))
        ledger.answer(mech, certified(3, 3))
        with pytest.raises(PrivacyError, match="open in another process"):
            restore_ledger(copy, path)
        assert len(ledger.entries()) == 9
        assert ledger.answer(mech, certified(3, 2)).cached.all()
    with pytest.raises(PrivacyError, match="open in another process"):
        restore_ledger(path, path)
    proc = python(ANSWERER, str(path))               # another process serving from it
    try:
        read_answers(proc, 1)
        with pytest.raises(PrivacyError, match="open in another process"):
            restore_ledger(copy, path)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    assert restore_ledger(copy, path) == 3           # every process stopped
    with Ledger.open(str(path)) as again:
        assert len(again.entries()) == 3
        assert again.answer(mech, certified(3, 1)).cached.all()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
