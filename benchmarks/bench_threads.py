"""Intra-op threads: oversubscription, OpenMP wait policy, and bounds vs thread count.
Run by hand; the machine is shared, so numbers are noisy.

A. Training time of one small model (the audit's "small agt train": 6-2 logistic on 800
   Blobs records, batch 100, 3 epochs, k = 0..20) and of a medium one (Blobs 6-128-2 MLP,
   3000 records, full batch, 2 epochs, k = 0..19), each in a fresh Python process so that the
   OpenMP settings take effect: torch's default thread count (all cores) vs 1 thread, with
   libgomp's default wait policy (spin, then sleep) vs OMP_WAIT_POLICY=PASSIVE (what the
   agt command line now sets), alone and next to one busy process (a Python busy loop).
   Time = training seconds measured inside the process (min and (min..max) over repeats).
B. Bounds vs thread count: a float32 64-100-2 MLP on 2000 random records (1 full-batch
   epoch, k = 0..5) trained with 1, 2 and 4 threads (4 oversubscribes 2 cores on purpose,
   bypassing agt's check, to show the chunking): hashes of the nominal parameters and of the
   bounds. This is why every teacher of an ensemble trains with the same thread count.
C. An ensemble (T = 10 teachers of the digits MLP if scikit-learn is installed, else Blobs
   MLP teachers): serially with 1 and with 2 threads per teacher vs 2 worker processes with
   1 thread each (what agt allows on 2 cores), and whether the ensemble ids agree.
D. The Python path vs the command line: the README quick start's training (its data and
   config) run as the README prints it (agt used before torch loads, so the facade's first
   use sets OMP_WAIT_POLICY), as a program that imports torch first (the old path, which
   warns), and as ``agt train --config --data`` on the same config and data, each in a fresh
   process, alone and next to one busy process. Training seconds: the clock of
   `agt.training.train` (which ``agt.train`` wraps and ``agt train`` prints), and the whole
   process's wall time (the command also writes the bundle and certifies the test split);
   ratios of the minima, Python / CLI.

    python benchmarks/bench_threads.py [--repeats 3] [--skip A,B,C,D]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # this process (B, C); A sets its own

import numpy as np  # noqa: E402

sys.path.insert(0, ".")

SMALL = dict(model=[{"linear": {"in": 6, "out": 2}}], loss="cross_entropy",
             data={"name": "blobs", "variant": "overlapping", "n_samples": 1000,
                   "test_fraction": 0.2, "seed": 0},
             learning_rate=0.5, lr_decay=0.1, clip_gamma=0.5, n_epochs=3, batch_size=100,
             k_values="0..20", device="cpu", dtype="float64")
MEDIUM = dict(model=[{"linear": {"in": 6, "out": 128}}, {"relu": {}},
                     {"linear": {"in": 128, "out": 2}}], loss="cross_entropy",
              data={"name": "blobs", "variant": "separable", "n_samples": 3750,
                    "test_fraction": 0.2, "seed": 0},
              learning_rate=2.0, lr_decay=0.6, lr_min=0.001, n_epochs=2, batch_size="full",
              clip_gamma=0.06, k_values="0..19", device="cpu", dtype="float64")

CHILD = r"""
import json, sys, time
sys.path.insert(0, ".")
import torch
from agt.config import config_from_dict
from agt.data import load_dataset
from agt.training import train
raw, threads = json.loads(sys.argv[1]), int(sys.argv[2])
if threads:
    torch.set_num_threads(threads)
