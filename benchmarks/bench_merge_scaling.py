"""How the OctMNIST head's AGT training scales with the number of private records: the CPU
seconds per bound value of the compiled factored merge (the exact rule's selection, most of
the training's time) for every k of the grid at several sample counts, and whole AGT
trainings' CPU seconds per record.

    flock /tmp/agt-bench.lock python benchmarks/bench_merge_scaling.py
        [--samples 1000,2000,4000,10000] [--inputs 16] [--repeats 3]
        [--trainings 300,1000,4000] [--train-k 0,10,200] [--pretrained prefix.pt]
        [--out scaling.json]

Merge: `agt.topk_kernel.merge_outer` on generated factors of the head's first layer
(100 output units, ``--inputs`` of its 3,200 inputs as intervals of non-negative ReLU
outputs; output gradients of both signs), both sides of every weight, one thread, CPU time
of the calling thread (``time.thread_time``: other jobs on a shared machine move it less than
wall time), the minimum over ``--repeats`` and the spread (max - min). A merge of n samples
costs 2 x 320,000 x n values per box and step; the script prints what the grid's boxes
cost per value together and the merge CPU this predicts for a training of 4 full-batch steps
(configs/octmnist.yaml) on n records. A training merges its fragments in flushes of up to
10,000 samples (`agt.topk.DEFER_BYTES`), so ``--samples 10000`` is the per-value cost of
the full task's first flush.

Trainings: ``--trainings`` sizes of the OctMNIST pipeline's head (configs/octmnist.yaml,
the grid ``--train-k``, generated data of the real shapes, behind ``--pretrained`` or the
initial prefix), the process's CPU seconds (all threads) for preparing the records (the
prefix's feature boxes) and for training, per record. Nothing here needs the real data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agt.threads import apply_recommended_environment  # noqa: E402

apply_recommended_environment()

from benchmarks._common import octmnist_data, peak_rss_mb, pipeline_config  # noqa: E402

OUT_UNITS = 100
FIRST_LAYER = 3200 * OUT_UNITS       # weights merged from factors (the rest: 200)
STEPS = 4


def merge_costs(samples: list[int], k_grid: list[int], inputs: int, repeats: int) -> dict:
    """Thread CPU nanoseconds per bound value of the compiled factored merge, per sample
    count and k: {n: {k: (min, spread)}}."""
    import numpy as np

    from agt import topk_kernel

    if not topk_kernel.available():
        raise SystemExit("numba is not installed: the compiled merge does not run here")
    rng = np.random.default_rng(0)
    one = np.ones((1, 1), np.float32)           # untimed: the kernel's compile (or cache load)
    topk_kernel.merge_outer(one, one, one, one, (0, 1), None, None, np.zeros(1), np.zeros(1), 0.9)
    out = {}
    for n in samples:
        d_lo = (rng.normal(size=(OUT_UNITS, n)) * 1e-2).astype(np.float32)
        d_hi = d_lo + np.abs(rng.normal(size=(OUT_UNITS, n)) * 1e-3).astype(np.float32)
        a_lo = np.maximum(rng.normal(size=(inputs, n)), 0).astype(np.float32)
        a_hi = a_lo + np.float32(1e-6)
        times: dict[int, list[float]] = {k: [] for k in k_grid}
        for _ in range(repeats):
            for k in k_grid:         # interleaved: a slow moment of the machine hits every k
                rows = OUT_UNITS * inputs
                buf_lo = np.full((rows, k), -np.inf, np.float32) if k else None
                buf_hi = np.full((rows, k), np.inf, np.float32) if k else None
                s_lo, s_hi = np.zeros(rows), np.zeros(rows)
                t0 = time.thread_time()
                topk_kernel.merge_outer(d_lo, d_hi, a_lo, a_hi, (0, inputs), buf_lo, buf_hi,
                                        s_lo, s_hi, 0.9)
                times[k].append((time.thread_time() - t0) / (2 * rows * n) * 1e9)
        out[n] = {k: (min(v), max(v) - min(v)) for k, v in times.items()}
    return out


def training_costs(sizes: list[int], k_grid: list[int], pretrained: str | None) -> list[dict]:
    """Process CPU seconds (all threads) of preparing and running AGT training of the
    OctMNIST head on each size."""
    import torch

    from agt.data import validate_dataset
    from agt.tensors import resolve_device, strict_kernels
    from agt.training import prepare, run, train

    torch.set_num_threads(2)
    cfg = pipeline_config("octmnist", "cpu", ",".join(map(str, k_grid)), pretrained)
    train(cfg.replace(k_values=[0, 1]), octmnist_data(20, 4))      # untimed warm-up
    rows = []
    for n in sizes:
        ds = octmnist_data(n, 0)
        validate_dataset(ds)
        device = resolve_device(cfg.device)
        with strict_kernels(device):
            c0, w0 = time.process_time(), time.perf_counter()
            setup = prepare(cfg, ds, device)
            c1, w1 = time.process_time(), time.perf_counter()
            run(setup, True, False, ds.sha256())
            c2, w2 = time.process_time(), time.perf_counter()
        rows.append({"n": n, "prepare_cpu_s": c1 - c0, "prepare_wall_s": w1 - w0,
                     "train_cpu_s": c2 - c1, "train_wall_s": w2 - w1,
                     "train_cpu_ms_per_record": (c2 - c1) / n * 1e3,
                     "peak_rss_mib": round(peak_rss_mb(), 1)})
    return rows


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", default="1000,2000,4000,10000")
    ap.add_argument("--k-values", default=None, help="default: configs/octmnist.yaml's grid")
    ap.add_argument("--inputs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trainings", default="", help="sizes of whole trainings (none: skip)")
    ap.add_argument("--train-k", default="0,10,200")
    ap.add_argument("--pretrained", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    k_grid = list(pipeline_config("octmnist", "cpu", args.k_values).k_values)
    result = {"settings": vars(args), "k_grid": k_grid}
    costs = merge_costs(_ints(args.samples), k_grid, args.inputs, args.repeats)
    result["merge_ns_per_value"] = {str(n): {str(k): v for k, v in c.items()}
                                    for n, c in costs.items()}
    print("compiled factored merge, thread CPU ns per bound value (min, +spread):")
    for n, c in costs.items():
        total = sum(v[0] for v in c.values())
        predicted = total * 1e-9 * 2 * FIRST_LAYER * n * STEPS
        result.setdefault("grid_ns_per_value", {})[str(n)] = total
        print(f"  n = {n:6,}: " + " ".join(f"{k}:{v[0]:.2f}(+{v[1]:.2f})" for k, v in c.items()))
        print(f"  {'':11s} the grid's {len(c)} boxes: {total:.1f} ns per value; merge CPU of "
              f"{STEPS} steps on {n:,} records = {predicted:,.0f} s")
    if args.trainings:
        rows = training_costs(_ints(args.trainings), _ints(args.train_k), args.pretrained)
        result["trainings"] = rows
        print(f"AGT trainings of the OctMNIST head, k = {args.train_k}:")
        for r in rows:
            print(f"  n = {r['n']:6,}: prepare {r['prepare_cpu_s']:.1f} CPU s, train "
                  f"{r['train_cpu_s']:.1f} CPU s ({r['train_wall_s']:.1f} s wall), "
                  f"{r['train_cpu_ms_per_record']:.1f} CPU ms per record")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
