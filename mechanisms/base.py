"""Mechanism objects and their registry: the only code that draws release noise.

A mechanism is a frozen object whose parameters are validated once, at construction
(one PrivacyError naming every bad parameter). It offers

  guarantee(relation)          the per-query (eps, delta) it gives under `relation`;
  relations(inputs)            the relations that guarantee holds under for these inputs
                               (those their certificates hold under, or every relation
                               for mechanisms that need no certificate);
  check(inputs)                refuses inputs it cannot release (wrong kind, too many
                               classes, radii without a smoothness proof);
  release(inputs, rng)         draws the released labels (REFUSED = -1 where the mechanism
                               declines to answer). Product code never calls this directly:
                               `Ledger.release` (ledger/) records the spend first;
  correct_probability(inputs, y)  the exact probability that the release equals y, per
                               query (a refusal counts as wrong), used by experiments and
                               release plans for exact expected accuracies;
  answered_probability(inputs)  the exact probability, per query, of an answer (expectation.py).

`MECHANISMS` maps each registry name (the one name used by the CLI, the experiments and
the ledger) to its entry; `make_mechanism(name, epsilon, delta, **options)` builds one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from agt.errors import ConfigError, DataError, PrivacyError, Problems
from mechanisms.guarantee import RELATIONS, Guarantee, check_relation
from mechanisms.inputs import Certified, Votes
from mechanisms.noise import REFUSED

__all__ = ["Mechanism", "REFUSED", "MECHANISMS", "Entry", "MechanismInfo", "register",
           "make_mechanism", "describe_registry", "load_registry",
           "mechanism_names"]


class Mechanism(ABC):
    """Base class of every release mechanism (see the module docstring)."""

    #: Certified (single model) or Votes (ensemble)
    input_type: ClassVar[type] = Certified
    #: spends stability radii: needs them, and needs their smoothness proof
    uses_radii: ClassVar[bool] = False
    #: the largest number of classes the proof covers (None: any)
    max_classes: ClassVar[int | None] = None
    #: the guarantee needs no certificate and holds under every relation
    relation_free: ClassVar[bool] = False
    #: the guarantee is per query (one ledger entry each); False: for the whole release
    #: (a session), recorded as one entry
    per_query: ClassVar[bool] = True

    @property
    @abstractmethod
    def name(self) -> str:
        """The registry name."""

    @abstractmethod
    def guarantee(self, relation: str) -> Guarantee:
        """Per-query guarantee under `relation` (validated).

        Args:
            relation: "replace-one" or "add-remove".

        Returns:
            The `Guarantee` (eps, delta) of one released query.
        """

    @abstractmethod
    def _draw(self, inputs, rng: np.random.Generator) -> NDArray[np.int64]:
        """Released labels for validated inputs (the one place noise is drawn)."""

    @abstractmethod
    def _correct(self, inputs, y: NDArray[np.int64]) -> NDArray[np.float64]:
        """P(release == y) per query for validated inputs."""

    # -- shared ---------------------------------------------------------------------------
    def relations(self, inputs) -> tuple[str, ...]:
        """Relations under which `guarantee` holds for these inputs.

        Args:
            inputs: `Certified` or `Votes`.

        Returns:
            Every relation for a mechanism that spends no radius, else the certificates'.
        """
        return RELATIONS if self.relation_free else tuple(inputs.source.relations)

    def check(self, inputs) -> None:
        """Refuse inputs this mechanism cannot release, with one typed error.

        Args:
            inputs: `Certified` or `Votes`.

        Raises:
            DataError: inputs of the wrong kind.
            PrivacyError: too many classes, or radii that are missing or not smooth where the
                mechanism spends them.
        """
        if not isinstance(inputs, self.input_type):
            kind = {Certified: "a single model's Certified", Votes: "an ensemble's Votes"}.get(
                self.input_type, self.input_type.__name__)
            raise DataError(f"{self.name} releases {kind} inputs, got "
                            f"{type(inputs).__name__}")
        problems = Problems(self.name, PrivacyError)
        if self.max_classes is not None and inputs.n_classes > self.max_classes:
            problems.add(f"{self.name} is proven for at most {self.max_classes} classes; "
                         f"these inputs have {inputs.n_classes} (use a multi-class mechanism "
                         f"such as exp-radius or ptr)", DataError)
        if self.uses_radii:
            radii = inputs.radius if isinstance(inputs, Certified) else inputs.radii
            if radii is None:
                problems.add(f"{self.name} spends stability radii; certify the queries (the "
                             f"inputs carry no radii)", DataError)
            if not inputs.source.smooth_radii:
                problems.add(
                    f"{self.name} needs radii with r(D') >= r(D) - 1 on neighbours, which "
                    f"the bounds behind these inputs do not prove (selection rule "
                    f"'{inputs.source.selection}', or an agt version whose interval passes "
                    f"were not graded yet: agt inspect says which); retrain with this agt and "
                    f"selection: exact (or use a mechanism that spends no radii: gs, lnmax, "
                    f"ens-ptr-votes)")
        problems.raise_if_any()

    def guarantee_for(self, inputs, relation: str) -> Guarantee:
        """The per-query guarantee of releasing `inputs`, stated under `relation`: native
        where the inputs' certificates hold under it, else converted (guarantee.py).

        Args:
            inputs: `Certified` or `Votes`.
            relation: the relation to state it under.

        Returns:
            The `Guarantee`.

        Raises:
            PrivacyError: an unknown relation, or one no conversion reaches.
        """
        problems = Problems(self.name, PrivacyError)
        check_relation(relation, problems)
        problems.raise_if_any()
        native = self.relations(inputs)
        if relation in native:
            return self.guarantee(relation)
        errors = []
        for other in native:
            try:
                return self.guarantee(other).in_relation(relation)
            except PrivacyError as exc:
                errors.append(str(exc))
        raise PrivacyError(f"{self.name}: these inputs are certified under {', '.join(native)}"
                           f" only, which gives no {relation} guarantee"
                           + (f" ({'; '.join(errors)})" if errors else ""))

    def release(self, inputs, rng: np.random.Generator) -> NDArray[np.int64]:
        """Draw the released labels. Product code calls `Ledger.release`, which records the
        spend before it calls this.

        Args:
            inputs: `Certified` or `Votes` (checked by `check`).
            rng: the numpy Generator to draw from.

        Returns:
            (Q,) int64 labels; `REFUSED` where the mechanism declines to answer.

        Raises:
            PrivacyError: `rng` is not a numpy Generator, or the inputs fail `check`.
        """
        self.check(inputs)
        if not isinstance(rng, np.random.Generator):
            raise PrivacyError("release needs a numpy Generator (the ledger makes one from the "
                               "operating system's secure source)")
        labels = np.asarray(self._draw(inputs, rng), dtype=np.int64)
        return labels

    def correct_probability(self, inputs, y: ArrayLike) -> NDArray[np.float64]:
        """Exact probability, per query, that the release equals y (REFUSED counts as wrong).

        An owner-side analysis tool: a function of the radii, it draws nothing and spends
        nothing, and is owner-only.

        Args:
            inputs: `Certified` or `Votes`.
            y: (Q,) reference labels (true labels, or the served predictions).

        Returns:
            (Q,) float64 probabilities in [0, 1].

        Raises:
            DataError: `y` does not have one label per query.
        """
        self.check(inputs)
        y = np.asarray(y)
        if y.shape != (inputs.n_queries,):
            raise DataError(f"labels y must have shape ({inputs.n_queries},), got {y.shape}")
        return np.clip(np.asarray(self._correct(inputs, y.astype(np.int64)), np.float64), 0.0, 1.0)

    def answered_probability(self, inputs) -> NDArray[np.float64]:
        """Exact probability, per query, that the release is a label (not REFUSED).

        P(L != REFUSED) = sum_y P(L = y) over the C classes, since a release is one of them
        or a refusal; mechanisms with a cheaper form of the same law override this.

        Args:
            inputs: validated-on-call inputs of this mechanism (Q queries).

        Returns:
            (Q,) probabilities in [0, 1].

        Raises:
            DataError: inputs this mechanism cannot release.
        """
        total = sum(self.correct_probability(inputs, np.full(inputs.n_queries, y))
                    for y in range(inputs.n_classes))
        return np.clip(np.asarray(total, np.float64), 0.0, 1.0)


@dataclass(frozen=True)
class Entry:
    """A registry entry: the factory and what the CLI and planners need to know."""

    name: str
    factory: Callable[..., Mechanism]
    inputs: type            # Certified (single model) or Votes (ensemble)
    needs_delta: bool       # (eps, delta)-DP per query with delta > 0
    summary: str


MECHANISMS: dict[str, Entry] = {}

#: the modules whose mechanisms register themselves, in the registry's order
REGISTERING_MODULES = ("global_sens", "smooth", "ensemble", "pate", "radius", "convex",
                       "loss_perturbation")


def load_registry() -> dict[str, Entry]:
    """Import every registering module once (the registry fills as they load) and return
    `MECHANISMS`. Lazy so that ``import mechanisms`` stays cheap."""
    import importlib

    for module in REGISTERING_MODULES:
        importlib.import_module(f"mechanisms.{module}")
    return MECHANISMS


def register(name: str, *, inputs: type, needs_delta: bool, summary: str):
    """Register `factory(epsilon=..., delta=..., **options)` under `name` (one name per
    mechanism, shared by the CLI, the experiments and the ledger)."""
    def deco(factory):
        if name in MECHANISMS:
            raise RuntimeError(f"internal: mechanism {name!r} registered twice")
        MECHANISMS[name] = Entry(name, factory, inputs, needs_delta, summary)
        return factory
    return deco


def mechanism_names(inputs: type | None = None) -> tuple[str, ...]:
    """Registered mechanism names.

    Args:
        inputs: None for all, or `Certified` / `Votes` for those releasing that input.

    Returns:
        The names, in registry order.
    """
    return tuple(n for n, e in load_registry().items() if inputs is None or e.inputs is inputs)


@dataclass(frozen=True)
class MechanismInfo:
    """What a registered mechanism is, read off the mechanism itself (the docs' mechanism
    table is generated from these, so it cannot drift from the code)."""

    name: str
    inputs: str             # the input type's name: Certified, Votes, LinearModel, ...
    pure: bool              # eps-DP (no delta)
    per_query: bool         # one guarantee per query; False: one for the whole release
    max_classes: int | None
    spends_radii: bool      # needs radii with a smoothness proof
    any_relation: bool      # needs no certificate: its guarantee holds under every relation
    summary: str
    cls: str                # module.Class of the mechanism object


def describe_registry() -> list[MechanismInfo]:
    """One `MechanismInfo` per registered mechanism, in the registry's order. The properties
    are those of an instance built at a nominal epsilon (and delta), since some depend on
    the factory's options (a session or not)."""
    rows = []
    for name, entry in load_registry().items():
        mech = make_mechanism(name, 1.0, 1e-6 if entry.needs_delta else None)
        rows.append(MechanismInfo(
            name=name, inputs=entry.inputs.__name__, pure=not entry.needs_delta,
            per_query=mech.per_query, max_classes=mech.max_classes,
            spends_radii=mech.uses_radii, any_relation=mech.relation_free,
            summary=entry.summary, cls=f"{type(mech).__module__}.{type(mech).__name__}"))
    return rows


