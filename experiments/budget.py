"""Fig. 5: accuracy vs inference budget Q for a fixed total (epsilon_total, delta_total).

Private prediction spends privacy per query: for a plan of Q queries the per-query epsilon
is the largest one whose Q-fold composition fits the total (mechanisms/accounting.py
`per_query_epsilon`), computed with the paper's composition ("best": the smaller of standard
and advanced composition) and with the tight PLD accountant. Pure eps-DP releases (GS,
SS-Cauchy, GS noisy argmax) spend delta 0 per query; SS-Laplace spends delta_total / (2 Q)
per query and leaves the rest as composition slack. Mechanisms: single model GS / SS, and
the T-teacher ensemble GS (noisy argmax) / SS (Thm 5.3 radius).

DP-SGD (Opacus, mechanisms/dpsgd.py) trains the same model to the same total
(epsilon_total, delta_total) once; predictions are post-processing, so its accuracy is flat
in Q. Its guarantee is for add-remove neighbours; the ensembles' for replace-one, the
full-batch single model certifies both.
"""

from __future__ import annotations

import time

import numpy as np

from mechanisms.accounting import per_query_epsilon

from experiments.accuracy import (Votes, ensemble_expected, ensemble_release, mean_std,
                                  sampled_accuracy, single_expected, single_release)
from experiments.context import Context, Outcome, markdown_table, pm
from experiments.plotting import plt, save, style

NAME = "budget"
CURVES = ("single-gs", "single-ss-cauchy", "single-ss-laplace",
          "ensemble-gs", "ensemble-ss-cauchy", "ensemble-ss-laplace")


def run(ctx: Context) -> Outcome:
    s = ctx.plan.settings[NAME]
    t0 = time.perf_counter()
    y = ctx.dataset.y_test
    single = ctx.single()
    em = ctx.ensemble(s.teachers)
    votes = Votes(em.cert.teacher_predictions, em.cert.teacher_radii)
    pred, radius = single.cert.prediction, single.cert.radius
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
                kind, mech = curve.split("-", 1)
                eps, d = (eps_lap, pqd) if mech == "ss-laplace" else (eps_pure, None)
                rngs = ctx.rngs(NAME, acc, q, curve, repeats=s.repeats)
                if kind == "single":
                    expected = single_expected(mech, pred, radius, y, eps, d).mean()
                    draws = sampled_accuracy(lambda rng: single_release(
                        mech, pred, radius, eps, d, single.relation, rng), y, rngs)
                else:
                    expected = ensemble_expected(mech, votes, y, eps, d).mean()
                    draws = sampled_accuracy(lambda rng: ensemble_release(
                        mech, votes, eps, d, em.relation, rng), y, rngs)
                m, sd = mean_std(draws)
                row["accuracy"][curve] = {"expected": float(expected), "sampled_mean": m,
                                          "sampled_std": sd, "sampled": draws}
            rows.append(row)
        per_acc[acc] = rows
    results = {
        "epsilon_total": s.epsilon_total, "delta_total": s.delta_total,
        "queries": list(s.queries), "teachers": s.teachers, "repeats": s.repeats,
        "n_test_queries": int(len(y)),
        "nonprivate": {"single": float(np.mean(pred == y)),
                       "ensemble": float(np.mean(em.cert.prediction == y))},
        "per_accountant": per_acc,
        "dp_sgd": {"accuracy": dp_acc, "accuracy_mean": mean_std(dp_acc)[0],
                   "accuracy_std": mean_std(dp_acc)[1], "runs": [r.to_json_dict() for r in runs]},
        "relations": {"single": single.relation, "ensemble": em.relation,
                      "dp_sgd": runs[0].relation},
        "ensemble": {"ensemble_id": em.ensemble.ensemble_id,
                     "k_values": [em.k_values[0], em.k_values[-1], len(em.k_values)]},
        "notes": "accuracy at Q = accuracy of the test queries answered at the per-query "
                 "epsilon of a Q-query plan; expected = exact, sampled = seeded draws; "
                 "DP-SGD guarantee is add-remove, the ensembles' replace-one",
    }
    files = [_plot(ctx, s, per_acc, dp_acc, results["nonprivate"])]
    table = [f"# Inference budget: accuracy vs Q ({ctx.plan.dataset})\n",
             f"Total budget (eps_t, delta_t) = ({s.epsilon_total:g}, {s.delta_total:g}); "
             f"T = {s.teachers}; {len(y)} test queries; cells are expected accuracies. "
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
                            for c in ("single-gs", "single-ss-cauchy", "ensemble-gs",
                                      "ensemble-ss-cauchy"))
                + f"; DP-SGD {mean_std(dp_acc)[0]:.3f}")
    return Outcome(NAME, headline, time.perf_counter() - t0, [str(p) for p in files])


def _plot(ctx: Context, s, per_acc, dp_acc, nonprivate):
    fig, axes = plt.subplots(1, len(per_acc), figsize=(5.4 * len(per_acc), 4.6), sharey=True,
                             squeeze=False)
    labels = {"single-gs": ("gs", "--", "single model, GS"),
              "single-ss-cauchy": ("ss-cauchy", "--", "single model, SS (Cauchy)"),
              "single-ss-laplace": ("ss-laplace", "--", "single model, SS (Laplace)"),
              "ensemble-gs": ("gs", "-", f"T={s.teachers}, GS noisy argmax"),
              "ensemble-ss-cauchy": ("ss-cauchy", "-", f"T={s.teachers}, SS (Cauchy)"),
              "ensemble-ss-laplace": ("ss-laplace", "-", f"T={s.teachers}, SS (Laplace)")}
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
