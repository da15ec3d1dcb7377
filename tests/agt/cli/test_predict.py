"""`agt predict`: releases through the ledger; the output holds index,label only; refusals
(budget, threshold radii, bad parameters) leave nothing behind; seeds are explicit and
recorded; certify plots."""

from __future__ import annotations

import csv
import os

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
    threshold = write_bundle(from_result(train(config(LOGISTIC_CE, k_values="0..20",
                                                      selection="threshold"), ds)), d / "t.h5")
    np.savez(d / "q.npz", x_test=ds.x_test[:20], y_test=ds.y_test[:20])
    return d, bundle, threshold


def run(*args):
    return main([str(a) for a in args])


@pytest.mark.parametrize("mechanism,extra", [("gs", []), ("ss-cauchy", []),
                                             ("ss-laplace", ["--delta", "1e-6"])])
def test_predict_records_every_release_and_writes_labels_only(setup, tmp_path, capsys,
                                                              mechanism, extra):
    d, bundle, _ = setup
    out = tmp_path / "labels.csv"
    db = tmp_path / "ledger.db"
    rc = run("predict", "--bounds", bundle, "--data", d / "q.npz", "--mechanism", mechanism,
             "--epsilon", "0.5", *extra, "--ledger", db, "--budget-epsilon", "100",
             "--budget-delta", "1e-3", "--insecure-seed", "3", "--out", out)
    assert rc == 0
    stdout = capsys.readouterr().out
    with open(out) as fh:
        assert fh.readline().strip() == "index,label"        # item 1: no radius column
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 20 and {r["label"] for r in rows} <= {"0", "1"}
    assert "radius" not in stdout and "INSECURE" in stdout
    with Ledger.open(db) as ledger:
        entries = ledger.entries()
    assert len(entries) == 20 and all(e.mechanism == mechanism for e in entries)
    assert all(e.epsilon == 0.5 and e.seeded for e in entries)


def test_predict_refuses_past_budget_and_writes_nothing(setup, tmp_path, capsys):
    d, bundle, _ = setup
    db = tmp_path / "ledger.db"
    common = ["predict", "--bounds", bundle, "--data", d / "q.npz", "--mechanism", "gs",
              "--epsilon", "0.25", "--ledger", db]
    assert run(*common, "--budget-epsilon", "7", "--out", tmp_path / "a.csv") == 0  # 20 x 0.25 = 5
    capsys.readouterr()
    assert run(*common, "--out", tmp_path / "b.csv") == 2                          # 10 > 7: refused
    err = capsys.readouterr().err
    assert err.startswith("agt: error:") and "budget" in err
    assert not (tmp_path / "b.csv").exists()
    assert not list(tmp_path.glob("*.partial"))
    with Ledger.open(db) as ledger:
        assert len(ledger.entries()) == 20


def test_threshold_bundles_cannot_feed_radius_mechanisms(setup, tmp_path, capsys):
    """Item 2: the threshold rule has no nesting proof, so smooth releases refuse it."""
    d, _, threshold = setup
    for mech in ("ss-cauchy", "ss-laplace"):
        rc = run("predict", "--bounds", threshold, "--data", d / "q.npz", "--mechanism", mech,
                 "--epsilon", "1", *(["--delta", "1e-6"] if mech == "ss-laplace" else []),
                 "--ledger", tmp_path / "l.db", "--budget-epsilon", "100",
                 "--budget-delta", "1e-3", "--out", tmp_path / "o.csv")
        err = capsys.readouterr().err
        assert rc == 2 and "selection: exact" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.csv").exists()
    rc = run("predict", "--bounds", threshold, "--data", d / "q.npz", "--mechanism", "gs",
             "--epsilon", "1", "--ledger", tmp_path / "l.db", "--budget-epsilon", "100",
             "--out", tmp_path / "o.csv")
    assert rc == 0                                           # GS spends no radius


