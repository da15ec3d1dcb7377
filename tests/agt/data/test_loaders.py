"""Tests for agt.data and tests.fakes: loaders, options, validation, hashing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from agt.data import (
    Dataset,
    blobs_features,
    load_dataset,
    load_npz_queries,
    octmnist_public_split,
    validate_dataset,
)
from agt.errors import ConfigError, DataError
from tests.fakes import write_fake_imdb_embeddings, write_fake_octmnist


@pytest.fixture(scope="module")
def oct_file(tmp_path_factory) -> Path:
    return write_fake_octmnist(tmp_path_factory.mktemp("oct") / "octmnist.npz",
                               n_train=203, n_val=41, n_test=43, seed=1)


@pytest.fixture(scope="module")
def imdb_file(tmp_path_factory) -> Path:
    return write_fake_imdb_embeddings(tmp_path_factory.mktemp("imdb") / "imdb_embeddings.npz",
                                      n_train=120, n_test=30, dim=768, seed=2)


# ---------------------------------------------------------------------------- blobs


def test_blobs_default_shapes_and_balance():
    ds = load_dataset("blobs", {})
    assert ds.x_train.shape == (5000, 6) and ds.x_test.shape == (1250, 6)
    assert ds.x_train.dtype == np.float64 and ds.y_train.dtype == np.int64
    assert ds.feature_shape == (6,) and ds.n_classes == 2
    y_all = np.concatenate([ds.y_train, ds.y_test])
    assert np.sum(y_all == 1) == np.sum(y_all == 0) == 3125
    # train split is a shuffle of both classes, roughly balanced
    assert 2300 < ds.y_train.sum() < 2700


def test_blobs_labels_follow_centres_and_features():
    ds = load_dataset("blobs", {"n_samples": 400, "seed": 3})
    x1, x2 = ds.x_train[:, 0], ds.x_train[:, 1]
    # separable: every point is on its centre's side of the line x1 + x2 = 0
    assert np.all((x1 + x2 > 0) == (ds.y_train == 1))
    np.testing.assert_allclose(ds.x_train[:, 2:4], ds.x_train[:, :2] ** 2)
    np.testing.assert_allclose(ds.x_train[:, 4:6], ds.x_train[:, :2] ** 3)
    raw = load_dataset("blobs", {"n_samples": 400, "seed": 3, "features": "raw"})
    assert raw.feature_shape == (2,)
    np.testing.assert_array_equal(raw.x_train, ds.x_train[:, :2])
    np.testing.assert_array_equal(blobs_features(raw.x_train, "cubic"), ds.x_train)


def test_blobs_variants_and_odd_size():
    sep = load_dataset("blobs", {"n_samples": 2001, "test_fraction": 0.0})
    assert sep.x_test is None and sep.n_train == 2001
    assert np.sum(sep.y_train == 1) == 1000 and np.sum(sep.y_train == 0) == 1001
    ov = load_dataset("blobs", {"variant": "overlapping", "n_samples": 4000, "features": "raw"})
    pos = ov.x_train[ov.y_train == 1]
    np.testing.assert_allclose(pos.mean(axis=0), [1.0, 1.0], atol=0.1)
    np.testing.assert_allclose(pos.std(axis=0), [0.75, 0.75], atol=0.06)


def test_blobs_deterministic_by_seed():
    a = load_dataset("blobs", {"n_samples": 300, "seed": 5})
    b = load_dataset("blobs", {"n_samples": 300, "seed": 5})
    c = load_dataset("blobs", {"n_samples": 300, "seed": 6})
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert a.sha256() == b.sha256() != c.sha256()


def test_blobs_features_rejects_bad_shape():
    with pytest.raises(DataError, match=r"\(m, 2\)"):
        blobs_features(np.zeros((4, 3)))
    with pytest.raises(ConfigError):
        blobs_features(np.zeros((4, 2)), "quadratic")


@pytest.mark.parametrize("options, key", [
    ({"n_sample": 10}, "n_sample"),
    ({"variant": "round"}, "variant"),
    ({"n_samples": "100"}, "n_samples"),
    ({"n_samples": True}, "n_samples"),
    ({"test_fraction": 1.0}, "test_fraction"),
    ({"seed": -1}, "seed"),
    ({"features": "quartic"}, "features"),
])
def test_blobs_bad_options_name_the_key(options, key):
    with pytest.raises(ConfigError, match=key):
        load_dataset("blobs", options)


def test_unknown_option_lists_allowed_ones():
    with pytest.raises(ConfigError, match=r"unknown option 'colour'.*allowed.*variant.*seed"):
        load_dataset("blobs", {"colour": "red"})


def test_unknown_dataset_name():
    with pytest.raises(ConfigError, match="blobs"):
        load_dataset("cifar10", {})   # mnist and digits are known sources now


# ---------------------------------------------------------------------------- sha256


def test_sha256_stable_and_sensitive():
    ds = load_dataset("blobs", {"n_samples": 200})
    h = ds.sha256()
    assert len(h) == 64 and h == load_dataset("blobs", {"n_samples": 200}).sha256()
    # independent of memory layout and of the test split / meta
    fortran = replace(ds, x_train=np.asfortranarray(ds.x_train), x_test=None, meta={})
    assert fortran.sha256() == h
    # one record changed: features or label
    x = ds.x_train.copy()
    x[17, 3] = np.nextafter(x[17, 3], np.inf)
    assert replace(ds, x_train=x).sha256() != h
    y = ds.y_train.copy()
    y[0] = 1 - y[0]
    assert replace(ds, y_train=y).sha256() != h
    # same bytes, different shape
    flat = replace(ds, x_train=ds.x_train.reshape(ds.n_train, 2, 3))
    assert flat.sha256() != h


# ---------------------------------------------------------------------------- validation


def _tiny(**kw) -> Dataset:
    base = dict(name="t", x_train=np.zeros((3, 2)), y_train=np.array([0, 1, 0]),
                x_test=None, y_test=None, n_classes=2)
    base.update(kw)
    return Dataset(**base)


def test_validate_reports_nan_with_split_and_index():
    x = np.zeros((5, 2))
    x[3, 1] = np.nan
    with pytest.raises(DataError, match=r"x_train.*record 3"):
        validate_dataset(_tiny(x_train=x, y_train=np.zeros(5, np.int64)))
    xt = np.zeros((2, 2))
    xt[1, 0] = np.inf
    with pytest.raises(DataError, match=r"x_test.*record 1"):
        validate_dataset(_tiny(x_test=xt, y_test=np.zeros(2, np.int64)))


def test_validate_labels_lengths_and_emptiness():
    with pytest.raises(DataError, match=r"y_train\[1\] = 2"):
        validate_dataset(_tiny(y_train=np.array([0, 2, 1])))
    with pytest.raises(DataError, match="3 records but y_train has 2"):
        validate_dataset(_tiny(y_train=np.array([0, 1])))
    with pytest.raises(DataError, match="empty"):
        validate_dataset(_tiny(x_train=np.zeros((0, 2)), y_train=np.zeros(0, np.int64)))
    with pytest.raises(DataError, match="feature shape"):
        validate_dataset(_tiny(x_test=np.zeros((2, 3)), y_test=np.zeros(2, np.int64)))
    validate_dataset(_tiny())


# ---------------------------------------------------------------------------- npz


def test_npz_round_trip_with_column_labels(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, 4)).astype(np.float32)
    y = (np.arange(30) % 3).reshape(30, 1).astype(np.uint8)
    xt = rng.standard_normal((7, 4))
    yt = np.arange(7) % 3
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=xt, y_test=yt)
    ds = load_dataset("npz", {"path": "d.npz"}, base_dir=tmp_path)
    assert ds.y_train.shape == (30,) and ds.y_train.dtype == np.int64
    np.testing.assert_array_equal(ds.y_train, y[:, 0])
    np.testing.assert_array_equal(ds.x_train, x.astype(np.float64))
    np.testing.assert_array_equal(ds.x_test, xt)
    assert ds.n_classes == 3
    assert load_dataset("npz", {"path": str(tmp_path / "d.npz"), "n_classes": 5}).n_classes == 5


def test_npz_custom_keys_and_no_test(tmp_path):
    np.savez(tmp_path / "d.npz", feats=np.ones((4, 2, 2)), labs=np.array([0, 0, 0, 0]))
    ds = load_dataset("npz", {"path": str(tmp_path / "d.npz"), "x_key": "feats", "y_key": "labs"})
    assert ds.x_test is None and ds.feature_shape == (2, 2) and ds.n_classes == 2


def test_npz_errors(tmp_path):
    with pytest.raises(ConfigError, match="path"):
        load_dataset("npz", {})
    with pytest.raises(DataError, match="not found"):
        load_dataset("npz", {"path": str(tmp_path / "nope.npz")})
    np.savez(tmp_path / "d.npz", a=np.zeros(3))
    with pytest.raises(DataError, match=r"no array 'x_train'; keys present: a"):
        load_dataset("npz", {"path": str(tmp_path / "d.npz")})
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="is not a numpy .npz archive"):
        load_dataset("npz", {"path": str(tmp_path / "junk.npz")})
    np.savez(tmp_path / "f.npz", x_train=np.ones((3, 2)), y_train=np.array([0.0, 0.5, 1.0]))
    with pytest.raises(DataError, match="not an integer"):
        load_dataset("npz", {"path": str(tmp_path / "f.npz")})


def test_npz_nan_and_feature_mismatch(tmp_path):
    x = np.ones((4, 3))
    x[2, 0] = np.nan
    np.savez(tmp_path / "nan.npz", x_train=x, y_train=np.zeros(4, int))
    with pytest.raises(DataError, match=r"x_train.*record 2"):
        load_dataset("npz", {"path": str(tmp_path / "nan.npz")})
    np.savez(tmp_path / "mm.npz", x_train=np.ones((4, 3)), y_train=np.zeros(4, int),
             x_test=np.ones((2, 4)), y_test=np.zeros(2, int))
    with pytest.raises(DataError, match=r"test features have shape \(4,\).*\(3,\)"):
        load_dataset("npz", {"path": str(tmp_path / "mm.npz")})


# ---------------------------------------------------------------------------- octmnist


def _file_labels(path: Path, split: str) -> np.ndarray:
    with np.load(path) as f:
        return f[f"{split}_labels"][:, 0].astype(int)


def test_fake_octmnist_has_medmnist_format(oct_file):
    with np.load(oct_file) as f:
        assert set(f.files) == {f"{s}_{k}" for s in ("train", "val", "test")
                                for k in ("images", "labels")}
        assert f["train_images"].shape == (203, 28, 28) and f["train_images"].dtype == np.uint8
        assert f["train_labels"].shape == (203, 1)
        assert set(np.unique(f["train_labels"])) == {0, 1, 2, 3}
        assert f["val_images"].shape == (41, 28, 28) and f["test_labels"].shape == (43, 1)


def test_fake_octmnist_classes_are_distinguishable(oct_file):
    # nearest class mean on train separates the test split well above chance (25%)
    with np.load(oct_file) as f:
        xtr = f["train_images"].reshape(-1, 784) / 255.0
        ytr = f["train_labels"][:, 0]
        xte = f["test_images"].reshape(-1, 784) / 255.0
        yte = f["test_labels"][:, 0]
    means = np.stack([xtr[ytr == c].mean(axis=0) for c in range(4)])
    pred = np.argmin(((xte[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert np.mean(pred == yte) > 0.7


def test_octmnist_binary_task_channel_first_scaled(oct_file):
    ds = load_dataset("octmnist", {"path": str(oct_file)})
    orig = _file_labels(oct_file, "train")
    assert ds.x_train.shape == (203, 1, 28, 28) and ds.feature_shape == (1, 28, 28)
    assert ds.x_train.dtype == np.float64
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    np.testing.assert_array_equal(ds.y_train, (orig != 3).astype(int))
    with np.load(oct_file) as f:
        np.testing.assert_allclose(ds.x_train[5, 0], f["train_images"][5] / 255.0)
    assert ds.x_test.shape == (43, 1, 28, 28) and ds.n_classes == 2
    raw = load_dataset("octmnist", {"data_dir": str(oct_file.parent), "scale": False,
                                    "split_test": "val"})
    assert raw.x_train.max() > 1.0 and raw.x_test.shape[0] == 41


def test_octmnist_class_filter_balance_and_test_filter(oct_file):
    orig = _file_labels(oct_file, "train")
    n_min = min(int(np.sum(orig == 2)), int(np.sum(orig == 3)))
    opts = {"path": str(oct_file), "classes": [2, 3], "balance": True, "seed": 4,
            "test_classes": [2]}
    ds = load_dataset("octmnist", opts)
    assert np.sum(ds.y_train == 1) == np.sum(ds.y_train == 0) == n_min
    # source_index points to drusen/normal rows, kept in file order
    assert np.all(np.diff(ds.source_index) > 0)
    assert set(orig[ds.source_index]) == {2, 3}
    assert np.all(ds.y_test == 1)
    assert ds.x_test.shape[0] == int(np.sum(_file_labels(oct_file, "test") == 2))
    again = load_dataset("octmnist", opts)
    assert again.sha256() == ds.sha256()
    other = load_dataset("octmnist", {**opts, "seed": 5})
    assert other.sha256() != ds.sha256()
    # without test_classes the test split follows `classes`
    ds2 = load_dataset("octmnist", {"path": str(oct_file), "classes": [2, 3]})
    assert set(_file_labels(oct_file, "train")[ds2.source_index]) == {2, 3}
    assert ds2.x_test.shape[0] == int(np.isin(_file_labels(oct_file, "test"), [2, 3]).sum())


def test_octmnist_multiclass_and_bad_options(oct_file):
    ds = load_dataset("octmnist", {"path": str(oct_file), "task": "multiclass"})
    assert ds.n_classes == 4
    np.testing.assert_array_equal(ds.y_train, _file_labels(oct_file, "train"))
    for options, key in [({"classes": [2, 7]}, "classes"), ({"balance": "yes"}, "balance"),
                         ({"task": "drusen"}, "task"), ({"split_test": "train"}, "split_test"),
                         ({"classes": []}, "classes")]:
        with pytest.raises(ConfigError, match=key):
            load_dataset("octmnist", {"path": str(oct_file), **options})
    with pytest.raises(ConfigError, match="not both"):
        load_dataset("octmnist", {"path": str(oct_file), "data_dir": str(oct_file.parent)})
    with pytest.raises(DataError, match="two classes"):
        load_dataset("octmnist", {"path": str(oct_file), "classes": [0, 1], "balance": True})


def test_octmnist_public_split(oct_file):
    orig = _file_labels(oct_file, "train")
    pub = octmnist_public_split(oct_file, seed=0)
    m = min(int(np.sum(orig == c)) for c in (0, 1, 3))
    assert pub.n_classes == 3 and pub.n_train == 3 * m
    assert [int(np.sum(pub.y_train == c)) for c in range(3)] == [m, m, m]
    assert 2 not in set(orig[pub.source_index])
    binary = octmnist_public_split(data_dir=oct_file.parent, labels="binary", balance=False)
    assert binary.n_classes == 2
    np.testing.assert_array_equal(binary.y_train, (orig[binary.source_index] != 3).astype(int))
    # kept disjoint from a private set's normal images
    private = load_dataset("octmnist", {"path": str(oct_file), "classes": [2, 3], "balance": True})
    disjoint = octmnist_public_split(oct_file, exclude_indices=private.source_index)
    assert not set(disjoint.source_index) & set(private.source_index)
    assert disjoint.meta["n_excluded"] == int(np.sum(orig[private.source_index] == 3))
    with pytest.raises(ConfigError, match="labels"):
        octmnist_public_split(oct_file, labels="four")


def test_octmnist_missing_file_explains_download(tmp_path):
    with pytest.raises(DataError, match=r"octmnist\.npz not found.*medmnist.*data-dir"):
        load_dataset("octmnist", {"data_dir": str(tmp_path)})
    with pytest.raises(DataError, match=r"medmnist\.com"):
        load_dataset("octmnist", {})
    with pytest.raises(DataError, match=r"medmnist"):
        octmnist_public_split(data_dir=tmp_path)


def test_octmnist_malformed_file(tmp_path):
    p = tmp_path / "octmnist.npz"
    np.savez(p, train_images=np.zeros((3, 28, 28), np.uint8),
             train_labels=np.array([[0], [1], [9]], np.uint8))
    with pytest.raises(DataError, match=r"train_labels\[2\] = 9"):
        load_dataset("octmnist", {"path": str(p)})
    np.savez(p, train_images=np.zeros((3, 28, 28), np.uint8),
             train_labels=np.array([[0], [1], [3]], np.uint8))
    with pytest.raises(DataError, match=r"no array 'test_images'; keys present"):
        load_dataset("octmnist", {"path": str(p)})
    np.savez(p, train_images=np.zeros((3, 28, 28), np.uint8), train_labels=np.zeros((3, 1)),
             test_images=np.zeros((2, 14, 14), np.uint8), test_labels=np.zeros((2, 1)))
    with pytest.raises(DataError, match="same feature pipeline"):
        load_dataset("octmnist", {"path": str(p)})
    nan_images = np.zeros((3, 28, 28))
    nan_images[1, 4, 4] = np.nan
    np.savez(p, train_images=nan_images, train_labels=np.zeros((3, 1)))
    with pytest.raises(DataError, match="record 1"):
        load_dataset("octmnist", {"path": str(p), "split_test": "none"})


# ---------------------------------------------------------------------------- imdb


def test_imdb_loader(imdb_file):
    ds = load_dataset("imdb", {"path": str(imdb_file)})
    assert ds.x_train.shape == (120, 768) and ds.x_test.shape == (30, 768)
    assert ds.x_train.dtype == np.float64 and set(np.unique(ds.y_train)) == {0, 1}
    assert ds.n_classes == 2 and ds.source_index is None
    with np.load(imdb_file) as f:
        assert f["x_train"].dtype == np.float32
        assert np.sum(f["y_train"] == 1) == 60
    # the two Gaussian classes are separable by their means far above chance
    mu1, mu0 = ds.x_train[ds.y_train == 1].mean(0), ds.x_train[ds.y_train == 0].mean(0)
    score = (ds.x_test - (mu0 + mu1) / 2) @ (mu1 - mu0)
    assert np.mean((score > 0) == (ds.y_test == 1)) > 0.8

    sub = load_dataset("imdb", {"data_dir": str(imdb_file.parent), "max_train": 50, "seed": 1})
    assert sub.n_train == 50 and np.all(np.diff(sub.source_index) > 0)
    np.testing.assert_array_equal(sub.x_train, ds.x_train[sub.source_index])
    assert load_dataset("imdb", {"path": str(imdb_file), "max_train": 50, "seed": 1}).sha256() \
        == sub.sha256()
    with pytest.raises(ConfigError, match="max_train"):
        load_dataset("imdb", {"path": str(imdb_file), "max_train": 0})


def test_imdb_missing_file_explains_how_to_build(tmp_path):
    with pytest.raises(DataError,
                       match=r"imdb_embeddings\.npz not found.*GPT-2.*docs/data\.md"):
        load_dataset("imdb", {"data_dir": str(tmp_path)})


def test_imdb_dimension_mismatch_and_bad_labels(tmp_path):
    p = tmp_path / "imdb_embeddings.npz"
    np.savez(p, x_train=np.ones((4, 768)), y_train=np.array([0, 1, 0, 1]),
             x_test=np.ones((2, 512)), y_test=np.array([0, 1]))
    with pytest.raises(DataError, match=r"\(512,\).*\(768,\)"):
        load_dataset("imdb", {"path": str(p)})
    np.savez(p, x_train=np.ones((4, 8)), y_train=np.array([0, 1, 2, 1]),
             x_test=np.ones((2, 8)), y_test=np.array([0, 1]))
    with pytest.raises(DataError, match=r"y_train\[2\] = 2"):
        load_dataset("imdb", {"path": str(p)})


# ---------------------------------------------------------------------------- queries


def test_load_npz_queries(tmp_path):
    np.savez(tmp_path / "q.npz", x_test=np.ones((3, 6)), y_test=np.array([[1], [0], [1]]),
             x_val=np.zeros((2, 6)))
    x, y = load_npz_queries(tmp_path / "q.npz")
    assert x.shape == (3, 6) and x.dtype == np.float64
    np.testing.assert_array_equal(y, [1, 0, 1])
    xv, yv = load_npz_queries(tmp_path / "q.npz", split="val")
    assert xv.shape == (2, 6) and yv is None
    np.savez(tmp_path / "plain.npz", x=np.ones((2, 6)), y=np.array([0, 1]))
    x, y = load_npz_queries(tmp_path / "plain.npz", split="train")
    assert x.shape == (2, 6) and list(y) == [0, 1]


def test_load_npz_queries_errors(tmp_path):
    np.savez(tmp_path / "q.npz", features=np.ones((3, 6)))
    with pytest.raises(DataError, match=r"neither 'x_test' nor 'x'; keys present: features"):
        load_npz_queries(tmp_path / "q.npz")
    with pytest.raises(DataError, match="not found"):
        load_npz_queries(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_text("hello")
    with pytest.raises(DataError, match="is not a numpy .npz archive"):
        load_npz_queries(tmp_path / "bad.npz")
    np.save(tmp_path / "single.npy", np.ones(3))
    with pytest.raises(DataError, match="single array"):
        load_npz_queries(tmp_path / "single.npy")
    x = np.ones((3, 2))
    x[1, 1] = np.nan
    np.savez(tmp_path / "nan.npz", x=x)
    with pytest.raises(DataError, match="record 1"):
        load_npz_queries(tmp_path / "nan.npz")
    np.savez(tmp_path / "len.npz", x=np.ones((3, 2)), y=np.array([0, 1]))
    with pytest.raises(DataError, match="3 records but 2 labels"):
        load_npz_queries(tmp_path / "len.npz")


# ------------------------------------------------------------------ digits: unit-ball features

def test_digits_unit_ball_features_and_the_stability_example_config():
    """features: unit_ball maps by the public pixel range only, (x - 8) / (8 sqrt 64), so
    every image the format allows has ||x|| <= 1 (the domain of bound method stability);
    labels and split are the raw loader's; configs/digits_stability.yaml (fewer steps here)
    trains on it and certifies queries at k >= 1."""
    from agt.certify import Certifier
    from agt.config import load_config
    from agt.store import from_result
    from agt.training import train
    raw = load_dataset("digits", {"task": "binary"}, None)
    unit = load_dataset("digits", {"task": "binary", "features": "unit_ball"}, None)
    np.testing.assert_array_equal(raw.y_train, unit.y_train)
    np.testing.assert_array_equal(raw.y_test, unit.y_test)
    np.testing.assert_allclose(unit.x_train, (raw.x_train - 8.0) / 64.0, rtol=1e-11)
    assert np.linalg.norm(unit.x_train, axis=1).max() <= 1.0
    assert unit.meta["feature_range"] == [-0.125, 0.125]
    assert unit.meta["options"]["features"] == "unit_ball"
    with pytest.raises(ConfigError, match="features"):
        load_dataset("digits", {"features": "pca"}, None)
    cfg = load_config("configs/digits_stability.yaml", {"n_epochs": 20, "device": "cpu"})
    ds = load_dataset(cfg.data.name, cfg.data.options)
    res = train(cfg, ds)
    cert = Certifier(from_result(res)).certify(ds.x_test)
    assert (cert.prediction == ds.y_test).mean() > 0.7
    assert cert.certified_fraction()[1] > 0.3
