"""Plot helpers (matplotlib, Agg backend): certification summaries."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def plot_certification(cert, path: Path) -> Path:
    """Certified fraction vs k (left) and the histogram of smooth radii (right)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frac = cert.certified_fraction()
    ks = np.asarray(list(frac), dtype=float)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(ks, [frac[int(k)] for k in ks], marker="." if len(ks) < 40 else None)
    a.set_xlabel("distance k (records)")
    a.set_ylabel("fraction of queries certified")
    a.set_ylim(-0.02, 1.02)
    a.set_title("Certified fraction vs k")
    a.grid(alpha=0.3)
    b.hist(cert.radius, bins=min(50, max(5, int(cert.radius.max(initial=0)) + 2)),
           color="tab:green")
    b.set_xlabel("stability radius r" + ("" if cert.contiguous else " (grid index)")
                 + "; -1: k = 0 not certified")
    b.set_ylabel("number of queries")
    b.set_title(f"Stability radii of {len(cert.radius)} queries (owner-only)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
