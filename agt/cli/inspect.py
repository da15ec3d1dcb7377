"""``agt inspect FILE.h5``: a bundle's metadata and bound widths (owner command)."""

from __future__ import annotations

from agt.cli.format import summary_ks


def add_parser(sub) -> None:
    i = sub.add_parser("inspect", help="print a bundle's metadata and bound widths (owner-only)")
    i.add_argument("bundle")
    i.set_defaults(func=run)


def run(args) -> int:
    from agt.store import read_bundle

    b = read_bundle(args.bundle)
    print(f"bundle: {b.path}")
    print(f"  agt_version {b.agt_version}, created {b.created}, dtype {b.dtype}, "
          f"n_train {b.n_train}")
    print(f"  dataset_sha256 {b.dataset_sha256}")
    if b.parent:
        print(f"  teacher {b.parent['teacher']} of {b.parent['n_teachers']} "
              f"({b.parent['partition']}) of dataset {b.parent['dataset_sha256']}")
    print(f"  relations: {', '.join(b.relations)}")
    print(f"  selection: {b.selection}, bound_method: {b.bound_method} ("
          + ("nesting proof: radii are smooth" if b.smooth_radii
             else "no nesting proof: radii may not feed smooth releases")
          + ")")
    print(f"  k_values: {b.k_grid.describe()}")
    print(f"  model: {b.spec.to_json()}")
    cfg = b.config
    keys = ("loss", "optimizer", "learning_rate", "lr_decay", "lr_min", "momentum", "n_epochs",
            "batch_size", "clip_gamma", "clip_norm", "seed", "input_norm_bound", "k_boxes",
            "k_placement")
    print("  config: " + ", ".join(f"{k}={cfg[k]}" for k in keys if k in cfg))
    print("  max width (upper - lower) per parameter:")
    ks = summary_ks(b.k_values, 8)
    print("    " + f"{'param':<14s}" + "".join(f"k={k:<10d}" for k in ks))
    for name in b.nominal:
        widths = (b.upper[name] - b.lower[name]).reshape(len(b.k_values), -1).amax(1)
        row = "".join(f"{float(widths[b.k_values.index(k)]):<12.3e}" for k in ks)
        print(f"    {name:<14s}{row}")
    if b.ball_radius is not None:
        row = "".join(f"{float(b.ball_radius[b.k_values.index(k)]):<12.3e}" for k in ks)
        print(f"    {'L2 ball rho_k':<14s}{row}")
    return 0
