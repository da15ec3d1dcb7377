"""The Ledger contract on both backends (an SQLite file and a real PostgreSQL database):
the same budget checks, refusals, answers cache, client budgets, sessions, rdp accounting
and idempotent retries; on PostgreSQL also: a versioned schema, append-only tables,
processes that never over-spend together, and a connection terminated mid-transaction
that loses nothing and charges a retry once."""

from __future__ import annotations

import time

import numpy as np
import pytest

from agt.errors import BudgetExceededError, PrivacyError
from mechanisms import Certified, Ledger, Source, make_mechanism
from mechanisms.ledger import (
    FORMAT_VERSION,
    POSTGRES_FORMAT_VERSION,
    AnswerRequest,
    IdempotencyError,
)
from tests.mechanisms.test_answers import SOURCE, certified
from tests.mechanisms.test_ledger import SPENDER, python, wait_for
from tests.postgres import pg_databases, postgres_url  # noqa: F401  (fixtures)


@pytest.fixture(params=["sqlite", "postgres"])
def name(request, tmp_path) -> str:
    """Where a new ledger goes: an SQLite file or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "l.db")
    return request.getfixturevalue("postgres_url")


def test_budget_is_refused_exactly_and_a_refusal_records_nothing(name):
    gs = make_mechanism("gs", 0.25)
    with Ledger.open(name, 1.0, 0.0) as ledger:
        assert ledger.backend in ("SQLite", "PostgreSQL")
        ledger.release(gs, certified(3, 1))
        with pytest.raises(BudgetExceededError, match="at most 1 of these"):
            ledger.release(gs, certified(2, 2))
        assert ledger.spent().epsilon == 0.75 and len(ledger.entries()) == 3
        ledger.release(gs, certified(1, 3))
        assert ledger.spent().epsilon == 1.0          # exactly the budget, no tolerance
        assert [e.id for e in ledger.entries()] == [1, 2, 3, 4]
    with Ledger.open(name) as again:                   # reopened: the stored settings
        assert again.budget_epsilon == 1.0 and again.spent().epsilon == 1.0
        with pytest.raises(PrivacyError, match="other settings"):
            Ledger.open(name, 2.0)
        with pytest.raises(PrivacyError, match="another dataset"):
            again.release(gs, Certified(np.array([1]), None, 2,
                                        Source("b", "c" * 64, ("replace-one",), True)))


def test_answers_cache_client_budgets_and_totals(name):
    mech = make_mechanism("exp-radius", 0.5)
    inputs = certified(20, 1)
    with Ledger.open(name, budget_epsilon=12.0) as ledger:
        first = ledger.answer(mech, inputs, client="a", client_budget=(10.0, 0.0))
        assert first.charges == 20 and not first.cached.any()
        again = ledger.answer(mech, inputs, client="b")
        assert again.charges == 0 and again.cached.all()
        assert np.array_equal(first.labels, again.labels)
        with pytest.raises(BudgetExceededError, match="client a"):
            ledger.answer(mech, certified(1, 2), client="a", client_budget=(10.0, 0.0))
        out = ledger.answer_batch([AnswerRequest(mech, certified(5, 3), "b"),
                                   AnswerRequest(mech, certified(1, 4), "c")])
        assert isinstance(out[0], BudgetExceededError) and out[1].charges == 1
        assert ledger.client_spent("a").epsilon == 10.0
        assert ledger.client_spent("c").epsilon == 0.5 and ledger.client_spent("z") is None
        assert ledger.spent().epsilon == 10.5 and len(ledger.entries()) == 21


def test_gated_sessions_continue_across_requests_and_reopening(name):
    svt = make_mechanism("svt", 1.0, 1e-5, cutoff=50)
    inputs = certified(30, 6, radius=40)
    with Ledger.open(name, budget_epsilon=10.0, budget_delta=1e-3) as ledger:
        assert ledger.answer(svt, inputs.subset(slice(0, 10)), client="a").sessions_opened == 1
    with Ledger.open(name) as ledger:
        later = ledger.answer(svt, inputs.subset(slice(10, 30)), client="a")
        assert later.sessions_opened == 0 and later.charges == 0
        assert ledger.answer(svt, certified(5, 7, radius=40), client="b").sessions_opened == 1
        assert ledger.spent().epsilon == pytest.approx(2.0)


def test_rdp_ledger_composes_curves(name):
    with Ledger.open(name, 8.0, 1e-5, "rdp") as ledger:
        ledger.release(make_mechanism("gs", 0.5), certified(4, 1))
        curve = ledger.spent_curve()
        assert len(curve) > 0 and 0 < ledger.spent().epsilon <= 8.0
        with pytest.raises(BudgetExceededError):
            ledger.release(make_mechanism("gs", 0.5), certified(40, 2))


def test_idempotent_retries_are_charged_once(name):
    mech = make_mechanism("exp-radius", 0.5)
    with Ledger.open(name, budget_epsilon=100.0) as ledger:
        req = AnswerRequest(mech, certified(5, 1), "a", idempotency_key="k-1")
        first = ledger.answer_batch([req])[0]
        again = ledger.answer_batch([req])[0]
        assert first.charges == 5 and again.charges == 5      # the same answer, recorded once
        assert np.array_equal(first.labels, again.labels)
        assert np.array_equal(first.cached, again.cached)
        assert ledger.spent().epsilon == 2.5
        other = ledger.answer_batch([AnswerRequest(mech, certified(5, 2), "a",
                                                   idempotency_key="k-1")])[0]
        assert isinstance(other, IdempotencyError) and "another request" in str(other)
        # the key is the client's own: another client's equal key is another request
        assert ledger.answer_batch([AnswerRequest(mech, certified(5, 2), "b",
                                                  idempotency_key="k-1")])[0].charges == 5
        assert ledger.spent().epsilon == 5.0


# -- PostgreSQL only ------------------------------------------------------------------------

def _execute(url: str, sql: str, *params):
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, params or None).fetchall() if sql.lstrip().upper().startswith(
            "SELECT") else conn.execute(sql, params or None)


def test_postgres_schema_is_versioned_append_only_and_exclusive(pg_databases):  # noqa: F811
    url = pg_databases.new()
    with Ledger.open(url, 1.0) as ledger:
        ledger.release(make_mechanism("gs", 0.25), certified(1, 1))
    import psycopg
    with pytest.raises(psycopg.Error, match="append-only"):
        _execute(url, "UPDATE releases SET epsilon = 0.01")
    with pytest.raises(psycopg.Error, match="append-only"):
        _execute(url, "DELETE FROM releases")
    _execute(url, "UPDATE ledger_meta SET format_version = 99")
    with pytest.raises(PrivacyError, match="format 99"):
        Ledger.open(url)
    foreign = pg_databases.new()
    _execute(foreign, "CREATE TABLE customers (id INTEGER)")
    with pytest.raises(PrivacyError, match="another application"):
        Ledger.open(foreign, 1.0)
    assert _execute(foreign, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                    ) == [("customers",)]
    with pytest.raises(PrivacyError, match="cannot connect"):
        Ledger.open(url.rsplit("/", 1)[0] + "/agt_no_such_database", 1.0)


@pytest.mark.slow
def test_postgres_processes_never_overspend_together(postgres_url, tmp_path):  # noqa: F811
    Ledger.open(postgres_url, 1.0, 0.0).close()
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(4)]
    procs = [python(SPENDER, postgres_url, str(go), str(r)) for r in ready]
    for r in ready:
        wait_for(r, timeout=60)
    go.touch()
    counts = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        counts.append(int(out))
    assert sum(counts) == 64                      # 64 * 1/64 is exactly the budget
    assert sum(c > 0 for c in counts) >= 2
    with Ledger.open(postgres_url) as ledger:
        assert ledger.spent().epsilon == 1.0 and len(ledger.entries()) == 64


def test_a_terminated_connection_loses_nothing_and_a_retry_is_charged_once(postgres_url):  # noqa: F811
    """The backend is terminated while the answering transaction holds the budget lock
    (after the labels were drawn, before the commit): the request fails whole, nothing is
    recorded, and the retry with the same idempotency key (on a new connection) is charged
    once."""
    mech = make_mechanism("exp-radius", 0.5)
    req = AnswerRequest(mech, certified(6, 1), "a", idempotency_key="retry-1")
    with Ledger.open(postgres_url, budget_epsilon=100.0) as ledger:
        pid = ledger._conn.info.backend_pid

        class Killer(np.random.Generator):
            """A generator that terminates its ledger's connection while drawing."""

            def integers(self, *args, **kwargs):
                _execute(postgres_url, "SELECT pg_terminate_backend(%s)", pid)
                return super().integers(*args, **kwargs)

        with pytest.raises(PrivacyError, match="nothing was released"):
            ledger.answer_batch([req], insecure_rng=Killer(np.random.PCG64(0)))
        assert ledger.spent().epsilon == 0 and ledger.entries() == []   # reconnected
        first = ledger.answer_batch([req])[0]
        assert first.charges == 6
        with Ledger.open(postgres_url) as replica:        # another process's connection
            again = replica.answer_batch([req])[0]
            assert np.array_equal(again.labels, first.labels)
            assert replica.spent().epsilon == 3.0 and len(replica.entries()) == 6


