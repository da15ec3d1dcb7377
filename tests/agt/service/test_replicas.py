"""Two `agt serve` replicas (real processes on 127.0.0.1) on one PostgreSQL ledger, real
clients (`agt.client`): they share the dataset's budget, the clients' budgets, the answers
and the keys held in the ledger; 16 clients over both never over-spend and every label
received is the recorded one; a key revoked through one is refused by both; a retry with
the same Idempotency-Key on the other replica is answered once and charged once, also after
kill -9 of the first replica in the middle of requests."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
pytest.importorskip("psycopg")

from agt.client import Client, ServiceError  # noqa: E402
from agt.service.keys import LedgerKeyStore  # noqa: E402
from mechanisms.ledger import hash_query  # noqa: E402
from tests.agt.service.test_service import (  # noqa: E402
    CONFIG,
    free_port,
    stop_process,
    wait_until_ready,
)
from tests.postgres import Databases  # noqa: E402

BUDGET = 60.0           # exp-radius at epsilon 1 per query: 60 charges at most


class Replica:
    """One `agt serve` process on the shared ledger URL (its keys come from the ledger)."""

    def __init__(self, workdir: Path, url: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-c", "import sys; from agt.cli.main import main; "
               "sys.exit(main(sys.argv[1:]))", "serve", "--bounds", str(workdir / "b.h5"),
               "--mechanism", "exp-radius", "--epsilon", "1", "--ledger", url,
               "--budget-epsilon", str(BUDGET), "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def wait_ready(self) -> "Replica":
        wait_until_ready(self.proc, self.url)
        return self

    def stop(self, sig=signal.SIGTERM) -> None:
        stop_process(self.proc, sig)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A bundle, a PostgreSQL ledger with its keys, and two replicas serving from it."""
    from agt.cli.main import main
    from agt.data import load_dataset

    dbs = Databases()            # (skips with the reason where no server answers)
    d = tmp_path_factory.mktemp("replicas")
    (d / "c.yaml").write_text(CONFIG)
    assert main(["train", "--config", str(d / "c.yaml"), "--out", str(d / "b.h5"),
                 "--quiet"]) == 0
    url = dbs.new()
    store = LedgerKeyStore(url)
    keys = {"owner": store.add("owner")[0], "alice": store.add("client")[0],
            "bob": store.add("client")[0],
            "carol": store.add("client", budget_epsilon=3.0)[0]}
    keys["clients"] = [store.add("client")[0] for _ in range(16)]
    store.close()
    queries = load_dataset("blobs", {"variant": "separable", "n_samples": 3000,
                                     "seed": 5}).x_train
    replicas = [Replica(d, url), Replica(d, url)]        # started side by side
    try:
        for r in replicas:
            r.wait_ready()
        yield url, replicas, keys, queries
    finally:
        for r in replicas:
            if r.proc.poll() is None:
                r.proc.terminate()
        for r in replicas:
            r.stop()
        dbs.drop_all()


def recorded(url: str) -> tuple[int, dict[str, int]]:
    """(charges, query hash -> label) as the ledger holds them."""
    from mechanisms import Ledger
    with Ledger.open(url) as ledger:     # every charge, a request's run expanded
        charges = {e.id: e.query_hash for e in ledger.entries()}
        # (an answer without its charge fails here: KeyError)
        labels = {charges[r]: label for r, label in ledger.recorded_answers()}
    return len(charges), labels


