"""Where the certificates of long training runs go: the wrapping effect, measured.

For a linear task of benchmarks/bench_tightness.py (default digits10_linear: 10-class
digits, 64 -> 10, cross-entropy, 10 full-batch float32 steps, lr 2, gamma 0.1), per step:

* interval method: median and largest width of the k = 0 and k = 1 boxes and the growth
  factor of the k = 1 median width;
* the nominal step map theta -> theta - lr * mean clamp(grad) at the nominal parameters
  (float64 autograd): its Jacobian's spectral radius and 2-norm (how fast the reachable set
  can grow) and the largest row sum of |J| (the factor interval arithmetic multiplies a box
  by);

then, after the last step, the largest parameter change over ``--neighbours`` retrained
neighbours (one random record replaced by a random point of the feature domain with a random
label, float64 retraining), against the k = 1 box half-width.

    python benchmarks/bench_wrapping.py [--task digits10_linear] [--neighbours 20]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
from bench_tightness import task_setup  # noqa: E402

from agt.bounded.losses import loss_grad_nominal  # noqa: E402
from agt.optim import round_to  # noqa: E402
from agt.tensors import torch_dtype  # noqa: E402
from agt.training import _batches, epoch_orders, train  # noqa: E402


def _linear_setup(name: str, k_values: list[int]):
    cfg, ds, _, _ = task_setup(name)
    if name == "imdb_head":       # the step map below has no momentum rule: plain SGD
        cfg = cfg.replace(optimizer="sgd", momentum=0.0, dampening=0.0)
    if len(cfg.model.layers) != 1:
        raise SystemExit(f"{name}: this benchmark needs a one-layer linear model")
    return cfg.replace(k_values=k_values), ds


def _theta(params: dict) -> torch.Tensor:
    w = params["0.weight"].detach().to(torch.float64)
    return torch.cat([w, params["0.bias"].detach().to(torch.float64)[:, None]], 1)


def _plan(cfg, n: int):
    dtype = torch_dtype(cfg.dtype)
    orders = epoch_orders(n, cfg.n_epochs, cfg.seed)
    batches = [torch.as_tensor(b) for e in range(cfg.n_epochs)
               for b in _batches(orders[e], cfg.batch_for(n))]
    return batches, [round_to(cfg.learning_rate_at(s), dtype) for s in range(len(batches))]


def _step_map(cfg, x: torch.Tensor, y: torch.Tensor, lr: float):
    """theta (C, d+1) -> theta - lr * mean clamp(per-sample gradient), float64, no rounding."""
    xt = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], 1)

    def step(theta):
        e = loss_grad_nominal(cfg.loss, xt @ theta.T, y)
        g = (e[:, :, None] * xt[:, None, :]).clamp(-cfg.clip_gamma, cfg.clip_gamma)
        return theta - lr * g.mean(0)
    return step


def diagnose(name: str, n_neighbours: int) -> None:
    cfg, ds = _linear_setup(name, [0, 1])
    widths = []
    res = train(cfg, ds, step_callback=lambda s, th, boxes: widths.append(
        {k: torch.cat([(b.hi - b.lo)[k].flatten() for b in boxes.values()]) for k in (0, 1)}))
    x = torch.as_tensor(ds.x_train, dtype=torch.float64)
    y = torch.as_tensor(ds.y_train)
    batches, lrs = _plan(cfg, ds.n_train)
    theta = _theta(res.init)
    print(f"{name}: {len(batches)} steps, P = {theta.numel()} parameters")
    print("step | k=0 median / max width | k=1 median / max width | k=1 growth | "
          "rho(J) | ||J||_2 | max row sum |J|")
    prev = None
    for s, (idx, lr) in enumerate(zip(batches, lrs)):
        step = _step_map(cfg, x[idx], y[idx], lr)
        J = torch.autograd.functional.jacobian(step, theta).reshape(theta.numel(), -1)
        rho = float(torch.linalg.eigvals(J).abs().max())
        two = float(torch.linalg.matrix_norm(J, 2))
        row = float(J.abs().sum(1).max())
        w0, w1 = widths[s][0], widths[s][1]
        med1 = float(w1.median())
        growth = f"{med1 / prev:6.2f}" if prev else "     -"
        prev = med1
        print(f"{s:4d} | {float(w0.median()):.2e} / {float(w0.max()):.2e} | "
              f"{med1:.2e} / {float(w1.max()):.2e} | {growth} | {rho:5.2f} | {two:5.2f} | "
              f"{row:6.2f}")
        theta = step(theta).detach()
    # retrained neighbours (float64, same batches and steps)
    rng = np.random.default_rng(0)
    bound = float(np.abs(ds.x_train).max())
    devs = []
    for _ in range(n_neighbours):
        i = int(rng.integers(ds.n_train))
        x2, y2 = x.clone(), y.clone()
        x2[i] = torch.as_tensor(rng.uniform(-bound if x.min() < 0 else 0.0, bound, x.shape[1]))
        y2[i] = int(rng.integers(int(y.max()) + 1))
        th = _theta(res.init)
        for idx, lr in zip(batches, lrs):
            th = _step_map(cfg, x2[idx], y2[idx], lr)(th)
        devs.append(float((th - theta).abs().max()))
    print(f"retrained neighbours (k = 1, n = {n_neighbours}): largest |delta theta| "
          f"{max(devs):.2e} (median over neighbours {np.median(devs):.2e}); k = 1 box "
          f"half-width median {float(widths[-1][1].median()) / 2:.2e}, "
          f"largest {float(widths[-1][1].max()) / 2:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="digits10_linear")
    ap.add_argument("--neighbours", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    diagnose(args.task, args.neighbours)


if __name__ == "__main__":
    main()
