"""The privacy ledger, the one door: releases go through `Ledger.release(mechanism, inputs)`,
which refuses at the budget, records every query, binds one dataset and one relation, fixes
the per-query guarantee for accountants that need it, records seeded noise, and survives
concurrent processes and kills."""

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from agt.errors import BudgetExceededError, DataError, PrivacyError
from mechanisms import Certified, Ledger, Source, default_ledger_path, make_mechanism
from mechanisms.accounting import per_query_epsilon
from mechanisms.ledger import backup_ledger, hash_query

REPO = Path(__file__).resolve().parents[2]
SHA = "ab" * 32
OTHER = "cd" * 32


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


def inputs(n=1, sha=SHA, relations=("replace-one",), radius=3, ids=None):
    return Certified(np.arange(n) % 2, np.full(n, radius), 2,
                     Source("bundle-1", sha, tuple(relations), True), ids)


GS = lambda eps: make_mechanism("gs", eps)  # noqa: E731


# -- budget -------------------------------------------------------------------------------

def test_refuses_exactly_at_the_budget(tmp_path):
    with Ledger.open(tmp_path / "l.db", 1.0, 0.0) as ledger:
        assert ledger.accountant.name == "standard"
        for _ in range(4):
            out = ledger.release(GS(0.25), inputs())
            assert out.labels.shape == (1,) and out.guarantee.epsilon == 0.25
        assert ledger.spent().epsilon == 1.0 and ledger.remaining() == (0.0, 0.0)
        assert not ledger.fits(1, 0.25)
        with pytest.raises(BudgetExceededError, match="over the budget"):
            ledger.release(GS(0.25), inputs())
    assert row_count(tmp_path / "l.db") == 4


def test_batch_is_all_or_nothing_and_draws_nothing_when_refused(tmp_path, monkeypatch):
    drawn = []
    mech = GS(0.25)
    original = type(mech)._draw
    monkeypatch.setattr(type(mech), "_draw",
                        lambda self, i, rng: drawn.append(1) or original(self, i, rng))
    with Ledger.open(tmp_path / "l.db", 1.0, 0.0) as ledger:
        with pytest.raises(BudgetExceededError):
            ledger.release(mech, inputs(5))
        assert ledger.entries() == [] and drawn == []
        assert ledger.release(mech, inputs(4)).n_queries == 4
        assert len(ledger.entries()) == 4 and drawn == [1]


def test_delta_budget_is_enforced(tmp_path):
    with Ledger.open(tmp_path / "l.db", 100.0, 1e-5) as ledger:
        ledger.release(make_mechanism("ss-laplace", 0.1, 4e-6), inputs(2))
        with pytest.raises(BudgetExceededError, match="delta"):
            ledger.release(make_mechanism("ss-laplace", 0.1, 4e-6), inputs(1))


def test_tight_ledger_admits_the_calibrated_plan_and_nothing_more(tmp_path):
    q = 25
    eps = per_query_epsilon(10.0, 1e-5, q, accountant="tight")
    assert eps > 10.0 / q  # more than standard composition gives
    with Ledger.open(tmp_path / "l.db", 10.0, 1e-5, accountant="tight",
                     per_query_epsilon=eps) as ledger:
        ledger.release(make_mechanism("ss-cauchy", eps), inputs(q))
        assert ledger.spent().epsilon <= 10.0
        with pytest.raises(BudgetExceededError):
            ledger.release(make_mechanism("ss-cauchy", eps), inputs(1))


# -- item 6: accountants that compose a fixed sequence need a fixed per-query guarantee ------

@pytest.mark.parametrize("accountant", ["best", "advanced", "tight"])
def test_non_standard_accountants_need_a_fixed_per_query_guarantee(tmp_path, accountant):
    with pytest.raises(PrivacyError, match="fixed in advance"):
        Ledger.open(tmp_path / "l.db", 10.0, 1e-5, accountant=accountant)
    with Ledger.open(tmp_path / "l.db", 10.0, 1e-5, accountant=accountant,
                     per_query_epsilon=0.5) as ledger:
        assert ledger.per_query == (0.5, 0.0)
        with pytest.raises(PrivacyError, match="fixes every release at"):
            ledger.release(GS(0.6), inputs())          # a larger epsilon: refused
        out = ledger.release(GS(0.3), inputs())        # a smaller one: charged the fixed 0.5
        assert out.charged_epsilon == 0.5 and out.guarantee.epsilon == 0.3
        (entry,) = ledger.entries()
        assert entry.epsilon == 0.5 and "charged at the ledger's fixed" in entry.note


