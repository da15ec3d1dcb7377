"""Fig. 5: accuracy vs inference budget Q for a fixed total (epsilon_total, delta_total).

Private prediction spends privacy per query: for a plan of Q queries the per-query epsilon
is the largest one whose Q-fold composition fits the total (mechanisms/accounting.py
`per_query_epsilon`), computed with the paper's composition ("best": the smaller of standard
and advanced composition) and with the tight PLD accountant. Pure eps-DP releases spend
delta 0 per query; SS-Laplace spends delta_total / (2 Q) per query and leaves the rest as
composition slack. Curves: single model GS / SS / exponential mechanism on the radius, and the
T-teacher ensemble (noisy argmax / SS / exponential mechanism on the ensemble radius).

Stability-gated sessions (svt, ens-svt; mechanisms/radius.py) spend the whole total on one
session per deployment of Q queries: stable queries are answered with the certified class at
no cost, at most `gate_cutoff` unstable ones by the fallback, the rest refused. Their
accuracy does not depend on the accountant. Every curve is evaluated on deployments of Q
consecutive test queries (the test split cut into chunks of Q; a per-query mechanism's
accuracy does not depend on the cut, a session's does); "answered" is the expected fraction
of queries that get a label.

DP-SGD (Opacus, agt/baselines/dpsgd.py) trains the same model to the same total under
replace-one (its add-remove target is halved, experiments/context.py); predictions are
post-processing, so its accuracy is flat in Q. Every row is under replace-one; exact
expectations are mean +- std over the training seeds.
"""

from __future__ import annotations

import time

import numpy as np

from experiments.accuracy import RELATION, expected_accuracy, mean_std, simulate
from experiments.context import Context, Outcome, markdown_table, pm
from experiments.ensembles import ensemble_mechanism
from experiments.plotting import plt, save, style
from experiments.single import single_mechanism
from mechanisms.accounting import per_query_epsilon

NAME = "budget"
CURVES = ("single-gs", "single-ss-cauchy", "single-ss-laplace", "single-exp-radius",
          "ensemble-lnmax", "ensemble-ens-ss-cauchy", "ensemble-ens-exp-radius")
GATED = ("single-svt", "ensemble-ens-svt")
SAMPLED_CHUNKS = 40


def chunks(n: int, q: int) -> list[slice]:
    """The test split cut into deployments of q consecutive queries (the last may be shorter)."""
    return [slice(i, min(n, i + q)) for i in range(0, n, q)]