def make_mechanism(name: str, epsilon: float, delta: float | None = None,
                   **options) -> Mechanism:
    """The mechanism registered as `name` with per-query `epsilon`.

    Args:
        name: a registered name (`mechanism_names`, docs/choosing-a-mechanism.md).
        epsilon: the per-query (or per-release) eps > 0.
        delta: the per-query delta in (0, 1) for an (eps, delta) mechanism; None otherwise.
        **options: the mechanism's own options (e.g. a PTR threshold).

    Returns:
        The `Mechanism`.

    Raises:
        ConfigError: an unknown name.
        PrivacyError: a missing delta, or a delta given to a pure eps mechanism.
    """
    entry = load_registry().get(name)
    if entry is None:
        raise ConfigError(f"unknown mechanism {name!r}; choose one of "
                          f"{', '.join(sorted(MECHANISMS))}")
    if entry.needs_delta and delta is None:
        raise PrivacyError(f"{name} is (eps, delta)-DP per query: give a delta in (0, 1)")
    if not entry.needs_delta and delta not in (None, 0, 0.0):
        raise PrivacyError(f"{name} is pure eps-DP per query and takes no delta "
                           f"(got {delta!r})")
    kwargs = dict(options, epsilon=epsilon)
    if entry.needs_delta:
        kwargs["delta"] = delta
    mech = entry.factory(**kwargs)
    if mech.name != name:
        raise RuntimeError(f"internal: factory of {name!r} made {mech.name!r}")
    return mech
