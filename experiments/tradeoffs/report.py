"""What a trade-off run shows: the figures (one PNG per figure and task) and the markdown
summary with each regime's winner. Reads rows, never models."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.context import markdown_table
from experiments.plotting import plt, save
from experiments.tradeoffs.methods import TRAINING, family
from experiments.tradeoffs.settings import TradeoffSettings

#: one colour per method (a method and its Gaussian or zCDP variant share one; plot_task
#: dashes the methods that need delta > 0)
COLORS = {"model-sens": "tab:blue", "model-sens-gauss": "tab:blue", "loss-pert": "tab:cyan",
          "loss-pert-gauss": "tab:cyan", "pred-sens": "tab:orange",
          "pred-sens-gauss": "tab:orange", "df-exp": "tab:red", "df-exp-zcdp": "tab:red",
          "lnmax": "tab:pink", "gnmax": "gold", "confident-gnmax": "darkkhaki",
          "ss-argmax": "tab:green", "exp-radius": "tab:brown",
          "ptr": "tab:olive", "ens-exp-radius": "tab:purple", "gs": "0.3",
          "ss-cauchy": "tab:gray", "ss-laplace": "k", "dp-sgd": "navy"}

#: PNG name (<task>_<name>.png) -> the sweeps drawn side by side in it
FIG_FILES = {"fig1": ("fig1_eps_delta0", "fig1_eps_delta"), "fig2": ("fig2_budget",),
             "fig3": ("fig3_delta",), "fig4": ("fig4_n",), "fig5": ("fig5_dim",),
             "fig6": ("fig6_lambda", "fig6_teachers")}
#: panels that show only the methods their x-axis acts on (lambda: the convex fits;
#: T: the vote methods)
FIG_ONLY = {"fig6_lambda": TRAINING[:4] + ("pred-sens", "pred-sens-gauss"),
            "fig6_teachers": ("df-exp", "df-exp-zcdp", "lnmax", "gnmax", "confident-gnmax",
                              "ens-exp-radius")}
TITLES = {"fig1_eps_delta0": "delta = 0", "fig1_eps_delta": "delta = {delta:g}",
          "fig2_budget": "eps = {eps:g}, delta = {delta:g}", "fig3_delta": "eps = {eps:g}, B = {B}",
          "fig4_n": "eps = {eps:g}, delta = {delta:g}, B = {B}",
          "fig5_dim": "eps = {eps:g}, delta = {delta:g}, B = {B}",
          "fig6_lambda": "convex methods, eps = {eps:g}, B = {B}",
          "fig6_teachers": "vote methods, eps = {eps:g}, B = {B}"}


def plot_task(task: str, figures: dict, out_dir: Path, s: TradeoffSettings) -> list[Path]:
    """Draw a task's figures.

    Args:
        task: ``multiclass`` or ``binary``.
        figures: the task's sweeps (`experiments.tradeoffs.sweeps.run_figures`).
        out_dir: where the PNGs go.
        s: the settings (for the titles).

    Returns:
        The PNGs written: one per `FIG_FILES` entry with at least one sweep.
    """
    files = []
    for fig_name, keys in FIG_FILES.items():
        keys = [k for k in keys if k in figures]
        if not keys:
            continue
        fig, axes = plt.subplots(1, len(keys), figsize=(6.2 * len(keys), 4.6), squeeze=False)
        for ax, key in zip(axes[0], keys):
            sweep = figures[key]
            xs = np.asarray(sweep["x"], dtype=float)
            for m, rows in sweep["rows"].items():
                if key in FIG_ONLY and m not in FIG_ONLY[key]:
                    continue
                pts = [(x, r["mean"], r["std"]) for x, r in zip(xs, rows) if r is not None]
                if not pts:
                    continue
                px, pm_, ps = (np.asarray(v) for v in zip(*pts))
                gauss = m.endswith("gauss") or m in ("df-exp-zcdp", "ptr", "ss-laplace")
                ax.errorbar(px, pm_, yerr=ps, color=COLORS.get(m), capsize=2, marker=".",
                            linestyle="--" if gauss else "-", label=f"{m} ({family(m)})")
            npv = [v["convex"] for v in sweep["nonprivate"]]
            ax.plot(xs, npv, color="0.5", linestyle=":", label="non-private (convex)")
            ax.plot(xs, [v["agt"] for v in sweep["nonprivate"]], color="tab:green",
                    linestyle=":", alpha=0.6, label="non-private (AGT nominal)")
            if sweep["x_name"] in ("epsilon", "budget", "delta", "lambda", "teachers",
                                   "n_train"):
                ax.set_xscale("log")
            ax.set_xlabel({"epsilon": "total ε over the budget", "budget": "inference budget B",
                           "delta": "total δ", "n_train": "training-set size N",
                           "pca_dim": "dimension D (PCA on the unlabelled queries)",
                           "lambda": "L2 weight λ", "teachers": "teachers T"}[sweep["x_name"]])
            ax.set_ylabel("test accuracy (mean ± std; AGT and DP-SGD over seeds too)")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"digits {task}: " + TITLES[key].format(
                delta=s.delta, eps=s.epsilon, B=s.budget) + " (replace-one)", fontsize=9)
            ax.grid(alpha=0.3, which="both")
        axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.02, 1.0))
        files.append(save(fig, out_dir / f"{task}_{fig_name}.png"))
    return files


def tuning_markdown(tuning: dict, s: dict) -> str:
    """The settings chosen on the public surrogate, with every candidate's score."""
    def fmt(choice: dict) -> str:
        # each candidate with all of its own keys (the stability ones add bound_method, ...)
        cands = "; ".join(", ".join(f"{k} {v}" for k, v in c.items()
                                    if k not in ("score", "scores"))
                          + f": {c['score']:.3f}" for c in choice["candidates"])
        return (f"chosen {choice['chosen'] or 'the fixed settings'} by {choice['criterion']}"
                + (f" (candidates: {cands})" if len(choice["candidates"]) > 1 else ""))
    text = (f"Settings chosen on {tuning['surrogate']} of the digits' public shape, never "
            f"on the digits. AGT: {fmt(tuning['agt'])}. AGT rows average the training seeds "
            f"{tuple(s['agt_seeds'])}.")
    if "dpsgd" in tuning:
        text += f" DP-SGD: {fmt(tuning['dpsgd'])}; seeds {tuple(s['dpsgd_seeds'])}."
    return text


