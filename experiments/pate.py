"""The PATE table: teacher labels from LNMax, GNMax and Confident-GNMax (data-independent,
data-dependent + sanitised, and with AGT radii as the distance), under one relation.

Setting. A T-teacher AGT ensemble is trained on the private training split (replace-one;
teacher t on the records t, t + T, ...); the public set is the first `n_public` test records
(unlabelled queries; their labels only score the released labels); the student is a
scikit-learn logistic regression trained on the answered public queries and scored on the
remaining test records. Every release goes through an rdp ledger (one per run, budget
large enough not to stop it: this table measures costs, it does not ration them).

Parameters are fixed a priori from the number of teachers T only (never from the votes or
from accuracy): threshold T_c = 0.8 T, sigma_1 = 0.6 T, sigma_2 = 0.16 T (the PATE 2018
MNIST setting, T = 250, T_c = 200, sigma_1 = 150, sigma_2 = 40, scaled with T); gnmax at
sigma_2; lnmax at the per-query eps for which its noise scale 2 / eps is sigma_2 / 2 (a
like-for-like noise level, also a function of T only). The Renyi order
of the sanitised release, beta and sigma_s are chosen on a public surrogate
(`surrogate_plan`: Q histograms with 90 % of the votes on one class).

Rows per mechanism (mean +- std over `seeds` release draws): answered queries, eps
(data-independent, composed by the ledger; data-dependent, owner-only, shown here because
this is the owner's own evaluation; sanitised, the released estimate, from PATE's plain
distance and from the AGT distance: the same release analysed twice and each estimate drawn
with the same noise, so the two differ only in the analysis), label accuracy on the answered
queries, student accuracy, and answered per unit of sanitised (or, where none exists,
data-independent) eps. results.json also holds the smooth sensitivities (owner-only).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agt.config import load_config
from agt.data import load_dataset
from agt.errors import ConfigError
from mechanisms import make_mechanism
from mechanisms.inputs import Votes
from mechanisms.ledger import Ledger
from mechanisms.noise import REFUSED
from mechanisms.pate_costs import SanitisedCost, data_dependent_report, surrogate_plan

DELTA = 1e-5
ROWS = ("lnmax", "gnmax", "confident-gnmax")


@dataclass(frozen=True)
class PateSetting:
    """One table: a training config, the teacher counts, the public set size, the seeds."""

    name: str
    config: str
    teachers: tuple[int, ...]
    n_public: int
    seeds: tuple[int, ...]


def settings(quick: bool) -> list[PateSetting]:
    """The plan: Blobs with 250 teachers of 20 records (the issue's setting) and 25 of 200
    (the AGT paper's ensemble), digits with 16, 32 and 64 teachers (quick: fewer teachers
    and seeds, for tests)."""
    root = Path(__file__).resolve().parent.parent / "configs"
    if quick:
        return [PateSetting("blobs", str(root / "blobs.yaml"), (25,), 200, (0, 1)),
                PateSetting("digits", str(root / "digits_stability.yaml"), (16,), 150, (0,))]
    return [PateSetting("blobs", str(root / "blobs.yaml"), (25, 250), 640, (0, 1, 2)),
            PateSetting("digits", str(root / "digits_stability.yaml"), (16, 32, 64), 200,
                        (0, 1, 2))]


def _votes(setting: PateSetting, n_teachers: int, progress: bool):
    from agt.ensemble import EnsembleCertifier, train_ensemble

    cfg = load_config(setting.config)
    ds = load_dataset(cfg.data.name, cfg.data.options, Path(setting.config).parent)
    batch = cfg.batch_for(ds.n_train // n_teachers)
    cfg = cfg.replace(k_values=list(cfg.k_values.below(batch)))
    t0 = time.perf_counter()
    ens = train_ensemble(cfg, ds, n_teachers, progress=progress)
    x_pub, y_pub = ds.x_test[:setting.n_public], ds.y_test[:setting.n_public]
    x_eval, y_eval = ds.x_test[setting.n_public:], ds.y_test[setting.n_public:]
    cert = EnsembleCertifier(ens).certify(x_pub)
    votes = Votes.from_certificate(cert)
    return votes, (x_pub, y_pub, x_eval, y_eval), time.perf_counter() - t0


def _student(x, labels, x_eval, y_eval) -> float:
    from sklearn.linear_model import LogisticRegression

    keep = labels != REFUSED
    if keep.sum() < 2 or len(np.unique(labels[keep])) < 2:
        return math.nan
    model = LogisticRegression(max_iter=2000).fit(x[keep], labels[keep])
    return float((model.predict(x_eval) == y_eval).mean())


def _mechanisms(n_teachers: int) -> dict:
    sigma2, sigma1, threshold = 0.16 * n_teachers, 0.6 * n_teachers, 0.8 * n_teachers
    lnmax_eps = 4.0 / sigma2                     # noise scale 2 / eps = sigma_2 / 2
    big = 1e6                                    # per-query eps caps: the sigmas decide
    return {
        "lnmax": make_mechanism("lnmax", lnmax_eps),
        "gnmax": make_mechanism("gnmax", big, DELTA, sigma=sigma2),
        "confident-gnmax": make_mechanism("confident-gnmax", big, DELTA, threshold=threshold,
                                          sigma1=sigma1, sigma2=sigma2),
    }


def run_table(setting: PateSetting, n_teachers: int, progress: bool = False) -> dict:
    """The rows of one (dataset, T) cell (module docstring)."""
    votes, (x_pub, y_pub, x_eval, y_eval), train_s = _votes(setting, n_teachers, progress)
    mechs = _mechanisms(n_teachers)
    rows: dict[str, list[dict]] = {r: [] for r in ROWS}
    for seed in setting.seeds:
        for key in ROWS:
            mech = mechs[key]
            rng = np.random.default_rng([seed, ROWS.index(key), n_teachers])  # experiments only
            ledger = Ledger.in_memory(1e6, DELTA, "rdp")
            labels = ledger.release(mech, votes, insecure_rng=rng).labels
            report = data_dependent_report(mech, votes, labels, DELTA)
            answered = labels != REFUSED
            row = {"answered": int(answered.sum()),
                   "eps_independent": ledger.spent().epsilon,
                   "eps_dependent": report.eps_dependent,
                   "label_accuracy": float((labels[answered] == y_pub[answered]).mean())
                   if answered.any() else math.nan,
                   "student_accuracy": _student(x_pub, labels, x_eval, y_eval)}
            if key != "lnmax":
                # the same release analysed twice, plain and with the AGT distance, and each
                # estimate drawn with the same noise: they differ only in the analysis
                plan = surrogate_plan(mech, votes.n_queries, n_teachers, votes.n_classes,
                                      DELTA)
                noise_seed = int(rng.integers(0, 2 ** 62))
                for tag, use_radii in (("", False), ("_agt", True)):
                    estimate = SanitisedCost.prepare(mech, votes, labels, plan,
                                                     use_radii=use_radii)
                    _, eps_s = ledger.release_estimate(
                        estimate, insecure_rng=np.random.default_rng(noise_seed))
                    row[f"eps_sanitised{tag}"] = eps_s
                    row[f"smooth_sensitivity{tag}"] = estimate.sensitivity    # owner-only
                    # the estimate's noise: what the AGT distance lowers (owner-only)
                    row[f"noise_std{tag}"] = plan.sigma * estimate.sensitivity
                row["order"] = plan.order
            eps_for_rate = row.get("eps_sanitised", row["eps_independent"])
            row["answered_per_eps"] = row["answered"] / eps_for_rate
            rows[key].append(row)
    return {"dataset": setting.name, "teachers": n_teachers, "n_public": votes.n_queries,
            "training_seconds": train_s,
            "unstable_vote_fraction": float((votes.radii <= 0).mean()),
            "queries_with_an_unstable_vote": float((votes.radii <= 0).any(axis=1).mean()),
            "parameters": {"threshold": 0.8 * n_teachers, "sigma1": 0.6 * n_teachers,
                           "sigma2": 0.16 * n_teachers, "lnmax_eps": 4.0 / (0.16 * n_teachers),
                           "delta": DELTA},
            "rows": {k: _summary(v) for k, v in rows.items()}}


def _summary(runs: list[dict]) -> dict:
    keys = sorted({k for r in runs for k in r})
    out = {}
    for k in keys:
        vals = np.array([r.get(k, math.nan) for r in runs], dtype=np.float64)
        out[k] = {"mean": float(np.nanmean(vals)) if np.isfinite(vals).any() else math.nan,
                  "std": float(np.nanstd(vals)) if np.isfinite(vals).any() else math.nan}
    return out


def markdown(results: list[dict]) -> str:
    """The table as Markdown."""
    lines = ["| dataset | T | mechanism | answered | eps indep. | eps data-dep. (owner) | "
             "eps sanitised | noise std (owner) | eps sanitised, AGT distance | "
             "noise std, AGT (owner) | label acc. | student acc. | answered / eps |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for cell in results:
        for key, stats in cell["rows"].items():
            def f(name, digits=3, _s=stats):
                if name not in _s or not math.isfinite(_s[name]["mean"]):
                    return "-"
                return f"{_s[name]['mean']:.{digits}f} ± {_s[name]['std']:.{digits}f}"
            lines.append(f"| {cell['dataset']} | {cell['teachers']} | {key} | "
                         f"{f('answered', 1)} | {f('eps_independent', 2)} | "
                         f"{f('eps_dependent', 2)} | {f('eps_sanitised', 2)} | "
                         f"{f('noise_std', 2)} | {f('eps_sanitised_agt', 2)} | "
                         f"{f('noise_std_agt', 2)} | "
                         f"{f('label_accuracy')} | {f('student_accuracy')} | "
                         f"{f('answered_per_eps', 1)} |")
    return "\n".join(lines)


def run_pate(out: str | Path, quick: bool = False, progress: bool = False) -> list[dict]:
    """Run every cell of the plan and write ``results.json`` and ``summary.md`` to `out`."""
    try:
        import sklearn  # noqa: F401  (the digits data and the students)
    except ImportError:
        raise ConfigError('agt reproduce pate needs scikit-learn (the digits data and the '
                          'students): pip install -e ".[datasets]"') from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = [run_table(s, t, progress) for s in settings(quick) for t in s.teachers]
    (out / "results.json").write_text(json.dumps(
        {"results": results, "seconds": time.perf_counter() - t0, "quick": quick},
        indent=2, default=float))
    (out / "summary.md").write_text("# PATE table\n\n" + markdown(results) + "\n")
    return results
