"""Composition of per-query DP guarantees over an inference budget, and its inverse.

All accountants compose guarantees with respect to one neighbouring relation (the one the
bundle certifies); none of them looks at the data. Every total returned here is an upper
bound rounded *up* (exact rational sums for standard composition, a 1e-12 relative pad on
floating-point formulas), so a verified calibration is never over budget.

Spends are (eps_i, delta_i) guarantees of mechanisms run one after another.

* standard (basic composition; Dwork-Roth 2014, Thm 3.16):
      (sum eps_i, sum delta_i).
  Valid also when the eps_i are chosen adaptively.
* advanced (Dwork-Rothblum-Vadhan 2010, Thm III.3; Dwork-Roth Thm 3.20), for a slack
  delta' > 0, in its heterogeneous form (same Azuma argument with per-step ranges eps_i):
      eps = sqrt(2 ln(1/delta') sum eps_i^2) + sum eps_i (e^eps_i - 1),
      delta = sum delta_i + delta'.
  Homogeneous: sqrt(2 Q ln(1/delta')) eps + Q eps (e^eps - 1), Q delta + delta'.
* best: the smaller of standard and advanced (both are valid guarantees).
* tight: optimal composition via privacy-loss distributions (dp_accounting's PLD with
  pessimistic rounding, so an upper bound). Every (eps, delta)-DP mechanism -- *any* one, not
  only a Laplace mechanism -- is dominated by the randomized-response pair of
  Kairouz-Oh-Viswanath 2015 (Sec. 2): privacy loss +inf w.p. delta, +eps w.p.
  (1-delta)/(1+e^-eps), -eps w.p. (1-delta)/(1+e^eps) (the pair of dp_accounting's
  `from_privacy_parameters`; built here with grid indices that keep +-eps exact). Composing
  these PLDs gives KOV's optimal composition (Thm 3.3) for homogeneous spends and the optimal
  heterogeneous composition (Murtagh-Vadhan 2016) up to the discretisation, which only rounds
  up. So it is valid for GS-Laplace and SS-Cauchy (pure eps-DP: delta_i = 0 is randomized
  response) and, with delta_i > 0, for SS-Laplace ((eps, delta)-DP): no spend is treated as a
  Laplace mechanism (SS noise has a data-dependent scale; its PLD is not Laplace's). The total
  is taken at delta = sum delta_i + delta' (the +inf mass carries 1 - prod(1 - delta_i) <=
  sum delta_i). The PLD's FFT convolution errs (an adversarial review found negative composed
  masses, and a reported epsilon whose exact delta was 3.8x the target), so its answer is
  checked against the exact hockey-stick divergence of the composed pair (KOV's optimal
  composition, a binomial sum in 50-digit arithmetic) and raised by bisection where it falls
  short; mixed spends, which have no such closed form, fall back to `best`. The tight total is
  the minimum of this and the standard and advanced totals, so it is never worse than `best`.

Adaptivity: standard composition holds for privacy parameters chosen adaptively. Advanced and
tight composition as used here assume the sequence of (eps_i, delta_i) is fixed in advance,
e.g. one calibrated per-query epsilon for a plan of Q queries (stopping early is fine: a prefix
is a post-processing of the full plan). The ledger enforces this: a ledger with any accountant
but "standard" fixes its per-query guarantee when it is created (ledger/). For adaptively
chosen heterogeneous parameters use "standard" (or a privacy filter,
Rogers-Roth-Ullman-Vadhan 2016).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Literal

from agt.errors import BudgetExceededError, PrivacyError
from mechanisms.checks import check_count, check_delta, check_epsilon, privacy_problems
from mechanisms.rounding import float_down as _float_down
from mechanisms.rounding import float_up as _float_up

if TYPE_CHECKING:      # annotations only: the exact checks import it when they run
    import mpmath

AccountantName = Literal["standard", "advanced", "best", "tight"]
ACCOUNTANTS: tuple[str, ...] = ("standard", "advanced", "best", "tight")

# (epsilon, delta, count): `count` identical spends.
SpendGroup = tuple[float, float, int]

_REL_PAD = 1e-12          # relative pad on floating-point totals (they err by ~1e-15)
_MAX_EPSILON = 500.0      # per-spend epsilon above which formulas overflow; treated as +inf
_PLD_POINTS = 1_000_000   # cap on the PLD support (speed); a coarser grid only rounds up more
_PLD_RESOLUTION = 1000    # discretisation interval min eps / 1000 where the cap allows


@dataclass(frozen=True)
class Composition:
    """A composed guarantee: the spends together are (epsilon, delta)-DP, by `method`."""

    epsilon: float
    delta: float
    method: str

    def fits(self, budget_epsilon: float, budget_delta: float) -> bool:
        """True when this guarantee is within (budget_epsilon, budget_delta)."""
        return self.epsilon <= budget_epsilon and self.delta <= budget_delta


# ---------------------------------------------------------------------------------------------
# Rounding toward safety.

def _pad_up(x: float) -> float:
    """x padded up by a relative 1e-12: float formulas err far less than that."""
    return math.nextafter(x + abs(x) * _REL_PAD, math.inf) if math.isfinite(x) else x


# ---------------------------------------------------------------------------------------------
# Candidate totals over groups of identical spends.

def _exact_delta_sum(groups: Sequence[SpendGroup]) -> Fraction:
    return sum((Fraction(d) * c for _, d, c in groups), Fraction(0))


def _standard(groups: Sequence[SpendGroup]) -> Composition:
    eps = sum((Fraction(e) * c for e, _, c in groups), Fraction(0))
    return Composition(_float_up(eps), _float_up(_exact_delta_sum(groups)), "standard")


def _advanced(groups: Sequence[SpendGroup], slack: float) -> Composition:
    delta = _float_up(_exact_delta_sum(groups) + Fraction(slack))
    if any(e > _MAX_EPSILON for e, _, _ in groups):
        return Composition(math.inf, delta, "advanced")
    square_sum = math.fsum(c * e * e for e, _, c in groups)
    drift = math.fsum(c * e * math.expm1(e) for e, _, c in groups)
    eps = math.sqrt(-2.0 * math.log(slack) * square_sum) + drift
    return Composition(_pad_up(eps), delta, "advanced")


def _loss_indices(eps: float, interval: float) -> tuple[int, int, Fraction]:
    """Grid indices (a, b) representing the losses +eps and -eps on the grid `interval`.

    Pessimistic rounding puts each loss on the grid point at or above it (exact ceil). When
    eps is within 1e-9 of a grid multiple n * h (the grid is built from the smallest eps),
    +-n is used instead, and the returned shortfall max(0, eps - n h, -eps + n h) -- an ulp
    or so -- is added to the composed epsilon: a loss represented at most s too low moves the
    composed epsilon(delta) by at most the sum of the s's.
    """
    ratio = Fraction(eps) / Fraction(interval)
    n = round(ratio)
    if n >= 1 and abs(ratio - n) <= Fraction(1, 10**9):
        return n, -n, abs(Fraction(eps) - n * Fraction(interval))
    return math.ceil(ratio), math.ceil(-ratio), Fraction(0)


def _tight(groups: Sequence[SpendGroup], slack: float) -> Composition:
    """PLD composition of the KOV dominating pairs, epsilon at delta = sum delta_i + slack."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    target = _float_down(_exact_delta_sum(groups) + Fraction(slack))
    if any(e > _MAX_EPSILON for e, _, _ in groups) or len(groups) > 1:
        # Mixed spends: the FFT's error has no rigorous bound (an adversarial review found
        # negative composed masses, and deltas up to 3.8x the target for homogeneous ones)
        # and no closed form checks it, so tight falls back to best there.
        return Composition(math.inf, target, "tight")
    # Grid: the epsilon in up to 1000 steps, so the spends are represented exactly; coarser
    # when needed to keep the support of the composition small.
    eps, delta, count = groups[0]
    total_eps = count * eps
    steps = min(_PLD_RESOLUTION, math.floor(eps * _PLD_POINTS / (2.0 * total_eps)))
    interval = eps / steps if steps >= 1 else 2.0 * total_eps / _PLD_POINTS
    up, down, short = _loss_indices(eps, interval)
    shortfall = short * count
    one = pld.PrivacyLossDistribution.create_from_rounded_probability(
        {up: (1.0 - delta) / (1.0 + math.exp(-eps)),
         down: (1.0 - delta) / (1.0 + math.exp(eps))},
        infinity_mass=delta, value_discretization_interval=interval,
        pessimistic_estimate=True)
    composed = one.self_compose(count) if count > 1 else one
    # Evaluate at a slightly smaller delta (relative 1e-6, absolute 1e-14) and pad epsilon up;
    # that margin alone is not enough (the review above), so `_kov_certified` checks the
    # answer exactly and raises it where needed.
    evaluate_at = target * (1.0 - 1e-6) - 1e-14
    if evaluate_at <= 0:
        return Composition(math.inf, target, "tight")
    eps_total = _pad_up(max(float(composed.get_epsilon_for_delta(evaluate_at)), 0.0)
                        + _float_up(shortfall))
    return Composition(_kov_certified(groups[0], eps_total, target), target, "tight")


