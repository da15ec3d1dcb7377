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
        "agt_grid": {}, "agt_stability_grid": {}, "agt_seeds": [0, 1],
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


def test_agt_rows_average_every_training_seed(study):
    _, results = study
    rows = results["tasks"]["multiclass"]["figures"]["fig1_eps_delta"]["rows"]
    for name in ("exp-radius", "ptr", "ss-argmax", "ens-exp-radius"):
        for r in rows[name]:
            assert r["agt_training_seeds"] == [0, 1]
            assert r["std_kind"] == "exact over AGT training seeds and noise draws"
    assert "agt_training_seeds" not in rows["df-exp"][0]
    assert results["seeds"]["agt_training_seeds"] == [0, 1]


def test_surrogate_reads_only_the_public_shape():
    from experiments.public_tuning import PublicShape, surrogate_like
    a, b = tiny("multiclass", seed=0), tiny("multiclass", seed=1)
    shape = PublicShape.of(a)
    assert shape == PublicShape.of(b) == PublicShape(80, 30, 64, 10, (0.0, 16.0), None)
    a.meta["options"] = {"task": "multiclass"}          # how the digits loader records it
    assert PublicShape.of(a).task == "multiclass"
    sa, sb = surrogate_like(shape, 3), surrogate_like(PublicShape.of(b), 3)
    for field in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(sa, field), getattr(sb, field))
    assert sa.n_train == 80 and sa.n_test == 30 and sa.n_classes == 10
    assert sa.x_train.min() >= 0.0 and sa.x_train.max() <= 16.0
    assert not np.array_equal(surrogate_like(shape, 4).x_train, sa.x_train)


def test_choose_takes_the_best_mean_score_and_the_first_of_ties():
    from experiments.public_tuning import choose, grid
    cands = grid({"lr": [1, 2, 3], "e": [5]})
    assert cands == [{"lr": 1, "e": 5}, {"lr": 2, "e": 5}, {"lr": 3, "e": 5}]
    table = {1: [0.5, 0.5], 2: [0.9, 0.5], 3: [0.6, 0.8]}
    pick = choose(cands, lambda c: table[c["lr"]], "test")
    assert pick.chosen == {"lr": 2, "e": 5}                 # mean 0.7, before lr 3's 0.7
    assert [row["score"] for row in pick.table] == [0.5, 0.7, 0.7]
    assert pick.table[2]["scores"] == [0.6, 0.8]
    with pytest.raises(ValueError, match="non-empty list"):
        grid({"lr": []})


def _tuning_of(dataset, task="multiclass", **extra):
    from experiments.tradeoffs import Study
    settings = load_settings(quick=True, overrides={
        **TINY, "agt_grid": {"learning_rate": [5.0, 50.0]}, "agt_seeds": [0],
        "tuning_seeds": [0, 1], "dpsgd": {"epochs": 1, "batch_size": 40,
                                          "max_grad_norm": 1.0, "accountant": "rdp"},
        "dpsgd_grid": {"learning_rate": [0.5, 5.0]}, **extra})
    return Study(settings, dataset_by_task={task: dataset}).tuning(task)


def test_tuning_never_reads_the_private_data():
    """The AGT and DP-SGD settings are chosen on the surrogates: other records, skewed
    training labels, permuted test labels and another pixel distribution change nothing in
    the choice or in any candidate's scores."""
    a = tiny("multiclass", seed=0)
    b = tiny("multiclass", seed=1)
    rng = np.random.default_rng(9)
    skewed = np.where(rng.random(b.n_train) < 0.7, 0, rng.integers(0, 10, b.n_train))
    b = Dataset(b.name, 2.0 + 0.5 * b.x_train, skewed, 2.0 + 0.5 * b.x_test,
                rng.permutation(b.y_test), b.n_classes, b.meta)
    more = {"agt_stability_grid": {"learning_rate": [1.9], "n_epochs": [5]}}
    ta, tb = _tuning_of(a, **more), _tuning_of(b, **more)
    assert ta == tb
    # two interval candidates and one stability candidate
    assert len(ta["agt"]["candidates"]) == 3 and len(ta["dpsgd"]["candidates"]) == 2
    assert ta["agt"]["candidates"][2]["bound_method"] == "stability"
    assert all(len(c["scores"]) == 2 for c in ta["agt"]["candidates"] + ta["dpsgd"]["candidates"])
    assert ta["agt_params"]["learning_rate"] in (5.0, 50.0, 1.9)
    assert ta["dpsgd_params"]["learning_rate"] in (0.5, 5.0)


