"""The factored exact rule's two merges on the CPU: the compiled kernel (numba, the CPU's
default) against the torch merge (agt/topk_torch.py, the path of every other device, here
under AGT_FACTORED_MERGE=torch), on one AGT training of the IMDB-shaped head.

    flock /tmp/agt-bench.lock python benchmarks/bench_factored.py [--n 5000] [--repeats 3]
        [--k-values 0..10,20,50,100,200,500,1000] [--out factored.json]

configs/imdb.yaml (MLP 768-100-1, 3 full-batch steps, float32, fragments of 2,000) on
generated 768-d data. Per merge: the minimum and the spread (max - min) of ``--repeats``
trainings, after one untimed small training; the nominal training once for the per-k ratio;
and how far the two bundles' boxes lie apart (the batch sums' order only: see
agt/topk_torch.py). The torch merge is there for the GPU: on the CPU it is expected to be
slower (every value meets a selection, where the compiled kernel compares most with a floor).
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

from benchmarks._common import imdb_data, pipeline_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k-values", default=None, help="default: the config's grid")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    import agt.topk as topk
    from agt import topk_kernel
    from agt.training import train

    ds = imdb_data(args.n)
    cfg = pipeline_config("imdb", "cpu", args.k_values)
    train(pipeline_config("imdb", "cpu", "0,1"), imdb_data(200))    # untimed warm-up
    t0 = time.perf_counter()
    train(cfg, ds, with_bounds=False)
    nominal = time.perf_counter() - t0
    out = {"n": args.n, "k_values": len(cfg.k_values), "threads": torch.get_num_threads(),
           "nominal_s": round(nominal, 2), "numba": topk_kernel.available()}
    bundles = {}
    for merge in ("compiled", "torch"):
        topk.FACTORED_TORCH_ON_CPU = merge == "torch"
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            bundles[merge] = train(cfg, ds)
            times.append(time.perf_counter() - t0)
        out[merge] = {"min_s": round(min(times), 2), "spread_s": round(max(times) - min(times), 2),
                      "times_s": [round(t, 2) for t in times],
                      "per_k_over_nominal": round(min(times) / len(cfg.k_values) / nominal, 2)}
        print(merge, out[merge], flush=True)
    a, b = bundles["compiled"], bundles["torch"]
    out["torch_over_compiled"] = round(out["torch"]["min_s"] / out["compiled"]["min_s"], 2)
    out["max_box_gap"] = max(float((x[n] - y[n]).abs().max())
                             for x, y in ((a.lower, b.lower), (a.upper, b.upper)) for n in x)
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
