"""`agt serve` as a user meets it: a real server in a subprocess on 127.0.0.1 and a free
port, a real HTTP client (`agt.client`, httpx), a real ledger file.

Keys and roles (401, 403), every kind of bad input (a one-line 4xx, nothing charged),
the budget refusal (429 with what remains), cached answers at no charge across clients and
restarts, a stability-gated session across requests, 16 clients at once that never
overspend and never get a label without its record, and kill -9 under load: after a restart
the ledger is consistent and every retry is answered from the cache."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from agt.client import Client, ServiceError  # noqa: E402
from agt.service.keys import KeyStore  # noqa: E402
from mechanisms.ledger import Ledger, hash_query  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]

CONFIG = """model: [{linear: {in: 6, out: 2}}]
loss: cross_entropy
data: {name: blobs, variant: separable, n_samples: 600, seed: 0}
learning_rate: 2.0
clip_gamma: 0.06
k_values: "0..49"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_ready(proc: subprocess.Popen, url: str) -> None:
    """Poll /healthz of the `agt serve` process `proc` until it is ready (the model answered
    its warm-up query), at most 120 s; raise with its stderr if it exits first."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"agt serve exited: {proc.stderr.read()[-2000:]}")
        try:
            with Client(url) as c:
                if c.health():
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise RuntimeError("agt serve did not answer in 120 s")


def stop_process(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    """Send `sig` to a server process still running and wait for it to end."""
    if proc.poll() is None:
        proc.send_signal(sig)
        proc.wait(timeout=60)


class Server:
    """An `agt serve` subprocess; ``url`` once /healthz answers."""

    def __init__(self, workdir: Path, *extra: str, budget: str = "1000",
                 mechanism: tuple[str, ...] = ("--mechanism", "exp-radius", "--epsilon", "1")):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-c", "import sys; from agt.cli.main import main; "
               "sys.exit(main(sys.argv[1:]))", "serve", "--bounds", str(workdir / "b.h5"),
               *mechanism, "--ledger", str(workdir / "l.db"), "--budget-epsilon", budget,
               "--keys", str(workdir / "keys.json"), "--port", str(self.port), *extra]
        self.proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        wait_until_ready(self.proc, self.url)

    def stop(self, sig=signal.SIGTERM) -> None:
        stop_process(self.proc, sig)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained Blobs bundle, an owner key and three client keys (one with a budget)."""
    from agt.cli.main import main

    d = tmp_path_factory.mktemp("serve")
    (d / "c.yaml").write_text(CONFIG)
    assert main(["train", "--config", str(d / "c.yaml"), "--out", str(d / "b.h5"),
                 "--quiet"]) == 0
    store = KeyStore.load(d / "keys.json", create=True)
    keys = {"owner": store.add("owner")[0], "alice": store.add("client")[0],
            "bob": store.add("client")[0],
            "carol": store.add("client", budget_epsilon=5.0)[0]}
    revoked, record = store.add("client")
    store.revoke(record.id)
    keys["revoked"] = revoked
    store.save()
    from agt.data import load_dataset
    queries = load_dataset("blobs", {"variant": "separable", "n_samples": 3000,
                                     "seed": 5}).x_train
    return d, keys, queries


@pytest.fixture(scope="module")
def server(world):
    d, _, _ = world
    srv = Server(d, "--max-queries", "2000", "--max-body-bytes", "400000")
    yield srv
    srv.stop()


def recorded_charges(path) -> dict[int, str]:
    """Charge id -> query hash of every charge the ledger holds (through `Ledger.entries`:
    the answering door records a request's charges as one run)."""
    from mechanisms import Ledger
    with Ledger.open(path) as ledger:
        return {e.id: e.query_hash for e in ledger.entries()}


def ledger_rows(path) -> dict:
    from mechanisms import Ledger
    with Ledger.open(path) as ledger:
        return {"charges": len(recorded_charges(path)),
                "answers": len(ledger.recorded_answers())}


def answers_of(path) -> dict[str, int]:
    """Query hash -> label of every recorded answer, joined with its recorded charge."""
    from mechanisms import Ledger
    charges = recorded_charges(path)
    with Ledger.open(path) as ledger:
        # (an answer without its charge fails here: KeyError)
        return {charges[r]: label for r, label in ledger.recorded_answers()}


def test_keys_and_roles(world, server):
    _, keys, q = world
    with Client(server.url) as anonymous:
        assert anonymous.info()["mechanism"] == "exp-radius"       # public
        for call in (lambda: anonymous.predict(q[:1]), anonymous.budget):
            with pytest.raises(ServiceError) as err:
                call()
            assert err.value.status == 401
    for bad in ("agt_not-a-key", keys["revoked"], keys["alice"][:-1]):
        with Client(server.url, bad) as c, pytest.raises(ServiceError) as err:
            c.predict(q[:1])
        assert err.value.status == 401
    with Client(server.url, keys["alice"]) as alice:
        for call in (lambda: alice.radii(q[:1]), alice.ledger):
            with pytest.raises(ServiceError) as err:
                call()
            assert err.value.status == 403
    with Client(server.url, keys["owner"]) as owner:
        r = owner.radii(q[:3])
        assert len(r["radius"]) == 3 and len(owner.ledger(5)) <= 5


