"""Cost of bound method "stability" (agt/stability.py): training with and without the
interval pass (config ``k_boxes``), and the placement programme of `StabilityProblem.radii`.

    python benchmarks/bench_stability.py [--repeats 3] [--threads 2]

1. Training on digits10_gd and digits10_sgd (benchmarks/bench_tightness.py's tasks) under
   ``k_boxes: interval`` (the interval pass beside the balls) and ``k_boxes: ball`` (boxes
   enclosing the balls, no interval pass), interleaved repeats; minimum, spread (max - min)
   and the ratio of the minima, all from this run, with the certified fractions of each
   (ball boxes compute the nominal rule's per-sample arithmetic in float64, so their radii
   charge less float error and certify at least as much in float32).
2. `radii` alone for synthetic step lists (T steps, a contiguous grid of K values; one step
   per epoch and 10 steps per epoch), minimum over the repeats.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from bench_tightness import domain_of, task_setup, with_method  # noqa: E402

from agt.certify import Certifier  # noqa: E402
from agt.stability import StabilityProblem, StabilityStep  # noqa: E402
from agt.store import from_result  # noqa: E402
from agt.training import train  # noqa: E402


def training(task: str, repeats: int) -> None:
    cfg, ds, ks, _ = task_setup(task)
    cfgs = {kb: with_method(cfg, method, domain_of(task))
            for kb, method in (("interval", "stability"), ("ball", "stability-ball"))}
    times = {kb: [] for kb in cfgs}
    fractions = {}
    for _ in range(repeats):
        for kb, c in cfgs.items():
            t0 = time.perf_counter()
            res = train(c, ds)
            times[kb].append(time.perf_counter() - t0)
            cert = Certifier(from_result(res)).certify(ds.x_test)
            fractions[kb] = [round(float((cert.max_certified_k >= k).mean()), 4) for k in ks]
    for kb, ts in times.items():
        print(f"{task:14s} k_boxes {kb:8s} train min {min(ts):7.3f} s  spread "
              f"{max(ts) - min(ts):6.3f} s  certified at k = {ks}: {fractions[kb]}")
    print(f"{task:14s} interval / ball (minima): {min(times['interval']) / min(times['ball']):.1f}x"
          f"; ball certifies at least as much: "
          f"{all(b >= i for b, i in zip(fractions['ball'], fractions['interval']))}")


def radii(repeats: int) -> None:
    problem = StabilityProblem.build("cross_entropy", 10, 64, True, 0.0, 8.0, torch.float32)
    for T, per_epoch, K in [(100, 1, 31), (1000, 1, 200), (1000, 10, 200), (5000, 50, 40)]:
        steps = [StabilityStep(epoch=t // per_epoch, lr=0.1, batch_size=128, beta=5.0,
                               norm=3.0) for t in range(T)]
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            problem.radii(list(range(K)), steps)
            ts.append(time.perf_counter() - t0)
        print(f"radii T = {T:5d}, {per_epoch:3d} steps per epoch, K = {K:4d}: min "
              f"{min(ts):6.3f} s, spread {max(ts) - min(ts):6.3f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    np.set_printoptions(precision=3)
    for task in ("digits10_gd", "digits10_sgd"):
        training(task, args.repeats)
    radii(args.repeats)


if __name__ == "__main__":
    main()
