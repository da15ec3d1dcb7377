"""The ledger's answering door alone: `Ledger.answer_batch` on 1,000-query requests, no
certification and no HTTP (what the durable writes of a request cost).

    python benchmarks/bench_ledger_door.py {sqlite|postgres} [N_REQUESTS]
        [--postgres postgresql://postgres@127.0.0.1:5432]

A fresh ledger (a file in a temporary folder, or a new database dropped at the end), then
N requests of 1,000 new generated queries each (hashes and radii made before the clock
starts), one `answer_batch` per request; prints labels per second over the loop and the
median time of one request. Run it from two checkouts one after the other (under
``flock /tmp/agt-bench.lock``) to compare their ledgers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def requests(n: int, size: int = 1000):
    """`n` requests of `size` new queries: random points, labels and radii."""
    from mechanisms import Certified, Source
    from mechanisms.ledger import hash_query

    source = Source("bundle-1", "a" * 64, ("replace-one",), True)
    out = []
    for seed in range(n):
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(size, 3))
        out.append(Certified(rng.integers(0, 2, size=size), rng.integers(-1, 12, size=size),
                             2, source, tuple(hash_query(q) for q in x)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("backend", choices=("sqlite", "postgres"))
    ap.add_argument("n", type=int, nargs="?", default=80)
    ap.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432")
    args = ap.parse_args()
    from mechanisms import Ledger, make_mechanism
    from mechanisms.ledger import AnswerRequest

    mech = make_mechanism("exp-radius", 1e-3)
    db = None
    if args.backend == "sqlite":
        name = os.path.join(tempfile.mkdtemp(), "l.db")
    else:
        import psycopg
        db = f"agt_bench_door_{os.getpid()}"
        with psycopg.connect(f"{args.postgres}/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {db}")
        name = f"{args.postgres}/{db}"
    reqs = requests(args.n)
    times = []
    try:
        with Ledger.open(name, budget_epsilon=1e6) as ledger:
            t0 = time.perf_counter()
            for inputs in reqs:
                t = time.perf_counter()
                ledger.answer_batch([AnswerRequest(mech, inputs, "bench")])
                times.append(time.perf_counter() - t)
            wall = time.perf_counter() - t0
    finally:
        if db is not None:
            with psycopg.connect(f"{args.postgres}/postgres", autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {db}")
    print(f"{args.backend} labels/s {args.n * 1000 / wall:.0f} median ms/request "
          f"{1000 * np.median(times):.1f}")


if __name__ == "__main__":
    main()