def test_a_connection_lost_while_idle_is_opened_again(postgres_url):  # noqa: F811
    gs = make_mechanism("gs", 0.25)
    with Ledger.open(postgres_url, 1.0) as ledger:
        ledger.release(gs, certified(1, 1))
        _execute(postgres_url, "SELECT pg_terminate_backend(%s)",
                 ledger._conn.info.backend_pid)
        time.sleep(0.2)
        ledger.release(gs, certified(1, 2))         # a new connection, nothing lost
        assert ledger.spent().epsilon == 0.5 and len(ledger.entries()) == 2


# -- a request's charges as one run ---------------------------------------------------------

def _raw(name: str, sql: str):
    """Run one statement on the ledger's database outside the Ledger (a test's tampering)."""
    if name.startswith("postgresql://"):
        return _execute(name, sql)
    import sqlite3
    conn = sqlite3.connect(name, isolation_level=None)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_a_request_is_one_run_of_charges_sharing_the_ids_of_releases(name):
    """The answering door records a request's charges as one append-only row; every charge
    still has its own id (one sequence with `release`'s rows), its query hash and its answer,
    and the totals count each charge."""
    gs, mech = make_mechanism("gs", 0.25), make_mechanism("exp-radius", 0.5)
    five, one = certified(5, 2), certified(1, 4)
    with Ledger.open(name, 100.0) as ledger:
        ledger.release(gs, certified(3, 1))                        # ids 1..3
        ledger.answer(mech, five, client="a")                      # one run: 4..8
        ledger.release(gs, certified(2, 3))                        # 9, 10
        ledger.answer(mech, one, client="a")                       # 11
        entries = ledger.entries()
        assert [e.id for e in entries] == list(range(1, 12))
        assert [e.query_hash for e in entries[3:8]] == list(five.query_ids)
        assert entries[10].query_hash == one.query_ids[0]
        assert {(e.epsilon, e.mechanism) for e in entries[3:8]} == {(0.5, "exp-radius")}
        assert ledger.spent().epsilon == pytest.approx(5 * 0.25 + 6 * 0.5)
        assert ledger.client_spent("a").epsilon == pytest.approx(3.0)
        answers = ledger.recorded_answers()
    by_id = {e.id: e.query_hash for e in entries}
    assert sorted(by_id[r] for r, _ in answers) == sorted([*five.query_ids, *one.query_ids])
    assert _raw(name, "SELECT COUNT(*) FROM charge_runs") == [(2,)]
    assert _raw(name, "SELECT COUNT(*) FROM answer_blocks") == [(2,)]   # one per request
    for tamper in ("UPDATE charge_runs SET count = 1", "DELETE FROM charge_runs",
                   "UPDATE answer_blocks SET labels = release_ids", "DELETE FROM answer_blocks"):
        with pytest.raises(Exception, match="append-only"):
            _raw(name, tamper)