def test_seeds_are_explicit_and_an_existing_release_file_is_kept(setup, tmp_path, capsys):
    d, bundle, _ = setup
    common = ["predict", "--bounds", bundle, "--data", d / "q.npz", "--mechanism", "gs",
              "--epsilon", "0.5", "--ledger", tmp_path / "l.db", "--budget-epsilon", "100"]
    with pytest.raises(SystemExit):
        run(*common, "--seed", "3", "--out", tmp_path / "a.csv")      # item 5: no bare --seed
    assert run(*common, "--out", tmp_path / "a.csv") == 0
    assert "INSECURE" not in capsys.readouterr().out
    with Ledger.open(tmp_path / "l.db") as ledger:
        assert not any(e.seeded for e in ledger.entries())
    before = (tmp_path / "a.csv").read_text()
    assert run(*common, "--out", tmp_path / "a.csv") == 2            # never silently replaced
    assert "exists" in capsys.readouterr().err
    assert (tmp_path / "a.csv").read_text() == before
    assert run(*common, "--out", tmp_path / "a.csv", "--overwrite") == 0


@pytest.mark.parametrize("args,message", [
    (["--mechanism", "ss-laplace", "--epsilon", "1"], "delta"),
    (["--mechanism", "gs", "--epsilon", "1", "--delta", "1e-5"], "delta"),
])
def test_predict_bad_privacy_parameters(setup, tmp_path, capsys, args, message):
    d, bundle, _ = setup
    rc = run("predict", "--bounds", bundle, "--data", d / "q.npz", *args, "--ledger",
             tmp_path / "l.db", "--budget-epsilon", "10", "--budget-delta", "1e-3",
             "--out", tmp_path / "o.csv")
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.csv").exists() and not (tmp_path / "l.db").exists()


@pytest.mark.parametrize("args", [["--epsilon", "-1"], ["--epsilon", "nan"],
                                  ["--epsilon", "1", "--delta", "2"]])
def test_predict_bad_numbers_are_usage_errors(setup, tmp_path, capsys, args):
    d, bundle, _ = setup
    with pytest.raises(SystemExit) as info:
        run("predict", "--bounds", bundle, "--data", d / "q.npz", "--mechanism", "ss-laplace",
            *args, "--ledger", tmp_path / "l.db", "--budget-epsilon", "10",
            "--out", tmp_path / "o.csv")
    assert info.value.code == 2
    assert not (tmp_path / "o.csv").exists() and not (tmp_path / "l.db").exists()


def test_certify_plot(setup, tmp_path):
    d, bundle, _ = setup
    png = tmp_path / "cert.png"
    assert run("certify", "--bounds", bundle, "--data", d / "q.npz", "--out", tmp_path / "c.csv",
               "--plot", png) == 0
    assert png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_predict_gated_session_is_one_ledger_entry(setup, tmp_path, capsys):
    d, bundle, _ = setup
    # its gate threshold (41) is above the grid's largest radius (20): the check before
    # spending refuses it (tests/agt/cli/test_plan.py) unless the owner overrides
    rc = run("predict", "--bounds", bundle, "--data", d / "q.npz", "--mechanism", "svt",
             "--epsilon", "5", "--delta", "1e-5", "--cutoff", "3", "--fallback", "refuse",
             "--ledger", tmp_path / "l.db", "--budget-epsilon", "5", "--budget-delta", "1e-5",
             "--out", tmp_path / "s.csv", "--force")
    out = capsys.readouterr().out
    assert rc == 0 and "the whole session (5, 1e-05)-DP" in out
    with Ledger.open(tmp_path / "l.db") as ledger:
        assert len(ledger.entries()) == 1
    rows = list(csv.DictReader(open(tmp_path / "s.csv")))
    assert len(rows) == 20 and {r["label"] for r in rows} <= {"-1", "0", "1"}
    # an option of another mechanism is refused before anything happens
    rc = run("predict", "--bounds", bundle, "--data", d / "q.npz", "--mechanism", "gs",
             "--epsilon", "1", "--cutoff", "3", "--ledger", tmp_path / "m.db",
             "--budget-epsilon", "5", "--out", tmp_path / "t.csv")
    assert rc == 2 and "--cutoff applies to svt" in capsys.readouterr().err
    assert not (tmp_path / "m.db").exists()


