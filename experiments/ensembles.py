"""Fig. 4: subsample-and-aggregate, accuracy vs ensemble size T at fixed per-query epsilons.

For every T: T teachers trained with AGT on the index-mod-T parts of the private set
(agt/ensemble; each on the config's k grid cut to k < floor(n / T)), certified on the test
queries: votes and teacher radii. Mechanisms per epsilon (mechanisms/ensemble.py): noisy
argmax (lnmax: Laplace(2/eps) on the vote counts), the SS ensemble release with Cauchy and
with Laplace noise on the ensemble radius (the settings' radius_rule: min-cost by default,
the paper's Thm 5.3 sum on request), PTR on the min-cost ensemble radius (no answer
counts as wrong) and the paper's PTR variant (test at eps/2, GS fallback at eps/2).
Expected accuracy is exact; sampled accuracy is the mean +- std of simulated deployments.
Ensembles certify the replace-one relation (index partitioning).
"""

from __future__ import annotations

import time

import numpy as np

from experiments.accuracy import evaluate_seeds, mean_std
from experiments.context import Context, Outcome, markdown_table, pm
from experiments.plotting import label, plt, save, style
from mechanisms import MECHANISMS, make_mechanism
from mechanisms.ensemble import ensemble_radius, flips_needed

NAME = "ensembles"


def ensemble_mechanism(name: str, epsilon: float, delta: float | None, rule: str = "tight",
                       **options):
    """An ensemble mechanism of the registry at per-query epsilon (delta if it takes one)."""
    if name.startswith("ens-ss"):
        options = {"radius_rule": rule, **options}
    return make_mechanism(name, epsilon, delta if MECHANISMS[name].needs_delta else None,
                          **options)


def evaluate_ensembles(ctx: Context, models, y: np.ndarray, epsilons, delta: float,
                       repeats: int, rule: str, tag, mechanisms) -> dict:
    """Expected (mean +- std over the seeds' ensembles) and sampled accuracy of each
    mechanism at each epsilon."""
    inputs = [m.inputs for m in models]
    return {str(eps): {name: evaluate_seeds(ensemble_mechanism(name, eps, delta, rule), inputs,
                                            y, ctx.rngs(tag, name, eps, repeats=repeats))
                       for name in mechanisms}
            for eps in epsilons}


def run(ctx: Context) -> Outcome:
    s = ctx.plan.settings[NAME]
    t0 = time.perf_counter()
    y = ctx.dataset.y_test
    keep = _reused_sizes(ctx)
    per_t = []
    for T in ctx.bar(s.teachers, "ensembles: T"):
        models = ctx.ensembles(T, keep=T in keep)
        stats = [_stats(em, y, s.radius_rule) for em in models]
        em = models[0]
        summary = {key: mean_std([st[key] for st in stats])[0] for key in stats[0]}
        per_t.append({
            "T": T, "k_values": [em.k_values[0], em.k_values[-1], len(em.k_values)],
            "records_per_teacher": [min(em.ensemble.manifest["partition"]["sizes"]),
                                    max(em.ensemble.manifest["partition"]["sizes"])],
            **summary,
            "nonprivate_accuracy_std": mean_std([st["nonprivate_accuracy"] for st in stats])[1],
            "by_seed": stats, "relation": em.relation,
            "training_and_certification_seconds": sum(m.seconds for m in models),
            "accuracy": evaluate_ensembles(ctx, models, y, s.epsilons, s.delta, s.repeats,
                                           s.radius_rule, (NAME, T), s.mechanisms),
        })
    results = {"teachers": list(s.teachers), "epsilons": list(s.epsilons), "delta": s.delta,
               "repeats": s.repeats, "radius_rule": s.radius_rule, "n_queries": int(len(y)),
               "mechanisms": list(s.mechanisms), "training_seeds": list(ctx.seeds),
               "per_T": per_t,
               "notes": "ens-ptr: no answer (-1) counts as wrong; ens-ptr-gs: PTR at eps/2, GS "
                        "release of the ensemble answer at eps/2 where PTR gives no answer (the "
                        "paper's variant; basic composition). expected = exact, mean +- std "
                        "over the training seeds; sampled = simulated deployments of the first "
                        "seed's ensemble; every guarantee under replace-one"}
    files = [_plot(ctx, s, per_t)]
    header = ["T", "k grid", "non-private"] + [f"{label(m)}, eps={e:g}"
                                               for e in s.epsilons for m in s.mechanisms]
    rows = []
    for r in per_t:
        row = [r["T"], f"0..{r['k_values'][1]}",
               pm(r["nonprivate_accuracy"], r["nonprivate_accuracy_std"])]
        for e in s.epsilons:
            for m in s.mechanisms:
                a = r["accuracy"][str(e)][m]
                row.append(pm(a["expected"], a["expected_std"]))
        rows.append(row)
    ctx.write_table(NAME, f"# Ensembles: expected accuracy vs T ({ctx.plan.dataset})\n\n"
                          f"{len(y)} test queries; mean ± std over the training seeds "
                          f"{list(ctx.seeds)}; every row under replace-one; delta = {s.delta:g} "
                          f"per query for SS-Laplace and PTR; sampled deployments are in "
                          f"results.json.\n\n" + markdown_table(header, rows))
    ctx.write_results(NAME, {"results": results, "seconds": time.perf_counter() - t0})
    parts = []
    picks = [m for m in ("lnmax", "ens-ss-cauchy", "ens-ptr-gs", "ens-exp-radius")
             if m in s.mechanisms]
    for e in s.epsilons:
        best = {m: max(per_t, key=lambda r: r["accuracy"][str(e)][m]["expected"]) for m in picks}
        parts.append(f"eps={e:g}: " + ", ".join(
            f"{m} {best[m]['accuracy'][str(e)][m]['expected']:.3f} (T={best[m]['T']})"
            for m in best))
    headline = "best over T -- " + "; ".join(parts)
    return Outcome(NAME, headline, time.perf_counter() - t0, [str(p) for p in files])


