"""Teacher table (paper section 6, "Use in teacher models"): label a public set privately,
train a student on the labels, report the student's accuracy.

Public set: the first max(n_public) records of the held-out test split (unlabelled queries;
their true labels are used only to report label accuracy); the student is evaluated on the
remaining test records, disjoint from the public ones. For each n_public = Q, the per-query
epsilon is the largest whose Q-fold composition fits (epsilon_total, delta_total) under the
plan's accountant ('best' = the paper's composition). Teachers, as in Fig. 5: the single AGT
model (GS, and SS with Cauchy noise) and the T-teacher ensemble (GS noisy argmax, SS ensemble
with Cauchy noise). Every release is a seeded draw of the mechanism's release function;
`repeats` draws, each followed by training a fresh student, give mean +- std. The student is
a plain (nominal, non-AGT) model with the teachers' architecture and training config plus
`student_overrides` (agt.student.train_student). DP-SGD trains the private model itself
to (epsilon_total, delta_total) under replace-one and needs no student: its row is that
model's accuracy on the same evaluation records. Every row is under replace-one.
"""

from __future__ import annotations

import time

import numpy as np

from agt.baselines.dpsgd import evaluate
from agt.errors import ConfigError
from agt.student import train_student
from experiments.accuracy import expected_accuracy, mean_std, simulate
from experiments.context import Context, Outcome, markdown_table, pm
from experiments.ensembles import ensemble_mechanism
from experiments.plotting import plt, save, style
from experiments.single import single_mechanism
from mechanisms.accounting import per_query_epsilon
from mechanisms.pate import sigmas_for_budget

NAME = "teacher"
ROWS = ("single-gs", "single-ss", "single-exp", "single-svt", "sa-gs", "sa-ss", "sa-exp",
        "sa-svt", "sa-gnmax", "sa-cgnmax")
ROW_LABELS = {"single-gs": "Single model, GS", "single-ss": "Single model, SS",
              "single-exp": "Single model, exp. mechanism on the radius",
              "single-svt": "Single model, gated session",
              "sa-gs": "Subsample & agg., GS", "sa-ss": "Subsample & agg., SS",
              "sa-exp": "Subsample & agg., exp. mechanism on the radius",
              "sa-svt": "Subsample & agg., gated session",
              "sa-gnmax": "Subsample & agg., GNMax (Renyi)",
              "sa-cgnmax": "Subsample & agg., Confident-GNMax (Renyi)", "dp-sgd": "DP-SGD"}
# The paper's teacher table (section 6), student accuracy in %. Its Blobs DP-SGD entry reads
# "1.0": the paper's Fig. 5 script draws DP-SGD on Blobs at accuracy 1 (a fraction), so it
# is 100 % printed as a fraction.
PAPER = {
    "blobs": {"single-gs": 82.8, "single-ss": 99.8, "sa-gs": 99.5, "sa-ss": 98.1, "dp-sgd": 1.0},
    "octmnist": {"single-gs": 12.7, "single-ss": 18.7, "sa-gs": 14.1, "sa-ss": 19.8,
                 "dp-sgd": 81.2},
    "imdb": {"single-gs": 54.4, "single-ss": 73.5, "sa-gs": 73.0, "sa-ss": 71.7, "dp-sgd": 70.5},
}


