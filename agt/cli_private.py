"""``agt predict``: privatized labels for a batch of queries, within a ledgered budget.

Order of operations (check, then commit, then release): read the bundle and the queries,
certify (smooth radii), build one ledger entry per query, and let the ledger check the
whole batch against the remaining budget in one transaction. Only after the spend is
recorded is any noise drawn; the labels are then written. A refusal draws no noise and
writes nothing.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from agt.errors import ConfigError

MECHANISMS = ("gs", "ss-laplace", "ss-cauchy")


def add_private_commands(sub) -> None:
    p = sub.add_parser("predict", help="privatized predictions within a ledgered privacy budget")
    p.add_argument("--bounds", required=True, help="bounds bundle (.h5)")
    p.add_argument("--data", required=True, help="npz with the queries (x_<split> or x)")
    p.add_argument("--split", default="test")
    p.add_argument("--mechanism", required=True, choices=MECHANISMS)
    p.add_argument("--epsilon", required=True, type=float, help="per-query epsilon")
    p.add_argument("--delta", type=float, help="per-query delta (ss-laplace only)")
    p.add_argument("--ledger", required=True, help="SQLite privacy ledger (created if missing)")
    p.add_argument("--budget-epsilon", type=float, help="total epsilon budget (required for a new ledger)")
    p.add_argument("--budget-delta", type=float, help="total delta budget (default 0 for a new ledger)")
    p.add_argument("--accountant", choices=("best", "standard", "advanced", "tight"),
                   help="composition used by a new ledger (default best)")
    p.add_argument("--relation", choices=("replace-one", "add-remove"),
                   help="neighbouring relation of the guarantee (must be certified by the bundle)")
    p.add_argument("--seed", type=int, help="seed the noise (experiments only; default: OS entropy)")
    p.add_argument("--out", required=True, help="output .csv")
    p.set_defaults(func=cmd_predict)


def choose_relation(bundle_relations, requested: str | None) -> str:
    if requested is not None:
        if requested not in bundle_relations:
            raise ConfigError(f"the bundle certifies {', '.join(bundle_relations)}, not {requested}")
        return requested
    return "add-remove" if "add-remove" in bundle_relations else bundle_relations[0]


def cmd_predict(args) -> int:
    from agt.certify import Certifier
    from agt.data import load_npz_queries
    from agt.store import read_bundle
    from mechanisms.global_sens import global_guarantee, release_global
    from mechanisms.ledger import Ledger, Spend, hash_query
    from mechanisms.noise import make_generator
    from mechanisms.smooth import release_smooth, smooth_guarantee

    out = Path(args.out)
    if out.suffix != ".csv":
        raise ConfigError(f"--out must end in .csv, got {out.name}")
    bundle = read_bundle(args.bounds)
    x, _ = load_npz_queries(args.data, split=args.split)
    certifier = Certifier(bundle)
    bundle.spec.require_binary(f"bundle {bundle.path}")
    relation = choose_relation(bundle.relations, args.relation)
    if args.mechanism == "gs":
        cert = None
        pred = certifier.predict(x)
    else:
        cert = certifier.certify(x)
        pred = cert.prediction
    noise = args.mechanism.split("-")[-1]
    delta = args.delta if args.mechanism == "ss-laplace" else None
    if args.mechanism != "ss-laplace" and args.delta is not None:
        raise ConfigError(f"--delta applies to ss-laplace only; {args.mechanism} is pure eps-DP")

    rng = make_generator(args.seed)

    def release():
        if cert is None:
            return release_global(pred, args.epsilon, relation=relation, rng=rng)
        return release_smooth(pred, cert.radius, args.epsilon, delta, noise=noise,
                              relation=relation, rng=rng)

    # the guarantee validates the privacy parameters before the ledger is touched
    guarantee = (global_guarantee(args.epsilon, relation) if cert is None
                 else smooth_guarantee(args.epsilon, delta, noise, relation))
    spends = [Spend.from_guarantee(guarantee, bundle.bundle_id, hash_query(x[i]))
              for i in range(len(x))]
    budget_delta = args.budget_delta
    if budget_delta is None and args.budget_epsilon is not None and not Path(args.ledger).exists():
        budget_delta = 0.0          # a new ledger without a delta budget: pure eps-DP only
    with Ledger.open(args.ledger, args.budget_epsilon, budget_delta, args.accountant) as ledger:
        labels, guarantee = ledger.spend(spends, release)
        spent = ledger.spent()

    def write(path):
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            header = ["index", "label"] + (["smooth_radius"] if cert is not None else [])
            w.writerow(header)
            for i in range(len(labels)):
                row = [i, int(labels[i])] + ([int(cert.radius[i])] if cert is not None else [])
                w.writerow(row)

    from agt.cli import _write_atomic
    _write_atomic(out, write)
    print(f"released {len(labels)} labels with {args.mechanism}: each ({guarantee.epsilon}, "
          f"{guarantee.delta})-DP w.r.t. {relation}")
    print(f"ledger {args.ledger}: spent eps={spent.epsilon:.6g}, delta={spent.delta:.3g} "
          f"({spent.method}) of the budget")
    if cert is not None:
        print(f"mean smooth radius {float(np.mean(cert.radius)) if len(x) else 0.0:.2f}")
    print(f"wrote {out}")
    return 0
