"""Fig. 2: single-model private prediction, accuracy vs per-query epsilon.

One AGT model per training seed on the whole private set (`Context.singles`), its nominal
predictions and stability radii on the test queries. Per epsilon of the grid, every
mechanism of the plan (registry names, all under replace-one):
  gs          1[f + Laplace(1/eps) > 1/2]                       P(flip) = exp(-eps/2) / 2
  ss-laplace  Laplace(2S/eps), S = exp(-beta r), beta = eps / (2 ln(2/delta))
  ss-cauchy   Cauchy(6S/eps), beta = eps / 6
  exp-radius  exponential mechanism on the radius, P(flip) = w / (1 + w), w = e^{-eps (r+1)}
  ptr         the certified class where r + Laplace(1/eps) > ln(1/delta)/eps, else no answer
Accuracy = mean over queries of P(release = true label): exact from the closed forms
("expected", mean +- std over the training seeds), and from `repeats` simulated deployments
of the first seed's model ("sampled"). "Keeps the noise-free accuracy from eps_keep on": the
smallest grid epsilon from which every larger grid epsilon has mean expected accuracy >=
mean noise-free accuracy - tolerance; the paper's claim is eps_keep(GS) / eps_keep(SS) >= 10.
"""

from __future__ import annotations

import time

import numpy as np

from experiments.accuracy import RELATION, evaluate_seeds, expected_accuracy, mean_std
from experiments.context import Context, Outcome, markdown_table, pm
from experiments.plotting import label, plt, save, style
from mechanisms import MECHANISMS, make_mechanism

NAME = "single"