def test_a_ledger_of_the_format_before_runs_is_migrated(name):
    """A ledger of the format before runs (no ``charge_runs``, no ``answer_blocks``) opens,
    keeps its charges, and records new requests as runs after its last id."""
    gs, mech = make_mechanism("gs", 0.25), make_mechanism("exp-radius", 0.5)
    with Ledger.open(name, 100.0) as ledger:
        ledger.release(gs, certified(3, 1))
        with ledger._writing() as db:
            db.ensure_answer_tables()
        backend = ledger.backend
    from mechanisms.ledger.schema import MIGRATES_FROM
    _raw(name, "DROP TABLE charge_runs")
    _raw(name, "DROP TABLE answer_blocks")
    _raw(name, "DROP TRIGGER answers_moved" + (" ON answers" if backend != "SQLite" else ""))
    _raw(name, f"UPDATE ledger_meta SET format_version = {MIGRATES_FROM[backend][0]}")
    with Ledger.open(name) as ledger:
        out = ledger.answer(mech, certified(4, 2), client="a")
        assert out.charges == 4
        assert [e.id for e in ledger.entries()] == list(range(1, 8))
        assert ledger.spent().epsilon == pytest.approx(3 * 0.25 + 4 * 0.5)
        assert ledger.answer(mech, certified(4, 2), client="a").cached.all()
    assert _raw(name, "SELECT format_version FROM ledger_meta") == [
        (FORMAT_VERSION if backend == "SQLite" else POSTGRES_FORMAT_VERSION,)]