def test_standard_ledger_accepts_adaptive_epsilons(tmp_path):
    with Ledger.open(tmp_path / "l.db", 1.0, 0.0) as ledger:
        ledger.release(GS(0.1), inputs())
        ledger.release(GS(0.7), inputs())
        assert ledger.spent().epsilon == pytest.approx(0.8)


# -- item 4: one dataset, one relation -----------------------------------------------------

def test_one_dataset_per_ledger(tmp_path):
    with Ledger.open(tmp_path / "l.db", 10.0, 0.0) as ledger:
        assert ledger.dataset_sha256 is None
        ledger.release(GS(0.5), inputs())             # the first release binds the dataset
        assert ledger.dataset_sha256 == SHA
        with pytest.raises(PrivacyError, match="one ledger per private dataset"):
            ledger.release(GS(0.5), inputs(sha=OTHER))
    with Ledger.open(tmp_path / "m.db", 10.0, 0.0, dataset_sha256=OTHER) as ledger:
        with pytest.raises(PrivacyError, match="one ledger per private dataset"):
            ledger.release(GS(0.5), inputs())
    assert row_count(tmp_path / "m.db") == 0


def test_one_relation_per_ledger_with_sound_conversion(tmp_path):
    """The audit's case: 0.5 under add-remove plus 0.5 under replace-one used to total 1.0. A
    replace-one ledger now converts the add-remove spend (group privacy: 2 eps) and totals
    1.5; an add-remove ledger refuses replace-one-only inputs."""
    ss = make_mechanism("ss-cauchy", 0.5)
    with Ledger.open(tmp_path / "r.db", 10.0, 0.0) as ledger:
        assert ledger.relation == "replace-one"
        ledger.release(ss, inputs(relations=("add-remove",)))
        ledger.release(ss, inputs(relations=("replace-one",)))
        assert ledger.spent().epsilon == pytest.approx(1.5)
        converted, native = ledger.entries()
        assert converted.epsilon == 1.0 and "converted from add-remove" in converted.note
        assert native.epsilon == 0.5
    with Ledger.open(tmp_path / "a.db", 10.0, 0.0, relation="add-remove") as ledger:
        with pytest.raises(PrivacyError, match="no add-remove guarantee"):
            ledger.release(ss, inputs(relations=("replace-one",)))
        ledger.release(ss, inputs(relations=("replace-one", "add-remove")))
        assert ledger.spent().epsilon == 0.5
        # a data-independent mechanism holds under every relation
        ledger.release(GS(0.5), inputs(relations=("replace-one",)))


def test_default_ledger_is_per_dataset_and_does_not_expose_the_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("AGT_LEDGER_DIR", str(tmp_path / "ledgers"))
    a, b = default_ledger_path(SHA), default_ledger_path(SHA)
    assert a == b != default_ledger_path(OTHER)
    assert SHA[:8] not in a.name                     # keyed name, not the raw hash
    key = tmp_path / "ledgers" / ".key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


# -- item 5: seeded noise is recorded ------------------------------------------------------

def test_seeded_noise_is_recorded_and_secure_noise_is_the_default(tmp_path):
    q = np.arange(6, dtype=np.float32).reshape(2, 3)
    with Ledger.open(tmp_path / "l.db", 10.0, 0.0) as ledger:
        secure = ledger.release(GS(0.5), inputs(1, ids=(hash_query(q),)))
        seeded = ledger.release(GS(0.5), inputs(1), insecure_seed=7)
        again = ledger.release(GS(0.5), inputs(1), insecure_seed=7)
        assert not secure.seeded and seeded.seeded
        assert np.array_equal(seeded.labels, again.labels)
        e1, e2, _ = ledger.entries()
        assert not e1.seeded and e1.query_hash == hash_query(q.copy())
        assert e2.seeded and "INSECURE" in e2.note and "seed 7" in e2.note
        with pytest.raises(PrivacyError, match="insecure_seed"):
            ledger.release(GS(0.5), inputs(1), insecure_seed=-1)
    assert hash_query(q) != hash_query(q.astype(np.float64))


