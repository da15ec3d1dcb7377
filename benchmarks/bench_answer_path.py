"""The service's answering path in process, step by step, as `PredictionService._answer`
runs it: certify a batch, hash its queries, build the `Certified` inputs, split them per
request, and answer the requests through `Ledger.answer_batch`.

    python benchmarks/bench_answer_path.py --bundle B.h5 [--ledger sqlite|postgres]
        [--shape 1x1000,8x1] [--rounds 30] [--budget] [--profile FILE.prof]
        [--postgres postgresql://postgres@127.0.0.1:5432]

Per shape (``R x Q``: batches of R requests of Q new queries each, exp-radius at eps 1e-3,
a fresh ledger): the milliseconds per batch of each step (the service's dataset check
``Ledger.fits``, certify, hash, inputs, answer_batch; and the process CPU time of every step
but certification, which leaves out waits for the disk and the database server), the
minimum over ``--rounds`` batches and the spread (median - min). Every batch asks new
queries (random points of the Blobs feature map), so no answer comes from the cache.
``--budget``: every client has its own budget (the client-budget check runs too);
``--profile``: a cProfile of every step but certification. Only public APIs are used, so
the script times any checkout (``PYTHONPATH=<checkout>``); it prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

EPSILON = 1e-3


def queries(n: int, seed: int) -> np.ndarray:
    from agt.data.blobs import blobs_features

    rng = np.random.default_rng(seed)
    return blobs_features(rng.normal(size=(n, 2)) * 1.5)


def new_ledger(kind: str, folder: Path, server: str, made: list) -> str:
    if kind == "sqlite":
        path = folder / f"ledger-{len(made)}.db"
        made.append(path)
        return str(path)
    import psycopg
    db = f"agt_rel_{os.getpid()}_{len(made)}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {db}")
        conn.execute(f"CREATE DATABASE {db}")
    made.append(db)
    return f"{server}/{db}"


def drop(kind: str, server: str, made: list) -> None:
    if kind == "sqlite":
        return
    import psycopg
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        for db in made:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                         "datname = %s AND pid <> pg_backend_pid()", (db,))
            conn.execute(f"DROP DATABASE IF EXISTS {db}")


def run_shape(certifier, ledger, mech, n_requests: int, size: int, rounds: int, seed: int,
              budget, profiler=None) -> dict:
    import inspect

    import mechanisms
    from mechanisms.ledger import AnswerRequest, hash_queries

    # the service's dataset check before each batch (`PredictionService._dataset_can_pay`),
    # of the totals the ledger committed last where this checkout has them
    known = {"known": True} if "known" in inspect.signature(ledger.fits).parameters else {}
    steps: dict[str, list[float]] = {name: [] for name in (
        "precheck", "certify", "hash", "inputs", "answer_batch", "total", "cpu_after_certify")}
    for k in range(rounds + 2):                       # two warm-up batches
        x = queries(n_requests * size, seed * 100_003 + k)
        if profiler is not None and k >= 2:
            profiler.enable()
        tp, cpu0 = time.perf_counter(), time.process_time()
        assert ledger.fits(1, EPSILON, **known)
        t0, cpu1 = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.disable()
        cert = certifier.certify(x, radii=True)
        if profiler is not None and k >= 2:
            profiler.enable()
        t1, cpu2 = time.perf_counter(), time.process_time()
        hashes = hash_queries(x)
        t2 = time.perf_counter()
        inputs = mechanisms.Certified.from_certificate(cert, hashes, with_radii=True)
        requests = [AnswerRequest(mech, inputs.subset(slice(i * size, (i + 1) * size)),
                                  f"client{i}", budget, None) for i in range(n_requests)]
        t3 = time.perf_counter()
        out = ledger.answer_batch(requests)
        t4, cpu3 = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.disable()
        bad = [a for a in out if isinstance(a, Exception)]
        if bad:
            raise bad[0]
        if k >= 2:
            for name, dt in zip(steps, (t0 - tp, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - tp,
                                        cpu1 - cpu0 + cpu3 - cpu2)):
                steps[name].append(dt * 1000)
    return {name: {"min": float(np.min(v)), "median": float(np.median(v)),
                   "spread": float(np.median(v) - np.min(v))} for name, v in steps.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--ledger", default="sqlite", choices=("sqlite", "postgres"))
    ap.add_argument("--shape", default="1x1000,8x1")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--budget", action="store_true")
    ap.add_argument("--profile")
    ap.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432")
    args = ap.parse_args()
    import mechanisms
    from agt.certify import Certifier
    from agt.store import read_bundle

    certifier = Certifier(read_bundle(args.bundle))
    mech = mechanisms.make_mechanism("exp-radius", EPSILON)
    budget = (1e6, 0.0) if args.budget else None
    made: list = []
    out = {"code": mechanisms.__file__, "ledger": args.ledger}
    profiler = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, shape in enumerate(args.shape.split(",")):
                n_requests, size = (int(v) for v in shape.split("x"))
                ledger = mechanisms.Ledger.open(new_ledger(args.ledger, Path(tmp), args.postgres,
                                                           made), budget_epsilon=1e6)
                try:
                    out[shape] = run_shape(certifier, ledger, mech, n_requests, size,
                                           args.rounds, seed=i + 1, budget=budget,
                                           profiler=profiler)
                finally:
                    ledger.close()
    finally:
        drop(args.ledger, args.postgres, made)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
