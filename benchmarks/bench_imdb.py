"""IMDB-like MLP benchmark: time per k relative to nominal training, and peak RSS.

Setting (issue 2): 10,000 x 768 inputs, MLP 768-100-1, BCE, 3 full-batch steps
(sgdm momentum 0.99, dampening 0.3, lr 0.2, lr_decay 0.5), gamma 0.04, fragment 2000,
float32 nominal. Data: two Gaussian classes in 768-d (the real embeddings are not
available offline). Each measurement runs in a fresh subprocess so that peak RSS is its own.

    python benchmarks/bench_imdb.py [--k-values 0,10,100,1000] [--batches 10000,20000]
                                    [--selection threshold,exact]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def _child(n: int, k_values: str, bounds: bool, selection: str = "threshold") -> dict:
    import numpy as np
    import torch

    sys.path.insert(0, ".")
    from benchmarks._common import peak_rss_mb, timer
    from agt.config import config_from_dict
    from agt.data import Dataset
    from agt.training import train

    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=n)
    x = rng.normal(size=(n, 768)) * 0.5 + (2 * y[:, None] - 1) * 0.05
    ds = Dataset("imdb-like", x, y.astype(np.int64), None, None, 2)
    cfg = config_from_dict(dict(
        model=[{"linear": {"in": 768, "out": 100}}, {"relu": {}}, {"linear": {"in": 100, "out": 1}}],
        loss="binary_cross_entropy", data={"name": "npz", "path": "unused"}, optimizer="sgdm",
        momentum=0.99, dampening=0.3, learning_rate=0.2, lr_decay=0.5, n_epochs=3,
        batch_size=n, clip_gamma=0.04, k_values=k_values, fragment_size=2000,
        dtype="float32", device="cpu", selection=selection))
    times: dict = {}
    with timer(times, "seconds"):
        res = train(cfg, ds, with_bounds=bounds)
    return {"n": n, "bounds": bounds, "k_values": list(res.k_values), "seconds": times["seconds"],
            "peak_rss_mb": peak_rss_mb()}


def run_child(n: int, k_values: str, bounds: bool, selection: str = "threshold") -> dict:
    code = (f"import json,sys; sys.path.insert(0,'.'); from benchmarks.bench_imdb import _child; "
            f"print(json.dumps(_child({n}, {k_values!r}, {bounds}, {selection!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k-values", default="0,10,100,1000")
    ap.add_argument("--batches", default="10000,20000")
    ap.add_argument("--selection", default="threshold,exact", help="threshold, exact or both")
    args = ap.parse_args()
    n0 = int(args.batches.split(",")[0])
    nominal = run_child(n0, "0", bounds=False)
    print(f"nominal training, n={n0}: {nominal['seconds']:.2f} s, peak RSS {nominal['peak_rss_mb']:.0f} MiB")
    runs = [(n, sel) for n in (int(b) for b in args.batches.split(",")) for sel in args.selection.split(",")]
    for n, selection in runs:
        agt = run_child(n, args.k_values, bounds=True, selection=selection)
        nk = len(agt["k_values"])
        per_k = agt["seconds"] / nk
        line = (f"AGT selection={selection} n={n}, {nk} k values {agt['k_values']}: "
                f"{agt['seconds']:.2f} s total, {per_k:.2f} s per k, peak RSS {agt['peak_rss_mb']:.0f} MiB")
        if n == n0:
            line += (f"; per k / nominal = {per_k / nominal['seconds']:.1f}x; "
                     f"vs reference 70-100 s per k: {70 / per_k:.1f}x-{100 / per_k:.1f}x faster")
        print(line)


if __name__ == "__main__":
    main()
