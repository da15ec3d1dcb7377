"""Fig. 3: the smooth-sensitivity bound over the input plane, separable vs overlapping blobs.

For each blobs variant: the 6-128-2 ReLU network of configs/blobs_mlp.yaml (4 full-batch
epochs on 3000 points, cross-entropy) is trained with AGT on its k grid; every point of a
G x G grid over [-L, L]^2 is mapped to the model's features with `blobs_features` (the same
map the blobs loader uses) and certified; its smooth radius r (k* on a contiguous grid) gives
the bound S = exp(-beta r) for the chosen noise at the chosen epsilon (the paper: Cauchy,
eps = 1, beta = 1/6). Low S means little noise; S = 1 is global sensitivity. The nominal
decision boundary and the test points are drawn on top.
"""

from __future__ import annotations

import time

import numpy as np

from agt.certify import Certifier
from agt.config import load_config
from agt.data import blobs_features, load_dataset
from agt.store import from_result
from agt.training import train
from experiments.context import Context, Outcome, markdown_table
from experiments.plan import display_path
from experiments.plotting import plt, save
from mechanisms.smooth import smooth_beta, smooth_bound

NAME = "heatmap"
CLASS_COLORS = ("#3b8bff", "#6fe36f")
VARIANT_TEXT = {"separable": "centres ±(1.25, 1.25), std 0.35",
                "overlapping": "centres ±(1, 1), std 0.75"}