def _bytes_sql(name: str, data: bytes) -> str:
    return f"decode('{data.hex()}', 'hex')" if name.startswith("postgresql://") else \
        f"X'{data.hex()}'"


def test_an_old_format_ledger_is_migrated_and_serves_its_old_answers(name):
    """A ledger of the format before answer blocks (SQLite 3, PostgreSQL 2: one ``answers``
    row per answer, keyed by SHA-256(source | mechanism | hash)), built here with raw SQL,
    opens at the new format, serves its old answers at no charge, records new ones as
    blocks, and refuses an old agt's insert into its old table from then on."""
    from mechanisms.ledger.answers import _answer_key

    mech = make_mechanism("exp-radius", 0.5)
    old, new = certified(6, 1), certified(3, 2)
    with Ledger.open(name, 100.0) as ledger:
        first = ledger.answer(mech, old, client="a")
        backend = ledger.backend
        hashes = {e.id: e.query_hash for e in ledger.entries()}
        rows = [(_answer_key(SOURCE.source_id, mech.name, hashes[r]), label, r)
                for r, label in ledger.recorded_answers()]
    # the old format: its answers in `answers`, no blocks, no fence on `answers`
    _raw(name, "DROP TABLE answer_blocks")
    _raw(name, "DROP TRIGGER answers_moved" + (" ON answers" if backend != "SQLite" else ""))
    for key, label, r in rows:
        _raw(name, f"INSERT INTO answers (key, label, release_id) VALUES "
                   f"({_bytes_sql(name, key)}, {label}, {r})")
    _raw(name, f"UPDATE ledger_meta SET format_version = {3 if backend == 'SQLite' else 2}")
    with Ledger.open(name) as ledger:
        again = ledger.answer(mech, old, client="b")
        assert again.cached.all() and again.charges == 0
        assert np.array_equal(again.labels, first.labels)
        mixed = ledger.answer(mech, Certified(
            np.r_[old.prediction[:2], new.prediction], np.r_[old.radius[:2], new.radius], 2,
            SOURCE, old.query_ids[:2] + new.query_ids), client="b")
        assert mixed.cached.tolist() == [True, True, False, False, False]
        assert mixed.charges == 3 and ledger.spent().epsilon == pytest.approx(9 * 0.5)
        assert len(ledger.recorded_answers()) == 9
    assert _raw(name, "SELECT format_version FROM ledger_meta") == [
        (FORMAT_VERSION if backend == "SQLite" else POSTGRES_FORMAT_VERSION,)]
    with pytest.raises(Exception, match="upgrade agt"):
        _raw(name, f"INSERT INTO answers (key, label, release_id) VALUES "
                   f"({_bytes_sql(name, bytes(16))}, 1, 1)")


def _to_json_runs(name: str, backend: str, damage: bool = False) -> None:
    """Turn a ledger's ``charge_runs`` back into the format before (SQLite 4, PostgreSQL 3):
    the table as it was declared then, each run's hashes a JSON array of hex strings."""
    import json

    rows = _raw(name, "SELECT id, count, time, source_id, mechanism, epsilon, delta, seeded, "
                      "note, query_hashes FROM charge_runs ORDER BY id")
    _raw(name, "DROP TABLE charge_runs")
    real = "REAL" if backend == "SQLite" else "DOUBLE PRECISION"
    _raw(name, f"CREATE TABLE charge_runs (id BIGINT PRIMARY KEY, count INTEGER NOT NULL, "
               f"time TEXT NOT NULL, source_id TEXT NOT NULL, mechanism TEXT NOT NULL, "
               f"epsilon {real} NOT NULL, delta {real} NOT NULL, seeded INTEGER NOT NULL, "
               f"note TEXT NOT NULL, query_hashes TEXT NOT NULL)")
    for i, (*head, raw) in enumerate(rows):
        text = bytes(raw).hex()
        hashes = [text[k:k + 64] for k in range(0, len(text), 64)]
        if damage and i == len(rows) - 1:
            hashes = hashes[:-1]
        values = ", ".join(repr(v) if isinstance(v, str) else str(v) for v in head)
        _raw(name, f"INSERT INTO charge_runs VALUES ({values}, '{json.dumps(hashes)}')")
    if backend == "SQLite":
        _raw(name, "CREATE TRIGGER charge_runs_no_update BEFORE UPDATE ON charge_runs BEGIN "
                   "SELECT RAISE(ABORT, 'the privacy ledger is append-only'); END")
    else:
        _raw(name, "CREATE TRIGGER charge_runs_append_only BEFORE UPDATE OR DELETE ON "
                   "charge_runs FOR EACH ROW EXECUTE FUNCTION agt_append_only()")
    _raw(name, f"UPDATE ledger_meta SET format_version = "
               f"{FORMAT_VERSION - 1 if backend == 'SQLite' else POSTGRES_FORMAT_VERSION - 1}")