def single_mechanism(name: str, epsilon: float, delta: float | None, **options):
    """A single-model mechanism of the registry at per-query epsilon (delta if it takes one)."""
    return make_mechanism(name, epsilon, delta if MECHANISMS[name].needs_delta else None,
                          **options)


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
    models = ctx.singles()
    y = ctx.dataset.y_test
    inputs = [m.inputs for m in models]
    nonprivate_by_seed = [float(np.mean(m.cert.prediction == y)) for m in models]
    nonprivate, nonprivate_std = mean_std(nonprivate_by_seed)
    keys = ("expected", "expected_std", "expected_by_seed", "sampled_mean", "sampled_std",
            "sampled")
    curves = {m: {k: [] for k in keys} for m in s.mechanisms}
    for eps in ctx.bar(s.epsilons, "single: epsilon grid"):
        for name in s.mechanisms:
            r = evaluate_seeds(single_mechanism(name, eps, s.delta), inputs, y,
                               ctx.rngs(NAME, name, eps, repeats=s.repeats))
            for key in keys:
                curves[name][key].append(r[key])
    reported = {}
    for eps in s.report_epsilons:
        reported[str(eps)] = {}
        for name in s.mechanisms:
            mech = single_mechanism(name, eps, s.delta)
            by_seed = [expected_accuracy(mech, i, y) for i in inputs]
            m, sd = mean_std(by_seed)
            reported[str(eps)][name] = {"expected": m, "expected_std": sd,
                                        "expected_by_seed": by_seed}
    target = nonprivate - s.tolerance
    keep = {m: keeps_from(s.epsilons, curves[m]["expected"], target) for m in s.mechanisms}
    ratios = {m: (keep["gs"] / keep[m] if keep.get("gs") and keep[m] else None)
              for m in s.mechanisms if m != "gs"}
    radii = np.concatenate([np.maximum(m.cert.radius, 0) for m in models])
    values, counts = np.unique(radii, return_counts=True)
    kv = models[0].bundle.k_values
    results = {
        "epsilons": list(s.epsilons), "delta": s.delta, "repeats": s.repeats,
        "mechanisms": list(s.mechanisms), "training_seeds": list(ctx.seeds),
        "n_queries": int(len(y)), "nonprivate_accuracy": nonprivate,
        "nonprivate_accuracy_std": nonprivate_std, "nonprivate_by_seed": nonprivate_by_seed,
        "accuracy": curves, "at_reported_epsilons": reported,
        "keeps_nonprivate_from_epsilon": keep, "tolerance": s.tolerance,
        "gs_over_mechanism_epsilon_ratio": ratios,
        "radius": {"mean": float(radii.mean()), "median": float(np.median(radii)),
                   "histogram": {"values": values, "counts": counts},
                   "k_values": [kv[0], kv[-1], len(kv)],
                   "contiguous_grid": models[0].cert.contiguous},
        "models": [{"seed": seed, "bundle_id": m.bundle.bundle_id,
                    "relations_certified": list(m.bundle.relations),
                    "training_and_certification_seconds": m.seconds}
                   for seed, m in zip(ctx.seeds, models)],
        "relation": RELATION,
        "notes": "expected = exact mean of P(release = label) from the mechanisms' closed "
                 "forms, mean +- std over the training seeds; sampled = simulated deployments "
                 "of the first seed's model through in-memory ledgers (seeded); every "
                 "guarantee under replace-one",
    }
    files = [_plot(ctx, s, curves, nonprivate)]
    header = ["epsilon"] + [label(m) for m in s.mechanisms]
    rows = [[f"{eps:.3g}"] + [pm(curves[m]["expected"][i], curves[m]["expected_std"][i])
                              for m in s.mechanisms] for i, eps in enumerate(s.epsilons)]
    table = (f"# Single model: accuracy vs per-query epsilon ({ctx.plan.dataset})\n\n"
             f"Non-private accuracy {pm(nonprivate, nonprivate_std)} on {len(y)} test queries; "
             f"cells: expected accuracy, mean ± std over the training seeds {list(ctx.seeds)} "
             f"(the sampled deployments are in results.json). Every row is under replace-one; "
             f"SS-Laplace and PTR use delta = {s.delta:g} per query.\n\n"
             + markdown_table(header, rows)
             + f"\n\nKeeps the non-private accuracy (within {s.tolerance:g}) from epsilon: "
             + ", ".join(f"{m} {_fmt(keep[m])}" for m in s.mechanisms) + "\n"
             + "\n## At the reported epsilons\n\n"
             + markdown_table(["epsilon"] + [label(m) for m in s.mechanisms],
                              [[f"{e:g}"] + [pm(reported[str(e)][m]["expected"],
                                                reported[str(e)][m]["expected_std"])
                                             for m in s.mechanisms] for e in s.report_epsilons])
             + "\n")
    ctx.write_table(NAME, table)
    ctx.write_results(NAME, {"results": results, "seconds": time.perf_counter() - t0})
    picks = [m for m in ("gs", "ss-cauchy", "exp-radius") if m in s.mechanisms]
    headline = (f"non-private {nonprivate:.3f} ({len(ctx.seeds)} seeds); keeps it from eps "
                + ", ".join(f"{m} {_fmt(keep[m])}" for m in picks))
    return Outcome(NAME, headline, time.perf_counter() - t0, [str(p) for p in files])


def _fmt(v) -> str:
    return "never" if v is None else f"{v:.3g}"


def _plot(ctx: Context, s, curves, nonprivate):
    eps = np.asarray(s.epsilons)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.axhline(nonprivate, **style("nonprivate"))
    for mech in s.mechanisms:
        c = curves[mech]
        st = style(mech)
        m, sd = np.asarray(c["expected"]), np.asarray(c["expected_std"])
        ax.plot(eps, m, color=st["color"], linestyle=st.get("linestyle", "-"), label=st["label"])
        ax.fill_between(eps, m - sd, m + sd, color=st["color"], alpha=0.2, linewidth=0)
        ax.plot(eps, c["sampled_mean"], linestyle="none", marker=".", color=st["color"],
                markersize=4)
    ax.plot([], [], linestyle="none", marker=".", color="0.3",
            label=f"sampled mean, seed {ctx.seed} ({s.repeats} deployments)")
    ax.set_xscale("log")
    ax.set_xlabel("per-query privacy loss ε (replace-one, log scale)")
    ax.set_ylabel("accuracy on the test queries (fraction)")
    ax.set_ylim(0.4, 1.02)
    ax.set_title(f"{ctx.plan.dataset}: single-model private prediction "
                 f"({len(ctx.dataset.y_test)} queries; mean ± std over {len(ctx.seeds)} "
                 f"seeds{', quick' if ctx.plan.quick else ''})", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    return save(fig, ctx.experiment_dir(NAME) / "accuracy_vs_epsilon.png")
