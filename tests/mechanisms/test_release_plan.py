"""Release plans and the check before spending: the exact laws agree with the empirical mean
of real releases drawn through the real mechanisms (and the ledger), the per-query
guarantees are the accounting inverse's, and refusals name their reason."""

from __future__ import annotations

import numpy as np
import pytest

from agt.errors import ConfigError, ReleaseRefusedError
from mechanisms import Certified, Source, Votes, make_mechanism
from mechanisms.accounting import plan_queries
from mechanisms.base import Mechanism
from mechanisms.expectation import deployments, expect, simulate_expectation
from mechanisms.release_check import check_release, largest_radius
from mechanisms.release_plan import JSON_KEYS, plan_release

SOURCE = Source("bundle", "d" * 64, ("replace-one",), True)


def certified(q: int, n_classes: int, seed: int, top: int = 12):
    """Q queries with radii in [-1, top] and labels the model gets right 80% of the time."""
    rng = np.random.default_rng(seed)
    pred = rng.integers(0, n_classes, q)
    radius = rng.integers(-1, top + 1, q)
    y = np.where(rng.random(q) < 0.8, pred, (pred + 1) % n_classes)
    return Certified(pred, radius, n_classes, SOURCE), y


def gated(q: int, n_classes: int, seed: int):
    """Radii mostly far above a sparse-vector gate's threshold, a tenth near -1."""
    rng = np.random.default_rng(seed)
    pred = rng.integers(0, n_classes, q)
    radius = np.where(rng.random(q) < 0.9, rng.integers(30, 60, q), rng.integers(-1, 4, q))
    y = np.where(rng.random(q) < 0.8, pred, (pred + 1) % n_classes)
    return Certified(pred, radius, n_classes, SOURCE), y


def votes(q: int, t: int, seed: int):
    rng = np.random.default_rng(seed)
    v = np.where(rng.random((q, t)) < 0.75, rng.integers(0, 2, q)[:, None],
                 rng.integers(0, 2, (q, t)))
    r = rng.integers(-1, 6, (q, t))
    return Votes(v, r, 2, SOURCE), v[:, 0].copy()


def assert_close(exact, mc) -> None:
    """Every fraction of the exact law within 4 standard errors of the draws' mean (the
    smallest resolvable difference, 1 / (Q draws), where the draws did not vary)."""
    tol = 4 * mc.standard_error + 1e-9
    for name in ("answered", "agreement", "accuracy"):
        a, b = getattr(exact, name), getattr(mc, name)
        assert (a is None) == (b is None)
        if a is not None:
            assert abs(a - b) <= tol + 1.0 / (mc.draws * 40), (name, a, b, tol)


@pytest.mark.parametrize("name,eps,delta,opts,classes", [
    ("exp-radius", 0.3, None, {}, 3),
    ("ptr", 0.8, 1e-3, {}, 3),
    ("svt", 8.0, 1e-4, {"cutoff": 4}, 3),
    ("svt", 8.0, 1e-4, {"cutoff": 4, "fallback": "refuse"}, 2),
    ("ss-cauchy", 1.0, None, {}, 2),
])
def test_exact_law_matches_real_releases(name, eps, delta, opts, classes):
    inputs, y = (gated if name == "svt" else certified)(40, classes, seed=3)
    mech = make_mechanism(name, eps, delta, **opts)
    exact = expect(mech, inputs, y)
    mc = simulate_expectation(mech, inputs, np.random.default_rng(11), 60, y)
    assert exact.law == "exact" and mc.law == "monte-carlo" and mc.draws == 60
    assert_close(exact, mc)


def test_session_law_over_deployments_of_b_queries():
    """A session's law depends on B: the sample is cut into sessions of B (or repeated up to
    B); the exact law and real sessions agree either way."""
    inputs, y = gated(30, 2, seed=5)
    mech = make_mechanism("svt", 8.0, 1e-4, cutoff=3, fallback="refuse")
    for b in (12, 45):
        exact = expect(mech, inputs, y, n_queries=b)
        mc = simulate_expectation(mech, inputs, np.random.default_rng(b), 60, y, n_queries=b)
        assert_close(exact, mc)
    assert expect(mech, inputs, y, 12).answered != expect(mech, inputs, y, 45).answered
    assert [len(d) for d in deployments(30, 12)] == [12, 12, 6]
    assert deployments(3, 7)[0].tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_ensemble_law_matches_real_releases():
    inputs, y = votes(30, 5, seed=2)
    for name, eps, delta in (("ens-exp-radius", 0.5, None), ("lnmax", 1.0, None)):
        mech = make_mechanism(name, eps, delta)
        assert_close(expect(mech, inputs, y),
                     simulate_expectation(mech, inputs, np.random.default_rng(1), 60, y))


