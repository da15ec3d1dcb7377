"""The black-box audit (experiments.audit_service, ``agt audit --service-a/--service-b``)
against real `agt serve` processes on 127.0.0.1: two services on two neighbouring Blobs
bundles (a label flip of record 0) keep exp-radius's claim; the same audit of two services
running a planted bug (exp-radius reading the radius one too high, registered in the server
process only) reports it violated; a budget that cannot pay is refused before any release."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from agt.errors import BudgetExceededError  # noqa: E402
from agt.service.keys import KeyStore  # noqa: E402
from experiments.audit_service import ServiceSide, audit_services  # noqa: E402
from tests.agt.service.test_service import (  # noqa: E402
    free_port,
    stop_process,
    wait_until_ready,
)

ROOT = Path(__file__).resolve().parents[3]
CONFIG = """model: [{linear: {in: 6, out: 2}}]
loss: cross_entropy
data: {name: blobs, variant: separable, n_samples: 200, seed: 0}
learning_rate: 2.0
clip_gamma: 0.06
k_values: "0..49"
"""
#: the server process registers the planted mechanism before the CLI builds its choices
PLANTED = ("import sys; sys.path.insert(0, {root!r}); from mechanisms.base import register, "
           "load_registry; from mechanisms.inputs import Certified; "
           "from tests.mechanisms.planted import RadiusOffByOne; load_registry(); "
           "register('planted-radius-off-by-one', inputs=Certified, needs_delta=False, "
           "summary='test only')(RadiusOffByOne); from agt.cli.main import main; "
           "sys.exit(main(sys.argv[1:]))")
PLAIN = "import sys; from agt.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _serve(d: Path, bundle: str, ledger: str, mechanism: str, code: str):
    port = free_port()
    cmd = [sys.executable, "-c", code, "serve", "--bounds", str(d / bundle), "--mechanism",
           mechanism, "--epsilon", "1", "--ledger", str(d / ledger), "--budget-epsilon",
           "100000", "--keys", str(d / "keys.json"), "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """Four services on 127.0.0.1: exp-radius and the planted twin, each on bundle A and on
    its neighbour B; an owner key, a client key and a client key with a small budget."""
    import agt
    from agt.config import load_config
    from agt.data import load_dataset
    from agt.store import write_bundle
    from experiments.audit import neighbour_dataset

    d = tmp_path_factory.mktemp("service-audit")
    (d / "c.yaml").write_text(CONFIG)
    cfg = load_config(d / "c.yaml")
    data = load_dataset("blobs", {"variant": "separable", "n_samples": 200, "seed": 0})
    write_bundle(agt.train(cfg, data), d / "a.h5")
    write_bundle(agt.train(cfg, neighbour_dataset(data, "replace-one")), d / "b.h5")
    store = KeyStore.load(d / "keys.json", create=True)
    keys = {"owner": store.add("owner")[0], "client": store.add("client")[0],
            "poor": store.add("client", budget_epsilon=10.0)[0]}
    store.save()
    # candidates: the segment between the two classes' means, across both boundaries
    x0 = data.x_train[data.y_train == 0].mean(axis=0)
    x1 = data.x_train[data.y_train == 1].mean(axis=0)
    line = x0[None] + np.linspace(0.0, 1.0, 801)[:, None] * (x1 - x0)[None]
    procs = {}
    for tag, mech, code in (("ok", "exp-radius", PLAIN),
                            ("bug", "planted-radius-off-by-one", PLANTED.format(root=str(ROOT)))):
        for side in "ab":
            procs[tag + side] = _serve(d, f"{side}.h5", f"{tag}{side}.db", mech, code)
    try:
        for proc, url in procs.values():
            wait_until_ready(proc, url)
        yield {k: url for k, (_, url) in procs.items()}, keys, line, d
    finally:
        for proc, _ in procs.values():      # all stop at once, then wait for each
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in procs.values():
            stop_process(proc)


def _sides(urls, keys, tag, client="client"):
    return (ServiceSide(urls[tag + "a"], keys["owner"], keys[client]),
            ServiceSide(urls[tag + "b"], keys["owner"], keys[client]))


@pytest.mark.slow
def test_a_correct_service_holds_and_a_planted_bug_is_caught(services):
    from mechanisms import make_mechanism

    urls, keys, line, _ = services
    claimed = make_mechanism("exp-radius", 1.0)
    ok = audit_services(*_sides(urls, keys, "ok"), line, samples=1000, seed=1,
                        confidence=0.999)
    assert ok.verdict == "claim holds", ok.summary()
    assert ok.extra["law"] == "exp-radius" and ok.selection == "law"
    # the chosen query's certified inputs differ (the neighbours' labels differ there)
    assert ok.extra["first"] != ok.extra["second"], ok.extra
    assert ok.extra["charged_releases"] == [1000, 1000]       # every copy a fresh release
    assert ok.exact_loss is not None and ok.lower_bound <= ok.exact_loss + 1e-9
    assert ok.lower_bound > 0.3, ok.summary()                    # the audit has power here
    bug = audit_services(*_sides(urls, keys, "bug"), line, samples=1000, seed=1,
                         confidence=0.999, mechanism=claimed)
    assert bug.mechanism == "planted-radius-off-by-one"
    assert bug.verdict == "claim violated", bug.summary()
    # the same seed again meets its own cached answers: refused, not counted twice
    with pytest.raises(Exception, match="earlier releases"):
        audit_services(*_sides(urls, keys, "ok"), line, samples=1000, seed=1)


@pytest.mark.slow
def test_a_budget_that_cannot_pay_is_refused_before_any_release(services):
    from agt.client import Client

    urls, keys, line, _ = services
    with pytest.raises(BudgetExceededError, match=r"needs 1000 fresh releases.*eps=10"):
        audit_services(*_sides(urls, keys, "ok", "poor"), line, samples=1000)
    with Client(urls["oka"], keys["poor"]) as c:
        assert c.budget()["spent"]["epsilon"] == 0.0


@pytest.mark.slow
def test_the_cli_audits_two_services_with_keys_from_files(services, capsys):
    import json

    from agt.cli.main import main

    urls, keys, line, d = services
    np.save(d / "q.npy", line)
    (d / "owner.key").write_text(keys["owner"] + "\n")
    (d / "client.key").write_text(f"{keys['client']}\n{keys['client']}\n")
    out = d / "service-audit.json"
    assert main(["audit", "--service-a", urls["oka"], "--service-b", urls["okb"],
                 "--queries", str(d / "q.npy"), "--owner-key-file", str(d / "owner.key"),
                 "--client-key-file", str(d / "client.key"), "--samples", "300",
                 "--seed", "7", "--confidence", "0.999", "--out", str(out)]) == 0
    assert "exp-radius: claim holds" in capsys.readouterr().out
    row = json.loads(out.read_text())
    assert row["samples"] == 300 and row["extra"]["charged_releases"] == [300, 300]
    assert keys["owner"] not in out.read_text() and keys["client"] not in out.read_text()
