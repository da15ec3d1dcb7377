"""Typed errors and the one validation vocabulary of agt and mechanisms.

Every error a user can cause is a subclass of `AGTError` (and of `ValueError`), carries a
one-line message that says what to change, and makes the CLI exit with status 2.

Validation collects before it raises: a `Problems` collector gathers every problem of one
input (a config, a dataset, a manifest, a mechanism's parameters) and raises them together
as one typed error, so a user fixes a file in one round instead of one error at a time.
"""

from __future__ import annotations


class AGTError(ValueError):
    """Base class for every user-facing error of agt and mechanisms."""


class ConfigError(AGTError):
    """A configuration value is missing, unknown or impossible."""


class DataError(AGTError):
    """A dataset is missing, malformed or incompatible with the model."""


class BundleError(AGTError):
    """A bounds bundle (HDF5) is unreadable, malformed or does not match the model."""


class SoundnessError(AGTError):
    """A soundness invariant failed (e.g. nominal parameters outside their bounds).

    Raised instead of writing a certificate that could be wrong."""


class WorkerError(AGTError):
    """A task run in a worker (an ensemble's teacher) kept failing -- its process crashed or
    was killed, its Ray worker or node was lost, or it raised an unexpected error -- after
    its retries (agt/parallel.py); nothing was returned or written. ``detail`` holds the
    worker's traceback when there is one."""

    detail: str = ""


class PrivacyError(AGTError):
    """Invalid privacy parameters (epsilon, delta, budgets), or a release that the privacy
    rules refuse (wrong relation, wrong dataset, radii without a smoothness proof)."""


class BudgetExceededError(PrivacyError):
    """A release would exceed the remaining privacy budget; nothing was released."""


class ReleaseRefusedError(PrivacyError):
    """The owner's check before spending refused a release that is expected to return
    almost nothing (mechanisms/release_check.py); nothing was charged. Owner-only: the
    reason is a function of the radii."""


# The error a collection of problems raises: the first kind present in this order.
_PRECEDENCE = (BudgetExceededError, PrivacyError, SoundnessError, BundleError, DataError,
               ConfigError, WorkerError, AGTError)


class Problems:
    """Collects problems of one input and raises them together as one typed error.

    >>> p = Problems("config")
    >>> p.check(lr > 0, "learning_rate must be > 0")          # doctest: +SKIP
    >>> p.raise_if_any()                                       # doctest: +SKIP

    Each problem carries the error class it belongs to (the collector's ``kind``, ConfigError
    unless given); the
    raised error is the most specific class present (privacy before data before config,
    `_PRECEDENCE`) and its message lists every problem, separated by "; ", after the
    optional ``where`` prefix.
    """

    def __init__(self, where: str = "", kind: type[AGTError] = ConfigError):
        self.where = where
        self.kind = kind
        self._items: list[tuple[type[AGTError], str]] = []

    def add(self, message: str, kind: type[AGTError] | None = None) -> None:
        self._items.append((kind or self.kind, message))

    def check(self, condition: object, message: str, kind: type[AGTError] | None = None) -> bool:
        """Record `message` unless `condition` holds; returns bool(condition)."""
        if not condition:
            self.add(message, kind)
        return bool(condition)

    def extend(self, other: "Problems") -> None:
        self._items.extend(other._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def messages(self) -> list[str]:
        return [m for _, m in self._items]

    def error(self) -> AGTError | None:
        """The error these problems raise (None when there is none)."""
        if not self._items:
            return None
        kinds = {k for k, _ in self._items}
        kind = next((k for k in _PRECEDENCE if k in kinds), self._items[0][0])
        text = "; ".join(self.messages)
        return kind(f"{self.where}: {text}" if self.where else text)

    def raise_if_any(self) -> None:
        err = self.error()
        if err is not None:
            raise err
