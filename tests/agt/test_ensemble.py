"""agt/ensemble: partition by record index, training, storage and manifest validation,
the ensemble certifier, and smoothness of ensemble radii on real neighbouring datasets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from agt.certify import Certifier
from agt.data import Dataset
from agt.ensemble import (
    MANIFEST,
    EnsembleCertifier,
    check_ensemble_plan,
    part_sizes,
    partition_indices,
    read_ensemble,
    teacher_dataset,
    teacher_of,
    train_ensemble,
    write_ensemble,
)
from agt.errors import BundleError, ConfigError
from mechanisms import ensemble as me
from tests.helpers import LOGISTIC_CE, MLP, blobs, config, with_train

T = 5
KV = "0..20"


def cfg(**kw):
    base = dict(k_values=KV, n_epochs=2, seed=3)
    base.update(kw)
    return config(LOGISTIC_CE, "cross_entropy", **base)


@pytest.fixture(scope="module")
def data():
    return blobs(400, seed=31, variant="overlapping")


@pytest.fixture(scope="module")
def ensemble(data):
    return train_ensemble(cfg(), data, T)


@pytest.fixture(scope="module")
def stored(ensemble, tmp_path_factory):
    path = tmp_path_factory.mktemp("ens") / "ensemble"
    write_ensemble(ensemble, path)
    return path


@pytest.fixture(scope="module")
def certificate(ensemble, data):
    return EnsembleCertifier(ensemble).certify(data.x_test)


def copy_of(stored: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(stored, dst)
    return dst


def edit_manifest(path: Path, edit) -> None:
    m = json.loads((path / MANIFEST).read_text())
    edit(m)
    (path / MANIFEST).write_text(json.dumps(m))


# -- partition ----------------------------------------------------------------------------

def test_partition_by_record_index():
    parts = partition_indices(23, 4)
    assert [len(p) for p in parts] == part_sizes(23, 4) == [6, 6, 6, 5]
    joined = np.sort(np.concatenate(parts))
    assert np.array_equal(joined, np.arange(23))                       # disjoint and covering
    for t, p in enumerate(parts):
        assert np.all(teacher_of(p, 4) == t) and np.all(np.diff(p) > 0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition_indices(23, 4)))
    with pytest.raises(ConfigError, match="T must be an integer >= 1"):
        partition_indices(10, 0)
    with pytest.raises(ConfigError, match="at least one record each"):
        partition_indices(3, 4)


def test_teacher_dataset_holds_its_records_in_index_order(data):
    tds = teacher_dataset(data, 2, T)
    idx = np.arange(2, data.n_train, T)
    assert np.array_equal(tds.x_train, data.x_train[idx])
    assert np.array_equal(tds.y_train, data.y_train[idx])
    assert tds.x_test is data.x_test


def test_plan_refuses_k_at_or_above_the_smallest_teacher_batch(data):
    n = data.n_train                                  # 401 -> parts of 80 or 81
    check_ensemble_plan(cfg(k_values="0..79"), n, T)
    with pytest.raises(ConfigError, match=r"k value 80 .* every teacher's batch size 80.*0\.\.79"):
        check_ensemble_plan(cfg(k_values="0..80"), n, T)
    with pytest.raises(ConfigError, match="every teacher's batch size 30"):
        check_ensemble_plan(cfg(k_values="0..30", batch_size=30), n, T)
    with pytest.raises(ConfigError, match="k value"):
        train_ensemble(cfg(k_values="0..90"), data, T)


# -- training and certification -----------------------------------------------------------

def test_ensemble_manifest_and_teachers(ensemble, data):
    m = ensemble.manifest
    assert m["n_teachers"] == T and ensemble.n_teachers == T
    assert m["partition"] == {"rule": "index-mod-T", "n_train": data.n_train,
                              "sizes": part_sizes(data.n_train, T)}
    assert ensemble.seeds == [3, 4, 5, 6, 7]
    assert ensemble.k_values == tuple(range(21))
    assert ensemble.relations == ("replace-one",)
    for t, (e, b) in enumerate(zip(m["teachers"], ensemble.bundles)):
        assert b.config["seed"] == e["seed"] == 3 + t
        assert b.n_train == len(np.arange(t, data.n_train, T))
        assert b.dataset_sha256 == teacher_dataset(data, t, T).sha256()
        # a full-batch teacher alone would certify add-remove on its part, but adding a record
        # to the whole dataset shifts the partition: teachers record replace-one only, and
        # name the ensemble whose data they spend
        assert b.relations == ("replace-one",)
        assert b.parent == {"dataset_sha256": data.sha256(), "n_teachers": T, "teacher": t,
                            "partition": "index-mod-T"}
        assert b.protected_dataset_sha256 == data.sha256()
    assert m["dataset_sha256"] == data.sha256()


def test_certifier_aggregates_teacher_certificates(ensemble, certificate, data):
    c = certificate
    Q = data.n_test
    assert c.teacher_predictions.shape == c.teacher_radii.shape == (Q, T)
    for t, b in enumerate(ensemble.bundles):
        single = Certifier(b).certify(data.x_test)
        assert np.array_equal(c.teacher_predictions[:, t], single.prediction)
        assert np.array_equal(c.teacher_radii[:, t], single.radius)
        assert np.array_equal(c.teacher_max_k[:, t], single.max_certified_k)
    assert c.dataset_sha256 == data.sha256() and c.relations == ("replace-one",)
    assert c.smooth_radii and c.n_classes == 2 and c.source_id == ensemble.ensemble_id
    assert np.array_equal(EnsembleCertifier(ensemble).predict_teachers(data.x_test),
                          c.teacher_predictions)
    votes_only = EnsembleCertifier(ensemble).certify(data.x_test, radii=False)
    assert votes_only.teacher_radii is None
    assert np.array_equal(votes_only.teacher_predictions, c.teacher_predictions)
    answer = me.aggregate(c.teacher_predictions)
    assert (answer == data.y_test).mean() > 0.8
    radius = me.ensemble_radius(c.teacher_predictions, c.teacher_radii, "thm5.3")
    assert radius.max() > 20                        # sums over several teachers exceed K


@pytest.mark.parametrize("kind,index", [("far", 17), ("flip", 202), ("move", 333)])
def test_neighbour_touches_one_teacher_and_radii_drop_by_at_most_one(data, ensemble, certificate,
                                                                     kind, index):
    """Replace record `index` (replace-one neighbour): only teacher index mod T retrains to
    something different, every other bundle is bit-identical; per-teacher radii, both ensemble
    radii and both PTR distances move by at most 1 on every query."""
    x, y = data.x_train.copy(), data.y_train.copy()
    if kind == "far":          # a far-away point with the wrong label
        x[index] = -3.0 * x[index]
    elif kind == "flip":
        y[index] = 1 - y[index]
    else:
        x[index] = x[(index + 1) % len(x)]
        y[index] = 1 - y[(index + 1) % len(x)]
    neighbour = with_train(data, x, y)
    ens2 = train_ensemble(cfg(), neighbour, T)
    touched = teacher_of(index, T)
    for t, (b1, b2) in enumerate(zip(ensemble.bundles, ens2.bundles)):
        same = all(torch.equal(b1.nominal[n], b2.nominal[n])
                   and torch.equal(b1.lower[n], b2.lower[n])
                   and torch.equal(b1.upper[n], b2.upper[n]) for n in b1.nominal)
        assert same == (t != touched), f"teacher {t}"
    c1 = certificate
    c2 = EnsembleCertifier(ens2).certify(data.x_test)
    others = [t for t in range(T) if t != touched]
    assert np.array_equal(c1.teacher_radii[:, others], c2.teacher_radii[:, others])
    assert np.abs(c1.teacher_radii - c2.teacher_radii).max() <= 1
    for f in (lambda c: me.ensemble_radius(c.teacher_predictions, c.teacher_radii, "thm5.3"),
              lambda c: me.ensemble_radius(c.teacher_predictions, c.teacher_radii, "tight"),
              lambda c: me.ptr_distance(c.teacher_predictions)):
        a, b = f(c1), f(c2)
        assert (b >= a - 1).all() and (a >= b - 1).all()
    assert (c1.teacher_radii[:, touched] != c2.teacher_radii[:, touched]).any()


def test_multiclass_ensemble_is_certified_per_teacher():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(120, 6))
    y = rng.integers(0, 3, size=120)
    ds = Dataset("three", x, y, x[:10], y[:10], 3)
    c = config(MLP[:2] + [{"linear": {"in": 12, "out": 3}}], "cross_entropy", k_values=[0, 1, 2])
    ens = train_ensemble(c, ds, 3)
    cert = EnsembleCertifier(ens).certify(ds.x_test)
    assert cert.n_classes == 3 and cert.teacher_predictions.shape == (10, 3)
    assert set(np.unique(cert.teacher_predictions)) <= {0, 1, 2}


def test_progress_bar_over_teachers(data, capsys):
    train_ensemble(cfg(k_values=[0, 1]), data, 2, progress=True)
    err = capsys.readouterr().err
    assert "AGT teachers (T=2)" in err and "2/2" in err


# -- storage ------------------------------------------------------------------------------

def test_round_trip(stored, ensemble, certificate, data):
    ens = read_ensemble(stored)
    assert sorted(p.name for p in stored.iterdir()) == [MANIFEST] + [f"teacher_{t:03d}.h5"
                                                                     for t in range(T)]
    assert ens.manifest == json.loads(json.dumps(ensemble.manifest))
    assert ens.ensemble_id == ensemble.ensemble_id
    again = EnsembleCertifier(ens).certify(data.x_test)
    for field in ("teacher_predictions", "teacher_radii", "teacher_max_k"):
        assert np.array_equal(getattr(again, field), getattr(certificate, field))


def test_write_replaces_an_ensemble_but_never_other_directories(stored, ensemble, tmp_path):
    path = copy_of(stored, tmp_path)
    write_ensemble(ensemble, path)                  # an ensemble is replaced
    read_ensemble(path)
    assert not (tmp_path / "copy.partial").exists() and not (tmp_path / "copy.replaced").exists()
    (path / "ledger.db").write_text("budget")
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        write_ensemble(ensemble, path)
    assert (path / "ledger.db").read_text() == "budget"
    other = tmp_path / "notes"
    other.mkdir()
    (other / "a.txt").write_text("x")
    with pytest.raises(ConfigError, match="not an agt ensemble"):
        write_ensemble(ensemble, other)
    afile = tmp_path / "file.h5"
    afile.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        write_ensemble(ensemble, afile)


@pytest.mark.parametrize("edit,message", [
    (lambda m: m.update(format="agt-bounds"), "not an agt ensemble manifest"),
    (lambda m: m.update(format_version=2), "format_version 2 is not supported"),
    (lambda m: m.pop("teachers"), r"missing key\(s\) \['teachers'\]"),
    (lambda m: m.update(n_teachers=4), "n_teachers is 4 but 5 teacher entries"),
    (lambda m: m["partition"].update(rule="random"), "unknown partition rule 'random'"),
    (lambda m: m["partition"].update(sizes=[80, 80, 80, 80, 81]), "do not match the index-mod-T"),
    (lambda m: m.update(relations=["replace-one", "add-remove"]), "replace-one only"),
    (lambda m: m.update(k_values=[1, 2]), "k_values must be"),
    (lambda m: m["teachers"][1].update(file="../teacher_001.h5"), "plain file name"),
    (lambda m: m["teachers"][2].update(index=7), r"teachers\[2\].index is 7"),
    (lambda m: m["teachers"][3].update(n_train=12), r"teachers\[3\].n_train is 12"),
])
def test_manifest_validation(stored, tmp_path, edit, message):
    path = copy_of(stored, tmp_path)
    edit_manifest(path, edit)
    with pytest.raises(BundleError, match=message):
        read_ensemble(path)


def test_manifest_validation_reports_every_problem(stored, tmp_path):
    path = copy_of(stored, tmp_path)
    edit_manifest(path, lambda m: (m.update(k_values=[0, 1, 1]),
                                   m["teachers"][0].update(seed=-1)))
    with pytest.raises(BundleError) as info:
        read_ensemble(path)
    assert "k_values must be" in str(info.value) and "teachers[0].seed" in str(info.value)


def test_bundles_checked_against_manifest(stored, tmp_path):
    path = copy_of(stored, tmp_path)
    (path / "teacher_001.h5").rename(path / "tmp.h5")
    (path / "teacher_003.h5").rename(path / "teacher_001.h5")
    (path / "tmp.h5").rename(path / "teacher_003.h5")          # two teachers swapped
    with pytest.raises(BundleError) as info:
        read_ensemble(path)
    msg = str(info.value)
    assert "teacher 1 (teacher_001.h5): dataset_sha256 differs" in msg
    assert "teacher 3 (teacher_003.h5)" in msg and "seed" in msg

    path = copy_of(stored, tmp_path / "b")
    (path / "teacher_004.h5").unlink()
    with pytest.raises(BundleError, match=r"teacher 4 \(teacher_004.h5\): bounds file not found"):
        read_ensemble(path)
    (path / "teacher_004.h5").write_bytes(b"not hdf5")
    with pytest.raises(BundleError, match="teacher 4 .*cannot read"):
        read_ensemble(path)


def test_bundle_k_grid_must_match(stored, tmp_path, data):
    path = copy_of(stored, tmp_path)
    other = train_ensemble(cfg(k_values="0..10"), data, T)
    from agt.store import write_bundle
    write_bundle(other.bundles[2], path / "teacher_002.h5")
    with pytest.raises(BundleError, match="teacher 2 .*k_values 0..10 .* differ"):
        read_ensemble(path)


def test_missing_or_malformed_ensemble(tmp_path, stored):
    with pytest.raises(BundleError, match="ensemble not found"):
        read_ensemble(tmp_path / "nope")
    with pytest.raises(BundleError, match="not an ensemble directory"):
        read_ensemble(stored / "teacher_000.h5")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match="missing manifest.json"):
        read_ensemble(tmp_path / "empty")
    path = copy_of(stored, tmp_path)
    (path / MANIFEST).write_text("{not json")
    with pytest.raises(BundleError, match="malformed JSON"):
        read_ensemble(path)
    (path / MANIFEST).write_text("[1, 2]")
    with pytest.raises(BundleError, match="must be a JSON object"):
        read_ensemble(path)