def _kov_delta(eps0: float, delta0: float, count: int, eps_total: float) -> "mpmath.mpf":
    """The exact delta(eps_total) of `count`-fold composition of the KOV dominating pair of
    (eps0, delta0): with p = e^eps0 / (1 + e^eps0), j ~ Binomial(count, 1 - p) the number of
    -eps0 losses,
        delta = 1 - (1 - delta0)^k + (1 - delta0)^k sum_j P(j) (1 - e^(eps_total - L_j))_+,
    L_j = (k - 2j) eps0: the hockey-stick divergence of the composed pair, which KOV (Thm 3.3)
    show is the optimal composition. In 50-digit arithmetic."""
    import mpmath

    with mpmath.workdps(50):
        e0 = mpmath.mpf(eps0)
        p = mpmath.exp(e0) / (1 + mpmath.exp(e0))
        q = 1 - p
        k = count
        term = p ** k                                     # P(j = 0)
        total = mpmath.mpf(0)
        for j in range(k + 1):
            loss = (k - 2 * j) * e0
            if loss <= eps_total:
                break
            total += term * -mpmath.expm1(mpmath.mpf(eps_total) - loss)
            term = term * (k - j) / (j + 1) * q / p
        lost = -mpmath.expm1(k * mpmath.log1p(-mpmath.mpf(delta0)))   # 1 - (1 - delta0)^k
        return lost + (1 - lost) * total