def test_records_what_was_released(tmp_path):
    with Ledger.open(tmp_path / "l.db", 1.0, 1e-5) as ledger:
        ledger.release(make_mechanism("ss-laplace", 0.5, 1e-6), inputs(relations=("replace-one",)))
        (rec,) = ledger.entries()
    assert (rec.epsilon, rec.delta, rec.mechanism, rec.source_id) == (0.5, 1e-6, "ss-laplace",
                                                                       "bundle-1")
    assert "relation=replace-one" in rec.note and rec.time.endswith("+00:00")
    with sqlite3.connect(tmp_path / "l.db") as conn, pytest.raises(sqlite3.IntegrityError):
        conn.execute("DELETE FROM releases")


def test_refused_inputs_record_nothing(tmp_path):
    threshold = Certified(np.array([0, 1]), np.array([2, 3]), 2,
                          Source("b", SHA, ("replace-one",), False, "threshold"))
    with Ledger.open(tmp_path / "l.db", 10.0, 0.0) as ledger:
        with pytest.raises(PrivacyError, match="selection: exact"):
            ledger.release(make_mechanism("ss-cauchy", 1.0), threshold)
        with pytest.raises(DataError, match="Votes"):
            ledger.release(make_mechanism("lnmax", 1.0), inputs())
        with pytest.raises(PrivacyError, match="mechanism object"):
            ledger.release("gs", inputs())
        assert ledger.entries() == []


# -- opening ------------------------------------------------------------------------------

def test_reopen_checks_the_stored_settings(tmp_path):
    path = tmp_path / "l.db"
    Ledger.open(path, 2.0, 1e-6, accountant="tight", per_query_epsilon=0.1).close()
    with Ledger.open(path) as ledger:  # omitted values: the stored ones
        assert (ledger.budget_epsilon, ledger.budget_delta) == (2.0, 1e-6)
        assert ledger.accountant.name == "tight" and ledger.per_query == (0.1, 0.0)
    Ledger.open(path, 2.0, 1e-6, accountant="tight").close()
    for kwargs in ({"budget_epsilon": 3.0}, {"budget_delta": 1e-5}, {"accountant": "best"},
                   {"delta_prime": 1e-7}, {"relation": "add-remove"},
                   {"per_query_epsilon": 0.2}):
        with pytest.raises(PrivacyError, match="other settings"):
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
        Ledger.open(tmp_path / "a.db", 1.0, 0.0, accountant="renyi")
    with pytest.raises(PrivacyError, match="budget_delta > 0"):
        Ledger.open(tmp_path / "a.db", 1.0, 0.0, accountant="rdp")
    with pytest.raises(PrivacyError, match="no delta_prime"):
        Ledger.open(tmp_path / "a.db", 1.0, 1e-5, accountant="rdp", delta_prime=1e-6)
    assert not (tmp_path / "a.db").exists() or Ledger.open(tmp_path / "a.db", 1.0, 1e-5,
                                                            accountant="rdp").is_rdp
    with pytest.raises(PrivacyError, match="budget_delta > 0"):
        Ledger.open(tmp_path / "b.db", 1.0, 0.0, accountant="advanced", per_query_epsilon=0.1)
    with pytest.raises(PrivacyError, match="delta_prime"):
        Ledger.open(tmp_path / "c.db", 1.0, 1e-6, delta_prime=1e-5)
    with pytest.raises(PrivacyError, match="not an existing folder"):
        Ledger.open(tmp_path / "missing-dir" / "l.db", 1.0, 0.0)
    with pytest.raises(PrivacyError, match="relation"):
        Ledger.open(tmp_path / "d.db", 1.0, 0.0, relation="swap")
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    with pytest.raises(PrivacyError, match="not a usable privacy ledger"):
        Ledger.open(junk, 1.0, 0.0)