def summary_markdown(results: dict) -> str:
    """summary.md of a run.

    Args:
        results: the run's results (what results.json holds).

    Returns:
        The markdown: per task the non-private accuracies, the settings chosen on the
        surrogate, each regime's winner and the best of each family, and the Fig. 1 table.
    """
    s = results["settings"]
    quick = " (quick)" if results["quick"] else ""
    lines = [f"# Trade-offs of private prediction on digits{quick}",
             "", "Every row: total (eps, delta) over B queries, replace-one; per-query "
             "mechanisms use standard composition (delta = 0) or the better of standard and "
             "advanced composition (delta > 0); sessions (model-sens*, loss-pert*, "
             "df-exp-zcdp) spend the total once. Accuracy: mean ± std over noise draws "
             f"({s['repeats']} draws; loss perturbation {s['loss_repeats']}); exact "
             "expectation as the mean where it exists; AGT rows also over the training "
             f"seeds {tuple(s['agt_seeds'])} and DP-SGD rows over its seeds "
             f"{tuple(s['dpsgd_seeds'])} "
             "(each row's std_kind in results.json says which).", ""]
    for task, block in results["tasks"].items():
        np_ = block["nonprivate"]
        lines += [f"## {task} ({block['n_classes']} classes, N = {block['n_train']}, "
                  f"{block['n_test']} queries)", "",
                  f"Non-private: convex {np_['convex']:.3f}, T = {s['teachers']} teachers' "
                  f"plurality {np_['teachers_plurality']:.3f}, AGT nominal {np_['agt']:.3f}; AGT "
                  f"radius median {block['agt_radius_median']:g} over every training seed's "
                  "queries (owner-only statistic).", "",
                  tuning_markdown(block["tuning"], s), "",
                  "### Winner per regime (eps = {:g})".format(s["epsilon"]), ""]
        header = ["regime", "winner", "accuracy", "best private training",
                  "best private prediction", "best AGT"]
        rows = []
        for r in block["regimes"]:
            b = r["best_by_family"]
            rows.append([r["regime"], f"{r['winner']} ({r['winner_family']})",
                         f"{r['winner_accuracy']:.3f}"]
                        + [f"{b[f]['method']} {b[f]['mean']:.3f} ± {b[f]['std']:.3f}"
                           for f in ("private training", "private prediction", "AGT")])
        lines += [markdown_table(header, rows), ""]
        fig1 = block["figures"].get("fig1_eps_delta")
        if fig1:
            lines += [f"### Fig. 1 (delta = {s['delta']:g}, B = {s['budget']}): accuracy vs "
                      "total eps", ""]
            hdr = ["method", "accountant"] + [f"eps {x:g}" for x in fig1["x"]]
            body = []
            for m, rs in fig1["rows"].items():
                if all(r is None for r in rs):
                    continue
                acct = next(r["accountant"] for r in rs if r is not None)
                body.append([m, acct] + ["—" if r is None else
                                         f"{r['mean']:.3f} ± {r['std']:.3f}" for r in rs])
            lines += [markdown_table(hdr, body), ""]
    lines += ["Owner-only research output: aggregate accuracies of models trained on the "
              "private digits; no radius, vote or logit is written.", ""]
    return "\n".join(lines)
