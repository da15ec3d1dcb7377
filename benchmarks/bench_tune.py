"""Does `agt tune` on public data give a released accuracy at least that of the configs/
defaults at the same budget (issue 44's goal)? Run by hand, not a test:

    python benchmarks/bench_tune.py [--seeds 3] [--template configs/blobs.yaml] [--quick]

On scikit-learn's bundled breast-cancer (569 records, 30 features, 2 classes), wine (178,
13, 3) and digits (1,797, 64, 10) sets, per split seed: the records are permuted and cut
into a public part (30%, for tuning), a private training part (50%) and a held-out test part
(20%); features are standardised with the *public* part's mean and standard deviation (a
public statistic). The default is the template (configs/blobs.yaml: lr 2, decay 0.6, one
full-batch epoch, gamma 0.06, k 0..199) with its model made a linear layer of the data's
width and classes. `agt tune`'s library call (`experiments.tune.tune`, search space
``small``, 2 public splits, the private part's size as ``private_records`` unless
``--unscaled``) sees only the public part. Both configs then train on the private
part; each is scored on the test part by the exact expected accuracy of its release at the
budget (B = 100 queries, total (eps, delta)), and by the mean of 20 simulated releases
through in-memory ledgers. The default is scored with exp-radius and, as an upper reference
that chooses its mechanism on the test labels (favouring the default), with its best
mechanism. Prints one row per (data set, budget, seed) and the mean over seeds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, ".")

import numpy as np  # noqa: E402

from agt.certify import Certifier  # noqa: E402
from agt.config import load_config  # noqa: E402
from agt.data.dataset import Dataset  # noqa: E402
from agt.store import from_result  # noqa: E402
from agt.training import train  # noqa: E402
from experiments.accuracy import sampled_accuracy  # noqa: E402
from experiments.public_tuning import budgeted_mechanism, score_release  # noqa: E402
from experiments.tune import MECHANISMS_TRIED, ReleaseBudget, search_space, tune  # noqa: E402
from mechanisms import Certified  # noqa: E402

BUDGETS = ((100, 1.0, 0.0), (100, 10.0, 0.0), (100, 1.0, 1e-6))


def load(name: str):
    from sklearn import datasets

    loader = {"breast-cancer": datasets.load_breast_cancer, "wine": datasets.load_wine,
              "digits": datasets.load_digits}[name]
    x, y = loader(return_X_y=True)
    return x.astype(np.float64), y.astype(np.int64)


def parts(x, y, seed: int):
    """public 30% / private train 50% / test 20%, standardised with public statistics."""
    order = np.random.default_rng(seed).permutation(len(y))
    n_pub, n_priv = int(0.3 * len(y)), int(0.5 * len(y))
    pub, priv, test = np.split(order, [n_pub, n_pub + n_priv])
    mu, sd = x[pub].mean(axis=0), x[pub].std(axis=0)
    sd[sd == 0] = 1.0
    z = (x - mu) / sd
    c = int(y.max()) + 1
    public = Dataset("public", z[pub], y[pub], None, None, c, {})
    private = Dataset("private", z[priv], y[priv], z[test], y[test], c, {})
    return public, private


def released(cfg, private: Dataset, names, budget: ReleaseBudget, seed: int) -> dict:
    """{mechanism: (expected, sampled mean)} of the private model on the test part."""
    cert = Certifier(from_result(train(cfg, private)), device="cpu").certify(private.x_test)
    inputs = Certified.from_certificate(cert)
    out = {}
    for name in names:
        try:
            mech = budgeted_mechanism(name, budget.epsilon_total, budget.delta_total,
                                      budget.queries).mechanism
            mech.check(inputs)
        except Exception:       # not applicable (classes, delta): skipped
            continue
        rngs = [np.random.default_rng([seed, i]) for i in range(20)]
        out[name] = (score_release(mech, inputs, private.y_test),
                     float(np.mean(sampled_accuracy(mech, inputs, private.y_test, rngs))))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--template", default="configs/blobs.yaml")
    ap.add_argument("--space", default="small")
    ap.add_argument("--quick", action="store_true", help="one budget, one seed, breast cancer")
    ap.add_argument("--unscaled", action="store_true",
                    help="score radii as certified on the public part (no --private-records)")
    args = ap.parse_args()
    base = load_config(args.template)
    sets = ("breast-cancer",) if args.quick else ("breast-cancer", "wine", "digits")
    budgets = BUDGETS[:1] if args.quick else BUDGETS
    seeds = range(1 if args.quick else args.seeds)
    print("data set       B    eps    delta  seed  default exp-radius  default best (oracle)"
          "       tuned (mechanism)                 tune s")
    summary: dict[tuple, list] = {}
    for name in sets:
        x, y = load(name)
        c = int(y.max()) + 1
        raw = {k: v for k, v in base.raw.items() if k != "data"}
        raw["model"] = [{"linear": {"in": int(x.shape[1]), "out": c}}]
        raw["device"] = "cpu"
        template = load_config_from(raw)
        for queries, eps, delta in budgets:
            budget = ReleaseBudget(queries, eps, delta)
            for seed in seeds:
                public, private = parts(x, y, seed)
                t0 = time.perf_counter()
                result = tune(public, template, budget, space=search_space(template, args.space),
                              splits=2, seed=seed,
                              private_records=None if args.unscaled else private.n_train)
                seconds = time.perf_counter() - t0
                default = released(template, private, MECHANISMS_TRIED, budget, seed)
                tuned = released(result.config.replace(data=None), private,
                                 (result.mechanism,), budget, seed)
                d_exp = default["exp-radius"]
                best = max(default, key=lambda m: default[m][0])
                t_exp = tuned[result.mechanism]
                print(f"{name:<13} {queries:>4} {eps:>5g} {delta:>8g} {seed:>4}  "
                      f"{d_exp[0]:.4f} ({d_exp[1]:.4f})   {best:<10} {default[best][0]:.4f}"
                      f"   {t_exp[0]:.4f} ({t_exp[1]:.4f}) {result.mechanism:<10} "
                      f"{_short(result.settings):<22} {seconds:6.1f}")
                summary.setdefault((name, queries, eps, delta), []).append(
                    (d_exp[0], default[best][0], t_exp[0]))
    print("\nmean over seeds (expected released accuracy on the test part; tuned - default "
          "exp-radius: min / max over seeds)")
    for (name, q, eps, delta), rows in summary.items():
        a = np.asarray(rows)
        diff = a[:, 2] - a[:, 0]
        print(f"{name:<13} B={q} eps={eps:g} delta={delta:g}: default {a[:, 0].mean():.4f}, "
              f"default oracle {a[:, 1].mean():.4f}, tuned {a[:, 2].mean():.4f}; tuned - "
              f"default {diff.min():+.4f} / {diff.max():+.4f}")
    return 0


def load_config_from(raw: dict):
    from agt.config import config_from_dict

    return config_from_dict(raw)


def _short(settings: dict) -> str:
    names = {"learning_rate": "lr", "clip_gamma": "g", "n_epochs": "ep", "k_values": "k"}
    return " ".join(f"{names.get(k, k)}={v}" for k, v in settings.items()) or "template"


if __name__ == "__main__":
    sys.exit(main())