def test_a_foreign_sqlite_database_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
        conn.execute("INSERT INTO customers VALUES (1, 'x')")
    before = path.read_bytes()
    with pytest.raises(PrivacyError, match="another application"):
        Ledger.open(path, 1.0, 0.0)
    assert path.read_bytes() == before


def test_an_empty_file_is_a_new_ledger(tmp_path):
    path = tmp_path / "empty.db"
    path.touch()
    with Ledger.open(path, 1.0, 0.0) as ledger:
        ledger.release(GS(0.5), inputs())
    assert row_count(path) == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_ledger_is_a_one_line_error(tmp_path):
    path = tmp_path / "l.db"
    Ledger.open(path, 1.0, 0.0).close()
    path.chmod(0o444)
    try:
        with pytest.raises(PrivacyError, match="read-only|readonly"):
            with Ledger.open(path) as ledger:
                ledger.release(GS(0.5), inputs())
    finally:
        path.chmod(0o644)


def test_read_only_database_is_a_one_line_error(tmp_path):
    path = tmp_path / "l.db"
    Ledger.open(path, 1.0, 0.0).close()
    uri = f"file:{path}?mode=ro"
    with Ledger.open(path) as ledger:
        ledger._conn.close()
        ledger._conn = sqlite3.connect(uri, uri=True, isolation_level=None)
        with pytest.raises(PrivacyError, match="read-only"):
            ledger.release(GS(0.5), inputs())


def test_every_committed_spend_is_in_a_backup_taken_while_open(tmp_path):
    """Write-ahead-log mode (commits may sit in l.db-wal): `backup_ledger`, taken while the
    ledger is open, holds every committed spend in one self-contained file."""
    path = tmp_path / "l.db"
    with Ledger.open(path, 10.0, 0.0) as ledger:
        assert ledger._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert ledger._db.execute("PRAGMA synchronous").fetchone()[0] == 2     # FULL
        ledger.release(GS(0.5), inputs(3))
        assert (tmp_path / "l.db-wal").exists()
        assert backup_ledger(path, tmp_path / "copy.db") == 3
    assert not (tmp_path / "copy.db-wal").exists()
    assert row_count(tmp_path / "copy.db") == 3


# -- processes ----------------------------------------------------------------------------

SPENDER = """
import sys, time
from pathlib import Path
import numpy as np
from agt.errors import BudgetExceededError
from mechanisms import Certified, Ledger, Source, make_mechanism
path, go, ready = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
ledger = Ledger.open(path)
inputs = Certified(np.array([1]), None, 2, Source("b", "ab" * 32, ("replace-one",), True))
mech = make_mechanism("gs", 1 / 64)
ready.touch()
while not go.exists():
    time.sleep(0.002)
done = 0
while True:
    try:
        ledger.release(mech, inputs)
        time.sleep(0.002)          # the processes interleave
    except BudgetExceededError:
        break
    done += 1
print(done)
"""


def test_concurrent_processes_never_overspend_together(tmp_path):
    path, go = tmp_path / "l.db", tmp_path / "go"
    Ledger.open(path, 1.0, 0.0).close()
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
import numpy as np
from mechanisms import Certified, Ledger, Source
from mechanisms.global_sens import GlobalSensitivity
marker = Path(sys.argv[2])
class Slow(GlobalSensitivity):
    def _draw(self, inputs, rng):
        marker.touch()  # the spend is committed; the answer never comes
        time.sleep(60)
inputs = Certified(np.array([1]), None, 2, Source("b", "ab" * 32, ("replace-one",), True))
Ledger.open(sys.argv[1]).release(Slow(0.25), inputs)
"""

KILLED_MID_TRANSACTION = """
import sqlite3, sys, time
from pathlib import Path
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO releases (time, source_id, query_hash, mechanism, epsilon, delta, "
             "seeded, note) VALUES ('t', '', '', 'gs', 0.5, 0.0, 0, 'uncommitted')")