def test_a_client_gets_labels_and_the_guarantee_only(world, server):
    _, keys, q = world
    with Client(server.url, keys["alice"]) as alice:
        out = alice.predict(q[:10])
    assert len(out.labels) == 10 and all(v in (0, 1) for v in out.labels)
    assert out.guarantee == {"epsilon": 1.0, "delta": 0.0, "relation": "replace-one",
                             "per": "query"}
    raw = json.dumps(out.__dict__)
    for owner_only in ("radius", "radii", "votes", "margin", "logit", "dataset", "sha256"):
        assert owner_only not in raw


def bad_requests(q):
    """(body bytes, expected status) for every kind of bad input."""
    ok = q[:1].tolist()
    return [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (json.dumps({"queries": ok, "extra": 1}).encode(), 400),
        (json.dumps({"queries": []}).encode(), 400),
        (json.dumps({"queries": "abc"}).encode(), 400),
        (json.dumps({"queries": [[1.0, 2.0, 3.0]]}).encode(), 422),
        (json.dumps({"queries": ok[0]}).encode(), 422),
        (json.dumps({"queries": [[1, 2, 3, 4, 5, "x"]]}).encode(), 422),
        (b'{"queries": [[1, 2, 3, 4, 5, NaN]]}', 422),
        (b'{"queries": [[1, 2, 3, 4, 5, Infinity]]}', 422),
        (json.dumps({"queries": [[1.0] * 6] * 2001}).encode(), 413),
        (b'{"queries": [' + b"[1,1,1,1,1,1]," * 40000 + b"[1,1,1,1,1,1]]}", 413),
        (b'{"queries": [[1, 2, 3, 4, 5, ' + b"9" * 400 + b"]]}", 422),     # over float range
        (b'{"queries": [[1, 2, 3, 4, 5, ' + b"9" * 5000 + b"]]}", 422),    # the same
        (json.dumps({"queries": [[1, 2, 3, 4, 5, "6"]]}).encode(), 422),
        (json.dumps({"queries": [[1, 2, 3, 4, 5, True]]}).encode(), 422),
        # JSON in UTF-16 or UTF-32 (the standard reader takes them): its true and false are
        # not the bytes b"true" and b"false", and are still not numbers
        *((json.dumps({"queries": [[1, 2, 3, 4, 5, value]]}).encode(encoding), 422)
          for value in (True, False) for encoding in ("utf-16", "utf-16-be", "utf-32-le")),
    ]


def test_bad_input_is_a_one_line_4xx_and_charges_nothing(world, server):
    d, keys, q = world
    import httpx

    before = ledger_rows(d / "l.db")
    for body, status in bad_requests(q):
        r = httpx.post(server.url + "/v1/predict", content=body, timeout=60,
                       headers={"authorization": f"Bearer {keys['alice']}",
                                "content-type": "application/json"})
        assert r.status_code == status, (body[:80], r.text)
        detail = r.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail and len(detail) < 300
    assert ledger_rows(d / "l.db") == before


def test_cached_answers_are_free_across_clients(world, server):
    _, keys, q = world
    batch = q[100:140]
    with Client(server.url, keys["alice"]) as alice, Client(server.url, keys["bob"]) as bob:
        first = alice.predict(batch)
        spent = alice.budget()["spent"]["epsilon"]
        again = alice.predict(batch)
        other = bob.predict(batch)
        assert again.labels == first.labels == other.labels
        assert all(again.cached) and all(other.cached)
        assert again.charged["count"] == 0 == other.charged["count"]
        assert alice.budget()["spent"]["epsilon"] == spent
        assert bob.budget()["spent"]["epsilon"] == 0


def test_over_the_budget_is_refused_with_what_remains(world, server):
    d, keys, q = world
    with Client(server.url, keys["carol"]) as carol:
        carol.predict(q[200:203])                       # 3 of her 5
        before = ledger_rows(d / "l.db")
        with pytest.raises(ServiceError) as err:
            carol.predict(q[203:206])                   # 3 more: over
        assert err.value.status == 429
        assert err.value.body["remaining"]["client"] == {"epsilon": 2.0, "delta": 0.0}
        assert "labels" not in err.value.body
        assert ledger_rows(d / "l.db") == before
        assert carol.budget()["spent"]["epsilon"] == pytest.approx(3.0)
        carol.predict(q[203:205])                       # exactly what remains


