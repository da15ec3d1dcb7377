"""`agt reproduce` and the experiments: tiny end-to-end runs (blobs, and the OctMNIST and
IMDB pipelines on small generated files), artifact content, plans, data-dir errors.

The runs use tiny experiment plans written to tmp_path (the same code paths as the shipped
plans, with fewer points, k values and repeats); the shipped plans are checked to load."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from agt.cli import main
from agt.errors import ConfigError
from experiments.plan import default_plan_path, epsilon_grid, load_plan
from experiments.runner import EXPERIMENTS
from tests.fakes import write_fake_imdb_embeddings, write_fake_octmnist

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"
ALL = ["heatmap", "single", "ensembles", "budget", "kgrid", "teacher"]
DPSGD_TINY = {"epochs": 1, "batch_size": 50, "learning_rate": 0.5, "max_grad_norm": 1.0,
              "accountant": "rdp"}


def write_plan(path: Path, body: dict) -> Path:
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def run_cli(args, capsys) -> tuple[int, str, str]:
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def load(out: Path, dataset: str, experiment: str) -> dict:
    d = out / dataset / experiment
    assert (d / "table.md").is_file(), f"{experiment}: no table.md"
    assert list(d.glob("*.png")), f"{experiment}: no PNG plot"
    for png in d.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    body = json.loads((d / "results.json").read_text())
    assert body["experiment"] == experiment and body["dataset"] == dataset
    for key in ("seed", "settings", "train_config", "data", "results", "seconds"):
        assert key in body, f"{experiment}: results.json lacks {key}"
    return body


BLOBS_TINY = {
    "dataset": "blobs",
    "train_config": str(CONFIGS / "blobs.yaml"),
    "train_overrides": {"k_values": "0..49"},
    "experiments": ALL,
    "seeds": [0, 1],
    "settings": {
        "heatmap": {"train_config": str(CONFIGS / "blobs_mlp.yaml"),
                    "train_overrides": {"k_values": "0..3",
                                        "n_epochs": 1, "data": {"n_samples": 500}},
                    "grid_points": 12, "max_scatter": 50},
        "single": {"epsilons": {"logspace": [0.01, 10.0, 6]}, "repeats": 2},
        "ensembles": {"teachers": [1, 3], "epsilons": [1.0, 0.1], "repeats": 2},
        "budget": {"queries": [2, 50], "teachers": 3, "repeats": 2, "dpsgd": DPSGD_TINY,
                   "dpsgd_seeds": 1},
        "kgrid": {"sizes": [1, 2, 5, 49], "epsilons": [1.0]},
        "teacher": {"n_public": [40], "main": 40, "teachers": 3, "repeats": 1,
                    "student_overrides": {"n_epochs": 3}, "dpsgd": DPSGD_TINY,
                    "dpsgd_seeds": 1},
    },
}


# ------------------------------------------------------------------------------------------

def test_blobs_reproduce_end_to_end(tmp_path, capsys):
    plan = write_plan(tmp_path / "plan.yaml", BLOBS_TINY)
    out = tmp_path / "out"
    rc, stdout, _ = run_cli(["reproduce", "blobs", "--plan", str(plan), "--out", str(out),
                             "--quiet"], capsys)
    assert rc == 0
    for name in ALL:  # the summary table names every experiment
        assert f"| {name} |" in stdout
    assert (out / "blobs" / "summary.md").is_file()

    heat = load(out, "blobs", "heatmap")["results"]
    assert [p["variant"] for p in heat["panels"]] == ["separable", "overlapping"]
    for p in heat["panels"]:
        r = np.asarray(p["grid_radius"])
        assert r.shape == (12, 12) and r.min() >= 0 and r.max() <= 3
        assert 0 < p["grid_bound_mean"] <= 1
    assert heat["beta"] == pytest.approx(1.0 / 6.0)

    single = load(out, "blobs", "single")["results"]
    acc = single["accuracy"]
    eps = single["epsilons"]
    assert len(eps) == 6 and eps[0] == pytest.approx(0.01) and eps[-1] == pytest.approx(10.0)
    top = single["nonprivate_accuracy"]
    for mech in ("gs", "ss-laplace", "ss-cauchy"):
        e = np.asarray(acc[mech]["expected"])
        assert np.all(np.diff(e) >= -1e-12), f"{mech}: expected accuracy not monotone in eps"
        assert e.max() <= top + 1e-12 and e.min() >= 0.4
        assert np.allclose(acc[mech]["sampled_mean"], e, atol=0.08)
        assert all(len(d) == 2 for d in acc[mech]["sampled"])
    i1 = int(np.argmin(np.abs(np.asarray(eps) - 1.0)))
    assert acc["ss-cauchy"]["expected"][i1] > acc["gs"]["expected"][i1]
    # the exponential mechanism on the radius spends it far better than smooth sensitivity
    assert acc["exp-radius"]["expected"][i1] >= acc["ss-cauchy"]["expected"][i1]
    # mean +- std over the plan's training seeds, never one chosen seed
    assert single["training_seeds"] == [0, 1]
    assert all(len(v) == 2 for v in acc["gs"]["expected_by_seed"])
    assert len(single["nonprivate_by_seed"]) == 2

    ens = load(out, "blobs", "ensembles")["results"]
    assert [r["T"] for r in ens["per_T"]] == [1, 3]
    for r in ens["per_T"]:
        assert set(r["accuracy"]) == {"1.0", "0.1"}
        for per in r["accuracy"].values():
            for m in ("lnmax", "ens-ss-cauchy", "ens-ss-laplace", "ens-ptr", "ens-ptr-gs"):
                assert 0.0 <= per[m]["expected"] <= 1.0

    budget = load(out, "blobs", "budget")["results"]
    for acc_name, rows in budget["per_accountant"].items():
        assert [r["Q"] for r in rows] == [2, 50]
        assert rows[0]["epsilon_per_query"] > rows[1]["epsilon_per_query"]
        assert rows[0]["epsilon_per_query"] <= 10.0 / 2 * (1 + 1e-9) or acc_name == "tight"
    best = {r["Q"]: r["epsilon_per_query"] for r in budget["per_accountant"]["best"]}
    tight = {r["Q"]: r["epsilon_per_query"] for r in budget["per_accountant"]["tight"]}
    assert all(tight[q] >= best[q] * (1 - 1e-6) for q in best)
    gated = budget["gated"]
    assert [r["Q"] for r in gated] == [2, 50]
    for r in gated:
        for curve in ("single-svt", "ensemble-ens-svt"):
            assert 0 <= r[curve]["expected"] <= r[curve]["answered"] <= 1
    run0 = budget["dp_sgd"]["runs"][0]
    # DP-SGD's add-remove target converts to the replace-one total (10, 1e-5) of every row
    assert budget["relation"] == "replace-one"
    assert (run0["epsilon"] <= 5.0 * 1.01
            and run0["delta"] == pytest.approx(1e-5 / (1 + math.exp(5))))

    kg = load(out, "blobs", "kgrid")["results"]
    eps_key = "1.0"
    contiguous = [c["smooth_bound_mean"][eps_key] for c in kg["families"]["contiguous"]]
    assert all(b2 <= b1 + 1e-12 for b1, b2 in zip(contiguous, contiguous[1:]))
    assert all(0 < b <= 1 for b in contiguous)
    for c in kg["families"]["linear"]:
        assert c["radius_mean"] <= c["n_values"]       # index radius: at most the grid index
    assert kg["families"]["contiguous"][-1]["smooth_bound_mean"][eps_key] == pytest.approx(
        kg["trained_grid"]["smooth_bound_mean"][eps_key])

    teach = load(out, "blobs", "teacher")["results"]
    rows = teach["per_n_public"][0]["rows"]
    assert set(rows) == {"single-gs", "single-ss", "single-exp", "single-svt", "sa-gs", "sa-ss",
                         "sa-exp", "sa-svt", "sa-gnmax", "sa-cgnmax"}
    for r in rows.values():
        assert len(r["label_accuracy"]) == 1
        assert math.isnan(r["student_accuracy_mean"]) or 0 <= r["student_accuracy_mean"] <= 1
    assert teach["paper_percent"]["single-gs"] == 82.8


def test_blobs_rerun_is_deterministic_and_seed_changes_it(tmp_path, capsys):
    plan = write_plan(tmp_path / "plan.yaml", {**BLOBS_TINY, "experiments": ["single"]})
    results = []
    for name, extra in (("a", []), ("b", []), ("c", ["--seed", "3"])):
        rc, _, _ = run_cli(["reproduce", "blobs", "--plan", str(plan), "--out",
                            str(tmp_path / name), "--quiet", *extra], capsys)
        assert rc == 0
        body = json.loads((tmp_path / name / "blobs" / "single" / "results.json").read_text())
        results.append(body)
    assert results[0]["results"]["accuracy"] == results[1]["results"]["accuracy"]
    assert results[2]["seed"] == 3 and results[2]["train_config"]["seed"] == 3
    assert results[2]["training_seeds"] == [3] and results[0]["training_seeds"] == [0, 1]
    assert results[2]["results"]["accuracy"] != results[0]["results"]["accuracy"]


def serial_and_parallel(plan, tmp_path, capsys) -> list[tuple[str, Path]]:
    """`agt reproduce blobs` of `plan` with --workers 1 and with --workers 2 --threads 1:
    (stdout, output folder) of each run, both asserted to succeed."""
    runs = []
    for name, extra in (("serial", ["--workers", "1"]),
                        ("parallel", ["--workers", "2", "--threads", "1"])):
        rc, stdout, err = run_cli(["reproduce", "blobs", "--plan", str(plan), "--out",
                                   str(tmp_path / name), "--quiet", *extra], capsys)
        assert rc == 0, err
        runs.append((stdout, tmp_path / name))
    return runs


def test_ensembles_with_worker_processes_give_the_serial_results(tmp_path, capsys):
    """`--workers 2` trains the teachers through the same library path in two processes:
    the same ensembles (ids) and the same numbers."""
    plan = write_plan(tmp_path / "plan.yaml", {
        **BLOBS_TINY, "experiments": ["ensembles"],
        "settings": {**BLOBS_TINY["settings"],
                     "ensembles": {"teachers": [3], "epsilons": [1.0], "repeats": 2}}})
    bodies = [load(out, "blobs", "ensembles")["results"]["per_T"]
              for _, out in serial_and_parallel(plan, tmp_path, capsys)]
    assert len(bodies[0]) == 1
    for serial, parallel in zip(*bodies):
        for row in (serial, parallel):
            row.pop("training_and_certification_seconds")
        assert serial == parallel


def _without_timing(obj):
    if isinstance(obj, dict):
        return {k: _without_timing(v) for k, v in obj.items()
                if "second" not in k and k != "created"}
    if isinstance(obj, list):
        return [_without_timing(v) for v in obj]
    return obj


def test_heatmap_in_its_own_process_gives_the_serial_results(tmp_path, capsys):
    """`--workers 2` runs the heat map in a spawned process beside the other experiments:
    the same results.json (timings aside) and the summary in the plan's order."""
    plan = write_plan(tmp_path / "plan.yaml", {**BLOBS_TINY, "experiments": ["heatmap", "kgrid"]})
    bodies = []
    for stdout, out in serial_and_parallel(plan, tmp_path, capsys):
        assert stdout.index("| heatmap |") < stdout.index("| kgrid |")
        bodies.append({e: _without_timing(load(out, "blobs", e)) for e in ("heatmap", "kgrid")})
    assert bodies[0] == bodies[1]