@pytest.mark.parametrize("link", [False, True])
def test_the_output_cannot_be_the_ledger_or_an_input(setup, tmp_path, capsys, link):
    """A review's find: --out naming the ledger (with --overwrite) replaced the ledger by the
    labels after the spend, and the next release had the whole budget again. Refused before
    anything is spent, also through a link, and for the bounds and the data files."""
    d, bundle, _ = setup
    ledger = tmp_path / "ledger.csv"
    common = ["--mechanism", "gs", "--epsilon", "0.5", "--budget-epsilon", "100",
              "--overwrite"]
    rc = run("predict", "--bounds", bundle, "--data", d / "q.npz", *common, "--ledger",
             ledger, "--out", tmp_path / "first.csv")
    assert rc == 0
    with Ledger.open(ledger) as opened:
        spent = len(opened.entries())
    before = ledger.read_bytes()
    out = ledger
    if link:
        out = tmp_path / "alias.csv"
        out.symlink_to(ledger)
    capsys.readouterr()
    rc = run("predict", "--bounds", bundle, "--data", d / "q.npz", *common, "--ledger",
             ledger, "--out", out)
    err = capsys.readouterr().err
    assert rc == 2 and "is the file given as --ledger" in err
    assert ledger.read_bytes() == before
    with Ledger.open(ledger) as opened:
        assert len(opened.entries()) == spent
    # a folder named ~ (a review's bypass: ~ was expanded for the check, not for the ledger)
    tilde = tmp_path / "~"
    tilde.mkdir(exist_ok=True)
    ledger2 = tilde / "l.csv"
    ledger2.write_bytes(before)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = run("predict", "--bounds", bundle, "--data", d / "q.npz", *common, "--ledger",
                 "./~/l.csv", "--out", tilde / "l.csv")
    finally:
        os.chdir(cwd)
    assert rc == 2 and "is the file given as --ledger" in capsys.readouterr().err
    assert ledger2.read_bytes() == before
    queries = tmp_path / "q.csv.npz"
    queries.write_bytes((d / "q.npz").read_bytes())
    data_out = tmp_path / "data.csv"
    data_out.symlink_to(queries)
    rc = run("predict", "--bounds", bundle, "--data", queries, *common, "--ledger",
             tmp_path / "other.db", "--out", data_out)
    assert rc == 2 and "is the file given as --data" in capsys.readouterr().err
    assert not (tmp_path / "other.db").exists()


def test_a_charge_above_the_releases_own_guarantee_is_said(setup, tmp_path, capsys):
    """A ledger with a fixed per-query guarantee charges every release that much; a new
    user's review saw "each (0.5, 0)-DP" printed where the ledger recorded 1.0 per query."""
    d, bundle, _ = setup
    db = tmp_path / "fixed.db"
    base = ["predict", "--bounds", bundle, "--data", d / "q.npz", "--mechanism", "gs",
            "--ledger", db]
    assert run(*base, "--epsilon", "1.0", "--budget-epsilon", "1000", "--accountant", "best",
               "--out", tmp_path / "a.csv") == 0
    assert "the ledger charged" not in capsys.readouterr().out
    assert run(*base, "--epsilon", "0.5", "--out", tmp_path / "b.csv") == 0
    out = capsys.readouterr().out
    assert "each (0.5, 0)-DP" in out and "the ledger charged each query (1, 0)" in out
    with Ledger.open(db) as ledger:
        assert all(e.epsilon == 1.0 for e in ledger.entries())
