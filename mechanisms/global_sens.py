"""Global-sensitivity release of a single model's binary prediction (Laplace mechanism).

A binary prediction f(D) in {0, 1} has global sensitivity 1 under any neighbouring relation,
so releasing f + Laplace(1/eps) is eps-DP (Dwork-McSherry-Nissim-Smith 2006; Dwork-Roth 2014,
Thm 3.6), and so is its post-processing
    label = 1[ f + Laplace(1/eps) > 1/2 ].
The epsilon is with respect to the neighbouring relation the caller passes in (the one the
bundle certifies); the data-independent noise needs no certificate, this is the baseline that
smooth sensitivity (smooth.py) improves on.
    P(label != f) = P(Laplace(1/eps) > 1/2) = 0.5 * exp(-eps / 2).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mechanisms._checks import Problems, binary_array, check_epsilon
from mechanisms.guarantee import Guarantee, check_relation
from mechanisms.noise import laplace_flip_probability, make_generator, threshold_release

MECHANISM = "gs"


def global_guarantee(epsilon: float, relation: str) -> Guarantee:
    """The per-query guarantee of `release_global`: pure eps-DP w.r.t. `relation`."""
    return Guarantee(
        epsilon=float(epsilon), delta=0.0, relation=relation, mechanism=MECHANISM,
        note=f"global sensitivity 1, Laplace(1/eps) noise, eps={epsilon!r} per query "
             "(Dwork-Roth Thm 3.6)")


def flip_probability_gs(epsilon: float) -> float:
    """P(release != f) = P(Laplace(1/eps) > 1/2) = 0.5 * exp(-eps / 2)."""
    problems = Problems()
    check_epsilon(epsilon, problems)
    problems.raise_if_any()
    return float(laplace_flip_probability(1.0 / epsilon))


def release_global(predictions: ArrayLike, epsilon: float, *, relation: str,
                   rng: np.random.Generator | None = None
                   ) -> tuple[NDArray[np.int64], Guarantee]:
    """Release 1[f + Laplace(1/eps) > 1/2] for each nominal prediction f in {0, 1}.

    Returns the labels (int64, same shape as `predictions`) and the per-query Guarantee
    (eps, 0) w.r.t. `relation`. rng None draws from a fresh OS-seeded generator (the default
    for real releases); pass `make_generator(seed)` only for experiments.
    """
    problems = Problems()
    check_epsilon(epsilon, problems)
    check_relation(relation, problems)
    values = binary_array(predictions, problems)
    problems.raise_if_any()
    guarantee = global_guarantee(epsilon, relation)
    rng = make_generator(None) if rng is None else rng
    return threshold_release(values, 1.0 / epsilon, "laplace", rng), guarantee
