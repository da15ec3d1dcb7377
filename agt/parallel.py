"""Run n independent tasks serially, in local worker processes or on Ray, with the same
results whichever way they ran (an ensemble's teachers; any deterministic task).

A task function ``fn(shared, i)`` must be defined at module level (worker processes import it
by name), be deterministic in ``(shared, i)`` for a fixed thread count, and return a
picklable value. `run_tasks` returns ``[fn(shared, 0), ..., fn(shared, n - 1)]`` in index
order, whatever order the tasks finished in.

Backends:

* ``serial``: in this process, one task after another.
* ``process``: `workers` local processes started with ``spawn`` (never ``fork``: torch's
  OpenMP pool does not survive a fork). Each worker receives ``(fn, shared)`` once and then
  task indices; a script that calls this must guard its entry point with
  ``if __name__ == "__main__":`` (spawn re-imports the main module).
* ``ray``: Ray tasks (optional dependency, ``pip install -e ".[distributed]"``). With
  `ray_address` None or ``"local"`` a private local Ray instance with workers x threads CPUs
  is started and shut down afterwards; any other address (``"auto"``, ``"ray://head:10001"``,
  ``"head:6379"``) connects to that cluster, whose nodes must have agt installed. A Ray
  instance already initialised in this process is used as it is and left running. Each task
  asks Ray for `threads` CPUs, so Ray never runs more tasks on a node than its CPUs allow.

Threads: every task runs with exactly `threads` intra-op torch threads in every backend
(agt/threads.py explains why the count must be the same everywhere: it can change the
floating-point results). Worker processes start with OMP_NUM_THREADS / MKL_NUM_THREADS set
to it and OMP_WAIT_POLICY passive unless the user chose a policy.

Failures (check, then commit: results are returned only when every task succeeded, so a
caller that writes its output after `run_tasks` returns never leaves partial output):

* a user error (`AGTError` raised by fn) is not retried: the other tasks are stopped and
  that error is raised once, here;
* a worker failure -- the process running a task died (a signal, the OOM killer,
  ``os._exit``), a Ray worker or node was lost, or fn raised any other exception -- re-runs
  that task, at most `retries` more times; then `WorkerError` names the task and the last
  reason. Each re-run is reported in `RunReport.reruns`.

Transport: results, exceptions and ``(fn, shared)`` cross process boundaries as standard
pickles (bytes), never through torch's shared-memory reductions, so tensors arrive
byte-identical and owned by the receiver.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from tqdm.auto import tqdm

from agt.errors import AGTError, ConfigError, WorkerError
from agt.threads import using_threads, worker_environment

BACKENDS = ("serial", "process", "ray")
DEFAULT_RETRIES = 2
RAY_HINT = 'pip install -e ".[distributed]" (or pip install "ray>=2.40")'
_PROTOCOL = pickle.HIGHEST_PROTOCOL


@dataclass(frozen=True)
class Rerun:
    """One re-run of a task after a worker failure."""

    index: int
    attempt: int          # the attempt that failed (1 = first run)
    reason: str


@dataclass
class RunReport:
    results: list
    reruns: list[Rerun] = field(default_factory=list)


# ------------------------------------------------------------------------------------------
# Choosing backend, workers and threads

@dataclass(frozen=True)
class Execution:
    """How a run of tasks is executed: resolved once, before any task starts."""

    backend: str
    workers: int | None       # tasks at once (None: as many as the Ray cluster schedules)
    threads: int              # intra-op threads of every task
    ray_address: str | None = None


def plan_execution(n_tasks: int, *, workers: int | None = None, backend: str | None = None,
                   threads: int | None = None, ray_address: str | None = None,
                   default_threads: int = 1) -> Execution:
    """Resolve backend, workers and threads (agt/threads.py rules) before any work starts.

    `backend` None: "ray" with a `ray_address`, "process" with more than one worker, else
    "serial". Process workers are capped at `n_tasks`. Locally (serial, process, and a Ray
    instance started here) workers x threads must fit in this machine's cores; on a Ray
    cluster Ray places each task on `threads` CPUs of some node. Raises ConfigError."""
    from agt.threads import available_cores, requested_threads, resolve_threads

    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    if backend is None:
        backend = "ray" if ray_address is not None else \
            "process" if (workers or 1) > 1 else "serial"
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if ray_address is not None and backend != "ray":
        raise ConfigError(f"a Ray address needs the ray backend, not {backend!r}")
    if backend == "serial":
        if (workers or 1) > 1:
            raise ConfigError(f"the serial backend runs one task at a time; got workers="
                              f"{workers} (use the process or ray backend)")
        return Execution("serial", 1, resolve_threads(threads, 1, default=default_threads))
    if backend == "process":
        w = max(1, min(workers or 1, n_tasks))
        return Execution("process", w, resolve_threads(threads, w, default=default_threads))
    import_ray()
    if ray_address in (None, "local"):
        t = requested_threads(threads, default=default_threads)[0] or 1
        w = workers or max(1, available_cores() // t)
        return Execution("ray", w, resolve_threads(threads, w, default=default_threads),
                         ray_address)
    t = requested_threads(threads, default=default_threads)[0] or 1
    return Execution("ray", workers, t, ray_address)


# ------------------------------------------------------------------------------------------
# One task, wherever it runs: the message it sends back

def _run_one(fn: Callable, shared: Any, i: int) -> bytes:
    """("ok", result) or ("error", is_user_error, pickled exception or None, text), pickled."""
    try:
        return pickle.dumps(("ok", fn(shared, i)), protocol=_PROTOCOL)
    except Exception as exc:  # reported to the caller, which decides: raise or re-run
        text = f"{type(exc).__name__}: {exc}"
        try:
            blob = pickle.dumps(exc, protocol=_PROTOCOL)
            pickle.loads(blob)
        except Exception:
            blob = None
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return pickle.dumps(("error", isinstance(exc, AGTError), blob, text, detail),
                            protocol=_PROTOCOL)


class _Failure(Exception):
    """A task's worker failed (the task may be re-run); args: (reason, traceback text)."""


