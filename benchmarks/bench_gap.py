"""How far are the certificates from the truth? Certified k* against a poisoning attack.

For each task and bound method of bench_tightness.py (every task without an ensemble; the
MLP tasks only with the box methods), per test query:
the certified k* (a lower bound on the query's true stability radius) and the attack's flip
k (agt/attack.py: k records replaced, retrained by the served code path, the prediction
changes), which bounds the true radius from above for *every* sound method:

    certified k*  <=  true radius  <=  flip k - 1

Printed per row: nominal accuracy on the attacked queries, the median certified k*, the
median attack ceiling (flip k - 1; the largest attacked k where no flip was found), the
number of queries the attack did not flip, and the number of soundness violations
(certified k* >= flip k; must be 0). The ceiling's median bounds what any tighter method
could reach on these queries: "2x the baseline median" is out of reach for every sound
method when the ceiling is below it. The attack is a heuristic (two points of the
trajectory, one crafted record), so the truth may lie well below the ceiling.

    python benchmarks/bench_gap.py [--tasks a,b] [--methods interval,stability-ball]
                                   [--queries 100] [--max-k K] [--json FILE]

Methods that do not apply to a task (the stability rules on a clamped or momentum task, the
trajectory and stability rules on an MLP) are skipped with the reason. Deterministic: fixed data, seeds and queries (the first --queries
test points); the attack searches k in 1..max-k (default: the task's largest grid k) by
bisection after checking the largest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from agt.attack import flip_radius  # noqa: E402
from agt.certify import Certifier  # noqa: E402
from agt.errors import ConfigError, DataError  # noqa: E402
from agt.store import from_result  # noqa: E402
from agt.training import train  # noqa: E402
from agt.trajectory import TrajectoryBounds  # noqa: E402
from bench_tightness import _ratio, domain_of, task_setup, with_method  # noqa: E402

TASKS = ("imdb_head_fine", "digits10_linear", "digits10_gd", "digits10_gd_centred",
         "digits_bin_mb_linear", "digits10_sgd_centred", "blobs_mlp", "digits_bin_mb",
         "digits10_mlp")


def run(task: str, method: str, n_queries: int, max_k: int | None) -> dict:
    cfg, ds, _, n_teachers = task_setup(task)
    if n_teachers:
        raise ConfigError("ensembles: the attack targets one model")
    cfg = with_method(cfg, method, domain_of(task))
    x_q, y_q = ds.x_test[:n_queries], ds.y_test[:n_queries]
    t0 = time.perf_counter()
    bundle = from_result(train(cfg, ds))
    trajectory = TrajectoryBounds(bundle, ds) if method == "trajectory" else None
    cert = Certifier(bundle, trajectory=trajectory).certify(x_q)
    t_cert = time.perf_counter() - t0
    top = int(max_k or max(cert.k_values))
    t0 = time.perf_counter()
    att = flip_radius(cfg, ds, x_q, range(1, top + 1))
    t_att = time.perf_counter() - t0
    if not np.array_equal(att.prediction, cert.prediction):
        raise SystemExit(f"{task} {method}: the attack's served model differs from the bundle's")
    kstar = cert.max_certified_k
    ceiling = np.where(att.flip_k > 0, att.flip_k - 1, top)
    violations = int(((att.flip_k > 0) & (kstar >= att.flip_k)).sum())
    return {"task": task, "method": method, "queries": len(x_q),
            "accuracy": float((cert.prediction == y_q).mean()),
            "median_certified": float(np.median(kstar)), "median_ceiling": float(np.median(ceiling)),
            "not_flipped": int((att.flip_k < 0).sum()), "max_k": top, "violations": violations,
            "retrains": att.n_retrains, "train_certify_s": t_cert, "attack_s": t_att,
            "certified": kstar.tolist(), "flip_k": att.flip_k.tolist()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--methods", default="served-k0,trajectory,stability-ball,stability-clip:2")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--max-k", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    print("| task | method | accuracy | median certified k* | median attack ceiling | "
          "ratio of the medians (+1) | not flipped (of Q) | violations | attack s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for task in args.tasks.split(","):
        for method in args.methods.split(","):
            try:
                r = run(task, method, args.queries, args.max_k)
            except (ConfigError, DataError) as exc:
                print(f"| {task} | {method} | not applicable: {str(exc)[:90]} |||||||", flush=True)
                continue
            rows.append(r)
            print(f"| {task} | {method} | {r['accuracy']:.3f} | {r['median_certified']:g} | "
                  f"{r['median_ceiling']:g} (k <= {r['max_k']}) | "
                  f"{_ratio(r['median_ceiling'], r['median_certified'])} | {r['not_flipped']} ({r['queries']}) | "
                  f"{r['violations']} | {r['attack_s']:.1f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
