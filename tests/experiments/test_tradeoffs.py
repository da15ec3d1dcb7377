"""`agt reproduce tradeoffs` on tiny generated digits-format data: every figure, every
method row (with its relation and accountant) and every regime of the summary is produced,
and nothing owner-only beyond aggregate accuracies is written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agt.data.dataset import Dataset
from experiments.tradeoffs import FIG_FILES, load_settings, methods, run_study

TINY = {"epsilons": [1.0, 10.0], "budgets": [1, 10], "deltas": [1e-4],
        "train_fractions": [0.5, 1.0], "dims": [8, 64], "lambdas": [1e-2],
        "teacher_grid": [4], "teachers": 4, "agt_teachers_max": 4, "repeats": 2,
        "loss_repeats": 1, "check_draws": 1, "tol": 1e-6, "budget": 10,
        "dpsgd": {},            # DP-SGD rows off here (Opacus runs cost seconds each)
        "agt": {"learning_rate": 50.0, "n_epochs": 2, "clip_gamma": 0.01, "k_values": "0..3"},
        "figures": {"multiclass": ["eps", "budget", "delta", "n", "dim", "lambda_t"],
                    "binary": ["eps"]}}


def tiny(task: str, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    c = 10 if task == "multiclass" else 2
    protos = rng.integers(0, 17, size=(c, 64)).astype(np.float64)

    def draw(n):
        y = np.arange(n) % c
        x = np.clip(protos[y] + rng.normal(0, 3, size=(n, 64)).round(), 0, 16)
        return x, y.astype(np.int64)
    x, y = draw(80)
    xt, yt = draw(30)
    return Dataset("digits", x, y, xt, yt, c, {"feature_range": [0.0, 16.0]})


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("tradeoffs")
    settings = load_settings(quick=True, overrides=TINY)
    results = run_study(settings, out, quick=True,
                        dataset_by_task={t: tiny(t) for t in ("multiclass", "binary")})
    return out, results


def test_every_figure_and_file_is_written(study):
    out, results = study
    for fig in FIG_FILES:
        assert (out / f"multiclass_{fig}.png").stat().st_size > 1000
    assert (out / "binary_fig1.png").exists() and not (out / "binary_fig2.png").exists()
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["relation"] == "replace-one" and "owner_only" in on_disk
    assert "Winner per regime" in (out / "summary.md").read_text()


def test_every_method_has_rows_under_replace_one(study):
    _, results = study
    for task, block in results["tasks"].items():
        fig1 = block["figures"]["fig1_eps_delta"]["rows"]
        assert set(fig1) == set(methods(task))
        assert fig1.pop("dp-sgd") == [None, None]                  # switched off above
        for name, rows in fig1.items():
            assert all(r is not None for r in rows), name          # delta > 0: all apply
            for r in rows:
                assert r["relation"] == "replace-one" and r["accountant"]
                assert 0.0 <= r["mean"] <= 1.0 and r["std"] >= 0.0
        pure = block["figures"]["fig1_eps_delta0"]["rows"]
        assert pure["model-sens-gauss"] == [None, None] and pure["model-sens"][0] is not None
        assert len(block["regimes"]) == 8
    # binary AGT releases join only the binary task
    assert "ss-cauchy" in results["tasks"]["binary"]["figures"]["fig1_eps_delta"]["rows"]
    assert "ss-cauchy" not in results["tasks"]["multiclass"]["figures"]["fig1_eps_delta"]["rows"]


def test_no_radii_votes_or_logits_are_written(study):
    out, _ = study
    text = (out / "results.json").read_text()
    for word in ('"radius"', '"radii"', '"votes"', '"logits"', '"weights"'):
        assert word not in text


def test_exact_rows_match_their_ledgered_deployments(study):
    """The exact expectation and the sampled deployments describe the same mechanism: with
    the tiny data the sampled mean stays within 5 exact standard deviations (plus a margin
    for one draw)."""
    _, results = study
    rows = results["tasks"]["multiclass"]["figures"]["fig1_eps_delta"]["rows"]
    for name in ("df-exp", "df-exp-zcdp", "exp-radius"):
        for r in rows[name]:
            assert abs(r["sampled_mean"] - r["expected"]) <= 5 * r["std"] + 0.05
