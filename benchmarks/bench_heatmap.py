"""Blobs heat-map model benchmark: AGT training time of the 6-128-2 ReLU network
of configs/blobs_mlp.yaml (cross-entropy, 4 full-batch epochs on 3000 points, float64,
k = 0..199: 1 shared interval pass + 199 boxes x 3 steps), exact vs threshold selection,
old vs new engine. `agt reproduce blobs` trains two such models (separable and overlapping
blobs) for its heat map; their sum used to be ~49 s with the threshold rule.

Every measurement runs in a fresh subprocess; repeats are interleaved. Reported: min wall
time (+ spread = max - min), min CPU time, peak RSS; ratios use the minima of this run.

    python benchmarks/bench_heatmap.py [--repeats 3]
                                       [--variants exact,threshold,exact-old,threshold-old]
                                       [--baseline REV] [--variant-data separable]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BASELINE = "cac27e4"   # last commit with the torch.topk exact rule (before the introselect merges)


def measure(selection: str, bounds: bool, variant: str, threads: int) -> dict:
    """One training run in this process; imports agt from sys.path (the tree under test)."""
    import resource
    import time

    import torch

    from agt.config import load_config
    from agt.data import load_dataset
    from agt.training import train

    torch.set_num_threads(threads)
    cfg = load_config("configs/blobs_mlp.yaml", {"device": "cpu", "selection": selection})
    data = {**cfg.raw["data"], "variant": variant}
    cfg = cfg.replace(data=data)
    ds = load_dataset(cfg.data.name, cfg.data.options)
    t0, c0 = time.perf_counter(), time.process_time()
    res = train(cfg, ds, with_bounds=bounds)
    return {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0,
            "n_k": len(res.k_values), "n_train": ds.n_train,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks._common import run_child, spread, variant_trees

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default="nominal,exact,threshold,exact-old,threshold-old")
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the old engine")
    ap.add_argument("--variant-data", default="separable", help="blobs variant")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    variants = args.variants.split(",")
    trees = variant_trees(variants, args.baseline)
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for v in variants:
            rule, _, age = v.partition("-")
            kw = dict(selection="exact" if rule == "nominal" else rule, bounds=rule != "nominal",
                      variant=args.variant_data, threads=args.threads)
            runs[v].append(run_child(__file__, "measure", kw, trees["old" if age else "new"]))
    first = next(iter(runs.values()))[0]
    print(f"Blobs heat-map model 6-128-2, {first['n_train']} points, 4 full-batch epochs, "
          f"k = 0..199, {args.threads} threads, {args.repeats} interleaved repeats; "
          f"old = {args.baseline}")
    print(f"  {'variant':14s} {'wall s: min (+spread)':>22s} {'cpu s':>8s} {'peak RSS MiB':>13s}")
    best = {}
    for v, rs in runs.items():
        best[v] = min(r["seconds"] for r in rs)
        print(f"  {v:14s} {spread([r['seconds'] for r in rs]):>22s} "
              f"{min(r['cpu'] for r in rs):8.1f} {max(r['peak_rss_mb'] for r in rs):13.0f}")
    for a, b in (("exact", "threshold"), ("exact", "threshold-old"), ("exact-old", "exact"),
                 ("threshold-old", "threshold")):
        if a in best and b in best:
            print(f"  {a} / {b}: {best[a] / best[b]:.2f}x")


if __name__ == "__main__":
    main()
