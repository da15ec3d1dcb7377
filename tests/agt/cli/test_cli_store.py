"""The `agt` CLI (train / inspect / certify) end to end on tiny blobs, and the HDF5 bundle
reader (agt/store.py): round trip, validation, and one-line refusals that leave no output."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from agt.certify import Certifier
from agt.cli import main
from agt.config import load_config
from agt.data import load_dataset
from agt.errors import AGTError, BundleError
from agt.store import FORMAT, FORMAT_VERSION, from_result, read_bundle, write_bundle
from agt.training import train
from tests.helpers import restamp

BLOBS_OPTS = {"n_samples": 400, "test_fraction": 0.25, "seed": 0}
N_TRAIN = 300
N_EPOCHS = 2

CONFIG = """\
model: [{linear: {in: 6, out: 2}}]
loss: cross_entropy
data: {name: blobs, n_samples: 400, test_fraction: 0.25, seed: 0}
learning_rate: 0.5
n_epochs: 2
batch_size: 100
clip_gamma: 0.1
seed: 3
k_values: "0..5"
device: cpu
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_cli_error(rc: int, err: str, outdir: Path | None = None, contains: str = "") -> str:
    """Exit 2, exactly one stderr line 'agt: error: ...', and nothing left in outdir."""
    assert rc == 2, f"exit status {rc}, stderr {err!r}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"stderr is not one line: {err!r}"
    assert lines[0].startswith("agt: error: "), lines[0]
    if contains:
        assert contains in lines[0], lines[0]
    if outdir is not None:
        left = sorted(p.name for p in outdir.rglob("*"))
        assert left == [], f"files left behind: {left}"
    return lines[0]


