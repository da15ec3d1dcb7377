"""`agt plan` and the check before spending of `agt predict` / `agt teacher-labels`: the JSON
shape, owner-only output, refusals that charge nothing and create no ledger, the override,
and dry runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from agt.cli import main
from agt.store import from_result, write_bundle
from agt.training import train
from mechanisms.ledger import Ledger
from mechanisms.release_plan import JSON_KEYS
from tests.helpers import LOGISTIC_CE, blobs, config


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    ds = blobs(200, seed=41)
    bundle = write_bundle(from_result(train(config(LOGISTIC_CE, k_values="0..20"), ds)),
                          d / "b.h5")
    np.savez(d / "q.npz", x_test=ds.x_test[:20], y_test=ds.y_test[:20])
    np.savez(d / "public.npz", x_public=ds.x_test[:20])
    return d, bundle


def run(capsys, *args):
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def default_ledgers() -> set[Path]:
    return set(Path(os.environ["AGT_LEDGER_DIR"]).rglob("*"))


def test_plan_json_shape_and_owner_only_text(setup, capsys):
    d, bundle = setup
    common = ["plan", "--bounds", bundle, "--data", d / "q.npz", "--epsilon-total", "10",
              "--delta-total", "1e-5", "--accountant", "standard", "--accountant", "rdp"]
    before = default_ledgers()
    rc, out, _ = run(capsys, *common, "--json")
    assert rc == 0
    plan = json.loads(out)
    assert set(plan) == {"rows", "recommended"}
    assert all(tuple(r) == JSON_KEYS for r in plan["rows"])
    names = {r["mechanism"] for r in plan["rows"]}
    assert {"gs", "exp-radius", "ptr", "svt"} <= names and plan["recommended"] in names
    assert {r["accountant"] for r in plan["rows"]} == {"standard", "rdp"}
    assert all(r["expected_accuracy"] is not None for r in plan["rows"])   # labels given
    exp = next(r for r in plan["rows"] if (r["mechanism"], r["accountant"])
               == ("exp-radius", "standard"))
    assert exp["epsilon_per_query"] == pytest.approx(0.5) and exp["delta_per_query"] == 0
    assert plan["recommended"] not in ("ptr", "svt")      # refused by the check: not chosen
    rc, text, _ = run(capsys, *common, "--queries", "40")
    assert rc == 0 and "OWNER-ONLY" in text and "B = 40" in text and "recommended:" in text
    ptr_line = next(line for line in text.splitlines() if line.startswith("ptr "))
    assert ptr_line.endswith("refused")
    assert default_ledgers() == before                  # a plan opens no ledger


def test_refusal_charges_nothing_and_creates_no_ledger(setup, tmp_path, capsys):
    d, bundle = setup
    db = tmp_path / "l.db"
    before = default_ledgers()
    release = ["predict", "--bounds", bundle, "--data", d / "q.npz", "--out",
               tmp_path / "o.csv", "--budget-epsilon", "100", "--budget-delta", "1e-3"]
    for mech in (["--mechanism", "ptr", "--epsilon", "0.5", "--delta", "1e-6"],
                 ["--mechanism", "svt", "--epsilon", "1", "--delta", "1e-6"]):
        for ledger in (["--ledger", db], []):
            rc, _, err = run(capsys, *release, *mech, *ledger)
            assert rc == 2 and "refused before spending" in err and "--force" in err
            assert len(err.strip().splitlines()) == 1
    assert not db.exists() and not (tmp_path / "o.csv").exists()
    assert default_ledgers() == before
    # an existing ledger: its totals do not move
    assert run(capsys, *release, "--mechanism", "gs", "--epsilon", "0.5", "--ledger", db)[0] == 0
    with Ledger.open(db) as ledger:
        spent = ledger.spent()
    rc, _, err = run(capsys, *release, "--mechanism", "ptr", "--epsilon", "0.5", "--delta",
                     "1e-6", "--ledger", db, "--overwrite")
    assert rc == 2 and "refused before spending" in err
    with Ledger.open(db) as ledger:
        assert ledger.spent() == spent and len(ledger.entries()) == 20
    # the owner's override releases it, and a lower --min-answered is honoured too
    rc, out, _ = run(capsys, *release, "--mechanism", "ptr", "--epsilon", "0.5", "--delta",
                     "1e-6", "--ledger", db, "--overwrite", "--force")
    assert rc == 0
    with Ledger.open(db) as ledger:
        assert len(ledger.entries()) == 40 and ledger.spent().epsilon > spent.epsilon


def test_dry_run_charges_nothing(setup, tmp_path, capsys):
    d, bundle = setup
    before = default_ledgers()
    rc, out, _ = run(capsys, "predict", "--bounds", bundle, "--data", d / "q.npz",
                     "--mechanism", "svt", "--epsilon", "1", "--delta", "1e-6", "--dry-run")
    assert rc == 0 and "OWNER-ONLY" in out and "nothing charged" in out
    assert "would be refused before spending" in out
    rc, out, _ = run(capsys, "predict", "--bounds", bundle, "--data", d / "q.npz",
                     "--mechanism", "exp-radius", "--epsilon", "1", "--dry-run",
                     "--ledger", tmp_path / "l.db")
    assert rc == 0 and "check before spending passes" in out and "exp-radius" in out
    assert not (tmp_path / "l.db").exists() and default_ledgers() == before
    rc, _, err = run(capsys, "predict", "--bounds", bundle, "--data", d / "q.npz",
                     "--mechanism", "gs", "--epsilon", "1")
    assert rc == 2 and "--out" in err


def test_teacher_labels_dry_run_and_refusal(setup, tmp_path, capsys):
    d, bundle = setup
    before = default_ledgers()
    common = ["teacher-labels", "--ensemble", bundle, "--public", d / "public.npz",
              "--epsilon-total", "2", "--delta-total", "1e-5", "--ledger", tmp_path / "t.db"]
    rc, out, _ = run(capsys, *common, "--mechanism", "exp-radius", "--dry-run")
    assert rc == 0 and "OWNER-ONLY" in out and "best" in out
    rc, _, err = run(capsys, *common, "--mechanism", "ptr", "--out", tmp_path / "t.npz")
    assert rc == 2 and "refused before spending" in err
    assert not (tmp_path / "t.db").exists() and not (tmp_path / "t.npz").exists()
    assert default_ledgers() == before
