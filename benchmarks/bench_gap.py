"""How far are the certificates from the truth? Certified k* against a poisoning attack.

For each task and bound method of bench_tightness.py (the MLP tasks only with the box
methods), per test query:
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

Binary ensembles (task ensemble_t25): the teachers train on disjoint parts of the data, so
the attack runs on every teacher (its part, its seed) and the ensemble's flip k is the sum
of the m smallest flip k of the teachers that vote for the answer (m: the fewest vote
changes that change it). Each such flip is rebuilt as one neighbour of the whole training
set (the teachers' poisoned parts merged back), the changed teachers are retrained from it
and the ensemble's answer is checked to change: every reported ensemble flip is a real
neighbour. A query where fewer than m of those teachers flip within the grid has no ceiling
(inf; counted as not flipped). The certified radius is the benchmark's (Thm 5.3); the row
also gives the min-cost ("tight") radius of the same teacher certificates.

    python benchmarks/bench_gap.py [--tasks a,b] [--methods interval,stability-ball]
                                   [--queries 100] [--max-k K] [--json FILE]

Methods that do not apply to a task (the stability rules on a clamped or momentum task, the
trajectory and stability rules on an MLP) are skipped with the reason. Deterministic: fixed data,
seeds and queries (the first --queries test points); the attack searches k in 1..max-k (default: the
task's largest grid k) by bisection after checking the largest.
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
from bench_tightness import _ratio, domain_of, task_setup, with_method  # noqa: E402

from agt.attack import flip_radius, poisoned_dataset  # noqa: E402
from agt.bounded.network import Network  # noqa: E402
from agt.certify import Certifier  # noqa: E402
from agt.data import Dataset  # noqa: E402
from agt.ensemble import EnsembleCertifier, train_ensemble  # noqa: E402
from agt.ensemble.partition import partition_indices, teacher_dataset, teacher_seed  # noqa: E402
from agt.errors import ConfigError, DataError  # noqa: E402
from agt.store import from_result  # noqa: E402
from agt.tensors import predicted_classes, torch_dtype  # noqa: E402
from agt.training import train, train_nominal  # noqa: E402
from agt.trajectory import TrajectoryBounds  # noqa: E402
from mechanisms.votes import aggregate, ensemble_radius, flips_needed  # noqa: E402

TASKS = ("ensemble_t25", "imdb_head_fine", "digits10_linear", "digits10_gd",
         "digits10_gd_centred", "digits_bin_mb_linear", "digits10_sgd_centred", "blobs_mlp",
         "digits_bin_mb", "digits10_mlp")


def _merged_neighbour(cfg, ds, n_teachers: int, xq, plan: dict[int, int], top: int):
    """The whole training set with teacher t's part replaced by the attack's neighbour of
    that part at distance plan[t] (for every t in plan): one neighbour of ds at distance
    <= sum(plan.values()), since the parts are disjoint and replace-one keeps positions."""
    x, y = ds.x_train.copy(), ds.y_train.copy()
    parts = partition_indices(ds.n_train, n_teachers)
    for t, k in plan.items():
        part = poisoned_dataset(cfg.replace(seed=teacher_seed(cfg.seed, t)),
                                teacher_dataset(ds, t, n_teachers), xq, k, probe_k=top)
        x[parts[t]], y[parts[t]] = part.x_train, part.y_train
    changed = int((np.any(x.reshape(len(x), -1) != ds.x_train.reshape(len(x), -1), axis=1)
                   | (y != ds.y_train)).sum())
    if changed > sum(plan.values()):
        raise SystemExit(f"internal check: the merged neighbour changes {changed} records, "
                         f"more than the {sum(plan.values())} planned")
    return Dataset(ds.name, x, y, ds.x_test, ds.y_test, ds.n_classes, dict(ds.meta))


def run_ensemble(task: str, n_queries: int, max_k: int | None) -> dict:
    """A binary ensemble's certified radius against the teachers' attacks (module docstring)."""
    cfg, ds, _, n_teachers = task_setup(task)
    if ds.n_classes != 2:
        raise ConfigError("ensembles with more than two classes: a flipped teacher votes for the "
                          "class its neighbour retrains to, so the teachers' flips do not add up")
    x_q, y_q = ds.x_test[:n_queries], ds.y_test[:n_queries]
    t0 = time.perf_counter()
    ens = train_ensemble(cfg, ds, n_teachers)
    cert = EnsembleCertifier(ens).certify(x_q)
    t_cert = time.perf_counter() - t0
    votes, radii = cert.teacher_predictions, cert.teacher_radii
    answer, m = aggregate(votes, 2), flips_needed(votes, 2)
    top = int(max_k or max(ens.k_values))
    t0 = time.perf_counter()
    flips = np.empty(votes.shape, dtype=np.int64)
    retrains = 0
    for t in range(n_teachers):
        att = flip_radius(cfg.replace(seed=teacher_seed(cfg.seed, t)),
                          teacher_dataset(ds, t, n_teachers), x_q, range(1, top + 1))
        if not np.array_equal(att.prediction, votes[:, t]):
            raise SystemExit(f"{task}: teacher {t}'s attacked model differs from its bundle's")
        flips[:, t], retrains = att.flip_k, retrains + att.n_retrains
    # the m cheapest flipped teachers that vote for the answer; where fewer than m of them
    # flipped the attack found no neighbour and the query has no ceiling (inf, counted in
    # not_flipped; the median is finite while fewer than half are)
    cost = np.where((votes == answer[:, None]) & (flips > 0), flips, np.inf)
    order = np.argsort(cost, axis=1, kind="stable")
    flip = np.full(len(x_q), -1, dtype=np.int64)
    ceiling = np.full(len(x_q), np.inf)
    for q in range(len(x_q)):
        chosen = order[q, :m[q]]
        if not np.all(np.isfinite(cost[q, chosen])):
            continue
        ceiling[q] = cost[q, chosen].sum() - 1
        plan = {int(t): int(flips[q, t]) for t in chosen}
        neighbour = _merged_neighbour(cfg, ds, n_teachers, x_q[q], plan, top)
        new_votes = votes[q].copy()
        for t in chosen:
            params = train_nominal(cfg.replace(seed=teacher_seed(cfg.seed, int(t))),
                                   teacher_dataset(neighbour, int(t), n_teachers))
            new_votes[t] = _predict(cfg, ds, params, x_q[q])
            retrains += 1
        if aggregate(new_votes[None], 2)[0] == answer[q]:
            raise SystemExit(f"{task} query {q}: the merged neighbour does not change the answer")
        flip[q] = sum(plan.values())
    t_att = time.perf_counter() - t0
    kstar = ensemble_radius(votes, radii, "thm5.3", 2)
    tight = ensemble_radius(votes, radii, "tight", 2)
    violations = int(((flip > 0) & (np.maximum(kstar, tight) >= flip)).sum())
    return {"task": task, "method": "served-k0 (Thm 5.3)", "queries": len(x_q),
            "accuracy": float((answer == y_q).mean()),
            "median_certified": float(np.median(kstar)), "median_tight": float(np.median(tight)),
            "median_ceiling": float(np.median(ceiling)), "not_flipped": int((flip < 0).sum()),
            "max_k": top, "violations": violations, "retrains": retrains,
            "train_certify_s": t_cert, "attack_s": t_att, "certified": kstar.tolist(),
            "tight": tight.tolist(), "flip_k": flip.tolist(),
            "teacher_pairs": int(flips.size), "teacher_pairs_not_flipped": int((flips < 0).sum()),
            "teacher_not_flipped_at_grid_end": int(((flips < 0) & (radii >= top)).sum()),
            "teacher_gap_max": int(np.max(np.where(flips > 0, flips - 1 - radii, 0)))}


def _predict(cfg, ds, params, xq) -> int:
    """The nominal model's class for one query (the served code path's forward pass)."""
    spec = cfg.model.with_input_shape(ds.feature_shape)
    dtype = torch_dtype(cfg.dtype)
    with torch.no_grad():
        z, _ = Network(spec.layers, 0).forward_nominal(
            {k: v.to(dtype) for k, v in params.items()}, torch.as_tensor(xq[None], dtype=dtype))
    return int(predicted_classes(z)[0])


def run(task: str, method: str, n_queries: int, max_k: int | None) -> dict:
    cfg, ds, _, n_teachers = task_setup(task)
    if n_teachers:
        if method != "served-k0":
            raise ConfigError("ensembles: measured with their default bound method only")
        return run_ensemble(task, n_queries, max_k)
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
            "median_certified": float(np.median(kstar)),
            "median_ceiling": float(np.median(ceiling)),
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
            tight = f" (tight {r['median_tight']:g})" if "median_tight" in r else ""
            print(f"| {task} | {method} | {r['accuracy']:.3f} | {r['median_certified']:g}{tight} | "
                  f"{r['median_ceiling']:g} (k <= {r['max_k']}) | "
                  f"{_ratio(r['median_ceiling'], r['median_certified'])} | "
                  f"{r['not_flipped']} ({r['queries']}) | "
                  f"{r['violations']} | {r['attack_s']:.1f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