@pytest.fixture(scope="module")
def blobs():
    return load_dataset("blobs", BLOBS_OPTS)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One `agt train` run through the CLI (module scope: the expensive part)."""
    d = tmp_path_factory.mktemp("trained")
    cfg = write(d / "tiny.yaml", CONFIG)
    out = d / "bundles" / "tiny.h5"
    rc = main(["train", "--config", str(cfg), "--out", str(out), "--quiet"])
    assert rc == 0
    return cfg, out


@pytest.fixture(scope="module")
def queries(tmp_path_factory, blobs):
    d = tmp_path_factory.mktemp("queries")
    path = d / "queries.npz"
    np.savez(path, x_test=blobs.x_test, y_test=blobs.y_test)
    return path


@pytest.fixture()
def outdir(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d


def tampered(src: Path, dst: Path, edit, stamp: bool = True) -> Path:
    """A copy of a bundle edited by `edit`; with `stamp` its content hash is recomputed, so
    that the checks behind the hash are what a test meets (without it, every edit is caught
    by the hash: test_content_hash_catches_every_edit)."""
    shutil.copy(src, dst)
    with h5py.File(dst, "a") as f:
        edit(f)
    if stamp:
        try:
            restamp(dst)
        except (KeyError, ValueError, TypeError):    # structurally broken: nothing to stamp
            pass
    return dst


def read_error(path) -> str:
    with pytest.raises(BundleError) as info:
        read_bundle(path)
    msg = str(info.value)
    assert "\n" not in msg, f"not one line: {msg!r}"
    return msg


# ------------------------------------------------------------------------------------------
# agt train / inspect / certify: the happy path
# ------------------------------------------------------------------------------------------
def test_train_writes_bundle(tmp_path, capsys):
    cfg = write(tmp_path / "tiny.yaml", CONFIG)
    out = tmp_path / "b" / "tiny.h5"
    rc, stdout, err = run_cli(capsys, "train", "--config", cfg, "--out", out, "--quiet")
    assert rc == 0, err
    assert out.is_file()
    assert not list(out.parent.glob("*.partial"))
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny.h5"]
    assert f"bundle: {out}" in stdout
    assert "6 k values (0..5)" in stdout and "n=300" in stdout
    assert "certified fraction" in stdout
    with h5py.File(out, "r") as f:
        assert f.attrs["format"] == FORMAT
        assert int(f.attrs["format_version"]) == FORMAT_VERSION
        assert list(f.attrs["k_values"]) == [0, 1, 2, 3, 4, 5]
        assert set(f["bounds"].keys()) == {str(k) for k in range(6)}
        assert set(f["nominal"].keys()) == {"0.weight", "0.bias"}
        assert set(f["init"].keys()) == {"0.weight", "0.bias"}
        assert f["bounds/3/lower/0.weight"].dtype == np.float64
        assert json.loads(f.attrs["config"])["k_values"] == [0, 1, 2, 3, 4, 5]
        assert json.loads(f.attrs["model"])["input_shape"] == [6]


@pytest.mark.parametrize("clip", [None, 0.3])
def test_stability_bundle_from_a_yaml_config(tmp_path, capsys, clip):
    """bound_method stability with minibatches and k_boxes: ball, end to end through the
    CLI: train writes the radii, inspect shows them and the domain, certify reads them; with
    per-record clipping (clip_norm) too."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 3))
    x *= np.minimum(1.0, 0.999 / np.linalg.norm(x, axis=1, keepdims=True))
    y = (x[:, 0] > 0).astype(np.int64)
    data = tmp_path / "ball.npz"
    np.savez(data, x_train=x[:100], y_train=y[:100], x_test=x[100:], y_test=y[100:])
    cfg = write(tmp_path / "s.yaml", """\
model: [{linear: {in: 3, out: 2}}]
loss: cross_entropy
data: {name: npz, path: ball.npz}
learning_rate: 0.5
n_epochs: 3
batch_size: 25
clip_gamma: 1.0
bound_method: stability
input_norm_bound: 1.0
k_boxes: ball
k_values: "0..4"
device: cpu
""" + ("" if clip is None else f"clip_norm: {clip}\n"))
    out = tmp_path / "s.h5"
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", out, "--quiet")
    assert rc == 0, err
    b = read_bundle(out)
    assert b.bound_method == "stability" and b.relations == ("replace-one",)
    assert b.ball_radius[0] == 0 and bool((np.diff(b.ball_radius) > 0).all())
    rc, stdout, err = run_cli(capsys, "inspect", out)
    assert rc == 0, err
    assert "input_norm_bound=1.0, k_boxes=ball" in stdout and "L2 ball rho_k" in stdout
    assert ("clip_norm=0.3" in stdout) == (clip is not None)
    res = tmp_path / "c.json"
    rc, _, err = run_cli(capsys, "certify", "--bounds", out, "--data", data, "--split", "test",
                         "--out", res)
    assert rc == 0, err
    radii = [row["max_certified_k"] for row in json.loads(res.read_text())["queries"]]
    assert len(radii) == 20 and min(radii) >= 0 and max(radii) >= 1


def test_train_k_values_override_sparse(tmp_path, capsys, queries):
    cfg = write(tmp_path / "tiny.yaml", CONFIG)
    out = tmp_path / "sparse.h5"
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", out, "--quiet",
                         "--k-values", "0,1,3")
    assert rc == 0, err
    b = read_bundle(out)
    assert b.k_values == (0, 1, 3)
    # sparse grid: the smooth radius is the grid index of the largest certified value
    res = tmp_path / "sparse.json"
    rc, stdout, err = run_cli(capsys, "certify", "--bounds", out, "--data", queries, "--out", res)
    assert rc == 0, err
    doc = json.loads(res.read_text())
    assert doc["contiguous_grid"] is False and doc["k_values"] == [0, 1, 3]
    for row in doc["queries"]:
        if row["max_certified_k"] >= 0:
            assert row["smooth_radius"] == b.k_values.index(row["max_certified_k"])
        else:
            assert row["smooth_radius"] == 0
    assert "sparse" in stdout


def test_train_with_npz_data(tmp_path, capsys, blobs):
    data = tmp_path / "d.npz"
    np.savez(data, x_train=blobs.x_train, y_train=blobs.y_train)
    cfg = write(tmp_path / "tiny.yaml", CONFIG)
    out = tmp_path / "npz.h5"
    rc, stdout, err = run_cli(capsys, "train", "--config", cfg, "--data", data, "--out", out,
                              "--quiet")
    assert rc == 0, err
    b = read_bundle(out)
    assert b.dataset_sha256 == blobs.sha256()
    assert b.n_train == N_TRAIN
    assert b.config["data"]["name"] == "npz"


