"""Typed errors. Every error a user can cause is a subclass of `AGTError` (and of
`ValueError`), carries a one-line message that says what to change, and makes the CLI
exit with a non-zero status."""


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


class PrivacyError(AGTError):
    """Invalid privacy parameters (epsilon, delta, budgets)."""


class BudgetExceededError(PrivacyError):
    """A release would exceed the remaining privacy budget; nothing was released."""
