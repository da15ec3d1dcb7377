"""Certify 10,000 Blobs queries against the contiguous k = 0..199 bundle.

Reports queries per second of the binary search (`Certifier.certify`) and of the linear scan
(`Certifier.certify_linear`), measured in one run; the reference linear scan manages about
18,000 queries/s on this machine.

    python benchmarks/bench_certify.py
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

sys.path.insert(0, ".")
from agt.certify import Certifier  # noqa: E402
from agt.config import load_config  # noqa: E402
from agt.data import blobs_features, load_dataset  # noqa: E402
from agt.store import from_result  # noqa: E402
from agt.training import train  # noqa: E402


def main() -> None:
    torch.set_num_threads(2)
    cfg = load_config("configs/blobs.yaml", {"device": "cpu"})
    ds = load_dataset(cfg.data.name, cfg.data.options)
    certifier = Certifier(from_result(train(cfg, ds)))
    rng = np.random.default_rng(0)
    centres = rng.choice([-1.25, 1.25], size=(10_000, 1))
    queries = blobs_features(centres + rng.normal(scale=0.35, size=(10_000, 2)), "cubic")
    certifier.certify(queries[:100])
    t0 = time.perf_counter()
    fast = certifier.certify(queries)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = certifier.certify_linear(queries)
    t_slow = time.perf_counter() - t0
    assert np.array_equal(fast.max_certified_k, slow.max_certified_k)
    q = len(queries)
    print(f"10,000 Blobs queries, k = 0..199 (mean k* = {fast.max_certified_k.mean():.1f})")
    print(f"  binary search : {t_fast:.3f} s = {q / t_fast:,.0f} queries/s "
          f"({q / t_fast / 18_000:.1f}x the reference linear scan's 18,000/s)")
    print(f"  linear scan   : {t_slow:.3f} s = {q / t_slow:,.0f} queries/s")


if __name__ == "__main__":
    main()