def test_inspect_prints_metadata(trained, capsys, blobs):
    _, bundle = trained
    rc, stdout, err = run_cli(capsys, "inspect", bundle)
    assert rc == 0, err
    assert f"bundle: {bundle}" in stdout
    assert f"dataset_sha256 {blobs.sha256()}" in stdout
    assert "relations: replace-one" in stdout
    assert "k_values: 6 values, 0..5 (contiguous)" in stdout
    assert f"n_train {N_TRAIN}" in stdout and "dtype float64" in stdout
    assert '"input_shape": [6]' in stdout
    assert "learning_rate=0.5" in stdout and "batch_size=100" in stdout
    assert "0.weight" in stdout and "0.bias" in stdout


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_certify_writes_rows_and_summary(trained, queries, blobs, tmp_path, capsys, suffix):
    _, bundle = trained
    out = tmp_path / "res" / f"cert{suffix}"
    rc, stdout, err = run_cli(capsys, "certify", "--bounds", bundle, "--data", queries,
                              "--out", out)
    assert rc == 0, err
    assert out.is_file() and not list(out.parent.glob("*.partial"))
    if suffix == ".csv":
        with open(out, newline="") as fh:
            reader = csv.DictReader(fh)
            assert reader.fieldnames == ["index", "prediction", "max_certified_k",
                                         "smooth_radius"]
            rows = [{k: int(v) for k, v in r.items()} for r in reader]
    else:
        doc = json.loads(out.read_text())
        assert doc["k_values"] == [0, 1, 2, 3, 4, 5] and doc["contiguous_grid"] is True
        assert doc["bundle"] == str(bundle)
        rows = doc["queries"]
        assert set(rows[0]) == {"index", "prediction", "max_certified_k", "smooth_radius"}
    assert len(rows) == blobs.n_test
    assert [r["index"] for r in rows] == list(range(blobs.n_test))
    # rows agree with the library certifier
    cert = Certifier(read_bundle(bundle)).certify(blobs.x_test)
    assert [r["prediction"] for r in rows] == cert.prediction.tolist()
    assert [r["max_certified_k"] for r in rows] == cert.max_certified_k.tolist()
    assert [r["smooth_radius"] for r in rows] == cert.radius.tolist()
    for r in rows:
        assert r["prediction"] in (0, 1)
        assert r["max_certified_k"] in (-1, 0, 1, 2, 3, 4, 5)
        assert r["smooth_radius"] == max(r["max_certified_k"], 0)       # contiguous grid
    # summary on stdout
    assert f"certified {blobs.n_test} queries" in stdout
    assert "nominal accuracy:" in stdout
    acc = float(stdout.split("nominal accuracy:")[1].split()[0])
    assert acc == pytest.approx(float((cert.prediction == blobs.y_test).mean()), abs=1e-4)
    for k in range(6):
        assert f"k={k:<6d} certified fraction" in stdout
    assert f"wrote {out}" in stdout


def test_certify_trajectory(trained, queries, blobs, tmp_path, capsys):
    """--trajectory reloads the training data the bundle's config names and re-runs the
    interval pass; rows match the library's certifier with TrajectoryBounds."""
    from agt.trajectory import TrajectoryBounds
    _, bundle = trained
    out = tmp_path / "traj.json"
    rc, stdout, err = run_cli(capsys, "certify", "--bounds", bundle, "--data", queries,
                              "--out", out, "--trajectory")
    assert rc == 0, err
    doc = json.loads(out.read_text())
    assert doc["trajectory"] is True and doc["relations"] == ["replace-one"]
    b = read_bundle(bundle)
    cert = Certifier(b, trajectory=TrajectoryBounds(b, blobs)).certify(blobs.x_test)
    assert [r["max_certified_k"] for r in doc["queries"]] == cert.max_certified_k.tolist()
    box = Certifier(b).certify(blobs.x_test)
    assert (cert.max_certified_k >= box.max_certified_k).all()


