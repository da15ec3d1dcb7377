"""IMDB-like MLP benchmark: exact vs threshold selection, old vs new engine, time per k
relative to nominal training, and peak RSS.

Setting (issues 2 and 11): n x 768 inputs (n = 10,000 and 20,000), MLP 768-100-1, BCE,
3 full-batch steps (sgdm momentum 0.99, dampening 0.3, lr 0.2, lr_decay 0.5), gamma 0.04,
fragment 2000, float32 nominal, k = {0, 10, 100, 1000}. Data: two Gaussian classes in 768-d
(the real embeddings are not available offline).

Variants: nominal training only; the exact rule of this checkout ("exact") and of the
baseline revision ("exact-old", exported with git archive); the threshold rule of both.
Children run in the environment the ``agt`` command sets (passive OpenMP waits); a variant
ending in "@inherited" ("nominal@inherited", "exact@inherited") runs in this shell's
environment unchanged, and is compared with the nominal run of its own environment.
Every measurement runs in a fresh subprocess (peak RSS is its own); repeats are interleaved
so that a burst of load on a shared machine hits every variant alike. Reported: min wall
time (+ spread = max - min) and min CPU time; ratios use the minima of this one run.

    python benchmarks/bench_imdb.py [--batches 10000,20000] [--repeats 3]
        [--variants nominal,exact,exact-old,threshold,threshold-old,...@inherited]
        [--baseline REV]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BASELINE = "cac27e4"   # last commit with the torch.topk exact rule (before the introselect merges)
K_VALUES = "0,10,100,1000"


def measure(n: int, k_values: str, bounds: bool, selection: str, threads: int) -> dict:
    """One AGT (or nominal) training run in this process; imports agt from sys.path (the
    tree under test), so it uses nothing of benchmarks/ either."""
    import resource
    import time

    import numpy as np
    import torch

    from agt.config import config_from_dict
    from agt.data import Dataset
    from agt.training import train

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=n)
    x = rng.normal(size=(n, 768)) * 0.5 + (2 * y[:, None] - 1) * 0.05
    ds = Dataset("imdb-like", x, y.astype(np.int64), None, None, 2)
    cfg = config_from_dict(dict(
        model=[{"linear": {"in": 768, "out": 100}}, {"relu": {}},
               {"linear": {"in": 100, "out": 1}}],
        loss="binary_cross_entropy", data={"name": "npz", "path": "unused"}, optimizer="sgdm",
        momentum=0.99, dampening=0.3, learning_rate=0.2, lr_decay=0.5, n_epochs=3,
        batch_size=n, clip_gamma=0.04, k_values=k_values, fragment_size=2000,
        dtype="float32", device="cpu", selection=selection))
    t0, c0 = time.perf_counter(), time.process_time()
    res = train(cfg, ds, with_bounds=bounds)
    return {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0,
            "n_k": len(res.k_values),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks._common import run_child, variant_trees

    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="10000,20000")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="nominal,exact,exact-old,threshold,threshold-old")
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the old engine")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    variants = args.variants.split(",")
    trees = variant_trees(variants, args.baseline)
    print(f"IMDB-like 768-100-1, 3 full-batch steps, k = {{{K_VALUES}}}, {args.threads} threads, "
          f"{args.repeats} interleaved repeats; old = {args.baseline}")
    for n in (int(b) for b in args.batches.split(",")):
        runs: dict[str, list[dict]] = {v: [] for v in variants}
        for _ in range(args.repeats):
            for v in variants:
                name, _, env = v.partition("@")
                rule, _, age = name.partition("-")
                tree = trees["old" if age == "old" else "new"]
                kw = dict(n=n, k_values="0" if rule == "nominal" else K_VALUES,
                          bounds=rule != "nominal",
                          selection="exact" if rule == "nominal" else rule, threads=args.threads)
                runs[v].append(run_child(__file__, "measure", kw, tree,
                                         agt_environment=env != "inherited"))
        report(n, runs)


def report(n: int, runs: dict[str, list[dict]]) -> None:
    from benchmarks._common import spread

    best = {v: min(r["seconds"] for r in rs) for v, rs in runs.items()}
    # each variant against the nominal run of its own environment
    nominal_of = {v: "nominal" + v[v.index("@"):] if "@" in v else "nominal" for v in runs}
    print(f"\nn = {n}")
    print(f"  {'variant':14s} {'wall s: min (+spread)':>22s} {'cpu s':>8s} {'per k s':>8s} "
          f"{'per k / nominal':>16s} {'peak RSS MiB':>13s}")
    for v, rs in runs.items():
        is_nominal = v.startswith("nominal")
        n_k = 1 if is_nominal else rs[0]["n_k"]
        per_k = best[v] / n_k
        ratio = (f"{per_k / best[nominal_of[v]]:16.2f}" if nominal_of[v] in best
                 and not is_nominal else " " * 16)
        print(f"  {v:14s} {spread([r['seconds'] for r in rs]):>22s} "
              f"{min(r['cpu'] for r in rs):8.1f} {per_k:8.2f} {ratio} "
              f"{max(r['peak_rss_mb'] for r in rs):13.0f}")
    for a, b in (("exact", "threshold"), ("exact", "threshold-old"), ("exact-old", "exact"),
                 ("exact-old", "threshold-old"), ("threshold-old", "threshold")):
        if a in best and b in best:
            print(f"  {a} / {b}: {best[a] / best[b]:.2f}x")


if __name__ == "__main__":
    main()
