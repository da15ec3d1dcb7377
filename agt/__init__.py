"""agt: Abstract Gradient Training for smooth-sensitivity private prediction.

The certification engine: train a model with sound interval bounds on the parameters that
any dataset within distance k could produce, store them, and find each query's certified
stability radius. It adds no noise and never imports `mechanisms`, the sibling package that
turns certificates into private labels through its ledger.

The public names below load on first use (PEP 562), so ``import agt`` is cheap: it loads
neither torch nor h5py and changes no environment variable. A program that trains many
small models next to other busy processes, or trains on CUDA, should set
``OMP_WAIT_POLICY=PASSIVE`` and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` before torch loads, as
the ``agt`` command does (`agt.threads.recommended_environment`).

Example (the quick start of the documentation, run by its tests)::

    import numpy as np, torch, agt, mechanisms

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 6)); y = (x[:, 0] + 0.3 * x[:, 1] > 0).astype(int)
    ds = agt.Dataset.from_arrays(x[:500], y[:500], x[500:], y[500:])
    cfg = agt.TrainConfig.create(torch.nn.Sequential(torch.nn.Linear(6, 2)),
                                 "cross_entropy", learning_rate=2.0, clip_gamma=0.1,
                                 k_values="0..49")
    bundle = agt.train(cfg, ds)                    # nominal model + bounds for every k
    cert = agt.certify(bundle, ds.x_test)          # owner-only: predictions and radii
    with mechanisms.Ledger.open("ledger.db", budget_epsilon=100.0) as ledger:
        out = ledger.release(mechanisms.make_mechanism("exp-radius", 1.0),
                             mechanisms.Certified.from_certificate(cert))
    out.labels, out.guarantee                      # what may be published
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agt.version import __version__

if TYPE_CHECKING:          # for type checkers and the API reference; not run
    from agt.certify import Certificate, Certifier
    from agt.config import TrainConfig, config_from_dict, load_config
    from agt.data import Dataset, load_dataset
    from agt.ensemble import (Ensemble, EnsembleCertificate, EnsembleCertifier,
                              read_ensemble, train_ensemble, write_ensemble)
    from agt.errors import AGTError
    from agt.kgrid import KGrid
    from agt.models import ModelSpec
    from agt.store import Bundle, read_bundle, write_bundle
    from agt.training import TrainResult
    from agt.training import train as train_result

#: public name -> the module that defines it (loaded on first access)
_LAZY = {
    "Certificate": "agt.certify", "Certifier": "agt.certify",
    "TrainConfig": "agt.config", "config_from_dict": "agt.config", "load_config": "agt.config",
    "Dataset": "agt.data", "load_dataset": "agt.data",
    "Ensemble": "agt.ensemble", "EnsembleCertificate": "agt.ensemble",
    "EnsembleCertifier": "agt.ensemble", "read_ensemble": "agt.ensemble",
    "write_ensemble": "agt.ensemble", "train_ensemble": "agt.ensemble",
    "AGTError": "agt.errors",
    "KGrid": "agt.kgrid",
    "ModelSpec": "agt.models",
    "Bundle": "agt.store", "read_bundle": "agt.store", "write_bundle": "agt.store",
    "TrainResult": "agt.training",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name == "train_result":
        value = importlib.import_module("agt.training").train
    else:
        # a submodule used as an attribute (``agt.store.X`` after ``import agt``)
        try:
            value = importlib.import_module(f"agt.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"agt.{name}":
                raise
            raise AttributeError(f"module 'agt' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def train(config: TrainConfig, dataset: Dataset, *, progress: bool = False) -> Bundle:
    """Train with AGT and return the bounds bundle.

    Runs the nominal training rule (`agt.training`) and, in the same pass, computes for every
    k of ``config.k_values`` a box that holds the parameters training on any dataset within
    distance k of ``dataset`` could produce (AGT paper, Def. 4.3 and Thm 4.6).

    Args:
        config: a validated training configuration (`TrainConfig.create` or `load_config`).
        dataset: the private training data (and optionally a labelled test split).
        progress: show a progress bar on stderr.

    Returns:
        The `Bundle`: nominal (served) parameters, the boxes for every k, the record orders
        and the relations certified. Owner-only; `write_bundle` stores it as HDF5.
    """
    from agt.store import from_result
    from agt.training import train as run_training

    return from_result(run_training(config, dataset, progress=progress))


def certify(bundle: Bundle, x, *, device: str = "cpu", training_data: Dataset | None = None
            ) -> Certificate:
    """Certify queries: the served model's prediction and its stability radius.

    A query is certified at k when every parameter in the k-box predicts the served model's
    class (AGT paper, Lemma 4.4); its radius is the grid index of the largest certified k
    (-1 where even k = 0 does not certify), which moves by at most one between neighbouring
    datasets (`agt.certify`).

    Args:
        bundle: a bounds bundle (`train` or `read_bundle`).
        x: the queries, an array of shape (n, *input_shape).
        device: where to evaluate the boxes ("cpu" or "cuda").
        training_data: for a linear head's bundle from the interval pass, also certify by
            the margin bound along the training run (`agt.trajectory`; replace-one only).

    Returns:
        A `Certificate` with per-query predictions, largest certified k and radius.
        Owner-only: radii are deterministic functions of the private data.
    """
    from agt.certify import Certifier

    trajectory = None
    if training_data is not None:
        from agt.trajectory import TrajectoryBounds
        trajectory = TrajectoryBounds(bundle, training_data)
    return Certifier(bundle, device=device, trajectory=trajectory).certify(x)


__all__ = [
    "train", "certify", "train_ensemble", "read_bundle", "write_bundle", "read_ensemble",
    "write_ensemble", "Bundle", "Certificate", "Certifier", "Dataset", "Ensemble",
    "EnsembleCertificate", "EnsembleCertifier", "KGrid", "ModelSpec", "TrainConfig",
    "TrainResult", "AGTError", "config_from_dict", "load_config", "load_dataset",
    "train_result", "__version__",
]
