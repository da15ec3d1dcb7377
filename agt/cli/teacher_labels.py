"""``agt teacher-labels``: privately label a public set within a total budget (a release).

Order of operations (check, then commit, then release): the output path and the student
config are checked first; the ensemble (or one bundle) and the public queries are read and the
owner-side inputs computed (votes, radii); the per-query guarantee is planned for the Q
queries (a new ledger fixes it for accountants other than standard; a standard ledger plans
from what is left); the check before spending refuses a release expected to answer too
little (unless --force) and --dry-run prints the plan and stops, both before a new ledger
file is created; the ledger records all Q spends in one transaction; only then is noise
drawn; the labels file is written last. A refusal draws no noise and writes nothing.

The labels file holds only what was released (labels, -1 where a mechanism gave no answer)
and public metadata (the guarantee, the budget, the file names). Votes, radii and the hashes
of the private data or of the models are owner-only and never written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agt.cli.format import (
    add_release_options,
    charge_note,
    guarantee_line,
    ledger_line,
    mechanism_options,
    non_empty,
    non_negative_int,
    positive_float,
    require_out,
    unit_float,
)
from agt.cli.ledgers import (
    SpendGuard,
    default_ledger_unnamed,
    is_new_ledger,
    open_ledger,
    write_after_spend,
)
from agt.cli.plan import dry_run_or_check
from agt.errors import ConfigError, PrivacyError


def add_parser(sub) -> None:
    from mechanisms import MECHANISMS, Certified, Votes, mechanism_names

    # the convex baselines' inputs (a fitted linear model, a perturbed objective) do not
    # come from bundles: they are released through the library (agt.baselines)
    names = mechanism_names(Certified) + mechanism_names(Votes)
    p = sub.add_parser("teacher-labels",
                       help="label a public set with teachers within a total budget (a release)")
    p.add_argument("--ensemble", required=True,
                   help="ensemble directory (agt train --ensemble T); single-model mechanisms "
                        "also take a .h5 bundle")
    p.add_argument("--public", required=True, help="npz with the unlabelled public queries "
                   "(x_<split> or x; optional x_test/y_test to evaluate a student)")
    p.add_argument("--split", default="public", type=non_empty,
                   help="read x_<split> if present, else x")
    p.add_argument("--mechanism", required=True, choices=names,
                   help="; ".join(f"{n}: {MECHANISMS[n].summary}" for n in names))
    p.add_argument("--epsilon-total", required=True, type=positive_float,
                   help="total epsilon of the ledger (all Q labels together); an existing "
                        "ledger's must match, and these labels then spend everything it has "
                        "left")
    p.add_argument("--delta-total", required=True, type=unit_float,
                   help="total delta of the ledger (0 allows pure-eps mechanisms only)")
    p.add_argument("--per-query-delta", type=unit_float,
                   help="delta of each release of an (eps, delta) mechanism (default "
                        "delta_total / (2 Q); the rest is composition slack)")
    p.add_argument("--teacher", type=non_negative_int,
                   help="teacher of an ensemble used by single-model mechanisms (default 0)")
    add_release_options(p, "output labels .npz",
                        "composition of a new ledger (default best, with this plan's per-query "
                        "guarantee fixed; rdp: Renyi curves, the sigmas of gnmax and "
                        "confident-gnmax planned from the total); an existing ledger keeps its "
                        "own", ensembles=True)
    p.add_argument("--train-student", action="store_true",
                   help="train a plain (non-AGT) student on the released labels and report "
                        "its test accuracy (x_test/y_test of the public file)")
    p.add_argument("--student-config", help="YAML config of the student (default: the teachers')")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                   help="device for certification")
    p.set_defaults(func=run)


def _load_source(args, ensemble_mechanism: bool):
    """(ensemble or None, bundle or None, path)."""
    from agt.ensemble import is_ensemble_dir, read_ensemble
    from agt.store import read_bundle

    path = Path(args.ensemble)
    if ensemble_mechanism and args.teacher is not None:
        raise ConfigError(f"--teacher applies to single-model mechanisms; {args.mechanism} "
                          f"uses every teacher")
    teacher = 0 if args.teacher is None else args.teacher
    if is_ensemble_dir(path) or path.is_dir():
        ens = read_ensemble(path)
        if ensemble_mechanism:
            return ens, None, path
        if not 0 <= teacher < ens.n_teachers:
            raise ConfigError(f"--teacher {teacher} is out of range: the ensemble has "
                              f"{ens.n_teachers} teachers (0..{ens.n_teachers - 1})")
        return ens, ens.bundles[teacher], path
    if ensemble_mechanism:
        if not path.exists():
            raise ConfigError(f"ensemble not found: {path}")
        raise ConfigError(f"{args.mechanism} needs an ensemble directory (agt train --ensemble "
                          f"T), got the file {path}; single-model mechanisms take one bundle")
    return None, read_bundle(path), path


def _public_test(path: Path):
    """x_test, y_test of the public file when it carries both, else (None, None)."""
    from agt.data import load_npz_queries

    with np.load(path, allow_pickle=False) as f:
        keys = set(f.files)
    if "x_test" in keys and "y_test" in keys:
        return load_npz_queries(path, split="test")
    return None, None


def _student_config(args, config: dict):
    from agt.config import config_from_dict, load_config

    cfg = load_config(args.student_config) if args.student_config else config_from_dict(config)
    return cfg.replace(k_values=[0])


def run(args) -> int:
    from agt.certify import Certifier
    from agt.data import load_npz_queries
    from agt.ensemble import EnsembleCertifier
    from agt.io import check_not_an_input, check_output
    from agt.tensors import resolve_device
    from mechanisms import MECHANISMS, Certified, Ledger, Votes, default_ledger_path, make_mechanism
    from mechanisms.accounting import plan_queries
    from mechanisms.ledger import hash_query, is_url
    from mechanisms.rdp_plan import plan_renyi

    require_out(args)
    if not args.dry_run:
        out = check_output(args.out, suffixes=(".npz",), overwrite=args.overwrite)
        check_not_an_input(out, {"--ledger": args.ledger, "--ensemble": args.ensemble,
                                 "--public": args.public,
                                 "--student-config": args.student_config})
    if args.student_config and not args.train_student:
        raise ConfigError("--student-config needs --train-student")
    entry = MECHANISMS[args.mechanism]
    ens, bundle, source = _load_source(args, entry.inputs is Votes)
    student_cfg = None
    if args.train_student:   # validated before anything is spent
        student_cfg = _student_config(args, (ens.config if bundle is None else bundle.config))
    x, y_public = load_npz_queries(args.public, split=args.split)
    if student_cfg is not None:      # its shapes and classes, before anything is spent
        from agt.student import check_student
        check_student(student_cfg, x.shape[1:], (ens.spec if bundle is None else bundle.spec
                                                 ).n_classes)
    public_test = _public_test(Path(args.public)) if args.train_student else (None, None)
    q = len(x)
    ids = [hash_query(row) for row in x]
    options = mechanism_options(args)
    probe = make_mechanism(args.mechanism, 1.0, 0.5 if entry.needs_delta else None, **options)
    if bundle is None:
        certifier = EnsembleCertifier(ens, device=resolve_device(args.device))
        cert = certifier.certify(x, radii=probe.uses_radii)
        inputs = Votes.from_certificate(cert, ids, with_radii=probe.uses_radii)
        n_teachers = ens.n_teachers
    else:
        cert = Certifier(bundle, device=resolve_device(args.device)).certify(
            x, radii=probe.uses_radii)
        inputs = Certified.from_certificate(cert, ids, with_radii=probe.uses_radii)
        n_teachers = 1
    dataset = inputs.source.dataset_sha256

    path = (args.ledger if is_url(args.ledger) else Path(args.ledger)) if args.ledger else \
        default_ledger_path(dataset)
    with default_ledger_unnamed(None if args.ledger else path):
        if is_new_ledger(path):
            accountant = args.accountant or ("best" if probe.per_query else "standard")
            if accountant == "rdp":
                _no_per_query_delta(args)
                mechanism = plan_renyi(args.mechanism, args.epsilon_total, args.delta_total,
                                       q, **options)
            else:
                eps_q, delta_q = plan_queries(args.epsilon_total, args.delta_total, q,
                                              entry.needs_delta, accountant,
                                              args.per_query_delta,
                                              session=not probe.per_query)
                mechanism = make_mechanism(args.mechanism, eps_q,
                                           delta_q if entry.needs_delta else None, **options)
            g = mechanism.guarantee_for(inputs, args.relation or "replace-one")
            # before the ledger file is created: a refusal or a dry run leaves none
            if dry_run_or_check(args, mechanism, inputs, accountant, len(cert.k_values),
                                y_public):
                return 0
            ledger = open_ledger(args.ledger, dataset, args.epsilon_total, args.delta_total,
                                 accountant, args.relation, (g.epsilon, g.delta),
                                 "--epsilon-total and --delta-total", release=(mechanism, inputs))
        else:
            ledger = Ledger.open(path, args.epsilon_total, args.delta_total, args.accountant,
                                 relation=args.relation, dataset_sha256=dataset)
            try:
                mechanism = _mechanism_for(ledger, args, entry, q, options, not probe.per_query)
                stop = dry_run_or_check(args, mechanism, inputs, ledger.accountant_name,
                                        len(cert.k_values), y_public)
            except BaseException:
                ledger.close()
                raise
            if stop:
                ledger.close()
                return 0
        with SpendGuard() as guard:
            with ledger:
                released = ledger.release(mechanism, inputs, insecure_seed=args.insecure_seed)
                guard.spent = True
                summary = ledger_line(ledger, named=bool(args.ledger))
                accountant = ledger.accountant_name
                budget = (ledger.budget_epsilon, ledger.budget_delta)
            labels = released.labels
            g = released.guarantee
            arrays = {
                "labels": labels.astype(np.int64), "answered": labels >= 0,
                "query_index": np.arange(q, dtype=np.int64),
                "mechanism": np.asarray(released.mechanism),
                "epsilon_per_query": np.float64(g.epsilon),
                "delta_per_query": np.float64(g.delta),
                "relation": np.asarray(g.relation), "guarantee": np.asarray(g.note),
                "epsilon_total": np.float64(budget[0]), "delta_total": np.float64(budget[1]),
                "accountant": np.asarray(accountant), "n_queries": np.int64(q),
                "n_teachers": np.int64(n_teachers), "public": np.asarray(str(args.public)),
                "split": np.asarray(args.split), "seeded": np.bool_(released.seeded),
                "guarantee_per_query": np.bool_(released.per_query),
            }
            # the seed stays in the ledger (owner-side): whoever knows it can remove the noise

            def write(p: Path) -> None:
                with open(p, "wb") as fh:
                    np.savez(fh, **arrays)

            out = write_after_spend(out, write, args.overwrite)
    print(guarantee_line(q, released.mechanism, g, f" from {n_teachers} teacher(s)"
                         + (" (INSECURE seeded noise)" if released.seeded else ""),
                         released.per_query))
    note = charge_note(released)
    if note:
        print(note)
    print(summary)
    answered = labels >= 0
    if not answered.all():
        print(f"answered {int(answered.sum())} of {q} queries (the rest: no answer, label -1)")
    if y_public is not None and answered.any():
        agree = float((labels[answered] == y_public[answered]).mean())
        print(f"label accuracy on the answered public queries: {agree:.4f}")
    print(f"wrote {out}")
    if student_cfg is not None:
        _student(student_cfg, x, labels, public_test, inputs.n_classes)
    return 0


def _mechanism_for(ledger, args, entry, q: int, options: dict, session: bool):
    """The mechanism at the per-query guarantee an existing ledger allows for q releases."""
    from mechanisms import make_mechanism
    from mechanisms.accounting import plan_queries
    from mechanisms.rdp_plan import plan_renyi

    if ledger.is_rdp:
        _no_per_query_delta(args)
        return plan_renyi(args.mechanism, ledger.budget_epsilon, ledger.budget_delta, q,
                          spent=ledger.spent_curve(), **options)
    if ledger.per_query is not None:
        eps_q, delta_q = ledger.per_query
        if entry.needs_delta and delta_q <= 0:
            raise PrivacyError(f"{args.mechanism} is (eps, delta)-DP per query, but the ledger "
                               f"fixes a pure eps-DP per-query guarantee; use a pure mechanism")
        if args.per_query_delta is not None and args.per_query_delta != delta_q:
            raise PrivacyError(f"the ledger fixes the per-query delta at {delta_q!r}")
    else:
        eps_q, delta_q = plan_queries(ledger.budget_epsilon, ledger.budget_delta, q,
                                      entry.needs_delta, "standard", args.per_query_delta,
                                      spent=ledger._recorded_groups(), session=session)
    return make_mechanism(args.mechanism, eps_q, delta_q if entry.needs_delta else None,
                          **options)


def _no_per_query_delta(args) -> None:
    if args.per_query_delta is not None:
        raise ConfigError("--per-query-delta does not apply to an rdp ledger (it plans Renyi "
                          "curves, whose delta is the total's); leave it out")


def _student(cfg, x, labels, public_test, n_classes: int) -> None:
    from agt.student import train_student

    if not (labels >= 0).any():
        print("student: no public query was answered (all labels are -1); no student trained")
        return
    x_test, y_test = public_test
    acc, n_used = train_student(cfg, x, labels, x_test, y_test, n_classes)
    if acc is None:
        print(f"student trained on {n_used} labels; the public file has no x_test/y_test, so "
              f"no test accuracy")
    else:
        print(f"student (plain training, {n_used} labels): test accuracy {acc:.4f} on "
              f"{len(y_test)} records")
