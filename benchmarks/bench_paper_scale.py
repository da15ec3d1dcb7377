"""The paper's two pipelines at their real shapes and sizes, on generated data: wall time and
peak memory per stage, and AGT time per k relative to nominal training.

    python benchmarks/bench_paper_scale.py [--out FILE.json] [--repeats 1]
        [--imdb-n 25000] [--imdb-queries 10000]
        [--octmnist-public 81969] [--octmnist-private 15508,...] [--octmnist-queries 10000]
        [--stage-timeout 3600] [--only imdb|octmnist]

IMDB (configs/imdb.yaml: MLP 768-100-1, 3 full-batch steps, float32, its k grid of 17
values): nominal training, AGT training, certifying the queries, and releasing a label for
each through a ledger (exp-radius at eps 1 per query).

OctMNIST (configs/octmnist.yaml: a conv prefix 1x28x28 -> 3200, frozen after pretraining,
and a dense head 3200-100-1 fine-tuned with AGT, 4 full-batch steps, float32, its k grid of
20 values). The real split: OctMNIST has 97,477 training images; the private task (drusen
vs normal, balanced) has 2 x 7,754 = 15,508 of them and pretraining uses the rest (81,969).
Stages: one epoch of pretraining (Adam, batches of 100, as `agt reproduce octmnist`; the
plan runs 20), nominal and AGT training of the head at each private size of
``--octmnist-private`` (a list, so that a size too large for the machine can be
extrapolated from smaller ones), certifying the queries and releasing their labels.

Each stage runs in a fresh process (its peak RSS is its own), in the environment the
``agt`` command sets (passive OpenMP waits), under ``--stage-timeout``; a stage that runs
out of time is recorded as such. Every stage also records the CPU seconds its process used
(``cpu_s``, all threads; a stage stopped at its limit too) and the 1-minute load average at
its start and end: on a shared machine the wall time alone does not say how much of the
work was done. Figures: the minimum over ``--repeats``
with the spread (max - min), 2 threads, all in one run. Nothing here needs the real data.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._common import (  # noqa: E402
    child_environment,
    imdb_data,
    octmnist_data,
    pipeline_config,
)

EPSILON_PER_QUERY = 1.0
PRETRAIN_BATCH = 100
PRETRAIN_EPOCHS_IN_PLAN = 20


def _data(name: str, n: int, seed: int = 0):

    return imdb_data(n, seed) if name == "imdb" else octmnist_data(n, seed)


def _finish(out: dict) -> dict:
    from benchmarks._common import peak_rss_mb

    out["peak_rss_mib"] = round(peak_rss_mb(), 1)
    return out


# -- stages (each runs in its own process) --------------------------------------------------

def stage_pretrain(n: int, out_path: str) -> dict:
    """One epoch of the OctMNIST pretraining loop on ``n`` generated images; saves the
    state dict (the frozen prefix of the later stages)."""
    import torch

    from agt.models import init_params

    torch.set_num_threads(2)
    cfg = pipeline_config("octmnist", "cpu")
    ds = _data("octmnist", n, seed=1)
    spec = cfg.model.with_input_shape(ds.feature_shape)
    model = spec.build(torch.float32)
    model.load_state_dict(init_params(spec, cfg.seed, torch.float32))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    x = torch.as_tensor(ds.x_train, dtype=torch.float32)
    y = torch.as_tensor(ds.y_train, dtype=torch.float32)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    for i in range(0, n, PRETRAIN_BATCH):
        idx = order[i:i + PRETRAIN_BATCH]
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[idx])[:, 0], y[idx]).backward()
        opt.step()
    seconds = time.perf_counter() - t0
    torch.save(model.state_dict(), out_path)
    return _finish({"n": n, "epoch_s": seconds,
                    "plan_epochs": PRETRAIN_EPOCHS_IN_PLAN,
                    "plan_estimate_s": seconds * PRETRAIN_EPOCHS_IN_PLAN})


def stage_train(name: str, n: int, with_bounds: bool, bundle_path: str = "",
                pretrained: str = "") -> dict:
    """Nominal (``with_bounds`` False) or AGT training on ``n`` generated records."""
    import torch

    from agt.store import from_result, write_bundle
    from agt.training import train

    torch.set_num_threads(2)
    cfg = pipeline_config(name, "cpu", pretrained=pretrained or None)
    ds = _data(name, n)
    # untimed: a process's first training pays torch's start-up, not the pipeline's cost
    train(cfg.replace(k_values=[0, 1]), _data(name, 20, seed=4), with_bounds=with_bounds)
    t0 = time.perf_counter()
    res = train(cfg, ds, with_bounds=with_bounds)
    seconds = time.perf_counter() - t0
    out = {"n": n, "seconds": seconds, "k_values": len(tuple(cfg.k_values))}
    if with_bounds and bundle_path:
        write_bundle(from_result(res), bundle_path)
    return _finish(out)


def stage_certify_release(name: str, bundle_path: str, queries: int) -> dict:
    """Certify ``queries`` generated test queries, then release one label for each through
    a ledger (exp-radius, eps 1 per query)."""
    import numpy as np
    import torch

    import mechanisms
    from agt.certify import Certifier
    from agt.store import read_bundle
    from mechanisms.ledger import hash_query

    torch.set_num_threads(2)
    ds = _data(name, 10, seed=2)
    x = ds.x_test
    x = np.concatenate([x] * (1 + queries // len(x)))[:queries] if len(x) < queries else \
        x[:queries]
    # distinct queries (the ledger answers a repeated query from its record)
    x = x + np.random.default_rng(3).normal(scale=1e-3, size=x.shape)
    certifier = Certifier(read_bundle(bundle_path))
    certifier.certify(x[:5])                 # untimed warm-up
    t0 = time.perf_counter()
    cert = certifier.certify(x)
    certify_s = time.perf_counter() - t0
    mech = mechanisms.make_mechanism("exp-radius", EPSILON_PER_QUERY)
    with tempfile.TemporaryDirectory() as tmp:
        ledger = mechanisms.Ledger.open(Path(tmp) / "l.db",
                                        budget_epsilon=EPSILON_PER_QUERY * queries * 2)
        t0 = time.perf_counter()
        inputs = mechanisms.Certified.from_certificate(cert, [hash_query(q) for q in x])
        ledger.release(mech, inputs)
        release_s = time.perf_counter() - t0
        ledger.close()
    fraction = cert.certified_fraction()
    return _finish({"queries": queries, "certify_s": certify_s,
                    "queries_per_s": queries / certify_s, "release_s": release_s,
                    "certified_at": {str(k): round(fraction[k], 3)
                                     for k in (0, 10, 100) if k in fraction}})


# -- the driver -------------------------------------------------------------------------------

def _run(fn: str, timeout: float, **kwargs) -> dict:
    code = ("import json, runpy, sys; "
            f"mod = runpy.run_path({str(Path(__file__).resolve())!r}, run_name='stage'); "
            f"print('RESULT ' + json.dumps(mod[{fn!r}](**json.loads(sys.argv[1]))))")
    t0 = time.perf_counter()
    # CPU seconds of the stage's process (all its threads; a process killed at the limit
    # is reaped by subprocess.run, so it counts too) and the load around it: on a shared
    # machine wall time alone does not say how much of the work was done
    used0 = _children_cpu_s()
    load0 = os.getloadavg()
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout,
                              env=child_environment())
    except subprocess.TimeoutExpired:
        return {"timeout_s": timeout, **_usage(used0, load0)}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            out = json.loads(line[len("RESULT "):])
            out["process_s"] = time.perf_counter() - t0
            out.update(_usage(used0, load0))
            return out
    return {"error": (proc.stderr or proc.stdout)[-2000:]}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _usage(used0: float, load0: tuple[float, float, float]) -> dict:
    """The CPU seconds the stage's process used since ``used0`` (`_children_cpu_s`), and
    the 1-minute load average at its start and end."""
    return {"cpu_s": round(_children_cpu_s() - used0, 1),
            "load_1min": [round(load0[0], 2), round(os.getloadavg()[0], 2)]}


def _repeat(repeats: int, fn: str, timeout: float, key: str, **kwargs) -> dict:
    """Run a stage ``repeats`` times: the first run's figures with ``key`` as min and spread
    over the runs, and the largest peak RSS."""
    runs = [_run(fn, timeout, **kwargs) for _ in range(repeats)]
    ok = [r for r in runs if key in r]
    if not ok:
        return runs[0]
    best = dict(min(ok, key=lambda r: r[key]))
    values = [r[key] for r in ok]
    best[key + "_spread"] = max(values) - min(values)
    best["repeats"] = len(ok)
    best["peak_rss_mib"] = max(r["peak_rss_mib"] for r in ok)
    return best


def _pipeline(name: str, n: int, queries: int, repeats: int, timeout: float, tmp: Path,
              pretrained: str = "") -> dict:
    out = {}
    out["nominal"] = _repeat(repeats, "stage_train", timeout, "seconds", name=name, n=n,
                             with_bounds=False, pretrained=pretrained)
    bundle = str(tmp / f"{name}_{n}.h5")
    out["agt"] = _repeat(repeats, "stage_train", timeout, "seconds", name=name, n=n,
                         with_bounds=True, bundle_path=bundle, pretrained=pretrained)
    nominal, agt = out["nominal"].get("seconds"), out["agt"].get("seconds")
    if nominal and agt:
        out["agt_over_nominal"] = agt / nominal
        out["agt_per_k_over_nominal"] = agt / out["agt"]["k_values"] / nominal
    if queries and Path(bundle).is_file():
        out["certify_release"] = _repeat(repeats, "stage_certify_release", timeout,
                                         "certify_s", name=name, bundle_path=bundle,
                                         queries=queries)
    return out


def _line(label: str, stage: dict, key: str = "seconds") -> str:
    cpu = (f"   CPU {stage['cpu_s']:.0f} s, load {stage['load_1min'][0]:.1f} -> "
           f"{stage['load_1min'][1]:.1f}") if "cpu_s" in stage else ""
    if key not in stage:
        why = f"timed out after {stage['timeout_s']:.0f} s" if "timeout_s" in stage else \
            f"failed: {stage.get('error', '?')[-300:]}"
        return f"  {label:34s} {why}{cpu}"
    spread = stage.get(key + "_spread", 0.0)
    return (f"  {label:34s} {stage[key]:9.1f} s (+{spread:.1f})   "
            f"peak RSS {stage['peak_rss_mib'] / 1024:5.2f} GiB{cpu}")


def report(result: dict) -> None:
    for name in ("imdb", "octmnist"):
        if name not in result:
            continue
        print(f"\n{name}")
        part = result[name]
        if "pretrain" in part:
            p = part["pretrain"]
            print(_line(f"pretraining, 1 epoch of {p.get('n', '?'):,}", p, "epoch_s"))
            if "epoch_s" in p:
                print(f"  {'':34s} x {p['plan_epochs']} epochs of the plan = "
                      f"{p['plan_estimate_s'] / 60:.0f} min")
        for n, run in part["sizes"].items():
            print(_line(f"nominal training, n = {int(n):,}", run["nominal"]))
            print(_line(f"AGT training, n = {int(n):,}", run["agt"]))
            if "agt_per_k_over_nominal" in run:
                print(f"  {'':34s} AGT / nominal {run['agt_over_nominal']:.1f}x; per k "
                      f"{run['agt_per_k_over_nominal']:.2f}x ({run['agt']['k_values']} k)")
            cr = run.get("certify_release")
            if cr:
                print(_line(f"certifying {cr.get('queries', 0):,} queries", cr, "certify_s"))
                if "release_s" in cr:
                    print(f"  {'':34s} {cr['queries_per_s']:,.0f} queries/s; releasing "
                          f"their labels {cr['release_s']:.2f} s; certified at "
                          f"{cr['certified_at']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="artifacts/benchmarks/bench_paper_scale.json")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--imdb-n", type=int, default=25_000)
    ap.add_argument("--imdb-queries", type=int, default=10_000)
    ap.add_argument("--octmnist-public", type=int, default=81_969)
    ap.add_argument("--octmnist-private", default="15508",
                    help="comma-separated private sizes for the head's AGT training")
    ap.add_argument("--octmnist-queries", type=int, default=10_000)
    ap.add_argument("--stage-timeout", type=float, default=3600.0)
    ap.add_argument("--only", choices=("imdb", "octmnist"))
    args = ap.parse_args()
    out_path = ROOT / args.out if not Path(args.out).is_absolute() else Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    result = {"settings": vars(args), "threads": 2,
              "note": "generated data of the real shapes; each stage in a fresh process"}

    def save():
        out_path.write_text(json.dumps(result, indent=1))

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.only in (None, "imdb"):
            result["imdb"] = {"sizes": {str(args.imdb_n): _pipeline(
                "imdb", args.imdb_n, args.imdb_queries, args.repeats, args.stage_timeout, tmp)}}
            save()
        if args.only in (None, "octmnist"):
            pt = str(tmp / "prefix.pt")
            part = result["octmnist"] = {"sizes": {}}
            part["pretrain"] = _repeat(args.repeats, "stage_pretrain", args.stage_timeout,
                                       "epoch_s", n=args.octmnist_public, out_path=pt)
            save()
            sizes = [int(s) for s in args.octmnist_private.split(",") if s.strip()]
            for i, n in enumerate(sizes):
                # certify once, behind the largest size's bundle
                queries = args.octmnist_queries if i == len(sizes) - 1 else 0
                part["sizes"][str(n)] = _pipeline("octmnist", n, queries, args.repeats,
                                                  args.stage_timeout, tmp,
                                                  pretrained=pt if Path(pt).is_file() else "")
                save()
    report(result)
    print(f"\nwritten to {out_path}")


if __name__ == "__main__":
    main()
