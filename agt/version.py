"""The package version (one place; the bundle and the ledger record it)."""

__version__ = "0.4.0"
