"""experiments.audit: the neighbouring data sets the relation allows."""

from __future__ import annotations

import numpy as np
import pytest

from agt.data import Dataset
from agt.errors import ConfigError, DataError
from experiments.audit import neighbour_dataset


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 3))
    y = np.arange(12) % 3
    return Dataset.from_arrays(x, y, x[:4], y[:4], n_classes=3)


def test_replace_one_changes_exactly_one_record():
    ds = _data()
    flip = neighbour_dataset(ds, "replace-one", index=5)
    assert flip.n_train == ds.n_train
    changed = np.flatnonzero((flip.x_train != ds.x_train).any(axis=1) |
                             (flip.y_train != ds.y_train))
    assert changed.tolist() == [5]
    assert flip.y_train[5] == (ds.y_train[5] + 1) % 3
    np.testing.assert_array_equal(flip.x_train[5], ds.x_train[5])
    corner = neighbour_dataset(ds, "replace-one", plant="boundary")
    np.testing.assert_array_equal(corner.x_train[0], ds.x_train.max(axis=0))
    assert corner.y_train[0] != ds.y_train[0]
    np.testing.assert_array_equal(corner.x_train[1:], ds.x_train[1:])
    np.testing.assert_array_equal(corner.x_test, ds.x_test)         # the same queries


def test_add_remove_drops_the_last_record_by_default():
    ds = _data()
    fewer = neighbour_dataset(ds, "add-remove")
    assert fewer.n_train == ds.n_train - 1
    np.testing.assert_array_equal(fewer.x_train, ds.x_train[:-1])
    middle = neighbour_dataset(ds, "add-remove", index=3)
    np.testing.assert_array_equal(middle.y_train, np.delete(ds.y_train, 3))


def test_bad_neighbour_requests_are_refused():
    ds = _data()
    with pytest.raises(ConfigError, match="relation"):
        neighbour_dataset(ds, "swap")
    with pytest.raises(ConfigError, match="plant"):
        neighbour_dataset(ds, "replace-one", plant="noise")
    with pytest.raises(DataError, match="outside"):
        neighbour_dataset(ds, "replace-one", index=12)
