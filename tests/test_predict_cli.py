"""`agt predict`: ledger-checked releases, refusals leave nothing behind; certify plots."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from agt.cli import main
from agt.store import from_result, write_bundle
from agt.training import train
from mechanisms.ledger import Ledger

from tests.helpers import LOGISTIC_CE, blobs, config


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("predict")
    ds = blobs(300, seed=40)
    bundle = write_bundle(from_result(train(config(LOGISTIC_CE, k_values="0..20"), ds)), d / "b.h5")
    np.savez(d / "q.npz", x_test=ds.x_test[:20], y_test=ds.y_test[:20])
    return d, bundle


def run(*args):
    return main([str(a) for a in args])


@pytest.mark.parametrize("mechanism,extra", [("gs", []), ("ss-cauchy", []),
                                             ("ss-laplace", ["--delta", "1e-6"])])
def test_predict_records_every_release(setup, tmp_path, mechanism, extra):
    d, bundle = setup
    out = tmp_path / "labels.csv"
    db = tmp_path / "ledger.db"
    rc = run("predict", "--bounds", bundle, "--data", d / "q.npz", "--mechanism", mechanism,
             "--epsilon", "0.5", *extra, "--ledger", db, "--budget-epsilon", "100",
             "--budget-delta", "1e-3", "--seed", "3", "--out", out)
    assert rc == 0
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 20 and {r["label"] for r in rows} <= {"0", "1"}
    with Ledger.open(db) as ledger:
        releases = ledger.releases()
    assert len(releases) == 20 and all(r.mechanism == mechanism for r in releases)
    assert all(r.epsilon == 0.5 for r in releases)


def test_predict_refuses_past_budget_and_writes_nothing(setup, tmp_path, capsys):
    d, bundle = setup
    db = tmp_path / "ledger.db"
    common = ["predict", "--bounds", bundle, "--data", d / "q.npz", "--mechanism", "gs",
              "--epsilon", "0.25", "--ledger", db, "--seed", "1"]
    assert run(*common, "--budget-epsilon", "7", "--out", tmp_path / "a.csv") == 0   # 20 x 0.25 = 5
    capsys.readouterr()
    assert run(*common, "--out", tmp_path / "b.csv") == 2                           # 10 > 7: refused
    err = capsys.readouterr().err
    assert err.startswith("agt: error:") and "budget" in err
    assert not (tmp_path / "b.csv").exists()
    assert not list(tmp_path.glob("*.partial"))
    with Ledger.open(db) as ledger:
        assert len(ledger.releases()) == 20


@pytest.mark.parametrize("args,message", [
    (["--mechanism", "gs", "--epsilon", "-1"], "epsilon"),
    (["--mechanism", "ss-laplace", "--epsilon", "1"], "delta"),
    (["--mechanism", "ss-laplace", "--epsilon", "1", "--delta", "2"], "delta"),
    (["--mechanism", "gs", "--epsilon", "1", "--delta", "1e-5"], "delta"),
])
def test_predict_bad_privacy_parameters(setup, tmp_path, capsys, args, message):
    d, bundle = setup
    rc = run("predict", "--bounds", bundle, "--data", d / "q.npz", *args, "--ledger",
             tmp_path / "l.db", "--budget-epsilon", "10", "--budget-delta", "1e-3",
             "--out", tmp_path / "o.csv")
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists()


def test_certify_plot(setup, tmp_path):
    d, bundle = setup
    png = tmp_path / "cert.png"
    assert run("certify", "--bounds", bundle, "--data", d / "q.npz", "--out", tmp_path / "c.csv",
               "--plot", png) == 0
    assert png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