def test_stability_candidates_join_the_public_tuning():
    """agt_stability_grid adds candidates under bound method stability (R = 1 from the unit
    ball map, clamp off, ball boxes) that are scored on the same surrogates; when one wins,
    the study's AGT models train under it."""
    from experiments.tradeoffs import STABILITY_SETTINGS
    out = _tuning_of(tiny("multiclass"), agt_grid={"learning_rate": [50.0]},
                     agt_stability_grid={"learning_rate": [1.9], "n_epochs": [20]})
    cands = out["agt"]["candidates"]
    assert len(cands) == 2 and cands[0]["learning_rate"] == 50.0
    assert {k: cands[1][k] for k in STABILITY_SETTINGS} == STABILITY_SETTINGS
    assert all(len(c["scores"]) == 2 for c in cands)
    only = _tuning_of(tiny("multiclass"), agt_grid={},
                      agt_stability_grid={"learning_rate": [1.9], "n_epochs": [20]})
    assert only["agt_params"]["bound_method"] == "stability"


def test_clipped_stability_candidates_join_the_tuning():
    """clip_norm candidates (per-record clipped losses, agt/stability.py) join the tuning of
    both tasks, scored like the others; a null grid value leaves the key out; the chosen
    clipped setting is what the study trains under."""
    grid_spec = {"learning_rate": [1.9], "n_epochs": [20], "clip_norm": [None, 0.3]}
    for task in ("multiclass", "binary"):
        out = _tuning_of(tiny(task), task, agt_grid={}, agt_stability_grid=grid_spec, dpsgd={})
        cands = out["agt"]["candidates"]
        assert [c.get("clip_norm") for c in cands] == [None, 0.3]
        assert "clip_norm" not in cands[0]
        assert all(len(c["scores"]) == 2 for c in cands)
    only = _tuning_of(tiny("binary"), "binary", agt_grid={}, dpsgd={},
                      agt_stability_grid={**grid_spec, "clip_norm": [0.3]})
    assert only["agt_params"]["clip_norm"] == 0.3


def test_settings_refuse_repeated_or_negative_seeds():
    from agt.errors import ConfigError
    for bad in ({"agt_seeds": [0, 0]}, {"tuning_seeds": []}, {"dpsgd_seeds": [-1]}):
        with pytest.raises(ConfigError, match="distinct seeds"):
            load_settings(quick=True, overrides={**TINY, **bad})


def test_multi_seed_rows_combine_the_single_seed_rows():
    """An AGT row over seeds [0, 1] has the mean of the one-seed rows' expectations and the
    law-of-total-variance spread (unbiased between-seed variance + mean noise variance)."""
    from experiments.tradeoffs import Study
    rows = {}
    for seeds in ([0], [1], [0, 1]):
        settings = load_settings(quick=True, overrides={**TINY, "agt_seeds": seeds})
        study = Study(settings, dataset_by_task={"multiclass": tiny("multiclass")})
        setup = study.setup("multiclass")
        rows[tuple(seeds)] = study.point(setup, "exp-radius", 10.0, 0.0, 1, ("t",))
    one = [rows[(0,)], rows[(1,)]]
    both = rows[(0, 1)]
    e = np.array([r["expected"] for r in one])
    noise_var = np.array([r["std"] ** 2 for r in one])
    assert both["expected"] == pytest.approx(e.mean())
    assert both["std"] == pytest.approx(np.sqrt(e.var(ddof=1) + noise_var.mean()))
    assert e[0] != e[1]           # the seeds do give other models here