cfg = config_from_dict(raw)
ds = load_dataset(cfg.data.name, cfg.data.options)
t0 = time.perf_counter()
train(cfg, ds)
print(json.dumps({"seconds": time.perf_counter() - t0, "threads": torch.get_num_threads()}))
"""

BUSY = "import time\nt = time.time()\nwhile time.time() - t < 3600: pass\n"


def child_seconds(raw: dict, threads: int, wait: str | None) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if wait:
        env["OMP_WAIT_POLICY"] = wait
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(raw), str(threads)], env=env,
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["seconds"], r["threads"]


def fmt(values) -> str:
    v = np.asarray(values)
    return f"{v.min():8.3f} ({v.min():.3f}..{v.max():.3f})"


def part_a(repeats: int) -> None:
    print("\n== A. one model: threads x OpenMP wait policy x a busy neighbour ==")
    print(f"{'model':8s} {'neighbour':10s} {'threads':>8s} {'wait policy':>14s} "
          f"{'train s: min (min..max)':>28s}")
    for name, raw in (("small", SMALL), ("medium", MEDIUM)):
        for busy in (False, True):
            competitor = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
            try:
                time.sleep(0.5 if busy else 0)
                for threads in (0, 1):
                    for wait in (None, "PASSIVE"):
                        runs = [child_seconds(raw, threads, wait) for _ in range(repeats)]
                        label = f"{runs[0][1]}" + (" (default)" if threads == 0 else "")
                        print(f"{name:8s} {'1 busy' if busy else 'none':10s} {label:>8s} "
                              f"{wait or 'libgomp default':>14s} {fmt([s for s, _ in runs]):>28s}",
                              flush=True)
            finally:
                if competitor is not None:
                    competitor.kill()
                    competitor.wait()


def part_b() -> None:
    import torch

    from agt.config import config_from_dict
    from agt.data import Dataset
    from agt.training import train

    print("\n== B. bounds vs intra-op thread count (float32 64-100-2 MLP, 2000 records) ==")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 64))
    y = (x[:, :3].sum(1) > 0).astype(np.int64)
    ds = Dataset("random64", x, y, x[:100], y[:100], 2)
    cfg = config_from_dict(dict(model=[{"linear": {"in": 64, "out": 100}}, {"relu": {}},
                                       {"linear": {"in": 100, "out": 2}}],
                                loss="cross_entropy", learning_rate=0.5, lr_decay=0.1,
                                clip_gamma=0.5, n_epochs=1, batch_size="full", k_values="0..5",
                                dtype="float32", device="cpu"))

    def digest(*groups) -> str:
        h = hashlib.sha256()
        for g in groups:
            for n in sorted(g):
                h.update(g[n].contiguous().numpy().tobytes())
        return h.hexdigest()[:12]

    before = torch.get_num_threads()
    rows = []
    for threads in (1, 2, 4):
        torch.set_num_threads(threads)
        r = train(cfg, ds)
        rows.append((threads, digest(r.nominal), digest(r.lower, r.upper)))
    torch.set_num_threads(before)
    for threads, nom, bounds in rows:
        print(f"  {threads} thread(s): nominal {nom}  bounds {bounds}"
              f"{'  (same as 1 thread)' if (nom, bounds) == rows[0][1:] else '  DIFFERENT'}")


def part_c(repeats: int) -> None:
    from agt.config import load_config
    from agt.data import load_dataset
    from agt.ensemble import train_ensemble
    from benchmarks.bench_ensemble import digits_case

    T = 10
    made = digits_case(T)
    if made is None:
        cfg = load_config("configs/blobs_mlp.yaml", {"device": "cpu", "k_values": "0..49"})
        made = ("Blobs 6-128-2 MLP", cfg, load_dataset(cfg.data.name, cfg.data.options))
    name, cfg, ds = made
    print(f"\n== C. ensemble of T = {T} ({name}): threads per teacher vs worker processes ==")
    print(f"{'how':28s} {'wall s: min (min..max)':>26s}  ensemble id")
    for label, kw in (("serial, 1 thread/teacher", {"threads": 1}),
                      ("serial, 2 threads/teacher", {"threads": 2}),
                      ("2 processes x 1 thread", {"workers": 2, "threads": 1})):
        walls, ids = [], set()
        for _ in range(repeats):
            t0 = time.perf_counter()
            ens = train_ensemble(cfg, ds, T, **kw)
            walls.append(time.perf_counter() - t0)
            ids.add(ens.ensemble_id)
        print(f"{label:28s} {fmt(walls):>26s}  {', '.join(sorted(ids))}", flush=True)


#: the README quick start's training, as a program runs it (`first` picks the import order)
QUICK_START = r"""
import json, sys, time
if sys.argv[1] == "torch-first":
    import torch  # noqa: F401
import numpy as np, agt
rng = np.random.default_rng(0)
x = rng.normal(size=(600, 6)); y = (x[:, 0] + 0.3 * x[:, 1] > 0).astype(int)
ds = agt.Dataset.from_arrays(x[:500], y[:500], x[500:], y[500:])
cfg = agt.TrainConfig.create([{"linear": {"in": 6, "out": 2}}], "cross_entropy",
                             learning_rate=2.0, clip_gamma=0.1, k_values="0..49")
