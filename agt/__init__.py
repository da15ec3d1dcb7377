"""agt: Abstract Gradient Training for smooth-sensitivity private prediction.

The certification engine: train a model with sound interval bounds on the parameters that
any dataset within distance k could produce, store them, and find each query's certified
stability radius. It adds no noise and never imports `mechanisms`, the sibling package that
turns certificates into private labels through its ledger.

The public names below load on first use (PEP 562), so ``import agt`` is cheap: it loads
neither torch nor h5py and changes no environment variable. The first use of a public name
gives the program the ``agt`` command's threading settings before torch loads
(``OMP_WAIT_POLICY=PASSIVE``, ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, a user's own values win),
or warns once when torch was imported first (`agt.threads.prepare_first_use`).

A first run (train, certify, release through a ledger) is the quick start of the README and
of docs/getting-started.md, which the tests run.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from agt.version import __version__

if TYPE_CHECKING:          # for type checkers and the API reference; not run
    from agt.api import certify, train
    from agt.certify import Certificate, Certifier
    from agt.config import TrainConfig, config_from_dict, load_config
    from agt.data import Dataset, load_dataset
    from agt.ensemble import (
        Ensemble,
        EnsembleCertificate,
        EnsembleCertifier,
        read_ensemble,
        train_ensemble,
        write_ensemble,
    )
    from agt.errors import AGTError
    from agt.kgrid import KGrid
    from agt.models import ModelSpec
    from agt.scaling import InputScale
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
    "KGrid": "agt.kgrid", "InputScale": "agt.scaling",
    "ModelSpec": "agt.models",
    "Bundle": "agt.store", "read_bundle": "agt.store", "write_bundle": "agt.store",
    "TrainResult": "agt.training",
    "train": "agt.api", "certify": "agt.api",
}


def __getattr__(name: str) -> Any:
    if not name.startswith("_"):
        from agt.threads import prepare_first_use
        prepare_first_use()
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


class _Package(types.ModuleType):
    """The package object: loading the submodule ``agt.certify`` must not replace the
    function `certify` of the same name (the import system sets a loaded submodule as an
    attribute of its package; the submodule stays in ``sys.modules``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "certify" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "train", "certify", "train_ensemble", "read_bundle", "write_bundle", "read_ensemble",
    "write_ensemble", "Bundle", "Certificate", "Certifier", "Dataset", "Ensemble",
    "EnsembleCertificate", "EnsembleCertifier", "InputScale", "KGrid", "ModelSpec", "TrainConfig",
    "TrainResult", "AGTError", "config_from_dict", "load_config", "load_dataset",
    "train_result", "__version__",
]
