"""agt/parallel.py without Ray: results in index order, threads per task, re-runs after a
worker failure (bounded), user errors raised once and never re-run, and the plan checks."""

from __future__ import annotations

import sys

import pytest

from agt.errors import ConfigError, WorkerError
from agt.parallel import Execution, plan_execution, run_tasks
from tests.agt import parallel_tasks as tasks

SERIAL = Execution("serial", 1, 1)
TWO = Execution("process", 2, 1)


@pytest.mark.parametrize("ex", [Execution("serial", 1, 2), TWO], ids=["serial", "process"])
def test_results_in_index_order_with_the_planned_threads(tmp_path, ex, capsys):
    report = run_tasks(tasks.threads_seen, str(tmp_path), 7, ex, progress=True, desc="tasks",
                       unit="square")
    assert [r[:2] for r in report.results] == [(i, ex.threads) for i in range(7)]
    assert report.reruns == [] and all(tasks.attempts(str(tmp_path), i) == 1 for i in range(7))
    if ex.backend == "process":                   # workers start with the count in their env
        assert {r[2] for r in report.results} == {"1"}
    err = capsys.readouterr().err
    assert "tasks" in err and "7/7" in err


@pytest.mark.parametrize("ex", [SERIAL, TWO], ids=["serial", "process"])
def test_worker_failures_rerun_their_task(tmp_path, ex):
    """A killed process (process backend) and an unexpected exception re-run the task."""
    fn = tasks.flaky if ex.backend == "process" else tasks.fail_once
    report = run_tasks(fn, str(tmp_path), 4, ex)
    assert report.results == ([0, 1, 4, 9] if fn is tasks.flaky else [0, -1, -2, -3])
    reasons = {r.index: r.reason for r in report.reruns}
    assert reasons[0] == "RuntimeError: transient failure"
    if ex.backend == "process":
        assert reasons[1] == "the worker process exited with status 9"
        assert tasks.attempts(str(tmp_path), 1) == 2
    assert len(report.reruns) == len(reasons) and all(r.attempt == 1 for r in report.reruns)


def test_retries_are_bounded(tmp_path):
    with pytest.raises(WorkerError, match=r"task 2 failed 2 time\(s\) \(retries: 1\); last "
                                          r"failure: the worker process exited with status 3"):
        run_tasks(tasks.crash_always, str(tmp_path), 4, Execution("process", 1, 1), retries=1)
    assert tasks.attempts(str(tmp_path), 2) == 2
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(WorkerError, match="task 0 failed 1 time.*RuntimeError: transient") as info:
        run_tasks(tasks.fail_once, str(fresh), 1, SERIAL, retries=0)
    assert "Traceback" in info.value.detail


@pytest.mark.parametrize("ex", [SERIAL, TWO], ids=["serial", "process"])
def test_user_error_is_raised_once_and_never_rerun(tmp_path, ex):
    with pytest.raises(ConfigError, match="teacher 2 cannot run: bad setting"):
        run_tasks(tasks.user_error, str(tmp_path), 6, ex, retries=3)
    assert tasks.attempts(str(tmp_path), 2) == 1


def test_plan_chooses_the_backend_and_checks_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("agt.threads.available_cores", lambda: 2)
    assert plan_execution(5) == Execution("serial", 1, 1)
    assert plan_execution(5, workers=2) == Execution("process", 2, 1)
    assert plan_execution(1, workers=2) == Execution("process", 1, 1)     # capped at the tasks
    assert plan_execution(5, threads=2) == Execution("serial", 1, 2)
    with pytest.raises(ConfigError, match=r"2 worker\(s\) x 2 thread\(s\) \(--threads\)"):
        plan_execution(5, workers=2, threads=2)
    with pytest.raises(ConfigError, match=r"3 worker\(s\) x 1 thread"):
        plan_execution(5, workers=3)
    with pytest.raises(ConfigError, match="serial backend runs one task at a time"):
        plan_execution(5, workers=2, backend="serial")
    with pytest.raises(ConfigError, match="needs the ray backend"):
        plan_execution(5, backend="process", ray_address="auto")
    with pytest.raises(ConfigError, match="backend must be one of serial, process, ray"):
        plan_execution(5, backend="threads")
    with pytest.raises(ConfigError, match="workers must be an integer >= 1"):
        plan_execution(5, workers=0)


def test_ray_backend_without_ray_is_a_one_line_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)            # import ray -> ImportError
    for kw in ({"backend": "ray"}, {"ray_address": "auto"}):
        with pytest.raises(ConfigError, match=r"needs Ray, which is not installed: pip install "
                                              r"-e \"\.\[distributed\]\"") as info:
            plan_execution(5, **kw)
        assert "\n" not in str(info.value)
