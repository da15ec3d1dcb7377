"""``agt audit``: an empirical privacy audit of a release mechanism (mechanisms/audit/).

Three ways to name the neighbouring inputs:
  --registry                 every registry mechanism (or those given with --mechanism) at
                             eps 1 on the neighbours its exact laws pick
                             (mechanisms.audit.cases.sweep); --out writes the artifact the
                             mechanism guide's column is generated from;
  --inputs FILE.npz          two given inputs: prediction, radius, neighbour_prediction,
                             neighbour_radius (one model) or votes, radii, neighbour_votes,
                             neighbour_radii (an ensemble), and n_classes;
  --config CFG.yaml          a bundle (or an ensemble, --teachers) retrained on the config's
                             data set and on a neighbour made by --relation
                             (experiments.audit.audit_dataset);
  --service-a URL --service-b URL --queries Q.npy
                             two RUNNING services on two neighbouring bundles, audited
                             black-box through agt.client (experiments.audit_service): keys
                             from --owner-key-file / --client-key-file (one key, or two
                             lines: A's then B's) or AGT_OWNER_KEY / AGT_CLIENT_KEY, never
                             on the command line; every release it asks for is charged.

OWNER-ONLY: the audit draws thousands of releases from seeded generators and reports
frequencies of the private inputs' labels; it is a test bench, never a release, and its
output must not reach the people the guarantee protects.
"""

from __future__ import annotations

import json
from pathlib import Path

from agt.cli.format import non_empty, non_negative_int, positive_float, positive_int


def add_parser(sub) -> None:
    a = sub.add_parser("audit", help="empirical privacy audit of a release mechanism: a "
                       "lower bound on its eps from many releases on neighbouring inputs "
                       "(OWNER-ONLY test bench, not a release)",
                       description="Audit a mechanism: releases on two neighbouring inputs, "
                       "a distinguishing event chosen on half of them, and a Clopper-Pearson "
                       "lower bound on eps from the other half; 'claim violated' when it "
                       "exceeds the claimed eps (docs/auditing.md).")
    source = a.add_mutually_exclusive_group(required=True)
    source.add_argument("--registry", action="store_true",
                        help="audit the registry's mechanisms at eps 1 (with --mechanism: "
                        "those only)")
    source.add_argument("--inputs", help="npz with the two inputs (see the module docstring)")
    source.add_argument("--config", help="training config: retrain on its data set and on a "
                        "neighbour")
    source.add_argument("--service-a", help="black-box: the URL of a running service on the "
                        "first bundle (with --service-b, --queries)")
    a.add_argument("--service-b", help="black-box: the URL of the service on its neighbour")
    a.add_argument("--queries", type=non_empty,
                   help="black-box: .npy of candidate queries (one per row)")
    a.add_argument("--owner-key-file", type=non_empty,
                   help="black-box: file with the owner key (or two lines: A's, B's); "
                        "default $AGT_OWNER_KEY")
    a.add_argument("--client-key-file", type=non_empty,
                   help="black-box: file with the client key that pays for the releases (or "
                        "two lines); default $AGT_CLIENT_KEY")
    a.add_argument("--mechanism", action="append", type=non_empty,
                   help="registry name (repeat with --registry)")
    a.add_argument("--epsilon", type=positive_float, default=1.0,
                   help="the mechanism's per-query epsilon (not with --registry)")
    a.add_argument("--delta", type=positive_float,
                   help="its delta, for (eps, delta) mechanisms (default 1e-6)")
    a.add_argument("--relation", choices=("replace-one", "add-remove"), default="replace-one",
                   help="the neighbouring relation the claim is tested under")
    a.add_argument("--plant", choices=("label-flip", "boundary"), default="label-flip",
                   help="with --config: how the replaced record is made")
    a.add_argument("--index", type=non_negative_int,
                   help="with --config: the record changed (default first; add-remove: last)")
    a.add_argument("--teachers", type=positive_int,
                   help="with --config: train ensembles of this many teachers")
    a.add_argument("--samples", type=positive_int, default=20_000,
                   help="releases per side")
    a.add_argument("--session-samples", type=positive_int,
                   help="with --registry: releases per side for sessions (drawn one by one)")
    a.add_argument("--seed", type=non_negative_int, default=0,
                   help="the audit's seed (its reproducibility; never a release's)")
    a.add_argument("--confidence", type=positive_float, default=0.95,
                   help="1 - the false-alarm probability")
    a.add_argument("--out", type=non_empty, help="JSON file for the result(s)")
    a.add_argument("--plot", type=non_empty,
                   help="PNG/PDF/SVG of the two label distributions (not with --registry)")
    a.set_defaults(func=run)


