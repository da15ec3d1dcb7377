"""Fig. 5: accuracy vs inference budget Q for a fixed total (epsilon_total, delta_total).

Private prediction spends privacy per query: for a plan of Q queries the per-query epsilon
is the largest one whose Q-fold composition fits the total (mechanisms/accounting.py
`per_query_epsilon`), computed with the paper's composition ("best": the smaller of standard
and advanced composition) and with the tight PLD accountant. Pure eps-DP releases (GS,
SS-Cauchy, GS noisy argmax) spend delta 0 per query; SS-Laplace spends delta_total / (2 Q)
per query and leaves the rest as composition slack. Mechanisms: single model GS / SS, and
the T-teacher ensemble GS (noisy argmax) / SS (Thm 5.3 radius).

DP-SGD (Opacus, agt/baselines/dpsgd.py) trains the same model to the same total
(epsilon_total, delta_total) under replace-one once (its add-remove target is halved,
experiments/context.py); predictions are post-processing, so its accuracy is flat in Q.
Every row is under replace-one.
"""

from __future__ import annotations

import time

import numpy as np

from mechanisms.accounting import per_query_epsilon

from experiments.accuracy import RELATION, evaluate, mean_std
from experiments.context import Context, Outcome, markdown_table, pm
from experiments.ensembles import ensemble_mechanism
from experiments.single import single_mechanism
from experiments.plotting import plt, save, style

NAME = "budget"
CURVES = ("single-gs", "single-ss-cauchy", "single-ss-laplace",
          "ensemble-lnmax", "ensemble-ens-ss-cauchy", "ensemble-ens-ss-laplace")


def run(ctx: Context) -> Outcome:
    s = ctx.plan.settings[NAME]
    t0 = time.perf_counter()
    y = ctx.dataset.y_test
    single = ctx.single()
    em = ctx.ensemble(s.teachers)
    pred = single.cert.prediction
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
                rngs = ctx.rngs(NAME, acc, q, curve, repeats=s.repeats)
                if kind == "single":
                    row["accuracy"][curve] = evaluate(single_mechanism(name, eps, d),
                                                      single.inputs, y, rngs)
                else:
                    row["accuracy"][curve] = evaluate(ensemble_mechanism(name, eps, d),
                                                      em.inputs, y, rngs)
            rows.append(row)
        per_acc[acc] = rows
    results = {
        "epsilon_total": s.epsilon_total, "delta_total": s.delta_total,
        "queries": list(s.queries), "teachers": s.teachers, "repeats": s.repeats,
        "n_test_queries": int(len(y)),
        "nonprivate": {"single": float(np.mean(pred == y)),
                       "ensemble": float(np.mean(em.answer == y))},
        "per_accountant": per_acc,
        "dp_sgd": {"accuracy": dp_acc, "accuracy_mean": mean_std(dp_acc)[0],
                   "accuracy_std": mean_std(dp_acc)[1], "runs": [r.to_json_dict() for r in runs]},
        "relation": RELATION,
        "dp_sgd_add_remove_target": [runs[0].config.target_epsilon, runs[0].config.target_delta],
        "ensemble": {"ensemble_id": em.ensemble.ensemble_id,
                     "k_values": [em.k_values[0], em.k_values[-1], len(em.k_values)]},
        "notes": "accuracy at Q = accuracy of the test queries answered at the per-query "
                 "epsilon of a Q-query plan; expected = exact, sampled = simulated deployments; "
                 "every row under replace-one (DP-SGD trained to the add-remove target that "
                 "converts to the replace-one total)",
    }
    files = [_plot(ctx, s, per_acc, dp_acc, results["nonprivate"])]
    table = [f"# Inference budget: accuracy vs Q ({ctx.plan.dataset})\n",
             f"Total budget (eps_t, delta_t) = ({s.epsilon_total:g}, {s.delta_total:g}); "
             f"T = {s.teachers}; {len(y)} test queries; every row under replace-one; cells are "
             f"expected accuracies. "
             f"DP-SGD: {pm(*mean_std(dp_acc))} over {len(dp_acc)} run(s), flat in Q.\n"]
    for acc, rows in per_acc.items():
        table.append(f"\n## Per-query epsilon by the {acc} accountant\n")
        table.append(markdown_table(
            ["Q", "eps/query", "single GS", "single SS-Cauchy", "single SS-Laplace",
             f"T={s.teachers} GS", f"T={s.teachers} SS-Cauchy", f"T={s.teachers} SS-Laplace"],
            [[r["Q"], f"{r['epsilon_per_query']:.4g}"]
             + [f"{r['accuracy'][c]['expected']:.4f}" for c in CURVES] for r in rows]))
    ctx.write_table(NAME, "\n".join(table))
    ctx.write_results(NAME, {"results": results, "seconds": time.perf_counter() - t0})
    first = s.accountants[0]
    probe = min(s.queries, key=lambda q: abs(q - 100))
    row = next(r for r in per_acc[first] if r["Q"] == probe)
    headline = (f"Q={probe} ({first}, eps/query {row['epsilon_per_query']:.3g}): "
                + ", ".join(f"{c} {row['accuracy'][c]['expected']:.3f}"
                            for c in ("single-gs", "single-ss-cauchy", "ensemble-lnmax",
                                      "ensemble-ens-ss-cauchy"))
                + f"; DP-SGD {mean_std(dp_acc)[0]:.3f}")
    return Outcome(NAME, headline, time.perf_counter() - t0, [str(p) for p in files])


