"""Audits from a data set: neighbouring data sets made by the relation, the bundle (or
ensemble) retrained on each through the public API, and the audit of a mechanism on the
two certified inputs (`mechanisms.audit`). What ``agt audit --config`` runs.

Neighbours (`neighbour_dataset`):
  replace-one, plant "label-flip": record i keeps its features, its label becomes
      (y + 1) mod C;
  replace-one, plant "boundary": record i becomes a planted record at the domain's
      boundary: every feature at the largest value of that feature in the training split
      (the corner of the data's bounding box), with the flipped label;
  add-remove: record i is removed (default the last, so that no other record changes its
      index, which fixes batches and teachers).
Both data sets train with the same config and seed; the queries are the test split's. Among
the queries the audit takes the one whose exact release laws on the two certified inputs
promise the largest lower bound (`mechanisms.audit.cases.choose_pair`; a choice made on
the laws, not on samples, so the confidence stands). Training costs two bundles (or two
ensembles): use small data.
"""

from __future__ import annotations

import numpy as np

from agt.errors import ConfigError, DataError

__all__ = ["PLANTS", "neighbour_dataset", "certified_inputs", "audit_dataset"]

PLANTS = ("label-flip", "boundary")


def neighbour_dataset(dataset, relation: str, *, index: int | None = None,
                      plant: str = "label-flip"):
    """A neighbour of `dataset` under `relation` (module docstring).

    Args:
        dataset: an agt Dataset.
        relation: "replace-one" or "add-remove".
        index: the record changed (default 0 for replace-one, the last for add-remove).
        plant: "label-flip" or "boundary" (replace-one only).

    Returns:
        The neighbouring Dataset (named after the change).

    Raises:
        ConfigError: an unknown relation or plant; DataError: an index out of range.
    """
    from agt.data import Dataset

    n = dataset.n_train
    if relation not in ("replace-one", "add-remove"):
        raise ConfigError(f"relation must be replace-one or add-remove, got {relation!r}")
    if plant not in PLANTS:
        raise ConfigError(f"plant must be one of {PLANTS}, got {plant!r}")
    i = (0 if relation == "replace-one" else n - 1) if index is None else int(index)
    if not 0 <= i < n:
        raise DataError(f"record index {i} is outside the training split (0..{n - 1})")
    if relation == "add-remove":
        keep = np.arange(n) != i
        return Dataset.from_arrays(dataset.x_train[keep], dataset.y_train[keep],
                                   dataset.x_test, dataset.y_test,
                                   n_classes=dataset.n_classes,
                                   name=f"{dataset.name} without record {i}")
    x, y = dataset.x_train.copy(), dataset.y_train.copy()
    y[i] = (y[i] + 1) % dataset.n_classes
    if plant == "boundary":
        x[i] = dataset.x_train.max(axis=0)
    return Dataset.from_arrays(x, y, dataset.x_test, dataset.y_test,
                               n_classes=dataset.n_classes,
                               name=f"{dataset.name} with record {i} replaced ({plant})")


def certified_inputs(config, dataset, *, n_teachers: int | None = None):
    """Train on `dataset` (one bundle, or an ensemble of `n_teachers`) and certify its test
    split: mechanisms.Certified, or Votes for an ensemble.

    Args:
        config: an agt TrainConfig.
        dataset: the Dataset (its test split holds the queries).
        n_teachers: None for one model, else the ensemble's size.

    Returns:
        The certified inputs (owner-only).
    """
    import agt
    from mechanisms.inputs import Certified, Votes

    if dataset.x_test is None or dataset.n_test == 0:
        raise DataError("the data set has no test split: the audit needs queries")
    if n_teachers is None:
        bundle = agt.train(config, dataset)
        return Certified.from_certificate(agt.certify(bundle, dataset.x_test))
    ensemble = agt.train_ensemble(config, dataset, int(n_teachers))
    return Votes.from_certificate(agt.EnsembleCertifier(ensemble).certify(dataset.x_test))


def audit_dataset(mechanism, config, dataset, *, relation: str = "replace-one",
                  plant: str = "label-flip", index: int | None = None,
                  n_teachers: int | None = None, samples: int = 20_000, seed: int = 0,
                  confidence: float = 0.95, progress: bool = False):
    """Audit `mechanism` on the bundle (or ensemble) trained on `dataset` and on its
    neighbour (module docstring).

    Args:
        mechanism: a mechanism object (registry protocol).
        config: the TrainConfig both data sets train with.
        dataset: the private data set (with a test split of queries).
        relation: the neighbouring relation.
        plant: how the replaced record is made ("label-flip" or "boundary").
        index: the record changed.
        n_teachers: train ensembles of this size (Votes inputs) instead of one model.
        samples: releases per side (as `mechanisms.audit.audit`).
        seed: the audit's seed.
        confidence: 1 - the false-alarm probability.
        progress: show progress bars.

    Returns:
        The AuditResult; its `extra` names the neighbour, the query and the certified
        radii or votes of both sides at that query (owner-only).
    """
    from mechanisms.audit import audit
    from mechanisms.audit.cases import Pair, choose_pair
    from mechanisms.audit.core import claim_for

    neighbour = neighbour_dataset(dataset, relation, index=index, plant=plant)
    first = certified_inputs(config, dataset, n_teachers=n_teachers)
    second = certified_inputs(config, neighbour, n_teachers=n_teachers)
    pairs = [Pair(first.subset([q]), second.subset([q]), f"query {q}")
             for q in range(first.n_queries)]
    delta = claim_for(mechanism, pairs[0].first, pairs[0].second, relation).delta
    pair, predicted, _ = choose_pair(mechanism, pairs, delta, samples)
    result = audit(mechanism, pair.first, pair.second, relation=relation, samples=samples,
                   seed=seed, confidence=confidence, progress=progress)
    described = {"neighbour": neighbour.name, "query": pair.change,
                 "predicted_bound": predicted}
    for side, inputs in (("first", pair.first), ("second", pair.second)):
        if hasattr(inputs, "prediction"):
            described[side] = {"prediction": int(inputs.prediction[0]),
                               "radius": int(inputs.radius[0])}
        else:
            described[side] = {"votes": inputs.votes[0].tolist(),
                               "radii": inputs.radii[0].tolist()}
    result.extra.update(described)
    return result
