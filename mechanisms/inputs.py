"""What crosses the door: the owner-only inputs of a release.

A release turns certified predictions into released labels; these types hold the
certified side. Everything in them (nominal predictions, stability radii, teacher votes)
is a deterministic function of the private data and is *owner-only*: it reaches the world
only through `Ledger.release` (ledger/), which records the spend and draws the noise.

`Certified`: one model's answers to Q queries. `prediction` is the class the served
nominal model gives; `radius` its stability radius: the index of the largest certified
box on the bundle's k grid (k* itself on a contiguous grid), -1 where not even the k = 0
box certifies. A radius has the smoothness property r(D') >= r(D) - 1 on neighbouring
datasets only if the bounds come from a selection rule with a nesting proof
(`Source.smooth_radii`); mechanisms that spend radii refuse inputs without it.

`Votes`: an ensemble's T teachers' votes (and their stability radii) for Q queries.

Both are checked once, when built, and their arrays are read-only from then on, so what
was checked stays true: `subset` (the service splits one certified batch per request)
takes rows of them without checking again.

`Source`: where the inputs come from: the private dataset they protect (the ledger refuses
inputs of another dataset), the neighbouring relations their certificates hold under, and
whether their radii are smooth. Both input types can be built from the certificates of
`agt` (`from_certificate`), which carry these fields; this package never imports `agt`
beyond its errors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agt.errors import DataError, PrivacyError, Problems
from mechanisms.checks import class_array, radius_array
from mechanisms.guarantee import RELATIONS

__all__ = ["Source", "Certified", "Votes"]


@dataclass(frozen=True)
class Source:
    """Provenance of certified inputs (see the module docstring)."""

    source_id: str
    dataset_sha256: str
    relations: tuple[str, ...]
    smooth_radii: bool
    selection: str = "exact"

    def __post_init__(self) -> None:
        problems = Problems("release source", PrivacyError)
        problems.check(isinstance(self.source_id, str), "source_id must be a string")
        problems.check(isinstance(self.dataset_sha256, str) and self.dataset_sha256,
                       "dataset_sha256 must be a non-empty string")
        problems.check(isinstance(self.relations, tuple) and self.relations and
                       all(r in RELATIONS for r in self.relations),
                       f"relations must be a non-empty tuple drawn from {RELATIONS}, got "
                       f"{self.relations!r}")
        problems.check(isinstance(self.smooth_radii, bool), "smooth_radii must be a bool")
        problems.raise_if_any()

    @staticmethod
    def of(certificate) -> "Source":
        """From an agt certificate (attributes source_id, dataset_sha256, relations,
        smooth_radii, selection).

        Args:
            certificate: an `agt.Certificate` or `agt.EnsembleCertificate`.

        Returns:
            The `Source` a release records.
        """
        return Source(str(certificate.source_id), str(certificate.dataset_sha256),
                      tuple(certificate.relations), bool(certificate.smooth_radii),
                      str(certificate.selection))


def _n_classes(n: object, problems: Problems) -> int:
    ok = isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 2
    problems.check(ok, f"n_classes must be an integer >= 2, got {n!r}")
    return int(n) if ok else 2


@dataclass(frozen=True, eq=False)
class Certified:
    """One model's certified answers to Q queries (owner-only; see the module docstring)."""

    prediction: NDArray[np.int64]
    radius: NDArray[np.int64] | None
    n_classes: int
    source: Source
    query_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        problems = Problems("certified inputs", DataError)
        n_classes = _n_classes(self.n_classes, problems)
        pred = class_array(self.prediction, n_classes, problems, "predictions")
        if pred is not None and pred.ndim != 1:
            problems.add(f"predictions must have shape (queries,), got {pred.shape}")
        radius = None
        if self.radius is not None:
            radius = radius_array(self.radius, problems, "radii")
            if radius is not None and pred is not None and radius.shape != pred.shape:
                problems.add(f"predictions and radii must have the same shape, got "
                             f"{pred.shape} and {radius.shape}")
        check_query_ids(self.query_ids, None if pred is None else len(pred), problems)
        problems.check(isinstance(self.source, Source), "source must be a mechanisms.Source")
        problems.raise_if_any()
        object.__setattr__(self, "prediction", _frozen(pred))
        object.__setattr__(self, "radius", None if radius is None else _frozen(radius))
        object.__setattr__(self, "n_classes", n_classes)

    @property
    def n_queries(self) -> int:
        """The number of queries Q."""
        return int(self.prediction.shape[0])

    @staticmethod
    def from_certificate(certificate, query_ids=None, *, with_radii: bool = True) -> "Certified":
        """From an agt `Certificate` (prediction, radius, n_classes and the Source fields).

        Args:
            certificate: an `agt.Certificate` (owner-only).
            query_ids: optional ids of the queries, for the ledger's record.
            with_radii: False to drop the radii (for mechanisms that spend none).

        Returns:
            The `Certified` inputs of `Ledger.release`.
        """
        return Certified(certificate.prediction, certificate.radius if with_radii else None,
                         int(certificate.n_classes), Source.of(certificate),
                         None if query_ids is None else tuple(query_ids))

    def subset(self, index) -> "Certified":
        """The same inputs for the queries selected by `index`: rows of the checked,
        read-only arrays, not checked again (a slice's rows are views, the query ids the
        same strings).

        Args:
            index: a slice or an index array.

        Returns:
            A `Certified` of the selected queries.
        """
        at, ids = _pick(self.n_queries, self.query_ids, index)
        return _checked(Certified, prediction=_frozen(self.prediction[at]),
                        radius=None if self.radius is None else _frozen(self.radius[at]),
                        n_classes=self.n_classes, source=self.source, query_ids=ids)


