"""`agt reproduce pate --quick`: the PATE table end to end through the CLI (real teachers,
real ledgers), and what its numbers must satisfy whatever the draws."""

from __future__ import annotations

import json
import math

from agt.cli.main import main


def run_cli(args, capsys) -> tuple[int, str, str]:
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_pate_quick_table(tmp_path, capsys):
    rc, out, _ = run_cli(["reproduce", "pate", "--quick", "--out", str(tmp_path), "--quiet"],
                         capsys)
    assert rc == 0 and "| dataset | T | mechanism |" in out
    body = json.loads((tmp_path / "pate-quick" / "results.json").read_text())
    assert body["quick"] is True
    for cell in body["results"]:
        rows = cell["rows"]
        assert set(rows) == {"lnmax", "gnmax", "confident-gnmax"}
        for name, row in rows.items():
            # the data-dependent bound never exceeds the data-independent charge
            assert row["eps_dependent"]["mean"] <= row["eps_independent"]["mean"] + 1e-9
            assert 0 <= row["answered"]["mean"] <= cell["n_public"]
            if name != "lnmax":
                assert math.isfinite(row["eps_sanitised"]["mean"])
                # the AGT distance never gives a larger smooth sensitivity than the plain one
                assert (row["smooth_sensitivity_agt"]["mean"]
                        <= row["smooth_sensitivity"]["mean"] + 1e-12)
        # gnmax answers every query; confident-gnmax only some
        assert rows["gnmax"]["answered"]["mean"] == cell["n_public"]
        assert rows["confident-gnmax"]["answered"]["mean"] <= cell["n_public"]
    assert (tmp_path / "pate-quick" / "summary.md").read_text().startswith("# PATE table")


def test_pate_takes_no_plan_options(tmp_path, capsys):
    rc, _, err = run_cli(["reproduce", "pate", "--quick", "--seed", "3", "--out",
                          str(tmp_path)], capsys)
    assert rc != 0 and "takes no --only, --seed" in err