def test_runs_of_json_hashes_are_converted_to_bytes_on_open(name):
    """A ledger of the format before (SQLite 4, PostgreSQL 3: a run's hashes a JSON array)
    opens at the new format with every run's hashes as bytes: the same charges, ids and
    hashes, still append-only, new runs after the old ones; its cached answers still served."""
    mech = make_mechanism("exp-radius", 0.5)
    asked = certified(5, 1)
    with Ledger.open(name, 100.0) as ledger:
        first = ledger.answer(mech, asked, client="a")
        ledger.answer(mech, certified(3, 2), client="b")
        before = ledger.entries()
        backend = ledger.backend
    _to_json_runs(name, backend)
    assert {type(r[0]) for r in _raw(name, "SELECT query_hashes FROM charge_runs")} == {str}
    with Ledger.open(name) as ledger:
        assert ledger.entries() == before
        again = ledger.answer(mech, asked, client="c")
        assert again.cached.all() and np.array_equal(again.labels, first.labels)
        assert ledger.answer(mech, certified(2, 3), client="c").charges == 2
        entries = ledger.entries()
        assert entries[:8] == before and [e.id for e in entries] == list(range(1, 11))
        assert ledger.spent().epsilon == pytest.approx(10 * 0.5)
    raw = _raw(name, "SELECT count, query_hashes FROM charge_runs ORDER BY id")
    assert [len(bytes(h)) for _, h in raw] == [32 * c for c, _ in raw] == [160, 96, 64]
    assert _raw(name, "SELECT format_version FROM ledger_meta") == [
        (FORMAT_VERSION if backend == "SQLite" else POSTGRES_FORMAT_VERSION,)]
    for tamper in ("UPDATE charge_runs SET count = 1", "DELETE FROM charge_runs"):
        with pytest.raises(Exception, match="append-only"):
            _raw(name, tamper)
    # an older agt still running on the migrated ledger cannot add a run of JSON hashes
    with pytest.raises(Exception, match="upgrade agt|charge_runs_hashes_length"):
        _raw(name, "INSERT INTO charge_runs VALUES (11, 1, 't', 's', 'm', 0.5, 0.0, 0, 'n', "
                   "'[\"" + "0" * 64 + "\"]')")


def test_a_damaged_run_of_json_hashes_is_refused_and_left_as_it_was(name):
    with Ledger.open(name, 100.0) as ledger:
        ledger.answer(make_mechanism("exp-radius", 0.5), certified(4, 1), client="a")
        backend = ledger.backend
    _to_json_runs(name, backend, damage=True)
    # (SQLite: the conversion's own check; PostgreSQL: the new format's length check)
    with pytest.raises(PrivacyError, match="damaged|charge_runs_hashes_length"):
        Ledger.open(name)
    assert {type(r[0]) for r in _raw(name, "SELECT query_hashes FROM charge_runs")} == {str}
    assert _raw(name, "SELECT format_version FROM ledger_meta") == [
        (FORMAT_VERSION - 1 if backend == "SQLite" else POSTGRES_FORMAT_VERSION - 1,)]


def test_a_ledger_of_a_newer_agt_is_refused_as_such(name):
    with Ledger.open(name, 1.0) as ledger:
        ledger.answer(make_mechanism("exp-radius", 0.5), certified(1, 1))
    _raw(name, "UPDATE ledger_meta SET format_version = 99")
    with pytest.raises(PrivacyError, match="newer agt.*upgrade agt"):
        Ledger.open(name)


