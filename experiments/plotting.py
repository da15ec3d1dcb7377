"""Shared plot style of the experiments (matplotlib, Agg backend): one colour and line style
per mechanism, so the same mechanism looks the same in every figure."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {
    "nonprivate": {"color": "0.45", "linestyle": "--", "label": "non-private"},
    "gs": {"color": "tab:red", "label": "GS (Laplace, global sensitivity)"},
    "ss-cauchy": {"color": "tab:green", "label": "SS (Cauchy, eps-DP)"},
    "ss-laplace": {"color": "tab:blue", "label": "SS (Laplace, (eps, delta)-DP)"},
    "lnmax": {"color": "tab:red", "label": "noisy argmax (Laplace on votes)"},
    "ens-ss-cauchy": {"color": "tab:green", "label": "SS ensemble (Cauchy)"},
    "ens-ss-laplace": {"color": "tab:blue", "label": "SS ensemble (Laplace)"},
    "ens-ptr": {"color": "tab:orange", "label": "PTR (no answer counts as wrong)"},
    "ens-ptr-gs": {"color": "tab:purple", "label": "PTR, GS fallback (paper)"},
    "exp-radius": {"color": "tab:brown", "label": "exponential mechanism on the radius"},
    "ptr": {"color": "tab:orange", "linestyle": ":",
            "label": "PTR on the radius (no answer = wrong)"},
    "svt": {"color": "tab:cyan", "label": "stability-gated session (sparse vector)"},
    "ens-exp-radius": {"color": "tab:brown",
                       "label": "exponential mechanism on the ensemble radius"},
    "ens-svt": {"color": "tab:cyan", "label": "stability-gated session on the ensemble radius"},
    "gnmax": {"color": "tab:olive", "label": "GNMax (PATE 2018, Renyi)"},
    "confident-gnmax": {"color": "tab:gray",
                        "label": "Confident-GNMax (no answer counts as wrong)"},
    "dp-sgd": {"color": "black", "linestyle": "-.", "label": "DP-SGD (private training)"},
}

ENSEMBLE_LABELS = {name: STYLE[name]["label"] for name in
                   ("lnmax", "ens-ss-cauchy", "ens-ss-laplace", "ens-ptr", "ens-ptr-gs",
                    "ens-exp-radius", "ens-svt")}


def label(name: str) -> str:
    """The legend / table label of a mechanism or curve name."""
    return STYLE[name]["label"] if name in STYLE else name


def style(key: str, **changes) -> dict:
    s = dict(STYLE[key])
    s.update(changes)
    return s


def save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


__all__ = ["plt", "STYLE", "ENSEMBLE_LABELS", "style", "save", "label"]
