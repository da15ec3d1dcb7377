"""Ensembles trained serially, in local processes and on Ray (local, 2 CPUs) are identical:
the same nominal parameters, bounds and record orders byte for byte, the same bundle and
ensemble ids, and -- once the write time is the same -- the same HDF5 content hashes. Ray's
worker-failure and user-error handling is checked here too (the Ray instance is started once
for the module; Ray tests need the ``distributed`` extra, which the README's test command
installs)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from agt.cli import main
from agt.ensemble import read_ensemble, train_ensemble, write_ensemble
from agt.errors import ConfigError, WorkerError
from agt.parallel import Execution, ray_session, run_tasks
from tests.agt import parallel_tasks as tasks
from tests.helpers import MLP, blobs, config

T = 5
FIXED_TIME = "2000-01-01T00:00:00+00:00"


def cfg(**kw):
    return config(MLP, "cross_entropy", **{**dict(k_values="0..15", n_epochs=2, seed=11,
                                                  batch_size=40), **kw})


@pytest.fixture(scope="module")
def data():
    return blobs(300, seed=5, variant="overlapping")


@pytest.fixture(scope="module")
def serial(data):
    return train_ensemble(cfg(), data, T)


def assert_identical(a, b):
    """Every array of every teacher bundle equal, bit for bit and in dtype; ids equal; the
    manifests equal but for when and how they ran."""
    assert a.ensemble_id == b.ensemble_id
    for t, (x, y) in enumerate(zip(a.bundles, b.bundles)):
        assert x.bundle_id == y.bundle_id, t
        for group in ("init", "nominal", "lower", "upper"):
            gx, gy = getattr(x, group), getattr(y, group)
            assert gx.keys() == gy.keys()
            for name in gx:
                assert gx[name].dtype == gy[name].dtype and torch.equal(gx[name], gy[name]), \
                    (t, group, name)
        assert np.array_equal(x.order, y.order)
        assert (x.config, x.k_values, x.relations, x.parent, x.dataset_sha256) == \
            (y.config, y.k_values, y.relations, y.parent, y.dataset_sha256)

    def what(m):
        m = json.loads(json.dumps(m))
        for key in ("created", "execution"):
            m.pop(key)
        for e in m["teachers"]:
            e.pop("seconds")
        return m
    assert what(a.manifest) == what(b.manifest)


def written(ensemble, path):
    """Write with a fixed creation time; return {file: (content hash, {dataset: bytes})}."""
    for b in ensemble.bundles:
        b.created = FIXED_TIME
    write_ensemble(ensemble, path)
    out = {}
    for p in sorted(path.glob("teacher_*.h5")):
        with h5py.File(p) as f:
            arrays = {}
            f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()].tobytes())
                         if isinstance(obj, h5py.Dataset) else None)
            out[p.name] = (f.attrs["content_sha256"], arrays)
    return out


def test_process_workers_give_the_serial_bundles(serial, data, tmp_path):
    parallel = train_ensemble(cfg(), data, T, workers=2)
    assert parallel.manifest["execution"] == {"backend": "process", "workers": 2,
                                              "threads_per_teacher": 1, "reruns": []}
    assert serial.manifest["execution"]["backend"] == "serial"
    assert_identical(serial, parallel)
    a, b = written(serial, tmp_path / "serial"), written(parallel, tmp_path / "process")
    assert a == b and len(a) == T
    assert_identical(read_ensemble(tmp_path / "serial"), read_ensemble(tmp_path / "process"))


# -- Ray (local, 2 CPUs, no network) ------------------------------------------------------

@pytest.fixture(scope="module")
def ray_local():
    """One local Ray instance (2 CPUs) for the module, started and stopped by the library's
    own `ray_session` (what a run without a running cluster does)."""
    pytest.importorskip("ray")
    with ray_session("local", num_cpus=2) as ray:
        yield ray
    assert not ray.is_initialized()


RAY = Execution("ray", 2, 1)


def test_ray_gives_the_serial_bundles(ray_local, serial, data, tmp_path):
    on_ray = train_ensemble(cfg(), data, T, backend="ray", workers=2)
    assert on_ray.manifest["execution"]["backend"] == "ray"
    assert_identical(serial, on_ray)
    assert written(serial, tmp_path / "s") == written(on_ray, tmp_path / "r")


def test_ray_reruns_a_crashed_worker_and_raises_user_errors_once(ray_local, tmp_path):
    (tmp_path / "crash").mkdir()
    report = run_tasks(tasks.crash_once, str(tmp_path / "crash"), 4, RAY)
    assert report.results == [0, 1, 4, 9]
    assert ([r.index for r in report.reruns] == [1]
            and "WorkerCrashedError" in report.reruns[0].reason)
    (tmp_path / "user").mkdir()
    with pytest.raises(ConfigError, match="teacher 2 cannot run"):
        run_tasks(tasks.user_error, str(tmp_path / "user"), 4, RAY, retries=3)
    assert tasks.attempts(str(tmp_path / "user"), 2) == 1
    (tmp_path / "always").mkdir()
    with pytest.raises(WorkerError, match=r"task 2 failed 2 time\(s\)"):
        run_tasks(tasks.crash_always, str(tmp_path / "always"), 3, RAY, retries=1)


def test_cli_trains_on_ray_and_writes_the_serial_ensemble(ray_local, serial, data, tmp_path,
                                                          capsys):
    np.savez(tmp_path / "d.npz", x_train=data.x_train, y_train=data.y_train,
             x_test=data.x_test, y_test=data.y_test)
    body = {"model": MLP, "loss": "cross_entropy", "learning_rate": 0.5, "lr_decay": 0.1,
            "clip_gamma": 0.5, "n_epochs": 2, "batch_size": 40, "k_values": "0..15",
            "dtype": "float64", "device": "cpu", "seed": 11}
    (tmp_path / "c.yaml").write_text(json.dumps(body))
    rc = main(["train", "--config", str(tmp_path / "c.yaml"), "--data", str(tmp_path / "d.npz"),
               "--ensemble", str(T), "--ray-address", "local", "--out", str(tmp_path / "r")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "execution: ray, 2 worker(s), 1 thread(s) per teacher" in out
    assert f"AGT teachers (T={T})" in err and f"{T}/{T}" in err
    assert read_ensemble(tmp_path / "r").ensemble_id == serial.ensemble_id
