"""IMDB sentiment as pre-computed review embeddings (``imdb_embeddings.npz``).

``x_train`` (n, 768) float, ``y_train`` (n,) in {0, 1} (1 = positive review), ``x_test``
(m, 768) float, ``y_test`` (m,) in {0, 1}. Each row is the mean over tokens of GPT-2's last
hidden states for one review (768-d). Produce it with
``python -m agt.data.embed_imdb --reviews aclImdb --out DIR/imdb_embeddings.npz`` (docs/data.md
section Data).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from agt.data.dataset import Dataset, validate_dataset
from agt.data.options import (
    NpzArchive,
    Options,
    as_features,
    as_labels,
    check_pair,
    check_same_features,
    subsample_sorted,
)
from agt.errors import DataError

IMDB_FILENAME = "imdb_embeddings.npz"
_IMDB_HINT = (
    "produce it by embedding the IMDB reviews with GPT-2 via `transformers` (mean of the last "
    "hidden states, 768-d): `python -m agt.data.embed_imdb --reviews aclImdb --out "
    "DIR/imdb_embeddings.npz` (see docs/data.md), then pass --data-dir DIR or set "
    "data.data_dir"
)

def load_imdb(options: Mapping[str, Any] | None, base_dir: Path | None) -> Dataset:
    opts = Options("imdb", options, ("path", "data_dir", "max_train", "seed"))
    max_train = opts.int("max_train", None, minimum=1)
    seed = opts.int("seed", 0, minimum=0)
    path = opts.file(base_dir, IMDB_FILENAME, _IMDB_HINT)
    with NpzArchive(path) as f:
        x = as_features(f.get("x_train"), f"{path.name}:x_train")
        y = as_labels(f.get("y_train"), f"{path.name}:y_train")
        x_test = as_features(f.get("x_test"), f"{path.name}:x_test")
        y_test = as_labels(f.get("y_test"), f"{path.name}:y_test")
    for split, arr in (("x_train", x), ("x_test", x_test)):
        if arr.ndim != 2:
            raise DataError(f"{path.name}:{split} must have shape (n, dim), got {arr.shape}")
    check_pair(x, y, f"{path.name} (x_train, y_train)")
    check_pair(x_test, y_test, f"{path.name} (x_test, y_test)")
    check_same_features(x, x_test, "imdb")
    n_source = int(x.shape[0])
    source_index = None
    if max_train is not None and max_train < n_source:
        source_index = subsample_sorted(np.random.default_rng(seed), np.arange(n_source), max_train)
        x, y = x[source_index], y[source_index]
    ds = Dataset(
        name="imdb",
        x_train=np.ascontiguousarray(x), y_train=np.ascontiguousarray(y),
        x_test=x_test, y_test=y_test, n_classes=2,
        meta={"source": str(path),
              "options": {"max_train": max_train, "seed": seed},
              "label_meaning": {"0": "negative", "1": "positive"},
              "embedding_dim": int(x.shape[1]),
              "n_train_source": n_source,
              "n_train": int(x.shape[0]),
              "n_test": int(x_test.shape[0])},
        source_index=None if source_index is None else source_index.astype(np.int64),
    )
    return validate_dataset(ds)

