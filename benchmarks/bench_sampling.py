"""Cost of exact sampling (mechanisms/exact.py) against the float draws it replaced.

Per release of Q queries, measured in one run, each timing repeated (minimum and spread
reported): lnmax on C-class vote counts (exact discrete Laplace + random tie-break vs numpy's
float Laplace argmax), a binary Cauchy release (exact Bernoulli(arctan(2 s) / pi) vs a
float Cauchy draw), ss-argmax for C classes (exact lazily realised Cauchy argmax vs
numpy's float Cauchy argmax), and a sparse-vector session. Ratios are exact / float in the same run.

    python benchmarks/bench_sampling.py [--queries 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, ".")
from mechanisms import Certified, Source, make_mechanism  # noqa: E402
from mechanisms.ensemble import lnmax_draw, lnmax_scale  # noqa: E402
from mechanisms.noise import threshold_draw  # noqa: E402


def timed(fn, repeats: int) -> tuple[float, float]:
    """(minimum, max - min) wall seconds over `repeats` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), max(times) - min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    q, reps = args.queries, args.repeats
    rng = np.random.default_rng(0)
    rows = []

    for classes, eps in ((2, 1.0), (10, 1.0), (10, 0.01)):
        counts = rng.multinomial(32, np.ones(classes) / classes, size=q)

        def exact():
            lnmax_draw(counts, eps, rng)

        def floats():
            (counts + rng.laplace(0.0, lnmax_scale(eps), size=counts.shape)).argmax(axis=1)

        rows.append((f"lnmax C={classes} eps={eps}", timed(exact, reps), timed(floats, reps)))

    values = rng.integers(0, 2, size=q)
    for scale in (0.05, 1.0, 50.0):
        def exact_cauchy():
            threshold_draw(values, scale, "cauchy", rng)

        def float_cauchy():
            (values + scale * rng.standard_cauchy(size=q) > 0.5).astype(np.int64)

        rows.append((f"binary Cauchy s={scale}", timed(exact_cauchy, reps),
                     timed(float_cauchy, reps)))

    source = Source("bench", "ab" * 32, ("replace-one",), True)
    for classes, radius in ((3, 4), (10, 4), (10, 60)):
        argmax = make_mechanism("ss-argmax", 1.0)
        labels = rng.integers(0, classes, size=q)
        certified = Certified(labels, np.full(q, radius), classes, source)
        scale = argmax.scale(certified.radius, classes)

        def float_argmax():     # the float draw ss-argmax used before its exact sampler
            f = np.zeros((q, classes - 1))
            has = labels >= 1
            f[np.flatnonzero(has), labels[has] - 1] = 1.0
            z = rng.standard_cauchy(size=(q, classes - 1))
            np.concatenate([np.full((q, 1), 0.5), f + scale[:, None] * z], axis=1).argmax(axis=1)

        rows.append((f"ss-argmax C={classes} r={radius}",
                     timed(lambda: argmax._draw(certified, rng), reps), timed(float_argmax, reps)))

    inputs = Certified(values, rng.integers(-1, 40, size=q), 2, source)
    svt = make_mechanism("svt", 1.0, 1e-5, cutoff=q)
    rows.append((f"svt session (cutoff {q})", timed(lambda: svt.release(inputs, rng), reps),
                 None))

    print(f"{q} queries per release, {reps} repeats: min seconds (spread)")
    print(f"{'release':28s} {'exact':>18s} {'float':>18s} {'ratio':>7s} {'us/query':>9s}")
    for name, (t_exact, s_exact), other in rows:
        line = f"{name:28s} {t_exact:9.4f} ({s_exact:6.4f})"
        if other is None:
            line += f" {'':>18s} {'':>7s}"
        else:
            t_float, s_float = other
            line += f" {t_float:9.4f} ({s_float:6.4f}) {t_exact / t_float:7.0f}"
        print(line + f" {1e6 * t_exact / q:9.1f}")
    print(f"(timing spread is max - min over repeats; the median ratio is "
          f"{statistics.median(r[1][0] / r[2][0] for r in rows if r[2] is not None):.0f}x)")


if __name__ == "__main__":
    main()
