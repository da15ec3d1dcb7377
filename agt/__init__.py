"""agt: Abstract Gradient Training for smooth-sensitivity private prediction.

The certification engine: train a model with sound interval bounds on the parameters that
any dataset within distance k could produce, store them, and find each query's certified
stability radius. It adds no noise and never imports `mechanisms`, the sibling package that
turns certificates into private labels through its ledger.

    import torch, agt, mechanisms
    # x_train (n, 6), y_train (n,) in {0, 1}, x_test, y_test, x_query: numpy arrays
    ds = agt.Dataset.from_arrays(x_train, y_train, x_test, y_test)
    cfg = agt.TrainConfig.create(torch.nn.Sequential(torch.nn.Linear(6, 2)),
                                 "cross_entropy", learning_rate=2.0, clip_gamma=0.06,
                                 k_values="0..99")
    bundle = agt.train(cfg, ds)                       # nominal model + bounds for every k
    cert = agt.Certifier(bundle).certify(x_query)     # owner-only: predictions and radii
    # a budget for every query: exp-radius at eps 1.0 costs 1.0 per query (standard
    # composition); a refused release records nothing
    with mechanisms.Ledger.open("ledger.db", budget_epsilon=1.0 * len(x_query)) as ledger:
        out = ledger.release(mechanisms.make_mechanism("ss-cauchy", 1.0),
                             mechanisms.Certified.from_certificate(cert))
    out.labels, out.guarantee                         # what may be published
"""

import os as _os
import sys as _sys

from agt.threads import passive_wait as _passive_wait

# OpenMP reads OMP_WAIT_POLICY once, when torch loads it. Spinning waits made a small
# `agt train` 10-17x slower next to one busy process on 2 cores (benchmarks/bench_threads.py)
# and the Blobs ensembles study 5x slower, so unless the user chose a policy, agt asks for
# passive waits -- effective only when agt is imported before torch (the CLI always is).
if "torch" not in _sys.modules:
    _passive_wait()
# Deterministic cuBLAS (agt.tensors.strict_kernels, on CUDA) needs a fixed workspace, read
# from the environment; a user's setting wins. Nothing reads it on CPU.
_os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

from agt.certify import Certificate, Certifier  # noqa: E402
from agt.config import TrainConfig, config_from_dict, load_config  # noqa: E402
from agt.data import Dataset, load_dataset  # noqa: E402
from agt.ensemble import (  # noqa: E402
    Ensemble,
    EnsembleCertificate,
    EnsembleCertifier,
    read_ensemble,
    train_ensemble,  # noqa: E402
    write_ensemble,
)
from agt.errors import AGTError  # noqa: E402
from agt.kgrid import KGrid  # noqa: E402
from agt.models import ModelSpec  # noqa: E402
from agt.store import Bundle, read_bundle, write_bundle  # noqa: E402
from agt.training import TrainResult  # noqa: E402
from agt.training import train as train_result  # noqa: E402
from agt.version import __version__  # noqa: E402,F401


def train(config: TrainConfig, dataset: Dataset, *, progress: bool = False) -> Bundle:
    """Run AGT (nominal training and bounds for every k of ``config.k_values``) and return
    the bounds bundle (`write_bundle` stores it)."""
    from agt.store import from_result

    return from_result(train_result(config, dataset, progress=progress))


def certify(bundle: Bundle, x, *, device: str = "cpu", training_data: Dataset | None = None
            ) -> Certificate:
    """Per query: the served model's prediction and its stability radius (owner-only).
    ``training_data`` (a linear head's bundle from the interval pass): also certify by the
    margin bound along the training run (agt/trajectory.py; replace-one)."""
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
    "train_result",
]