def _given_inputs(path: str, relation: str):
    import numpy as np

    from agt.errors import DataError
    from mechanisms.inputs import Certified, Source, Votes

    with np.load(path) as f:
        data = {k: f[k] for k in f.files}
    if "n_classes" not in data:
        raise DataError(f"{path}: give n_classes in the npz")
    c = int(data["n_classes"])
    source = Source("audit-inputs", "0" * 64, (relation,), True)
    if "prediction" in data:
        keys = ("prediction", "radius", "neighbour_prediction", "neighbour_radius")
        kind = Certified
    else:
        keys = ("votes", "radii", "neighbour_votes", "neighbour_radii")
        kind = Votes
    missing = [k for k in keys if k not in data]
    if missing:
        raise DataError(f"{path} lacks {', '.join(missing)} (see agt audit --help)")
    return (kind(data[keys[0]], data[keys[1]], c, source),
            kind(data[keys[2]], data[keys[3]], c, source))


def _keys(path: str | None, env: str, what: str) -> tuple[str, str]:
    """(A's key, B's key) from a file of one or two lines, else the environment variable."""
    import os

    from agt.errors import ConfigError

    if path is not None:
        try:
            lines = [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]
        except OSError as exc:
            raise ConfigError(f"cannot read {what} key file {path}: {exc.strerror}") from None
    else:
        lines = [k for k in os.environ.get(env, "").split(",") if k]
    if len(lines) not in (1, 2):
        raise ConfigError(f"give the {what} key in --{what}-key-file (one line, or two: the "
                          f"first service's, then the second's) or in ${env}")
    return lines[0], lines[-1]


def _audit_services(args):
    import numpy as np

    from agt.errors import ConfigError
    from experiments.audit_service import ServiceSide, audit_services
    from mechanisms import make_mechanism

    if not args.service_b or not args.queries:
        raise ConfigError("--service-a needs --service-b URL and --queries FILE.npy")
    owner = _keys(args.owner_key_file, "AGT_OWNER_KEY", "owner")
    client = _keys(args.client_key_file, "AGT_CLIENT_KEY", "client")
    claimed = None
    if args.mechanism:      # the claimed law (default: the services' own name)
        if len(args.mechanism) != 1:
            raise ConfigError("name at most one claimed mechanism with --mechanism")
        claimed = make_mechanism(args.mechanism[0], args.epsilon, args.delta)
    return audit_services(ServiceSide(args.service_a, owner[0], client[0]),
                          ServiceSide(args.service_b, owner[1], client[1]),
                          np.load(args.queries), samples=args.samples, mechanism=claimed,
                          seed=args.seed, confidence=args.confidence)


def run(args) -> int:
    from agt.errors import ConfigError
    from agt.io import atomic_write, check_output

    out = check_output(args.out, suffixes=(".json",)) if args.out else None
    if args.plot:
        from agt.plots import PLOT_SUFFIXES
        check_output(args.plot, suffixes=PLOT_SUFFIXES, what="--plot")
    if not 0.5 <= args.confidence < 1:
        raise ConfigError(f"--confidence must be in [0.5, 1), got {args.confidence}")
    if args.registry:
        if args.plot:
            raise ConfigError("--plot draws one audit: leave it out with --registry")
        from mechanisms.audit.cases import sweep, write_sweep

        results = sweep(args.mechanism, samples=args.samples,
                        session_samples=args.session_samples, seed=args.seed,
                        confidence=args.confidence, progress=True)
        for r in results:
            print(r.summary())
        if out is not None:
            atomic_write(out, lambda p: write_sweep(results, p))
        return 0
    if args.service_a:
        _report(_audit_services(args), out, args.plot)
        return 0
    if not args.mechanism or len(args.mechanism) != 1:
        raise ConfigError("name one mechanism with --mechanism")
    from mechanisms import make_mechanism
    from mechanisms.base import load_registry

    name = args.mechanism[0]
    entry = load_registry().get(name)
    delta = (args.delta if args.delta is not None else 1e-6) \
        if entry is not None and entry.needs_delta else args.delta
    mechanism = make_mechanism(name, args.epsilon, delta)
    if args.inputs:
        from mechanisms.audit import audit

        first, second = _given_inputs(args.inputs, args.relation)
        result = audit(mechanism, first, second, relation=args.relation,
                       samples=args.samples, seed=args.seed, confidence=args.confidence,
                       progress=True)
    else:
        from agt.config import load_config
        from agt.data import load_dataset
        from experiments.audit import audit_dataset

        cfg = load_config(args.config)
        ds = load_dataset(cfg.data.name, cfg.data.options,
                          base_dir=Path(args.config).resolve().parent)
        result = audit_dataset(mechanism, cfg, ds, relation=args.relation, plant=args.plant,
                               index=args.index, n_teachers=args.teachers,
                               samples=args.samples, seed=args.seed,
                               confidence=args.confidence, progress=True)
    _report(result, out, args.plot)
    return 0


def _report(result, out: Path | None, plot: str | None) -> None:
    """Print an audit's summary and write its JSON and plot where asked."""
    from agt.io import atomic_write

    print(result.summary())
    if out is not None:
        atomic_write(out, lambda p: p.write_text(json.dumps(result.to_dict(), indent=1)
                                                 + "\n"))
    if plot:
        atomic_write(plot, lambda p: result.plot(p))
