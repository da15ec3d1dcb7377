"""Shared benchmark helpers (run by hand; not part of the test suite).

Measurements run in fresh subprocesses (so that peak RSS is their own) against a source tree:
this checkout, or a git revision exported with `git archive` (the "old" engine of a
before/after comparison). The benchmark's own code is the same in both; only ``agt`` differs.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def timer(out: dict, key: str):
    t0 = time.perf_counter()
    c0 = time.process_time()
    yield
    out[key] = time.perf_counter() - t0
    out[key + "_cpu"] = time.process_time() - c0


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def source_tree(rev: str | None) -> Path:
    """A temporary copy of git revision ``rev``, or for rev None of this checkout's working
    tree (tracked and untracked, not ignored files): edits made while a long benchmark
    runs do not leak into its later measurements."""
    out = Path(tempfile.mkdtemp(prefix=f"agt-{(rev or 'worktree')[:12]}-"))
    if rev is not None:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True,
                                 check=True).stdout
    else:
        files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], capture_output=True, check=True).stdout
        archive = subprocess.run(["tar", "-c", "-C", str(ROOT), "--null", "-T", "-"],
                                 input=files, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def run_child(script: str, fn: str, kwargs: dict, tree: Path, agt_environment: bool = True
              ) -> dict:
    """Run ``fn(**kwargs)`` of benchmark ``script`` in a fresh interpreter that imports agt
    from ``tree``, in the environment the ``agt`` command sets (`child_environment`), or
    with ``agt_environment=False`` in this one unchanged; returns its JSON result."""
    code = ("import json, runpy, sys; "
            f"sys.path.insert(0, {str(tree)!r}); "
            f"mod = runpy.run_path({str(Path(script).resolve())!r}); "
            f"print(json.dumps(mod[{fn!r}](**{kwargs!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree,
                         env=child_environment() if agt_environment else None)
    if out.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({tree}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child_environment() -> dict[str, str]:
    """The environment of a measurement: this one with the variables the ``agt`` command
    sets before torch loads (passive OpenMP waits: spinning OpenMP threads took the cores
    from the selection threads and made an IMDB-like exact run 1.3x slower); a variable the
    user set wins."""
    from agt.threads import apply_recommended_environment

    env = dict(os.environ)
    apply_recommended_environment(env)
    return env


def warm_tree(tree: Path) -> None:
    """Compile (and cache in ``tree``) the numba kernels of the exact rule once, so that no
    measurement pays the compilation; a tree without them, or without numba, is left alone."""
    code = ("import numpy as np\n"
            "try:\n"
            "    from agt import topk_kernel\n"
            "except ImportError:\n"
            "    raise SystemExit(0)\n"
            "if topk_kernel.available():\n"
            "    for dt in (np.float32, np.float64):\n"
            "        for largest in (True, False):\n"
            "            topk_kernel.merge_fragment(np.zeros((2, 200), dt), np.zeros((2, 3), dt),\n"
            "                                       np.zeros(2), 1.0, largest)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tree, env=child_environment())


def check_tree(tree: Path) -> None:
    """Make sure the child interpreter really imports agt from ``tree``."""
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); import agt; print(agt.__file__)"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tree).stdout.strip()
    if not got.startswith(str(tree)):
        raise RuntimeError(f"agt imported from {got}, expected {tree}")


def variant_trees(variants: list[str], baseline: str) -> dict[str, Path]:
    """The checked source trees a before/after run needs: "new" (this checkout) and, when a
    variant ends in ``-old``, "old" (git revision `baseline`)."""
    trees = {"new": source_tree(None)}
    if any(v.endswith("-old") for v in variants):
        trees["old"] = source_tree(baseline)
    for tree in trees.values():
        check_tree(tree)
        warm_tree(tree)
    return trees


def spread(values: list[float]) -> str:
    """'min (+spread)' of repeated measurements: min is the estimate on a noisy machine."""
    lo = min(values)
    return f"{lo:7.2f} (+{max(values) - lo:5.2f})" if len(values) > 1 else f"{lo:7.2f}"


def median(values: list[float]) -> float:
    return statistics.median(values)


# -- generated data of the paper pipelines' shapes ------------------------------------

def imdb_data(n: int, seed: int = 0):
    """Two Gaussian classes in 768-d, the scale of mean GPT-2 embeddings."""
    import numpy as np

    from agt.data import Dataset

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n + 10_000)
    x = rng.normal(size=(n + 10_000, 768)) * 0.5 + (2 * y[:, None] - 1) * 0.05
    return Dataset.from_arrays(x[:n], y[:n], x[n:], y[n:])


def octmnist_data(n: int, seed: int = 0):
    """28 x 28 single-channel images whose class shifts a fixed smooth pattern (so a conv
    net can tell them apart), pixel values in [0, 1] as OctMNIST's scaled images."""
    import numpy as np

    from agt.data import Dataset

    rng = np.random.default_rng(seed)
    total = n + 2_000
    grid = np.linspace(-1, 1, 28)
    pattern = np.exp(-(grid[:, None] ** 2 + grid[None, :] ** 2) * 3)[None]
    y = rng.integers(0, 2, size=total)
    x = rng.random(size=(total, 1, 28, 28)) * 0.6 + 0.4 * y[:, None, None, None] * pattern
    return Dataset.from_arrays(x[:n], y[:n], x[n:], y[n:])


def pipeline_config(name: str, device: str, k_values: str | None = None,
                    pretrained: str | None = None):
    """configs/<name>.yaml without its data, on ``device``; its own k grid unless
    ``k_values``; a random frozen prefix unless ``pretrained`` (benchmarks time, not train)."""
    import yaml

    from agt.config import config_from_dict

    raw = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    raw.pop("data", None)
    raw.pop("pretrained", None)
    raw["device"] = device
    if k_values is not None:
        raw["k_values"] = k_values
    if pretrained:
        raw["pretrained"] = pretrained
    return config_from_dict(raw)