def test_answered_law_of_a_session_is_the_generic_one():
    """svt's one-pass answered law equals the sum over classes of its correct law."""
    inputs, _ = certified(25, 3, seed=7)
    mech = make_mechanism("svt", 2.0, 1e-5, cutoff=4)
    np.testing.assert_allclose(mech.answered_probability(inputs),
                               Mechanism.answered_probability(mech, inputs), atol=1e-12)


def test_plan_uses_the_accounting_inverse_and_recommends_the_best_row():
    inputs, y = certified(40, 3, seed=1)
    plan = plan_release(inputs, 100, 2.0, 1e-5, labels=y,
                        accountants=("standard", "best", "rdp"))
    rows = {(r.mechanism, r.accountant): r for r in plan.rows}
    for (name, acc), row in rows.items():
        if acc in ("standard", "best") and row.per_query:
            needs = name == "ptr"
            eps_q, delta_q = plan_queries(2.0, 1e-5, 100, needs, acc)
            assert (row.epsilon_per_query, row.delta_per_query) == (eps_q, delta_q)
    assert ("svt", "standard") in rows and ("svt", "best") not in rows     # one session row
    assert rows[("svt", "standard")].epsilon_per_query == 2.0
    assert ("gs", "standard") not in rows and any(n == "gs" for n, _ in plan.skipped)
    assert any(n == "ptr/rdp" for n, _ in plan.skipped)                     # no Renyi curve
    # ptr answers nothing at these eps: marked refused by the check, and not recommended
    assert rows[("ptr", "standard")].refused and "below the minimum" in \
        rows[("ptr", "standard")].refused
    assert rows[("exp-radius", "standard")].refused is None
    best = max((r for r in plan.rows if r.refused is None),
               key=lambda r: r.expectation.accuracy)
    assert plan.recommended.expectation.accuracy == best.expectation.accuracy
    assert plan.recommended.mechanism in plan.reason
    assert plan.recommended.planned.name == plan.recommended.mechanism    # ready to release
    out = plan.to_json()
    assert set(out) == {"rows", "recommended"} and out["recommended"] == best.mechanism
    assert all(tuple(r) == JSON_KEYS for r in out["rows"])
    # without labels: accuracy null, the recommendation by agreement
    unlabelled = plan_release(inputs, 100, 2.0, 1e-5, accountants=("standard",))
    assert all(r["expected_accuracy"] is None for r in unlabelled.to_json()["rows"])
    assert "agreement" in unlabelled.reason


def test_plan_refuses_bad_requests():
    inputs, _ = certified(10, 2, seed=0)
    with pytest.raises(ConfigError, match="not a mechanism for Certified"):
        plan_release(inputs, 10, 1.0, mechanisms=("lnmax",))
    with pytest.raises(ConfigError, match="unknown accountant"):
        plan_release(inputs, 10, 1.0, accountants=("nope",))
    with pytest.raises(Exception, match="n_queries"):
        plan_release(inputs, 0, 1.0)


def test_check_refuses_thresholds_no_query_passes_and_low_yield():
    inputs, _ = certified(30, 2, seed=4, top=20)
    gate = make_mechanism("svt", 1.0, 1e-6)
    assert gate.threshold > 20
    with pytest.raises(ReleaseRefusedError, match="gate threshold T = .* above the largest "
                                                  "radius .*\\(20\\).*--force"):
        check_release(gate, inputs, n_k_values=21)
    ptr = make_mechanism("ptr", 0.5, 1e-6)
    with pytest.raises(ReleaseRefusedError, match="ptr's threshold"):
        check_release(ptr, inputs, n_k_values=21)
    with pytest.raises(ReleaseRefusedError, match="expected to answer .* below the minimum"):
        check_release(ptr, inputs)                     # no grid: the answered rule alone
    assert check_release(ptr, inputs, n_k_values=21, force=True).answered < 0.05
    assert check_release(ptr, inputs, min_answered=0.0).answered >= 0.0
    exp = check_release(make_mechanism("exp-radius", 0.5), inputs, n_k_values=21)
    assert exp.answered == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="min_answered"):
        check_release(ptr, inputs, min_answered=2.0)


def test_largest_radius_of_an_ensemble_is_its_unanimous_top():
    inputs, _ = votes(5, 4, seed=0)
    assert largest_radius(inputs, 6) > 5
    single, _ = certified(5, 2, seed=0)
    assert largest_radius(single, 6) == 5
