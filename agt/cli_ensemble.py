"""``agt train --ensemble T`` and ``agt teacher-labels``: subsample-and-aggregate teachers
and privately labelled public data (AGT Sec. 5.2 and the teacher table of Sec. 6).

teacher-labels, order of operations (check, then commit, then release): load the ensemble (or
one bundle), the public queries and the non-private votes / radii; open the ledger (created
with the total budget if new); calibrate the per-query epsilon for Q = number of public
queries with the ledger's accountant; let the ledger check all Q spends in one transaction;
only then draw the noise; write the labels atomically. A refusal (over budget, bad input)
draws no noise and writes nothing, and the command exits non-zero.

The labels file holds only what was released (labels, -1 where PTR gave no answer) and public
metadata; votes and radii depend on the private data without noise and are never written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from agt.errors import ConfigError, DataError, PrivacyError

if TYPE_CHECKING:
    from mechanisms.guarantee import Guarantee

MECHANISMS = ("gnmax", "ss-laplace", "ss-cauchy", "ptr", "single-gs", "single-ss")
ACCOUNTANTS = ("best", "standard", "advanced", "tight")
LEDGER_SUFFIX = ".ledger.db"


def add_ensemble_commands(sub) -> None:
    p = sub.add_parser("teacher-labels",
                       help="label a public set with a teacher ensemble within a total budget")
    p.add_argument("--ensemble", required=True,
                   help="ensemble directory (agt train --ensemble T); single-* also take a .h5 bundle")
    p.add_argument("--public", required=True, help="npz with the unlabelled public queries "
                   "(x_<split> or x; optional x_test/y_test to evaluate a student)")
    p.add_argument("--split", default="public", help="read x_<split> if present, else x")
    p.add_argument("--mechanism", required=True, choices=MECHANISMS)
    p.add_argument("--epsilon-total", required=True, type=float,
                   help="total epsilon of the ledger (all Q labels together)")
    p.add_argument("--delta-total", required=True, type=float,
                   help="total delta of the ledger (0 allows pure-eps mechanisms with standard "
                        "composition only)")
    p.add_argument("--per-query-delta", type=float,
                   help="delta of each release for ss-laplace, ptr and single-ss with Laplace "
                        "noise (default delta_total / (2 Q); the rest is composition slack)")
    p.add_argument("--noise", choices=("laplace", "cauchy"), default="laplace",
                   help="noise of single-ss (default laplace)")
    p.add_argument("--radius-rule", choices=("thm5.3", "tight"), default="thm5.3",
                   help="ensemble radius of ss-*: AGT Thm 5.3 (default) or +1 per flipped vote, -1")
    p.add_argument("--ptr-distance", choices=("agt", "votes"), default="agt",
                   help="distance tested by ptr: AGT radii (default) or vote flips m - 1 alone")
    p.add_argument("--teacher", type=int, default=0,
                   help="teacher of an ensemble used by single-* (default 0)")
    p.add_argument("--relation", choices=("replace-one", "add-remove"),
                   help="neighbouring relation (must be certified; ensembles: replace-one)")
    p.add_argument("--ledger", help=f"SQLite privacy ledger (default <ensemble>{LEDGER_SUFFIX}); "
                   "created with the total budget if missing")
    p.add_argument("--accountant", choices=ACCOUNTANTS,
                   help="composition of a new ledger (default best; an existing ledger keeps its own)")
    p.add_argument("--seed", type=int, help="seed the noise (experiments only; default: OS entropy)")
    p.add_argument("--out", required=True, help="output labels .npz")
    p.add_argument("--train-student", action="store_true",
                   help="train a plain (non-AGT) student on the released labels and report "
                        "its test accuracy (x_test/y_test of the public file)")
    p.add_argument("--student-config", help="YAML config of the student (default: the teachers')")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="device for certification")
    p.set_defaults(func=cmd_teacher_labels)


# ------------------------------------------------------------------------------------------
# agt train --ensemble T

def train_ensemble_command(args, cfg, ds, out) -> int:
    """``agt train --config FILE --ensemble T [--out DIR]``: train, write, summarise."""
    from agt.cli import _summary_ks
    from agt.ensemble import EnsembleCertifier, train_ensemble, write_ensemble

    n_teachers = args.ensemble
    if getattr(args, "out", None):
        out = Path(args.out)
        if out.suffix == ".h5":
            raise ConfigError(f"an ensemble is written as a directory; give --out DIR, not "
                              f"{out.name}")
    else:
        out = Path("artifacts") / "ensembles" / f"{Path(args.config).stem}_T{n_teachers}"
    ens = train_ensemble(cfg, ds, n_teachers, progress=not args.quiet)
    write_ensemble(ens, out)
    secs = ens.training_seconds
    sizes = ens.manifest["partition"]["sizes"]
    print(f"trained {n_teachers} teachers on {ds.name}: n={ds.n_train} split by record index "
          f"mod {n_teachers} ({min(sizes)}..{max(sizes)} records each), "
          f"{len(ens.k_values)} k values ({ens.k_values[0]}..{ens.k_values[-1]}), "
          f"relations {', '.join(ens.relations)}")
    print(f"time: {sum(secs):.2f} s training ({sum(secs) / n_teachers:.3f} s per teacher)")
    print(f"ensemble: {out}")
    if ds.x_test is None or not len(ds.x_test):
        return 0
    if ens.spec.n_logits > 2:
        from agt.certify import Certifier
        accs = [float((Certifier(b).predict(ds.x_test) == ds.y_test).mean()) for b in ens.bundles]
        print(f"teacher test accuracy (nominal): mean {np.mean(accs):.4f}, min {min(accs):.4f}, "
              f"max {max(accs):.4f}; {ens.spec.n_logits} classes: the ensemble mechanisms "
              f"(votes, radii, teacher-labels) are for binary labels")
        return 0
    cert = EnsembleCertifier(ens).certify(ds.x_test)
    acc = float((cert.prediction == ds.y_test).mean())
    teacher_acc = (cert.teacher_predictions == ds.y_test[:, None]).mean(axis=0)
    print(f"test accuracy (nominal vote): {acc:.4f}; teachers mean {teacher_acc.mean():.4f} "
          f"(min {teacher_acc.min():.4f}) on {len(ds.x_test)} test records")
    print(f"ensemble radius (Thm 5.3) on the test split: mean {cert.radius.mean():.2f}, "
          f"median {np.median(cert.radius):.0f}; fraction with radius >= r:")
    for r in _summary_ks(tuple(range(int(cert.radius.max()) + 1)) or (0,)):
        print(f"  r={r:<6d} {float((cert.radius >= r).mean()):.4f}")
    return 0


# ------------------------------------------------------------------------------------------
# agt teacher-labels

def _load_source(args):
    """(ensemble or None, bundle or None, source path) for the mechanism."""
    from agt.ensemble import is_ensemble_dir, read_ensemble
    from agt.store import read_bundle

    path = Path(args.ensemble)
    single = args.mechanism.startswith("single-")
    if is_ensemble_dir(path) or path.is_dir():
        ens = read_ensemble(path)
        if single:
            if not 0 <= args.teacher < ens.n_teachers:
                raise ConfigError(f"--teacher {args.teacher} is out of range: the ensemble has "
                                  f"{ens.n_teachers} teachers (0..{ens.n_teachers - 1})")
            return ens, ens.bundles[args.teacher], path
        return ens, None, path
    if not single:
        if not path.exists():
            raise ConfigError(f"ensemble not found: {path}")
        raise ConfigError(f"{args.mechanism} needs an ensemble directory (agt train --ensemble T), "
                          f"got the file {path}; single-gs and single-ss take one bundle")
    return None, read_bundle(path), path


def _public_test(path: Path):
    """x_test, y_test of the public file when it carries both, else (None, None)."""
    from agt.data import load_npz_queries

    with np.load(path, allow_pickle=False) as f:
        keys = set(f.files)
    if "x_test" in keys and "y_test" in keys:
        return load_npz_queries(path, split="test")
    return None, None


def _needs_delta(args) -> bool:
    return args.mechanism in ("ss-laplace", "ptr") or \
        (args.mechanism == "single-ss" and args.noise == "laplace")


def _plan(args, q: int, ledger) -> tuple[float, float]:
    """(per-query eps, per-query delta) that fit the ledger's budget for q releases."""
    from mechanisms.accounting import per_query_epsilon

    eps_t, delta_t = ledger.budget_epsilon, ledger.budget_delta
    if _needs_delta(args):
        if delta_t <= 0:
            raise PrivacyError(f"{args.mechanism} is (eps, delta)-DP per query and needs a delta "
                               f"budget: give --delta-total > 0")
        pqd = args.per_query_delta if args.per_query_delta is not None else delta_t / (2.0 * q)
        if not 0 < pqd < 1 or pqd * q > delta_t:
            raise PrivacyError(f"--per-query-delta {pqd!r} times Q = {q} queries must be in "
                               f"(0, delta_total = {delta_t!r}]")
    else:
        if args.per_query_delta is not None:
            raise PrivacyError(f"{args.mechanism} is pure eps-DP per query and takes no "
                               f"--per-query-delta")
        pqd = 0.0
    eps_q = per_query_epsilon(eps_t, delta_t, q, pqd, ledger.accountant.name)
    return eps_q, pqd



