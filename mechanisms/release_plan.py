"""A release plan: what each mechanism would cost and return for B queries, before spending.

For the owner's inputs on a query sample (`Certified` or `Votes`), a number of queries B
and a total budget (epsilon_total, delta_total) under one relation, `plan_release` lists,
for every registry mechanism that releases these inputs under the relation and every
accountant that can compose it:

* the per-query guarantee: `accounting.plan_queries` (the same inverse of composition the
  release commands use: the largest per-query eps whose B-fold composition fits the total,
  per-query delta delta_total / (2B) for (eps, delta) mechanisms) or, for the rdp
  accountant, `rdp_plan.plan_renyi`; a session (svt, ens-svt, df-exp-zcdp) is one spend and
  gets the whole total under every (eps, delta) accountant, so it is listed once, under
  standard;
* the expected answered fraction, agreement with the served model and, with labels,
  accuracy (mechanisms/expectation.py: exact laws; Monte Carlo with its standard error for
  a mechanism without one);
* whether the check before spending (mechanisms/release_check.py) would refuse it;
* a recommendation: among the rows the check passes (all rows if it passes none), the one of
  highest expected accuracy (agreement without labels), ties to the higher answered
  fraction, then to pure eps-DP, then to the registry's order.

The plan is OWNER-ONLY: it is a function of the radii and votes, so printing or publishing
it leaks about the private data, and choosing a mechanism by it is a data-dependent choice
that no ledger charges. Plan on public queries or a public surrogate's bundle to avoid that
(docs/privacy.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from agt.errors import AGTError, ConfigError
from mechanisms.accounting import ACCOUNTANTS, plan_queries
from mechanisms.base import Mechanism, load_registry, make_mechanism
from mechanisms.checks import check_count, check_delta, check_epsilon, privacy_problems
from mechanisms.expectation import Expectation, expect, simulate_expectation
from mechanisms.guarantee import REPLACE_ONE, check_relation
from mechanisms.inputs import Certified, Votes
from mechanisms.release_check import MIN_ANSWERED, check_min_answered, refusal

__all__ = ["PLAN_ACCOUNTANTS", "PlanRow", "ReleasePlan", "plan_release", "SESSION_ACCOUNTANT"]

#: every accountant a ledger can have
PLAN_ACCOUNTANTS: tuple[str, ...] = ACCOUNTANTS + ("rdp",)
#: the accountant a session's single spend is listed under
SESSION_ACCOUNTANT = "standard"
#: the keys of a row in the plan's JSON, in order
JSON_KEYS = ("mechanism", "accountant", "epsilon_per_query", "delta_per_query",
             "expected_answered", "expected_agreement", "expected_accuracy")


@dataclass(frozen=True)
class PlanRow:
    """One mechanism under one accountant (owner-only).

    Attributes:
        mechanism: the registry name.
        accountant: the composition the per-query guarantee was planned with.
        epsilon_per_query: the guarantee of each query (of the session for a session).
        delta_per_query: its delta (0 for pure eps-DP).
        per_query: False for a session (one guarantee for all B queries).
        expectation: the expected fractions (`Expectation`).
        planned: the mechanism object at these parameters (what `Ledger.release` takes
            to make this release; None for rows built by hand).
        refused: why the check before spending refuses this release
            (`release_check.refusal`), None when it passes.
    """

    mechanism: str
    accountant: str
    epsilon_per_query: float
    delta_per_query: float
    per_query: bool
    expectation: Expectation
    planned: Mechanism | None = field(default=None, repr=False, compare=False)
    refused: str | None = None

    def to_json(self) -> dict:
        """The row as `agt plan --json` prints it.

        Returns:
            A dict with the keys `JSON_KEYS` (expected accuracy None without labels).
        """
        e = self.expectation
        return {"mechanism": self.mechanism, "accountant": self.accountant,
                "epsilon_per_query": self.epsilon_per_query,
                "delta_per_query": self.delta_per_query,
                "expected_answered": e.answered, "expected_agreement": e.agreement,
                "expected_accuracy": e.accuracy}


@dataclass(frozen=True)
class ReleasePlan:
    """The plan of a release (module docstring; owner-only).

    Attributes:
        rows: one `PlanRow` per (mechanism, accountant) that applies.
        skipped: (mechanism or "mechanism/accountant", reason) for what does not apply.
        recommended: the recommended row (None when no row applies).
        reason: why it is recommended (or why nothing is).
        n_queries: B.
        epsilon_total, delta_total, relation: the budget planned for.
        n_sample: the queries the expectations were computed on.
        labelled: whether expected accuracies against labels were computed.
    """

    rows: tuple[PlanRow, ...]
    skipped: tuple[tuple[str, str], ...]
    recommended: PlanRow | None
    reason: str
    n_queries: int
    epsilon_total: float
    delta_total: float
    relation: str
    n_sample: int
    labelled: bool

    def to_json(self) -> dict:
        """The plan as `agt plan --json` prints it.

        Returns:
            ``{"rows": [row.to_json(), ...], "recommended": name or None}``.
        """
        return {"rows": [r.to_json() for r in self.rows],
                "recommended": None if self.recommended is None else self.recommended.mechanism}


def _score(row: PlanRow, order: dict[str, int]) -> tuple:
    e = row.expectation
    value = e.accuracy if e.accuracy is not None else e.agreement
    return (value, e.answered, row.delta_per_query == 0, -order[row.mechanism])


def _reason(best: PlanRow, labelled: bool, runner_up: PlanRow | None) -> str:
    e = best.expectation
    what = (f"the highest expected accuracy against the labels ({e.accuracy:.3f})" if labelled
            else f"the highest expected agreement with the served model ({e.agreement:.3f}; "
                 f"no labels given)")
    text = (f"{best.mechanism} under {best.accountant} composition has {what}, answering "
            f"{e.answered:.1%} of queries in expectation")
    if runner_up is not None:
        r = runner_up.expectation
        value = r.accuracy if labelled else r.agreement
        text += f"; next best {runner_up.mechanism} ({value:.3f})"
    return text


def plan_release(inputs: Certified | Votes, n_queries: int, epsilon_total: float,
                 delta_total: float = 0.0, relation: str = REPLACE_ONE,
                 labels: ArrayLike | None = None, *,
                 mechanisms: tuple[str, ...] | None = None,
                 accountants: tuple[str, ...] = PLAN_ACCOUNTANTS,
                 options: dict[str, dict] | None = None,
                 n_k_values: int | None = None,
                 min_answered: float = MIN_ANSWERED,
                 monte_carlo_draws: int = 200,
                 rng: np.random.Generator | None = None) -> ReleasePlan:
    """Plan a release of B queries within a total budget (module docstring).

    For each mechanism m and accountant a that apply, the per-query guarantee
    (eps_q, delta_q) is the largest whose B-fold composition under a fits
    (epsilon_total, delta_total) (`accounting.plan_queries`; `rdp_plan.plan_renyi` for
    rdp), and the expectations are those of m at (eps_q, delta_q) on the sample
    (`expectation.expect`: A = mean_i P(L_i = c_i), E = mean_i P(L_i = y_i), N = mean_i
    P(L_i answered)); a mechanism without a closed-form law gets a Monte Carlo estimate of
    `monte_carlo_draws` real draws (`expectation.simulate_expectation`, its standard error
    recorded in the row's expectation).

    Args:
        inputs: the owner's inputs on a query sample (predictions and radii, or votes).
        n_queries: B, the queries the budget must cover (the sample need not have B).
        epsilon_total: the total epsilon (> 0).
        delta_total: the total delta in [0, 1) (0 allows pure eps-DP mechanisms only).
        relation: the neighbouring relation of the ledger ("replace-one" or "add-remove");
            mechanisms whose inputs hold no guarantee under it are skipped.
        labels: optional (Q,) true labels of the sample.
        mechanisms: registry names to plan (default every one releasing these inputs).
        accountants: accountants to plan with (default every one; see `PLAN_ACCOUNTANTS`).
        options: per-mechanism options, e.g. ``{"svt": {"cutoff": 5}}``.
        n_k_values: the length of the k grid behind the radii, for the check's threshold
            rules (None: only its answered-fraction rule).
        min_answered: the check's least expected answered fraction.
        monte_carlo_draws: draws for a mechanism without a closed-form law (>= 2).
        rng: generator of those draws (default a fixed seed: the plan is reproducible).

    Returns:
        A `ReleasePlan` (owner-only).

    Raises:
        PrivacyError: an invalid budget, B or relation.
        ConfigError: an unknown mechanism or accountant, or one that does not release
            these inputs.
        DataError: labels that are not one class per query.
    """
    check_min_answered(min_answered)
    problems = privacy_problems("release plan")
    check_epsilon(epsilon_total, problems, name="epsilon_total")
    check_delta(delta_total, problems, name="delta_total", allow_zero=True)
    check_count(n_queries, problems, name="n_queries")
    check_relation(relation, problems)
    problems.raise_if_any()
    if not isinstance(inputs, (Certified, Votes)):
        raise ConfigError(f"a release plan takes Certified or Votes inputs, got "
                          f"{type(inputs).__name__}")
    registry = load_registry()
    kind = type(inputs)
    names = tuple(mechanisms) if mechanisms is not None else tuple(
        n for n, e in registry.items() if e.inputs is kind)
    for n in names:
        if n not in registry or registry[n].inputs is not kind:
            fitting = ", ".join(k for k, e in registry.items() if e.inputs is kind)
            raise ConfigError(f"{n!r} is not a mechanism for {kind.__name__} inputs; choose "
                              f"from {fitting}")
    for a in accountants:
        if a not in PLAN_ACCOUNTANTS:
            raise ConfigError(f"unknown accountant {a!r}; choose from {PLAN_ACCOUNTANTS}")
    options = options or {}
    rng = rng if rng is not None else np.random.default_rng(0)
    order = {n: i for i, n in enumerate(registry)}
    rows: list[PlanRow] = []
    skipped: list[tuple[str, str]] = []
    cache: dict[tuple, Expectation] = {}
    for name in names:
        entry = registry[name]
        opts = options.get(name, {})
        try:
            probe = make_mechanism(name, 1.0, 0.5 if entry.needs_delta else None, **opts)
            probe.check(inputs)
        except AGTError as exc:
            skipped.append((name, str(exc)))
            continue
        if relation not in probe.relations(inputs):
            skipped.append((name, f"these inputs are certified under "
                                  f"{', '.join(probe.relations(inputs))} only; plan under "
                                  f"that relation"))
            continue
        session = not probe.per_query
        for accountant in accountants:
            if session and accountant not in (SESSION_ACCOUNTANT, "rdp"):
                continue            # one spend: the same row as under standard
            try:
                mech = _planned(name, entry.needs_delta, accountant, epsilon_total,
                                delta_total, n_queries, session, opts)
                g = mech.guarantee_for(inputs, relation)
            except AGTError as exc:
                skipped.append((f"{name}/{accountant}", str(exc)))
                continue
            key = (name, g.epsilon, g.delta)
            if key not in cache:
                cache[key] = _expectation(mech, inputs, labels, n_queries, relation,
                                          monte_carlo_draws, rng)
            rows.append(PlanRow(name, accountant, g.epsilon, g.delta, mech.per_query,
                                cache[key], mech,
                                refusal(mech, inputs, cache[key], n_k_values, min_answered)))
    labelled = labels is not None
    passing = [r for r in rows if r.refused is None] or rows
    ranked = sorted(passing, key=lambda r: _score(r, order), reverse=True)
    best = ranked[0] if ranked else None
    runner_up = next((r for r in ranked if best is not None and r.mechanism != best.mechanism),
                     None)
    reason = (_reason(best, labelled, runner_up) if best is not None else
              "no mechanism applies to these inputs under this budget and relation")
    return ReleasePlan(tuple(rows), tuple(skipped), best, reason, int(n_queries),
                       float(epsilon_total), float(delta_total), relation, inputs.n_queries,
                       labelled)


def _planned(name: str, needs_delta: bool, accountant: str, epsilon_total: float,
             delta_total: float, n_queries: int, session: bool, opts: dict):
    """The mechanism at the per-query guarantee the accountant allows for B queries."""
    if accountant == "rdp":
        from mechanisms.rdp_plan import plan_renyi
        return plan_renyi(name, epsilon_total, delta_total, n_queries, **opts)
    eps_q, delta_q = plan_queries(epsilon_total, delta_total, n_queries, needs_delta,
                                  accountant, session=session)
    return make_mechanism(name, eps_q, delta_q if needs_delta else None, **opts)


def _expectation(mech, inputs, labels, n_queries: int, relation: str, draws: int,
                 rng: np.random.Generator) -> Expectation:
    try:
        return expect(mech, inputs, labels, n_queries)
    except NotImplementedError:
        return simulate_expectation(mech, inputs, rng, draws, labels, n_queries, relation)