@dataclass(frozen=True, eq=False)
class Votes:
    """An ensemble's votes for Q queries: (Q, T) teacher votes and, optionally, the teachers'
    (Q, T) stability radii (owner-only; see the module docstring)."""

    votes: NDArray[np.int64]
    radii: NDArray[np.int64] | None
    n_classes: int
    source: Source
    query_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        problems = Problems("teacher votes", DataError)
        n_classes = _n_classes(self.n_classes, problems)
        votes = class_array(self.votes, n_classes, problems, "teacher votes")
        if votes is not None and (votes.ndim != 2 or votes.shape[1] < 1):
            problems.add(f"teacher votes must have shape (queries, teachers) with at least one "
                         f"teacher, got {votes.shape}")
            votes = None
        radii = None
        if self.radii is not None:
            radii = radius_array(self.radii, problems, "teacher radii")
            if radii is not None and votes is not None and radii.shape != votes.shape:
                problems.add(f"teacher radii must have the shape of the votes {votes.shape}, "
                             f"got {radii.shape}")
        check_query_ids(self.query_ids, None if votes is None else len(votes), problems)
        problems.check(isinstance(self.source, Source), "source must be a mechanisms.Source")
        problems.raise_if_any()
        object.__setattr__(self, "votes", _frozen(votes))
        object.__setattr__(self, "radii", None if radii is None else _frozen(radii))
        object.__setattr__(self, "n_classes", n_classes)

    @property
    def n_queries(self) -> int:
        """The number of queries Q."""
        return int(self.votes.shape[0])

    @property
    def n_teachers(self) -> int:
        """The number of teachers T."""
        return int(self.votes.shape[1])

    @staticmethod
    def from_certificate(certificate, query_ids=None, *, with_radii: bool = True) -> "Votes":
        """From an agt `EnsembleCertificate` (teacher_predictions, teacher_radii, n_classes
        and the Source fields).

        Args:
            certificate: an `agt.EnsembleCertificate` (owner-only).
            query_ids: optional ids of the queries, for the ledger's record.
            with_radii: False to drop the radii (for mechanisms that spend none).

        Returns:
            The `Votes` inputs of `Ledger.release`.
        """
        return Votes(certificate.teacher_predictions,
                     certificate.teacher_radii if with_radii else None,
                     int(certificate.n_classes), Source.of(certificate),
                     None if query_ids is None else tuple(query_ids))

    def subset(self, index) -> "Votes":
        """The same votes for the queries selected by `index` (rows of checked arrays, not
        checked again: `Certified.subset`).

        Args:
            index: a slice or an index array.

        Returns:
            A `Votes` of the selected queries.
        """
        at, ids = _pick(self.n_queries, self.query_ids, index)
        return _checked(Votes, votes=_frozen(self.votes[at]),
                        radii=None if self.radii is None else _frozen(self.radii[at]),
                        n_classes=self.n_classes, source=self.source, query_ids=ids)


def _frozen(arr: NDArray) -> NDArray:
    """`arr`, read-only: checked inputs stay as they were checked (their subsets, views or
    copies of checked rows, need no second check)."""
    arr.setflags(write=False)
    return arr


def _pick(n: int, ids: tuple[str, ...] | None, index):
    """(selector, ids) for the queries a 1-D numpy selection `index` (a slice, integer or
    boolean array) takes of n queries: the selector takes the same rows of every array
    (a slice as given, else the positions np.arange(n)[index], in its order), ids the same
    entries of `ids` (None: none). A DataError where `index` selects no run of queries (a
    single position, several dimensions)."""
    if isinstance(index, slice):
        return index, None if ids is None else ids[index]   # tuple slices as numpy does
    at = np.arange(n)[index]
    if at.ndim != 1:
        raise DataError("subset takes a slice or a 1-D integer or boolean array of query "
                        "positions")
    return at, None if ids is None else tuple([ids[i] for i in at.tolist()])


def _checked(cls, **fields):
    """An input object built from parts of a checked one, without checking them again
    (`subset`: rows of arrays that passed `__post_init__` and are read-only since)."""
    obj = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


def check_query_ids(ids, n: int | None, problems: Problems) -> None:
    if ids is None:
        return
    if not isinstance(ids, tuple) or not all(isinstance(i, str) for i in ids):
        problems.add("query_ids must be a tuple of strings")
    elif n is not None and len(ids) != n:
        problems.add(f"{len(ids)} query ids for {n} queries")
