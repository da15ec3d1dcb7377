"""``agt plan``: what each mechanism would cost and return for B queries, before spending.

Reads a bundle (or an ensemble) and a query file, certifies the queries (owner-side) and
prints `mechanisms.release_plan.plan_release`: per mechanism and accountant, the per-query
guarantee within the total budget and the expected answered fraction, agreement with the
served model and accuracy against the file's labels, with a recommendation. Nothing is
charged and no ledger is opened. The output is OWNER-ONLY (a function of the radii): it says
so, and docs/privacy.md says how to plan without a data-dependent choice.

`dry_run_or_check` is the release commands' side of the same library: ``--dry-run`` prints
the plan of that one release; otherwise the check before spending
(`mechanisms.release_check.check_release`) refuses, before any ledger is opened, a release
expected to answer too little, unless ``--force``.
"""

from __future__ import annotations

import json

from agt.cli.format import (
    OWNER_ONLY_NOTE,
    fraction,
    non_empty,
    plan_table,
    plan_text,
    positive_float,
    positive_int,
    unit_float,
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan", help="owner-only: expected cost and return of every mechanism before spending",
        description="Plan a release of B queries within a total (epsilon, delta): per "
                    "mechanism and accountant, the per-query guarantee and the expected "
                    "answered fraction, agreement and accuracy (exact laws), and a "
                    "recommendation. Charges nothing. OWNER-ONLY output: it is a function of "
                    "the radii.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--bounds", help="bounds bundle (.h5): plan single-model mechanisms")
    src.add_argument("--ensemble", help="ensemble directory: plan ensemble mechanisms")
    p.add_argument("--data", required=True,
                   help="npz with the queries (x_<split> or x; y_<split> or y for accuracy)")
    p.add_argument("--split", default="test", type=non_empty)
    p.add_argument("--relation", choices=("replace-one", "add-remove"), default="replace-one",
                   help="neighbouring relation of the ledger (default replace-one)")
    p.add_argument("--epsilon-total", required=True, type=positive_float,
                   help="total epsilon of the release (all B queries)")
    p.add_argument("--delta-total", type=unit_float, default=0.0,
                   help="total delta (default 0: pure eps-DP mechanisms only)")
    p.add_argument("--queries", type=positive_int, metavar="B",
                   help="queries the budget must cover (default: the queries in --data)")
    p.add_argument("--accountant", action="append",
                   choices=("standard", "advanced", "best", "tight", "rdp"),
                   help="plan only with this accountant (repeatable; default all)")
    p.add_argument("--cutoff", type=positive_int,
                   help="svt / ens-svt: unstable queries a session answers (default 10)")
    p.add_argument("--fallback", choices=("exp-radius", "refuse"),
                   help="svt / ens-svt: the answer of an unstable query (default exp-radius)")
    p.add_argument("--min-answered", type=fraction, default=0.05, metavar="F",
                   help="mark (and do not recommend) the releases the check before spending "
                        "refuses at this least expected answered fraction (default 0.05)")
    p.add_argument("--json", action="store_true",
                   help='print {"rows": [...], "recommended": name} (null where a value does '
                        'not apply)')
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                   help="device for certification")
    p.set_defaults(func=run)


def certified_inputs(bounds: str | None, ensemble: str | None, x, device: str = "cpu"):
    """(inputs, length of the k grid): the owner-side inputs of queries x, with radii.

    Args:
        bounds: a bundle path (single-model inputs), or None.
        ensemble: an ensemble directory (ensemble inputs), or None.
        x: the queries.
        device: certification device.

    Returns:
        (`mechanisms.Certified` or `mechanisms.Votes`, number of k values).
    """
    from agt.tensors import resolve_device
    from mechanisms import Certified, Votes
    from mechanisms.ledger import hash_query

    ids = [hash_query(q) for q in x]
    if ensemble is not None:
        from agt.ensemble import EnsembleCertifier, read_ensemble

        ens = read_ensemble(ensemble)
        cert = EnsembleCertifier(ens, device=resolve_device(device)).certify(x)
        return Votes.from_certificate(cert, ids), len(ens.k_values)
    from agt.certify import Certifier
    from agt.store import read_bundle

    cert = Certifier(read_bundle(bounds), device=resolve_device(device)).certify(x)
    return Certified.from_certificate(cert, ids), len(cert.k_values)


def run(args) -> int:
    from agt.data import load_npz_queries
    from mechanisms.release_plan import PLAN_ACCOUNTANTS, plan_release

    x, y = load_npz_queries(args.data, split=args.split)
    inputs, n_k_values = certified_inputs(args.bounds, args.ensemble, x, args.device)
    gate = {k: v for k, v in (("cutoff", args.cutoff), ("fallback", args.fallback))
            if v is not None}
    plan = plan_release(inputs, args.queries or len(x), args.epsilon_total, args.delta_total,
                        args.relation, y,
                        accountants=tuple(dict.fromkeys(args.accountant or PLAN_ACCOUNTANTS)),
                        options={"svt": gate, "ens-svt": gate}, n_k_values=n_k_values,
                        min_answered=args.min_answered)
    if args.json:
        print(json.dumps(plan.to_json()))
    else:
        print(plan_text(plan))
    return 0


def dry_run_or_check(args, mechanism, inputs, accountant: str, n_k_values: int,
                     labels=None) -> bool:
    """The owner's check of one release, before any ledger is opened.

    Args:
        args: parsed flags with dry_run, min_answered and force.
        mechanism: the mechanism at the parameters to be charged.
        inputs: its owner-only inputs.
        accountant: the ledger's accountant (printed with a dry run).
        n_k_values: the length of the k grid behind the radii.
        labels: optional labels of the queries, for the expected accuracy.

    Returns:
        True after a dry run (the plan was printed; the caller stops, charging nothing),
        False when the release may go ahead.

    Raises:
        ReleaseRefusedError: (not a dry run, no --force) the check refused the release.
    """
    from agt.errors import ReleaseRefusedError
    from mechanisms.release_check import check_release
    from mechanisms.release_plan import PlanRow

    if not args.dry_run:
        check_release(mechanism, inputs, n_k_values=n_k_values,
                      min_answered=args.min_answered, force=args.force)
        return False
    expectation = check_release(mechanism, inputs, n_k_values=n_k_values, force=True,
                                labels=labels)
    g = mechanism.guarantee_for(inputs, args.relation or "replace-one")
    row = PlanRow(mechanism.name, accountant, g.epsilon, g.delta, mechanism.per_query,
                  expectation, mechanism)
    print(OWNER_ONLY_NOTE)
    print(f"dry run: the plan of this release of {inputs.n_queries} queries (nothing charged, "
          f"no ledger opened)")
    print(plan_table([row]))
    try:
        check_release(mechanism, inputs, n_k_values=n_k_values, min_answered=args.min_answered)
        print("the check before spending passes")
    except ReleaseRefusedError as exc:
        print(f"without --force this release would be {str(exc)}")
    return True