def test_two_ledger_objects_share_one_cache(name):
    """Two `Ledger` objects on one database (two processes, two replicas) writing in turn:
    each sees the other's answers before it decides, so no query gets a second label."""
    mech = make_mechanism("exp-radius", 0.5)
    q1, q2, q3 = certified(8, 1), certified(8, 2), certified(8, 3)
    with Ledger.open(name, 100.0) as a, Ledger.open(name) as b:
        one = a.answer(mech, q1, client="x")
        seen_by_b = b.answer(mech, q1, client="y")
        assert seen_by_b.cached.all() and np.array_equal(seen_by_b.labels, one.labels)
        two = b.answer(mech, q2, client="y")
        out = a.answer_batch([AnswerRequest(mech, q2, "x"), AnswerRequest(mech, q3, "x"),
                              AnswerRequest(mech, q3, "z")])
        assert out[0].cached.all() and np.array_equal(out[0].labels, two.labels)
        assert out[1].charges == 8 and out[2].cached.all()         # earlier in the batch
        assert np.array_equal(out[1].labels, out[2].labels)
        assert b.answer(mech, q3, client="y").cached.all()
        assert a.spent().epsilon == pytest.approx(24 * 0.5) == b.spent().epsilon
        assert len(a.entries()) == 24 == len(b.recorded_answers())


def test_a_cached_label_is_served_only_under_its_own_parameters(name):
    """An answer released at one epsilon is not reported under another: a request at
    another epsilon is a new, charged release."""
    inputs = certified(5, 1)
    with Ledger.open(name, 100.0) as ledger:
        ledger.answer(make_mechanism("exp-radius", 0.5), inputs)
        other = ledger.answer(make_mechanism("exp-radius", 1.0), inputs)
        assert other.charges == 5 and not other.cached.any()
        assert other.charged_epsilon == 1.0
        assert ledger.answer(make_mechanism("exp-radius", 0.5), inputs).cached.all()
        assert ledger.answer(make_mechanism("exp-radius", 1.0), inputs).cached.all()
        assert ledger.spent().epsilon == pytest.approx(5 * 0.5 + 5 * 1.0)
        # the same values in other Python types are the same parameters: served, not
        # charged again (a second label for one query at one epsilon)
        for same in (1, np.float64(1.0), np.float32(1.0)):
            assert ledger.answer(make_mechanism("exp-radius", same), inputs).cached.all()
        assert ledger.spent().epsilon == pytest.approx(5 * 0.5 + 5 * 1.0)


def _raw_restore(copy, path) -> None:
    """Write `copy` over the ledger `path` with SQLite's own backup API (what `sqlite3 path
    ".restore copy"` does), without `restore_ledger`'s check that nothing holds it open."""
    import contextlib
    import sqlite3

    with contextlib.closing(sqlite3.connect(copy)) as src, \
            contextlib.closing(sqlite3.connect(path)) as dst:
        src.backup(dst)


def test_a_ledger_restored_under_an_open_object_is_refused(tmp_path):
    """Blocks are never removed, so a ledger whose blocks went back (a backup restored
    while a process held it open) would leave that process's index holding answers the
    ledger no longer records: `restore_ledger` refuses while it is open, and a restore made
    otherwise (SQLite's own backup API) is caught at the next answering transaction, which
    refuses and releases nothing."""
    from mechanisms.ledger import backup_ledger, restore_ledger

    path = tmp_path / "l.db"
    mech = make_mechanism("exp-radius", 0.5)
    with Ledger.open(str(path), 100.0) as ledger:
        ledger.answer(mech, certified(3, 1))
        backup_ledger(path, tmp_path / "backup.db")
        ledger.answer(mech, certified(3, 2))
        ledger.answer(mech, certified(3, 3))
        with pytest.raises(PrivacyError, match="open in another process"):
            restore_ledger(tmp_path / "backup.db", path)
        assert len(ledger.entries()) == 9                  # nothing was changed
        _raw_restore(tmp_path / "backup.db", path)        # `sqlite3 l.db ".restore ..."`
        with pytest.raises(PrivacyError, match="restored from a backup"):
            ledger.answer(mech, certified(3, 4))
    with Ledger.open(str(path)) as reopened:           # a fresh object reads what is there
        assert reopened.answer(mech, certified(3, 2)).charges == 3