def test_a_gated_session_continues_across_requests(tmp_path, world):
    """svt with cutoff 1 at eps 4 per session (gate threshold 30, noise scales 1 and 2):
    queries of radius 49 are stable (they ride free), a boundary query is unstable and closes
    its session, and the next request opens (and is charged) a new one."""
    d, keys, q = world
    for name in ("b.h5", "keys.json"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    srv = Server(tmp_path, "--cutoff", "1", "--delta", "1e-5", "--budget-delta", "0.01",
                 budget="100", mechanism=("--mechanism", "svt", "--epsilon", "4"))
    try:
        with Client(srv.url, keys["owner"]) as owner:
            radius = np.array(owner.radii(q[:1000])["radius"])
        assert radius.max() == 49 and radius.min() <= 0
        stable = q[:1000][radius == 49]
        far, boundary = stable[:1], q[:1000][radius <= 0][:1]
        with Client(srv.url, keys["alice"]) as alice:
            first = alice.predict(far)
            assert first.session == {"opened": 1, "closed": False}
            second = alice.predict(stable[1:2])
            assert second.session == {"opened": 0, "closed": False}
            assert second.charged["count"] == 0
            third = alice.predict(boundary)
            assert third.session["closed"] and third.session["opened"] == 0
            fourth = alice.predict(stable[2:3])
            assert fourth.session["opened"] == 1 and fourth.charged["count"] == 1
            assert alice.budget()["spent"]["epsilon"] == pytest.approx(8.0)
    finally:
        srv.stop()


def test_a_restart_keeps_the_budget_and_the_answers(tmp_path, world):
    d, keys, q = world
    for name in ("b.h5", "keys.json"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    srv = Server(tmp_path)
    with Client(srv.url, keys["alice"]) as alice:
        first = alice.predict(q[:25])
        spent = alice.budget()["spent"]
    srv.stop()
    srv = Server(tmp_path)
    try:
        with Client(srv.url, keys["alice"]) as alice:
            again = alice.predict(q[:25])
            assert again.labels == first.labels and all(again.cached)
            assert alice.budget()["spent"] == spent
    finally:
        srv.stop()


def test_sixteen_clients_at_once_never_overspend(tmp_path, world):
    """16 clients x 50 requests of 1-4 queries each against a budget that runs out part way:
    the recorded spend stays within it, every label a client got is the ledger's answer for
    that query, and every refused request got no label."""
    d, _, q = world
    (tmp_path / "b.h5").write_bytes((d / "b.h5").read_bytes())
    store = KeyStore.load(tmp_path / "keys.json", create=True)
    client_keys = [store.add("client")[0] for _ in range(16)]
    store.save()
    srv = Server(tmp_path, budget="600")
    got: list[tuple[str, int]] = []
    refused, errors = [], []
    lock = threading.Lock()

    def run(i: int):
        rng = np.random.default_rng(i)
        with Client(srv.url, client_keys[i]) as c:
            for _ in range(50):
                idx = rng.choice(len(q), size=int(rng.integers(1, 5)), replace=False)
                try:
                    out = c.predict(q[idx])
                except ServiceError as exc:
                    with lock:
                        (refused if exc.status == 429 else errors).append(exc)
                    assert "labels" not in exc.body
                    continue
                with lock:
                    got.extend((hash_query(q[j]), v) for j, v in zip(idx, out.labels))

    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        srv.stop()
    assert not errors, errors[:3]
    assert refused, "the budget should have run out part way"
    rows = ledger_rows(tmp_path / "l.db")
    assert rows["charges"] <= 600 and rows["charges"] == rows["answers"]
    released = answers_of(tmp_path / "l.db")
    assert all(released[h] == v for h, v in got)
    assert len({h for h, _ in got}) == rows["answers"]


def test_kill_dash_nine_under_load_loses_nothing(tmp_path, world):
    """kill -9 while clients are being answered; after a restart the ledger's charges and
    answers agree one to one, every label a client got before the kill is the recorded one,
    and retrying every query charges only those that never got a record."""
    d, keys, q = world
    for name in ("b.h5", "keys.json"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    srv = Server(tmp_path, budget="5000")
    got: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def run(i: int):
        # a generous timeout: on a loaded 2-core CI box the first answers can take seconds,
        # and a client that gives up early would leave nothing answered before the kill
        with Client(srv.url, keys["alice"], timeout=120) as c:
            j = i * 400
            while not stop.is_set() and j < (i + 1) * 400:
                batch = q[j:j + 5]
                j += 5
                try:
                    out = c.predict(batch)
                except Exception:
                    return
                with lock:
                    got.update((hash_query(x), v) for x, v in zip(batch, out.labels))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    # kill only once clients are being answered (the state under test), however slow the box
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        with lock:
            if len(got) >= 20:
                break
        time.sleep(0.05)
    time.sleep(0.3)
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait(timeout=30)
    stop.set()
    for t in threads:
        t.join()
    assert got, "no request was answered before the kill"
    recorded = answers_of(tmp_path / "l.db")
    rows = ledger_rows(tmp_path / "l.db")
    assert rows["charges"] == rows["answers"] == len(recorded)
    assert all(recorded[h] == v for h, v in got.items())
    srv = Server(tmp_path, budget="5000")
    try:
        with Client(srv.url, keys["alice"]) as alice:
            asked = q[:1600]
            before = alice.budget()["spent"]["epsilon"]
            out = alice.predict(asked)
            fresh = sum(1 for x in asked if hash_query(x) not in recorded)
            assert out.charged["count"] == fresh
            assert alice.budget()["spent"]["epsilon"] == pytest.approx(before + fresh)
            for x, v, c in zip(asked, out.labels, out.cached):
                h = hash_query(x)
                if h in got:
                    assert c and v == got[h]
    finally:
        srv.stop()


def test_the_openapi_schema_lists_the_endpoints(world, server):
    import httpx

    schema = httpx.get(server.url + "/openapi.json", timeout=30).json()
    for path in ("/v1/predict", "/v1/budget", "/v1/info", "/healthz", "/v1/owner/radii",
                 "/v1/owner/ledger"):
        assert path in schema["paths"]
    assert "queries" in json.dumps(schema["paths"]["/v1/predict"])


def test_keys_commands(tmp_path, capsys):
    from agt.cli.main import main

    path = tmp_path / "keys.json"
    assert main(["keys", "add", "--keys", str(path), "--role", "client",
                 "--budget-epsilon", "2", "--name", "dave"]) == 0
    out = capsys.readouterr().out
    key = out.strip().splitlines()[-1].split()[-1]
    assert key.startswith("agt_") and key not in path.read_text()
    store = KeyStore.load(path)
    who = store.authenticate(key)
    assert who.role == "client" and who.budget == (2.0, 0.0)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert main(["keys", "list", "--keys", str(path)]) == 0
    listing = capsys.readouterr().out
    assert who.id in listing and key not in listing
    assert main(["keys", "revoke", "--keys", str(path), who.id]) == 0
    assert KeyStore.load(path).authenticate(key) is None
    assert main(["keys", "revoke", "--keys", str(path), "nope"]) == 2
    assert main(["keys", "add", "--keys", str(path), "--role", "owner",
                 "--budget-epsilon", "1"]) == 2


def test_minus_zero_is_the_query_zero(world, server):
    """-0.0 and 0.0 are one input: one charge, one label."""
    _, keys, _ = world
    with Client(server.url, keys["bob"]) as bob:
        first = bob.predict(np.array([[0.0, 0.5, 0.0, 0.25, 0.0, 0.125]]))
        again = bob.predict(np.array([[-0.0, 0.5, -0.0, 0.25, -0.0, 0.125]]))
    assert again.cached == [True] and again.labels == first.labels


def test_a_removed_keys_file_admits_no_one(tmp_path, world):
    d, keys, q = world
    for name in ("b.h5", "keys.json"):
        (tmp_path / name).write_bytes((d / name).read_bytes())
    srv = Server(tmp_path)
    try:
        with Client(srv.url, keys["alice"]) as alice:
            alice.predict(q[:1])
            (tmp_path / "keys.json").unlink()
            with pytest.raises(ServiceError) as err:
                alice.predict(q[:1])
            assert err.value.status == 401
    finally:
        srv.stop()


def test_an_rdp_ledger_is_refused_when_the_service_starts(world, tmp_path):
    """The answering door keeps (eps, delta) running totals; an rdp ledger is refused at
    start with the reason, not request by request."""
    from agt.errors import PrivacyError
    from agt.service.server import PredictionService
    from agt.store import read_bundle
    from mechanisms import Ledger, make_mechanism

    d, _, _ = world
    path = tmp_path / "rdp.db"
    Ledger.open(path, 5.0, 1e-5, "rdp").close()
    with pytest.raises(PrivacyError, match="rdp ledger"):
        PredictionService(read_bundle(d / "b.h5"), make_mechanism("exp-radius", 0.5), path)


# -- hardening (issue 47): no free work for a spent client, ready only when warm, JSON
# refusals, the key before the parameters, the schema true to the behaviour, the owner's page


def _count_certified(service) -> list[int]:
    """Wait until the service is warm, then record the size of every certification it runs
    (a spy on its certifier) in the returned list."""
    deadline = time.monotonic() + 60
    while not service.ready and time.monotonic() < deadline:
        time.sleep(0.05)
    assert service.ready
    certified: list[int] = []
    real = service._certifier.certify

    def spy(x, **kwargs):
        certified.append(len(x))
        return real(x, **kwargs)

    service._certifier.certify = spy
    return certified


def test_a_client_that_cannot_pay_is_refused_before_any_certification(world, tmp_path):
    """A client whose budget cannot pay for one more query, and any client once the
    dataset's budget cannot, are refused from the totals alone: the certifier is not called
    (a spy counts its calls), and the refusal is the budget error."""
    from agt.errors import BudgetExceededError
    from agt.service.keys import Principal
    from agt.service.server import PredictionService
    from agt.store import read_bundle
    from mechanisms import make_mechanism

    d, _, q = world
    service = PredictionService(read_bundle(d / "b.h5"), make_mechanism("exp-radius", 1.0),
                                tmp_path / "l.db", budget_epsilon=3.0)
    try:
        certified = _count_certified(service)
        dora = Principal("dora", "client", 2.0, 0.0)
        service.submit(dora, service.check_queries(q[:2])).result(60)     # all of her 2
        assert certified == [2]
        with pytest.raises(BudgetExceededError, match="client dora: its budget cannot pay"):
            service.submit(dora, service.check_queries(q[10:1010])).result(60)
        assert certified == [2]                    # 1,000 queries: not one certified
        erin = Principal("erin", "client")         # no budget of her own
        service.submit(erin, service.check_queries(q[20:21])).result(60)  # the dataset's last
        with pytest.raises(BudgetExceededError, match="dataset's budget cannot pay"):
            service.submit(erin, service.check_queries(q[30:530])).result(60)
        assert certified == [2, 1]
    finally:
        service.close()


def test_the_dataset_check_of_known_totals_lets_the_ledger_decide_other_writers(
        world, tmp_path):
    """The dataset's pre-check composes the totals the service's ledger committed last (no
    read per batch). Spends of another writer (a replica) are not in them: the next request
    is certified and the ledger refuses it inside its transaction, charging nothing; the
    check after that refusal reads the ledger, and later requests are refused before any
    certification."""
    from agt.errors import BudgetExceededError
    from agt.service.keys import Principal
    from agt.service.server import PredictionService
    from agt.store import read_bundle
    from mechanisms import Certified, Ledger, make_mechanism

    d, _, q = world
    service = PredictionService(read_bundle(d / "b.h5"), make_mechanism("exp-radius", 1.0),
                                tmp_path / "l.db", budget_epsilon=3.0)
    try:
        certified = _count_certified(service)
        gus = Principal("gus", "client")
        service.submit(gus, service.check_queries(q[:1])).result(60)
        source = service._inputs_for(q[:1])[0].source            # (one more certification)
        with Ledger.open(tmp_path / "l.db") as replica:          # spends the other 2.0
            replica.answer(make_mechanism("exp-radius", 1.0),
                           Certified(np.zeros(2, np.int64), np.zeros(2, np.int64), 2, source,
                                     ("a" * 64, "b" * 64)), client="other")
        with pytest.raises(BudgetExceededError, match="over the budget"):
            service.submit(gus, service.check_queries(q[1:2])).result(60)   # the ledger's
        with pytest.raises(BudgetExceededError, match="dataset's budget cannot pay"):
            service.submit(gus, service.check_queries(q[2:3])).result(60)
        assert certified == [1, 1, 1]               # the third request: not certified
        with Ledger.open(tmp_path / "l.db") as ledger:
            assert ledger.spent().epsilon == 3.0
    finally:
        service.close()


def test_a_paid_retry_is_replayed_after_the_budget_is_spent(world, tmp_path):
    """A review's find: the check before certification refused a retry with the same
    Idempotency-Key once its request had spent the client's whole budget, so the labels paid
    for could never be had. The retry is replayed (same labels, nothing charged, nothing
    certified); a new key from the spent client is still refused before certification."""
    from agt.errors import BudgetExceededError
    from agt.service.keys import Principal
    from agt.service.server import PredictionService
    from agt.store import read_bundle
    from mechanisms import make_mechanism

    d, _, q = world
    service = PredictionService(read_bundle(d / "b.h5"), make_mechanism("exp-radius", 1.0),
                                tmp_path / "l.db", budget_epsilon=100.0)
    try:
        certified = _count_certified(service)
        dora = Principal("dora", "client", 2.0, 0.0)
        first = service.submit(dora, service.check_queries(q[:2]),
                               idempotency_key="r-1").result(60)      # all of her budget
        again = service.submit(dora, service.check_queries(q[:2]),
                               idempotency_key="r-1").result(60)
        assert again.labels.tolist() == first.labels.tolist()
        assert certified == [2, 2] and len(service.entries(100).result(60)) == 2
        with pytest.raises(BudgetExceededError, match="client dora: its budget cannot pay"):
            service.submit(dora, service.check_queries(q[:2]),
                           idempotency_key="r-2").result(60)
        assert certified == [2, 2]
    finally:
        service.close()


def test_a_malformed_idempotency_key_is_refused_before_any_work(world, server):
    """A key the ledger would refuse (too long, not printable ASCII) is a 422 from the
    front door, before certification, and charges nothing."""
    import httpx

    _, keys, q = world
    with Client(server.url, keys["owner"]) as owner:
        before = len(owner.ledger(limit=100_000))
    for bad in ("a" * 256, "café".encode("latin-1"), "a\x7fb"):
        r = httpx.post(server.url + "/v1/predict", json={"queries": q[2000:2003].tolist()},
                       timeout=60, headers={"authorization": f"Bearer {keys['alice']}",
                                            "idempotency-key": bad})
        assert r.status_code == 422, (bad, r.text)
        assert "idempotency key" in r.json()["detail"]
    with Client(server.url, keys["owner"]) as owner:
        assert len(owner.ledger(limit=100_000)) == before


def test_a_request_that_is_not_http_is_refused_in_json(world, server):
    """What the HTTP parser cannot read (a broken request line, a control character in a
    header name) is refused with one line of JSON like every other refusal, not uvicorn's
    plain text, and charges nothing."""
    import socket

    _, keys, _ = world
    with Client(server.url, keys["owner"]) as owner:
        before = len(owner.ledger(limit=100_000))
    host, port = server.url.split("//", 1)[1].split(":")
    for raw in (b"POST /v1/predict HTTP/1.1 extra\r\n\r\n",
                b"GET /v1/info HTTP/1.1\r\nHost: x\r\nBad\x01Name: 1\r\n\r\n",
                # a body that cannot be read (a broken chunk): refused, not waited on
                b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'5\r\n{"que\r\nZZZ\r\n',
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"):    # a TLS hello
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.sendall(raw)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), (raw, answer[:200])
        assert b"content-type: application/json" in head.lower(), head
        assert json.loads(body)["detail"].startswith("malformed HTTP request"), body
    with Client(server.url, keys["owner"]) as owner:
        assert len(owner.ledger(limit=100_000)) == before


def _raw_exchange(url: str, raw: bytes, timeout: float = 30) -> bytes:
    """Send raw bytes on one connection; everything the server answers until it closes
    (a reset after its answer, because it closed with bytes of ours unread, ends it too)."""
    import socket

    host, port = url.split("//", 1)[1].split(":")
    answer = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        try:
            conn.sendall(raw)
            while chunk := conn.recv(65536):
                answer += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
    return answer


def test_an_unbounded_request_head_is_refused_early(world, server):
    """A request line or header that never ends is refused once it passes h11's limit on
    a request head (what httptools' parser does not bound), not buffered without end."""
    _, keys, _ = world
    for head in (b"GET /v1/info HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (256 << 10),
                 b"GET /v1/info?" + b"a" * (256 << 10)):
        answer = _raw_exchange(server.url, head, timeout=10)    # the head never ends
        status, _, body = answer.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 400"), answer[:200]
        assert json.loads(body)["detail"].startswith("malformed HTTP request"), body


def test_a_pipelined_request_is_answered_before_a_broken_one_after_it(world, server):
    """Requests pipelined on one connection are answered in order; an unreadable one after
    a valid one is refused after the valid one's answer, which is not lost (it is charged)."""
    d, keys, q = world
    body = json.dumps({"queries": q[2100:2101].tolist()}).encode()
    valid = (b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
             + keys["alice"].encode() + b"\r\nContent-Type: application/json\r\n"
             + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    answer = _raw_exchange(server.url, valid + b"NOT HTTP\x01\r\n\r\n")
    statuses = [part[:3] for part in answer.split(b"HTTP/1.1 ")[1:]]
    assert statuses == [b"200", b"400"], answer[:400]
    assert answer.rstrip().endswith(b"}") and b"malformed HTTP request" in answer
    # a body over the head limit (JSON whitespace) read with the start of the next head:
    # its bytes are not counted as head bytes
    import socket
    padded = body[:-1] + b" " * (64 << 10) + b"}"
    big = valid.replace(b"Content-Length: " + str(len(body)).encode(),
                        b"Content-Length: " + str(len(padded)).encode()).replace(body, padded)
    host, port = server.url.split("//", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(big + valid[:10])
        time.sleep(0.3)
        conn.sendall(valid[10:])
        answer = b""
        while answer.count(b"HTTP/1.1 ") < 2 or not answer.rstrip().endswith(b"}"):
            answer += conn.recv(65536)
    assert [part[:3] for part in answer.split(b"HTTP/1.1 ")[1:]] == [b"200", b"200"], answer


def test_under_the_tight_accountant_a_spent_dataset_is_refused_after_one_refusal(
        world, tmp_path):
    """The tight accountant's composition is costly, so the dataset's pre-check asks it at
    start and after the ledger refused a request on the dataset's budget: from then on
    requests are refused without certification."""
    from agt.errors import BudgetExceededError
    from agt.service.keys import Principal
    from agt.service.server import PredictionService
    from agt.store import read_bundle
    from mechanisms import Ledger, make_mechanism

    d, _, q = world
    Ledger.open(tmp_path / "t.db", 2.5, 1e-5, "tight", per_query_epsilon=1.0,
                per_query_delta=0.0).close()
    service = PredictionService(read_bundle(d / "b.h5"), make_mechanism("exp-radius", 1.0),
                                tmp_path / "t.db")
    try:
        certified = []
        real = service._certifier.certify
        service._certifier.certify = lambda x, **kw: (certified.append(len(x)),
                                                      real(x, **kw))[1]
        who = Principal("fay", "client")
        outcomes = []
        for i in range(5):
            try:
                service.submit(who, service.check_queries(q[i:i + 1])).result(60)
                outcomes.append("answered")
            except BudgetExceededError as exc:
                outcomes.append("before" if "one more query" in str(exc) else "ledger")
        assert outcomes == ["answered", "answered", "ledger", "before", "before"]
        assert certified[-3:] == [1, 1, 1] and len(certified) <= 4    # (+ the warm-up)
    finally:
        service.close()


def test_a_spent_client_learns_only_its_budget_state(world, server):
    """carol has spent her whole budget (test_over_the_budget_...): requests with different
    queries (stable and on the decision boundary) get the same 429, byte for byte."""
    _, keys, q = world
    import httpx

    with Client(server.url, keys["owner"]) as owner:
        radius = np.array(owner.radii(q[:400])["radius"])
    bodies = set()
    for batch in (q[:400][radius == radius.max()][:3], q[:400][radius <= 0][:3], q[600:1600]):
        r = httpx.post(server.url + "/v1/predict", json={"queries": batch.tolist()}, timeout=60,
                       headers={"authorization": f"Bearer {keys['carol']}"})
        assert r.status_code == 429 and r.headers["content-type"] == "application/json"
        bodies.add(r.content)
    assert len(bodies) == 1
    body = json.loads(bodies.pop())
    assert body["remaining"]["client"] == {"epsilon": 0.0, "delta": 0.0}
    assert "one more query" in body["detail"]


def test_healthz_says_ready_and_refusals_put_the_key_first(world, server):
    import httpx

    _, keys, _ = world
    r = httpx.get(server.url + "/healthz", timeout=30)
    assert r.status_code == 200 and r.json() == {"status": "ok", "ready": True}
    url = server.url + "/v1/owner/ledger?limit=abc"
    for key, status in ((None, 401), (keys["alice"], 403), (keys["owner"], 422)):
        r = httpx.get(url, timeout=30,
                      headers={"authorization": f"Bearer {key}"} if key else {})
        assert r.status_code == status, r.text
        detail = r.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail
    r = httpx.get(server.url + "/v1/owner/ledger?limit=-1", timeout=30,
                  headers={"authorization": f"Bearer {keys['owner']}"})
    assert r.status_code == 422 and isinstance(r.json()["detail"], str)
    r = httpx.post(server.url + "/v1/owner/radii", content=b"{not json", timeout=30)
    assert r.status_code == 401                    # the key before the body


@pytest.fixture(scope="module")
def narrow_server(world, tmp_path_factory):
    """A server that serves one request at a time (for the 503 and the schema fuzzer)."""
    d, _, _ = world
    t = tmp_path_factory.mktemp("narrow")
    for name in ("b.h5", "keys.json"):
        (t / name).write_bytes((d / name).read_bytes())
    srv = Server(t, "--max-connections", "1", "--max-queries", "64", budget="1000000")
    yield srv
    srv.stop()


def test_one_request_too_many_is_a_json_503(world, narrow_server):
    """A request held open (its body not finished) fills the only place; the next request
    is refused at once with a JSON 503; once the first finishes, requests are served."""
    import httpx

    _, keys, q = world
    url = narrow_server.url
    gate, results = threading.Event(), []

    def body():
        yield b'{"queries": '
        gate.wait(60)
        yield json.dumps(q[:1].tolist()).encode() + b"}"

    def held():
        results.append(httpx.post(url + "/v1/predict", content=body(), timeout=60,
                                  headers={"authorization": f"Bearer {keys['alice']}",
                                           "content-type": "application/json"}))

    thread = threading.Thread(target=held)
    thread.start()
    try:
        deadline, refused = time.monotonic() + 30, None
        while refused is None and time.monotonic() < deadline:
            r = httpx.get(url + "/v1/info", timeout=30)
            if r.status_code == 503:
                refused = r
            time.sleep(0.02)
    finally:
        gate.set()
        thread.join(60)
    assert refused is not None, "the held request never filled the only place"
    assert refused.headers["content-type"] == "application/json"
    assert "requests at once" in refused.json()["detail"]
    assert results and results[0].status_code == 200, results
    assert httpx.get(url + "/v1/info", timeout=30).status_code == 200


@pytest.mark.slow
def test_schemathesis_finds_no_mismatch(world, narrow_server, tmp_path):
    """schemathesis (every check) against the served schema with the owner's key on every
    operation and with a client's key on the client's operations: no failure."""
    pytest.importorskip("schemathesis")
    _, keys, _ = world
    runs = ((keys["owner"], [], "11"),
            (keys["alice"], ["--exclude-path-regex", "^/v1/owner/"], "12"))
    for key, extra, seed in runs:
        out = subprocess.run(
            [sys.executable, "-m", "schemathesis.cli", "run",
             narrow_server.url + "/openapi.json", "--checks", "all",
             "-H", f"Authorization: Bearer {key}", "--max-examples", "15", "--seed", seed,
             "--generation-database", "none", "--no-color", *extra],
            capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
        assert "No issues found" in out.stdout


def _chromium(profile: Path):
    """A headless Debian chromium driven by Selenium (never a downloaded browser) with a
    fresh profile folder, or a skip with the reason."""
    import shutil

    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service as DriverService

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip("no chromium and chromedriver here (apt-get install chromium "
                    "chromium-driver; .ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync", "--window-size=1100,1500",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=DriverService(executable_path=driver), options=options)


def _owner_login(browser, url: str, key: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(url + "/owner")
    browser.find_element(By.ID, "key").send_keys(key)
    browser.find_element(By.ID, "open").click()


def test_the_owners_page_in_a_real_browser(world, server, tmp_path):
    """chromium opens /owner, the owner's key goes through the form (not the URL, no
    cookie), and the page shows what the ledger holds: the charges, the dataset's spend,
    each client's spend and charges; the radius histogram counts what this server answered;
    a client's key is refused."""
    from selenium.webdriver.common.by import By

    d, keys, q = world
    with Client(server.url, keys["bob"]) as bob:
        bob.predict(q[2000:2012])
    browser = _chromium(tmp_path / "profile")
    try:
        _owner_login(browser, server.url, keys["owner"])
        assert browser.current_url == server.url + "/owner"      # the key is not in the URL
        assert browser.get_cookies() == []
        with Ledger.open(d / "l.db") as ledger:     # (a request's charges are one run)
            charges = len(ledger.entries())
        conn = sqlite3.connect(d / "l.db")
        try:
            per_client = dict(conn.execute("SELECT client, SUM(epsilon * count) FROM "
                                           "client_totals GROUP BY client"))
            counts = dict(conn.execute("SELECT client, SUM(count) FROM client_totals "
                                       "GROUP BY client"))
        finally:
            conn.close()
        assert browser.find_element(By.ID, "charges").text == str(charges)
        assert float(browser.find_element(By.ID, "spent-epsilon").text) == \
            pytest.approx(sum(per_client.values()), rel=1e-5)
        assert "exp-radius" in browser.find_element(By.ID, "mechanism").text
        bob_id = KeyStore.load(d / "keys.json").authenticate(keys["bob"]).id
        row = browser.find_element(By.CSS_SELECTOR, f'tr[data-client="{bob_id}"]')
        assert float(row.find_element(By.CLASS_NAME, "spent").text) == \
            pytest.approx(per_client[bob_id], rel=1e-5)
        assert int(row.find_element(By.CLASS_NAME, "charges").text) == counts[bob_id]
        assert int(row.find_element(By.CLASS_NAME, "answered").text) >= 12
        bars = browser.find_elements(By.CSS_SELECTOR, "#radius-histogram rect.bar")
        answered = sum(int(r.find_element(By.CLASS_NAME, "answered").text) for r in
                       browser.find_elements(By.CSS_SELECTOR, "#clients tbody tr"))
        assert bars and sum(int(b.get_attribute("data-count")) for b in bars) == answered
        assert browser.find_element(By.ID, "spend-chart").is_displayed()
        shot = os.environ.get("AGT_OWNER_PAGE_SCREENSHOT")
        if shot:
            browser.save_screenshot(shot)
        _owner_login(browser, server.url, keys["alice"])
        assert "needs the owner's key" in browser.find_element(By.ID, "error").text
        assert not browser.find_elements(By.ID, "clients")
        assert browser.get_cookies() == []
    finally:
        browser.quit()


def test_the_owners_page_over_plain_http(world, server):
    """Without a browser: the form, the page for the owner's key in a header, JSON refusals
    for other callers, and headers that keep the page out of caches, frames and referrers."""
    import httpx

    _, keys, _ = world
    form = httpx.get(server.url + "/owner", timeout=30)
    assert form.status_code == 200 and 'method="post"' in form.text and "agt_" not in form.text
    page = httpx.get(server.url + "/owner", timeout=30,
                     headers={"authorization": f"Bearer {keys['owner']}"})
    assert page.status_code == 200 and 'id="clients"' in page.text
    assert page.headers["cache-control"] == "no-store" and "set-cookie" not in page.headers
    assert "default-src 'none'" in page.headers["content-security-policy"]
    for key, status in ((keys["alice"], 403), ("agt_nope", 401)):
        r = httpx.post(server.url + "/owner", data={"key": key}, timeout=30)
        assert r.status_code == status and isinstance(r.json()["detail"], str)
        assert "radius" not in r.text
