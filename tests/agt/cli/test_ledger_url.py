"""`agt predict --ledger postgresql://...`: a release command on a PostgreSQL ledger (a new
one is created with the budget given and checked first; reopened it keeps its settings and
refuses past its budget)."""

from __future__ import annotations

import pytest

from agt.cli import main
from mechanisms.ledger import Ledger
from tests.agt.cli.test_predict import setup  # noqa: F401  (fixture)
from tests.postgres import pg_databases, postgres_url  # noqa: F401  (fixtures)


def test_predict_on_a_postgres_ledger(setup, postgres_url, tmp_path):  # noqa: F811
    d, bundle, _ = setup
    common = ["predict", "--bounds", str(bundle), "--data", str(d / "q.npz"), "--mechanism",
              "gs", "--epsilon", "0.5", "--ledger", postgres_url]
    # refused before anything is created: 20 queries at 0.5 do not fit a budget of 5
    assert main([*common, "--budget-epsilon", "5", "--out", str(tmp_path / "a.csv")]) == 2
    assert main([*common, "--budget-epsilon", "10", "--out", str(tmp_path / "b.csv")]) == 0
    with Ledger.open(postgres_url) as ledger:
        assert ledger.backend == "PostgreSQL" and len(ledger.entries()) == 20
        assert ledger.spent().epsilon == pytest.approx(10.0)
    assert main([*common, "--out", str(tmp_path / "c.csv")]) == 2      # the budget is spent