@pytest.mark.slow
def test_replicas_share_the_budgets_answers_and_keys(cluster):
    url, (a, b), keys, q = cluster
    with Client(a.url, keys["alice"]) as on_a, Client(b.url, keys["alice"]) as on_b:
        first = on_a.predict(q[:5])
        again = on_b.predict(q[:5])              # the other replica: the recorded answers
        assert first.charged["count"] == 5 and again.charged["count"] == 0
        assert again.cached == [True] * 5 and again.labels == first.labels
        assert on_b.budget()["spent"]["epsilon"] == 5.0
    with Client(a.url, keys["carol"]) as carol_a, Client(b.url, keys["carol"]) as carol_b:
        carol_a.predict(q[10:12])
        with pytest.raises(ServiceError) as err:  # her own budget (3) spans the replicas
            carol_b.predict(q[12:14])
        assert err.value.status == 429
    # a key revoked through the ledger is refused by both replicas at the next request
    with Client(a.url, keys["bob"]) as bob_a, Client(b.url, keys["bob"]) as bob_b:
        bob_b.predict(q[20:21])
        store = LedgerKeyStore(url)
        store.revoke(store.authenticate(keys["bob"]).id)
        store.close()
        for c in (bob_a, bob_b):
            with pytest.raises(ServiceError) as err:
                c.predict(q[21:22])
            assert err.value.status == 401
    # the same Idempotency-Key on the other replica: the same answer, charged once
    with Client(a.url, keys["alice"]) as on_a, Client(b.url, keys["alice"]) as on_b:
        spent = on_a.budget()["spent"]["epsilon"]
        one = on_a.predict(q[30:34], idempotency_key="req-1")
        two = on_b.predict(q[30:34], idempotency_key="req-1")
        assert one.labels == two.labels and one.charged == two.charged
        assert on_b.budget()["spent"]["epsilon"] == spent + 4
        with pytest.raises(ServiceError) as err:
            on_b.predict(q[40:44], idempotency_key="req-1")
        assert err.value.status == 422 and "Idempotency-Key" in err.value.detail


@pytest.mark.slow
def test_sixteen_clients_over_two_replicas_and_a_kill(cluster):
    """16 clients spread over both replicas until the dataset's budget runs out, one
    replica killed (-9) part way: spend never above the budget, every label received is the
    recorded one, and every request cut off by the kill, retried on the other replica with
    its Idempotency-Key, is charged at most once."""
    url, replicas, keys, q = cluster
    got: list[tuple[str, int]] = []
    refused, errors, cut = [], [], []
    lock = threading.Lock()
    killed = threading.Event()

    def run(i: int):
        rng = np.random.default_rng(i)
        for n in range(6):
            idx = rng.choice(len(q), size=int(rng.integers(1, 5)), replace=False)
            token = f"c{i}-{n}"
            target = replicas[(i + n) % 2]
            if killed.is_set():
                target = replicas[1]
            for attempt in (target, replicas[1]):         # a retry goes to the survivor
                try:
                    with Client(attempt.url, keys["clients"][i], timeout=60) as c:
                        out = c.predict(q[idx], idempotency_key=token)
                except ServiceError as exc:
                    with lock:
                        (refused if exc.status == 429 else errors).append(exc)
                    if exc.status == 429:
                        return                 # this client stops at its first refusal
                    break
                except Exception:                          # the kill cut the connection
                    with lock:
                        cut.append(token)
                    continue
                with lock:
                    got.extend((hash_query(q[j]), v) for j, v in zip(idx, out.labels))
                break
            if i == 0 and n == 1:
                replicas[0].stop(signal.SIGKILL)
                killed.set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert refused, "the budget should have run out part way"
    charges, labels = recorded(url)
    assert charges <= BUDGET and charges == len(labels)
    assert all(labels[h] == v for h, v in got)
    with Client(replicas[1].url, keys["owner"]) as owner:
        assert owner.budget()["dataset"]["remaining"]["epsilon"] == BUDGET - charges


def test_the_owners_page_lists_the_keys_held_in_the_ledger(cluster):
    """The owner's page of a replica reads its clients from the ledger's keys table (a
    review's find: it called the keys file's `records()` on the ledger's key store, a 500)."""
    import httpx

    _, replicas, keys, _ = cluster
    page = httpx.get(replicas[1].url + "/owner", timeout=60,
                     headers={"authorization": f"Bearer {keys['owner']}"})
    assert page.status_code == 200 and 'id="clients"' in page.text
    r = httpx.get(replicas[1].url + "/owner", timeout=60,
                  headers={"authorization": f"Bearer {keys['alice']}", "accept": "text/html"})
    assert r.status_code == 403
