"""Command line: ``agt train | certify | inspect`` (and the commands of agt/cli_*.py).

Every user error is an `AGTError`: printed as one line ``agt: error: ...`` on stderr with
exit status 2, and no partial output file is left behind.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

from agt.errors import AGTError, ConfigError

EXIT_USAGE = 2


def _summary_ks(k_values, limit: int = 12) -> list[int]:
    if len(k_values) <= limit:
        return list(k_values)
    picks = {k_values[0], k_values[-1]}
    for target in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000):
        candidates = [k for k in k_values if k <= target]
        if candidates:
            picks.add(candidates[-1])
    return sorted(picks)


def _write_atomic(path: Path, writer) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    try:
        writer(tmp)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------------
def cmd_train(args) -> int:
    from agt.certify import Certifier
    from agt.config import load_config, parse_k_values
    from agt.data import load_dataset
    from agt.store import from_result, write_bundle
    from agt.training import train

    overrides = {}
    if args.data:
        overrides["data"] = {"name": "npz", "path": str(Path(args.data).resolve())}
    if args.k_values:
        overrides["k_values"] = list(parse_k_values(args.k_values))
    if args.device:
        overrides["device"] = args.device
    cfg = load_config(args.config, overrides)
    base = Path(args.config).resolve().parent
    ds = load_dataset(cfg.data.name, cfg.data.options, base_dir=base)
    out = Path(args.out) if args.out else Path("artifacts") / "bundles" / f"{Path(args.config).stem}.h5"
    if args.ensemble:
        from agt.cli_ensemble import train_ensemble_command
        return train_ensemble_command(args, cfg, ds, out)
    t0 = time.perf_counter()
    result = train(cfg, ds, progress=not args.quiet)
    bundle = from_result(result)
    write_bundle(bundle, out)
    print(f"trained {ds.name}: n={ds.n_train}, {len(result.k_values)} k values "
          f"({result.k_values[0]}..{result.k_values[-1]}), relations {', '.join(result.relations)}")
    print(f"time: {result.seconds:.2f} s training, {time.perf_counter() - t0:.2f} s total")
    print(f"bundle: {out}")
    if ds.x_test is not None and len(ds.x_test):
        cert = Certifier(bundle).certify(ds.x_test)
        acc = float((cert.prediction == ds.y_test).mean())
        frac = cert.certified_fraction()
        print(f"test accuracy (nominal): {acc:.4f} on {len(ds.x_test)} test records")
        print("certified fraction of the test split:")
        for k in _summary_ks(result.k_values):
            print(f"  k={k:<6d} {frac[k]:.4f}")
    return 0


def cmd_inspect(args) -> int:
    import torch
    from agt.store import read_bundle

    b = read_bundle(args.bundle)
    print(f"bundle: {b.path}")
    print(f"  agt_version {b.agt_version}, created {b.created}, dtype {b.dtype}, n_train {b.n_train}")
    print(f"  dataset_sha256 {b.dataset_sha256}")
    print(f"  relations: {', '.join(b.relations)}")
    print(f"  k_values: {len(b.k_values)} values, {b.k_values[0]}..{b.k_values[-1]}"
          f"{' (contiguous)' if b.k_values == tuple(range(len(b.k_values))) else ' (sparse)'}")
    print(f"  model: {b.spec.to_json()}")
    cfg = b.config
    keys = ("loss", "optimizer", "learning_rate", "lr_decay", "lr_min", "momentum", "n_epochs",
            "batch_size", "clip_gamma", "seed")
    print("  config: " + ", ".join(f"{k}={cfg[k]}" for k in keys if k in cfg))
    print("  max width (upper - lower) per parameter:")
    ks = _summary_ks(b.k_values, 8)
    print("    " + f"{'param':<14s}" + "".join(f"k={k:<10d}" for k in ks))
    for name in b.nominal:
        widths = (b.upper[name] - b.lower[name]).reshape(len(b.k_values), -1).amax(1)
        row = "".join(f"{float(widths[b.k_values.index(k)]):<12.3e}" for k in ks)
        print(f"    {name:<14s}{row}")
    return 0


def cmd_certify(args) -> int:
    from agt.certify import Certifier
    from agt.data import load_npz_queries
    from agt.store import read_bundle

    bundle = read_bundle(args.bounds)
    x, y = load_npz_queries(args.data, split=args.split)
    cert = Certifier(bundle, device=args.device or "cpu").certify(x)
    out = Path(args.out)
    rows = [{"index": i, "prediction": int(cert.prediction[i]),
             "max_certified_k": int(cert.max_certified_k[i]), "smooth_radius": int(cert.radius[i])}
            for i in range(len(cert.prediction))]
    if out.suffix == ".json":
        _write_atomic(out, lambda p: p.write_text(json.dumps(
            {"bundle": str(args.bounds), "k_values": list(cert.k_values),
             "contiguous_grid": cert.contiguous, "queries": rows}, indent=1)))
    elif out.suffix == ".csv":
        def write_csv(p):
            with open(p, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else
                                   ["index", "prediction", "max_certified_k", "smooth_radius"])
                w.writeheader()
                w.writerows(rows)
        _write_atomic(out, write_csv)
    else:
        raise ConfigError(f"--out must end in .csv or .json, got {out.name}")
    frac = cert.certified_fraction()
    print(f"certified {len(rows)} queries against {bundle.path} "
          f"({'contiguous' if cert.contiguous else 'sparse: radius = grid index'})")
    if y is not None:
        print(f"nominal accuracy: {float((cert.prediction == y).mean()):.4f}")
    for k in _summary_ks(cert.k_values):
        print(f"  k={k:<6d} certified fraction {frac[k]:.4f}")
    if args.plot:
        from agt.plots import plot_certification
        plot_certification(cert, Path(args.plot))
        print(f"plot: {args.plot}")
    print(f"wrote {out}")
    return 0


# ------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agt", description="Abstract Gradient Training: sound "
                                "parameter bounds and smooth-sensitivity private prediction")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train with AGT and write a bounds bundle (HDF5)")
    t.add_argument("--config", required=True, help="YAML config (see configs/)")
    t.add_argument("--data", help="npz file replacing the config's data section")
    t.add_argument("--k-values", help="k grid, e.g. 0..199 or 0,1,2,5,10")
    t.add_argument("--out", help="output .h5 (default artifacts/bundles/<config>.h5)")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"))
    t.add_argument("--ensemble", type=int, default=0, metavar="T",
                   help="train T teachers on disjoint parts of the data (writes an ensemble)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)

    i = sub.add_parser("inspect", help="print a bundle's metadata and bound widths")
    i.add_argument("bundle")
    i.set_defaults(func=cmd_inspect)

    c = sub.add_parser("certify", help="largest certified k per query")
    c.add_argument("--bounds", required=True)
    c.add_argument("--data", required=True, help="npz with x_<split> (and y_<split>) or x")
    c.add_argument("--split", default="test")
    c.add_argument("--out", required=True, help="output .csv or .json")
    c.add_argument("--plot", help="optional PNG: certified fraction vs k and radius histogram")
    c.add_argument("--device", choices=("cpu", "cuda"))
    c.set_defaults(func=cmd_certify)

    from agt.cli_private import add_private_commands
    add_private_commands(sub)
    from agt.cli_ensemble import add_ensemble_commands
    add_ensemble_commands(sub)
    from agt.cli_reproduce import add_reproduce_commands
    add_reproduce_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except AGTError as exc:
        print(f"agt: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("agt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
