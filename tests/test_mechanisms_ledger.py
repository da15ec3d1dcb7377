"""Privacy ledger: refuses at the budget, batches are atomic, concurrent processes never
over-spend together, a process killed mid-release leaves a consistent ledger."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from agt.errors import BudgetExceededError, PrivacyError
from mechanisms.accounting import per_query_epsilon
from mechanisms.guarantee import Guarantee
from mechanisms.ledger import Ledger, Spend, hash_query

REPO = Path(__file__).resolve().parents[1]


def python(code: str, *args: str) -> subprocess.Popen:
    """Start `python -c code args...` with the repository importable."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.01)


def row_count(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM releases").fetchone()[0]


# -- budget -------------------------------------------------------------------------------

def test_refuses_exactly_at_the_budget(tmp_path):
    calls = []
    with Ledger.open(tmp_path / "l.db", 1.0, 0.0, accountant="standard") as ledger:
        for i in range(4):
            answer = ledger.spend([Spend(0.25, mechanism="gs")], lambda i=i: calls.append(i) or i)
            assert answer == i
        assert ledger.spent().epsilon == 1.0 and ledger.remaining() == (0.0, 0.0)
        assert not ledger.can_spend([(0.25, 0.0)])
        with pytest.raises(BudgetExceededError, match="over the budget"):
            ledger.spend([Spend(0.25)], lambda: calls.append("fifth"))
    assert calls == [0, 1, 2, 3]  # the refused release never ran
    assert row_count(tmp_path / "l.db") == 4


def test_batch_is_all_or_nothing(tmp_path):
    with Ledger.open(tmp_path / "l.db", 1.0, 0.0, accountant="standard") as ledger:
        with pytest.raises(BudgetExceededError):
            ledger.spend([(0.25, 0.0)] * 5, lambda: "never")
        assert ledger.releases() == []
        assert ledger.spend([(0.25, 0.0)] * 4, lambda: "labels") == "labels"
        assert len(ledger.releases()) == 4


def test_delta_budget_is_enforced(tmp_path):
    with Ledger.open(tmp_path / "l.db", 100.0, 1e-5, accountant="standard") as ledger:
        ledger.spend([(0.1, 4e-6)] * 2, lambda: None)
        with pytest.raises(BudgetExceededError, match="delta"):
            ledger.spend([(0.1, 4e-6)], lambda: None)


def test_tight_ledger_admits_the_calibrated_plan_and_nothing_more(tmp_path):
    q = 25
    eps = per_query_epsilon(10.0, 1e-5, q, accountant="tight")
    assert eps > 10.0 / q  # more than standard composition gives
    with Ledger.open(tmp_path / "l.db", 10.0, 1e-5, accountant="tight") as ledger:
        ledger.spend([Spend(eps, 0.0, "ss-cauchy")] * q, lambda: None)
        assert ledger.spent().epsilon <= 10.0
        with pytest.raises(BudgetExceededError):
            ledger.spend([Spend(eps, 0.0, "ss-cauchy")], lambda: None)


def test_release_failure_after_commit_keeps_the_spend(tmp_path):
    def broken():
        raise RuntimeError("model crashed")

    with Ledger.open(tmp_path / "l.db", 1.0, 0.0) as ledger:
        with pytest.raises(RuntimeError):
            ledger.spend([(0.5, 0.0)], broken)
        assert ledger.spent().epsilon == 0.5


def test_records_what_was_released(tmp_path):
    g = Guarantee(0.5, 1e-6, "add-remove", "ss-laplace", "beta=...")
    q = np.arange(6, dtype=np.float32).reshape(2, 3)
    with Ledger.open(tmp_path / "l.db", 1.0, 1e-5) as ledger:
        ledger.spend([Spend.from_guarantee(g, "bundle-1", hash_query(q))], lambda: None)
        (rec,) = ledger.releases()
    assert (rec.epsilon, rec.delta, rec.mechanism, rec.bundle_id) == (0.5, 1e-6, "ss-laplace",
                                                                       "bundle-1")
    assert rec.query_hash == hash_query(q.copy()) != hash_query(q.astype(np.float64))
    assert "relation=add-remove" in rec.note and rec.time.endswith("+00:00")
    with sqlite3.connect(tmp_path / "l.db") as conn, pytest.raises(sqlite3.IntegrityError):
        conn.execute("DELETE FROM releases")


# -- opening ------------------------------------------------------------------------------

def test_reopen_checks_the_stored_budget(tmp_path):
    path = tmp_path / "l.db"
    Ledger.open(path, 2.0, 1e-6, accountant="tight").close()
    with Ledger.open(path) as ledger:  # omitted values: the stored ones
        assert (ledger.budget_epsilon, ledger.budget_delta) == (2.0, 1e-6)
        assert ledger.accountant.name == "tight"
    Ledger.open(path, 2.0, 1e-6, accountant="tight").close()
    for kwargs in ({"budget_epsilon": 3.0}, {"budget_delta": 1e-5}, {"accountant": "best"},
                   {"delta_prime": 1e-7}):
        with pytest.raises(PrivacyError, match="different budget"):
            Ledger.open(path, **kwargs)


@pytest.mark.parametrize("eps,delta", [(0.0, 0.0), (-1.0, 0.0), (float("nan"), 0.0),
                                       (float("inf"), 0.0), (1.0, 1.0), (1.0, -1e-6),
                                       (1.0, float("nan"))])
def test_invalid_budgets_are_refused(tmp_path, eps, delta):
    with pytest.raises(PrivacyError, match="budget_"):
        Ledger.open(tmp_path / "l.db", eps, delta)


def test_other_bad_openings(tmp_path):
    with pytest.raises(PrivacyError, match="new ledger"):
        Ledger.open(tmp_path / "new.db")
    with pytest.raises(PrivacyError, match="accountant must be"):
        Ledger.open(tmp_path / "a.db", 1.0, 0.0, accountant="rdp")
    with pytest.raises(PrivacyError, match="budget_delta > 0"):
        Ledger.open(tmp_path / "b.db", 1.0, 0.0, accountant="advanced")
    with pytest.raises(PrivacyError, match="delta_prime"):
        Ledger.open(tmp_path / "c.db", 1.0, 1e-6, delta_prime=1e-5)
    with pytest.raises(PrivacyError, match="cannot open"):
        Ledger.open(tmp_path / "missing-dir" / "l.db", 1.0, 0.0)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(PrivacyError, match="not a usable privacy ledger"):
        Ledger.open(junk, 1.0, 0.0)
    with Ledger.open(tmp_path / "d.db", 1.0, 0.0) as ledger:
        with pytest.raises(PrivacyError, match="epsilon"):
            ledger.spend([(0.0, 0.0)], lambda: None)
        with pytest.raises(PrivacyError, match="at least one"):
            ledger.spend([], lambda: None)


# -- processes ----------------------------------------------------------------------------

SPENDER = """
import sys, time
from pathlib import Path
from agt.errors import BudgetExceededError
from mechanisms.ledger import Ledger, Spend
path, go, ready = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
ledger = Ledger.open(path)
ready.touch()
while not go.exists():
    time.sleep(0.002)
done = 0
while True:
    try:  # the release (outside the lock) takes a moment, so the processes interleave
        ledger.spend([Spend(1 / 64, mechanism="gs")], lambda: time.sleep(0.002))
    except BudgetExceededError:
        break
    done += 1
print(done)
"""


def test_concurrent_processes_never_overspend_together(tmp_path):
    path, go = tmp_path / "l.db", tmp_path / "go"
    Ledger.open(path, 1.0, 0.0, accountant="standard").close()
    ready = [tmp_path / f"ready{i}" for i in range(6)]
    procs = [python(SPENDER, str(path), str(go), str(r)) for r in ready]
    for r in ready:
        wait_for(r, timeout=30)
    go.touch()
    counts = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        counts.append(int(out))
    assert sum(counts) == 64 == row_count(path)  # 64 * 1/64 is exactly the budget
    assert sum(c > 0 for c in counts) >= 2  # the processes did compete
    with Ledger.open(path) as ledger:
        assert ledger.spent().epsilon == 1.0


KILLED_AFTER_COMMIT = """
import sys, time
from pathlib import Path
from mechanisms.ledger import Ledger
marker = Path(sys.argv[2])
def release():
    marker.touch()  # the spend is committed; the answer never comes
    time.sleep(60)
Ledger.open(sys.argv[1]).spend([(0.25, 0.0)], release)
"""

KILLED_MID_TRANSACTION = """
import sqlite3, sys, time
from pathlib import Path
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO releases (time, bundle_id, query_hash, mechanism, epsilon, delta, "
             "note) VALUES ('t', '', '', 'gs', 0.5, 0.0, 'uncommitted')")
Path(sys.argv[2]).touch()
time.sleep(float(sys.argv[3]))
"""


def assert_consistent(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_killed_after_commit_keeps_the_spend(tmp_path):
    path, marker = tmp_path / "l.db", tmp_path / "committed"
    Ledger.open(path, 1.0, 0.0, accountant="standard").close()
    proc = python(KILLED_AFTER_COMMIT, str(path), str(marker))
    wait_for(marker)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert_consistent(path)
    with Ledger.open(path) as ledger:
        assert ledger.spent().epsilon == 0.25
        ledger.spend([(0.75, 0.0)], lambda: None)
        with pytest.raises(BudgetExceededError):
            ledger.spend([(0.25, 0.0)], lambda: None)


def test_killed_mid_transaction_leaves_no_trace(tmp_path):
    path, marker = tmp_path / "l.db", tmp_path / "locked"
    Ledger.open(path, 1.0, 0.0, accountant="standard").close()
    proc = python(KILLED_MID_TRANSACTION, str(path), str(marker), "60")
    wait_for(marker)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert_consistent(path)
    with Ledger.open(path) as ledger:
        assert ledger.releases() == []
        ledger.spend([(1.0, 0.0)], lambda: None)


def test_a_spend_waits_for_another_process_holding_the_lock(tmp_path):
    path, marker = tmp_path / "l.db", tmp_path / "locked"
    Ledger.open(path, 1.0, 0.0, accountant="standard").close()
    proc = python(KILLED_MID_TRANSACTION, str(path), str(marker), "1.0")  # exits, rolls back
    wait_for(marker)
    start = time.monotonic()
    with Ledger.open(path, timeout=30) as ledger:  # opening and spending both need the lock
        ledger.spend([(1.0, 0.0)], lambda: None)
        assert time.monotonic() - start > 0.3  # waited for the lock instead of failing
        assert [r.note for r in ledger.releases()] == [""]
    proc.communicate(timeout=10)
