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
from mechanisms.ledger import hash_query  # noqa: E402

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
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agt serve exited: {self.proc.stderr.read()[-2000:]}")
            try:
                with Client(self.url) as c:
                    if c.health():
                        return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError("agt serve did not answer in 120 s")

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=60)


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
    out = {"charges": len(recorded_charges(path))}
    conn = sqlite3.connect(path)
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        out["answers"] = (conn.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
                          if "answers" in tables else 0)
        return out
    finally:
        conn.close()


def answers_of(path) -> dict[str, int]:
    """Query hash -> label of every recorded answer, joined with its recorded charge."""
    charges = recorded_charges(path)
    conn = sqlite3.connect(path)
    try:
        # (an answer without its charge fails here: KeyError)
        return {charges[r]: label for label, r in
                conn.execute("SELECT label, release_id FROM answers")}
    finally:
        conn.close()


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
        (b'{"queries": [[1, 2, 3, 4, 5, ' + b"9" * 5000 + b"]]}", 400),    # over json's ints
        (json.dumps({"queries": [[1, 2, 3, 4, 5, "6"]]}).encode(), 422),
        (json.dumps({"queries": [[1, 2, 3, 4, 5, True]]}).encode(), 422),
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