def _kov_certified(group: SpendGroup, eps_total: float, target: float) -> float:
    """eps_total if the exact KOV delta there is <= target, else the smallest float found by
    bisection up to the standard total (where delta is at most sum delta_i <= target) that
    satisfies it: the PLD's answer is only accepted once checked exactly."""
    import mpmath

    eps0, delta0, count = group
    limit = mpmath.mpf(target)
    if _kov_delta(eps0, delta0, count, eps_total) <= limit:
        return eps_total
    lo, hi = eps_total, _float_up(Fraction(eps0) * count)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _kov_delta(eps0, delta0, count, mid) <= limit:
            hi = mid
        else:
            lo = mid
    return _pad_up(hi)


# ---------------------------------------------------------------------------------------------
# Accountant.

def _groups_from_lists(epsilons: Sequence[float], deltas: Sequence[float]) -> list[SpendGroup]:
    problems = privacy_problems()
    if len(epsilons) != len(deltas):
        problems.add(f"got {len(epsilons)} epsilons but {len(deltas)} deltas; "
                                "give one (epsilon, delta) per spend")
        problems.raise_if_any()
    for i, (e, d) in enumerate(zip(epsilons, deltas)):
        check_epsilon(e, problems, name=f"epsilon[{i}]")
        check_delta(d, problems, name=f"delta[{i}]", allow_zero=True)
    problems.raise_if_any()
    counts = Counter((float(e), float(d)) for e, d in zip(epsilons, deltas))
    return [(e, d, c) for (e, d), c in sorted(counts.items())]