# agt.train wraps this same function; its own clock is the one agt train prints
print(json.dumps({"seconds": agt.train_result(cfg, ds).seconds}))
"""


def _quick_start_files(folder) -> tuple[str, str]:
    """The quick start's data as an npz and its config as YAML, for ``agt train``."""
    import yaml

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 6))
    y = (x[:, 0] + 0.3 * x[:, 1] > 0).astype(np.int64)
    data = os.path.join(folder, "quick_start.npz")
    np.savez(data, x_train=x[:500], y_train=y[:500], x_test=x[500:], y_test=y[500:])
    config = os.path.join(folder, "quick_start.yaml")
    with open(config, "w") as fh:
        yaml.safe_dump({"model": [{"linear": {"in": 6, "out": 2}}], "loss": "cross_entropy",
                        "learning_rate": 2.0, "clip_gamma": 0.1, "k_values": "0..49",
                        "data": {"name": "npz", "path": data}}, fh)
    return config, data


#: what the ``agt`` console script runs
AGT_COMMAND = "import sys\nfrom agt.cli import main\nsys.exit(main())"


def _timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[-1]} failed:\n{out.stderr[-2000:]}")
    return time.perf_counter() - t0, out.stdout


def part_d(repeats: int) -> None:
    import re
    import tempfile

    print("\n== D. README quick start: Python (as printed / torch imported first) vs agt train ==")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    with tempfile.TemporaryDirectory() as tmp:
        config, data = _quick_start_files(tmp)
        out_h5 = os.path.join(tmp, "q.h5")
        ways = {
            "python, as printed": [sys.executable, "-c", QUICK_START, "agt-first"],
            "python, torch first": [sys.executable, "-c", QUICK_START, "torch-first"],
            "agt train (CLI)": [sys.executable, "-c", AGT_COMMAND, "train", "--config", config,
                                "--data", data, "--out", out_h5, "--overwrite", "--quiet"],
        }
        for busy in (False, True):
            competitor = subprocess.Popen([sys.executable, "-c", BUSY]) if busy else None
            try:
                time.sleep(0.5 if busy else 0)
                train = {w: [] for w in ways}
                wall = {w: [] for w in ways}
                failed = {w: [] for w in ways}
                for _ in range(repeats):           # interleaved, so drift hits every way alike
                    for way, cmd in ways.items():
                        try:
                            seconds, stdout = _timed(cmd, env)
                        except RuntimeError as exc:      # reported, not hidden
                            failed[way].append(str(exc).strip().splitlines()[-1][:160])
                            continue
                        wall[way].append(seconds)
                        if way.startswith("agt"):
                            train[way].append(float(re.search(r"time: ([0-9.]+) s training",
                                                              stdout).group(1)))
                        else:
                            train[way].append(json.loads(stdout.strip().splitlines()[-1])
                                              ["seconds"])
                cli_t, cli_w = min(train["agt train (CLI)"]), min(wall["agt train (CLI)"])
                print(f"neighbour: {'1 busy process' if busy else 'none'}")
                print(f"  {'how':22s} {'train s: min (min..max)':>26s} {'/ CLI':>6s} "
                      f"{'process s: min (min..max)':>28s} {'/ CLI':>6s}")
                for way in ways:
                    if train[way]:
                        print(f"  {way:22s} {fmt(train[way]):>26s} "
                              f"{min(train[way]) / cli_t:6.2f} {fmt(wall[way]):>28s} "
                              f"{min(wall[way]) / cli_w:6.2f}", flush=True)
                    for reason in failed[way]:
                        print(f"  {way:22s} FAILED: {reason}", flush=True)
            finally:
                if competitor is not None:
                    competitor.kill()
                    competitor.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip", default="")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    print(f"{os.cpu_count()} cores; load avg {os.getloadavg()[0]:.2f} (shared machine: noisy)")
    if "A" not in skip:
        part_a(args.repeats)
    if "B" not in skip:
        part_b()
    if "C" not in skip:
        part_c(args.repeats)
    if "D" not in skip:
        part_d(args.repeats)
    print(f"\nload avg at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
