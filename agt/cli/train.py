"""``agt train``: AGT training of one model or of a T-teacher ensemble (owner command).

    agt train --config FILE [--data FILE.npz] [--k-values SPEC] [--out FILE.h5]
              [--device auto|cpu|cuda] [--threads N] [--quiet]
    agt train --config FILE --ensemble T [--out DIR] [--workers N] [--threads N]
              [--ray-address local|auto|ADDR] ...

``--workers N`` trains the teachers in N local processes, ``--ray-address`` as Ray tasks
(``local``: a private local Ray instance; ``auto`` or ``ray://host:port``: a running
cluster); the bundles are byte-identical to a serial run's. ``--threads N``: intra-op threads
of the single model, or of every teacher (default 1 per teacher); workers x threads must fit
in the machine's cores (agt/threads.py).

Prints the training time, the k grid, the relations certified, and (with a labelled test
split) the nominal test accuracy and certified fractions: owner-only numbers about the
private model, never a privacy-preserving release.
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np

from agt.cli.format import certified_fractions, non_empty, positive_int, summary_ks
from agt.errors import ConfigError


def add_parser(sub) -> None:
    t = sub.add_parser("train", help="train with AGT and write a bounds bundle (HDF5)")
    t.add_argument("--config", required=True, help="YAML config (see configs/)")
    t.add_argument("--data", type=non_empty, help="npz file replacing the config's data section")
    t.add_argument("--k-values", help="k grid, e.g. 0..199 or 0,1,2,5,10")
    t.add_argument("--out", type=non_empty,
                   help="output .h5 (default artifacts/bundles/<config>.h5; a directory with "
                        "--ensemble)")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"))
    t.add_argument("--ensemble", type=positive_int, metavar="T",
                   help="train T >= 1 teachers on disjoint parts of the data (writes a directory)")
    t.add_argument("--workers", type=positive_int, metavar="N",
                   help="with --ensemble: train N teachers at once in local processes "
                        "(or at most N Ray tasks with --ray-address)")
    t.add_argument("--threads", type=positive_int, metavar="N",
                   help="intra-op threads of the model, or of every teacher (default: "
                        "OMP_NUM_THREADS, else all cores for one model, 1 per teacher)")
    t.add_argument("--ray-address", type=non_empty, metavar="ADDR",
                   help="with --ensemble: train the teachers on Ray; 'local' starts a local "
                        "instance, 'auto' or ray://HOST:PORT joins a cluster (needs the "
                        "distributed extra)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out (a bundle, or an ensemble directory)")
    t.add_argument("--scale-from", type=non_empty, metavar="PUBLIC.npz",
                   help="scale the features by the mean and standard deviation of this "
                        "PUBLIC file's x_train (else x); recorded in the bundle and applied "
                        "to every query. Never the private training file")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=run)


def run(args) -> int:
    from agt.config import load_config
    from agt.data import load_dataset
    from agt.io import check_output
    from agt.parallel import plan_execution
    from agt.threads import TEACHER_THREADS, configure_threads

    if args.ensemble and args.scale_from:
        raise ConfigError("--scale-from scales the inputs of one model; ensembles do not "
                          "record an input scale yet: scale the npz files with public "
                          "statistics instead")
    if not args.ensemble and (args.workers or args.ray_address):
        raise ConfigError("--workers and --ray-address train an ensemble's teachers in "
                          "parallel; give --ensemble T")
    # this process: the one model's threads; with --ensemble, --threads is per teacher (checked
    # by plan_execution) and this process keeps the default for certification
    configure_threads(None if args.ensemble else args.threads)
    execution = None
    if args.ensemble:                          # refuse a bad plan before loading any data
        execution = plan_execution(args.ensemble, workers=args.workers, threads=args.threads,
                                   ray_address=args.ray_address, default_threads=TEACHER_THREADS)
    overrides = {}
    if args.data is not None:
        overrides["data"] = {"name": "npz", "path": str(Path(args.data).resolve())}
    if args.k_values is not None:
        overrides["k_values"] = args.k_values
    if args.device:
        overrides["device"] = args.device
    cfg = load_config(args.config, overrides)
    if cfg.data is None:
        raise ConfigError(f"{args.config} has no data section; give --data FILE.npz")
    stem = Path(args.config).stem
    if args.ensemble:
        out = (Path(args.out) if args.out
               else Path("artifacts") / "ensembles" / f"{stem}_T{args.ensemble}")
        if out.suffix == ".h5" or (out.exists() and not out.is_dir()):
            raise ConfigError(f"an ensemble is written as a directory; give --out DIR, not "
                              f"{out.name}")
        if out.is_dir() and any(out.iterdir()) and not args.overwrite:
            raise ConfigError(f"--out {out} exists and is not empty; refusing to replace an "
                              f"ensemble (give a new name, or --overwrite)")
    else:
        # a bundle may stand for hours of training: replaced only when asked to
        out = check_output(Path(args.out) if args.out else
                           Path("artifacts") / "bundles" / f"{stem}.h5", suffixes=(".h5",),
                           overwrite=args.overwrite, what="--out (a bundle)")
    ds = load_dataset(cfg.data.name, cfg.data.options, base_dir=Path(args.config).resolve().parent)
    if args.ensemble:
        return _ensemble(args, cfg, ds, out, execution)
    return _single(args, cfg, ds, out)


def _single(args, cfg, ds, out: Path) -> int:
    from agt.api import check_bundle_fit, train_scaled
    from agt.certify import Certifier
    from agt.scaling import InputScale
    from agt.store import from_result, write_bundle

    scale = InputScale.from_npz(args.scale_from) if args.scale_from else None
    t0 = time.perf_counter()
    with warnings.catch_warnings():             # the data checks' warnings, one line each
        warnings.showwarning = _one_line
        result = train_scaled(cfg, ds, scale, progress=not args.quiet)
        bundle = from_result(result, input_scale=scale)
        check_bundle_fit(bundle, ds)
    write_bundle(bundle, out)
    print(f"trained {ds.name}: n={ds.n_train}, {len(result.k_values)} k values "
          f"({result.k_values[0]}..{result.k_values[-1]}), relations "
          f"{', '.join(result.relations)}; selection {bundle.selection}, bound_method "
          f"{bundle.bound_method}")
    print(f"time: {result.seconds:.2f} s training, {time.perf_counter() - t0:.2f} s total")
    print(f"bundle: {out}")
    if scale is not None:
        print(f"input scale: {scale.source}, recorded in the bundle and applied to queries")
    if ds.x_test is not None and len(ds.x_test):
        cert = Certifier(bundle).certify(ds.x_test)
        if ds.y_test is not None:
            acc = float((cert.prediction == ds.y_test).mean())
            print(f"test accuracy (nominal): {acc:.4f} on {len(ds.x_test)} test records")
        print("certified fraction of the test split (owner-only):")
        print(certified_fractions(cert.certified_fraction(), result.k_values))
    return 0


def _one_line(message, category, *_args, **_kwargs) -> None:
    print(f"agt: warning: {message}", file=sys.stderr)


def _ensemble(args, cfg, ds, out: Path, execution) -> int:
    from agt.ensemble import EnsembleCertifier, train_ensemble, write_ensemble
    from mechanisms.ensemble import aggregate, ensemble_radius

    n_teachers = args.ensemble
    t0 = time.perf_counter()
    ens = train_ensemble(cfg, ds, n_teachers, workers=execution.workers,
                         backend=execution.backend, threads=execution.threads,
                         ray_address=execution.ray_address, progress=not args.quiet)
    wall = time.perf_counter() - t0
    write_ensemble(ens, out)
    secs = ens.training_seconds
    sizes = ens.manifest["partition"]["sizes"]
    ran = ens.manifest["execution"]
    print(f"trained {n_teachers} teachers on {ds.name}: n={ds.n_train} split by record index "
          f"mod {n_teachers} ({min(sizes)}..{max(sizes)} records each), "
          f"{len(ens.k_values)} k values ({ens.k_values[0]}..{ens.k_values[-1]}), "
          f"relations {', '.join(ens.relations)}")
    workers = "" if ran["backend"] == "serial" else \
        f", {ran['workers'] or 'cluster-wide'} worker(s)"
    print(f"execution: {ran['backend']}{workers}, {ran['threads_per_teacher']} thread(s) per "
          f"teacher; {wall:.2f} s wall")
    for r in ran["reruns"]:
        print(f"  teacher {r['teacher']} re-run after attempt {r['attempt']}: {r['reason']}")
    print(f"time: {sum(secs):.2f} s training ({sum(secs) / n_teachers:.3f} s per teacher)")
    print(f"ensemble: {out}")
    if ds.x_test is None or not len(ds.x_test) or ds.y_test is None:
        return 0
    cert = EnsembleCertifier(ens).certify(ds.x_test)
    votes, n_classes = cert.teacher_predictions, cert.n_classes
    answer = aggregate(votes, n_classes)
    teacher_acc = (votes == ds.y_test[:, None]).mean(axis=0)
    print(f"test accuracy (nominal vote): {float((answer == ds.y_test).mean()):.4f}; teachers "
          f"mean {teacher_acc.mean():.4f} (min {teacher_acc.min():.4f}) on {len(ds.x_test)} "
          f"test records")
    radius = ensemble_radius(votes, cert.teacher_radii, "tight", n_classes)
    print(f"ensemble radius (min-cost) on the test split (owner-only): mean {radius.mean():.2f}, "
          f"median {np.median(radius):.0f}; fraction with radius >= r:")
    for r in summary_ks(tuple(range(int(radius.max(initial=0)) + 1)) or (0,)):
        print(f"  r={r:<6d} {float((radius >= r).mean()):.4f}")
    return 0