@dataclass(frozen=True)
class Accountant:
    """Composes a sequence of (eps_i, delta_i) spends into one guarantee.

    name: "standard", "advanced", "best" or "tight" (see the module docstring).
    delta_prime: the slack delta' of advanced/tight composition. None: use all of the delta
    budget the spends do not use (delta' = delta_budget - sum delta_i), which needs a
    `delta_budget` when totals are asked for.
    """

    name: AccountantName = "best"
    delta_prime: float | None = None

    def __post_init__(self) -> None:
        problems = privacy_problems()
        if self.name not in ACCOUNTANTS:
            problems.add(f"accountant must be one of {ACCOUNTANTS}, got {self.name!r}")
        if self.delta_prime is not None:
            check_delta(self.delta_prime, problems, name="delta_prime")
        problems.raise_if_any()

    def total(self, epsilons: Sequence[float], deltas: Sequence[float],
              delta_budget: float | None = None) -> Composition:
        """Composed guarantee of the spends (eps_i, delta_i).

        With `delta_budget`, the guarantee whose delta fits the budget and whose epsilon is
        smallest is returned (the smallest epsilon overall if none fits).
        """
        return self.compose_groups(_groups_from_lists(epsilons, deltas), delta_budget)

    def compose_groups(self, groups: Sequence[SpendGroup],
                       delta_budget: float | None = None) -> Composition:
        """`total` over groups (eps, delta, count) of identical spends (validated upstream)."""
        groups = [g for g in groups if g[2] > 0]
        if not groups:
            return Composition(0.0, 0.0, self.name)
        candidates = [_standard(groups)] if self.name != "advanced" else []
        slack = self._slack(groups, delta_budget) if self.name != "standard" else None
        if slack is not None:
            candidates.append(_advanced(groups, slack))
            if self.name == "tight":
                candidates.append(_tight(groups, slack))
        if not candidates:  # advanced composition with no delta left for its slack
            return Composition(math.inf, _float_up(_exact_delta_sum(groups)), "advanced")
        fitting = [c for c in candidates if delta_budget is None or c.delta <= delta_budget]
        return min(fitting or candidates, key=lambda c: c.epsilon)  # first wins ties

    def _slack(self, groups: Sequence[SpendGroup], delta_budget: float | None) -> float | None:
        if self.delta_prime is not None:
            return self.delta_prime
        if delta_budget is None:
            raise PrivacyError(f"the {self.name} accountant needs a slack delta': give "
                               "delta_prime or a delta budget")
        slack = _float_down(Fraction(delta_budget) - _exact_delta_sum(groups))
        return slack if slack > 0 else None


# ---------------------------------------------------------------------------------------------
# Homogeneous composition of Q queries.

def _check_homogeneous(epsilon: float, delta: float, q: int, delta_prime: float | None) -> None:
    problems = privacy_problems()
    check_epsilon(epsilon, problems)
    check_delta(delta, problems, allow_zero=True)
    check_count(q, problems)
    if delta_prime is not None:
        check_delta(delta_prime, problems, name="delta_prime")
    problems.raise_if_any()


def standard_composition(epsilon: float, delta: float, q: int) -> tuple[float, float]:
    """Q (eps, delta)-DP queries are (Q eps, Q delta)-DP (rounded up)."""
    _check_homogeneous(epsilon, delta, q, None)
    c = _standard([(float(epsilon), float(delta), q)])
    return c.epsilon, c.delta