def run(ctx: Context) -> Outcome:
    s = ctx.plan.settings[NAME]
    t0 = time.perf_counter()
    y = ctx.dataset.y_test
    singles = ctx.singles()
    ensembles = ctx.ensembles(s.teachers)
    inputs = {"single": [m.inputs for m in singles], "ensemble": [m.inputs for m in ensembles]}
    runs = ctx.dpsgd(s.epsilon_total, s.delta_total, s.dpsgd, s.dpsgd_seeds)
    dp_acc = [float(r.test_accuracy) for r in runs]
    per_acc = {}
    for acc in s.accountants:
        rows = []
        for q in ctx.bar(s.queries, f"budget: Q ({acc})"):
            eps_pure = per_query_epsilon(s.epsilon_total, s.delta_total, q, 0.0, acc)
            pqd = s.delta_total / (2.0 * q)
            eps_lap = per_query_epsilon(s.epsilon_total, s.delta_total, q, pqd, acc)
            row = {"Q": q, "epsilon_per_query": eps_pure,
                   "epsilon_per_query_ss_laplace": eps_lap, "delta_per_query_ss_laplace": pqd,
                   "accuracy": {}}
            for curve in CURVES:
                kind, name = curve.split("-", 1)
                eps, d = (eps_lap, pqd) if name.endswith("ss-laplace") else (eps_pure, None)
                make = single_mechanism if kind == "single" else ensemble_mechanism
                mech = make(name, eps, d)
                by_seed = [expected_accuracy(mech, i, y) for i in inputs[kind]]
                draws = [float(np.mean(simulate(mech, inputs[kind][0], rng) == y))
                         for rng in ctx.rngs(NAME, acc, q, curve, repeats=s.repeats)]
                row["accuracy"][curve] = _entry(by_seed, draws, 1.0)
            rows.append(row)
        per_acc[acc] = rows
    gated = _gated(ctx, s, inputs, y)
    results = {
        "epsilon_total": s.epsilon_total, "delta_total": s.delta_total,
        "queries": list(s.queries), "teachers": s.teachers, "repeats": s.repeats,
        "training_seeds": list(ctx.seeds), "n_test_queries": int(len(y)),
        "nonprivate": {"single": mean_std([float(np.mean(m.cert.prediction == y))
                                           for m in singles])[0],
                       "ensemble": mean_std([float(np.mean(m.answer == y))
                                             for m in ensembles])[0]},
        "per_accountant": per_acc, "gated": gated,
        "gate": {"cutoff": s.gate_cutoff, "fallback": s.gate_fallback},
        "dp_sgd": {"accuracy": dp_acc, "accuracy_mean": mean_std(dp_acc)[0],
                   "accuracy_std": mean_std(dp_acc)[1], "runs": [r.to_json_dict() for r in runs]},
        "relation": RELATION,
        "dp_sgd_add_remove_target": [runs[0].config.target_epsilon, runs[0].config.target_delta],
        "notes": "accuracy at Q = accuracy of deployments of Q test queries at the per-query "
                 "epsilon of a Q-query plan (gated sessions: one session of the total budget "
                 "per deployment); expected = exact, mean +- std over training seeds; sampled "
                 "= simulated deployments of the first seed's models; every row under "
                 "replace-one (DP-SGD trained to the add-remove target that converts to it)",
    }
    files = [_plot(ctx, s, per_acc, gated, dp_acc, results["nonprivate"])]
    table = [f"# Inference budget: accuracy vs Q ({ctx.plan.dataset})\n",
             f"Total budget (eps_t, delta_t) = ({s.epsilon_total:g}, {s.delta_total:g}) under "
             f"replace-one; T = {s.teachers}; {len(y)} test queries; cells are expected "
             f"accuracies, mean ± std over the training seeds {list(ctx.seeds)}. DP-SGD: "
             f"{pm(*mean_std(dp_acc))} over {len(dp_acc)} run(s), flat in Q. Gated sessions: "
             f"cutoff {s.gate_cutoff}, fallback {s.gate_fallback}; 'answered' = expected "
             f"fraction of queries that get a label.\n"]
    for acc, rows in per_acc.items():
        table.append(f"\n## Per-query epsilon by the {acc} accountant\n")
        table.append(markdown_table(
            ["Q", "eps/query"] + [_short(c, s.teachers) for c in CURVES],
            [[r["Q"], f"{r['epsilon_per_query']:.4g}"]
             + [pm(r["accuracy"][c]["expected"], r["accuracy"][c]["expected_std"])
                for c in CURVES] for r in rows]))
    table.append("\n## Stability-gated sessions (the whole budget per deployment of Q queries)\n")
    table.append(markdown_table(
        ["Q"] + [f"{_short(c, s.teachers)} accuracy" for c in GATED]
        + [f"{_short(c, s.teachers)} answered" for c in GATED],
        [[r["Q"]] + [pm(r[c]["expected"], r[c]["expected_std"]) for c in GATED]
         + [f"{r[c]['answered']:.3f}" for c in GATED] for r in gated]))
    ctx.write_table(NAME, "\n".join(table))
    ctx.write_results(NAME, {"results": results, "seconds": time.perf_counter() - t0})
    first = s.accountants[0]
    probe = min(s.queries, key=lambda q: abs(q - 100))
    row = next(r for r in per_acc[first] if r["Q"] == probe)
    g = next(r for r in gated if r["Q"] == probe)
    headline = (f"Q={probe} ({first}, eps/query {row['epsilon_per_query']:.3g}): "
                + ", ".join(f"{c} {row['accuracy'][c]['expected']:.3f}"
                            for c in ("single-gs", "single-ss-cauchy", "single-exp-radius",
                                      "ensemble-lnmax", "ensemble-ens-ss-cauchy"))
                + f"; gated single {g['single-svt']['expected']:.3f}"
                + f"; DP-SGD {mean_std(dp_acc)[0]:.3f}")
    return Outcome(NAME, headline, time.perf_counter() - t0, [str(p) for p in files])


def _entry(by_seed, draws, answered) -> dict:
    m, sd = mean_std(by_seed)
    dm, dsd = mean_std(draws) if draws else (float("nan"), float("nan"))
    return {"expected": m, "expected_std": sd, "expected_by_seed": by_seed,
            "sampled_mean": dm, "sampled_std": dsd, "sampled": draws, "answered": answered}


