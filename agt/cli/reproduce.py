"""``agt reproduce blobs|octmnist|imdb|tradeoffs|pate``: run the paper's experiments
(one dataset, the trade-off study or the PATE table).

    agt reproduce DATASET [--quick] [--data-dir DIR] [--out artifacts] [--only EXP,...]
                          [--seed N] [--plan FILE] [--device cpu|cuda] [--workers N|auto]
                          [--threads N] [--quiet]

Writes ``<out>/<DATASET>/<experiment>/`` (results.json, PNG plots, table.md) and
``<out>/<DATASET>/summary.md``, shows progress on stderr and prints the summary table on
stdout. The experiments and their settings are in experiments/ and
configs/experiments/<DATASET>.yaml. The artifacts are research outputs for the model owner
(accuracies, radii, bound statistics of models trained on the data): they are not private
releases; every simulated release inside them went through an in-memory ledger. OctMNIST
and IMDB read their files from --data-dir (a missing file is a one-line error saying how to
obtain it).

``agt reproduce tradeoffs [--quick]`` runs the trade-off study of van der Maaten & Hannun on
scikit-learn's digits (experiments/tradeoffs/, configs/experiments/tradeoffs.yaml; needs
scikit-learn) and writes ``<out>/tradeoffs/`` (``<out>/tradeoffs-quick/`` with --quick):
results.json, summary.md and the figures; --only, --seed, --data-dir and --workers do not
apply to it (--threads does; default 1 thread: its problems are small).

``agt reproduce pate [--quick]`` runs the PATE table (experiments/pate.py): LNMax, GNMax and
Confident-GNMax with data-independent, data-dependent and sanitised Renyi accounting, with
and without AGT radii, on Blobs (25 and 250 teachers) and digits (16, 32, 64 teachers), and
writes ``<out>/pate/`` (``<out>/pate-quick/``): results.json and summary.md (needs
scikit-learn, the datasets extra).
"""

from __future__ import annotations

from agt.cli.format import non_negative_int, positive_int

DATASETS = ("blobs", "octmnist", "imdb", "tradeoffs", "pate")


def add_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="run the paper's experiments for one dataset "
                       "(figures, tables and results.json under --out)")
    p.add_argument("dataset", choices=DATASETS)
    p.add_argument("--quick", action="store_true",
                   help="reduced settings (the plan's quick: section); minutes on 2 CPU cores")
    p.add_argument("--data-dir", help="folder with octmnist.npz / imdb_embeddings.npz "
                   "(default: the training config's data_dir)")
    p.add_argument("--out", default="artifacts", help="output folder (default artifacts)")
    p.add_argument("--only", help="comma-separated experiments to run: heatmap, single, "
                   "ensembles, budget, kgrid, teacher (default: all of the plan)")
    p.add_argument("--seed", type=non_negative_int, help="run only this training seed "
                   "(overrides the plan's seeds) and base seed of the sampled releases")
    p.add_argument("--plan", help="experiment plan YAML (default "
                   "configs/experiments/<dataset>.yaml)")
    p.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu",
                   help="device for certification and DP-SGD (training follows the config)")
    p.add_argument("--workers", type=workers_arg, default="auto", metavar="N|auto",
                   help="local processes. With N >= 2 the heat map runs in a process of its "
                        "own beside the other experiments and the ensembles' teachers use "
                        "the other N - 1; the results are identical. Default auto: 2 when "
                        "the heat map runs beside other experiments and two processes fit "
                        "in the cores, else 1")
    p.add_argument("--threads", type=positive_int, metavar="N",
                   help="intra-op threads of this process and of every teacher (default: "
                        "OMP_NUM_THREADS, else all cores here and 1 per teacher)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def workers_arg(text: str) -> int | str:
    return "auto" if text == "auto" else positive_int(text)


def run(args) -> int:
    # OMP_WAIT_POLICY is set passive by agt.cli.main before torch loads (agt/threads.py)
    from agt.errors import ConfigError
    from agt.parallel import plan_execution
    from agt.threads import TEACHER_THREADS, configure_threads
    from experiments.runner import reproduce, summary_table

    configure_threads(args.threads)
    # refuse workers x threads beyond the cores before any experiment runs ("auto" never
    # asks for more than fits)
    if args.workers != "auto":
        plan_execution(args.workers, workers=args.workers, threads=args.threads,
                       default_threads=TEACHER_THREADS)
    if args.dataset == "tradeoffs":
        return _run_tradeoffs(args)
    if args.dataset == "pate":
        return _run_pate(args)

    only = None
    if args.only is not None:
        only = [e.strip() for e in args.only.split(",") if e.strip()]
        if not only:
            raise ConfigError("--only needs at least one experiment name")
    device = args.device
    if device == "auto":
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    outcomes = reproduce(args.dataset, quick=args.quick, data_dir=args.data_dir, out=args.out,
                         only=only, seed=args.seed, plan_path=args.plan,
                         progress=not args.quiet, device=device, workers=args.workers,
                         threads=args.threads)
    total = outcomes[-1]
    print(summary_table(args.dataset, outcomes[:-1], total.seconds, args.quick))
    print(f"\nartifacts: {total.headline.removeprefix('wrote ')}")
    return 0


def _run_tradeoffs(args) -> int:
    from pathlib import Path

    from agt.errors import ConfigError
    from experiments.tradeoffs import load_settings, run_study

    if args.only is not None or args.seed is not None or args.data_dir is not None:
        raise ConfigError("agt reproduce tradeoffs takes no --only, --seed or --data-dir "
                          "(its seeds and data are in configs/experiments/tradeoffs.yaml)")
    settings = load_settings(args.plan, quick=args.quick)
    out = Path(args.out) / ("tradeoffs-quick" if args.quick else "tradeoffs")
    results = run_study(settings, out, quick=args.quick, progress=not args.quiet,
                        threads=args.threads)
    print((out / "summary.md").read_text())
    t = results["timing"]
    print(f"artifacts: {out} ({t['total_seconds']:.1f} s: training {t['training_seconds']:.1f}"
          f" s, releasing {t['releasing_seconds']:.1f} s, choosing settings on the public "
          f"surrogate {t['tuning_seconds']:.1f} s)")
    return 0


def _run_pate(args) -> int:
    from pathlib import Path

    from agt.errors import ConfigError
    from experiments.pate import run_pate

    if any(v is not None for v in (args.only, args.seed, args.data_dir, args.plan)):
        raise ConfigError("agt reproduce pate takes no --only, --seed, --data-dir or --plan "
                          "(its settings are fixed in experiments/pate.py)")
    out = Path(args.out) / ("pate-quick" if args.quick else "pate")
    run_pate(out, quick=args.quick, progress=not args.quiet)
    print((out / "summary.md").read_text())
    print(f"artifacts: {out}")
    return 0