def _stats(em, y: np.ndarray, rule: str) -> dict:
    """Owner-side statistics of one ensemble on the test queries."""
    cert = em.cert
    teacher_acc = (cert.teacher_predictions == y[:, None]).mean(axis=0)
    radius = ensemble_radius(cert.teacher_predictions, cert.teacher_radii, rule, cert.n_classes)
    return {"nonprivate_accuracy": float(np.mean(em.answer == y)),
            "teacher_accuracy_mean": float(teacher_acc.mean()),
            "teacher_accuracy_min": float(teacher_acc.min()),
            "teacher_radius_mean": float(np.maximum(cert.teacher_radii, 0).mean()),
            "ensemble_radius_mean": float(radius.mean()),
            "ensemble_radius_median": float(np.median(radius)),
            "flips_mean": float(flips_needed(cert.teacher_predictions, cert.n_classes).mean())}


def _reused_sizes(ctx: Context) -> set[int]:
    """Ensemble sizes later experiments of this run reuse (kept in memory)."""
    out = set()
    for name in ("budget", "teacher"):
        if name in ctx.plan.settings:
            out.add(int(ctx.plan.settings[name].teachers))
    return out


def _plot(ctx: Context, s, per_t):
    Ts = [r["T"] for r in per_t]
    fig, axes = plt.subplots(1, len(s.epsilons), figsize=(5.2 * len(s.epsilons), 4.4),
                             sharey=True, squeeze=False)
    for ax, e in zip(axes[0], s.epsilons):
        ax.plot(Ts, [r["nonprivate_accuracy"] for r in per_t], **style("nonprivate"))
        for m in s.mechanisms:
            st = style(m)
            mean = np.array([r["accuracy"][str(e)][m]["expected"] for r in per_t])
            sd = np.array([r["accuracy"][str(e)][m]["expected_std"] for r in per_t])
            ax.plot(Ts, mean, marker="o", markersize=3, **st)
            ax.fill_between(Ts, mean - sd, mean + sd, color=st["color"], alpha=0.2, linewidth=0)
        ax.set_title(f"per-query ε = {e:g}")
        ax.set_xlabel("ensemble size T (teachers)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy on the test queries (fraction)")
    axes[0][0].set_ylim(-0.02, 1.02)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{ctx.plan.dataset}: private prediction with T-teacher ensembles "
                 f"(lines: expected mean over {len(ctx.seeds)} seeds, bands: ± std over seeds)"
                 f"{' [quick]' if ctx.plan.quick else ''}",
                 fontsize=10)
    fig.tight_layout()
    return save(fig, ctx.experiment_dir(NAME) / "accuracy_vs_teachers.png")
