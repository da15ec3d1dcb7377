"""Check before spending: refuse the owner's own release when it is expected to return
almost nothing.

A release is refused, before anything is charged, when

* it is a stability-gated session (svt, ens-svt) whose gate threshold T exceeds the largest
  radius the k grid can certify: every query's radius r <= r_max < T, so a query is stable
  only when the noises alone clear the gap T - r;
* it is a PTR release (ptr) whose threshold ln(1/delta) / eps exceeds that largest radius:
  no query passes but by the Laplace noise;
* its exact expected answered fraction N = (1/Q) sum_i P(L_i != REFUSED)
  (mechanisms/expectation.py) is below `min_answered` (default 5%).

The owner may override (`force`). This check is for the owner's own releases (the CLI
release commands and the library): the reason is a function of the radii, so it is
owner-only, and a service never refuses a client by such a rule (that refusal would itself
be an unaccounted release of radius information).
"""

from __future__ import annotations

import numpy as np

from agt.errors import ConfigError, ReleaseRefusedError
from mechanisms.base import Mechanism
from mechanisms.expectation import Expectation, expect
from mechanisms.inputs import Votes

__all__ = ["MIN_ANSWERED", "largest_radius", "refusal", "check_release",
           "check_min_answered"]

#: the default least expected answered fraction of a release
MIN_ANSWERED = 0.05


def check_min_answered(min_answered: object) -> None:
    """Validate a least expected answered fraction.

    Args:
        min_answered: the value given.

    Raises:
        ConfigError: not a number in [0, 1].
    """
    if isinstance(min_answered, bool) or not isinstance(min_answered, (int, float)) \
            or not 0.0 <= min_answered <= 1.0:
        raise ConfigError(f"min_answered must be a fraction in [0, 1], got {min_answered!r}")


def largest_radius(inputs, n_k_values: int) -> int:
    """The largest radius a release's inputs can have on a k grid of `n_k_values` values.

    A single model's radius is a grid index, at most n - 1. An ensemble's min-cost radius
    grows with the teachers' radii and their agreement, so its largest value is that of
    unanimous votes with every teacher at radius n - 1 (`votes.ensemble_radius`).

    Args:
        inputs: `Certified` or `Votes`.
        n_k_values: the length of the bundle's (or ensemble's) k grid, >= 1.

    Returns:
        r_max >= 0.

    Raises:
        ConfigError: n_k_values < 1.
    """
    if isinstance(n_k_values, bool) or not isinstance(n_k_values, (int, np.integer)) \
            or n_k_values < 1:
        raise ConfigError(f"the k grid must have at least one value, got {n_k_values!r}")
    top = int(n_k_values) - 1
    if isinstance(inputs, Votes):
        from mechanisms.votes import ensemble_radius
        t = inputs.n_teachers
        return int(ensemble_radius(np.zeros((1, t), np.int64), np.full((1, t), top, np.int64),
                                   "tight", inputs.n_classes)[0])
    return top


def _threshold_problem(mechanism: Mechanism, r_max: int) -> str | None:
    from mechanisms.noise import ptr_threshold
    from mechanisms.radius import RadiusPTR, SparseVectorGate

    if isinstance(mechanism, SparseVectorGate) and mechanism.threshold > r_max:
        return (f"{mechanism.name}'s gate threshold T = {mechanism.threshold} is above the "
                f"largest radius the k grid certifies ({r_max}): every query is unstable")
    if isinstance(mechanism, RadiusPTR):
        t = ptr_threshold(mechanism.epsilon, mechanism.delta)
        if t > r_max:
            return (f"ptr's threshold ln(1/delta)/eps = {t:.4g} is above the largest radius "
                    f"the k grid certifies ({r_max}): a query passes only by noise")
    return None


def check_release(mechanism: Mechanism, inputs, *, n_k_values: int | None = None,
                  min_answered: float = MIN_ANSWERED, force: bool = False,
                  labels=None) -> Expectation:
    """Check a release before it is charged (module docstring) and return what it is
    expected to return.

    Args:
        mechanism: the mechanism at the parameters to be charged.
        inputs: its owner-only inputs (the queries of this release, in order).
        n_k_values: the length of the k grid behind the radii; None skips the threshold
            checks.
        min_answered: the least expected answered fraction N, in [0, 1].
        force: the owner's explicit override: nothing is refused.
        labels: optional (Q,) labels, for the expected accuracy.

    Returns:
        The release's exact `Expectation` (answered, agreement, accuracy).

    Raises:
        ReleaseRefusedError: (unless `force`) a threshold no query can pass, or N below
            `min_answered`; a one-line reason that names the override.
        ConfigError: min_answered outside [0, 1].
    """
    expectation = expect(mechanism, inputs, labels)
    reason = None if force else refusal(mechanism, inputs, expectation, n_k_values,
                                        min_answered)
    if reason is not None:
        raise ReleaseRefusedError(f"refused before spending (owner-only: the reason depends on "
                                  f"the radii): {reason}; nothing was charged; override with "
                                  f"--force (library: force=True)")
    return expectation


def refusal(mechanism: Mechanism, inputs, expectation: Expectation,
            n_k_values: int | None = None, min_answered: float = MIN_ANSWERED) -> str | None:
    """Why the check before spending refuses a release, or None when it does not.

    Args:
        mechanism: the mechanism at the parameters to be charged.
        inputs: its inputs.
        expectation: the release's `Expectation` (`expectation.expect`).
        n_k_values: the length of the k grid behind the radii; None skips the threshold
            rules.
        min_answered: the least expected answered fraction, in [0, 1].

    Returns:
        A one-line reason (module docstring's rules, in order), or None.

    Raises:
        ConfigError: min_answered outside [0, 1].
    """
    check_min_answered(min_answered)
    if n_k_values is not None and mechanism.uses_radii:
        problem = _threshold_problem(mechanism, largest_radius(inputs, n_k_values))
        if problem:
            return (f"{problem} (expected answered {expectation.answered:.1%}); raise epsilon "
                    f"or use exp-radius")
    if expectation.answered < min_answered:
        return (f"{mechanism.name} is expected to answer {expectation.answered:.1%} of the "
                f"{inputs.n_queries} queries, below the minimum {min_answered:.1%} "
                f"(min_answered, --min-answered); raise epsilon or use exp-radius")
    return None