def test_certify_unlabelled_queries(trained, blobs, tmp_path, capsys):
    _, bundle = trained
    q = tmp_path / "x.npz"
    np.savez(q, x=blobs.x_test[:7])
    out = tmp_path / "c.csv"
    rc, stdout, err = run_cli(capsys, "certify", "--bounds", bundle, "--data", q, "--out", out)
    assert rc == 0, err
    assert len(out.read_text().strip().splitlines()) == 1 + 7
    assert "nominal accuracy" not in stdout


# ------------------------------------------------------------------------------------------
# bundle round trip
# ------------------------------------------------------------------------------------------
def test_bundle_round_trip(trained, blobs):
    cfg_path, bundle_path = trained
    b = read_bundle(bundle_path)
    assert b.path == Path(bundle_path)
    assert b.k_values == (0, 1, 2, 3, 4, 5)
    assert b.relations == ("replace-one",)             # mini-batches: replace-one only
    assert b.dtype == "float64" and b.n_train == N_TRAIN
    assert b.dataset_sha256 == blobs.sha256()
    assert b.spec.input_shape == (6,)
    assert b.config["batch_size"] == 100 and b.config["k_values"] == list(range(6))
    # /order: (epochs, n), each row a permutation of the record indices
    assert b.order.shape == (N_EPOCHS, N_TRAIN)
    for row in b.order:
        assert np.array_equal(np.sort(row), np.arange(N_TRAIN))
    assert not np.array_equal(b.order[0], b.order[1])
    # parameters and bounds
    assert set(b.nominal) == set(b.init) == set(b.lower) == set(b.upper) == {"0.weight", "0.bias"}
    for name, nom in b.nominal.items():
        lo, hi = b.lower[name], b.upper[name]
        assert lo.shape == hi.shape == (6, *nom.shape)
        assert lo.dtype == hi.dtype == torch.float64
        assert bool(((lo <= nom) & (nom <= hi)).all())
        assert bool((lo[1:] <= lo[:-1]).all()) and bool((hi[1:] >= hi[:-1]).all())  # nested
        assert bool((hi[-1] - lo[-1] > 0).all())
        assert not torch.equal(nom, b.init[name])         # training moved the parameters
    # the bundle holds exactly what train() computes (deterministic, seeded)
    result = train(load_config(cfg_path), blobs)
    for name in b.nominal:
        assert torch.equal(b.nominal[name], result.nominal[name].cpu())
        assert torch.equal(b.init[name], result.init[name].cpu())
        assert torch.equal(b.lower[name], result.lower[name].cpu())
        assert torch.equal(b.upper[name], result.upper[name].cpu())
    assert np.array_equal(b.order, result.order)


def test_write_read_bundle_api(tmp_path, blobs):
    cfg = load_config(write(tmp_path / "c.yaml", CONFIG)).replace(batch_size="full",
                                                                  k_values="0..3")
    result = train(cfg, blobs)
    bundle = from_result(result)
    path = write_bundle(bundle, tmp_path / "deep" / "api.h5")
    assert path.is_file() and bundle.path == path
    assert sorted(p.name for p in path.parent.iterdir()) == ["api.h5"]
    back = read_bundle(path)
    assert back.k_values == (0, 1, 2, 3)
    assert back.relations == ("replace-one", "add-remove")   # full batch certifies both
    assert back.order.shape == (N_EPOCHS, N_TRAIN)
    assert back.bundle_id == bundle.bundle_id
    for name in bundle.nominal:
        assert torch.equal(back.nominal[name], bundle.nominal[name])
        assert torch.equal(back.lower[name], bundle.lower[name])
        assert torch.equal(back.upper[name], bundle.upper[name])


def test_from_result_without_bounds_refused(blobs, tmp_path):
    cfg = load_config(write(tmp_path / "c.yaml", CONFIG))
    result = train(cfg, blobs, with_bounds=False)
    with pytest.raises(BundleError):
        from_result(result)


# ------------------------------------------------------------------------------------------
# the reader refuses broken bundles, with one-line BundleErrors
# ------------------------------------------------------------------------------------------
def test_read_missing_file(tmp_path):
    assert "not found" in read_error(tmp_path / "missing.h5")