def test_auto_workers_detach_the_heatmap_only_when_two_processes_fit(monkeypatch):
    """`--workers auto` (the default): a second process only for the heat map beside other
    experiments, and only when two processes of the requested threads fit in the cores."""
    import experiments.runner as runner

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runner, "available_cores", lambda: 2)
    assert runner.auto_workers(["heatmap", "single"]) == 2
    assert runner.auto_workers(["heatmap"]) == 1                  # nothing to run beside it
    assert runner.auto_workers(["single", "ensembles"]) == 1     # tiny teachers stay here
    assert runner.auto_workers(["heatmap", "single"], threads=2) == 1   # 2 x 2 > 2 cores
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert runner.auto_workers(["heatmap", "single"]) == 1
    monkeypatch.setattr(runner, "available_cores", lambda: 1)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert runner.auto_workers(["heatmap", "single"]) == 1
    with pytest.raises(ConfigError, match="workers"):
        runner.reproduce("blobs", workers="many", only=["single"])


class _TwoArgumentError(Exception):
    """Pickles, but does not unpickle (its __init__ wants two arguments)."""

    def __init__(self, a, b):
        super().__init__(f"broken {a} {b}")


def test_an_exception_that_cannot_travel_reaches_the_parent_as_text(monkeypatch):
    """The heat map's process sends an exception only if it survives a pickle round trip;
    otherwise a WorkerError with its type and message (never a TypeError on receipt)."""
    import multiprocessing

    import torch

    import experiments.runner as runner
    from agt.errors import WorkerError

    def fail(*args, **kwargs):
        raise _TwoArgumentError(1, 2)

    monkeypatch.setattr(runner, "load_plan", fail)
    parent, child = multiprocessing.Pipe(duplex=False)
    args = dict(path="plan.yaml", quick=False, dataset="blobs", out="unused", data_dir=None,
                seed=None, device="cpu", threads=None)
    runner._detached_main(child, ["heatmap"], args, torch.get_num_threads())
    kind, exc, tb = parent.recv()
    assert kind == "error" and isinstance(exc, WorkerError)
    assert "_TwoArgumentError: broken 1 2" in str(exc) and "_TwoArgumentError" in tb