def _gated(ctx: Context, s, inputs, y: np.ndarray) -> list[dict]:
    """Per Q: the gated sessions' exact expected accuracy and answered fraction over all
    deployments (chunks) of Q queries, and sampled accuracy on the first chunks."""
    n = len(y)
    rows = []
    for q in ctx.bar(s.queries, "budget: gated sessions"):
        row = {"Q": q}
        for curve in GATED:
            kind, name = curve.split("-", 1)
            make = single_mechanism if kind == "single" else ensemble_mechanism
            mech = make(name, s.epsilon_total, s.delta_total, cutoff=s.gate_cutoff,
                        fallback=s.gate_fallback)
            by_seed, answered = [], []
            for inp in inputs[kind]:
                right = np.concatenate([mech.correct_probability(inp.subset(c), y[c])
                                        for c in chunks(n, q)])
                by_seed.append(float(right.mean()))
                answered.append(_answered(mech, inp, n, q))
            some = chunks(n, q)[:SAMPLED_CHUNKS]
            draws = []
            for rng in ctx.rngs(NAME, "gated", q, curve, repeats=s.repeats):
                hits = np.concatenate([simulate(mech, inputs[kind][0].subset(c), rng) == y[c]
                                       for c in some])
                draws.append(float(hits.mean()))
            row[curve] = _entry(by_seed, draws, float(np.mean(answered)))
        rows.append(row)
    return rows


def _answered(mech, inputs, n: int, q: int) -> float:
    """Expected fraction of queries a gated session labels over the deployments of q
    queries (the law lives in mechanisms: `Mechanism.answered_probability`)."""
    total = sum(float(mech.answered_probability(inputs.subset(c)).sum()) for c in chunks(n, q))
    return min(1.0, total / n)


def _short(curve: str, teachers: int) -> str:
    kind, name = curve.split("-", 1)
    who = "single" if kind == "single" else f"T={teachers}"
    return f"{who} {name}"


def _plot(ctx: Context, s, per_acc, gated, dp_acc, nonprivate):
    fig, axes = plt.subplots(1, len(per_acc), figsize=(5.6 * len(per_acc), 4.8), sharey=True,
                             squeeze=False)
    for ax, (acc, rows) in zip(axes[0], per_acc.items()):
        qs = [r["Q"] for r in rows]
        for curve in CURVES:
            kind, name = curve.split("-", 1)
            key = name.replace("ens-", "") if name.startswith("ens-") else name
            st = style(key if key in ("gs", "ss-cauchy", "ss-laplace", "exp-radius") else
                       "lnmax", linestyle="--" if kind == "single" else "-",
                       label=_short(curve, s.teachers))
            mean = np.array([r["accuracy"][curve]["expected"] for r in rows])
            sd = np.array([r["accuracy"][curve]["expected_std"] for r in rows])
            ax.plot(qs, mean, marker="o", markersize=3, **st)
            ax.fill_between(qs, mean - sd, mean + sd, color=st["color"], alpha=0.12, linewidth=0)
        for curve in GATED:
            kind, name = curve.split("-", 1)
            st = style("svt", linestyle="--" if kind == "single" else "-",
                       label=f"{_short(curve, s.teachers)} (gated session)")
            mean = np.array([r[curve]["expected"] for r in gated])
            ax.plot([r["Q"] for r in gated], mean, marker="s", markersize=3, **st)
        ax.axhline(float(np.mean(dp_acc)), **style("dp-sgd", label=f"DP-SGD ({s.epsilon_total:g}, "
                                                              f"{s.delta_total:g})"))
        ax.axhline(nonprivate["single"], **style("nonprivate", linestyle=":",
                                                 label="non-private single model"))
        ax.set_xscale("log")
        ax.set_xlabel("inference budget Q (queries, log scale)")
        name = "paper's composition (best of standard / advanced)" if acc == "best" else \
            f"{acc} accountant" + (" (PLD)" if acc == "tight" else "")
        ax.set_title(f"per-query ε by {name}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("accuracy on the test queries (fraction)")
    axes[0][0].set_ylim(0.4, 1.02)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="lower center", ncol=4, bbox_to_anchor=(0.5, -0.14))
    fig.suptitle(f"{ctx.plan.dataset}: accuracy vs inference budget at total (ε, δ) = "
                 f"({s.epsilon_total:g}, {s.delta_total:g}), replace-one; mean over "
                 f"{len(ctx.seeds)} seeds{' [quick]' if ctx.plan.quick else ''}", fontsize=10)
    fig.tight_layout()
    return save(fig, ctx.experiment_dir(NAME) / "accuracy_vs_queries.png")
