"""``agt certify``: per query, the nominal prediction, k* and the stability radius.

Owner-only: radii and k* are deterministic functions of the private data and carry no
privacy guarantee; this file is for the model owner. Releases go through ``agt predict``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from agt.cli.format import certified_fractions, non_empty

_FIELDS = ["index", "prediction", "max_certified_k", "smooth_radius"]


def add_parser(sub) -> None:
    c = sub.add_parser("certify", help="largest certified k per query (OWNER-ONLY output: "
                       "radii are not private; release labels with agt predict)")
    c.add_argument("--bounds", required=True)
    c.add_argument("--data", required=True, help="npz with x_<split> (and y_<split>) or x")
    c.add_argument("--split", default="test", type=non_empty)
    c.add_argument("--out", required=True, type=non_empty, help="output .csv or .json")
    c.add_argument("--plot", help="optional PNG/PDF/SVG: certified fraction vs k and radius "
                   "histogram")
    c.add_argument("--device", choices=("cpu", "cuda"))
    c.add_argument("--trajectory", action="store_true",
                   help="also certify by the margin bound along the training run (a linear "
                   "head's bundle from bound_method interval or served-k0; re-runs training "
                   "on the data its config names, relative paths from the working directory; "
                   "the certificate then holds under replace-one)")
    c.set_defaults(func=run)


def run(args) -> int:
    from agt.certify import Certifier
    from agt.data import load_npz_queries
    from agt.io import atomic_write, check_output
    from agt.plots import PLOT_SUFFIXES
    from agt.store import read_bundle

    out = check_output(args.out, suffixes=(".csv", ".json"))
    if args.plot:
        check_output(args.plot, suffixes=PLOT_SUFFIXES, what="--plot")
    bundle = read_bundle(args.bounds)
    x, y = load_npz_queries(args.data, split=args.split)
    trajectory = None
    if args.trajectory:
        from agt.trajectory import TrajectoryBounds
        trajectory = TrajectoryBounds.from_config_data(bundle, progress=True)
    cert = Certifier(bundle, device=args.device or "cpu", trajectory=trajectory).certify(x)
    rows = [{"index": i, "prediction": int(cert.prediction[i]),
             "max_certified_k": int(cert.max_certified_k[i]),
             "smooth_radius": max(int(cert.radius[i]), 0)}
            for i in range(len(cert.prediction))]
    if out.suffix == ".json":
        atomic_write(out, lambda p: p.write_text(json.dumps(
            {"owner_only": "radii and k* are functions of the private data; not a release",
             "bundle": str(args.bounds), "k_values": list(cert.k_values),
             "contiguous_grid": cert.contiguous, "smooth_radii": cert.smooth_radii,
             "relations": list(cert.relations), "trajectory": bool(args.trajectory),
             "queries": rows}, indent=1)))
    else:
        def write_csv(p: Path) -> None:
            with open(p, "w", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=_FIELDS)
                w.writeheader()
                w.writerows(rows)
        atomic_write(out, write_csv)
    print(f"certified {len(rows)} queries against {bundle.path} "
          f"({'contiguous grid' if cert.contiguous else 'sparse grid: radius = grid index'}; "
          f"owner-only output)")
    if y is not None:
        print(f"nominal accuracy: {float((cert.prediction == y).mean()):.4f}")
    print(certified_fractions(cert.certified_fraction(), cert.k_values, "certified fraction "))
    if args.plot:
        from agt.plots import plot_certification
        plot_certification(cert, Path(args.plot))
        print(f"plot: {args.plot}")
    print(f"wrote {out}")
    return 0
