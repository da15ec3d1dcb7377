"""``agt tune``: training settings and a release mechanism chosen on public data.

    agt tune --public PUBLIC.npz --config TEMPLATE.yaml --queries B --epsilon-total E
             [--delta-total D] [--relation replace-one|add-remove] [--space small|default|none]
             [--grid KEY=V1,V2 ...] [--splits N] [--validation-fraction F] [--seed S]
             [--max-k K] [--input-norm-bound R] [--device cpu|cuda|auto]
             --out tuned.yaml [--overwrite] [--json] [--quiet]

Scores every candidate of the search space by the exact expected accuracy of every
applicable release at the planned budget on a public validation part, and writes the
template with the best candidate's settings (experiments/tune.py says how). The private data
is never opened: the template's ``data`` section is copied, not read. The printed table is a
function of public data only.
"""

from __future__ import annotations

import json
from pathlib import Path

from agt.cli.format import (
    non_empty,
    non_negative_int,
    positive_float,
    positive_int,
    unit_float,
)


def add_parser(sub) -> None:
    from experiments.tune import MAX_K, SPACES

    p = sub.add_parser(
        "tune", help="choose training settings and a release on public data; write a config",
        description="Choose the training settings (learning rate, epochs, clipping, batch "
                    "size, k grid, bound method) and the release mechanism with the best "
                    "expected released accuracy at a planned budget, on PUBLIC data only, and "
                    "write a config that agt train takes. The private data is never read.")
    p.add_argument("--public", required=True, type=non_empty, metavar="NPZ",
                   help="public records of the private task's shape, or a public surrogate "
                        "(x_train, y_train and optionally x_test, y_test; pooled, then split "
                        "into a public training and a validation part)")
    p.add_argument("--config", required=True, type=non_empty,
                   help="the config template (e.g. configs/blobs.yaml): model, loss and every "
                        "key not tuned are kept; its data section is copied, never read")
    p.add_argument("--queries", required=True, type=positive_int, metavar="B",
                   help="the number of queries the release budget must cover")
    p.add_argument("--epsilon-total", required=True, type=positive_float,
                   help="total epsilon over the B queries")
    p.add_argument("--delta-total", type=unit_float, default=0.0,
                   help="total delta over the B queries (default 0: pure DP releases only)")
    p.add_argument("--relation", choices=("replace-one", "add-remove"), default="replace-one",
                   help="neighbouring relation of the release (default replace-one)")
    p.add_argument("--space", choices=(*SPACES, "none"), default="small",
                   help="search-space preset: factors on the template's learning rate "
                        "(and epochs) and clipping gamma; small: 9 candidates, default: 18; "
                        "none: only --grid (default small)")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="absolute candidate values of one key, replacing the preset's "
                        "(learning_rate, n_epochs, clip_gamma, batch_size, k_values, "
                        "bound_method); k grids are separated by ';' (k_values=auto;0..50); "
                        "repeat for several keys")
    p.add_argument("--splits", type=positive_int, default=2,
                   help="public train/validation divisions each candidate is scored on "
                        "(default 2)")
    p.add_argument("--validation-fraction", type=unit_float, default=0.25,
                   help="share of the public records held out for validation (default 0.25)")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="seeds the public divisions (default 0)")
    p.add_argument("--max-k", type=positive_int, default=MAX_K,
                   help=f"largest k of an auto k grid (default {MAX_K})")
    p.add_argument("--input-norm-bound", type=positive_float, metavar="R",
                   help="declared L2 bound on every record (a public fact about the format): "
                        "adds bound method stability candidates for a linear-head template")
    p.add_argument("--private-records", type=positive_int, metavar="N",
                   help="the private training set's size (public: every guarantee is stated "
                        "for it); sizes the auto k grid for N and extrapolates full-batch "
                        "candidates' radii from the public training part to N")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                   help="where candidates train (default cpu)")
    p.add_argument("--out", required=True, type=non_empty, help="the tuned config (.yaml)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    p.add_argument("--json", action="store_true",
                   help="print the choice and every candidate's scores as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    from agt.config import load_config
    from agt.errors import ConfigError
    from agt.io import atomic_write, check_not_an_input, check_output
    from agt.threads import configure_threads
    from experiments.tune import (
        ReleaseBudget,
        load_public,
        parse_override,
        search_space,
        tune,
        tuned_config_text,
    )

    configure_threads(None)
    if not 0 < args.validation_fraction < 1:
        raise ConfigError(f"--validation-fraction must be in (0, 1), got "
                          f"{args.validation_fraction}")
    overrides = dict(parse_override(text) for text in args.grid)
    out = check_output(args.out, suffixes=(".yaml", ".yml"), overwrite=args.overwrite,
                       what="--out (a config)")
    check_not_an_input(out, {"--config": args.config, "--public": args.public})
    template = load_config(args.config)
    _refuse_private_as_public(template, args.config, args.public)
    budget = ReleaseBudget(args.queries, args.epsilon_total, args.delta_total, args.relation)
    budget.validate()
    space = search_space(template, args.space, overrides, args.input_norm_bound)
    public = load_public(args.public)
    result = tune(public, template, budget, space=space, splits=args.splits,
                  validation_fraction=args.validation_fraction, seed=args.seed,
                  max_k=args.max_k, input_norm_bound=args.input_norm_bound,
                  private_records=args.private_records,
                  device=args.device, progress=not args.quiet and not args.json)
    text = tuned_config_text(result, args.config, out, args.public)
    atomic_write(out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    if args.json:
        print(json.dumps({**result.as_dict(), "config": str(out)}, indent=2))
        return 0
    print(_table(result))
    print(f"chosen: {_describe(result.settings)}; release {result.mechanism} at per-query "
          f"(eps, delta) = ({result.epsilon:.6g}, {result.delta:.3g}), {result.accountant} "
          f"composition; expected released accuracy {result.score:.4f} on the public "
          f"validation parts")
    for note in result.notes:
        print(f"note: {note}")
    print(f"wrote {out} (train it: agt train --config {out})")
    return 0


def _refuse_private_as_public(template, config_path: str, public: str) -> None:
    """Refuse --public naming the template's own training file: settings chosen on it are a
    choice made on the private data, which no guarantee covers. Compares paths only."""
    import os

    from agt.errors import ConfigError

    data = template.data
    if data is None or data.name != "npz" or not isinstance(data.options.get("path"), str):
        return
    private = Path(data.options["path"]).expanduser()
    if not private.is_absolute():
        private = Path(config_path).resolve().parent / private
    if os.path.abspath(private) == os.path.abspath(public):
        raise ConfigError(f"--public names the config's private training file {public}; "
                          f"tune on public records (or a public surrogate) only")


def _describe(settings: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in settings.items()) or "the template's settings"


def _table(result) -> str:
    """One row per candidate: its settings, each release's score, the best."""
    keys = ("learning_rate", "n_epochs", "clip_gamma", "batch_size", "k_values",
            "bound_method")
    mechs = list(dict.fromkeys(m for row in result.candidates for m in row["scores"]))
    header = ["#", "lr", "epochs", "gamma", "batch", "k grid", "bounds"] + mechs + ["best"]
    body = []
    for row in result.candidates:
        r = row["resolved"]
        cells = [str(row["candidate"])] + [_cell(r.get(k)) for k in keys]
        if row["error"]:
            cells += ["-"] * len(mechs) + [f"invalid: {row['error']}"]
        else:
            cells += [("-" if row["scores"].get(m) is None else f"{row['scores'][m]:.4f}")
                      for m in mechs]
            cells.append("" if row["best_mechanism"] is None else
                         f"{row['best_mechanism']} {row['score']:.4f}")
        body.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    rows = ["  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in body]
    return "\n".join([f"candidates ({result.criterion}; - : the release does not apply):",
                      line, *rows])


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
