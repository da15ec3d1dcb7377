"""No free work for a spent client (issue 47): under every accountant of the answering door
(standard, best, advanced, tight) and for a stability-gated session mechanism, a client that
cannot pay for one more charge is refused before any certification, and a client that can
still pay (or has a session open) is answered.

The server is real (`create_app` under uvicorn on 127.0.0.1, real HTTP clients) but runs in
this process, so that a spy on its certifier counts the certifications
(`test_service._count_certified`)."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from agt.client import Client, ServiceError  # noqa: E402
from agt.service.keys import KeyStore  # noqa: E402
from mechanisms import Ledger  # noqa: E402
from tests.agt.service.test_service import (  # noqa: E402
    _count_certified,
    free_port,
    world,  # noqa: F401 - the trained bundle and the queries, a module fixture
)


@contextlib.contextmanager
def served(service, keys_path):
    """The service's HTTP app under uvicorn on 127.0.0.1 and a free port, in a thread of this
    process; yields its URL, and stops it (the app's lifespan closes the service) after."""
    import uvicorn

    from agt.service.app import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service, keys_path), host="127.0.0.1",
                                           port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)


def _keys(path, budget: tuple[float, float]) -> tuple[str, str, str, str]:
    """Two client keys with the same budget: (dora's key, dora's id, erin's key, erin's id)."""
    store = KeyStore.load(path, create=True)
    dora, dora_record = store.add("client", budget_epsilon=budget[0], budget_delta=budget[1])
    erin, erin_record = store.add("client", budget_epsilon=budget[0], budget_delta=budget[1])
    store.save()
    return dora, dora_record.id, erin, erin_record.id


def _refused(url: str, key: str, queries) -> ServiceError:
    with Client(url, key) as client, pytest.raises(ServiceError) as err:
        client.predict(queries)
    assert err.value.status == 429
    return err.value


@pytest.mark.parametrize("accountant", ["standard", "best", "advanced", "tight"])
def test_a_spent_client_gets_no_certification_under_every_accountant(world, tmp_path,  # noqa: F811
                                                                     accountant):
    """dora asks one query at a time until she is refused: every answered request was
    certified once, the refusal none; 500 more queries, and the same query again, are
    refused without certification too (the verdict is kept); erin, with the same budget
    untouched, is answered; the ledger holds exactly dora's answered charges."""
    from agt.service.server import PredictionService
    from agt.store import read_bundle
    from mechanisms import make_mechanism

    d, _, q = world
    fixed = {} if accountant == "standard" else {"per_query_epsilon": 0.1,
                                                 "per_query_delta": 0.0}
    Ledger.open(tmp_path / "l.db", 100.0, 1e-5, accountant, **fixed).close()
    dora, dora_id, erin, erin_id = _keys(tmp_path / "keys.json", (1.0, 1e-6))
    service = PredictionService(read_bundle(d / "b.h5"), make_mechanism("exp-radius", 0.1),
                                tmp_path / "l.db")
    with served(service, tmp_path / "keys.json") as url:
        certified = _count_certified(service)
        answered = 0
        with Client(url, dora) as client:
            for i in range(30):
                try:
                    client.predict(q[i:i + 1])
                except ServiceError as exc:
                    refusal = exc
                    break
                answered += 1
        assert 1 <= answered < 30 and refusal.status == 429
        assert f"client {dora_id}: its budget cannot pay for one more query" in refusal.detail
        assert certified == [1] * answered              # the refused request: none
        assert _refused(url, dora, q[100:600]).body["remaining"]["client"] is not None
        _refused(url, dora, q[0:1])                      # answered before, but she is spent
        assert certified == [1] * answered
        with Client(url, erin) as client:
            assert len(client.predict(q[700:702]).labels) == 2
        assert certified == [1] * answered + [2]
    with Ledger.open(tmp_path / "l.db") as ledger:
        notes = [e.note for e in ledger.entries()]
    assert sum(n.endswith(f"client {dora_id}") for n in notes) == answered
    assert sum(n.endswith(f"client {erin_id}") for n in notes) == 2


def test_a_spent_client_without_an_open_session_gets_no_certification(world, tmp_path):  # noqa: F811
    """svt, cutoff 1, eps 4 per session; dora's budget pays for one session. Her first
    (stable) query opens it and spends her whole budget; while it is open she is answered at
    no charge; an unstable query closes it; from then on she is refused before
    certification (a new session is unpaid), and erin, who can pay, opens one."""
    from agt.service.server import PredictionService
    from agt.store import read_bundle
    from mechanisms import make_mechanism

    d, _, q = world
    Ledger.open(tmp_path / "l.db", 100.0, 0.01).close()
    dora, dora_id, erin, _ = _keys(tmp_path / "keys.json", (4.0, 1e-4))
    service = PredictionService(read_bundle(d / "b.h5"),
                                make_mechanism("svt", 4.0, 1e-5, cutoff=1), tmp_path / "l.db")
    with served(service, tmp_path / "keys.json") as url:
        radius = np.asarray(service.radii(service.check_queries(q[:1000])).result(60)["radius"])
        stable, boundary = q[:1000][radius == radius.max()], q[:1000][radius <= 0][:1]
        assert radius.max() == 49 and len(boundary) == 1
        certified = _count_certified(service)
        with Client(url, dora) as client:
            first = client.predict(stable[:1])
            assert first.session == {"opened": 1, "closed": False}
            second = client.predict(stable[1:2])             # her budget is spent: still open
            assert second.session == {"opened": 0, "closed": False}
            assert client.predict(boundary).session["closed"]
        assert certified == [1, 1, 1]
        refusal = _refused(url, dora, stable[2:3])
        assert f"client {dora_id}: its budget cannot pay for a new session" in refusal.detail
        _refused(url, dora, q[1000:1500])
        assert certified == [1, 1, 1]
        with Client(url, erin) as client:
            assert client.predict(stable[3:4]).session["opened"] == 1
        assert certified == [1, 1, 1, 1]