def run(ctx: Context) -> Outcome:
    s = ctx.plan.settings[NAME]
    t0 = time.perf_counter()
    ds = ctx.dataset
    n_max = max(s.n_public)
    if ds.n_test < n_max + 2:
        raise ConfigError(f"settings.teacher.n_public up to {n_max} needs a test split of more "
                          f"than {n_max} records (the rest evaluates the student); it has "
                          f"{ds.n_test}")
    x_eval, y_eval = ds.x_test[n_max:], ds.y_test[n_max:]
    singles = ctx.singles()
    ensembles = ctx.ensembles(s.teachers)
    single, em = singles[0], ensembles[0]
    student_cfg = ctx.config.replace(k_values=[0], **s.student_overrides)
    runs = ctx.dpsgd(s.epsilon_total, s.delta_total, s.dpsgd, s.dpsgd_seeds)
    dp_acc = [evaluate(r, None, x_eval, y_eval) for r in runs]
    per_q = []
    for q in ctx.bar(sorted(s.n_public), "teacher: public set sizes"):
        eps = per_query_epsilon(s.epsilon_total, s.delta_total, q, 0.0, s.accountant)
        x_pub, y_pub = ds.x_test[:q], ds.y_test[:q]
        sub = slice(0, q)
        mechanisms = {
            "single-gs": single_mechanism("gs", eps, None),
            "single-ss": single_mechanism("ss-cauchy", eps, None),
            "single-exp": single_mechanism("exp-radius", eps, None),
            "single-svt": single_mechanism("svt", s.epsilon_total, s.delta_total,
                                           cutoff=s.gate_cutoff),
            "sa-gs": ensemble_mechanism("lnmax", eps, None),
            "sa-ss": ensemble_mechanism("ens-ss-cauchy", eps, None),
            "sa-exp": ensemble_mechanism("ens-exp-radius", eps, None),
            "sa-svt": ensemble_mechanism("ens-svt", s.epsilon_total, s.delta_total,
                                         cutoff=s.gate_cutoff),
            # PATE 2018: the sigmas whose q-fold Renyi composition fits the same total
            # (public: the budget, Q and T only); threshold 0.8 T as PATE's MNIST setting
            "sa-gnmax": ensemble_mechanism(
                "gnmax", 1e6, s.delta_total,
                sigma=sigmas_for_budget(s.epsilon_total, s.delta_total, q)[0]),
            "sa-cgnmax": _confident(s, q)}
        rows = {}
        for name in ctx.bar(ROWS, f"teacher: students (Q={q})"):
            mechanism = mechanisms[name]
            models = singles if name.startswith("single") else ensembles
            inputs = [m.inputs.subset(sub) for m in models]
            label_acc, student_acc = [], []
            # repeat j releases from the model of training seed j mod (number of seeds): the
            # spread covers both the training seed and the noise
            for j, rng in enumerate(ctx.rngs(NAME, q, name, repeats=s.repeats)):
                labels = simulate(mechanism, inputs[j % len(inputs)], rng)
                label_acc.append(float(np.mean(labels == y_pub)))
                if (labels >= 0).any():
                    acc, _ = train_student(student_cfg, x_pub, labels, x_eval, y_eval)
                else:
                    acc = float("nan")
                student_acc.append(float(acc))
            expected = mean_std([expected_accuracy(mechanism, i, y_pub) for i in inputs])[0]
            rows[name] = {"label_accuracy_expected": expected,
                          "label_accuracy": label_acc, "student_accuracy": student_acc,
                          "student_accuracy_mean": _nanmean_std(student_acc)[0],
                          "student_accuracy_std": _nanmean_std(student_acc)[1]}
        clean, _ = train_student(student_cfg, x_pub, y_pub, x_eval, y_eval)
        per_q.append({"n_public": q, "epsilon_per_query": eps, "rows": rows,
                      "student_on_true_labels": float(clean)})
    results = {
        "epsilon_total": s.epsilon_total, "delta_total": s.delta_total,
        "accountant": s.accountant, "teachers": s.teachers, "repeats": s.repeats,
        "n_public": sorted(s.n_public), "main": s.main, "n_eval": int(len(y_eval)),
        "per_n_public": per_q,
        "dp_sgd": {"accuracy": dp_acc, "accuracy_mean": mean_std(dp_acc)[0],
                   "accuracy_std": mean_std(dp_acc)[1], "runs": [r.to_json_dict() for r in runs]},
        "teacher_nonprivate_accuracy_on_eval": {
            "single": float(np.mean(single.cert.prediction[n_max:] == y_eval)),
            "ensemble": float(np.mean(em.answer[n_max:] == y_eval))},
        "student_config_overrides": dict(s.student_overrides),
        "paper_percent": PAPER.get(ctx.plan.dataset),
        "notes": "SS rows use Cauchy noise (eps-DP), as the paper's Fig. 5; exp rows the "
                 "exponential mechanism on the radius at the same per-query epsilon; svt rows "
                 "one stability-gated session of the whole budget over the Q public queries; "
                 "the paper's Blobs DP-SGD entry '1.0' is 100 % written as a fraction; every "
                 "row under replace-one (DP-SGD trained to the add-remove target that converts "
                 "to it); repeat j uses the model of training seed j mod (number of seeds)",
        "training_seeds": list(ctx.seeds),
    }
    main = next(p for p in per_q if p["n_public"] == s.main)
    files = [_plot(ctx, s, main, dp_acc)]
    paper = PAPER.get(ctx.plan.dataset, {})
    header = ["Teacher mechanism"] + [f"student acc, Q={p['n_public']} (eps/query "
                                      f"{p['epsilon_per_query']:.3g})" for p in per_q] \
        + [f"label acc, Q={s.main}", "paper (%)"]
    rows = []
    for name in ROWS:
        rows.append([ROW_LABELS[name]]
                    + [pm(100 * p["rows"][name]["student_accuracy_mean"],
                          100 * p["rows"][name]["student_accuracy_std"], 1) for p in per_q]
                    + [f"{100 * main['rows'][name]['label_accuracy_expected']:.1f}",
                       paper.get(name, "")])
    paper_dp = paper.get("dp-sgd", "")
    if ctx.plan.dataset == "blobs":
        paper_dp = "1.0 (= 100, a fraction)"
    rows.append([ROW_LABELS["dp-sgd"]] + [pm(100 * mean_std(dp_acc)[0],
                                             100 * mean_std(dp_acc)[1], 1)] * len(per_q)
                + ["(no labels)", paper_dp])
    ctx.write_table(NAME, f"# Teacher table: student accuracy in % ({ctx.plan.dataset})\n\n"
                    f"Total budget ({s.epsilon_total:g}, {s.delta_total:g}) for Q public labels, "
                    f"per-query epsilon by the {s.accountant} accountant; T = {s.teachers}; "
                    f"students evaluated on {len(y_eval)} held-out test records; mean ± std "
                    f"over {s.repeats} label draws (draw j from the model of training seed "
                    f"{list(ctx.seeds)}[j mod {len(ctx.seeds)}]; DP-SGD: {len(dp_acc)} run(s)). "
                    f"SS = Cauchy; exp = exponential mechanism on the radius at the same "
                    f"per-query epsilon; gated session = one sparse-vector session of the whole "
                    f"budget (cutoff {s.gate_cutoff}). Every row under replace-one. "
                    f"The paper's Blobs DP-SGD '1.0' is 100 % printed as a fraction.\n\n"
                    + markdown_table(header, rows))
    ctx.write_results(NAME, {"results": results, "seconds": time.perf_counter() - t0})
    headline = (f"Q={s.main} (eps/query {main['epsilon_per_query']:.3g}): "
                + ", ".join(f"{n} {100 * main['rows'][n]['student_accuracy_mean']:.1f}"
                            for n in ROWS)
                + f", DP-SGD {100 * mean_std(dp_acc)[0]:.1f} %"
                + (" (paper " + "/".join(str(paper[k]) for k in paper) + ")" if paper else ""))
    return Outcome(NAME, headline, time.perf_counter() - t0, [str(p) for p in files])


