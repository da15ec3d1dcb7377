"""Training time and certified radii of this checkout against a baseline revision, on the
tasks of bench_tightness.py, in one run (optionally with ``k_placement: per-epoch``).

Written for the config-only overflow checks (public bounds on every run's parameters,
computed once per run; the records that could overflow marked at each step; the boxes cut to
the public bounds after every update; the nominal mean clamped) and the graded passes of the
per-epoch programme. It measures what they cost and whether any radius changed.

Every measurement runs in a fresh subprocess against a source tree (this checkout, or the
baseline exported with git archive); repeats alternate old / new, times are the minimum
over the repeats with the spread (max - min) beside them; radii are deterministic.

    python benchmarks/bench_versions.py [--tasks digits10_linear,blobs_mlp_mb1,...]
        [--placement per-epoch] [--repeats 3] [--baseline REV]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BASELINE = "ea89ada"     # the revision before the config-only checks
TASKS = ("digits10_linear", "digits_bin_mb", "blobs_mlp_mb1", "imdb_head")


def measure(task: str, threads: int, placement: str | None) -> dict:
    """Train and certify one task of bench_tightness in this process (agt from sys.path,
    the task definitions from the tree's own benchmarks/), with ``placement`` as the
    config's k_placement where given."""
    import time

    import numpy as np
    import torch

    sys.path.insert(0, "benchmarks")
    from bench_tightness import task_setup

    from agt.certify import Certifier
    from agt.store import from_result
    from agt.training import train

    torch.set_num_threads(threads)
    cfg, ds, ks, _ = task_setup(task)
    if placement is not None:
        cfg = cfg.replace(k_placement=placement)
    t0 = time.perf_counter()
    res = train(cfg, ds)
    seconds = time.perf_counter() - t0
    cert = Certifier(from_result(res)).certify(ds.x_test)
    k_star = np.asarray(cert.max_certified_k)
    return {"seconds": seconds, "median_k": float(np.median(k_star)),
            "fractions": [float((k_star >= k).mean()) for k in ks], "ks": list(ks)}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks._common import run_child, spread, variant_trees

    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the old engine")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--placement", default=None, choices=["per-batch", "per-epoch"])
    args = ap.parse_args()
    trees = variant_trees(["new", "new-old"], args.baseline)
    print(f"new (this checkout) vs old ({args.baseline}); k_placement "
          f"{args.placement or 'as configured'}; {args.threads} threads, {args.repeats} "
          f"interleaved repeats, train seconds min (+spread)")
    print(f"{'task':18s} {'old s':>16s} {'new s':>16s} {'new/old':>8s}  radii (median k*, "
          f"fractions at three k)")
    for task in args.tasks.split(","):
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for _ in range(args.repeats):
            for age in ("old", "new"):
                runs[age].append(run_child(__file__, "measure",
                                           dict(task=task, threads=args.threads,
                                                placement=args.placement), trees[age]))
        best = {age: min(r["seconds"] for r in rs) for age, rs in runs.items()}
        old, new = runs["old"][-1], runs["new"][-1]
        same = old["median_k"] == new["median_k"] and old["fractions"] == new["fractions"]
        radii = (f"same: {new['median_k']:g}, {new['fractions']} at k = {new['ks']}" if same
                 else f"old {old['median_k']:g} {old['fractions']} -> new "
                      f"{new['median_k']:g} {new['fractions']} at k = {new['ks']}")
        print(f"{task:18s} {spread([r['seconds'] for r in runs['old']]):>16s} "
              f"{spread([r['seconds'] for r in runs['new']]):>16s} "
              f"{best['new'] / best['old']:8.2f}  {radii}")


if __name__ == "__main__":
    main()
