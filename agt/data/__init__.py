"""Datasets: the `Dataset` value type and one loader per source.

Every loader returns a `Dataset` (float64 features, int64 labels) that has passed
`validate_dataset`. Loaders are chosen by name with `load_dataset(name, options)`; each
accepts a fixed set of option keys (unknown keys, wrong types and impossible values are
collected into one `ConfigError` naming the keys) and raises `DataError` for a missing or
malformed file, with a one-line message that says how to fix it.

Record order matters: AGT assigns batches as a function of the record index (agt.training,
`epoch_orders`), so every subsampling keeps the surviving records in file order and is a
deterministic function of the option `seed`.

  dataset.py   Dataset, validate_dataset, Dataset.from_arrays (numpy arrays in)
  blobs.py     generated Gaussian blobs (the embedded default; runs anywhere)
  npz.py       generic .npz training files and query files
  octmnist.py  MedMNIST OctMNIST (private set and public pre-training split)
  imdb.py      IMDB review embeddings (GPT-2, 768-d; embed_imdb.py makes them)
  digits.py    scikit-learn's 8 x 8 digits (optional dependency) and MNIST .npz archives
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from agt.data.blobs import blobs_features, load_blobs
from agt.data.dataset import Dataset, validate_dataset
from agt.data.digits import MNIST_FILENAME, load_digits_dataset, load_mnist
from agt.data.imdb import IMDB_FILENAME, load_imdb
from agt.data.npz import load_npz, load_npz_queries
from agt.data.octmnist import (
    OCTMNIST_CLASS_NAMES,
    OCTMNIST_FILENAME,
    load_octmnist,
    octmnist_public_split,
)
from agt.errors import ConfigError

__all__ = [
    "Dataset", "validate_dataset", "load_dataset", "blobs_features", "octmnist_public_split",
    "load_npz_queries", "DATASET_NAMES", "OCTMNIST_FILENAME", "IMDB_FILENAME",
    "OCTMNIST_CLASS_NAMES", "MNIST_FILENAME",
]

_LOADERS: dict[str, Callable[[Mapping[str, Any] | None, Path | None], Dataset]] = {
    "blobs": load_blobs,
    "npz": load_npz,
    "octmnist": load_octmnist,
    "imdb": load_imdb,
    "digits": load_digits_dataset,
    "mnist": load_mnist,
}
DATASET_NAMES = tuple(_LOADERS)


def load_dataset(name: str, options: Mapping[str, Any] | None = None,
                 base_dir: Path | None = None) -> Dataset:
    """Load dataset `name` (blobs, npz, octmnist, imdb, digits, mnist) with its `options`.

    Args:
        name: the loader (docs/data.md).
        options: the loader's options (the config's ``data`` keys beside ``name``).
        base_dir: the folder relative paths in the options resolve against (e.g. the config
            file's); default the working directory.

    Returns:
        The validated `Dataset`.

    Raises:
        ConfigError: an unknown name or a bad option (one error naming every key).
    """
    loader = _LOADERS.get(name) if isinstance(name, str) else None
    if loader is None:
        raise ConfigError(
            f"unknown dataset {name!r} in data.name; choose one of {', '.join(DATASET_NAMES)}")
    return loader(options, None if base_dir is None else Path(base_dir))