@dataclass
class _Inputs:
    """What the release needs, computed without noise before anything is spent."""

    votes: np.ndarray | None = None      # (Q, T) teacher votes
    radii: np.ndarray | None = None      # (Q, T) teacher smooth radii
    pred: np.ndarray | None = None       # (Q,) single model's prediction
    radius: np.ndarray | None = None     # (Q,) single model's smooth radius


def _nonprivate_inputs(mech: str, args, certifier, x) -> _Inputs:
    if mech == "gnmax" or (mech == "ptr" and args.ptr_distance == "votes"):
        return _Inputs(votes=certifier.predict_teachers(x))
    if mech in ("ss-laplace", "ss-cauchy", "ptr"):
        cert = certifier.certify(x)
        return _Inputs(votes=cert.teacher_predictions, radii=cert.teacher_radii)
    if mech == "single-gs":
        return _Inputs(pred=certifier.predict(x))
    cert = certifier.certify(x)
    return _Inputs(pred=cert.prediction, radius=cert.radius)


def _release_plan(args, inp: _Inputs, eps_q: float, delta_q: float, relation: str, rng
                  ) -> tuple[Guarantee, Callable[[], np.ndarray]]:
    """The per-query guarantee (validated now) and the function that draws the noise (called
    by the ledger only after the spend is committed)."""
    from mechanisms import ensemble as me
    from mechanisms.global_sens import global_guarantee, release_global
    from mechanisms.smooth import release_smooth, smooth_guarantee

    mech = args.mechanism
    noise = args.noise if mech == "single-ss" else mech.split("-")[-1]
    dq = delta_q if noise == "laplace" else None
    if mech == "gnmax":
        return (me.gnmax_guarantee(eps_q, relation),
                lambda: me.release_gnmax(inp.votes, eps_q, relation=relation, rng=rng)[0])
    if mech in ("ss-laplace", "ss-cauchy"):
        rule = args.radius_rule
        return (me.ss_ensemble_guarantee(eps_q, dq, noise, relation, rule),
                lambda: me.release_ss_ensemble(inp.votes, inp.radii, eps_q, dq, noise=noise,
                                               relation=relation, rule=rule, rng=rng)[0])
    if mech == "ptr":
        return (me.ptr_guarantee(eps_q, delta_q, relation, inp.radii is not None),
                lambda: me.release_ptr(inp.votes, eps_q, delta_q, relation=relation,
                                       teacher_radii=inp.radii, rng=rng)[0])
    if mech == "single-gs":
        return (global_guarantee(eps_q, relation),
                lambda: release_global(inp.pred, eps_q, relation=relation, rng=rng)[0])
    return (smooth_guarantee(eps_q, dq, noise, relation),
            lambda: release_smooth(inp.pred, inp.radius, eps_q, dq, noise=noise,
                                   relation=relation, rng=rng)[0])


