"""The audit's plot: the two inputs' empirical label distributions side by side."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["plot_distributions"]


def _label(outcome: tuple[int, ...]) -> str:
    return ",".join("refused" if y == -1 else str(y) for y in outcome)


def plot_distributions(result, path: str | Path) -> Path:
    """Bars of the first and second input's outcome frequencies (log scale), the outcomes of
    the chosen event hatched; the title states the verdict, bound and claim.

    Args:
        result: an AuditResult.
        path: the image file to write (its suffix picks the format).

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    x = np.arange(len(result.outcomes))
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(x) + 2.0), 3.2))
    in_event = {tuple(o) for o in result.event}
    hatch = ["//" if tuple(o) in in_event else "" for o in result.outcomes]
    for offset, freq, name in ((-0.2, result.frequencies_a, "first input"),
                               (0.2, result.frequencies_b, "neighbour")):
        bars = ax.bar(x + offset, np.maximum(freq, 1e-12), width=0.4, label=name)
        for bar, h in zip(bars, hatch):
            bar.set_hatch(h)
    ax.set_yscale("log")
    ax.set_xticks(x, [_label(o) for o in result.outcomes], rotation=45 if len(x) > 8 else 0)
    ax.set_xlabel("released labels (hatched: the chosen event)")
    ax.set_ylabel("frequency")
    ax.set_title(f"{result.mechanism}: {result.verdict} (eps >= {result.lower_bound:.3f}, "
                 f"claim {result.claim_epsilon:.3g})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