def test_read_not_hdf5(tmp_path):
    p = tmp_path / "not.h5"
    p.write_text("this is not an HDF5 file\n")
    assert "HDF5" in read_error(p)


def test_read_truncated_hdf5(trained, tmp_path):
    data = trained[1].read_bytes()
    p = tmp_path / "trunc.h5"
    p.write_bytes(data[: len(data) // 2])
    read_error(p)


def test_read_wrong_format(trained, tmp_path):
    p = tampered(trained[1], tmp_path / "fmt.h5", lambda f: f.attrs.__setitem__("format", "other"))
    msg = read_error(p)
    assert "format" in msg and "other" in msg


def test_read_hdf5_without_format(tmp_path):
    p = tmp_path / "plain.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("x", data=np.arange(3))
    assert "format" in read_error(p)


def test_read_wrong_version(trained, tmp_path):
    p = tampered(trained[1], tmp_path / "ver.h5",
                 lambda f: f.attrs.__setitem__("format_version", FORMAT_VERSION + 1))
    msg = read_error(p)
    assert "format_version" in msg and str(FORMAT_VERSION + 1) in msg


def test_read_missing_bounds_k(trained, tmp_path):
    p = tampered(trained[1], tmp_path / "nok.h5", lambda f: f["bounds"].__delitem__("3"))
    assert "/bounds/3" in read_error(p)


def test_read_missing_parameter(trained, tmp_path):
    p = tampered(trained[1], tmp_path / "nop.h5", lambda f: f["nominal"].__delitem__("0.bias"))
    assert "0.bias" in read_error(p)


def test_read_extra_parameter(trained, tmp_path):
    p = tampered(trained[1], tmp_path / "extra.h5",
                 lambda f: f["bounds/2/upper"].create_dataset("9.weight", data=np.zeros(2)))
    assert "9.weight" in read_error(p)


def test_read_missing_group(trained, tmp_path):
    p = tampered(trained[1], tmp_path / "noinit.h5", lambda f: f.__delitem__("init"))
    assert "/init" in read_error(p)


def test_read_bad_k_values(trained, tmp_path):
    p = tampered(trained[1], tmp_path / "kv.h5",
                 lambda f: f.attrs.__setitem__("k_values", np.array([1, 0, 2], dtype=np.int64)))
    assert "k_values" in read_error(p)


def test_read_nominal_outside_bounds(trained, tmp_path):
    def edit(f):
        nom = np.asarray(f["nominal/0.weight"])
        f["bounds/2/upper/0.weight"][...] = nom - 1.0
        for k in (3, 4, 5):   # keep the boxes nested, so only containment fails
            f[f"bounds/{k}/upper/0.weight"][...] = np.maximum(
                np.asarray(f[f"bounds/{k}/upper/0.weight"]), nom - 1.0)
    p = tampered(trained[1], tmp_path / "out.h5", edit)
    msg = read_error(p)
    assert "outside" in msg and "0.weight" in msg and "k=2" in msg


def test_read_nan_in_bounds(trained, tmp_path):
    def edit(f):
        arr = np.asarray(f["bounds/1/lower/0.bias"])
        arr[0] = np.nan
        f["bounds/1/lower/0.bias"][...] = arr
    p = tampered(trained[1], tmp_path / "nan.h5", edit)
    assert "NaN" in read_error(p)


def test_read_wrong_parameter_shape(trained, tmp_path):
    def edit(f):
        del f["nominal/0.weight"]
        f["nominal"].create_dataset("0.weight", data=np.zeros((3, 6)))
    p = tampered(trained[1], tmp_path / "shape.h5", edit)
    msg = read_error(p)
    assert "0.weight" in msg and "shape" in msg and "(2, 6)" in msg


def test_read_wrong_bound_shape(trained, tmp_path):
    def edit(f):
        del f["bounds/4/lower/0.bias"]
        f["bounds/4/lower"].create_dataset("0.bias", data=np.zeros(3))
    p = tampered(trained[1], tmp_path / "bshape.h5", edit)
    assert "0.bias" in read_error(p)


def test_read_non_nested_bounds(trained, tmp_path):
    def edit(f):
        # widen k = 2 beyond k = 3: still sound for the nominal, but not nested in k
        f["bounds/2/lower/0.bias"][...] = np.asarray(f["bounds/2/lower/0.bias"]) - 1.0
    p = tampered(trained[1], tmp_path / "nest.h5", edit)
    msg = read_error(p)
    assert "nested" in msg and "0.bias" in msg


def test_read_malformed_model_attr(trained, tmp_path):
    p = tampered(trained[1], tmp_path / "model.h5",
                 lambda f: f.attrs.__setitem__("model", '{"layers": [{"conv3d": {}}]}'))
    assert "model" in read_error(p)


def test_read_non_integer_version_is_bundle_error(trained, tmp_path):
    p = tampered(trained[1], tmp_path / "verstr.h5",
                 lambda f: f.attrs.__setitem__("format_version", "one"))
    read_error(p)


def test_read_bounds_k_not_a_group_is_bundle_error(trained, tmp_path):
    def edit(f):
        del f["bounds/1"]
        f["bounds"].create_dataset("1", data=np.zeros(2))
    read_error(tampered(trained[1], tmp_path / "grp.h5", edit))


def test_cli_certify_unknown_dtype(trained, queries, tmp_path, outdir, capsys):
    p = tampered(trained[1], tmp_path / "dt.h5", lambda f: f.attrs.__setitem__("dtype", "float16"))
    rc, _, err = run_cli(capsys, "certify", "--bounds", p, "--data", queries,
                         "--out", outdir / "c.csv")
    assert_cli_error(rc, err, outdir)


# ------------------------------------------------------------------------------------------
# CLI bad input: exit 2, one stderr line, no output (nor *.partial) left behind
# ------------------------------------------------------------------------------------------
def test_cli_train_malformed_yaml(tmp_path, outdir, capsys):
    cfg = write(tmp_path / "bad.yaml", CONFIG + "seed: 0\n  k_values: : 3\n")
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", outdir / "b.h5", "--quiet")
    line = assert_cli_error(rc, err, outdir, "malformed YAML")
    assert "line 12" in line


def test_cli_train_missing_config(tmp_path, outdir, capsys):
    rc, _, err = run_cli(capsys, "train", "--config", tmp_path / "nope.yaml",
                         "--out", outdir / "b.h5", "--quiet")
    assert_cli_error(rc, err, outdir, "not found")


def test_cli_train_unknown_layer(tmp_path, outdir, capsys):
    cfg = write(tmp_path / "c.yaml", CONFIG.replace("linear: {in: 6, out: 2}",
                                                    "conv3d: {in: 6, out: 2}"))
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", outdir / "b.h5", "--quiet")
    line = assert_cli_error(rc, err, outdir, "conv3d")
    assert "linear" in line and "conv2d" in line


def test_cli_train_unknown_key(tmp_path, outdir, capsys):
    cfg = write(tmp_path / "c.yaml", CONFIG + "epochs: 4\n")
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", outdir / "b.h5", "--quiet")
    assert_cli_error(rc, err, outdir, "epochs")


def test_cli_train_k_larger_than_batch(tmp_path, outdir, capsys):
    cfg = write(tmp_path / "c.yaml", CONFIG.replace('"0..5"', '"0..500"'))
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", outdir / "b.h5", "--quiet")
    assert_cli_error(rc, err, outdir, "batch")


def test_cli_train_k_override_larger_than_batch(tmp_path, outdir, capsys):
    cfg = write(tmp_path / "c.yaml", CONFIG)
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", outdir / "b.h5", "--quiet",
                         "--k-values", "0..500")
    assert_cli_error(rc, err, outdir, "500")


def test_cli_train_bad_k_override(tmp_path, outdir, capsys):
    cfg = write(tmp_path / "c.yaml", CONFIG)
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", outdir / "b.h5", "--quiet",
                         "--k-values", "0..x")
    assert_cli_error(rc, err, outdir, "k_values")