def cmd_teacher_labels(args) -> int:
    from agt.certify import Certifier
    from agt.cli import _write_atomic
    from agt.cli_private import choose_relation
    from agt.data import load_npz_queries
    from agt.ensemble import EnsembleCertifier
    from mechanisms import ensemble as me
    from mechanisms.ledger import Ledger, Spend, hash_query
    from mechanisms.noise import make_generator

    out = Path(args.out)
    if out.suffix != ".npz":
        raise ConfigError(f"--out must end in .npz, got {out.name}")
    if args.student_config and not args.train_student:
        raise ConfigError("--student-config needs --train-student")
    ens, bundle, source = _load_source(args)
    mech = args.mechanism
    x, y_public = load_npz_queries(args.public, split=args.split)
    public_test = _public_test(Path(args.public)) if args.train_student else (None, None)
    q = len(x)

    # -- non-private inputs of the release (votes, radii); nothing is released yet ----------
    spec = bundle.spec if bundle is not None else ens.spec
    if spec.n_logits > 2:
        raise DataError(f"the teacher-label mechanisms are for binary labels; the "
                        f"{'model' if ens is None else 'ensemble'} has {spec.n_logits} classes")
    # a teacher of an ensemble is a function of the whole dataset through the partition, so
    # it gets the ensemble's relation, not the one its own bundle certifies on its part
    relation = choose_relation(ens.relations if ens is not None else bundle.relations,
                               args.relation)
    if bundle is not None:
        certifier = Certifier(bundle, device=args.device)
        source_id, n_teachers = bundle.bundle_id, 1
    else:
        certifier = EnsembleCertifier(ens, device=args.device)
        source_id, n_teachers = ens.ensemble_id, ens.n_teachers
    inputs = _nonprivate_inputs(mech, args, certifier, x)

    ledger_path = Path(args.ledger) if args.ledger else Path(str(source).rstrip("/") + LEDGER_SUFFIX)
    rng = make_generator(args.seed)
    with Ledger.open(ledger_path, args.epsilon_total, args.delta_total, args.accountant) as ledger:
        eps_q, delta_q = _plan(args, q, ledger)
        guarantee, release = _release_plan(args, inputs, eps_q, delta_q, relation, rng)
        hashes = [hash_query(x[i]) for i in range(q)]
        spends = [Spend.from_guarantee(guarantee, source_id, h) for h in hashes]
        labels = ledger.spend(spends, release)
        spent = ledger.spent()
        accountant = ledger.accountant.name
        budget = (ledger.budget_epsilon, ledger.budget_delta)

    answered = labels >= 0
    arrays = {
        "labels": labels.astype(np.int64), "answered": answered,
        "query_index": np.arange(q, dtype=np.int64), "query_hash": np.asarray(hashes),
        "mechanism": np.asarray(mech), "ledger_mechanism": np.asarray(guarantee.mechanism),
        "epsilon_per_query": np.float64(guarantee.epsilon),
        "delta_per_query": np.float64(guarantee.delta),
        "epsilon_total": np.float64(budget[0]), "delta_total": np.float64(budget[1]),
        "accountant": np.asarray(accountant), "relation": np.asarray(relation),
        "n_queries": np.int64(q), "n_teachers": np.int64(n_teachers),
        "source": np.asarray(str(source)), "source_id": np.asarray(source_id),
        "public": np.asarray(str(args.public)), "split": np.asarray(args.split),
        "ledger": np.asarray(str(ledger_path)), "guarantee": np.asarray(guarantee.note),
        "seeded": np.bool_(args.seed is not None),
    }
    if mech in ("ss-laplace", "ss-cauchy"):
        arrays["radius_rule"] = np.asarray(args.radius_rule)
    if mech == "ptr":
        arrays["ptr_distance"] = np.asarray(args.ptr_distance)
        arrays["ptr_threshold"] = np.float64(me.ptr_threshold(eps_q, delta_q))

    def write(path):
        with open(path, "wb") as fh:
            np.savez(fh, **arrays)

    _write_atomic(out, write)
    print(f"released {q} labels with {mech} ({guarantee.mechanism}) from {n_teachers} "
          f"teacher(s): each ({guarantee.epsilon:.6g}, {guarantee.delta:.3g})-DP w.r.t. {relation}")
    print(f"ledger {ledger_path}: spent eps={spent.epsilon:.6g}, delta={spent.delta:.3g} "
          f"({spent.method}) of the budget ({budget[0]:.6g}, {budget[1]:.3g})")
    if mech == "ptr":
        print(f"answered {int(answered.sum())} of {q} queries (the rest: no answer, label -1)")
    if y_public is not None and answered.any():
        agree = float((labels[answered] == y_public[answered]).mean())
        print(f"label accuracy on the answered public queries: {agree:.4f}")
    print(f"wrote {out}")
    if args.train_student:
        _student(args, ens, bundle, x, labels, public_test)
    return 0


