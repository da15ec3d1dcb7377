"""``agt predict``: privatized labels for a batch of queries, through the ledger.

Order of operations (check, then commit, then release): the mechanism's parameters and the
output path are checked first; then the bundle is read and the queries certified (owner-side
inputs); the check before spending (mechanisms/release_check.py) refuses a release expected
to answer too little, unless --force, and --dry-run prints this release's plan and stops,
both before any ledger is opened; the ledger (bound to the bundle's private dataset and one
relation) checks the whole batch against its budget in one transaction and records it; only
then is noise drawn; the labels are written last. Everything that can fail before the spend
is checked before it; a failure after it (disk full) says that the budget was spent.

The output holds ``index,label`` only (label -1 where a mechanism gave no answer). Radii,
margins and the dataset or bundle hashes are never written or printed by this command: they
are functions of the private data (``agt certify`` gives the owner the radii).
"""

from __future__ import annotations

import csv
from pathlib import Path

from agt.cli.format import (
    add_release_options,
    charge_note,
    guarantee_line,
    ledger_line,
    mechanism_options,
    non_empty,
    positive_float,
    require_out,
    unit_float,
)
from agt.cli.ledgers import SpendGuard, default_ledger_unnamed, open_ledger, write_after_spend
from agt.cli.plan import dry_run_or_check


def add_parser(sub) -> None:
    from mechanisms import MECHANISMS, Certified, mechanism_names

    names = mechanism_names(Certified)
    p = sub.add_parser(
        "predict", help="privatized labels within a ledgered privacy budget (a release)",
        description="Release privatized labels for the queries of --data. Writes index,label "
                    "only; radii are owner-only (use agt certify).")
    p.add_argument("--bounds", required=True, help="bounds bundle (.h5)")
    p.add_argument("--data", required=True, help="npz with the queries (x_<split> or x)")
    p.add_argument("--split", default="test", type=non_empty)
    p.add_argument("--mechanism", required=True, choices=names,
                   help="; ".join(f"{n}: {MECHANISMS[n].summary}" for n in names))
    p.add_argument("--epsilon", required=True, type=positive_float,
                   help="per-query epsilon (svt: of the whole session)")
    p.add_argument("--delta", type=unit_float,
                   help="per-query delta of (eps, delta) mechanisms (svt: of the session)")
    p.add_argument("--budget-epsilon", type=positive_float,
                   help="total epsilon budget (required for a new ledger)")
    p.add_argument("--budget-delta", type=unit_float,
                   help="total delta budget of a new ledger (default 0)")
    add_release_options(p, "output .csv (index,label)",
                        "composition of a new ledger (default standard; best, advanced and "
                        "tight fix the per-query (eps, delta) of this call for the ledger's "
                        "lifetime; rdp composes Renyi curves and needs --budget-delta > 0)",
                        ensembles=False)
    p.set_defaults(func=run)


def run(args) -> int:
    from agt.certify import Certifier
    from agt.data import load_npz_queries
    from agt.io import check_not_an_input, check_output
    from agt.store import read_bundle
    from mechanisms import Certified, default_ledger_path, make_mechanism
    from mechanisms.ledger import hash_query

    require_out(args)
    mechanism = make_mechanism(args.mechanism, args.epsilon, args.delta,
                               **mechanism_options(args))
    if not args.dry_run:
        out = check_output(args.out, suffixes=(".csv",), overwrite=args.overwrite)
        check_not_an_input(out, {"--ledger": args.ledger, "--bounds": args.bounds,
                                 "--data": args.data})
    bundle = read_bundle(args.bounds)
    x, y = load_npz_queries(args.data, split=args.split)
    cert = Certifier(bundle).certify(x, radii=mechanism.uses_radii)
    inputs = Certified.from_certificate(cert, [hash_query(q) for q in x],
                                        with_radii=mechanism.uses_radii)
    mechanism.check(inputs)
    per_query = mechanism.guarantee_for(inputs, args.relation or "replace-one")
    # before any ledger is opened or created: a refusal or a dry run charges nothing
    if dry_run_or_check(args, mechanism, inputs, args.accountant or "standard",
                        len(cert.k_values), y):
        return 0
    default = None if args.ledger else default_ledger_path(inputs.source.dataset_sha256)
    with default_ledger_unnamed(default), SpendGuard() as guard:
        with open_ledger(args.ledger, inputs.source.dataset_sha256, args.budget_epsilon,
                         args.budget_delta, args.accountant, args.relation,
                         (per_query.epsilon, per_query.delta),
                         budget_flags="--budget-epsilon (and --budget-delta)",
                         release=(mechanism, inputs)) as ledger:
            released = ledger.release(mechanism, inputs, insecure_seed=args.insecure_seed)
            guard.spent = True
            summary = ledger_line(ledger, named=bool(args.ledger))

        def write(path: Path) -> None:
            with open(path, "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["index", "label"])
                w.writerows([i, int(v)] for i, v in enumerate(released.labels))

        out = write_after_spend(out, write, args.overwrite)
    answered = int((released.labels >= 0).sum())
    print(guarantee_line(released.n_queries, released.mechanism, released.guarantee,
                         " (INSECURE seeded noise)" if released.seeded else "",
                         released.per_query))
    note = charge_note(released)
    if note:
        print(note)
    if answered < released.n_queries:
        print(f"answered {answered} of {released.n_queries} queries (the rest: no answer, -1)")
    print(summary)
    print(f"wrote {out}")
    return 0
