"""What the trade-off study computes per task: the sweeps behind its Figs. 1-6 (the
comparisons of van der Maaten & Hannun, Sec. 4, with AGT added) and the winner of each
regime. Rows only; nothing is plotted or written here."""

from __future__ import annotations

from experiments.tradeoffs.methods import methods
from experiments.tradeoffs.settings import FIGURES
from experiments.tradeoffs.study import Study


def _sweep(study: Study, task: str, fig_key: str, x_name: str, xs, make) -> dict:
    """{method: [row or None per x]} for the points make(x) -> (setup, eps, delta, B); each
    point's noise is seeded by (task, fig_key, x_name, x)."""
    out: dict[str, list] = {m: [] for m in methods(task)}
    nonpriv = []
    for x in xs:
        setup, eps, delta, budget = make(x)
        nonpriv.append(setup.nonprivate)
        for m in methods(task):
            out[m].append(study.point(setup, m, eps, delta, budget, (task, fig_key, x_name, x)))
    return {"x": list(xs), "x_name": x_name, "rows": out, "nonprivate": nonpriv}


def run_figures(study: Study, task: str) -> dict:
    """Every sweep the plan's ``figures`` asks of a task (default: every figure for
    multiclass, eps and budget otherwise).

    Args:
        study: the run.
        task: ``multiclass`` or ``binary``.

    Returns:
        {sweep key (``fig1_eps_delta0``, ...): {"x", "x_name", "rows": {method: [row or
        None per x]}, "nonprivate": [accuracies per x]}}.
    """
    s = study.s
    figs = s.figures.get(task, FIGURES if task == "multiclass" else ("eps", "budget"))
    n_full = study.dataset(task).n_train
    base = study.setup(task)
    out = {}
    if "eps" in figs:
        out["fig1_eps_delta0"] = _sweep(study, task, "fig1_eps_delta0", "epsilon", s.epsilons,
                                        lambda e: (base, e, 0.0, s.budget))
        out["fig1_eps_delta"] = _sweep(study, task, "fig1_eps_delta", "epsilon", s.epsilons,
                                       lambda e: (base, e, s.delta, s.budget))
    if "budget" in figs:
        out["fig2_budget"] = _sweep(study, task, "fig2_budget", "budget", s.budgets,
                                    lambda b: (base, s.epsilon, s.delta, b))
    if "delta" in figs:
        out["fig3_delta"] = _sweep(study, task, "fig3_delta", "delta", s.deltas,
                                   lambda d: (base, s.epsilon, d, s.budget))
    if "n" in figs:
        ns = sorted({max(2 * s.teachers, int(round(f * n_full))) for f in s.train_fractions})
        out["fig4_n"] = _sweep(study, task, "fig4_n", "n_train", ns, lambda n: (
            study.setup(task, n=n), s.epsilon, s.delta, s.budget))
    if "dim" in figs:
        out["fig5_dim"] = _sweep(study, task, "fig5_dim", "pca_dim", s.dims, lambda d: (
            study.setup(task, dim=d), s.epsilon, s.delta, s.budget))
    if "lambda_t" in figs:
        out["fig6_lambda"] = _sweep(study, task, "fig6_lambda", "lambda", s.lambdas, lambda lam: (
            study.setup(task, lam=lam), s.epsilon, s.delta, s.budget))
        out["fig6_teachers"] = _sweep(study, task, "fig6_teachers", "teachers", s.teacher_grid,
                                      lambda t: (
            study.setup(task, teachers=t), s.epsilon, s.delta, s.budget))
    return out


def regimes(study: Study, task: str) -> list[dict]:
    """Which method wins per regime: B small/large x delta 0/> 0 x N small/large, at the
    plan's total epsilon. Small/large = the ends of the plan's budgets and train_fractions.

    Args:
        study: the run.
        task: ``multiclass`` or ``binary``.

    Returns:
        One entry per regime (8): its point, the winner and its family, the best method of
        each family, and every method's row.
    """
    s = study.s
    n_full = study.dataset(task).n_train
    n_small = max(2 * s.teachers, int(round(min(s.train_fractions) * n_full)))
    out = []
    for b_label, b in (("small B", min(s.budgets)), ("large B", max(s.budgets))):
        for d_label, delta in (("delta = 0", 0.0), (f"delta = {s.delta:g}", s.delta)):
            for n_label, n in (("small N", n_small), ("large N", n_full)):
                setup = study.setup(task, n=n)
                rows = [study.point(setup, m, s.epsilon, delta, b, (task, "regime", b, delta, n))
                        for m in methods(task)]
                rows = [r for r in rows if r is not None]
                best = max(rows, key=lambda r: r["mean"])
                best_of = {f: max((r for r in rows if r["family"] == f),
                                  key=lambda r: r["mean"])
                           for f in ("private training", "private prediction", "AGT")}
                out.append({"regime": f"{b_label}, {d_label}, {n_label}", "budget": b,
                            "delta_total": delta, "n_train": n, "epsilon_total": s.epsilon,
                            "winner": best["method"], "winner_family": best["family"],
                            "winner_accuracy": best["mean"],
                            "best_by_family": {f: {"method": r["method"], "mean": r["mean"],
                                                   "std": r["std"]}
                                               for f, r in best_of.items()},
                            "rows": rows})
    return out