def _confident(s, q: int):
    sigma2, sigma1 = sigmas_for_budget(s.epsilon_total, s.delta_total, q, confident=True)
    return ensemble_mechanism("confident-gnmax", 1e6, s.delta_total,
                              threshold=0.8 * s.teachers, sigma1=sigma1, sigma2=sigma2)


def _nanmean_std(values) -> tuple[float, float]:
    """Mean and std over the draws that trained a student (a draw that answered nothing
    trains none)."""
    a = np.asarray(values, dtype=np.float64)
    a = a[np.isfinite(a)]
    return (float(a.mean()), float(a.std())) if a.size else (float("nan"), float("nan"))


def _plot(ctx: Context, s, main, dp_acc):
    names = list(ROWS) + ["dp-sgd"]
    means = [main["rows"][n]["student_accuracy_mean"] for n in ROWS] + [float(np.mean(dp_acc))]
    stds = [main["rows"][n]["student_accuracy_std"] for n in ROWS] + [float(np.std(dp_acc))]
    labels = [main["rows"][n]["label_accuracy_expected"] for n in ROWS] + [np.nan]
    kinds = {"gs": "gs", "ss": "ss-cauchy", "exp": "exp-radius", "svt": "svt",
             "gnmax": "gnmax", "cgnmax": "confident-gnmax"}
    colors = [style(kinds[n.split("-")[1]])["color"] for n in ROWS] + ["0.2"]
    fig, ax = plt.subplots(figsize=(9.5, 4.6))
    xs = np.arange(len(names))
    ax.bar(xs, means, yerr=stds, color=colors, alpha=0.8, capsize=4,
           label="student accuracy (mean ± std)")
    ax.plot(xs, labels, linestyle="none", marker="D", color="tab:orange",
            label="expected label accuracy on the public set")
    paper = PAPER.get(ctx.plan.dataset)
    if paper:
        vals = [np.nan if n not in paper else paper[n] / 100.0
                if n != "dp-sgd" or ctx.plan.dataset != "blobs" else paper[n] for n in names]
        ax.plot(xs, vals, linestyle="none", marker="x", color="black", markersize=8,
                label="paper (student accuracy)")
    ax.set_xticks(xs, [ROW_LABELS[n].replace(", ", ",\n") for n in names], rotation=20,
                  fontsize=7)
    ax.set_ylabel("accuracy on held-out records (fraction)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"{ctx.plan.dataset}: students of private teachers, Q = {main['n_public']} "
                 f"labels, total (ε, δ) = ({s.epsilon_total:g}, {s.delta_total:g})"
                 f"{' [quick]' if ctx.plan.quick else ''}", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    return save(fig, ctx.experiment_dir(NAME) / "student_accuracy.png")
