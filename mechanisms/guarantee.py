"""`Guarantee`: the differential-privacy statement a release comes with, and the rule that
moves a guarantee from one neighbouring relation to another.

A release with Guarantee(epsilon, delta, relation, ...) is (epsilon, delta)-DP *per query*
with respect to `relation`: "replace-one" (bounded DP: one record replaced) or "add-remove"
(unbounded DP: one record added or removed). Releasing Q queries composes Q such guarantees
(accounting.py); a ledger composes only guarantees of its own relation (ledger/).

Conversion (group privacy; Dwork-Roth 2014, Thm 2.2 and its (eps, delta) form): replacing a
record is removing it and adding another, so two add-remove steps. An (eps, delta)-DP
mechanism under add-remove is therefore (2 eps, (1 + e^eps) delta)-DP under replace-one:
P[M(D) in S] <= e^eps (e^eps P[M(D'') in S] + delta) + delta. The other way has no
conversion: replace-one neighbours have equal sizes and say nothing about adding a record.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from agt.errors import PrivacyError
from mechanisms.checks import check_delta, check_epsilon, privacy_problems
from mechanisms.rdp import curve_problem

REPLACE_ONE = "replace-one"
ADD_REMOVE = "add-remove"
RELATIONS: tuple[str, ...] = (REPLACE_ONE, ADD_REMOVE)


def check_relation(relation: object, problems) -> None:
    """The neighbouring relation must be one of RELATIONS."""
    if relation not in RELATIONS:
        problems.add(f"relation must be one of {RELATIONS}, got {relation!r}", PrivacyError)


def _up(x: float) -> float:
    """x raised by a relative 1e-15 and one ulp: above the three roundings of (1 + e^eps)
    delta (exp, the sum, the product; one ulp each was not enough, a review found 4 % of
    random conversions recording up to 1.1e-16 too little)."""
    return math.nextafter(x * (1.0 + 1e-15), math.inf) if math.isfinite(x) else x


@dataclass(frozen=True)
class Guarantee:
    """Per-query (epsilon, delta)-DP with respect to `relation`, given by `mechanism`.

    delta = 0 means pure epsilon-DP. `note` says where the guarantee comes from (theorem and
    calibration), for the record written next to the release. `rdp`, where the mechanism
    states one, is its per-query Renyi curve on `mechanisms.rdp.ORDERS` (what an rdp ledger
    composes; (epsilon, delta) is that curve converted at delta).
    """

    epsilon: float
    delta: float
    relation: str
    mechanism: str
    note: str = ""
    rdp: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        problems = privacy_problems()
        check_epsilon(self.epsilon, problems)
        check_delta(self.delta, problems, allow_zero=True)
        check_relation(self.relation, problems)
        if not isinstance(self.mechanism, str) or not self.mechanism:
            problems.add(f"mechanism must be a non-empty name, got {self.mechanism!r}")
        if self.rdp is not None:
            problem = curve_problem(self.rdp)
            if problem is not None:
                problems.add(problem)
            else:
                object.__setattr__(self, "rdp", tuple(float(v) for v in self.rdp))
        problems.raise_if_any()

    @property
    def is_pure(self) -> bool:
        """True for pure epsilon-DP (delta = 0)."""
        return self.delta == 0

    def in_relation(self, relation: str) -> "Guarantee":
        """This guarantee stated under `relation` (see the module docstring).

        Args:
            relation: "replace-one" or "add-remove".

        Returns:
            The `Guarantee` under `relation` (itself when it is already stated there).

        Raises:
            PrivacyError: no conversion holds.
        """
        if relation == self.relation:
            return self
        if self.relation == ADD_REMOVE and relation == REPLACE_ONE:
            eps = 2.0 * self.epsilon
            # e^eps overflows above eps ~ 709.8, where the delta is useless anyway
            grown = math.inf if self.epsilon > 700 else (1.0 + math.exp(self.epsilon)) * self.delta
            delta = 0.0 if self.delta == 0 else _up(grown) if math.isfinite(grown) else math.inf
            if not math.isfinite(eps) or (self.delta > 0 and delta >= 1.0):
                raise PrivacyError(f"the add-remove guarantee ({self.epsilon}, {self.delta}) "
                                   f"gives no useful replace-one guarantee")
            return dataclasses.replace(   # (no Renyi curve survives this conversion here)
                self, epsilon=eps, delta=delta, relation=REPLACE_ONE, rdp=None,
                note=f"{self.note}; converted from add-remove ({self.epsilon!r}, "
                     f"{self.delta!r}) by group privacy over 2 records".lstrip("; "))
        raise PrivacyError(f"a {self.relation} guarantee says nothing about {relation} "
                           f"neighbours; use a ledger of relation {self.relation}")