def advanced_composition(epsilon: float, delta: float, q: int, delta_prime: float
                         ) -> tuple[float, float]:
    """(sqrt(2 Q ln(1/delta')) eps + Q eps (e^eps - 1), Q delta + delta') (DRV 2010)."""
    _check_homogeneous(epsilon, delta, q, delta_prime)
    if delta_prime is None:
        raise PrivacyError("advanced composition needs delta_prime in (0, 1)")
    c = _advanced([(float(epsilon), float(delta), q)], float(delta_prime))
    return c.epsilon, c.delta


def best_composition(epsilon: float, delta: float, q: int, delta_prime: float) -> Composition:
    """The smaller-epsilon of standard and advanced composition; `method` says which."""
    _check_homogeneous(epsilon, delta, q, delta_prime)
    return Accountant("best", delta_prime).compose_groups([(float(epsilon), float(delta), q)])


def tight_epsilon(epsilon: float, q: int, delta_total: float, per_query_delta: float = 0.0
                  ) -> float:
    """Total epsilon of Q (eps, per_query_delta)-DP queries at total delta `delta_total`
    by the tight accountant (PLD / KOV optimal composition, never above best composition)."""
    problems = privacy_problems()
    check_delta(delta_total, problems, name="delta_total")
    problems.raise_if_any()
    _check_homogeneous(epsilon, per_query_delta, q, None)
    if Fraction(per_query_delta) * q >= Fraction(delta_total):
        raise PrivacyError(f"delta_total={delta_total!r} must exceed Q * per_query_delta = "
                           f"{q} * {per_query_delta!r} to leave a slack delta'")
    groups = [(float(epsilon), float(per_query_delta), q)]
    return Accountant("tight").compose_groups(groups, delta_budget=delta_total).epsilon