def test_a_raw_restore_is_caught_after_other_processes_wrote_as_many_blocks_again(tmp_path):
    """The block count alone would miss a restore after which another process wrote as many
    blocks as this one had read (the ids reach `seen` again, other answers under them): the
    catch-up also checks that the last block this object read or wrote is still there,
    unchanged, and refuses before anything is released."""
    from mechanisms.ledger import backup_ledger

    path = tmp_path / "l.db"
    mech = make_mechanism("exp-radius", 0.5)
    with Ledger.open(str(path), 100.0) as a:
        a.answer(mech, certified(3, 1))
        backup_ledger(path, tmp_path / "backup.db")
        a.answer(mech, certified(3, 2))
        a.answer(mech, certified(3, 3))                    # a has seen 3 blocks
        _raw_restore(tmp_path / "backup.db", path)        # restored: 1 block
        with Ledger.open(str(path)) as b:                  # another process's writes
            b.answer(mech, certified(3, 4))
            b.answer(mech, certified(3, 2))                # 3 blocks again, other answers
        with Ledger.open(str(path)) as c:
            charges = len(c.entries())
        with pytest.raises(PrivacyError, match="restored from a backup"):
            a.answer(mech, certified(3, 4))
        with pytest.raises(PrivacyError, match="restored from a backup"):
            a.answer(mech, certified(3, 2))                # never served from a's memory
    with Ledger.open(str(path)) as reopened:
        assert len(reopened.entries()) == charges          # nothing was charged by a
        assert reopened.answer(mech, certified(3, 4)).charges == 0


class _Interrupted(BaseException):
    """What a signal would raise in the middle of a draw."""


class _Failing(np.random.Generator):
    """A generator whose draws raise `error` (a failed draw, an interrupt) once `allowed`
    of them were made (counted in `made`)."""

    error: BaseException = RuntimeError("no entropy")
    allowed = 0
    made = 0

    def __getattribute__(self, attr):
        if attr.startswith("_") or attr in ("error", "allowed", "made"):
            return super().__getattribute__(attr)
        if self.made >= self.allowed:
            raise self.error
        self.made += 1
        return super().__getattribute__(attr)


def test_a_rolled_back_transaction_leaves_nothing_in_the_index(name):
    mech = make_mechanism("exp-radius", 0.5)
    with Ledger.open(name, 100.0) as ledger:
        ledger.answer(mech, certified(2, 1))
        # a request of a batch refused at its draw: its savepoint undone, the batch goes on
        out = ledger.answer_batch([AnswerRequest(mech, certified(3, 2), "a"),
                                   AnswerRequest(mech, certified(1, 4), "a")],
                                  insecure_rng=_Failing(np.random.PCG64(1)))
        assert isinstance(out[0], PrivacyError) and isinstance(out[1], PrivacyError)
        # the whole transaction rolled back: an interrupt in the second request's draw,
        # after the first request's block was written (its draws counted on a ledger in
        # memory: the same seeded draws)
        counting = _Failing(np.random.PCG64(1))
        counting.allowed = 10**9
        Ledger.in_memory(100.0).answer(mech, certified(5, 5), insecure_rng=counting)
        interrupting = _Failing(np.random.PCG64(1))
        interrupting.error, interrupting.allowed = _Interrupted(), counting.made
        with pytest.raises(_Interrupted):
            ledger.answer_batch([AnswerRequest(mech, certified(5, 5), "a"),
                                 AnswerRequest(mech, certified(4, 3), "a")],
                                insecure_rng=interrupting)
        assert interrupting.made == counting.made > 0
        assert len(ledger._answer_index) == 2 and not ledger._pending
        for seed, n in ((2, 3), (5, 5), (3, 4)):
            fresh = ledger.answer(mech, certified(n, seed))
            assert fresh.charges == n and not fresh.cached.any()
        assert len(ledger.recorded_answers()) == 14 == len(ledger._answer_index)



class _FailingOnce(np.random.Generator):
    """A generator whose first draw raises (a failed draw), and whose later ones do not."""

    failed = False

    def __getattribute__(self, attr):
        if not attr.startswith("_") and attr != "failed" and not self.failed:
            self.failed = True
            raise RuntimeError("no entropy")
        return super().__getattribute__(attr)