def _plot(ctx: Context, s, per_acc, dp_acc, nonprivate):
    fig, axes = plt.subplots(1, len(per_acc), figsize=(5.4 * len(per_acc), 4.6), sharey=True,
                             squeeze=False)
    labels = {"single-gs": ("gs", "--", "single model, GS"),
              "single-ss-cauchy": ("ss-cauchy", "--", "single model, SS (Cauchy)"),
              "single-ss-laplace": ("ss-laplace", "--", "single model, SS (Laplace)"),
              "ensemble-lnmax": ("gs", "-", f"T={s.teachers}, noisy argmax"),
              "ensemble-ens-ss-cauchy": ("ss-cauchy", "-", f"T={s.teachers}, SS (Cauchy)"),
              "ensemble-ens-ss-laplace": ("ss-laplace", "-", f"T={s.teachers}, SS (Laplace)")}
    for ax, (acc, rows) in zip(axes[0], per_acc.items()):
        qs = [r["Q"] for r in rows]
        for curve in CURVES:
            key, ls, label = labels[curve]
            st = style(key, linestyle=ls, label=label)
            mean = np.array([r["accuracy"][curve]["sampled_mean"] for r in rows])
            sd = np.array([r["accuracy"][curve]["sampled_std"] for r in rows])
            ax.plot(qs, [r["accuracy"][curve]["expected"] for r in rows], marker="o",
                    markersize=3, **st)
            ax.fill_between(qs, mean - sd, mean + sd, color=st["color"], alpha=0.15, linewidth=0)
        ax.axhline(float(np.mean(dp_acc)),
                   **style("dp-sgd", label=f"DP-SGD ({s.epsilon_total:g}, {s.delta_total:g})"))
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
    fig.legend(handles, names, fontsize=8, loc="lower center", ncol=4, bbox_to_anchor=(0.5, -0.1))
    fig.suptitle(f"{ctx.plan.dataset}: accuracy vs inference budget at total "
                 f"(ε, δ) = ({s.epsilon_total:g}, {s.delta_total:g})"
                 f"{' [quick]' if ctx.plan.quick else ''}", fontsize=10)
    fig.tight_layout()
    return save(fig, ctx.experiment_dir(NAME) / "accuracy_vs_queries.png")