def per_query_epsilon(epsilon_total: float, delta_total: float, q: int,
                      per_query_delta: float = 0.0, accountant: str = "best") -> float:
    """Largest per-query eps such that Q (eps, per_query_delta) queries stay within
    (epsilon_total, delta_total) under `accountant`, with slack delta' = delta_total -
    Q per_query_delta.

    Solved by bisection on the (monotone) composed epsilon and verified by plugging the
    answer back into the same accountant the ledger uses: the result always fits.
    """
    problems = privacy_problems()
    check_epsilon(epsilon_total, problems, name="epsilon_total")
    check_delta(delta_total, problems, name="delta_total", allow_zero=True)
    check_delta(per_query_delta, problems, name="per_query_delta", allow_zero=True)
    check_count(q, problems)
    if accountant not in ACCOUNTANTS:
        problems.add(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    problems.raise_if_any()
    slack = Fraction(delta_total) - Fraction(per_query_delta) * q
    if slack < 0:
        raise PrivacyError(f"Q * per_query_delta = {q} * {per_query_delta!r} exceeds "
                           f"delta_total={delta_total!r}; lower per_query_delta or Q")
    if accountant == "advanced" and slack == 0:
        raise PrivacyError(f"advanced composition needs delta' = delta_total - Q * "
                           f"per_query_delta > 0, got 0; raise delta_total above "
                           f"{q} * {per_query_delta!r}")
    acc = Accountant(accountant)  # type: ignore[arg-type]

    def fits(eps: float) -> bool:
        groups = [(eps, float(per_query_delta), q)]
        return acc.compose_groups(groups, delta_budget=delta_total).fits(epsilon_total,
                                                                         delta_total)

    # A feasible lower end: the standard answer stepped down past rounding, else halve.
    lo = epsilon_total / q
    for _ in range(4):
        if fits(lo):
            break
        lo = math.nextafter(lo, 0.0)
    while not fits(lo):
        lo /= 2.0
        if lo < 1e-300:
            raise PrivacyError(f"no per-query epsilon fits ({epsilon_total!r}, {delta_total!r}) "
                               f"for Q={q} under {accountant} composition")
    if accountant == "standard":
        return lo
    if accountant == "tight":  # start from best's answer: tight is never worse
        lo = max(lo, per_query_epsilon(epsilon_total, delta_total, q, per_query_delta, "best"))
    hi = 2.0 * lo
    while fits(hi):
        lo, hi = hi, 2.0 * hi
        if hi > _MAX_EPSILON:
            return lo
    rtol = 1e-5 if accountant == "tight" else 1e-10
    while hi - lo > rtol * lo:
        mid = 0.5 * (lo + hi)
        if fits(mid):
            lo = mid
        else:
            hi = mid
    if not fits(lo):  # the bisection invariant; checked again because it is the guarantee
        raise AssertionError(f"calibrated per-query epsilon {lo!r} does not fit the budget")
    return lo


def plan_queries(epsilon_total: float, delta_total: float, q: int, needs_delta: bool,
                 accountant: str = "best", per_query_delta: float | None = None,
                 spent: Sequence[SpendGroup] = (), session: bool = False) -> tuple[float, float]:
    """(per-query eps, per-query delta) for Q releases within a total budget.

    needs_delta: the mechanism is (eps, delta)-DP with delta > 0; its per-query delta is
    `per_query_delta`, by default delta_total / (2 Q) (the rest is composition slack).
    Pure eps-DP mechanisms get delta 0. `spent` (standard accountant only): groups already
    recorded, whose epsilon and delta come off the total first. `session`: the mechanism's
    guarantee covers all Q queries at once (one spend), which gets everything left.
    """
    problems = privacy_problems()
    check_epsilon(epsilon_total, problems, name="epsilon_total")
    check_delta(delta_total, problems, name="delta_total", allow_zero=True)
    check_count(q, problems)
    if accountant not in ACCOUNTANTS:
        problems.add(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    problems.raise_if_any()
    if spent and accountant != "standard":
        raise PrivacyError(f"the {accountant} accountant plans a fixed sequence from an empty "
                           f"ledger; with releases already recorded use the ledger's fixed "
                           f"per-query guarantee")
    eps_left, delta_left = float(epsilon_total), float(delta_total)
    if spent:
        used = _standard([g for g in spent if g[2] > 0])
        eps_left = _float_down(Fraction(epsilon_total) - Fraction(used.epsilon))
        delta_left = max(0.0, _float_down(Fraction(delta_total) - Fraction(used.delta)))
        # what the rounding of earlier plans leaves (a review's find: 1e-13 of a budget of
        # 1000 "released" 20 labels at eps 6e-15 each, noise alone) counts as spent
        if eps_left <= 1e-9 * float(epsilon_total):
            raise BudgetExceededError(f"the ledger's epsilon budget is spent (left: "
                                      f"{max(eps_left, 0.0):.3g} of {float(epsilon_total):.6g}); "
                                      f"nothing was released")
    if session:
        q = 1
        if per_query_delta is None and needs_delta:
            per_query_delta = delta_left
    if needs_delta:
        if delta_left <= 0:
            raise PrivacyError("this mechanism is (eps, delta)-DP per query and needs a delta "
                               "budget: give a total delta > 0")
        pqd = per_query_delta if per_query_delta is not None else delta_left / (2.0 * q)
        if not 0 < pqd < 1 or Fraction(pqd) * q > Fraction(delta_left):
            raise PrivacyError(f"per-query delta {pqd!r} times Q = {q} queries must be in "
                               f"(0, delta left = {delta_left!r}]")
    else:
        if per_query_delta not in (None, 0, 0.0):
            raise PrivacyError("this mechanism is pure eps-DP per query and takes no "
                               "per-query delta")
        pqd = 0.0
    if q == 1:
        return eps_left, pqd
    return per_query_epsilon(eps_left, delta_left, q, pqd, accountant), pqd