def test_cli_train_nan_in_data(tmp_path, outdir, capsys, blobs):
    x = blobs.x_train.copy()
    x[17, 3] = np.nan
    data = tmp_path / "nan.npz"
    np.savez(data, x_train=x, y_train=blobs.y_train)
    cfg = write(tmp_path / "c.yaml", CONFIG)
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--data", data,
                         "--out", outdir / "b.h5", "--quiet")
    line = assert_cli_error(rc, err, outdir, "NaN")
    assert "17" in line


def test_cli_train_missing_data_file(tmp_path, outdir, capsys):
    cfg = write(tmp_path / "c.yaml", CONFIG)
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--data", tmp_path / "none.npz",
                         "--out", outdir / "b.h5", "--quiet")
    assert_cli_error(rc, err, outdir)


def test_cli_train_wrong_feature_dimension(tmp_path, outdir, capsys):
    cfg = write(tmp_path / "c.yaml", CONFIG.replace("in: 6", "in: 5"))
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", outdir / "b.h5", "--quiet")
    assert_cli_error(rc, err, outdir, "model[0]")


def test_cli_train_npz_wrong_feature_dimension(tmp_path, outdir, capsys, blobs):
    data = tmp_path / "d.npz"
    np.savez(data, x_train=blobs.x_train[:, :4], y_train=blobs.y_train)
    cfg = write(tmp_path / "c.yaml", CONFIG)
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--data", data,
                         "--out", outdir / "b.h5", "--quiet")
    assert_cli_error(rc, err, outdir, "(4,)")


