"""The two entry points of the engine, `train` and `certify` (exported as `agt.train` and
`agt.certify`)."""

from __future__ import annotations

import sys
from dataclasses import replace

from agt.certify import Certificate, Certifier
from agt.config import TrainConfig
from agt.data import Dataset
from agt.data_checks import check_fit, check_training_data
from agt.scaling import InputScale
from agt.store import Bundle, from_result
from agt.training import train as run_training


def train(config: TrainConfig, dataset: Dataset, *, progress: bool | None = None,
          input_scale: InputScale | None = None) -> Bundle:
    """Train with AGT and return the bounds bundle.

    Runs the nominal training rule (`agt.training`) and, in the same pass, computes for every
    k of ``config.k_values`` a box that holds the parameters training on any dataset within
    distance k of ``dataset`` could produce (AGT paper, Def. 4.3 and Thm 4.6).

    Args:
        config: a validated training configuration (`TrainConfig.create` or `load_config`).
        dataset: the private training data (and optionally a labelled test split).
        progress: show a progress bar on stderr (tqdm); None (the default): when stderr is
            a terminal.
        input_scale: a public input scale (`agt.InputScale`: from public data or fixed
            bounds, never from `dataset`): training sees the scaled records, the bundle
            records the scale and certification applies it to every query.

    Returns:
        The `Bundle` with the nominal (served) parameters, the boxes for every k, the
        record orders and the relations certified. Owner-only; `write_bundle` stores it
        as HDF5.

    Warns (`agt.data_checks.DataWarning`, owner-only lines) when the features are far from
    unit scale, a class has no training record, or the trained model does no better than
    the majority class on its training records.
    """
    if progress is None:
        progress = _stderr_is_a_terminal()
    result = train_scaled(config, dataset, input_scale, progress=progress)
    bundle = from_result(result, input_scale=input_scale)
    check_bundle_fit(bundle, dataset)
    return bundle


def train_scaled(config: TrainConfig, dataset: Dataset, input_scale: InputScale | None, *,
                 progress: bool = False):
    """Train on `dataset` behind `input_scale` (if any), after checking the data.

    Args:
        config: the training configuration.
        dataset: the private data in its original units.
        input_scale: a public input scale, or None.
        progress: show a progress bar.

    Returns:
        The `agt.training.TrainResult`; its dataset hash is that of `dataset` as given (the
        private records), whatever the scale.
    """
    seen = dataset if input_scale is None else input_scale.apply_to(dataset)
    check_training_data(seen, scaled=input_scale is not None)
    result = run_training(config, seen, progress=progress)
    if input_scale is not None:
        result = replace(result, dataset_sha256=dataset.sha256())
    return result


def check_bundle_fit(bundle: Bundle, dataset: Dataset) -> list[str]:
    """`agt.data_checks.check_fit` of the bundle's served model on the training records.

    Args:
        bundle: the trained bundle.
        dataset: its training data in the original units.

    Returns:
        The warnings issued.
    """
    return check_fit(Certifier(bundle).predict(dataset.x_train), dataset.y_train)


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
