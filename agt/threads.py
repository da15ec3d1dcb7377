"""Intra-op thread counts: the one place that decides how many threads torch may use.

torch runs its CPU kernels on an OpenMP pool (and MKL's) of, by default, one thread per
core. Two measured problems make that default a poor choice here:

* Oversubscription. Spinning OpenMP threads (libgomp's default wait policy) make tensor
  ops many times slower when another process holds a core. Next to one busy process on a
  2-core machine, a small AGT run (6-2 logistic, 800 records, 24 steps) took 2.5 s with
  torch's default 2 threads, 0.15 s with ``OMP_WAIT_POLICY=PASSIVE`` and 0.24 s with one
  thread; a medium one (6-128-2 MLP, 3000 records, k = 0..19) 19.4 s, 3.6 s and 4.7 s
  (benchmarks/bench_threads.py, part A). Parallel workers multiply the threads: W workers
  x t threads must not exceed the cores.
* Determinism. Results can depend on the thread count: torch splits some reductions and
  matrix products into per-thread chunks, so a float32 64-100-2 MLP trained on 2000 records
  gets other nominal parameters with 4 threads than with 1 or 2 (part B; equally sound
  bounds, but another served model). Bundles are therefore byte-identical across runs only
  for the same per-model thread count; the ensemble trainer fixes it per teacher (default 1,
  whatever the backend and the number of workers) and records it in the manifest.

Rules (`resolve_threads`): an explicit count (``threads=``, ``--threads``) wins; else
``OMP_NUM_THREADS`` when it is set (its first value, OpenMP's "4,2" syntax included); else
the caller's default (one process: the cores it may use divided by its workers). The result
times the number of workers must fit in the cores this process may run on
(``os.sched_getaffinity``, which honours taskset and cgroup cpusets): a ConfigError says
which numbers to change otherwise, for explicit counts and OMP_NUM_THREADS alike, rather
than silently running with another count (which could change the bounds).

``OMP_WAIT_POLICY=PASSIVE`` must be in the environment before torch loads OpenMP. The
``agt`` command sets it first thing (`apply_recommended_environment`; a user's setting
wins), worker processes inherit it (`worker_environment`), and ``import agt`` leaves the
environment alone. A Python program gets the same settings on its first use of a public
name of the `agt` facade (``agt.train``, ``agt.Dataset``, ...), or on importing the
subpackages ``agt.certify`` and ``agt.ensemble`` (agt/_first_use.py): `prepare_first_use` sets the
variables there when torch is not loaded yet, and warns once (`ThreadingWarning`) when torch
was imported first and the wait policy is unset, since OpenMP has then already read it.

Nothing here imports torch at module level, so this module can run before torch loads.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Container, Iterator, Mapping, MutableMapping

from agt.errors import ConfigError

#: per-teacher threads of an ensemble when neither ``threads=`` nor OMP_NUM_THREADS says
#: otherwise: teachers are the unit of parallelism, and one thread each keeps the bundles
#: identical whatever the backend and the number of workers
TEACHER_THREADS = 1


def available_cores() -> int:
    """Cores this process may run on (CPU affinity, else os.cpu_count(); at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):      # not Linux
        return max(1, os.cpu_count() or 1)


