"""The two entry points of the engine, `train` and `certify` (exported as `agt.train` and
`agt.certify`)."""

from __future__ import annotations

import sys

from agt.certify import Certificate, Certifier
from agt.config import TrainConfig
from agt.data import Dataset
from agt.store import Bundle, from_result
from agt.training import train as run_training


def train(config: TrainConfig, dataset: Dataset, *, progress: bool | None = None) -> Bundle:
    """Train with AGT and return the bounds bundle.

    Runs the nominal training rule (`agt.training`) and, in the same pass, computes for every
    k of ``config.k_values`` a box that holds the parameters training on any dataset within
    distance k of ``dataset`` could produce (AGT paper, Def. 4.3 and Thm 4.6).

    Args:
        config: a validated training configuration (`TrainConfig.create` or `load_config`).
        dataset: the private training data (and optionally a labelled test split).
        progress: show a progress bar on stderr (tqdm); None (the default): when stderr is
            a terminal.

    Returns:
        The `Bundle`: nominal (served) parameters, the boxes for every k, the record orders
        and the relations certified. Owner-only; `write_bundle` stores it as HDF5.
    """
    if progress is None:
        progress = _stderr_is_a_terminal()
    return from_result(run_training(config, dataset, progress=progress))


def _stderr_is_a_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):     # a replaced or closed stream
        return False


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
    trajectory = None
    if training_data is not None:
        from agt.trajectory import TrajectoryBounds
        trajectory = TrajectoryBounds(bundle, training_data)
    return Certifier(bundle, device=device, trajectory=trajectory).certify(x)