def grid_points(limit: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(axis values (n,), points (n*n, 2)) of an n x n grid over [-limit, limit]^2, row-major
    in (x2, x1): point [i * n + j] = (axis[j], axis[i])."""
    axis = np.linspace(-limit, limit, n)
    xx, yy = np.meshgrid(axis, axis)
    return axis, np.stack([xx.ravel(), yy.ravel()], axis=1)


def run(ctx: Context) -> Outcome:
    s = ctx.plan.settings[NAME]
    t0 = time.perf_counter()
    base = load_config(ctx.plan.resolve(s.train_config))
    overrides = dict(s.train_overrides)
    if ctx.seed_override is not None:
        overrides["seed"] = int(ctx.seed_override)
    beta = smooth_beta(s.epsilon, s.delta if s.noise == "laplace" else None, s.noise)
    axis, pts = grid_points(s.grid_limit, s.grid_points)
    feats = blobs_features(pts)
    panels = []
    for variant in ctx.bar(s.variants, "heatmap: blobs variants"):
        data = {**base.raw["data"], **overrides.get("data", {}), "variant": variant}
        cfg = base.replace(**{**overrides, "data": data})
        ds = load_dataset(cfg.data.name, cfg.data.options)
        t1 = time.perf_counter()
        result = train(cfg, ds, progress=ctx.progress)
        bundle = from_result(result)
        certifier = Certifier(bundle, device=ctx.device)
        grid = certifier.certify(feats)
        test = certifier.certify(ds.x_test)
        r = np.maximum(grid.radius, 0).reshape(s.grid_points, s.grid_points)
        bound = smooth_bound(r, beta)
        test_points = _raw_points(ds)
        panels.append({
            "variant": variant, "description": VARIANT_TEXT[variant],
            "train_config": cfg.to_json_dict(), "dataset_sha256": ds.sha256(),
            "n_train": ds.n_train, "n_test": ds.n_test,
            "k_values": [bundle.k_values[0], bundle.k_values[-1], len(bundle.k_values)],
            "contiguous_grid": grid.contiguous, "bundle_id": bundle.bundle_id,
            "test_accuracy": float(np.mean(test.prediction == ds.y_test)),
            "test_radius_mean": float(np.maximum(test.radius, 0).mean()),
            "grid_radius_mean": float(r.mean()), "grid_radius_min": int(r.min()),
            "grid_bound_mean": float(bound.mean()), "grid_bound_median": float(np.median(bound)),
            "grid_fraction_at_max_k": float(np.mean(r >= bundle.k_values[-1])),
            "seconds": time.perf_counter() - t1,
            "grid_radius": r.astype(int), "grid_prediction":
                grid.prediction.reshape(s.grid_points, s.grid_points).astype(int),
            "_test": (test_points, ds.y_test),
        })
    files = [_plot(ctx, s, axis, panels, beta)]
    for p in panels:
        p.pop("_test")
    results = {"epsilon": s.epsilon, "noise": s.noise, "beta": beta,
               "grid": {"points_per_axis": s.grid_points, "limit": s.grid_limit,
                        "axis": axis, "layout": "grid_radius[i][j] is the point "
                                                "(x1 = axis[j], x2 = axis[i])"},
               "panels": panels,
               "notes": f"bound = exp(-beta r), beta = {beta:.6g} "
                        f"({s.noise}, eps = {s.epsilon:g}); "
                        f"radius r = largest certified k of the contiguous k grid"}
    rows = [[p["variant"], p["description"], f"{p['test_accuracy']:.4f}",
             f"0..{p['k_values'][1]}", f"{p['test_radius_mean']:.1f}",
             f"{p['grid_radius_mean']:.1f}", f"{p['grid_bound_mean']:.3g}",
             f"{p['grid_bound_median']:.3g}", f"{p['grid_fraction_at_max_k']:.3f}"]
            for p in panels]
    ctx.write_table(NAME, f"# Smooth-sensitivity heat map ({ctx.plan.dataset}, Fig. 3)\n\n"
                    f"{s.grid_points} x {s.grid_points} grid over [-{s.grid_limit:g}, "
                    f"{s.grid_limit:g}]^2; bound exp(-beta r) for {s.noise} noise at eps = "
                    f"{s.epsilon:g} (beta = {beta:.4g}).\n\n"
                    + markdown_table(["variant", "blobs", "test acc", "k grid", "mean r (test)",
                                      "mean r (grid)", "mean bound (grid)",
                                      "median bound (grid)", "fraction of grid at max k"], rows))
    ctx.write_results(NAME, {"results": results, "seconds": time.perf_counter() - t0,
                             "model_config_file": display_path(ctx.plan.resolve(s.train_config))})
    headline = "; ".join(f"{p['variant']}: test acc {p['test_accuracy']:.3f}, median bound "
                         f"{p['grid_bound_median']:.2g}, mean r {p['grid_radius_mean']:.0f} "
                         f"(k<={p['k_values'][1]})" for p in panels)
    return Outcome(NAME, headline, time.perf_counter() - t0, [str(p) for p in files])


def _raw_points(ds) -> np.ndarray:
    """The planar (x1, x2) of the test records: the first two "cubic" features."""
    return ds.x_test[:, :2]


def _plot(ctx: Context, s, axis, panels, beta):
    from matplotlib.colors import LogNorm
    from matplotlib.lines import Line2D

    bounds = [smooth_bound(np.maximum(p["grid_radius"], 0), beta) for p in panels]
    vmin = max(min(float(b.min()) for b in bounds), 1e-300)
    norm = LogNorm(vmin=min(vmin, 0.5), vmax=1.0)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5.0), squeeze=False)
    ext = [-s.grid_limit, s.grid_limit, -s.grid_limit, s.grid_limit]
    image = None
    for ax, p, b in zip(axes[0], panels, bounds):
        image = ax.imshow(b, origin="lower", extent=ext, norm=norm, cmap="magma_r",
                          interpolation="nearest", aspect="equal")
        pred = p["grid_prediction"]
        if pred.min() != pred.max():
            ax.contour(axis, axis, pred, levels=[0.5], colors="red", linewidths=1.2)
        pts, y = p["_test"]
        if len(pts) > s.max_scatter:
            keep = np.random.default_rng(0).choice(len(pts), s.max_scatter, replace=False)
            pts, y = pts[keep], y[keep]
        for cls, color in enumerate(CLASS_COLORS):
            m = y == cls
            ax.scatter(pts[m, 0], pts[m, 1], s=7, c=color, edgecolors="black", linewidths=0.3)
        ax.set_xlim(ext[:2])
        ax.set_ylim(ext[2:])
        ax.set_xlabel("input coordinate x1 (dimensionless)")
        ax.set_ylabel("input coordinate x2 (dimensionless)")
        ax.set_title(f"{p['variant']} blobs ({p['description']})\n"
                     f"test acc {p['test_accuracy']:.3f}, k grid 0..{p['k_values'][1]}",
                     fontsize=9)
    handles = [Line2D([], [], color="red", label="nominal decision boundary"),
               Line2D([], [], linestyle="none", marker="o", markersize=4, color=CLASS_COLORS[0],
                      markeredgecolor="black", label="test points, class 0"),
               Line2D([], [], linestyle="none", marker="o", markersize=4, color=CLASS_COLORS[1],
                      markeredgecolor="black", label="test points, class 1")]
    axes[0][0].legend(handles=handles, fontsize=7, loc="lower right", framealpha=0.9)
    cbar = fig.colorbar(image, ax=axes[0].tolist(), orientation="horizontal", fraction=0.05,
                        pad=0.12)
    cbar.set_label(f"smooth-sensitivity bound exp(-βr)  ({s.noise}, ε = {s.epsilon:g}, "
                   f"β = {beta:.3g}; 1 = global sensitivity)")
    fig.suptitle(f"Smooth-sensitivity bound over the input plane (6-128-2 ReLU network)"
                 f"{' [quick]' if ctx.plan.quick else ''}", fontsize=10)
    return save(fig, ctx.experiment_dir(NAME) / "smooth_bound_heatmap.png")
