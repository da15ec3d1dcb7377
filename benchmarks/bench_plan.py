"""Release plans against real releases on scikit-learn's bundled data sets (issue 44's goal).

For breast cancer (2 classes, 30 features), wine (3 classes, 13) and digits (10 classes,
64): the records are shuffled (fixed seed) into a private training split (50 %), a public
split (20 %) and test queries (30 %). Breast cancer and wine are scaled with the public
split's mean and standard deviation (never the private split's statistics: they would
change with one record), digits by its fixed pixel range (x / 128 puts every 8x8 image of
values 0..16 in the unit ball). A linear model is trained with AGT on the private split
(breast cancer, wine: 30 full-batch epochs at learning rate 0.3, clip_gamma 0.05; digits:
configs/digits_stability.yaml, the trade-off study's settings; fixed by hand to give a
range of radii, not tuned for the goal), the test queries are certified, and
`mechanisms.release_plan.plan_release` plans B = (number of test queries) within each total
budget. For every row of every plan, 20 real releases are drawn through the ledger
(`mechanisms.expectation.simulate`, seeded); the script prints

  * the largest |expected accuracy - mean accuracy of the 20 releases| over the rows
    (goal: <= 0.03 for every row),
  * the recommended row's realised accuracy over the best realised row's (goal >= 0.97),
  * the rows the check before spending refuses without --force (expected answered fraction
    under 5 %, or an svt / ptr threshold above the grid's largest radius); the plan does
    not recommend them.

Run by hand (not a test), under the benchmark lock on a shared machine:

    flock /tmp/agt-bench.lock python benchmarks/bench_plan.py [--releases 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, ".")

import numpy as np  # noqa: E402

#: the data sets (linear models, one fixed set of training settings, not tuned)
DATASETS = ("breast_cancer", "wine", "digits")
#: total budgets planned: (epsilon_total, delta_total)
BUDGETS = ((10.0, 1e-5), (50.0, 1e-5))
ACCOUNTANTS = ("standard", "best", "tight", "rdp")


def split(name: str, seed: int = 0):
    """(private train, public, test) arrays of one scikit-learn data set, features scaled
    with the public split's mean and standard deviation."""
    from sklearn import datasets

    data = getattr(datasets, f"load_{name}")()
    x, y = data.data.astype(np.float64), data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    n_train, n_public = int(0.5 * len(y)), int(0.2 * len(y))
    if name == "digits":
        x = x / 128.0                       # the format's range, no statistics
    else:
        public = x[n_train:n_train + n_public]
        mean, std = public.mean(axis=0), public.std(axis=0)
        x = (x - mean) / np.where(std > 0, std, 1.0)
    return ((x[:n_train], y[:n_train]), (x[n_train:n_train + n_public],
                                        y[n_train:n_train + n_public]),
            (x[n_train + n_public:], y[n_train + n_public:]), int(y.max()) + 1)


def certified_inputs(name: str):
    """Train on the private split and certify the test queries: (inputs, y_test, number of k
    values, seconds)."""
    from agt import certify, train
    from agt.config import config_from_dict, load_config
    from agt.data.dataset import Dataset
    from mechanisms import Certified

    (xtr, ytr), _, (xte, yte), c = split(name)
    if name == "digits":
        cfg = load_config("configs/digits_stability.yaml").replace(device="cpu")
    else:
        cfg = config_from_dict({
            "model": [{"linear": {"in": xtr.shape[1], "out": c}}], "loss": "cross_entropy",
            "data": {"name": name}, "learning_rate": 0.3, "clip_gamma": 0.05,
            "n_epochs": 30, "batch_size": "full", "k_values": "0..49", "dtype": "float64",
            "device": "cpu", "seed": 0})
    t0 = time.perf_counter()
    bundle = train(cfg, Dataset(name, xtr, ytr, xte, yte, c))
    cert = certify(bundle, xte)
    return Certified.from_certificate(cert), yte, len(cert.k_values), time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", type=int, default=20)
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    args = ap.parse_args()
    from mechanisms.expectation import simulate
    from mechanisms.release_plan import plan_release

    rng = np.random.default_rng(2026)
    worst_gap, worst_ratio = 0.0, 1.0
    for name in args.datasets:
        inputs, y, n_k, secs = certified_inputs(name)
        print(f"\n== {name}: {inputs.n_queries} test queries, {inputs.n_classes} classes; "
              f"model accuracy {np.mean(inputs.prediction == y):.3f}; median radius "
              f"{int(np.median(inputs.radius))}; trained and certified in {secs:.1f} s")
        for eps_t, delta_t in BUDGETS:
            t0 = time.perf_counter()
            plan = plan_release(inputs, inputs.n_queries, eps_t, delta_t, labels=y,
                                accountants=ACCOUNTANTS, n_k_values=n_k)
            plan_s = time.perf_counter() - t0
            realised = {}
            print(f"-- total ({eps_t:g}, {delta_t:g}), B = {plan.n_queries}; plan in "
                  f"{plan_s:.1f} s")
            print(f"   {'mechanism':<12}{'accountant':<10}{'eps/q':>8}{'answered':>9}"
                  f"{'expected':>9}{'realised':>9}{'sd':>7}{'gap':>7}")
            for row in plan.rows:
                acc = [float(np.mean(simulate(row.planned, inputs, rng) == y))
                       for _ in range(args.releases)]
                m, sd = float(np.mean(acc)), float(np.std(acc))
                realised[(row.mechanism, row.accountant)] = m
                gap = abs(row.expectation.accuracy - m)
                worst_gap = max(worst_gap, gap)
                flag = "  refused by the check" if row.refused else ""
                print(f"   {row.mechanism:<12}{row.accountant:<10}"
                      f"{row.epsilon_per_query:>8.4f}{row.expectation.answered:>9.3f}"
                      f"{row.expectation.accuracy:>9.3f}{m:>9.3f}{sd:>7.3f}{gap:>7.3f}{flag}")
            rec = plan.recommended
            best = max(realised.values())
            ratio = realised[(rec.mechanism, rec.accountant)] / best if best > 0 else 1.0
            worst_ratio = min(worst_ratio, ratio)
            print(f"   recommended {rec.mechanism} ({rec.accountant}): realised "
                  f"{realised[(rec.mechanism, rec.accountant)]:.3f}, best realised {best:.3f}, "
                  f"ratio {ratio:.3f}")
    print(f"\nlargest |expected - realised| over every row: {worst_gap:.4f} (goal <= 0.03); "
          f"smallest recommended / best realised: {worst_ratio:.3f} (goal >= 0.97)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
