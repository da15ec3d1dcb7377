"""Task functions for tests of agt/parallel.py: module level and light to import (worker
processes import this module by name). ``shared`` is a folder; every call leaves a marker
file ``<i>.<random>`` there, so a test can count how often each task ran."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from agt.errors import ConfigError


def _mark(folder: str, i: int) -> int:
    """Leave a marker for this attempt; return how many attempts task i has had."""
    Path(folder, f"{i}.{uuid.uuid4().hex}").touch()
    return attempts(folder, i)


def attempts(folder: str, i: int) -> int:
    return sum(1 for p in Path(folder).iterdir() if p.name.split(".")[0] == str(i))


def threads_seen(folder: str, i: int) -> tuple:
    """(i, torch's thread count, OMP_NUM_THREADS) as the task saw them."""
    import torch

    _mark(folder, i)
    return i, torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")


def crash_once(folder: str, i: int) -> int:
    """Task 1's first attempt kills its process (as the OOM killer would)."""
    if _mark(folder, i) == 1 and i == 1:
        os._exit(9)
    return i * i


def flaky(folder: str, i: int) -> int:
    """Task 1's first attempt kills its process; task 0's first attempt raises an unexpected
    error: both are worker failures, re-run."""
    n = _mark(folder, i)
    if n == 1 and i == 1:
        os._exit(9)
    if n == 1 and i == 0:
        raise RuntimeError("transient failure")
    return i * i


def crash_always(folder: str, i: int) -> int:
    if i == 2:
        _mark(folder, i)
        os._exit(3)
    return i


def fail_once(folder: str, i: int) -> int:
    """Task 0 raises an unexpected error on its first attempt (re-run: a worker failure)."""
    if _mark(folder, i) == 1 and i == 0:
        raise RuntimeError("transient failure")
    return -i


def user_error(folder: str, i: int) -> int:
    """Task 2 is a user error (never re-run)."""
    _mark(folder, i)
    if i == 2:
        raise ConfigError("teacher 2 cannot run: bad setting")
    return i
