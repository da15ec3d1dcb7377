"""agt/threads.py: who decides the thread count, and workers x threads <= cores."""

from __future__ import annotations

import pytest
import torch

from agt.errors import ConfigError
from agt.threads import (
    apply_recommended_environment,
    env_threads,
    requested_threads,
    resolve_threads,
    using_threads,
    worker_environment,
)
from tests.helpers import environ_seen_by_the_command_line


def test_explicit_count_wins_over_environment_and_default():
    env = {"OMP_NUM_THREADS": "2"}
    assert resolve_threads(3, 1, cores=4, environ=env) == 3
    assert resolve_threads(None, 1, cores=4, environ=env) == 2
    assert resolve_threads(None, 1, default=1, cores=4, environ={}) == 1
    assert requested_threads(None, environ={}) == (None, "the default")


def test_default_shares_the_cores_among_workers():
    assert resolve_threads(None, 1, cores=8, environ={}) == 8
    assert resolve_threads(None, 3, cores=8, environ={}) == 2
    assert resolve_threads(None, 2, cores=2, environ={}) == 1


@pytest.mark.parametrize("threads,workers,env,source", [
    (2, 2, {}, r"--threads"),
    (None, 2, {"OMP_NUM_THREADS": "2"}, "OMP_NUM_THREADS"),
    (None, 3, {}, "the default"),
])
def test_oversubscription_is_refused_naming_the_numbers(threads, workers, env, source):
    with pytest.raises(ConfigError, match=rf"{workers} worker\(s\) x \d thread\(s\) \({source}\)"
                       rf" = \d exceeds the 2 core\(s\)"):
        resolve_threads(threads, workers, default=1 if source == "the default" else None,
                        cores=2, environ=env)


def test_omp_num_threads_syntax():
    assert env_threads({"OMP_NUM_THREADS": "4,2"}) == 4
    assert env_threads({"OMP_NUM_THREADS": " "}) is None
    for bad in ("0", "two", "-1"):
        with pytest.raises(ConfigError, match="OMP_NUM_THREADS must be a positive integer"):
            env_threads({"OMP_NUM_THREADS": bad})
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError, match="must be an integer >= 1"):
            resolve_threads(bad, 1, cores=2, environ={})


def test_using_threads_restores_the_count():
    before = torch.get_num_threads()
    with using_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_worker_environment_keeps_a_users_wait_policy():
    assert worker_environment(2, {}) == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2",
                                         "OMP_WAIT_POLICY": "PASSIVE"}
    assert worker_environment(1, {"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"



def test_the_command_line_sets_a_passive_wait_policy_before_torch_loads():
    """OpenMP reads OMP_WAIT_POLICY once, when torch loads it, so the command line sets it
    before anything loads torch: a spinning policy made the Blobs ensembles study 4x slower
    next to busy processes. A user's policy wins."""
    assert environ_seen_by_the_command_line("OMP_WAIT_POLICY") == "PASSIVE"
    assert environ_seen_by_the_command_line("OMP_WAIT_POLICY", "ACTIVE") == "ACTIVE"


def test_recommended_environment_fills_only_what_the_user_left_unset():
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    added = apply_recommended_environment(environ)
    assert added == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    assert apply_recommended_environment(environ) == {}


def test_first_use_gives_python_the_command_lines_settings(monkeypatch):
    """Torch not loaded yet: the facade's first use fills what the user left unset, once."""
    from agt import threads

    monkeypatch.setattr(threads, "_first_use_done", False)
    environ = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    assert threads.prepare_first_use(environ, loaded=set()) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE", "CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    environ.clear()
    assert threads.prepare_first_use(environ, loaded=set()) == {} and environ == {}


def test_first_use_after_torch_warns_once_and_changes_nothing(monkeypatch):
    from agt import threads

    monkeypatch.setattr(threads, "_first_use_done", False)
    monkeypatch.setattr(threads, "_torch_threads", lambda: 2)
    environ: dict = {}
    with pytest.warns(threads.ThreadingWarning, match="OMP_WAIT_POLICY=PASSIVE"):
        assert threads.prepare_first_use(environ, loaded={"torch"}) == {}
    assert environ == {}
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        threads.prepare_first_use(environ, loaded={"torch"})       # once per process
    monkeypatch.setattr(threads, "_first_use_done", False)
    with warnings.catch_warnings():                                 # the user's policy: quiet
        warnings.simplefilter("error")
        threads.prepare_first_use({"OMP_WAIT_POLICY": "ACTIVE"}, loaded={"torch"})


def test_the_facades_first_use_sets_the_wait_policy_before_torch_loads():
    """End to end in a fresh interpreter: ``import agt`` changes nothing, the first public
    name sets OMP_WAIT_POLICY before torch (which the name's module loads) reads it."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = ("import json, os, sys, agt\n"
            "before = os.environ.get('OMP_WAIT_POLICY')\n"
            "agt.TrainConfig\n"
            "print(json.dumps([before, os.environ.get('OMP_WAIT_POLICY'),\n"
            "                  'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [None, "PASSIVE", True]


@pytest.mark.parametrize("subpackage", ["agt.certify", "agt.ensemble"])
def test_importing_a_subpackage_first_sets_the_wait_policy_without_a_warning(subpackage):
    """A program that imports ``agt.certify`` (or ``agt.ensemble``) before any facade name:
    its modules load torch, so the settings must be made before them, and no warning fires
    (torch was loaded by agt, after the settings); with torch imported first, one does."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = (f"import os, warnings\nwarnings.simplefilter('error')\nimport {subpackage}\n"
            f"print(os.environ.get('OMP_WAIT_POLICY'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "PASSIVE"
    torch_first = subprocess.run(
        [sys.executable, "-c", f"import torch, warnings\nwarnings.simplefilter('error')\n"
                               f"torch.set_num_threads(2)\nimport {subpackage}"],
        capture_output=True, text=True, env=env, timeout=120)
    assert torch_first.returncode != 0 and "ThreadingWarning" in torch_first.stderr