# ------------------------------------------------------------------------------------------
# Student

def _student_config(args, ens, bundle):
    from agt.config import config_from_dict, load_config

    if args.student_config:
        cfg = load_config(args.student_config)
    else:
        cfg = config_from_dict(ens.config if ens is not None else bundle.config)
    return cfg.replace(k_values=[0])


def train_student(cfg, x: np.ndarray, labels: np.ndarray, x_test=None, y_test=None
                  ) -> tuple[float | None, int]:
    """Train a plain nominal student (no bounds) on the answered public queries; return its
    test accuracy (None without a labelled test set) and the number of training labels."""
    import torch

    from agt.data import Dataset
    from agt.training import train

    keep = labels >= 0
    if not keep.any():
        raise DataError("no public query was answered (all labels are -1): nothing to train a "
                        "student on")
    n_classes = 2
    ds = Dataset("student", np.ascontiguousarray(x[keep], dtype=np.float64),
                 np.ascontiguousarray(labels[keep], dtype=np.int64),
                 None if x_test is None else np.ascontiguousarray(x_test, dtype=np.float64),
                 None if y_test is None else np.ascontiguousarray(y_test, dtype=np.int64),
                 n_classes)
    result = train(cfg, ds, with_bounds=False)
    if x_test is None or y_test is None:
        return None, int(keep.sum())
    dtype = {"float32": torch.float32, "float64": torch.float64}[cfg.dtype]
    model = result.spec.build(dtype)
    model.load_state_dict({k: v.detach().cpu() for k, v in result.nominal.items()})
    with torch.no_grad():
        z = model(torch.as_tensor(x_test, dtype=dtype))
    pred = (z[:, 0] > 0).long() if z.shape[1] == 1 else z.argmax(dim=1)
    return float((pred.numpy() == y_test).mean()), int(keep.sum())


def _student(args, ens, bundle, x, labels, public_test) -> None:
    if not (labels >= 0).any():
        print("student: no public query was answered (all labels are -1); no student trained")
        return
    cfg = _student_config(args, ens, bundle)
    x_test, y_test = public_test
    acc, n_used = train_student(cfg, x, labels, x_test, y_test)
    if acc is None:
        print(f"student trained on {n_used} labels; the public file has no x_test/y_test, so "
              f"no test accuracy")
    else:
        print(f"student (plain training, {n_used} labels): test accuracy {acc:.4f} on "
              f"{len(y_test)} records")