def _outcome(message: tuple) -> Any:
    """The result of a task's (unpickled) message; raises the user error, or _Failure."""
    kind, *rest = message
    if kind == "ok":
        return rest[0]
    is_user, blob, text, detail = rest
    if is_user:
        raise pickle.loads(blob) if blob is not None else AGTError(text)
    raise _Failure(text, detail)


class _Scheduler:
    """Bookkeeping shared by the backends: pending tasks, attempts, results, re-runs."""

    def __init__(self, n: int, retries: int, bar, unit: str = "task"):
        self.unit = unit
        self.pending = deque(range(n))
        self.attempts = [0] * n
        self.results: list = [None] * n
        self.finished = [False] * n
        self.done = 0
        self.retries = retries
        self.reruns: list[Rerun] = []
        self.bar = bar

    def take(self) -> int:
        i = self.pending.popleft()
        self.attempts[i] += 1
        return i

    def give_back(self, i: int) -> None:
        """`i` never started (its worker was gone before it got the task)."""
        self.attempts[i] -= 1
        self.pending.appendleft(i)

    def succeed(self, i: int, result: Any) -> None:
        self.results[i] = result
        self.finished[i] = True
        self.done += 1
        self.bar.update(1)

    def fail(self, i: int, reason: str, detail: str = "") -> None:
        """Queue `i` again, or raise WorkerError when its retries are spent."""
        if self.attempts[i] > self.retries:
            err = WorkerError(f"{self.unit} {i} failed {self.attempts[i]} time(s) (retries: "
                              f"{self.retries}); last failure: {reason}")
            err.detail = detail
            raise err
        self.reruns.append(Rerun(i, self.attempts[i], reason))
        self.bar.set_postfix(reruns=len(self.reruns))
        self.pending.appendleft(i)

    def handle(self, i: int, message: bytes | tuple) -> None:
        """Record task `i`'s message (pickled or already unpickled)."""
        if isinstance(message, bytes):
            message = pickle.loads(message)
        try:
            result = _outcome(message)
        except _Failure as exc:
            self.fail(i, *exc.args)
        else:
            self.succeed(i, result)

    @property
    def complete(self) -> bool:
        return self.done == len(self.results)


