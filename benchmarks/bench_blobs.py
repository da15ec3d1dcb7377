"""Blobs logistic regression, contiguous k = 0..199.

Compares, in one run on this machine:
  * the one-pass multi-k AGT run (all 200 k values, vectorised),
  * 200 separate single-k AGT runs of the same engine (k_values = [0, k]),
  * plain PyTorch training of the same model (nn.Linear + CrossEntropyLoss + SGD,
    full batch, no clamping: the cost of training without any certification).

    python benchmarks/bench_blobs.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

sys.path.insert(0, ".")
from agt.config import load_config  # noqa: E402
from agt.data import load_dataset  # noqa: E402
from agt.training import train  # noqa: E402


def plain_pytorch(cfg, ds) -> float:
    x = torch.as_tensor(ds.x_train)
    y = torch.as_tensor(ds.y_train)
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model = torch.nn.Linear(6, 2).double()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.learning_rate)
    for step in range(cfg.n_epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return time.perf_counter() - t0


def best_of(fn, repeats: int) -> float:
    return min(fn() for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    cfg = load_config("configs/blobs.yaml", {"device": "cpu"})
    ds = load_dataset(cfg.data.name, cfg.data.options)
    train(cfg, ds)  # warm-up (imports, allocator)

    def one_pass():
        t0 = time.perf_counter()
        train(cfg, ds)
        return time.perf_counter() - t0

    def separate():
        t0 = time.perf_counter()
        for k in range(1, 200):
            train(cfg.replace(k_values=[0, k]), ds)
        return time.perf_counter() - t0

    t_one = best_of(one_pass, args.repeats)
    t_sep = separate()
    t_plain = best_of(lambda: plain_pytorch(cfg, ds), args.repeats)
    t_nominal = best_of(lambda: (lambda t0: (train(cfg, ds, with_bounds=False),
                                             time.perf_counter() - t0)[1])(time.perf_counter()),
                        args.repeats)
    print(f"Blobs logistic, n={ds.n_train}, k = 0..199, {cfg.n_epochs} full-batch step(s)")
    print(f"  one-pass AGT, all 200 k values : {t_one:8.3f} s   "
          f"(goal < 2 s; reference: 54 s for 200 runs)")
    print(f"  200 separate single-k runs     : {t_sep:8.3f} s   "
          f"-> one pass is {t_sep / t_one:.1f}x faster")
    print(f"  agt nominal training only      : {t_nominal:8.3f} s")
    print(f"  plain PyTorch training         : {t_plain:8.3f} s   "
          f"-> one-pass AGT / plain = {t_one / t_plain:.1f}x")


if __name__ == "__main__":
    main()