Path(sys.argv[2]).touch()
time.sleep(float(sys.argv[3]))
"""


def assert_consistent(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_killed_after_commit_keeps_the_spend(tmp_path):
    path, marker = tmp_path / "l.db", tmp_path / "committed"
    Ledger.open(path, 1.0, 0.0).close()
    proc = python(KILLED_AFTER_COMMIT, str(path), str(marker))
    wait_for(marker)
    backup_ledger(path, tmp_path / "copy.db")    # the backup holds the committed spend
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert_consistent(path)
    assert row_count(tmp_path / "copy.db") == 1
    with Ledger.open(path) as ledger:
        assert ledger.spent().epsilon == 0.25
        ledger.release(GS(0.75), inputs())
        with pytest.raises(BudgetExceededError):
            ledger.release(GS(0.25), inputs())


def test_killed_mid_transaction_leaves_no_trace(tmp_path):
    path, marker = tmp_path / "l.db", tmp_path / "locked"
    Ledger.open(path, 1.0, 0.0).close()
    proc = python(KILLED_MID_TRANSACTION, str(path), str(marker), "60")
    wait_for(marker)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    with Ledger.open(path) as ledger:           # opening rolls the hot journal back
        assert ledger.entries() == []
        ledger.release(GS(1.0), inputs())
    assert_consistent(path)


def test_a_spend_waits_for_another_process_holding_the_lock(tmp_path):
    path, marker = tmp_path / "l.db", tmp_path / "locked"
    Ledger.open(path, 1.0, 0.0).close()
    proc = python(KILLED_MID_TRANSACTION, str(path), str(marker), "1.0")  # exits, rolls back
    wait_for(marker)
    start = time.monotonic()
    with Ledger.open(path, timeout=30) as ledger:  # opening and spending both need the lock
        ledger.release(GS(1.0), inputs())
        assert time.monotonic() - start > 0.3  # waited for the lock instead of failing
        assert [e.note.startswith("relation=replace-one") for e in ledger.entries()] == [True]
    proc.communicate(timeout=10)


# -- nothing fails after the spend ----------------------------------------------------------

def _extreme_inputs(entry, n_classes: int, sensitivity: float = 0.1, source_relation=None):
    """Small inputs of every kind a registered mechanism takes."""
    from mechanisms import Votes
    from mechanisms.convex import LinearModel
    from mechanisms.loss_perturbation import PerturbedObjective

    rng = np.random.default_rng(0)
    src = Source("b", SHA, (source_relation or "replace-one",), True)
    if entry.inputs is Certified:
        return Certified(rng.integers(0, n_classes, 6), np.array([-1, 0, 1, 5, 100, 10**6]),
                         n_classes, src)
    if entry.inputs is Votes:
        return Votes(rng.integers(0, n_classes, (6, 5)), rng.integers(-1, 50, (6, 5)), n_classes,
                     src)
    x = rng.normal(size=(6, 4))
    x /= 2 * np.linalg.norm(x, axis=1, keepdims=True)
    if entry.inputs is LinearModel:
        return LinearModel(rng.normal(size=(n_classes, 4)), x, sensitivity, n_classes, src)
    assert entry.inputs is PerturbedObjective
    return PerturbedObjective(lambda b, r: np.zeros((n_classes, 4)), x, 100, n_classes,
                              0.0 if sensitivity > 1 else 1e-2, src)


def test_every_mechanism_refuses_before_the_spend_or_releases():
    """An audit found releases that failed only after the ledger had recorded the spend
    (ss-laplace at delta < 1.1e-308: 2 / delta overflowed, beta 0; ptr, gs and lnmax at eps
    ~1e-310: thresholds and scales overflowed): budget spent, nothing released. Every
    registered mechanism, at extreme (eps, delta) and 2 or 3 classes, either is refused
    before anything is recorded or releases labels; so do the convex mechanisms at extreme
    sensitivities (a second review: a ZeroDivisionError after the spend at sensitivity
    1e25, infinite noise at 1e19), loss perturbation without L2 (expm1 overflowed), and
    add-remove inputs on a replace-one ledger (e^eps overflowed in the conversion)."""
    from agt.errors import AGTError
    from mechanisms import MECHANISMS

    epsilons = (5e-324, 1e-310, 1e-300, 1e-20, 1.0, 1e6)
    deltas = (5e-324, 1e-310, 1e-20, 1e-5, 0.999999)
    released = 0
    settings = [(2, 0.1, None), (3, 0.1, None), (3, 1e25, None), (2, 1e-299, None),
                (3, 0.1, "add-remove")]
    for name, entry in MECHANISMS.items():
        for n_classes, sensitivity, relation in settings:
            try:
                inputs = _extreme_inputs(entry, n_classes, sensitivity, relation)
            except AGTError:
                continue
            for eps in epsilons:
                for delta in deltas if entry.needs_delta else (None,):
                    options = {}
                    if name in ("svt", "ens-svt"):
                        options["cutoff"] = 10**9 if eps < 1e-250 else 6
                    try:
                        mech = make_mechanism(name, eps, delta, **options)
                    except AGTError:
                        continue
                    with Ledger.in_memory(1e6, 0.9999999) as ledger:
                        try:
                            out = ledger.release(mech, inputs, insecure_seed=0)
                        except AGTError as exc:
                            assert ledger.spent().epsilon == 0, (name, eps, delta, str(exc))
                            continue
                        assert out.labels.shape == (6,)
                        released += 1
    assert released > 200            # most settings do release


def test_a_failure_after_the_spend_says_the_budget_is_spent_without_private_values(monkeypatch):
    """The last line behind the checks above: a draw that fails after the commit raises a
    PrivacyError that says the budget is spent and names only the error's type (its text may
    hold private values); an interrupt keeps its type and gains a note."""
    mech = make_mechanism("exp-radius", 0.5)
    inputs = Certified(np.array([0, 1]), np.array([3, 17]), 2,
                       Source("b", SHA, ("replace-one",), True))

    def broken(self, inputs, rng):
        raise ValueError("radius 17 of query 1")

    monkeypatch.setattr(type(mech), "_draw", broken)
    with Ledger.in_memory(5.0) as ledger:
        with pytest.raises(PrivacyError, match="budget is spent") as err:
            ledger.release(mech, inputs, insecure_seed=0)
        assert "17" not in str(err.value) and "ValueError" in str(err.value)
        assert ledger.spent().epsilon == pytest.approx(1.0)

        def interrupted(self, inputs, rng):
            raise KeyboardInterrupt

        monkeypatch.setattr(type(mech), "_draw", interrupted)
        with pytest.raises(KeyboardInterrupt) as stop:
            ledger.release(mech, inputs, insecure_seed=0)
        assert any("budget is spent" in note for note in stop.value.__notes__)


def test_a_ledger_in_memory_is_refused_outside_simulations(tmp_path):
    """A ledger that forgets its spends lets a release be repeated without limit."""
    for path in (":memory:", ""):
        with pytest.raises(PrivacyError, match="needs a file"):
            Ledger.open(path, 1.0)
    with Ledger.in_memory(1.0) as ledger:
        assert ledger.budget_epsilon == 1.0


@pytest.mark.parametrize("accountant,fixed", [
    ("standard", {}), ("best", {"per_query_epsilon": 0.3, "per_query_delta": 0.0}),
    ("advanced", {"per_query_epsilon": 0.3, "per_query_delta": 0.0})])
def test_a_refusal_over_the_budget_says_how_many_would_fit(accountant, fixed):
    """The count the refusal names is the largest that `fits` accepts (a new user's review:
    the old advice, lower the per-query epsilon, could not help on a fixed-guarantee
    ledger), and `check_release`'s dry run refuses where `release` does, recording nothing."""
    import re
    for spent in (0, 5):
        with Ledger.in_memory(6.0, 1e-6, accountant, **fixed) as ledger:
            if spent:
                ledger.release(GS(0.3), inputs(spent), insecure_seed=0)
            with pytest.raises(BudgetExceededError) as dry:
                ledger.check_release(GS(0.3), inputs(400))
            with pytest.raises(BudgetExceededError) as real:
                ledger.release(GS(0.3), inputs(400), insecure_seed=0)
            assert str(dry.value) == str(real.value) and len(ledger.entries()) == spent
            m = int(re.search(r"at most (\d+)", str(real.value)).group(1))
            assert ledger.fits(m, 0.3) and not ledger.fits(m + 1, 0.3)
            assert "is spent" in str(real.value)
            ledger.check_release(GS(0.3), inputs(m))          # the count it names fits
