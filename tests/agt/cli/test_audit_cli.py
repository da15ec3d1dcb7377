"""``agt audit``: given inputs, a retrained neighbour, the registry sweep, and refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agt.cli import main

CONFIG = """\
model: [{linear: {in: 6, out: 2}}]
loss: cross_entropy
data: {name: blobs, n_samples: 60, test_fraction: 0.2, seed: 0}
learning_rate: 0.5
n_epochs: 2
batch_size: full
clip_gamma: 0.5
k_values: "0..8"
device: cpu
dtype: float64
"""


def test_given_inputs_give_a_verdict_a_json_and_a_plot(tmp_path, capsys):
    pair = tmp_path / "pair.npz"
    np.savez(pair, prediction=[0], radius=[0], neighbour_prediction=[1], neighbour_radius=[0],
             n_classes=2)
    # this pair is exactly tight (loss = claim): at confidence 0.95 some seeds raise a false
    # alarm, as the docs say (seed 0 at 2000 samples: 1.015); 0.99 tests the plumbing
    rc = main(["audit", "--mechanism", "exp-radius", "--inputs", str(pair), "--samples", "2000",
               "--confidence", "0.99", "--out", str(tmp_path / "r.json"),
               "--plot", str(tmp_path / "r.png")])
    assert rc == 0
    assert "exp-radius: claim holds" in capsys.readouterr().out
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["verdict"] == "claim holds" and result["samples"] == 2000
    assert result["confidence"] == 0.99
    assert result["exact_loss"] == pytest.approx(1.0)
    assert 0.5 < result["lower_bound"] <= 1.0
    assert (tmp_path / "r.png").stat().st_size > 1000


@pytest.mark.slow
def test_a_retrained_neighbour_is_audited(tmp_path, capsys):
    """Two bundles (record 0's label flipped), certified on the test split; the query whose
    laws promise the most is audited."""
    (tmp_path / "c.yaml").write_text(CONFIG)
    rc = main(["audit", "--mechanism", "exp-radius", "--config", str(tmp_path / "c.yaml"),
               "--samples", "1000", "--out", str(tmp_path / "r.json")])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["verdict"] == "claim holds"
    assert "record 0 replaced (label-flip)" in result["extra"]["neighbour"]
    first, second = result["extra"]["first"], result["extra"]["second"]
    # the two certificates are those of neighbours: radii one apart at most, or both <= 0
    if first["prediction"] == second["prediction"]:
        assert abs(first["radius"] - second["radius"]) <= 1
    else:
        assert max(first["radius"], second["radius"]) <= 0


def test_the_registry_sweep_writes_its_artifact(tmp_path, capsys):
    out = tmp_path / "audit.json"
    rc = main(["audit", "--registry", "--mechanism", "exp-radius", "--mechanism", "gs",
               "--samples", "1000", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert set(doc["mechanisms"]) == {"exp-radius", "gs"}
    assert doc["mechanisms"]["gs"]["claim_epsilon"] == 1.0


@pytest.mark.parametrize("argv,message", [
    (["--inputs", "x.npz"], "one mechanism"),
    (["--registry", "--plot", "p.png"], "--plot"),
    (["--registry", "--confidence", "1.5"], "confidence"),
    (["--mechanism", "nope", "--inputs", "x.npz"], "unknown mechanism"),
])
def test_bad_requests_are_one_line_errors(tmp_path, capsys, argv, message):
    rc = main(["audit", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("agt: error:") and message in err, err
