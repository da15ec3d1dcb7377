"""The answering door of the ledger (`Ledger.answer_batch`, what the prediction service
uses): released answers are kept and given again at no charge, clients have their own
budgets under the dataset's, stability-gated sessions continue across requests exactly as one
session would, a refusal charges and draws nothing, and nothing leaves without its record."""

from __future__ import annotations

import collections
import sqlite3

import numpy as np
import pytest

from agt.errors import BudgetExceededError, PrivacyError
from mechanisms import Certified, Ledger, Source, make_mechanism
from mechanisms.ledger import AnswerRequest, hash_query

SOURCE = Source("bundle-1", "a" * 64, ("replace-one",), True)


def certified(n: int, seed: int, radius=None) -> Certified:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    r = rng.integers(-1, 12, size=n) if radius is None else np.full(n, radius)
    return Certified(rng.integers(0, 2, size=n), r, 2, SOURCE,
                     tuple(hash_query(q) for q in x))


def rows(path) -> dict:
    """The charges the ledger holds (counted through `Ledger.entries`: the answering door
    records a request's charges as one run), its answers (`Ledger.recorded_answers`: a
    request's are one block) and the clients' charges."""
    with Ledger.open(path) as ledger:
        out = {"charges": len(ledger.entries()), "answers": len(ledger.recorded_answers())}
    conn = sqlite3.connect(path)
    try:
        out["client_charges"] = conn.execute(
            "SELECT COALESCE(SUM(count), 0) FROM client_totals").fetchone()[0]
        return out
    finally:
        conn.close()


def test_a_query_asked_again_gets_its_label_at_no_charge(tmp_path):
    db = tmp_path / "l.db"
    inputs = certified(20, 1)
    with Ledger.open(db, budget_epsilon=100.0) as ledger:
        mech = make_mechanism("exp-radius", 0.5)
        first = ledger.answer(mech, inputs, client="a")
        assert first.charges == 20 and not first.cached.any()
        again = ledger.answer(mech, inputs, client="b")
        assert again.charges == 0 and again.cached.all()
        assert np.array_equal(first.labels, again.labels)
        assert ledger.spent().epsilon == pytest.approx(10.0)
        # a repeat within one request is one query (charged once, one label)
        twice = certified(3, 2)
        doubled = twice.subset(np.array([0, 1, 0, 2, 1]))
        out = ledger.answer(mech, doubled, client="a")
        assert out.charges == 3
        assert out.labels[0] == out.labels[2] and out.labels[1] == out.labels[4]
    assert rows(db) == {"charges": 23, "answers": 23, "client_charges": 23}


def test_client_budgets_under_the_dataset_cap(tmp_path):
    mech = make_mechanism("exp-radius", 1.0)
    with Ledger.open(tmp_path / "l.db", budget_epsilon=12.0) as ledger:
        ledger.answer(mech, certified(5, 1), client="a", client_budget=(6.0, 0.0))
        with pytest.raises(BudgetExceededError, match="client a"):
            ledger.answer(mech, certified(2, 2), client="a", client_budget=(6.0, 0.0))
        ledger.answer(mech, certified(1, 3), client="a", client_budget=(6.0, 0.0))
        # the dataset caps every client together, whatever their own budgets
        ledger.answer(mech, certified(6, 4), client="b", client_budget=(10.0, 0.0))
        with pytest.raises(BudgetExceededError, match="over the budget"):
            ledger.answer(mech, certified(1, 5), client="c", client_budget=(10.0, 0.0))
        assert ledger.spent().epsilon == pytest.approx(12.0)
        assert ledger.client_spent("a").epsilon == pytest.approx(6.0)
        assert ledger.client_spent("b").epsilon == pytest.approx(6.0)
        assert ledger.client_spent("c") is None


def test_a_batch_answers_in_order_and_a_refused_request_records_nothing(tmp_path):
    mech = make_mechanism("exp-radius", 1.0)
    db = tmp_path / "l.db"
    with Ledger.open(db, budget_epsilon=10.0) as ledger:
        out = ledger.answer_batch([AnswerRequest(mech, certified(6, 1), "a"),
                                   AnswerRequest(mech, certified(6, 2), "b"),
                                   AnswerRequest(mech, certified(4, 3), "c")])
        assert out[0].charges == 6
        assert isinstance(out[1], BudgetExceededError)      # 6 more would pass 10
        assert out[2].charges == 4
        assert ledger.spent().epsilon == pytest.approx(10.0)
    assert rows(db)["charges"] == 10 == rows(db)["answers"]


