"""Fig. 6 (paper App. C): tightness of the smooth-sensitivity bound vs the number of k values.

The single model's bundle holds bounds for a grid of L k values. A sub-grid with n values
besides 0 is a bundle of those k's boxes (what AGT run on that grid computes: each k's box
is independent of the others, the nesting is validated); every sub-grid is certified on the
test queries with the real `Certifier`, and the bound S = exp(-beta r) is averaged over the
queries for each epsilon (beta of the chosen noise). Families of sub-grids (indices into the
trained grid, always with k = 0):

  contiguous     the first n + 1 grid values ({0, 1, ..., n} on a contiguous grid): r = k*
  linear         n indices evenly spread up to the largest grid value: r = grid *index* of
                 the largest certified value (a sparse grid's radius must be the
                 index, never the value g_j, for exp(-beta r) to be beta-smooth)
  geometric      n indices geometrically spread (denser at small k): index radius
  linear, value  the linear grids with r = g_j, the value: what the paper's Fig. 6 plots;
                 NOT a beta-smooth bound (a neighbouring dataset can drop r by a whole grid
                 step), shown only to explain the difference from the paper

The global-sensitivity bound is 1.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from agt.certify import Certifier
from agt.store import Bundle
from experiments.accuracy import expected_accuracy
from experiments.context import Context, Outcome, markdown_table
from experiments.plotting import plt, save
from experiments.single import single_mechanism
from mechanisms import Certified
from mechanisms.smooth import smooth_beta, smooth_bound

NAME = "kgrid"
FAMILIES = ("contiguous", "linear", "geometric", "linear-value")


def sub_bundle(bundle: Bundle, indices) -> Bundle:
    """The bundle restricted to the k values at `indices` (ascending, starting with 0)."""
    idx = list(indices)
    return dataclasses.replace(bundle, path=None,
                               k_values=tuple(bundle.k_values[i] for i in idx),
                               lower={n: t[idx].clone() for n, t in bundle.lower.items()},
                               upper={n: t[idx].clone() for n, t in bundle.upper.items()},
                               ball_radius=None if bundle.ball_radius is None
                               else bundle.ball_radius[idx].copy())


def grid_indices(family: str, n: int, length: int) -> list[int]:
    """Indices into a grid of `length` values: 0 plus n others (fewer if they coincide)."""
    last = length - 1
    n = min(n, last)
    if family == "contiguous":
        picks = range(1, n + 1)
    elif family in ("linear", "linear-value"):
        picks = (round(last * i / n) for i in range(1, n + 1))
    elif family == "geometric":
        picks = (round(v) for v in np.geomspace(1, last, n)) if n > 1 else [last]
    else:
        raise ValueError(f"unknown grid family {family!r}")
    return sorted({0, *(int(p) for p in picks)})


def run(ctx: Context) -> Outcome:
    s = ctx.plan.settings[NAME]
    t0 = time.perf_counter()
    model = ctx.single()
    bundle = model.bundle
    y = ctx.dataset.y_test
    L = len(bundle.k_values)
    sizes = sorted({min(n, L - 1) for n in s.sizes})
    betas = {e: smooth_beta(e, s.delta if s.noise == "laplace" else None, s.noise)
             for e in s.epsilons}
    curves = {f: [] for f in FAMILIES}
    cache: dict[tuple, tuple] = {}
    for n in ctx.bar(sizes, "kgrid: grid sizes"):
        for fam in FAMILIES:
            idx = grid_indices(fam, n, L)
            key = tuple(idx)
            if key not in cache:
                cert = Certifier(sub_bundle(bundle, idx), device=ctx.device).certify(
                    ctx.dataset.x_test)
                cache[key] = (cert, np.maximum(cert.radius, 0),
                              np.maximum(cert.max_certified_k, 0), cert.contiguous)
            cert, index_radius, value_radius, contiguous = cache[key]
            r = value_radius if fam == "linear-value" else index_radius
            entry = {"n_values": len(idx) - 1, "k_values": [bundle.k_values[i] for i in idx],
                     "contiguous": contiguous, "radius_mean": float(r.mean()),
                     "smooth_bound_mean": {}, "expected_accuracy": {}}
            for e, beta in betas.items():
                entry["smooth_bound_mean"][str(e)] = float(smooth_bound(r, beta).mean())
                if fam != "linear-value":  # only smooth radii calibrate a valid release
                    mech = single_mechanism(f"ss-{s.noise}", e, s.delta)
                    entry["expected_accuracy"][str(e)] = expected_accuracy(
                        mech, Certified.from_certificate(cert), y)
            curves[fam].append(entry)
    full = {"k_values": [bundle.k_values[0], bundle.k_values[-1], L],
            "radius_mean": float(np.maximum(model.cert.radius, 0).mean()),
            "smooth_bound_mean": {str(e): float(smooth_bound(model.cert.radius, b).mean())
                                  for e, b in betas.items()}}
    results = {"sizes": sizes, "epsilons": list(s.epsilons), "noise": s.noise,
               "betas": {str(e): b for e, b in betas.items()}, "n_queries": int(len(y)),
               "families": curves, "trained_grid": full,
               "notes": "smooth bound = mean over test queries of exp(-beta r); GS = 1; "
                        "linear-value uses r = grid value (the paper's Fig. 6), not beta-smooth"}
    files = [_plot(ctx, s, curves, sizes, model.cert.contiguous)]
    e0 = s.epsilons[0]
    rows = []
    for i, n in enumerate(sizes):
        rows.append([n] + [f"{curves[f][i]['smooth_bound_mean'][str(e0)]:.3g}" for f in FAMILIES]
                    + [f"{curves[f][i]['expected_accuracy'].get(str(e), float('nan')):.4f}"
                       for f in ("linear", "geometric") for e in s.epsilons])
    ctx.write_table(NAME, f"# Smooth-bound tightness vs number of k values ({ctx.plan.dataset})\n\n"
                    f"Mean over {len(y)} test queries of exp(-beta r), {s.noise} noise, "
                    f"eps = {e0:g} (beta = {betas[e0]:.4g}); global sensitivity = 1. Trained "
                    f"grid: {L} values up to {bundle.k_values[-1]}. Expected accuracy: "
                    f"SS-{s.noise} with the sub-grid's smooth radius.\n\n"
                    + markdown_table(["n k values", "contiguous {0..n}", "linear (index r)",
                                      "geometric (index r)", "linear, value r (paper; not smooth)"]
                                     + [f"acc {f} eps={e:g}" for f in ("linear", "geometric")
                                        for e in s.epsilons], rows))
    ctx.write_results(NAME, {"results": results, "seconds": time.perf_counter() - t0})
    pick = [n for n in (1, 5, 10, 20) if n in sizes] or sizes[:1]
    headline = (f"mean bound at eps={e0:g}, linear grid (index r): "
                + ", ".join(f"n={n} "
                            f"{curves['linear'][sizes.index(n)]['smooth_bound_mean'][str(e0)]:.2g}"
                            for n in pick)
                + f"; full grid ({L - 1} values) {full['smooth_bound_mean'][str(e0)]:.2g}")
    return Outcome(NAME, headline, time.perf_counter() - t0, [str(p) for p in files])


def _plot(ctx: Context, s, curves, sizes, trained_contiguous: bool):
    e0 = str(s.epsilons[0])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    first = ("contiguous grid {0, 1, ..., n} (r = k*)" if trained_contiguous else
             "first n + 1 grid values (r = k* where contiguous, else index)")
    styles = {"contiguous": ("tab:green", "-", first),
              "linear": ("tab:blue", "-", "n evenly spread k values (r = grid index)"),
              "geometric": ("tab:purple", "-", "n geometrically spread k values (r = grid index)"),
              "linear-value": ("0.5", ":", "evenly spread, r = k value (paper Fig. 6; not smooth)")}
    for fam, (color, ls, label) in styles.items():
        ax.plot(sizes, [c["smooth_bound_mean"][e0] for c in curves[fam]], color=color,
                linestyle=ls, marker="o", markersize=3, label=label)
    ax.axhline(1.0, color="tab:red", linestyle="--", label="global sensitivity (bound 1)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of k values besides k = 0 (AGT runs, log scale)")
    beta = smooth_beta(float(e0), s.delta if s.noise == "laplace" else None, s.noise)
    ax.set_ylabel(f"mean smooth-sensitivity bound exp(-βr)  (β = {beta:.3g})")
    ax.set_title(f"{ctx.plan.dataset}: bound tightness vs size of the k grid "
                 f"({s.noise}, ε = {float(e0):g}){' [quick]' if ctx.plan.quick else ''}",
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower left")
    lo = min(min(c["smooth_bound_mean"][e0] for c in curves[f]) for f in curves)
    ax.set_ylim(max(lo / 3, 1e-300), 2.0)
    if not math.isfinite(lo):
        ax.set_ylim(1e-20, 2.0)
    return save(fig, ctx.experiment_dir(NAME) / "bound_vs_grid_size.png")
