"""Ledger handling shared by the release commands (predict, teacher-labels)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from agt.errors import AGTError, ConfigError, PrivacyError


def is_new_ledger(path: Path | str) -> bool:
    """A missing or empty file, or a PostgreSQL database without a ledger yet: opening it
    creates a ledger with the settings given.

    Args:
        path: an SQLite file's path or a ``postgresql://`` URL.

    Returns:
        Whether opening it creates a new ledger.
    """
    from mechanisms.ledger import is_url, postgres_ledger_exists

    if is_url(str(path)):
        return not postgres_ledger_exists(str(path))
    path = Path(path)
    return not path.exists() or (path.is_file() and path.stat().st_size == 0)


def open_ledger(path_arg: str | None, dataset_sha256: str, budget_epsilon: float | None,
                budget_delta: float | None, accountant: str | None, relation: str | None,
                per_query: tuple[float, float], budget_flags: str, release=None):
    """The ledger at `path_arg` (a file or a ``postgresql://`` URL), or the private
    dataset's default ledger.

    A new ledger (a missing or empty file) is created with the given budget, relation
    (default replace-one) and accountant (default standard); an accountant other than
    standard fixes `per_query` for the ledger's lifetime (accounting.py). An existing ledger
    keeps its own settings; values given that differ from them are refused.

    ``release`` = (mechanism, inputs): for a new ledger, the release is first checked on an
    in-memory ledger with the same settings, so a release that would be refused (over the
    budget, a mechanism that refuses the inputs, settings that do not go together) creates
    no file: a review found refused first releases leaving ledgers whose settings (budget,
    accountant, fixed per-query guarantee) then bound every later call."""
    from mechanisms import Ledger, default_ledger_path
    from mechanisms.ledger import is_url

    path = (path_arg if is_url(path_arg) else Path(path_arg)) if path_arg else \
        default_ledger_path(dataset_sha256)
    new = is_new_ledger(path)
    if new and budget_epsilon is None:
        # (the callers' default_ledger_unnamed calls a default ledger by that name)
        raise PrivacyError(f"{path} is a new ledger: give {budget_flags}")
    fixed = {}
    if new and (accountant or "standard") != "standard":
        fixed = {"per_query_epsilon": per_query[0], "per_query_delta": per_query[1]}
    if new and release is not None:
        with Ledger.in_memory(budget_epsilon, budget_delta if budget_delta is not None else 0.0,
                              accountant, relation=relation, dataset_sha256=dataset_sha256,
                              **fixed) as probe:
            probe.check_release(*release)
    return Ledger.open(path, budget_epsilon, budget_delta, accountant, relation=relation,
                       dataset_sha256=dataset_sha256, **fixed)


@contextlib.contextmanager
def default_ledger_unnamed(path: Path | None) -> Iterator[None]:
    """Errors that name the default ledger's file (``path``; None: the user named a ledger)
    call it "this dataset's default ledger" instead: its name is a keyed hash of the private
    dataset's hash, the same for every release from one dataset and another for a
    neighbouring one, which a release command must not print (`agt.cli.format.ledger_line`;
    a review found it in the settings-mismatch refusal)."""
    try:
        yield
    except AGTError as exc:
        text = str(exc)
        if path is None or str(path) not in text:
            raise
        raise type(exc)(text.replace(str(path), "this dataset's default ledger")) from None


def write_after_spend(out: Path, writer, overwrite: bool) -> Path:
    """Write a release file after the ledger recorded the spend and return where it went; a
    failure now cannot undo the spend, so say so plainly. Without `overwrite`, a file that
    appeared at `out` since the command's check (another release writing the same name) is
    kept, and the labels go to ``<stem>-<k><suffix>`` instead of being lost."""
    from agt.io import atomic_write

    try:
        try:
            return atomic_write(out, writer, replace=overwrite)
        except FileExistsError:
            for k in range(1, 1000):
                alternative = out.with_name(f"{out.stem}-{k}{out.suffix}")
                try:
                    written = atomic_write(alternative, writer, replace=False)
                except FileExistsError:
                    continue
                print(f"{out} appeared while this release ran (another release?); kept it and "
                      f"wrote these labels to {written}")
                return written
            raise
    except OSError as exc:
        raise ConfigError(f"the release was recorded in the ledger (budget spent) but {out} "
                          f"could not be written ({exc.strerror or exc}); the labels are "
                          f"lost") from None


class SpendGuard:
    """Around a release command's ledger call and file write: an interrupt (Ctrl-C,
    SIGTERM) that arrives once `spent` is set gains the note that the budget is spent and
    the labels are lost (agt/cli/main.py prints it). An interrupt inside the draw gets the
    ledger's own note instead."""

    def __init__(self) -> None:
        self.spent = False

    def __enter__(self) -> "SpendGuard":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if self.spent and isinstance(exc, KeyboardInterrupt):
            exc.add_note("the release was recorded in the ledger (budget spent) but its "
                         "labels were not written: they are lost")
        return False