def test_heatmap_process_failure_reaches_the_parent(tmp_path, capsys):
    """An error raised in the heat map's process is raised again in the parent with the
    child's traceback (the CLI's usual error exit), after the other experiments ran."""
    bad = write_plan(tmp_path / "bad_model.yaml", {
        **yaml.safe_load((CONFIGS / "blobs_mlp.yaml").read_text()),
        "model": [{"linear": {"in": 5, "out": 2}}]})      # blobs features are 6-wide
    plan = write_plan(tmp_path / "plan.yaml", {
        **BLOBS_TINY, "experiments": ["heatmap", "kgrid"],
        "settings": {**BLOBS_TINY["settings"],
                     "heatmap": {**BLOBS_TINY["settings"]["heatmap"],
                                 "train_config": str(bad)}}})
    rc, _, err = run_cli(["reproduce", "blobs", "--plan", str(plan), "--out",
                          str(tmp_path / "out"), "--quiet", "--workers", "2",
                          "--threads", "1"], capsys)
    assert rc != 0 and "feature" in err.lower()
    assert (tmp_path / "out" / "blobs" / "kgrid" / "results.json").is_file()
    assert not (tmp_path / "out" / "blobs" / "summary.md").exists()


# ------------------------------------------------------------------------------------------
# OctMNIST and IMDB pipelines on generated files