def _positive(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def env_threads(environ: Mapping[str, str] | None = None) -> int | None:
    """OMP_NUM_THREADS as an int (its first value), None when unset or empty."""
    environ = os.environ if environ is None else environ
    raw = environ.get("OMP_NUM_THREADS", "").strip()
    if not raw:
        return None
    first = raw.split(",")[0].strip()
    if not first.isdigit() or int(first) < 1:
        raise ConfigError(f"OMP_NUM_THREADS must be a positive integer, got {raw!r}; fix or "
                          f"unset it, or give --threads")
    return int(first)


def requested_threads(threads: int | None = None, *, default: int | None = None,
                      environ: Mapping[str, str] | None = None) -> tuple[int | None, str]:
    """The thread count asked for and who asked: (`threads`, "--threads"), else
    (OMP_NUM_THREADS, "OMP_NUM_THREADS"), else (`default`, "the default") -- the count is
    None when nobody asked and `default` is None."""
    if threads is not None:
        return _positive(threads, "the number of threads (--threads)"), "--threads"
    omp = env_threads(environ)
    if omp is not None:
        return omp, "OMP_NUM_THREADS"
    return (None if default is None else _positive(default, "default threads")), "the default"


def resolve_threads(threads: int | None = None, workers: int = 1, *, default: int | None = None,
                    cores: int | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Threads per worker on this machine: `threads`, else OMP_NUM_THREADS, else `default`
    (None: the cores divided by `workers`, at least 1). Raises ConfigError when
    workers x threads exceeds `cores` (default: `available_cores()`)."""
    _positive(workers, "the number of workers")
    cores = available_cores() if cores is None else _positive(cores, "cores")
    n, source = requested_threads(threads, default=default, environ=environ)
    if n is None:
        n = max(1, cores // workers)
    if workers * n > cores:
        raise ConfigError(f"{workers} worker(s) x {n} thread(s) ({source}) = {workers * n} "
                          f"exceeds the {cores} core(s) available; use fewer --workers or "
                          f"--threads so that workers x threads <= {cores}")
    return n


def set_threads(n: int) -> int:
    """Let torch (OpenMP and MKL) use `n` intra-op threads; returns the previous count."""
    import torch

    previous = torch.get_num_threads()
    if n != previous:
        torch.set_num_threads(_positive(n, "threads"))
    return previous


@contextlib.contextmanager
def using_threads(n: int) -> Iterator[int]:
    """Run a block with `n` torch threads, then restore the previous count."""
    previous = set_threads(n)
    try:
        yield n
    finally:
        set_threads(previous)


def configure_threads(threads: int | None = None, workers: int = 1) -> int:
    """Decide (`resolve_threads`) and apply this process's thread count; returns it."""
    n = resolve_threads(threads, workers)
    set_threads(n)
    return n


#: what the command line puts in its environment before torch loads, unless already set:
#: passive OpenMP waits (see above), and the fixed cuBLAS workspace that deterministic
#: cuBLAS kernels need (`agt.tensors.strict_kernels`, read when cuBLAS starts)
RECOMMENDED_ENVIRONMENT = {"OMP_WAIT_POLICY": "PASSIVE", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def apply_recommended_environment(environ: MutableMapping[str, str] | None = None
                                  ) -> dict[str, str]:
    """Set every `RECOMMENDED_ENVIRONMENT` variable the user has not set.

    Effective only before torch loads OpenMP and before CUDA starts cuBLAS; the command line
    calls it first thing. A library user does the same by hand::

        import os
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        import torch, agt

    Args:
        environ: the mapping to change (default ``os.environ``).

    Returns:
        The variables it set (name -> value); those the user had set are left alone.
    """
    environ = os.environ if environ is None else environ
    added = {k: v for k, v in RECOMMENDED_ENVIRONMENT.items() if k not in environ}
    environ.update(added)
    return added


def worker_environment(threads: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables a worker process should start with to run `threads` threads."""
    environ = os.environ if environ is None else environ
    n = str(_positive(threads, "threads"))
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n,
            "OMP_WAIT_POLICY": environ.get("OMP_WAIT_POLICY", "PASSIVE")}


class ThreadingWarning(UserWarning):
    """torch loaded before agt could set ``OMP_WAIT_POLICY``: spinning OpenMP threads can make
    training several times slower on a busy machine (module docstring)."""


#: whether `prepare_first_use` has run in this process (it acts once)
_first_use_done = False


def prepare_first_use(environ: MutableMapping[str, str] | None = None,
                      loaded: Container[str] | None = None) -> dict[str, str]:
    """Give a Python program the command line's threading settings, once per process.

    The `agt` facade calls it on the first use of a public name, before that name's module
    loads torch. Torch not loaded yet: set every `RECOMMENDED_ENVIRONMENT` variable the user
    has not set (`apply_recommended_environment`), as the ``agt`` command does. Torch already
    loaded with more than one thread and ``OMP_WAIT_POLICY`` unset: OpenMP has read its wait
    policy, so issue one `ThreadingWarning` that says how to fix the import order instead.

    Args:
        environ: the environment to read and change (default ``os.environ``).
        loaded: the names of the loaded modules (default ``sys.modules``).

    Returns:
        The variables it set (empty after the first call, when torch was loaded first, or
        when the user had set them all).
    """
    global _first_use_done
    if _first_use_done:
        return {}
    _first_use_done = True
    environ = os.environ if environ is None else environ
    loaded = sys.modules if loaded is None else loaded
    if "torch" not in loaded:
        return apply_recommended_environment(environ)
    if "OMP_WAIT_POLICY" not in environ and _torch_threads() > 1:
        warnings.warn("torch was imported before agt's first use, with OMP_WAIT_POLICY unset: "
                      "its OpenMP threads spin and training can be several times slower on a "
                      "busy machine; use agt (e.g. agt.TrainConfig) before importing torch, or "
                      "set OMP_WAIT_POLICY=PASSIVE before the program starts",
                      ThreadingWarning, stacklevel=3)
    return {}


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
