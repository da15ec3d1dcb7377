"""`Guarantee`: the differential-privacy statement a release comes with.

A release with Guarantee(epsilon, delta, relation, ...) is (epsilon, delta)-DP *per query*
with respect to `relation`, the neighbouring relation the bounds bundle certifies:
"replace-one" (bounded DP: one record replaced) or "add-remove" (unbounded DP: one record
added or removed). The mechanisms never choose the relation; the caller passes the one stated
in the bundle. Releasing Q queries composes Q such guarantees (see accounting.py, ledger.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mechanisms._checks import Problems, check_delta, check_epsilon

RELATIONS: tuple[str, ...] = ("replace-one", "add-remove")


def check_relation(relation: object, problems: Problems) -> None:
    """The neighbouring relation must be one of RELATIONS."""
    if relation not in RELATIONS:
        problems.privacy.append(
            f"relation must be one of {RELATIONS} (the one the bundle certifies), got {relation!r}")


@dataclass(frozen=True)
class Guarantee:
    """Per-query (epsilon, delta)-DP with respect to `relation`, given by `mechanism`.

    delta = 0 means pure epsilon-DP. `note` says where the guarantee comes from (theorem and
    calibration), for the record written next to the release.
    """

    epsilon: float
    delta: float
    relation: str
    mechanism: str
    note: str = ""

    def __post_init__(self) -> None:
        problems = Problems()
        check_epsilon(self.epsilon, problems)
        check_delta(self.delta, problems, allow_zero=True)
        check_relation(self.relation, problems)
        if not isinstance(self.mechanism, str) or not self.mechanism:
            problems.privacy.append(f"mechanism must be a non-empty name, got {self.mechanism!r}")
        problems.raise_if_any()

    @property
    def is_pure(self) -> bool:
        """True for pure epsilon-DP (delta = 0)."""
        return self.delta == 0