def test_cli_train_bce_with_two_logits(tmp_path, outdir, capsys):
    cfg = write(tmp_path / "c.yaml", CONFIG.replace("cross_entropy", "binary_cross_entropy"))
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", outdir / "b.h5", "--quiet")
    assert_cli_error(rc, err, outdir, "binary_cross_entropy")


def test_cli_train_impossible_value(tmp_path, outdir, capsys):
    cfg = write(tmp_path / "c.yaml", CONFIG.replace("clip_gamma: 0.1", "clip_gamma: -0.1"))
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", outdir / "b.h5", "--quiet")
    assert_cli_error(rc, err, outdir, "clip_gamma")


@pytest.mark.parametrize("command", ["inspect", "certify"])
@pytest.mark.parametrize("kind", ["text", "truncated", "missing", "wrong-format"])
def test_cli_unreadable_bundle(trained, queries, tmp_path, outdir, capsys, command, kind):
    bad = tmp_path / "bad.h5"
    if kind == "text":
        bad.write_text("not hdf5")
    elif kind == "truncated":
        bad.write_bytes(trained[1].read_bytes()[:1000])
    elif kind == "wrong-format":
        tampered(trained[1], bad, lambda f: f.attrs.__setitem__("format", "nope"))
    if command == "inspect":
        rc, stdout, err = run_cli(capsys, "inspect", bad)
        assert stdout == ""
    else:
        rc, _, err = run_cli(capsys, "certify", "--bounds", bad, "--data", queries,
                             "--out", outdir / "c.csv")
    assert_cli_error(rc, err, outdir)


def test_cli_certify_tampered_bundle(trained, queries, tmp_path, outdir, capsys):
    def edit(f):
        f["bounds/2/lower/0.bias"][...] = np.asarray(f["bounds/2/lower/0.bias"]) - 1.0
    bad = tampered(trained[1], tmp_path / "nest.h5", edit)
    rc, _, err = run_cli(capsys, "certify", "--bounds", bad, "--data", queries,
                         "--out", outdir / "c.json")
    assert_cli_error(rc, err, outdir, "nested")


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_cli_certify_wrong_feature_dimension(trained, blobs, tmp_path, outdir, capsys, suffix):
    q = tmp_path / "q5.npz"
    np.savez(q, x_test=blobs.x_test[:, :5], y_test=blobs.y_test)
    rc, _, err = run_cli(capsys, "certify", "--bounds", trained[1], "--data", q,
                         "--out", outdir / f"c{suffix}")
    assert_cli_error(rc, err, outdir, "feature shape")