# ------------------------------------------------------------------------------------------
# The entry point

def run_tasks(fn: Callable, shared: Any, n_tasks: int, execution: Execution | None = None, *,
              retries: int = DEFAULT_RETRIES, progress: bool = False, desc: str = "tasks",
              unit: str = "task") -> RunReport:
    """``[fn(shared, i) for i in range(n_tasks)]`` as `execution` says (`plan_execution`;
    None: serial, one thread) -- see the module docstring for the guarantees.

    `retries`: re-runs of a task after a worker failure. `progress`: a tqdm bar over tasks on
    stderr (`desc`, `unit`; `unit` also names a task in error messages)."""
    for name, value in (("n_tasks", n_tasks), ("retries", retries)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
    ex = execution if execution is not None else plan_execution(max(n_tasks, 1))
    bar = tqdm(total=n_tasks, desc=desc, unit=unit, disable=not progress)
    sched = _Scheduler(n_tasks, retries, bar, unit)
    try:
        if n_tasks == 0:
            pass
        elif ex.backend == "serial":
            _serial(fn, shared, ex.threads, sched)
        elif ex.backend == "process":
            _processes(fn, shared, min(ex.workers or 1, n_tasks), ex.threads, sched)
        else:
            _ray(fn, shared, ex.workers, ex.threads, ex.ray_address, sched)
    finally:
        bar.close()
    return RunReport(sched.results, sched.reruns)


# ------------------------------------------------------------------------------------------
# serial

def _serial(fn, shared, threads: int, sched: _Scheduler) -> None:
    with using_threads(threads):
        while not sched.complete:
            i = sched.take()
            sched.handle(i, _run_one(fn, shared, i))


# ------------------------------------------------------------------------------------------
# local processes

def _thread_lock_for_bars() -> None:
    """Workers draw no bars; a thread lock keeps tqdm from creating a multiprocessing
    semaphore, which a killed worker would leak (a resource_tracker warning at exit)."""
    import threading

    tqdm.set_lock(threading.RLock())


def _worker_main(conn, threads: int) -> None:
    """A worker process: receive (fn, shared), then run task indices until None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the parent handles Ctrl-C
    _thread_lock_for_bars()
    try:
        fn, shared = pickle.loads(conn.recv_bytes())
        from agt.threads import set_threads
        set_threads(threads)
    except BaseException:
        conn.send_bytes(pickle.dumps(("fatal", traceback.format_exc()), protocol=_PROTOCOL))
        return
    while True:
        try:
            i = conn.recv()
        except (EOFError, OSError):                   # the parent is gone
            return
        if i is None:
            return
        try:
            conn.send_bytes(_run_one(fn, shared, i))
        except (BrokenPipeError, OSError):
            return


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of a block (a spawned child copies them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "the worker process stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (killed: out of memory?)" if -exitcode == signal.SIGKILL else ""
        return f"the worker process was killed by {name}{hint}"
    return f"the worker process exited with status {exitcode}"


class _Worker:
    """A spawned worker process and the parent's end of its pipe; `task`: the index it runs
    (None: idle; -1: it died before it could take one)."""

    def __init__(self, ctx, threads: int, env: dict[str, str]):
        self.conn, child = ctx.Pipe()
        with _environ(env):
            self.process = ctx.Process(target=_worker_main, args=(child, threads), daemon=True,
                                       name="agt-worker")
            self.process.start()
        child.close()
        self.task: int | None = None

    def send_payload(self, payload: bytes) -> "_Worker":
        """Send (fn, shared); blocks until the worker has read it (a dead worker shows up
        as such when it is given a task)."""
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send_bytes(payload)
        return self

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)

    def close(self, timeout: float) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _processes(fn, shared, workers: int, threads: int, sched: _Scheduler) -> None:
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("spawn")
    payload = pickle.dumps((fn, shared), protocol=_PROTOCOL)
    env = worker_environment(threads)
    pool: list[_Worker] = []
    try:
        pool.extend(_Worker(ctx, threads, env) for _ in range(workers))   # all start at once
        for w in pool:
            w.send_payload(payload)
        while not sched.complete:
            for w in pool:
                if w.task is None and sched.pending:
                    i = sched.take()
                    try:
                        w.conn.send(i)
                        w.task = i
                    except (BrokenPipeError, OSError):
                        sched.give_back(i)
                        w.task = -1                    # dead before it started: replace below
            busy = [w for w in pool if w.task is not None]
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy]))
            for k, w in enumerate(pool):
                if w.task is None or (w.conn not in ready and w.process.sentinel not in ready):
                    continue
                i, w.task = w.task, None
                try:
                    message = pickle.loads(w.conn.recv_bytes())
                except (EOFError, OSError):
                    message = None
                if message is not None and message[0] == "fatal":
                    err = WorkerError(f"a worker process could not start: "
                                      f"{message[1].strip().splitlines()[-1]}")
                    err.detail = message[1]
                    raise err
                if message is None:                    # the process died
                    w.close(1.0)
                    if i >= 0:
                        sched.fail(i, _exit_reason(w.process.exitcode))   # may raise
                    pool[k] = _Worker(ctx, threads, env).send_payload(payload)
                    continue
                sched.handle(i, message)
    finally:
        for w in pool:
            w.stop()
        for w in pool:
            w.close(10.0 if sched.complete else 0.5)


# ------------------------------------------------------------------------------------------
# Ray

def import_ray():
    """The ray module, or a one-line ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"the Ray backend needs Ray, which is not installed: {RAY_HINT}") \
            from None
    return ray


