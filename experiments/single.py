"""Fig. 2: single-model private prediction, accuracy vs per-query epsilon.

One AGT model on the whole private set (the run's shared `Context.single`), its nominal
predictions f(x) and smooth radii r(x) on the test queries. Per epsilon of the grid:
  GS          1[f + Laplace(1/eps) > 1/2]                       P(flip) = exp(-eps/2) / 2
  SS-Laplace  Laplace(2S/eps), S = exp(-beta r), beta = eps / (2 ln(2/delta))
  SS-Cauchy   Cauchy(6S/eps), beta = eps / 6
Accuracy = mean over queries of P(release = true label): exact from the flip probabilities
("expected"), and from `repeats` seeded draws of the real releases ("sampled", mean +- std).
"Keeps the noise-free accuracy from eps_keep on": the smallest grid epsilon from which every
larger grid epsilon has expected accuracy >= noise-free - tolerance; the paper's claim is
eps_keep(GS) / eps_keep(SS) >= 10.
"""

from __future__ import annotations

import time

import numpy as np

from mechanisms import make_mechanism

from experiments.accuracy import RELATION, evaluate
from experiments.context import Context, Outcome, markdown_table
from experiments.plotting import plt, save, style

NAME = "single"
SINGLE_MECHANISMS = ("gs", "ss-laplace", "ss-cauchy")


def single_mechanism(name: str, epsilon: float, delta: float):
    """A single-model mechanism of the registry at per-query epsilon (delta if it takes one)."""
    return make_mechanism(name, epsilon, delta if name == "ss-laplace" else None)


def keeps_from(epsilons, accuracy, target: float) -> float | None:
    """Smallest eps of the (ascending) grid from which accuracy stays >= target."""
    keep = None
    for eps, acc in sorted(zip(epsilons, accuracy), reverse=True):
        if acc >= target:
            keep = eps
        else:
            break
    return keep


def run(ctx: Context) -> Outcome:
    s = ctx.plan.settings[NAME]
    t0 = time.perf_counter()
    model = ctx.single()
    y = ctx.dataset.y_test
    pred, radius = model.cert.prediction, model.cert.radius
    nonprivate = float(np.mean(pred == y))
    curves = {m: {"expected": [], "sampled_mean": [], "sampled_std": [], "sampled": []}
              for m in SINGLE_MECHANISMS}
    for eps in ctx.bar(s.epsilons, "single: epsilon grid"):
        for name in SINGLE_MECHANISMS:
            r = evaluate(single_mechanism(name, eps, s.delta), model.inputs, y,
                         ctx.rngs(NAME, name, eps, repeats=s.repeats))
            for key in curves[name]:
                curves[name][key].append(r[key])
    target = nonprivate - s.tolerance
    keep = {m: keeps_from(s.epsilons, curves[m]["expected"], target) for m in SINGLE_MECHANISMS}
    ratios = {m: (keep["gs"] / keep[m] if keep["gs"] and keep[m] else None)
              for m in ("ss-laplace", "ss-cauchy")}
    kv = model.bundle.k_values
    values, counts = np.unique(radius, return_counts=True)
    results = {
        "epsilons": list(s.epsilons), "delta_ss_laplace": s.delta, "repeats": s.repeats,
        "n_queries": int(len(y)), "nonprivate_accuracy": nonprivate,
        "accuracy": curves,
        "keeps_nonprivate_from_epsilon": keep, "tolerance": s.tolerance,
        "gs_over_ss_epsilon_ratio": ratios,
        "radius": {"mean": float(radius.mean()), "median": float(np.median(radius)),
                   "histogram": {"values": values, "counts": counts},
                   "k_values": [kv[0], kv[-1], len(kv)],
                   "contiguous_grid": model.cert.contiguous},
        "model": {"bundle_id": model.bundle.bundle_id, "relation": RELATION,
                  "relations_certified": list(model.bundle.relations),
                  "training_and_certification_seconds": model.seconds},
        "notes": "expected = exact mean of P(release = label) from the mechanisms' closed "
                 "forms; sampled = simulated deployments through in-memory ledgers "
                 "(seeded); every guarantee under replace-one",
    }
    files = [_plot(ctx, s, curves, nonprivate)]
    rows = []
    for i, eps in enumerate(s.epsilons):
        rows.append([f"{eps:.3g}"] + [f"{curves[m]['expected'][i]:.4f} "
                                      f"({curves[m]['sampled_mean'][i]:.4f} ± "
                                      f"{curves[m]['sampled_std'][i]:.4f})"
                                      for m in SINGLE_MECHANISMS])
    table = (f"# Single model: accuracy vs per-query epsilon ({ctx.plan.dataset})\n\n"
             f"Non-private accuracy {nonprivate:.4f} on {len(y)} test queries. Cells: expected "
             f"accuracy (sampled mean ± std over {s.repeats} seeded draws). SS-Laplace uses "
             f"delta = {s.delta:g} per query.\n\n"
             + markdown_table(["epsilon", "GS", "SS-Laplace", "SS-Cauchy"], rows)
             + "\n\nKeeps the non-private accuracy (within "
             f"{s.tolerance:g}) from epsilon: "
             + ", ".join(f"{m} {_fmt(keep[m])}" for m in SINGLE_MECHANISMS)
             + (f"; GS / SS-Cauchy = {ratios['ss-cauchy']:.1f}x" if ratios["ss-cauchy"] else "")
             + "\n")
    ctx.write_table(NAME, table)
    ctx.write_results(NAME, {"results": results, "seconds": time.perf_counter() - t0})
    headline = (f"non-private {nonprivate:.3f}; keeps it from eps GS {_fmt(keep['gs'])}, "
                f"SS-Cauchy {_fmt(keep['ss-cauchy'])}, SS-Laplace {_fmt(keep['ss-laplace'])}"
                + (f" (GS/SS-Cauchy {ratios['ss-cauchy']:.0f}x)" if ratios["ss-cauchy"] else ""))
    return Outcome(NAME, headline, time.perf_counter() - t0, [str(p) for p in files])


def _fmt(v) -> str:
    return "never" if v is None else f"{v:.3g}"


def _plot(ctx: Context, s, curves, nonprivate):
    eps = np.asarray(s.epsilons)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.axhline(nonprivate, **style("nonprivate"))
    for mech in ("gs", "ss-laplace", "ss-cauchy"):
        c = curves[mech]
        st = style(mech)
        ax.plot(eps, c["expected"], color=st["color"], label=st["label"] + ", expected")
        m, sd = np.asarray(c["sampled_mean"]), np.asarray(c["sampled_std"])
        ax.fill_between(eps, m - sd, m + sd, color=st["color"], alpha=0.25, linewidth=0)
        ax.plot(eps, m, linestyle="none", marker=".", color=st["color"], markersize=5)
    ax.plot([], [], linestyle="none", marker=".", color="0.3",
            label=f"sampled mean ± std ({s.repeats} draws)")
    ax.set_xscale("log")
    ax.set_xlabel("per-query privacy loss ε (log scale)")
    ax.set_ylabel("accuracy on the test queries (fraction)")
    ax.set_ylim(0.4, 1.02)
    ax.set_title(f"{ctx.plan.dataset}: single-model private prediction "
                 f"({len(ctx.dataset.y_test)} queries{', quick' if ctx.plan.quick else ''})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, ctx.experiment_dir(NAME) / "accuracy_vs_epsilon.png")