def test_a_failed_draw_rolls_the_whole_transaction_back(tmp_path):
    """Labels are drawn before the commit: a failure there leaves no record (and no label
    has left)."""
    mech = make_mechanism("exp-radius", 1.0)
    db = tmp_path / "l.db"

    class Broken:
        def integers(self, *a, **k):
            raise RuntimeError("entropy ran out")

    with Ledger.open(db, budget_epsilon=100.0) as ledger:
        ledger.answer(mech, certified(3, 1), client="a")
        out = ledger.answer_batch([AnswerRequest(mech, certified(4, 2), "a")],
                                  insecure_rng=Broken())
        assert isinstance(out[0], PrivacyError) and "nothing was recorded" in str(out[0])
        assert ledger.spent().epsilon == pytest.approx(3.0)
    assert rows(db) == {"charges": 3, "answers": 3, "client_charges": 3}


def test_answering_needs_query_hashes_and_a_per_query_or_gated_mechanism(tmp_path):
    inputs = certified(3, 1)
    with Ledger.open(tmp_path / "l.db", budget_epsilon=10.0, budget_delta=1e-3) as ledger:
        no_ids = Certified(inputs.prediction, inputs.radius, 2, SOURCE)
        with pytest.raises(PrivacyError, match="hash"):
            ledger.answer(make_mechanism("exp-radius", 1.0), no_ids)
        with pytest.raises(PrivacyError, match="one release as one session"):
            ledger.answer(make_mechanism("df-exp-zcdp", 1.0, 1e-6),
                          _votes(inputs))
        assert ledger.spent().epsilon == 0


def _votes(inputs):
    from mechanisms import Votes
    votes = np.stack([inputs.prediction] * 3, axis=1)
    return Votes(votes, None, 2, SOURCE, inputs.query_ids)


@pytest.mark.parametrize("cuts", [(7, 8, 25), (1, 2, 3, 30), ()])
def test_a_gated_session_across_requests_is_one_session(tmp_path, cuts):
    """The same draws in the same order: answering in several requests gives the labels of
    one release until the first session closes; then the next request opens (and charges)
    a new session instead of refusing."""
    svt = make_mechanism("svt", 1.0, 1e-5, cutoff=3)
    inputs = certified(40, 5)
    one = svt.release(inputs, np.random.default_rng(11))
    with Ledger.open(tmp_path / "l.db", budget_epsilon=1000.0, budget_delta=0.5) as ledger:
        rng = np.random.default_rng(11)
        labels, bounds, opened = [], (0, *cuts, 40), 0
        for start, stop in zip(bounds[:-1], bounds[1:]):
            out = ledger.answer(svt, inputs.subset(slice(start, stop)), client="a",
                                insecure_rng=rng)
            labels.append(out.labels)
            opened += out.sessions_opened
            assert out.charges == out.sessions_opened
        labels = np.concatenate(labels)
        closed_at = _first_close(svt, inputs)
        assert 0 < closed_at < 40
        assert np.array_equal(labels[:closed_at], one[:closed_at])
        assert (one[closed_at:] == -1).all() and (labels[closed_at:] >= 0).all()
        assert opened >= 2 and ledger.spent().epsilon == pytest.approx(opened * 1.0)


def _first_close(svt, inputs) -> int:
    """How many queries the first session answers (the same generator as the release)."""
    rng = np.random.default_rng(11)
    state = svt.open_session(rng)
    _, state, answered = svt.continue_session(inputs, state, rng)
    return answered


def test_a_session_state_survives_reopening_the_ledger(tmp_path):
    svt = make_mechanism("svt", 1.0, 1e-5, cutoff=50)
    inputs = certified(30, 6, radius=40)
    db = tmp_path / "l.db"
    with Ledger.open(db, budget_epsilon=10.0, budget_delta=1e-3) as ledger:
        first = ledger.answer(svt, inputs.subset(slice(0, 10)), client="a")
        assert first.sessions_opened == 1
    with Ledger.open(db) as ledger:
        later = ledger.answer(svt, inputs.subset(slice(10, 30)), client="a")
        assert later.sessions_opened == 0 and later.charges == 0
        assert ledger.spent().epsilon == pytest.approx(1.0)
        # another client has a session of its own
        other = ledger.answer(svt, certified(5, 7, radius=40), client="b")
        assert other.sessions_opened == 1


