"""Shared test utilities: tiny datasets and configs, perturbations, containment checks."""

from __future__ import annotations

import numpy as np
import torch

from agt.bounded.network import Network
from agt.config import config_from_dict
from agt.data import Dataset, load_dataset

LOGISTIC = [{"linear": {"in": 6, "out": 1}}]
LOGISTIC_CE = [{"linear": {"in": 6, "out": 2}}]
MLP = [{"linear": {"in": 6, "out": 12}}, {"relu": {}}, {"linear": {"in": 12, "out": 2}}]
MLP_BCE = [{"linear": {"in": 6, "out": 10}}, {"relu": {}}, {"linear": {"in": 10, "out": 1}}]
CONV = [{"conv2d": {"in": 1, "out": 3, "kernel": 3, "stride": 1}}, {"relu": {}}, {"flatten": {}},
        {"linear": {"in": 3 * 4 * 4, "out": 2}}]


class IntegersOnly:
    """A random generator that offers exactly uniform integers and nothing else: a release
    that draws through it never touches the float grid (rng.random, rng.laplace, ...)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def integers(self, low, high, size=None):
        return self.rng.integers(low, high, size=size)


def blobs(n: int, seed: int = 0, variant: str = "overlapping") -> Dataset:
    return load_dataset("blobs", {"n_samples": int(n / 0.8) + 1, "seed": seed, "variant": variant})


def images(n: int, seed: int = 0) -> Dataset:
    """6x6 single-channel images whose class is the sign of a fixed pattern correlation."""
    rng = np.random.default_rng(seed)
    pattern = rng.normal(size=(1, 6, 6))
    x = rng.normal(size=(n + 50, 1, 6, 6)) * 0.5
    y = ((x * pattern).sum(axis=(1, 2, 3)) > 0).astype(np.int64)
    return Dataset("images", x[:n], y[:n], x[n:], y[n:], 2)


def config(model, loss="cross_entropy", **kw):
    base = dict(model=model, loss=loss, data={"name": "blobs"}, learning_rate=0.5,
                lr_decay=0.1, clip_gamma=0.5, n_epochs=2, batch_size="full",
                k_values=[0, 1, 2, 4, 8],
                dtype="float64", device="cpu")
    base.update(kw)
    return config_from_dict(base)


def assert_radius_releases_refuse(bundle, x, match: str) -> None:
    """A bundle whose radii claim no nesting proof: its certificate says so, a release that
    spends radii (exp-radius) refuses it with a reason matching ``match``, and one that
    spends none (gs) releases from it."""
    import pytest

    import mechanisms
    from agt.certify import Certifier
    from agt.errors import PrivacyError
    assert not bundle.smooth_radii
    cert = Certifier(bundle).certify(x)
    assert not cert.smooth_radii
    inputs = mechanisms.Certified.from_certificate(cert)
    with pytest.raises(PrivacyError, match=match):
        mechanisms.make_mechanism("exp-radius", 1.0).check(inputs)
    mechanisms.make_mechanism("gs", 1.0).check(inputs)


def environ_seen_by_the_command_line(name: str, preset: str | None = None) -> str | None:
    """The value of environment variable `name` when the ``agt`` command line has started
    (its `main` ran a command) in a child process whose environment has `name` unset, or
    set to `preset`. The child checks that torch was not loaded before `main` set it."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != name}
    if preset is not None:
        env[name] = preset
    code = ("import os, sys\n"
            "from agt.cli.main import main\n"
            "assert 'torch' not in sys.modules\n"
            "main(['inspect', 'no-such-bundle.h5'])\n"
            f"print(os.environ.get({name!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def with_train(ds: Dataset, x: np.ndarray, y: np.ndarray) -> Dataset:
    return Dataset(ds.name, np.ascontiguousarray(x), np.ascontiguousarray(y, dtype=np.int64),
                   ds.x_test, ds.y_test, ds.n_classes, dict(ds.meta))


def restamp(path) -> None:
    """Recompute a bundle's content hash after a test edited the file, so that the reader's
    checks behind the hash (containment, nesting, NaN, ...) are what the test meets."""
    import h5py

    from agt import store

    with h5py.File(path, "a") as f:
        attrs = store._read_attrs(f, path)
        spec = store.ModelSpec.from_json(attrs["model"])
        arrays = [(p, np.asarray(f[p])) for p in
                  store.dataset_paths(spec.param_shapes, [int(k) for k in attrs["k_values"]],
                                      store.BALL_PATH in f)]
        f.attrs["content_sha256"] = store._content_hash(
            {k: v for k, v in attrs.items() if k != "content_sha256"}, arrays)


def logits(spec, params, x, dtype) -> torch.Tensor:
    net = Network(spec.layers, 0)
    with torch.no_grad():
        z, _ = net.forward_nominal({k: v.to(dtype) for k, v in params.items()},
                                   torch.as_tensor(x, dtype=dtype))
    return z


def classes(z: torch.Tensor) -> np.ndarray:
    if z.shape[-1] == 1:
        return (z[:, 0] > 0).long().numpy()
    return z.argmax(-1).numpy()


def inside(params: dict, lower: dict, upper: dict, j: int) -> tuple[bool, str]:
    for name, value in params.items():
        v = value.to(torch.float64)
        lo, hi = lower[name][j], upper[name][j]
        if not bool(((lo <= v) & (v <= hi)).all()):
            gap = float(torch.maximum(lo - v, v - hi).max())
            return False, f"{name} outside k-box index {j} by {gap:.3e}"
    return True, ""


def assert_each_holds_the_others_nominal(runs: dict, label: str = "") -> None:
    """For two training results of one config on different devices (name -> result): each
    one's nominal parameters lie in every k >= 1 box of the other (on the CPU)."""
    (a, ra), (b, rb) = runs.items()
    for (x, rx), (y, ry) in (((a, ra), (b, rb)), ((b, rb), (a, ra))):
        nominal = {k: v.cpu() for k, v in rx.nominal.items()}
        lower = {k: v.cpu() for k, v in ry.lower.items()}
        upper = {k: v.cpu() for k, v in ry.upper.items()}
        for j in range(1, len(ry.k_values)):
            ok, why = inside(nominal, lower, upper, j)
            assert ok, f"{label}{x}'s nominal, {y}'s boxes: {why}"
