"""The methods the trade-off study races and the family each belongs to (registry names of
`mechanisms.MECHANISMS`, plus ``dp-sgd``)."""

from __future__ import annotations

#: private training: one session of the total budget covers every query
TRAINING = ("model-sens", "model-sens-gauss", "loss-pert", "loss-pert-gauss", "dp-sgd")
#: private prediction: each query (or, for df-exp-zcdp, the B-query session) pays
PREDICTION = ("pred-sens", "pred-sens-gauss", "df-exp", "df-exp-zcdp", "lnmax", "gnmax",
              "confident-gnmax")
#: AGT releases of every task; AGT_BINARY releases need two classes, so binary only
AGT_MULTI = ("ss-argmax", "exp-radius", "ptr", "ens-exp-radius")
AGT_BINARY = ("gs", "ss-cauchy", "ss-laplace")
#: Monte Carlo mechanisms: no exact law, so their accuracy is the mean of sampled draws
SAMPLED_ONLY = ("model-sens", "model-sens-gauss", "pred-sens", "pred-sens-gauss",
                "loss-pert", "loss-pert-gauss")


def methods(task: str) -> tuple[str, ...]:
    """Every method of a task.

    Args:
        task: ``multiclass`` or ``binary``.

    Returns:
        The methods in table order; binary adds the binary AGT releases.
    """
    base = TRAINING + PREDICTION + AGT_MULTI
    return base + AGT_BINARY if task == "binary" else base


def family(name: str) -> str:
    """The family a method is compared within.

    Args:
        name: a method of `methods`.

    Returns:
        ``private training``, ``private prediction`` or ``AGT``.
    """
    return "private training" if name in TRAINING else (
        "AGT" if name in AGT_MULTI + AGT_BINARY else "private prediction")