# A narrower network than configs/octmnist.yaml (same layer kinds, same frozen prefix of 5
# layers) keeps the test fast; the pipeline code is the same.
SMALL_OCT_MODEL = [
    {"conv2d": {"in": 1, "out": 4, "kernel": 4, "stride": 2}}, {"relu": {}},
    {"conv2d": {"in": 4, "out": 8, "kernel": 4, "stride": 1}}, {"relu": {}}, {"flatten": {}},
    {"linear": {"in": 800, "out": 8}}, {"relu": {}}, {"linear": {"in": 8, "out": 1}},
]

PIPELINE_SETTINGS = {
    "single": {"epsilons": [0.1, 1.0, 10.0], "repeats": 2},
    "ensembles": {"teachers": [1, 2], "epsilons": [1.0], "repeats": 2},
    "budget": {"queries": [2, 20], "teachers": 2, "repeats": 2, "accountants": ["best"],
               "dpsgd": DPSGD_TINY, "dpsgd_seeds": 1},
    "kgrid": {"sizes": [1, 3], "epsilons": [1.0]},
    "teacher": {"n_public": [10], "main": 10, "teachers": 2, "repeats": 1,
                "dpsgd": DPSGD_TINY, "dpsgd_seeds": 1},
}


def test_octmnist_pipeline_end_to_end(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    write_fake_octmnist(data, n_train=400, n_val=20, n_test=120, seed=1)
    plan = write_plan(tmp_path / "plan.yaml", {
        "dataset": "octmnist", "train_config": str(CONFIGS / "octmnist.yaml"),
        "train_overrides": {"model": SMALL_OCT_MODEL, "k_values": "0..3", "n_epochs": 2},
        "experiments": ["single", "ensembles", "budget", "kgrid", "teacher"],
        "pipeline": {"max_train": 60, "max_public": 150, "pretrain_epochs": 2,
                     "pretrain_batch_size": 50},
        "settings": PIPELINE_SETTINGS})
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(["reproduce", "octmnist", "--plan", str(plan), "--data-dir",
                             str(data), "--out", str(out), "--quiet"], capsys)
    assert rc == 0, stderr
    pre = out / "octmnist" / "pipeline" / "octmnist_pretrained.pt"
    assert pre.is_file()
    body = load(out, "octmnist", "single")
    info = body["data"]
    assert info["n_train"] == 60                                 # max_train, stratified
    assert info["meta"]["train_class_counts"] == {"drusen": 100, "normal": 100}
    stats = info["pretraining"]
    assert stats["epochs"] == 2 and stats["public_records"] == 150
    assert stats["excluded_private_records"] > 0                 # private normals left out
    assert 0 <= stats["private_test_accuracy_before_finetuning"] <= 1
    assert body["train_config"]["pretrained"].endswith("octmnist_pretrained.pt")
    assert body["train_config"]["frozen_layers"] == 5
    # queries: the drusen test images only (label 1 = abnormal)
    assert body["results"]["n_queries"] == 30
    for name in ("ensembles", "budget", "kgrid", "teacher"):
        load(out, "octmnist", name)


def test_imdb_pipeline_end_to_end(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    write_fake_imdb_embeddings(data, n_train=300, n_test=80, seed=2)
    plan = write_plan(tmp_path / "plan.yaml", {
        "dataset": "imdb", "train_config": str(CONFIGS / "imdb.yaml"),
        "train_overrides": {"k_values": "0..3,10", "n_epochs": 1},
        "experiments": ["single", "ensembles", "budget", "kgrid", "teacher"],
        "pipeline": {"max_train": 200},
        "settings": PIPELINE_SETTINGS})
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(["reproduce", "imdb", "--plan", str(plan), "--data-dir",
                             str(data), "--out", str(out), "--quiet"], capsys)
    assert rc == 0, stderr
    single = load(out, "imdb", "single")
    assert single["data"]["n_train"] == 200 and single["results"]["n_queries"] == 80
    assert single["results"]["radius"]["contiguous_grid"] is False   # sparse: index radius
    assert single["results"]["nonprivate_accuracy"] > 0.6            # learnable fake data
    kg = load(out, "imdb", "kgrid")["results"]
    assert kg["trained_grid"]["k_values"] == [0, 10, 5]
    for name in ("ensembles", "budget", "teacher"):
        load(out, "imdb", name)


# ------------------------------------------------------------------------------------------
# Errors

@pytest.mark.parametrize("dataset, file, hint", [
    ("octmnist", "octmnist.npz", "medmnist"),
    ("imdb", "imdb_embeddings.npz", "GPT-2"),
])
def test_missing_data_dir_is_a_one_line_error(tmp_path, capsys, dataset, file, hint):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    rc, stdout, stderr = run_cli(["reproduce", dataset, "--quick", "--data-dir", str(empty),
                                  "--out", str(out), "--quiet"], capsys)
    assert rc != 0
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("agt: error:")
    assert file in lines[0] and hint.lower() in lines[0].lower()
    assert "--data-dir" in lines[0]
    assert not (out / dataset).exists()          # failed before any work


def test_bad_arguments(tmp_path, capsys):
    rc, _, err = run_cli(["reproduce", "blobs", "--only", "single,nope", "--out",
                          str(tmp_path)], capsys)
    assert rc == 2 and "nope" in err
    bad = write_plan(tmp_path / "bad.yaml", {**BLOBS_TINY, "settings": {
        "single": {"repeats": 2, "epsilon": [1.0]}}})
    rc, _, err = run_cli(["reproduce", "blobs", "--plan", str(bad), "--out", str(tmp_path)],
                         capsys)
    assert rc == 2 and "epsilon" in err and "settings.single" in err
    rc, _, err = run_cli(["reproduce", "imdb", "--plan", str(default_plan_path("blobs")),
                          "--out", str(tmp_path)], capsys)
    assert rc == 2 and "not 'imdb'" in err


# ------------------------------------------------------------------------------------------
# Plans

@pytest.mark.parametrize("dataset", ["blobs", "octmnist", "imdb"])
@pytest.mark.parametrize("quick", [False, True])
def test_shipped_plans_load(dataset, quick):
    plan = load_plan(default_plan_path(dataset), quick=quick, dataset=dataset)
    assert plan.train_config.is_file()
    assert set(plan.experiments) <= set(EXPERIMENTS)
    if dataset == "blobs":
        assert plan.experiments == tuple(ALL)
        single = plan.settings["single"]
        assert len(single.epsilons) == 20
        assert (single.epsilons[0] == pytest.approx(0.01)
                and single.epsilons[-1] == pytest.approx(10))
        assert plan.settings["budget"].epsilon_total == 10.0
        assert plan.settings["budget"].delta_total == 1e-5
        assert plan.settings["budget"].teachers == 25
        assert plan.settings["single"].repeats == (5 if quick else 10)
    json.dumps(plan.to_json_dict())


def test_epsilon_grid():
    g = epsilon_grid({"logspace": [0.01, 10.0, 20]}, "x")
    assert len(g) == 20 and math.isclose(g[0], 0.01) and math.isclose(g[-1], 10.0)
    assert epsilon_grid([1, "0.1"], "x") == (1.0, 0.1)
    for bad in ([], [0.0], {"logspace": [1, 0.1, 5]}, {"linspace": [1, 2, 3]}, "1"):
        with pytest.raises(ConfigError):
            epsilon_grid(bad, "x")
