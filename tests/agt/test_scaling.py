"""Input scale from public data (agt/scaling.py): recorded in the bundle, applied to every
query by the certifier; and the data checks' warnings (agt/data_checks.py)."""

from __future__ import annotations

import warnings

import h5py
import numpy as np
import pytest

import agt
from agt.cli.main import main
from agt.data_checks import DataWarning, check_fit, check_training_data
from agt.errors import BundleError, DataError
from agt.scaling import InputScale

MULT = np.array([1000.0, 1.0, 500.0, 1.0])      # raw features: areas next to ratios
ADD = np.array([3000.0, 0.0, 100.0, 0.0])


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(300, 4))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0.3).astype(np.int64)
    public = rng.normal(size=(100, 4)) * MULT + ADD    # same task, other records
    return x * MULT + ADD, y, public


def _cfg():
    return agt.TrainConfig.create([{"linear": {"in": 4, "out": 2}}], "cross_entropy",
                                  learning_rate=0.5, n_epochs=3, batch_size=50, clip_gamma=1.0,
                                  k_values="0..4")


def _train(ds, scale=None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bundle = agt.train(_cfg(), ds, input_scale=scale, progress=False)
    return bundle, [str(w.message) for w in caught if issubclass(w.category, DataWarning)]


def test_raw_features_warn_and_public_scaling_fixes_the_model(tmp_path):
    x, y, public = _data()
    ds = agt.Dataset.from_arrays(x[:250], y[:250], x[250:], y[250:])
    raw, raw_warnings = _train(ds)
    assert any("far from unit scale" in w for w in raw_warnings)
    assert any("majority-class rate" in w for w in raw_warnings)
    assert all("\n" not in w for w in raw_warnings)

    scale = InputScale.from_public(public, source="public.npz")
    scaled, scaled_warnings = _train(ds, scale)
    assert scaled_warnings == []
    cert = agt.certify(scaled, ds.x_test)              # queries in the original units
    assert cert.summary(ds.y_test).accuracy > 0.9 > agt.certify(raw, ds.x_test).summary(
        ds.y_test).accuracy
    assert scaled.dataset_sha256 == ds.sha256()        # the private records, not the scaled

    path = agt.write_bundle(scaled, tmp_path / "scaled.h5")
    with h5py.File(path) as f:
        assert f.attrs["format_version"] == 3
    back = agt.read_bundle(path)
    assert back.input_scale.source == "public.npz"
    np.testing.assert_array_equal(agt.certify(back, ds.x_test).radius, cert.radius)
    with h5py.File(agt.write_bundle(raw, tmp_path / "raw.h5")) as f:
        assert f.attrs["format_version"] == 2 and "input_scale" not in f

    with h5py.File(path, "r+") as f:                   # a wider scale would change answers
        f["input_scale/scale"][0] *= 2
    with pytest.raises(BundleError, match="content hash"):
        agt.read_bundle(path)


def test_agt_train_scale_from_records_the_public_scale(tmp_path, capsys):
    x, y, public = _data(1)
    np.savez(tmp_path / "private.npz", x_train=x[:250], y_train=y[:250], x_test=x[250:],
             y_test=y[250:])
    np.savez(tmp_path / "public.npz", x=public)
    config = tmp_path / "c.yaml"
    config.write_text("model: [{linear: {in: 4, out: 2}}]\nloss: cross_entropy\n"
                      "learning_rate: 0.5\nn_epochs: 3\nbatch_size: 50\nclip_gamma: 1.0\n"
                      "k_values: 0..4\n")
    base = ["train", "--config", str(config), "--data", str(tmp_path / "private.npz"),
            "--quiet"]
    assert main(base + ["--out", str(tmp_path / "s.h5"),
                        "--scale-from", str(tmp_path / "public.npz")]) == 0
    out = capsys.readouterr()
    assert "input scale: public statistics of public.npz" in out.out
    assert "warning" not in out.err
    bundle = agt.read_bundle(tmp_path / "s.h5")
    np.testing.assert_allclose(bundle.input_scale.shift, public.mean(0))
    assert main(base + ["--out", str(tmp_path / "r.h5")]) == 0
    err = capsys.readouterr().err
    assert "agt: warning: training features are far from unit scale" in err
    assert main(base + ["--ensemble", "2", "--out", str(tmp_path / "e"),
                        "--scale-from", str(tmp_path / "public.npz")]) == 2
    assert "ensembles do not record an input scale" in capsys.readouterr().err


def test_scale_construction_and_shape_checks():
    s = InputScale.from_bounds([0.0, -5.0], [255.0, 5.0])
    np.testing.assert_allclose(s.apply([[0.0, -5.0], [255.0, 5.0]]), [[-1, -1], [1, 1]])
    flat = InputScale.from_public(np.array([[1.0, 2.0], [3.0, 2.0]]))
    np.testing.assert_allclose(flat.apply([[2.0, 2.0]]), [[0.0, 0.0]])    # no spread: shift
    with pytest.raises(DataError, match="feature shape"):
        s.apply(np.zeros((2, 3)))
    with pytest.raises(DataError, match="low < high"):
        InputScale.from_bounds(1.0, 1.0)
    with pytest.raises(DataError, match="at least 2 records"):
        InputScale.from_public(np.zeros((1, 2)))


def test_missing_class_and_unit_scale_checks_are_one_line_each():
    rng = np.random.default_rng(0)
    ds = agt.Dataset.from_arrays(rng.normal(size=(20, 3)), np.arange(20) % 2, n_classes=3)
    with pytest.warns(DataWarning, match="class 2 of 3 has no record"):
        issued = check_training_data(ds)
    assert len(issued) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_training_data(agt.Dataset.from_arrays(rng.normal(size=(20, 3)),
                                                    np.arange(20) % 2))
    with pytest.warns(DataWarning, match="predicts class 1 for every record"):
        check_fit(np.ones(10, int), np.array([1] * 7 + [0] * 3))
    assert check_fit(np.array([1] * 7 + [0] * 3), np.array([1] * 7 + [0] * 3)) == []
