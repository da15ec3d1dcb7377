"""Planning a release of Q queries into an rdp ledger: the mechanism whose Q charges,
composed after what the ledger holds, fit its total budget (the Renyi counterpart of
accounting.plan_queries).

* gnmax / confident-gnmax: their sigmas (sigma_1 = 2 sigma_2), by `pate.sigmas_for_budget`;
* a pure eps-DP mechanism: the largest per-query eps whose pure-DP curves fit (bisection on
  the composed, converted curve, checked at the answer);
* a session (one guarantee for all its queries): the same with Q = 1;
* an (eps, delta > 0) mechanism without a Renyi curve: refused (an rdp ledger cannot compose
  it; rdp.curve_of says why).
Everything here reads public quantities only: the budget, Q, and the ledger's charges.
"""

from __future__ import annotations

import math

from agt.errors import BudgetExceededError, PrivacyError
from mechanisms.base import load_registry, make_mechanism
from mechanisms.checks import check_count, check_delta, check_epsilon, privacy_problems
from mechanisms.rdp import Curve, compose_curves, curve_epsilon, pure_curve

__all__ = ["plan_renyi"]

#: below this fraction of the budget left, the plan says the budget is spent (the noise that
#: would fit is pure noise: a release of no use that only looks like one)
_ROOM = 1e-6


def plan_renyi(name: str, epsilon_total: float, delta_total: float, n_queries: int, *,
               spent: Curve | None = None, **options):
    """The mechanism `name` planned so that its release of `n_queries` queries fits
    (epsilon_total, delta_total) in an rdp ledger holding `spent` (module docstring).

    Args:
        name: a registry name.
        epsilon_total: the ledger's total epsilon.
        delta_total: the ledger's total delta (> 0 for an rdp ledger).
        n_queries: Q, >= 1.
        spent: the ledger's composed curve so far (`Ledger.spent_curve`), None for a new one.
        **options: the mechanism's own options (threshold, cutoff, ...).
    Returns:
        The mechanism object.
    """
    from mechanisms.pate import sigmas_for_budget

    problems = privacy_problems("Renyi plan")
    check_epsilon(epsilon_total, problems, name="epsilon_total")
    check_delta(delta_total, problems, name="delta_total")
    check_count(n_queries, problems)
    problems.raise_if_any()
    entry = load_registry().get(name)
    if entry is None:
        return make_mechanism(name, 1.0)          # the registry's own error
    if spent is not None:
        used = curve_epsilon(spent, delta_total)[0]
        if used >= epsilon_total * (1 - _ROOM):
            raise BudgetExceededError(
                f"the rdp ledger's budget ({epsilon_total!r}, {delta_total!r}) is spent "
                f"({used:.6g} of {epsilon_total!r}); nothing was released")
    if name in ("gnmax", "confident-gnmax"):
        try:
            sigma, sigma1 = sigmas_for_budget(epsilon_total, delta_total, n_queries,
                                              confident=name != "gnmax", spent=spent)
        except PrivacyError as exc:
            raise BudgetExceededError(f"{name}: the budget left does not fit {n_queries} "
                                      f"queries ({exc})") from None
        if name == "gnmax":
            return make_mechanism(name, 1e6, delta_total, sigma=sigma, **options)
        return make_mechanism(name, 1e6, delta_total, sigma1=sigma1, sigma2=sigma, **options)
    if entry.needs_delta:
        raise PrivacyError(f"{name} is (eps, delta)-DP per query without a Renyi curve, so an "
                           f"rdp ledger cannot compose it: use gnmax, confident-gnmax or a "
                           f"pure mechanism, or a ledger with another accountant")
    probe = make_mechanism(name, 1.0, **options)
    count = int(n_queries) if probe.per_query else 1

    def fits(eps: float) -> bool:
        groups = [(pure_curve(eps), count)] + ([(spent, 1)] if spent is not None else [])
        return curve_epsilon(compose_curves(groups), delta_total)[0] <= epsilon_total

    lo, hi = 0.0, float(epsilon_total)
    if not fits(min(hi, 1e-12)):
        raise BudgetExceededError(f"the rdp ledger's budget ({epsilon_total!r}, "
                                  f"{delta_total!r}) has no room for {count} more charge(s)")
    for _ in range(200):
        mid = (lo + hi) / 2 if lo > 0 else math.sqrt(max(lo, 1e-300) * hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        if hi - lo <= 1e-12 * hi:
            break
    if not fits(lo):
        raise PrivacyError("internal: the planned per-query epsilon does not fit")
    return make_mechanism(name, lo, **options)
