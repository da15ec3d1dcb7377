"""Fig. 4: subsample-and-aggregate, accuracy vs ensemble size T at fixed per-query epsilons.

For every T: T teachers trained with AGT on the index-mod-T parts of the private set
(agt/ensemble.py; each on the config's k grid cut to k < floor(n / T)), certified on the test
queries: votes and teacher radii. Mechanisms per epsilon (mechanisms/ensemble.py): noisy
argmax (lnmax: Laplace(2/eps) on the vote counts), the SS ensemble release with Cauchy and
with Laplace noise on the Thm 5.3 radius, PTR on the min-cost ensemble radius (no answer
counts as wrong) and the paper's PTR variant (test at eps/2, GS fallback at eps/2).
Expected accuracy is exact; sampled accuracy is the mean +- std of simulated deployments.
Ensembles certify the replace-one relation (index partitioning).
"""

from __future__ import annotations

import time

import numpy as np

from mechanisms import MECHANISMS, make_mechanism
from mechanisms.ensemble import ensemble_radius, flips_needed

from experiments.accuracy import evaluate
from experiments.context import Context, Outcome, markdown_table
from experiments.plotting import ENSEMBLE_LABELS, plt, save, style

NAME = "ensembles"
ENSEMBLE_MECHANISMS = ("lnmax", "ens-ss-laplace", "ens-ss-cauchy", "ens-ptr", "ens-ptr-gs")


def ensemble_mechanism(name: str, epsilon: float, delta: float, rule: str = "thm5.3"):
    """An ensemble mechanism of the registry at per-query epsilon (delta if it takes one)."""
    options = {"radius_rule": rule} if name.startswith("ens-ss") else {}
    return make_mechanism(name, epsilon, delta if MECHANISMS[name].needs_delta else None,
                          **options)


def evaluate_ensemble(ctx: Context, em, y: np.ndarray, epsilons, delta: float, repeats: int,
                      rule: str, tag, mechanisms=ENSEMBLE_MECHANISMS) -> dict:
    """Expected and sampled accuracy of each mechanism at each epsilon (one ensemble)."""
    out = {}
    for eps in epsilons:
        out[str(eps)] = {name: evaluate(ensemble_mechanism(name, eps, delta, rule), em.inputs, y,
                                        ctx.rngs(tag, name, eps, repeats=repeats))
                         for name in mechanisms}
    return out


def run(ctx: Context) -> Outcome:
    s = ctx.plan.settings[NAME]
    t0 = time.perf_counter()
    y = ctx.dataset.y_test
    keep = _reused_sizes(ctx)
    per_t = []
    for T in ctx.bar(s.teachers, "ensembles: T"):
        em = ctx.ensemble(T, keep=T in keep)
        cert = em.cert
        teacher_acc = (cert.teacher_predictions == y[:, None]).mean(axis=0)
        rule_radius = ensemble_radius(cert.teacher_predictions, cert.teacher_radii,
                                      s.radius_rule, cert.n_classes)
        per_t.append({
            "T": T, "k_values": [em.k_values[0], em.k_values[-1], len(em.k_values)],
            "records_per_teacher": [min(em.ensemble.manifest["partition"]["sizes"]),
                                    max(em.ensemble.manifest["partition"]["sizes"])],
            "nonprivate_accuracy": float(np.mean(em.answer == y)),
            "teacher_accuracy_mean": float(teacher_acc.mean()),
            "teacher_accuracy_min": float(teacher_acc.min()),
            "teacher_radius_mean": float(np.maximum(cert.teacher_radii, 0).mean()),
            "ensemble_radius_mean": float(rule_radius.mean()),
            "ensemble_radius_median": float(np.median(rule_radius)),
            "flips_mean": float(flips_needed(cert.teacher_predictions, cert.n_classes).mean()),
            "relation": em.relation, "ensemble_id": em.ensemble.ensemble_id,
            "training_and_certification_seconds": em.seconds,
            "accuracy": evaluate_ensemble(ctx, em, y, s.epsilons, s.delta, s.repeats,
                                          s.radius_rule, (NAME, T)),
        })
    results = {"teachers": list(s.teachers), "epsilons": list(s.epsilons), "delta": s.delta,
               "repeats": s.repeats, "radius_rule": s.radius_rule, "n_queries": int(len(y)),
               "per_T": per_t,
               "notes": "ens-ptr: no answer (-1) counts as wrong; ens-ptr-gs: PTR at eps/2, GS "
                        "release of the ensemble answer at eps/2 where PTR gives no answer (the "
                        "paper's variant; basic composition). expected = exact, sampled = "
                        "simulated deployments; every guarantee under replace-one"}
    files = [_plot(ctx, s, per_t)]
    header = ["T", "k grid", "non-private"] + [f"{ENSEMBLE_LABELS[m]}, eps={e:g}"
                                               for e in s.epsilons for m in ENSEMBLE_MECHANISMS]
    rows = []
    for r in per_t:
        row = [r["T"], f"0..{r['k_values'][1]}", f"{r['nonprivate_accuracy']:.4f}"]
        for e in s.epsilons:
            for m in ENSEMBLE_MECHANISMS:
                row.append(f"{r['accuracy'][str(e)][m]['expected']:.4f}")
        rows.append(row)
    ctx.write_table(NAME, f"# Ensembles: expected accuracy vs T ({ctx.plan.dataset})\n\n"
                          f"{len(y)} test queries; delta = {s.delta:g} for SS-Laplace and PTR; "
                          f"sampled means and stds are in results.json.\n\n"
                          + markdown_table(header, rows))
    ctx.write_results(NAME, {"results": results, "seconds": time.perf_counter() - t0})
    parts = []
    for e in s.epsilons:
        best = {m: max(per_t, key=lambda r: r["accuracy"][str(e)][m]["expected"])
                for m in ("lnmax", "ens-ss-cauchy", "ens-ptr-gs")}
        parts.append(f"eps={e:g}: " + ", ".join(
            f"{m} {best[m]['accuracy'][str(e)][m]['expected']:.3f} (T={best[m]['T']})"
            for m in best))
    headline = "best over T -- " + "; ".join(parts)
    return Outcome(NAME, headline, time.perf_counter() - t0, [str(p) for p in files])


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
        for m in ("lnmax", "ens-ss-cauchy", "ens-ss-laplace", "ens-ptr-gs", "ens-ptr"):
            st = style(m, label=ENSEMBLE_LABELS[m])
            mean = np.array([r["accuracy"][str(e)][m]["sampled_mean"] for r in per_t])
            sd = np.array([r["accuracy"][str(e)][m]["sampled_std"] for r in per_t])
            ax.plot(Ts, [r["accuracy"][str(e)][m]["expected"] for r in per_t],
                    marker="o", markersize=3, **st)
            ax.fill_between(Ts, mean - sd, mean + sd, color=st["color"], alpha=0.2, linewidth=0)
        ax.set_title(f"per-query ε = {e:g}")
        ax.set_xlabel("ensemble size T (teachers)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy on the test queries (fraction)")
    axes[0][0].set_ylim(-0.02, 1.02)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{ctx.plan.dataset}: private prediction with T-teacher ensembles "
                 f"(lines: expected, bands: sampled ± std){' [quick]' if ctx.plan.quick else ''}",
                 fontsize=10)
    fig.tight_layout()
    return save(fig, ctx.experiment_dir(NAME) / "accuracy_vs_teachers.png")