_RAY_CACHE: dict[str, tuple] = {}


def _ray_task(token: str, boxed: list, i: int, threads: int) -> bytes:
    """A Ray task: (fn, shared) is unpickled once per Ray worker process (cached by token)."""
    if token not in _RAY_CACHE:
        import ray

        _thread_lock_for_bars()
        _RAY_CACHE.clear()
        _RAY_CACHE[token] = pickle.loads(ray.get(boxed[0]))
    fn, shared = _RAY_CACHE[token]
    with using_threads(threads):
        return _run_one(fn, shared, i)


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[Any]:
    """The ray module with Ray initialised for the block: an instance already initialised in
    this process is used as it is and left running; else `address` None or "local" starts a
    private local instance with `num_cpus` CPUs (no dashboard; it binds local ports only and
    needs no network), any other address joins that cluster; either is shut down after the
    block. A cluster that cannot be reached is a one-line ConfigError."""
    import logging

    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    options = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    if address in (None, "local"):
        ray.init(num_cpus=num_cpus, **options)
    else:
        try:
            ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"cannot connect to the Ray cluster at {address!r}: {first}") \
                from None
    try:
        yield ray
    finally:
        ray.shutdown()


def _ray(fn, shared, workers: int | None, threads: int, address: str | None,
         sched: _Scheduler) -> None:
    local = address in (None, "local")
    with ray_session(address, (workers or 1) * threads if local else None) as ray:
        _ray_run(ray, fn, shared, workers, threads, sched)


def _ray_run(ray, fn, shared, workers: int | None, threads: int, sched: _Scheduler) -> None:
    inflight: dict = {}
    try:
        remote = ray.remote(_ray_task).options(num_cpus=threads, max_retries=0,
                                               retry_exceptions=False)
        token = uuid.uuid4().hex
        boxed = [ray.put(pickle.dumps((fn, shared), protocol=_PROTOCOL))]
        cap = workers or len(sched.results)
        while not sched.complete:
            while sched.pending and len(inflight) < cap:
                i = sched.take()
                inflight[remote.remote(token, boxed, i, threads)] = i
            ready, _ = ray.wait(list(inflight), num_returns=1)
            for ref in ready:
                i = inflight.pop(ref)
                try:
                    message = ray.get(ref)
                except ray.exceptions.RayError as exc:    # worker, node or object lost
                    first = str(exc).splitlines()[0] if str(exc) else ""
                    sched.fail(i, f"{type(exc).__name__}: {first}")
                    continue
                sched.handle(i, message)
    finally:
        for ref in inflight:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