@pytest.mark.parametrize("bad_value", [np.nan, np.inf])
def test_cli_certify_nan_queries(trained, blobs, tmp_path, outdir, capsys, bad_value):
    x = blobs.x_test.copy()
    x[4, 0] = bad_value
    q = tmp_path / "qnan.npz"
    np.savez(q, x_test=x, y_test=blobs.y_test)
    rc, _, err = run_cli(capsys, "certify", "--bounds", trained[1], "--data", q,
                         "--out", outdir / "c.csv")
    line = assert_cli_error(rc, err, outdir, "NaN")
    assert "record 4" in line


def test_cli_certify_missing_queries(trained, tmp_path, outdir, capsys):
    rc, _, err = run_cli(capsys, "certify", "--bounds", trained[1], "--data",
                         tmp_path / "none.npz", "--out", outdir / "c.csv")
    assert_cli_error(rc, err, outdir, "not found")


def test_cli_certify_queries_not_npz(trained, tmp_path, outdir, capsys):
    q = tmp_path / "q.npz"
    q.write_text("garbage")
    rc, _, err = run_cli(capsys, "certify", "--bounds", trained[1], "--data", q,
                         "--out", outdir / "c.csv")
    assert_cli_error(rc, err, outdir)


def test_cli_certify_bad_out_suffix(trained, queries, outdir, capsys):
    rc, _, err = run_cli(capsys, "certify", "--bounds", trained[1], "--data", queries,
                         "--out", outdir / "c.txt")
    assert_cli_error(rc, err, outdir, ".csv or .json")


# ------------------------------------------------------------------------------------------
# the real console script
# ------------------------------------------------------------------------------------------
def _agt_script() -> list[str]:
    exe = Path(sys.executable).parent / "agt"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("agt")
    if found:
        return [found]
    pytest.fail("the agt console script is not installed: pip install -e . provides it")


def test_console_script_train_and_inspect(tmp_path, queries):
    cfg = write(tmp_path / "tiny.yaml", CONFIG)
    out = tmp_path / "cs.h5"
    proc = subprocess.run(_agt_script() + ["train", "--config", str(cfg), "--out", str(out),
                                           "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()
    res = tmp_path / "cs.csv"
    proc = subprocess.run(_agt_script() + ["certify", "--bounds", str(out), "--data",
                                           str(queries), "--out", str(res)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert res.read_text().startswith("index,prediction,max_certified_k,smooth_radius")


def test_console_script_bad_input_exit_code(tmp_path):
    cfg = write(tmp_path / "bad.yaml", CONFIG.replace("in: 6", "in: 5"))
    outdir = tmp_path / "out"
    outdir.mkdir()
    proc = subprocess.run(_agt_script() + ["train", "--config", str(cfg),
                                           "--out", str(outdir / "b.h5"), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agt: error: ")
    assert list(outdir.iterdir()) == []
    bad = tmp_path / "x.h5"
    bad.write_text("nope")
    proc = subprocess.run(_agt_script() + ["inspect", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("agt: error: ") and proc.stderr.count("\n") == 1


def test_errors_subclass_agt_error():
    assert issubclass(BundleError, AGTError)


def test_per_epoch_placement_through_the_cli(tmp_path, capsys, blobs):
    """k_placement: per-epoch from a config file: trained, written, read back with the key
    recorded and shown by inspect, and its boxes tighter than the same run's per-batch."""
    cfg = write(tmp_path / "pe.yaml", CONFIG + "k_placement: per-epoch\n")
    out = tmp_path / "pe.h5"
    rc, _, err = run_cli(capsys, "train", "--config", cfg, "--out", out, "--quiet")
    assert rc == 0, err
    rc, stdout, err = run_cli(capsys, "inspect", out)
    assert rc == 0, err
    assert "k_placement=per-epoch" in stdout
    new = read_bundle(out)
    assert new.config["k_placement"] == "per-epoch"
    old = from_result(train(load_config(write(tmp_path / "pb.yaml", CONFIG)), blobs))
    for name in new.lower:
        assert bool((new.lower[name] >= old.lower[name] - 1e-9).all()
                    and (new.upper[name] <= old.upper[name] + 1e-9).all())
        assert float((new.upper[name] - new.lower[name])[1:].sum()) < \
            float((old.upper[name] - old.lower[name])[1:].sum())
