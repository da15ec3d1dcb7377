"""Files: atomic writes through unique temporary names, and output checks made up front.

Every file agt writes (bundles, ensembles, certificates, released labels, results) goes
through `atomic_write`: the content is written to a temporary file with a unique name in
the target folder and renamed over the target only when complete, so an interrupted or
failed run leaves no partial output, and concurrent writers to one target never share a
temporary file (the last complete write wins, whole).

`check_output` is the check a command makes *before* any expensive or privacy-spending work:
the target is not a directory, its folder exists (or can be created) and is writable, and an
existing file is replaced only when the caller allows it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from agt.errors import ConfigError

__all__ = ["atomic_write", "atomic_directory", "check_output"]


def _temporary(path: Path, directory: bool = False) -> Path:
    prefix = f".{path.name}."
    if directory:
        return Path(tempfile.mkdtemp(prefix=prefix, suffix=".partial", dir=path.parent))
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".partial" + path.suffix, dir=path.parent)
    os.close(fd)
    return Path(name)


def atomic_write(path: str | Path, writer: Callable[[Path], object], *,
                 replace: bool = True) -> Path:
    """Call ``writer(tmp)`` on a fresh temporary file beside `path`, then rename it to `path`.

    The temporary name is unique (``.<name>.<random>.partial<suffix>``), ends in the target's
    suffix (numpy and h5py look at it) and is removed if the writer fails or is interrupted.
    With ``replace=False`` the name is first claimed with O_EXCL, so that of two processes
    writing the same new path one gets FileExistsError instead of both succeeding and one
    file silently replacing the other.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    claimed = False
    try:
        writer(tmp)
        if not replace:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            claimed = True          # ours from here on (never remove another writer's file)
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        if claimed:
            path.unlink(missing_ok=True)
        raise
    return path


def atomic_directory(path: str | Path, fill: Callable[[Path], object],
                     may_replace: Callable[[Path], bool]) -> Path:
    """Fill a fresh temporary directory beside `path`, then move it to `path`.

    An existing `path` is replaced only if ``may_replace(path)`` says so (e.g. it holds an
    output of the same kind and nothing else); the old directory is removed after the new
    one is in place."""
    path = Path(path)
    if path.exists() and not may_replace(path):
        raise ConfigError(f"{path} exists and is not an output this command may replace; "
                          f"give another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path, directory=True)
    try:
        fill(tmp)
        if path.exists():
            old = _temporary(path, directory=True)
            os.rmdir(old)
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def check_not_an_input(out: Path, inputs: dict[str, str | Path | None], *,
                       what: str = "--out") -> None:
    """Refuse an output path that names one of the command's own input files (by path, or
    the same file through a link): writing it would replace that input. For a release
    command that input may be its ledger, and replacing the ledger after the spend would
    erase the spend it just recorded (a review's find: the next release on the dataset then
    had the whole budget again)."""
    # the paths as the commands open them: no ~ expansion (the shell's job; a folder may be
    # named ~, and a review wrote the labels over the ledger through one)
    target = Path(os.path.abspath(out))
    for flag, given in inputs.items():
        if given is None:
            continue
        source = Path(os.path.abspath(given))
        same = target.resolve() == source.resolve()
        if not same and target.exists() and source.exists():
            same = os.path.samefile(target, source)
        if same:
            raise ConfigError(f"{what} {out} is the file given as {flag}; writing it would "
                              f"replace that input: give {what} another name")


def check_output(path: str | Path, *, suffixes: tuple[str, ...] = (), overwrite: bool = True,
                 what: str = "--out") -> Path:
    """Refuse an output path that cannot be written, before any work is done.

    Checks: the suffix (when `suffixes` is given), that `path` is not a directory, that no
    parent is a regular file, that the nearest existing folder is writable (probed with a
    temporary file when the target folder exists; nothing is created otherwise), and, with
    ``overwrite=False``, that `path` does not exist yet. Raises ConfigError with a one-line
    reason."""
    path = Path(path)
    if suffixes and path.suffix not in suffixes:
        raise ConfigError(f"{what} must end in {' or '.join(suffixes)}, got {path.name!r}")
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):    # the checks below say what is wrong
        pass
    except OSError as exc:       # a name too long, a loop of links, ...: one line, no traceback
        raise ConfigError(f"{what} {str(path)[:80]}{'...' if len(str(path)) > 80 else ''} "
                          f"cannot be used ({exc.strerror or exc}); choose another name") from None
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a directory; give a file name")
    if os.path.lexists(path) and not overwrite:         # a dangling link counts as existing
        raise ConfigError(f"{what} {path} exists; refusing to overwrite it (give a "
                          f"new name, or --overwrite)")
    existing = next(p for p in (path.parent, *path.parent.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"{what} {path}: {existing} is a file, not a folder")
    try:
        if existing == path.parent:
            _temporary(path).unlink()
        elif not os.access(existing, os.W_OK | os.X_OK):
            raise PermissionError(13, "permission denied")
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be written ({exc.strerror or exc}); choose a "
                          f"writable location") from None
    return path
