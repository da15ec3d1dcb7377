"""Plots of certification (matplotlib): the one drawing behind ``agt certify --plot`` and
`agt.Certificate.plot`.

The figure is built with `matplotlib.figure.Figure`, not pyplot, so drawing neither picks
nor changes the process's backend: a script saves the file, a notebook shows the returned
figure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def certification_figure(cert):
    """Certified fraction vs k (left) and the histogram of stability radii (right).

    Args:
        cert: an `agt.Certificate` (owner-only, and so is the figure).

    Returns:
        A `matplotlib.figure.Figure` with the two panels.
    """
    from matplotlib.figure import Figure

    frac = cert.certified_fraction()
    ks = np.asarray(list(frac), dtype=float)
    radius = np.asarray(cert.radius)
    fig = Figure(figsize=(10, 4))
    a, b = fig.subplots(1, 2)
    a.plot(ks, [frac[int(k)] for k in ks], marker="." if len(ks) < 40 else None)
    a.set_xlabel("distance k (records)")
    a.set_ylabel("fraction of queries certified")
    a.set_ylim(-0.02, 1.02)
    a.set_title("Certified fraction vs k")
    a.grid(alpha=0.3)
    b.hist(radius, bins=min(50, max(5, int(radius.max(initial=0)) + 2)), color="tab:green")
    b.set_xlabel("stability radius r" + ("" if cert.contiguous else " (grid index)")
                 + "; -1: k = 0 not certified")
    b.set_ylabel("number of queries")
    b.set_title(f"Stability radii of {len(radius)} queries (owner-only)")
    fig.tight_layout()
    return fig


def save_figure(fig, path: Path) -> Path:
    """Write `fig` to `path` (PNG, PDF or SVG by its suffix), creating its folder.

    Args:
        fig: a matplotlib figure.
        path: the file to write.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def plot_certification(cert, path: Path) -> Path:
    """Save `certification_figure` of `cert` to `path` (PNG, PDF or SVG by its suffix).

    Args:
        cert: an `agt.Certificate`.
        path: the file to write; its folder is created.

    Returns:
        The path written.
    """
    return save_figure(certification_figure(cert), path)