def test_a_request_undone_at_its_savepoint_is_forgotten_by_the_transaction(name):
    """A request refused at its draw, after its charges and totals were written, is undone at
    its savepoint; what the transaction knows (the totals it read and added to, the next
    charge and block ids) goes back with it, so the requests after it in the same batch are
    checked against the budget without its charges and take the ids it would have taken."""
    mech = make_mechanism("exp-radius", 0.5)
    # 2 charged before, then a batch of 3 (undone) + 3 + 4: the budget fits 2 + 3 + 4 only
    with Ledger.open(name, budget_epsilon=4.5) as ledger:
        ledger.answer(mech, certified(2, 1), client="a")
        out = ledger.answer_batch([AnswerRequest(mech, certified(3, 2), "a"),
                                   AnswerRequest(mech, certified(3, 3), "b"),
                                   AnswerRequest(mech, certified(4, 4), "a")],
                                  insecure_rng=_FailingOnce(np.random.PCG64(1)))
        assert isinstance(out[0], PrivacyError) and "drawing the labels failed" in str(out[0])
        assert out[1].charges == 3 and out[2].charges == 4
        assert [e.id for e in ledger.entries()] == list(range(1, 10))
        assert ledger.spent().epsilon == 4.5
        assert ledger.client_spent("a").epsilon == 3.0
        with pytest.raises(BudgetExceededError):
            ledger.answer(mech, certified(1, 5), client="b")
        assert len(ledger.recorded_answers()) == 9
    assert _raw(name, "SELECT epsilon, delta, count FROM spend_totals") == [(0.5, 0.0, 9)]
    assert sorted(_raw(name, "SELECT client, count FROM client_totals")) == [("a", 6),
                                                                             ("b", 3)]
    assert _raw(name, "SELECT id, count FROM charge_runs ORDER BY id") == [(1, 2), (3, 3),
                                                                          (6, 4)]
    assert _raw(name, "SELECT id FROM answer_blocks ORDER BY id") == [(1,), (2,), (3,)]

ANSWERER = """
import sys
import numpy as np
from mechanisms import Certified, Ledger, Source, make_mechanism
from mechanisms.ledger import AnswerRequest, hash_query
ledger = Ledger.open(sys.argv[1])
source = Source("bundle-1", "a" * 64, ("replace-one",), True)
mech = make_mechanism("exp-radius", 0.01)
for seed in range(10_000):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(50, 3))
    hashes = [hash_query(q) for q in x]
    inputs = Certified(rng.integers(0, 2, size=50), rng.integers(-1, 12, size=50), 2, source,
                       tuple(hashes))
    out = ledger.answer_batch([AnswerRequest(mech, inputs, "a")])[0]
    # a label leaves the process only after answer_batch returned (its commit)
    print(" ".join(f"{h}:{v}" for h, v in zip(hashes, out.labels)), flush=True)
"""


def test_kill_dash_nine_mid_write_loses_no_returned_label(name):
    """A process answering requests back to back is killed (SIGKILL) while it writes: every
    label it returned is recorded with its charge, no answer lacks its charge, and nothing
    is charged twice."""
    import signal

    Ledger.open(name, 1e6).close()
    proc = python(ANSWERER, name)
    got: dict[str, int] = {}
    for _ in range(4):                    # a few requests returned, the next one in flight
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        got.update((h, int(v)) for h, v in (p.split(":") for p in line.split()))
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    with Ledger.open(name) as ledger:
        charges = {e.id: e.query_hash for e in ledger.entries()}
        assert len(set(charges.values())) == len(charges)             # charged once each
        assert ledger.spent().epsilon == pytest.approx(0.01 * len(charges))
        recorded = {charges[r]: label for r, label in
                    ledger.recorded_answers()}                        # KeyError: no charge
    assert len(recorded) == len(charges) >= len(got) == 200
    assert all(recorded[h] == v for h, v in got.items())


def test_fits_of_the_known_totals_reads_nothing_and_never_over_counts(name):
    """`fits(known=True)` composes the totals this object's last commit knew: after its own
    charges they are the recorded ones, with no read of the database; charges of another
    object make them an under-count (a True the write transaction corrects, never a False
    the recorded charges would not give); a rolled-back charge is not in them."""
    mech = make_mechanism("exp-radius", 0.5)
    with Ledger.open(name, budget_epsilon=3.0) as ledger, Ledger.open(name) as other:
        assert ledger.fits(6, 0.5, known=True)             # nothing known yet: read
        ledger.answer(mech, certified(4, 1), client="a")
        ledger._db.execute = None                          # reading now would fail
        assert ledger.fits(2, 0.5, known=True) and not ledger.fits(3, 0.5, known=True)
        del ledger._db.execute
        other.answer(mech, certified(1, 2), client="b")    # 2.5 of 3.0 spent now
        assert ledger.fits(2, 0.5, known=True) and not ledger.fits(2, 0.5)
        out = ledger.answer_batch([AnswerRequest(mech, certified(2, 3), "a")])[0]
        assert isinstance(out, BudgetExceededError)        # the ledger's own check decides
        assert ledger.spent().epsilon == 2.5 and not ledger.fits(2, 0.5)