def test_released_answers_are_never_replaced(tmp_path):
    db = tmp_path / "l.db"
    with Ledger.open(db, budget_epsilon=10.0) as ledger:
        ledger.answer(make_mechanism("exp-radius", 1.0), certified(2, 1), client="a")
    conn = sqlite3.connect(db)
    for statement in ("UPDATE answer_blocks SET labels = release_ids",
                      "DELETE FROM answer_blocks"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute(statement)
    # the table of the format before blocks takes no new answer
    with pytest.raises(sqlite3.DatabaseError, match="upgrade agt"):
        conn.execute("INSERT INTO answers (key, label, release_id) VALUES (X'00', 1, 1)")
    conn.close()


def test_running_totals_match_the_charges(tmp_path):
    """The budget check reads running totals; they start from the charges recorded before
    the answering door first ran, and follow every later charge of either door."""
    db = tmp_path / "l.db"
    mech = make_mechanism("exp-radius", 0.25)
    with Ledger.open(db, budget_epsilon=100.0) as ledger:
        ledger.release(mech, certified(7, 1))                 # before the tables exist
        ledger.answer(make_mechanism("exp-radius", 0.5), certified(5, 2), client="a")
        ledger.release(mech, certified(3, 3))                 # after
        assert ledger.spent().epsilon == pytest.approx(7 * 0.25 + 5 * 0.5 + 3 * 0.25)
        scan = collections.Counter((e.epsilon, e.delta) for e in ledger.entries())
    conn = sqlite3.connect(db)
    totals = dict(((e, d), c) for e, d, c in conn.execute("SELECT * FROM spend_totals"))
    conn.close()
    assert totals == scan == {(0.25, 0.0): 10, (0.5, 0.0): 5}


def test_hash_queries_is_hash_query_of_every_row():
    from mechanisms.ledger import hash_queries

    rng = np.random.default_rng(0)
    for x in (rng.normal(size=(30, 6)), rng.normal(size=(5, 1, 4, 4)).astype(np.float32),
              np.arange(12).reshape(4, 3), rng.normal(size=(8, 6))[:, ::2]):
        assert hash_queries(x) == [hash_query(q) for q in x]
    assert len(set(hash_queries(rng.normal(size=(100, 3))))) == 100
    # the bytes ledgers hold: SHA-256 of "<dtype>|<shape>|" and the row's C-order bytes
    assert hash_queries(np.arange(6, dtype=np.float64).reshape(2, 3)) == [
        "8ba00ca203f7a1899fd5771e3dbe4210b2140fbefb2c41789300798a7d519e06",
        "9c62b84fa1e76f799656cc91418b2876082d24816e109bbd511b53fb46774f07"]
    assert hash_queries(np.arange(4, dtype=np.int32).reshape(2, 1, 2))[1] == \
        "1fe7da5badd68bb31bb914da599908629e5e3732c38696f3bbe4459beed06fca"
    assert hash_queries(np.zeros((0, 3))) == []


def test_hash_queries_of_empty_rows_and_of_another_byte_order():
    """Rows of no bytes hash as the empty query (as `hash_query` does), and a row of a 1-D
    array of another byte order as that dtype: not as the native dtype of the same bytes,
    which is another query (the hash `hash_queries` gave such rows up to 0.4.0)."""
    import hashlib

    from mechanisms.ledger import hash_queries

    x = np.zeros((3, 0))
    assert hash_queries(x) == [hash_query(q) for q in x]
    assert hash_queries(np.zeros((2, 0, 3))) == [hash_query(np.zeros((0, 3)))] * 2
    big = np.array([1.0, 2.0], dtype=">f8")
    same_bytes = np.frombuffer(big.tobytes(), dtype="<f8")       # other numbers
    assert hash_queries(big) != hash_queries(same_bytes)
    assert hash_queries(big)[0] == hashlib.sha256(b">f8|()|" + big[:1].tobytes()).hexdigest()


def test_a_session_that_cannot_be_paid_refuses_the_whole_request(tmp_path):
    """Cutoff 1 and boundary radii: every query closes its session, and the third session
    of one request exceeds the budget: the request is refused whole (no partial labels that
    a retry would answer otherwise), nothing recorded."""
    svt = make_mechanism("svt", 4.0, 1e-5, cutoff=1)
    db = tmp_path / "l.db"
    with Ledger.open(db, budget_epsilon=9.0, budget_delta=0.01) as ledger:
        with pytest.raises(BudgetExceededError):
            ledger.answer(svt, certified(5, 3, radius=0), client="a")
        assert ledger.spent().epsilon == 0
        out = ledger.answer(svt, certified(2, 4, radius=0), client="a")
        assert out.sessions_opened == 2 and (out.labels >= 0).all()
    assert rows(db)["charges"] == 2 and rows(db)["answers"] == 2


def test_a_seeded_label_is_never_served_to_a_secure_request(tmp_path):
    """A review's find: the cache did not record whether a label was drawn with seeded test
    noise (removable by whoever knows the seed), and served it later to a secure request as
    a free, cached answer. Seeded and secure answers are now kept apart."""
    inputs = certified(5, 11)
    mech = make_mechanism("exp-radius", 0.5)
    with Ledger.open(tmp_path / "l.db", budget_epsilon=100.0) as ledger:
        seeded = ledger.answer(mech, inputs, insecure_rng=np.random.default_rng(7))
        assert seeded.seeded and seeded.charges == 5
        secure = ledger.answer(mech, inputs, client="prod")
        assert not secure.seeded and not secure.cached.any() and secure.charges == 5
        again = ledger.answer(mech, inputs, client="prod")           # secure from secure
        assert again.cached.all() and np.array_equal(again.labels, secure.labels)
        reseeded = ledger.answer(mech, inputs, insecure_rng=np.random.default_rng(8))
        assert reseeded.cached.all() and np.array_equal(reseeded.labels, seeded.labels)


def test_an_idempotency_key_replays_only_its_own_request(tmp_path):
    """The same key with other queries (here: the first request's query and one more) is
    refused, and the answers' key fields cannot run into each other: a separator inside a
    source id, a query hash or a mechanism name is refused."""
    from mechanisms.ledger import IdempotencyError

    inputs = certified(2, 12)
    mech = make_mechanism("exp-radius", 0.5)
    with Ledger.open(tmp_path / "l.db", budget_epsilon=100.0) as ledger:
        first = ledger.answer_batch([AnswerRequest(mech, inputs.subset(np.array([0])), "c",
                                                   idempotency_key="k")])[0]
        again = ledger.answer_batch([AnswerRequest(mech, inputs.subset(np.array([0])), "c",
                                                   idempotency_key="k")])[0]
        assert np.array_equal(first.labels, again.labels) and again.charges == first.charges
        other = ledger.answer_batch([AnswerRequest(mech, inputs, "c", idempotency_key="k")])[0]
        assert isinstance(other, IdempotencyError)
        assert len(ledger.entries()) == 1
        piped = Certified(inputs.prediction, inputs.radius, 2,
                          Source("s|gs", "a" * 64, ("replace-one",), True), inputs.query_ids)
        with pytest.raises(PrivacyError, match="may not contain"):
            ledger.answer(mech, piped)
        assert len(ledger.entries()) == 1


def test_the_index_finds_exactly_the_digests_it_holds_when_prefixes_collide():
    """The answers index searches by each digest's first 8 bytes: digests that share those
    (forced here, in numbers a real ledger would almost never see) are still told apart by
    all 16 bytes, across segments and namespaces."""
    from mechanisms.ledger.index import DIGEST, AnswerIndex

    rng = np.random.default_rng(7)
    prefixes = [rng.bytes(8) for _ in range(6)]
    pool = [p + rng.bytes(8) for p in prefixes for _ in range(12)]      # 12 per prefix
    pool += [rng.bytes(16) for _ in range(40)]
    pool += [prefixes[0][:7] + bytes([prefixes[0][7] ^ 1]) + bytes(8), bytes(16),
             b"\xff" * 16, prefixes[1] + bytes(8)]            # neighbours, ends, zero tail
    held: dict[bytes, int] = {}
    index = AnswerIndex()
    space = ("s", "m", "p", False)
    for batch in range(5):
        chosen = [pool[i] for i in rng.choice(len(pool), size=15, replace=False)
                  if pool[i] not in held]
        labels = rng.integers(0, 9, size=len(chosen))
        held.update(zip(chosen, labels.tolist()))
        index.add(space, np.array(chosen, dtype=DIGEST), labels)
    asked = np.array(pool + [p + rng.bytes(8) for p in prefixes], dtype=DIGEST)
    found, labels = index.lookup(space, asked)
    for digest, f, label in zip(asked.tolist(), found, labels):
        digest = digest.ljust(16, b"\0")
        assert bool(f) == (digest in held)
        if f:
            assert int(label) == held[digest]
    assert found.sum() == len(held) > 40
    assert not index.lookup(("s", "m", "q", False), asked)[0].any()


def test_a_batch_looks_its_namespaces_up_once_and_sees_its_own_earlier_requests(tmp_path):
    """The committed answers of a batch's requests are looked up per namespace at once:
    each request still gets what is committed in its own namespace, the answers of the
    batch's earlier requests in it, and nothing of another namespace (other parameters)."""
    queries = certified(6, 11)
    half, other = make_mechanism("exp-radius", 0.5), make_mechanism("exp-radius", 0.25)
    with Ledger.open(tmp_path / "l.db", budget_epsilon=100.0) as ledger:
        before = ledger.answer(half, queries.subset(slice(0, 2)))           # q0, q1
        r1, r2, r3, r4 = ledger.answer_batch([
            AnswerRequest(half, queries.subset(np.array([0, 2]))),          # q0 committed
            AnswerRequest(other, queries.subset(np.array([0, 2]))),         # another space
            AnswerRequest(half, queries.subset(np.array([2, 3, 1]))),       # q2 of r1
            AnswerRequest(other, queries.subset(np.array([2, 4])))])        # q2 of r2
        assert r1.cached.tolist() == [True, False] and r1.charges == 1
        assert r1.labels[0] == before.labels[0]
        assert r2.cached.tolist() == [False, False] and r2.charges == 2
        assert r3.charges == 1 and r3.labels[0] == r1.labels[1]
        assert r3.labels[2] == before.labels[1]
        assert r4.charges == 1 and r4.labels[0] == r2.labels[1]
        assert ledger.spent().epsilon == 0.5 * 4 + 0.25 * 3


def test_each_check_of_a_batch_sees_the_earlier_requests_and_totals_match_the_charges(
        tmp_path):
    """Within one batch every budget check composes the charges of the requests before it
    (client a's third request does not fit her budget after her first two; client c's
    charges count at her next check though no check read them before), a request undone at
    its savepoint leaves nothing in the running totals, and the totals written equal the
    scan of every charge."""
    db = tmp_path / "l.db"
    mech = make_mechanism("exp-radius", 0.5)  # 0.5 a query
    with Ledger.open(db, budget_epsilon=100.0) as ledger:
        out = ledger.answer_batch([
            AnswerRequest(mech, certified(2, 21), "a", (1.5, 0.0)),
            AnswerRequest(mech, certified(3, 22), "b"),
            AnswerRequest(mech, certified(2, 23), "a", (1.5, 0.0)),     # a: 1.0 + 1.0 > 1.5
            AnswerRequest(mech, certified(1, 24), "a", (1.5, 0.0)),
            # c's first charges are not read (no budget): her next check still counts them
            AnswerRequest(mech, certified(2, 25), "c"),
            AnswerRequest(mech, certified(2, 26), "c", (1.5, 0.0))])
        assert [getattr(o, "charges", None) for o in out] == [2, 3, None, 1, 2, None]
        assert isinstance(out[2], BudgetExceededError) and "client a" in str(out[2])
        assert isinstance(out[5], BudgetExceededError) and "client c" in str(out[5])
        assert ledger.client_spent("a").epsilon == 1.5 and ledger.client_spent("b").epsilon == 1.5
        scan = collections.Counter((e.epsilon, e.delta) for e in ledger.entries())
    conn = sqlite3.connect(db)
    totals = {(e, d): c for e, d, c in conn.execute("SELECT * FROM spend_totals")}
    clients = sorted(conn.execute("SELECT * FROM client_totals"))
    conn.close()
    assert totals == scan == {(0.5, 0.0): 8}
    assert clients == [("a", 0.5, 0.0, 3), ("b", 0.5, 0.0, 3), ("c", 0.5, 0.0, 2)]
