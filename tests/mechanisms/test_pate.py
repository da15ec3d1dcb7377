"""PATE's GNMax releases and their Renyi accounting (mechanisms/rdp.py, pate.py, pate_costs.py
and the ledger's rdp accountant).

Golden values come from formulas written out again here in mpmath (50 digits), never from the
code under test; the privacy claims are checked on the exact output laws of small instances
(every neighbouring pair of vote counts), and each such check is shown able to fail: a claim
with a wrong constant is violated by some pair."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from functools import lru_cache

import mpmath as mp
import numpy as np
import pytest
from scipy import stats

from agt.errors import BudgetExceededError, DataError, PrivacyError
from mechanisms import Certified, Ledger, Source, Votes, make_mechanism
from mechanisms.exact import discrete_gaussian
from mechanisms.pate import (
    REFUSED,
    answer_probabilities,
    dg_pmf,
    difference_tail,
    gaussian_tail,
    gnmax_label_probabilities,
    gnmax_probabilities,
)
from mechanisms.pate_costs import (
    SanitisationPlan,
    SanitisedCost,
    data_dependent_report,
    gnmax_q,
    lnmax_bound,
    sanitised_epsilon,
    thm6_bound,
)
from mechanisms.rdp import (
    ORDERS,
    compose_curves,
    curve_epsilon,
    gaussian_curve,
    gnss_curve,
    pure_curve,
)

SHA = "ab" * 32
SOURCE = Source("pate-test", SHA, ("replace-one",), True)
DPS = 50


# -- independent high-precision references --------------------------------------------------

@lru_cache(maxsize=None)
def mp_pmf(sigma: float, half_width: int) -> dict[int, mp.mpf]:
    """{z: P(Z = z)} for |z| <= half_width, Z ~ N_Z(0, sigma^2): exp(-z^2 / (2 sigma^2))
    normalised over |z| <= 60 sigma + 60 (the rest weighs below e^-1800)."""
    with mp.workdps(DPS):
        s2 = 2 * mp.mpf(sigma) ** 2
        wide = max(int(math.ceil(60 * sigma)) + 60, half_width)
        weight = {z: mp.exp(-mp.mpf(z) ** 2 / s2) for z in range(-wide, wide + 1)}
        norm = mp.fsum(weight.values())
        return {z: weight[z] / norm for z in range(-half_width, half_width + 1)}


def mp_upper_tails(p: dict[int, mp.mpf]) -> dict[int, mp.mpf]:
    """{k: P(Z >= k)} over the support of p (and one past its top)."""
    k_max = max(p)
    out, acc = {k_max + 1: mp.mpf(0)}, mp.mpf(0)
    with mp.workdps(DPS):
        for k in range(k_max, min(p) - 1, -1):
            acc += p[k]
            out[k] = acc
    return out


def mp_difference_tail(sigma: float, gaps: list[int]) -> list[mp.mpf]:
    """P(Z_1 - Z_2 >= g) = sum_z P(Z_2 = z) P(Z_1 >= g + z), Z_i i.i.d. N_Z(0, sigma^2)."""
    k = int(math.ceil(45 * sigma)) + max(abs(g) for g in gaps) + 10
    p = mp_pmf(sigma, k)
    tail = mp_upper_tails(p)

    def at_least(m: int) -> mp.mpf:
        return mp.mpf(1) if m < -k else tail[min(m, k + 1)]

    with mp.workdps(DPS):
        return [mp.fsum(p[z] * at_least(g + z) for z in range(-k, k + 1)) for g in gaps]


def mp_thm6(q: float, sigma: float, order: float) -> tuple[mp.mpf, str]:
    """PATE 2018 Thm 6 for a mechanism with curve mu / sigma^2, as printed; the branch taken."""
    with mp.workdps(DPS):
        q, s, lam = mp.mpf(q), mp.mpf(sigma), mp.mpf(order)
        plain = lam / s ** 2
        mu2 = s * mp.sqrt(mp.log(1 / q))
        mu1 = mu2 + 1
        eps1, eps2 = mu1 / s ** 2, mu2 / s ** 2
        if not (mu2 > 1 and lam <= mu1 and q * mp.exp(eps2) < 1):
            return plain, "plain"
        if not q <= mp.exp((mu2 - 1) * eps2) / ((mu1 / (mu1 - 1)) * (mu2 / (mu2 - 1))) ** mu2:
            return plain, "higher-order condition"
        a = (1 - q) / (1 - (q * mp.exp(eps2)) ** ((mu2 - 1) / mu2))
        b = mp.exp(eps1) / q ** (1 / (mu1 - 1))
        bound = mp.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1)
        return min(bound, plain), "data-dependent"


def mp_lnmax(q: float, epsilon: float, order: float) -> tuple[mp.mpf, str]:
    """PATE 2017 Thm 3 in Renyi form at order lambda = l + 1, as printed; the branch taken."""
    with mp.workdps(DPS):
        q, e, lam = mp.mpf(q), mp.mpf(epsilon), mp.mpf(order)
        l = lam - 1  # noqa: E741
        plain = min(e, lam * e ** 2 / 2)
        if not q < (mp.exp(e) - 1) / (mp.exp(2 * e) - 1):
            return plain, "plain"
        bound = mp.log((1 - q) * ((1 - q) / (1 - mp.exp(e) * q)) ** l + q * mp.exp(e * l)) / l
        return min(bound, plain), "data-dependent"


def mp_conversion(curve, delta: float) -> mp.mpf:
    """min over the finite orders of r(a) + ln((a - 1) / a) - (ln delta + ln a) / (a - 1)
    (Canonne, Kamath & Steinke 2020, Prop. 12), floored at 0."""
    with mp.workdps(DPS):
        d = mp.mpf(delta)
        best = min(mp.mpf(r) + mp.log((a - 1) / mp.mpf(a)) - (mp.log(d) + mp.log(a)) / (a - 1)
                   for a, r in zip(ORDERS, curve) if math.isfinite(r))
        return max(best, mp.mpf(0))


def mp_renyi(p, q, order: float) -> mp.mpf:
    """D_order(P || Q) of two laws on the same finite outputs."""
    with mp.workdps(30):
        a = mp.mpf(order)
        terms = [mp.mpf(x) ** a * mp.mpf(y) ** (1 - a) for x, y in zip(p, q) if x > 0]
        return mp.log(mp.fsum(terms)) / (a - 1)


def hockey_stick(p, q, epsilon: float) -> mp.mpf:
    """sum_y max(0, P(y) - e^eps Q(y)): the least delta of (eps, delta) for this pair."""
    with mp.workdps(30):
        factor = mp.exp(epsilon)
        return mp.fsum(max(mp.mpf(0), mp.mpf(x) - factor * mp.mpf(y)) for x, y in zip(p, q))


def count_vectors(n_teachers: int, n_classes: int) -> list[tuple[int, ...]]:
    return [c for c in itertools.product(range(n_teachers + 1), repeat=n_classes)
            if sum(c) == n_teachers]


def moved(counts: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The count vectors one replaced record can reach: one vote moved to another class."""
    out = []
    for i, j in itertools.permutations(range(len(counts)), 2):
        if counts[i] > 0:
            c = list(counts)
            c[i] -= 1
            c[j] += 1
            out.append(tuple(c))
    return out


def votes_for(counts_rows, source: Source = SOURCE) -> Votes:
    """Votes whose count vectors are the given rows (teachers in class order)."""
    rows = [np.repeat(np.arange(len(c)), c) for c in counts_rows]
    return Votes(np.asarray(rows, dtype=np.int64), None, len(counts_rows[0]), source)


# -- 1. golden values of the data-dependent bounds ------------------------------------------

Q_GRID = [1e-30, 1e-20, 1e-12, 1e-8, 1e-5, 1e-3, 1e-2, 10 ** -1.5, 0.1, 0.2, 0.35, 0.5]
THM6_ORDERS = [2.0, 2.5, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0]


@pytest.mark.parametrize("sigma", [2.0, 10.0, 40.0, 150.0])
def test_thm6_bound_matches_the_printed_theorem(sigma):
    branches, wrong = set(), []
    for order in THM6_ORDERS:
        got = thm6_bound(np.log(Q_GRID), sigma, order)
        assert got.shape == (len(Q_GRID),)
        for q, value in zip(Q_GRID, got):
            exact, branch = mp_thm6(q, sigma, order)
            branches.add(branch)
            if abs(mp.mpf(value) / exact - 1) > 1e-9:
                wrong.append(f"thm6_bound(ln {q:g}, {sigma}, {order}) = {value!r}, Thm 6 gives "
                             f"{mp.nstr(exact, 12)} ({branch}; "
                             f"{'BELOW' if value < exact else 'above'} it)")
    # the grid reaches the data-dependent branch (and, for the small sigmas, the others)
    assert "data-dependent" in branches
    if sigma <= 10:
        assert {"plain", "higher-order condition"} <= branches
    assert not wrong, f"{len(wrong)} mismatches, e.g.\n" + "\n".join(wrong[:6])


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0, 5.0])
def test_lnmax_bound_matches_pate_2017_thm3(epsilon):
    branches = set()
    for order in THM6_ORDERS:
        got = lnmax_bound(np.log(Q_GRID), epsilon, order)
        for q, value in zip(Q_GRID, got):
            exact, branch = mp_lnmax(q, epsilon, order)
            branches.add(branch)
            assert float(abs(mp.mpf(value) / exact - 1)) <= 1e-9, (q, epsilon, order, value,
                                                                   exact, branch)
    assert branches == {"plain", "data-dependent"}


def test_the_bounds_fall_back_to_the_data_independent_values():
    # q = 1/2 breaks every condition of Thm 6 at sigma 2 (mu_2 = 1.67, q e^eps2 > 1)
    assert thm6_bound(np.log([0.5]), 2.0, 3.0)[0] == pytest.approx(3.0 / 4.0, rel=1e-15)
    # an order above mu_1 is the data-independent order / sigma^2 too
    order = 64.0
    mu1 = 10.0 * math.sqrt(math.log(1e3)) + 1
    assert order > mu1
    assert thm6_bound(np.log([1e-3]), 10.0, order)[0] == pytest.approx(0.64, rel=1e-15)
    # lnmax at q >= 1 / (e^eps + 1): the pure curve min(eps, order eps^2 / 2)
    assert lnmax_bound(np.log([0.3]), 1.0, 2.0)[0] == pytest.approx(1.0, rel=1e-15)
    assert lnmax_bound(np.log([0.45]), 0.5, 2.0)[0] == pytest.approx(0.25, rel=1e-15)


# -- 2. the discrete Gaussian: tails, pmf and the exact sampler ----------------------------

@pytest.mark.parametrize("sigma", [0.7, 3.0, 40.0])
def test_difference_tail_brackets_the_exact_sum(sigma):
    gaps = list(range(-5, 51))
    exact = mp_difference_tail(sigma, gaps)
    upper = difference_tail(sigma, gaps)
    lower = difference_tail(sigma, np.asarray(gaps), bound="lower")
    bad = []
    for g, e, u, lo in zip(gaps, exact, upper, lower):
        if not mp.mpf(lo) <= e <= mp.mpf(u):
            bad.append(f"gap {g}: lower {lo!r} <= exact {mp.nstr(e, 8)} <= upper {u!r} fails")
        if e > 1e-290:      # a float holds the value: the bracket is 1e-9 relative
            if abs(mp.mpf(u) / e - 1) > 1e-8 or abs(mp.mpf(lo) / e - 1) > 1e-8:
                bad.append(f"gap {g}: bracket [{lo!r}, {u!r}] not within 1e-8 of "
                           f"{mp.nstr(e, 12)}")
        elif u > 1e-299:
            bad.append(f"gap {g}: upper {u!r} far above the exact {mp.nstr(e, 6)}")
    assert not bad, f"sigma {sigma}: " + "; ".join(bad[:5])
    # a tie or better for the trailing class has probability >= 1/2 at gap 0 (symmetry)
    assert upper[gaps.index(0)] > 0.5 > upper[gaps.index(1)]


@pytest.mark.parametrize("sigma", [0.5, 3.0, 40.0])
def test_gaussian_tail_and_pmf_are_the_discrete_gaussian(sigma):
    ts = [-150.5, -10.5, -2.0, 0.0, 0.5, 1.0, 3.2, 7.0, 30.0, 100.0, 170.25]
    k = int(math.ceil(45 * sigma)) + 200
    p = mp_pmf(sigma, k)
    tail = mp_upper_tails(p)
    got = gaussian_tail(sigma, ts)
    for t, value in zip(ts, got):
        exact = tail[min(max(math.ceil(t), -k), k + 1)]
        if exact > 1e-290:
            assert float(abs(mp.mpf(value) / exact - 1)) <= 1e-10, (sigma, t, value, exact)
        else:
            assert value <= 1e-290, (sigma, t, value)
    w = int(math.ceil(12 * sigma)) + 2
    pmf = dg_pmf(sigma, w)
    assert len(pmf) == 2 * w + 1
    for z in range(-w, w + 1):
        if p[z] > 1e-290:
            assert float(abs(mp.mpf(pmf[z + w]) / p[z] - 1)) <= 1e-12, (sigma, z)


def _chi_square(draws: np.ndarray, pmf: dict[int, mp.mpf]) -> tuple[float, int]:
    """Pearson's statistic of the draws against pmf, cells with expected counts >= 5 and the
    two tails pooled; (statistic, degrees of freedom)."""
    n = len(draws)
    inner = [z for z in sorted(pmf) if float(pmf[z]) * n >= 5]
    lo, hi = min(inner), max(inner)
    expected = [float(mp.fsum(pmf[z] for z in pmf if z <= lo)) * n]
    observed = [int(np.sum(draws <= lo))]
    for z in range(lo + 1, hi):
        expected.append(float(pmf[z]) * n)
        observed.append(int(np.sum(draws == z)))
    expected.append(float(mp.fsum(pmf[z] for z in pmf if z >= hi)) * n)
    observed.append(int(np.sum(draws >= hi)))
    e, o = np.asarray(expected), np.asarray(observed)
    assert abs(e.sum() - n) < 1e-6 * n
    return float(np.sum((o - e) ** 2 / e)), len(e) - 1


@pytest.mark.parametrize("sigma", [0.5, 3.0])
def test_discrete_gaussian_sampler_has_the_pmf(sigma):
    n = 20000
    k = int(math.ceil(20 * sigma)) + 5
    law = mp_pmf(sigma, k)
    exact_var = float(mp.fsum(law[z] * z * z for z in law))

    def sample(s: float, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        s2 = Fraction(s) ** 2
        return np.array([discrete_gaussian(s2, rng) for _ in range(n)])

    def accepted(draws: np.ndarray) -> bool:
        stat, dof = _chi_square(draws, law)
        var_ok = abs(np.var(draws) / exact_var - 1) < 0.07
        return stat < stats.chi2.ppf(1 - 1e-4, dof) and abs(np.mean(draws)) < 0.05 * sigma \
            and var_ok

    assert accepted(sample(sigma, 20180 + int(10 * sigma)))
    # the same test rejects a sampler whose sigma is off by 10% (either way)
    assert not accepted(sample(1.1 * sigma, 7))
    assert not accepted(sample(sigma / 1.1, 8))


# -- 3. Renyi curves and their conversion ----------------------------------------------------

def _close_above(got, exact, rel=1e-11) -> bool:
    """got is the exact value rounded up: not below it, and within rel."""
    exact = mp.mpf(exact)
    return mp.mpf(got) >= exact and (exact == 0 and got == 0 or abs(got / exact - 1) <= rel)


def test_gaussian_and_pure_curves_are_their_formulas():
    assert len(ORDERS) == len(set(ORDERS)) and list(ORDERS) == sorted(ORDERS)
    assert ORDERS[0] > 1
    for rho in (1e-6, 1 / 1600, 0.5, 3.0):
        curve = gaussian_curve(rho)
        assert len(curve) == len(ORDERS)
        for a, r in zip(ORDERS, curve):
            assert _close_above(r, mp.mpf(rho) * a), (rho, a, r)
    assert gaussian_curve(0.0) == (0.0,) * len(ORDERS)
    for eps in (0.01, 0.3, 1.0, 4.0):
        for a, r in zip(ORDERS, pure_curve(eps)):
            assert _close_above(r, min(mp.mpf(eps), a * mp.mpf(eps) ** 2 / 2)), (eps, a, r)
    # the pure curve meets eps: below at small orders, equal above 2 / eps
    assert pure_curve(1.0)[ORDERS.index(1.5)] < 1.0
    assert pure_curve(1.0)[ORDERS.index(4.0)] == pytest.approx(1.0, rel=1e-11)


def test_gnss_curve_is_papernot_thm23():
    beta, sigma = 0.05, 16.0
    curve = gnss_curve(beta, sigma)
    with mp.workdps(DPS):
        for a, r in zip(ORDERS, curve):
            if 2 * a * beta >= 1:
                assert r == math.inf, a
                continue
            b, s, am = mp.mpf(beta), mp.mpf(sigma), mp.mpf(a)
            exact = am * mp.exp(2 * b) / s ** 2 + (b * am - mp.log(1 - 2 * am * b) / 2) / (am - 1)
            assert _close_above(r, exact, rel=1e-10), (a, r, exact)
    assert math.isfinite(curve[ORDERS.index(9.0)]) and curve[ORDERS.index(10.0)] == math.inf


def test_compose_curves_adds_order_by_order():
    c1, c2, c3 = gaussian_curve(0.01), pure_curve(0.2), gnss_curve(0.05, 16.0)
    total = compose_curves([(c1, 3), (c2, 5), (c3, 2)])
    for i, a in enumerate(ORDERS):
        exact = 3 * mp.mpf(c1[i]) + 5 * mp.mpf(c2[i]) + (2 * mp.mpf(c3[i])
                                                          if math.isfinite(c3[i]) else mp.inf)
        if exact == mp.inf:
            assert total[i] == math.inf
        else:
            assert _close_above(total[i], exact), (a, total[i], exact)
    # a group of count 0 adds nothing, even with infinite entries
    assert compose_curves([(c1, 4), (c3, 0)]) == compose_curves([(c1, 4)])
    assert compose_curves([(c1, 2)]) == compose_curves([(c1, 1), (c1, 1)])
    assert compose_curves([]) == (0.0,) * len(ORDERS)


@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_curve_epsilon_is_the_ckl_conversion(delta):
    curves = [gaussian_curve(0.001), gaussian_curve(0.4), gaussian_curve(640 / 1600),
              compose_curves([(gaussian_curve(0.01), 7), (pure_curve(0.3), 2)]),
              compose_curves([(gnss_curve(0.05, 16.0), 1), (gaussian_curve(0.02), 1)])]
    for curve in curves:
        eps, order = curve_epsilon(curve, delta)
        exact = mp_conversion(curve, delta)
        assert exact > 0
        assert _close_above(eps, exact, rel=1e-9), (eps, exact)
        i = ORDERS.index(order)
        with mp.workdps(DPS):
            at_order = (mp.mpf(curve[i]) + mp.log((order - 1) / mp.mpf(order))
                        - (mp.log(delta) + mp.log(order)) / (order - 1))
        assert abs(at_order - exact) <= 1e-12 * exact
        # Mironov's plain conversion is never tighter
        assert eps <= min(r + math.log(1 / delta) / (a - 1)
                          for a, r in zip(ORDERS, curve) if math.isfinite(r)) * (1 + 1e-12)
    assert curve_epsilon((math.inf,) * len(ORDERS), delta)[0] == math.inf
    # a closed form: r = rho a gives eps ~ rho + 2 sqrt(rho ln(1/delta)) (Mironov); CKS is
    # at most that
    rho = 0.05
    assert curve_epsilon(gaussian_curve(rho), delta)[0] <= \
        rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1e-9


# -- 4. exact output laws against the stated guarantees ------------------------------------

def brute_force_gnmax(counts_list, sigma: float) -> list[list[mp.mpf]]:
    """P(y | counts) by summing over every noise vector with |z_c| <= 10 sigma + 3 (the rest
    weighs below e^-50), a tie shared uniformly among the maximisers."""
    n_classes = len(counts_list[0])
    k = int(math.ceil(10 * sigma)) + 3
    p = mp_pmf(sigma, k)
    with mp.workdps(DPS):
        noise = list(itertools.product(range(-k, k + 1), repeat=n_classes))
        weight = [mp.fprod(p[z] for z in zs) for zs in noise]
        out = []
        for counts in counts_list:
            acc = [[] for _ in range(n_classes)]
            for zs, w in zip(noise, weight):
                noisy = [n + z for n, z in zip(counts, zs)]
                top = max(noisy)
                winners = [i for i, v in enumerate(noisy) if v == top]
                for i in winners:
                    acc[i].append(w / len(winners))
            out.append([mp.fsum(a) for a in acc])
        return out


@pytest.mark.parametrize("sigma, n_teachers, n_classes", [(0.5, 4, 3), (1.0, 6, 2),
                                                          (0.8, 3, 3)])
def test_gnmax_probabilities_match_a_brute_force_sum(sigma, n_teachers, n_classes):
    vectors = count_vectors(n_teachers, n_classes)
    got = gnmax_probabilities(np.asarray(vectors), sigma)
    exact = brute_force_gnmax(vectors, sigma)
    for counts, row, ref in zip(vectors, got, exact):
        assert abs(mp.fsum(ref) - 1) < 1e-25
        for y in range(n_classes):
            assert float(abs(mp.mpf(row[y]) / ref[y] - 1)) < 1e-12, (counts, y, row[y], ref[y])


@pytest.mark.parametrize("sigma", [0.7, 9.0, 150.0])
def test_label_probabilities_are_the_table_entries_bit_for_bit(sigma):
    """The expected accuracies read one entry per query (`gnmax_label_probabilities`, each
    distinct (counts, label) computed once): exactly the full table's entries, 0 for a label
    that is not a class, and through the mechanisms' correct_probability too."""
    rng = np.random.default_rng(3)
    votes = np.where(rng.random((40, 16)) < 0.7, rng.integers(0, 5, 40)[:, None],
                     rng.integers(0, 5, (40, 16)))
    counts = np.stack([np.bincount(v, minlength=5) for v in votes])
    counts = np.concatenate([counts, counts[:7]])                  # repeated rows
    y = rng.integers(0, 5, len(counts))
    y[:3] = (REFUSED, 5, 99)
    table = gnmax_probabilities(counts, sigma)
    got = gnmax_label_probabilities(counts, sigma, y)
    valid = (y >= 0) & (y < 5)
    assert np.array_equal(got[valid], table[np.flatnonzero(valid), y[valid]])
    assert np.all(got[~valid] == 0.0)
    inputs = Votes(votes.astype(np.int64), None, 5, SOURCE)
    mech = make_mechanism("gnmax", 1e6, 1e-5, sigma=sigma)
    assert np.array_equal(mech.correct_probability(inputs, y[:40]),
                          np.where(valid[:40], got[:40], 0.0))
    with pytest.raises(ValueError, match="one per query"):
        gnmax_label_probabilities(counts, sigma, y[:3])


def _gnmax_laws(sigma, n_teachers, n_classes):
    vectors = count_vectors(n_teachers, n_classes)
    probs = gnmax_probabilities(np.asarray(vectors), sigma)
    return {v: probs[i] for i, v in enumerate(vectors)}


def _worst_ratios(laws, claims) -> dict[str, float]:
    """For each named claim (a curve): the largest D_alpha / claim(alpha) over neighbouring
    pairs and orders."""
    worst = dict.fromkeys(claims, 0.0)
    for counts, law in laws.items():
        for other in moved(counts):
            for i, a in enumerate(ORDERS):
                d = mp_renyi(law, laws[other], a)
                for name, curve in claims.items():
                    worst[name] = max(worst[name], float(d / mp.mpf(curve[i])))
    return worst


def _worst_delta(laws, epsilon: float) -> float:
    return max(float(hockey_stick(law, laws[other], epsilon))
               for counts, law in laws.items() for other in moved(counts))


@pytest.mark.parametrize("sigma, n_teachers, n_classes", [(0.5, 6, 2), (0.5, 5, 3),
                                                          (1.0, 6, 2), (1.0, 5, 3),
                                                          (3.0, 4, 3)])
def test_gnmax_output_law_is_within_its_curve(sigma, n_teachers, n_classes):
    delta = 1e-3
    mech = make_mechanism("gnmax", 1e3, delta, sigma=sigma)
    guarantee = mech.guarantee("replace-one")
    for a, r in zip(ORDERS, guarantee.rdp):
        assert _close_above(r, a / mp.mpf(sigma) ** 2), (a, r)
    assert guarantee.delta == delta
    assert guarantee.epsilon == curve_epsilon(guarantee.rdp, delta)[0]

    laws = _gnmax_laws(sigma, n_teachers, n_classes)
    # sigma doubled in the claim = the curve divided by 4
    wrong = gaussian_curve(1 / (2 * sigma) ** 2)
    worst = _worst_ratios(laws, {"stated": guarantee.rdp, "sigma doubled": wrong})
    assert worst["stated"] <= 1.0, worst
    assert _worst_delta(laws, guarantee.epsilon) <= delta
    if sigma <= 1.0:
        # the check has teeth: the wrong claims fail on these laws
        assert worst["sigma doubled"] > 1.0, worst
        assert _worst_delta(laws, curve_epsilon(wrong, delta)[0]) > delta
    if (sigma, n_teachers, n_classes) == (0.5, 6, 2):
        # the curve is nearly tight here: 0.9 alpha / sigma^2 would already be violated
        assert worst["stated"] > 0.9, worst


def _confident_laws(sigma1, sigma2, threshold, n_teachers, n_classes):
    """{counts: (P(0), ..., P(C - 1), P(REFUSED))}: answer_probabilities x
    gnmax_probabilities for the labels; P(REFUSED) from the mpmath pmf, checked equal to
    1 - answer_probabilities."""
    vectors = count_vectors(n_teachers, n_classes)
    counts = np.asarray(vectors)
    answer = answer_probabilities(counts, threshold, sigma1)
    labels = gnmax_probabilities(counts, sigma2)
    k = int(math.ceil(45 * sigma1)) + n_teachers + 5
    p = mp_pmf(sigma1, k)
    laws = {}
    for i, v in enumerate(vectors):
        with mp.workdps(DPS):
            refused = mp.fsum(p[z] for z in p if max(v) + z < threshold)
            answered = mp.fsum(p[z] for z in p if max(v) + z >= threshold)
        assert float(abs(mp.mpf(answer[i]) / answered - 1)) < 1e-12, (v, answer[i])
        assert abs(float(refused) - (1 - answer[i])) < 1e-15, (v, answer[i])
        laws[v] = [answer[i] * labels[i, y] for y in range(n_classes)] + [refused]
    return laws


@pytest.mark.parametrize("sigma1, sigma2, threshold, n_teachers, n_classes", [
    (0.5, 1.0, 3, 6, 2), (1.0, 0.5, 3, 5, 3), (2.0, 1.0, 3.5, 5, 3), (0.7, 0.7, 3, 4, 3)])
def test_confident_gnmax_output_law_is_within_its_curve(sigma1, sigma2, threshold, n_teachers,
                                                        n_classes):
    delta = 1e-3
    mech = make_mechanism("confident-gnmax", 1e3, delta, threshold=threshold, sigma1=sigma1,
                          sigma2=sigma2)
    guarantee = mech.guarantee("replace-one")
    assert guarantee.rdp == mech.curve
    for a, r in zip(ORDERS, mech.curve):
        exact = a * (1 / (2 * mp.mpf(sigma1) ** 2) + 1 / mp.mpf(sigma2) ** 2)
        assert _close_above(r, exact), (a, r, exact)
    assert guarantee.epsilon == curve_epsilon(mech.curve, delta)[0]

    laws = _confident_laws(sigma1, sigma2, threshold, n_teachers, n_classes)
    claims = {"stated": mech.curve,
              "quarter": tuple(r / 4 for r in mech.curve),
              "gnmax step only": gaussian_curve(1 / sigma2 ** 2),
              "threshold step only": gaussian_curve(1 / (2 * sigma1 ** 2))}
    worst = _worst_ratios(laws, claims)
    assert worst["stated"] <= 1.0, worst
    assert _worst_delta(laws, guarantee.epsilon) <= delta
    # the check has teeth: the curve divided by 4 is violated, and so is a curve that leaves
    # out either step (where that step's noise is the smaller)
    assert worst["quarter"] > 1.0, worst
    if sigma1 < sigma2:
        assert worst["gnmax step only"] > 1.0, worst
    if sigma2 <= sigma1:
        assert worst["threshold step only"] > 1.0, worst


def test_releases_realise_the_stated_laws():
    """The exact samplers draw what the laws above describe (2000 copies of one query)."""
    n = 2000
    counts = (3, 2, 1)
    inputs = votes_for([counts] * n)
    gnmax = make_mechanism("gnmax", 1e3, 1e-3, sigma=1.0)
    freq = np.bincount(gnmax.release(inputs, np.random.default_rng(11)), minlength=3) / n
    law = gnmax_probabilities(np.asarray([counts]), 1.0)[0]
    assert np.all(np.abs(freq - law) <= 5 * np.sqrt(law * (1 - law) / n) + 1e-3), (freq, law)

    conf = make_mechanism("confident-gnmax", 1e3, 1e-3, threshold=4, sigma1=1.0, sigma2=1.0)
    out = conf.release(inputs, np.random.default_rng(12))
    answer = answer_probabilities(np.asarray([counts]), 4, 1.0)[0]
    law = np.append(answer * law, 1 - answer)
    freq = np.array([np.mean(out == y) for y in (0, 1, 2, REFUSED)])
    assert np.all(np.abs(freq - law) <= 5 * np.sqrt(law * (1 - law) / n) + 1e-3), (freq, law)
    # the correct-probability the experiments use is this law
    assert np.allclose(conf.correct_probability(inputs.subset(slice(0, 1)), np.array([0])),
                       law[0], rtol=1e-12)


# -- 5. data-dependent costs ----------------------------------------------------------------

def _mnist_like_votes() -> Votes:
    """640 queries, 250 teachers, 10 classes. Each query's true class gets a consensus share
    of the votes: with probability 1/2 a share in [0.8, 1] (200 to 250 votes: the teachers
    agree), else in [0.2, 0.8) (50 to 199 votes); the other votes go uniformly to the other
    9 classes. About half the queries then have >= 200 votes for their top class."""
    rng = np.random.default_rng(2018)
    q, t, c = 640, 250, 10
    true = rng.integers(0, c, q)
    share = np.where(rng.random(q) < 0.5, rng.uniform(0.8, 1.0, q), rng.uniform(0.2, 0.8, q))
    votes = np.empty((q, t), dtype=np.int64)
    for i in range(q):
        k = int(round(share[i] * t))
        others = rng.choice([j for j in range(c) if j != true[i]], size=t - k)
        votes[i] = np.concatenate([np.full(k, true[i]), others])
    return Votes(votes, None, c, SOURCE)


def test_data_dependent_cost_of_an_mnist_like_run():
    """PATE 2018's MNIST setting (T = 200, sigma1 = 150, sigma2 = 40, 640 queries, delta
    1e-5; its Table 1: 286 answered, eps 1.97) on synthetic votes."""
    inputs = _mnist_like_votes()
    tops = np.array([np.bincount(v, minlength=10).max() for v in inputs.votes])
    assert 0.4 <= np.mean(tops >= 200) <= 0.6
    mech = make_mechanism("confident-gnmax", 10.0, 1e-5, threshold=200, sigma1=150.0,
                          sigma2=40.0)
    labels = mech.release(inputs, np.random.default_rng(7))
    report = data_dependent_report(mech, inputs, labels, 1e-5)
    assert report.n_queries == 640
    assert report.n_answered == int(np.sum(labels != REFUSED))
    assert 200 <= report.n_answered <= 400

    # the data-independent charge: 640 alpha (1 / (2 150^2) + 1 / 40^2), converted
    independent = [640 * a * (1 / (2 * mp.mpf(150) ** 2) + 1 / mp.mpf(40) ** 2)
                   for a in ORDERS]
    for r, exact in zip(report.independent, independent):
        assert _close_above(r, exact, rel=1e-9)
    assert _close_above(report.eps_independent, mp_conversion(report.independent, 1e-5),
                        rel=1e-9)
    assert 4.0 < report.eps_independent < 5.0      # ~ 0.414 + 2 sqrt(0.414 ln 1e5)

    assert all(d <= i for d, i in zip(report.dependent, report.independent))
    assert all(d >= 0 for d in report.dependent)
    assert 0.5 <= report.eps_dependent <= 4.0
    assert report.eps_dependent < 0.6 * report.eps_independent
    assert report.eps_dependent == curve_epsilon(report.dependent, 1e-5)[0]


@pytest.mark.parametrize("sigma", [0.6, 2.0, 5.0])
def test_gnmax_q_bounds_the_probability_of_missing_the_top_class(sigma):
    rng = np.random.default_rng(int(sigma * 10))
    rows = [rng.multinomial(12, rng.dirichlet(np.ones(4) * 0.7)) for _ in range(60)]
    rows += [(6, 6, 0, 0), (12, 0, 0, 0), (4, 4, 4, 0), (3, 3, 3, 3), (7, 5, 0, 0)]
    counts = np.asarray(rows)
    q = gnmax_q(counts, sigma)
    probs = gnmax_probabilities(counts, sigma)
    for row, qi, p in zip(counts, q, probs):
        top = int(np.argmax(row))
        miss = math.fsum(p[j] for j in range(len(row)) if j != top)
        assert qi >= miss, (row, qi, miss)
        assert qi <= 1.0
    # two classes: the union bound is one term, P(Z_1 - Z_2 >= gap), exactly (a tie lost)
    for gap in (0, 1, 3, 6):
        pair = np.asarray([[gap + 2, 2]])
        above, at_least = mp_difference_tail(sigma, [gap + 1, gap])
        assert float(abs(gnmax_q(pair, sigma)[0] / at_least - 1)) < 1e-8
        # P(release not top) = P(D > gap) + P(D = gap) / 2 < P(D >= gap)
        miss = gnmax_probabilities(pair, sigma)[0, 1]
        assert float(abs(miss / ((above + at_least) / 2) - 1)) < 1e-12
        assert miss < gnmax_q(pair, sigma)[0]


# -- 6. refusals before any spend -----------------------------------------------------------

def _assert_one_line(exc_info) -> None:
    message = str(exc_info.value)
    assert message and "\n" not in message


@pytest.mark.parametrize("options", [
    dict(sigma=0.0), dict(sigma=-1.0), dict(sigma=float("nan")), dict(sigma=float("inf"))])
def test_gnmax_refuses_a_bad_sigma(options):
    with pytest.raises(PrivacyError, match="sigma") as exc:
        make_mechanism("gnmax", 1.0, 1e-5, **options)
    _assert_one_line(exc)


@pytest.mark.parametrize("options, match", [
    (dict(sigma1=0.0, sigma2=3.0), "sigma1"),
    (dict(sigma1=3.0, sigma2=float("nan")), "sigma2"),
    (dict(threshold=-1), "threshold"),
    (dict(threshold=float("nan")), "threshold"),
    (dict(sigma1=5.0), "both sigma1 and sigma2"),
    (dict(sigma2=5.0), "both sigma1 and sigma2"),
])
def test_confident_gnmax_refuses_bad_options(options, match):
    with pytest.raises(PrivacyError, match=match) as exc:
        make_mechanism("confident-gnmax", 1.0, 1e-5, **options)
    _assert_one_line(exc)


@pytest.mark.parametrize("name", ["gnmax", "confident-gnmax"])
@pytest.mark.parametrize("delta", [0, 0.0, 1.0, 1.5, -1e-5, float("nan")])
def test_refuses_a_delta_out_of_range(name, delta):
    with pytest.raises(PrivacyError, match="delta") as exc:
        make_mechanism(name, 1.0, delta)
    _assert_one_line(exc)


def test_refuses_given_sigmas_above_the_asked_epsilon():
    with pytest.raises(PrivacyError, match="above the epsilon") as exc:
        make_mechanism("gnmax", 0.1, 1e-5, sigma=1.0)
    _assert_one_line(exc)
    with pytest.raises(PrivacyError, match="above the epsilon"):
        make_mechanism("confident-gnmax", 0.1, 1e-5, sigma1=2.0, sigma2=1.0)


def test_a_threshold_above_the_teachers_is_refused_at_release_before_the_spend():
    ledger = Ledger.in_memory(100.0, 1e-5, "rdp")
    before = ledger.spent()
    mech = make_mechanism("confident-gnmax", 100.0, 1e-5, threshold=6, sigma1=2.0, sigma2=1.0)
    inputs = votes_for([(3, 2), (5, 0)])            # 5 teachers
    with pytest.raises(DataError, match="threshold") as exc:
        ledger.release(mech, inputs, insecure_seed=1)
    _assert_one_line(exc)
    assert ledger.entries() == [] and ledger.spent() == before
    # T = the number of teachers is allowed
    ok = make_mechanism("confident-gnmax", 100.0, 1e-5, threshold=5, sigma1=2.0, sigma2=1.0)
    assert len(ledger.release(ok, inputs, insecure_seed=1).labels) == 2


def test_an_rdp_ledger_needs_a_positive_delta():
    with pytest.raises(PrivacyError, match="budget_delta") as exc:
        Ledger.in_memory(1.0, 0.0, "rdp")
    _assert_one_line(exc)


def test_an_rdp_ledger_refuses_an_approximate_guarantee_without_a_curve():
    ledger = Ledger.in_memory(10.0, 1e-5, "rdp")
    before = ledger.spent()
    mech = make_mechanism("ens-ptr-votes", 1.0, 1e-6)
    with pytest.raises(PrivacyError, match="Renyi") as exc:
        ledger.release(mech, votes_for([(4, 1), (2, 3)]), insecure_seed=1)
    _assert_one_line(exc)
    assert ledger.entries() == [] and ledger.spent() == before


def _estimate() -> SanitisedCost:
    return SanitisedCost(SanitisationPlan.default(8.0), 0.5, 0.01, SOURCE.source_id, SHA)


def test_release_estimate_needs_an_rdp_ledger():
    ledger = Ledger.in_memory(10.0, 1e-5)
    with pytest.raises(PrivacyError, match="rdp ledger") as exc:
        ledger.release_estimate(_estimate(), insecure_rng=np.random.default_rng(0))
    _assert_one_line(exc)
    assert ledger.entries() == [] and ledger.spent().epsilon == 0


@pytest.mark.parametrize("order, beta", [(4.0, 0.125), (4.0, 0.3), (64.0, 1 / 128)])
def test_sanitisation_plan_refuses_an_infinite_release_cost(order, beta):
    with pytest.raises(PrivacyError, match="beta") as exc:
        SanitisationPlan(order, beta, 8.0)
    _assert_one_line(exc)
    SanitisationPlan(order, 0.99 / (2 * order), 8.0)     # just below 1 / (2 order) is fine


# -- 7. the rdp ledger composes curves --------------------------------------------------------

def test_rdp_ledger_spent_is_the_composed_curve_converted():
    ledger = Ledger.in_memory(50.0, 1e-5, "rdp")
    gnmax = make_mechanism("gnmax", 10.0, 1e-5, sigma=40.0)
    rng = np.random.default_rng(3)
    batches = [5, 7, 1]
    released = 0
    for n in batches:
        inputs = votes_for([tuple(rng.multinomial(9, [0.6, 0.3, 0.1])) for _ in range(n)])
        ledger.release(gnmax, inputs, insecure_seed=n)
        released += n
        curve = gnmax.guarantee("replace-one").rdp
        want = curve_epsilon(compose_curves([(curve, released)]), 1e-5)[0]
        assert ledger.spent().epsilon == want
        exact = mp_conversion([released * a / mp.mpf(1600) for a in ORDERS], 1e-5)
        assert _close_above(ledger.spent().epsilon, exact, rel=1e-9)
    assert len(ledger.entries()) == sum(batches)

    # other curves add to it: confident-gnmax's and a pure mechanism's min(eps, a eps^2 / 2)
    conf = make_mechanism("confident-gnmax", 10.0, 1e-5, threshold=5, sigma1=80.0,
                          sigma2=40.0)
    ledger.release(conf, votes_for([(6, 2, 1)] * 3), insecure_seed=4)
    gs = make_mechanism("gs", 0.5)
    ledger.release(gs, Certified(np.array([0, 1]), np.array([3, 3]), 2, SOURCE),
                   insecure_seed=5)
    total = compose_curves([(gnmax.guarantee("replace-one").rdp, released),
                            (conf.curve, 3), (pure_curve(0.5), 2)])
    assert ledger.spent().epsilon == curve_epsilon(total, 1e-5)[0]
    assert ledger.spent_curve() == total
    # Renyi composition beats adding the per-query epsilons
    assert ledger.spent().epsilon < sum(e.epsilon for e in ledger.entries())


def test_rdp_ledger_refuses_over_the_budget_and_records_nothing():
    gnmax = make_mechanism("gnmax", 10.0, 1e-5, sigma=40.0)
    curve = gnmax.guarantee("replace-one").rdp
    budget = curve_epsilon(compose_curves([(curve, 10)]), 1e-5)[0]
    inputs = votes_for([(5, 3, 1)] * 11)

    ledger = Ledger.in_memory(budget, 1e-5, "rdp")
    before = ledger.spent()
    with pytest.raises(BudgetExceededError, match="at most 10") as exc:
        ledger.release(gnmax, inputs, insecure_seed=1)
    _assert_one_line(exc)
    assert ledger.entries() == [] and ledger.spent() == before

    ledger.release(gnmax, inputs.subset(slice(0, 10)), insecure_seed=2)   # exactly the budget
    spent = ledger.spent()
    assert spent.epsilon == budget
    with pytest.raises(BudgetExceededError):
        ledger.release(gnmax, inputs.subset(slice(0, 1)), insecure_seed=3)
    assert len(ledger.entries()) == 10 and ledger.spent() == spent
    # an estimate's own cost is a charge too, refused the same way
    with pytest.raises(BudgetExceededError):
        ledger.release_estimate(_estimate(), insecure_rng=np.random.default_rng(0))
    assert len(ledger.entries()) == 10 and ledger.sanitised_estimates() == []


def test_release_estimate_charges_the_plans_curve():
    ledger = Ledger.in_memory(10.0, 1e-5, "rdp")
    estimate = _estimate()
    value, eps = ledger.release_estimate(estimate, insecure_rng=np.random.default_rng(0))
    plan = estimate.plan
    assert ledger.spent_curve() == compose_curves([(plan.curve, 1)])
    assert ledger.spent().epsilon == curve_epsilon(ledger.spent_curve(), 1e-5)[0]
    assert _close_above(ledger.spent().epsilon, mp_conversion(plan.curve, 1e-5), rel=1e-9)
    # eps = (V + the release's own cost at the order) converted at that one order
    lam = plan.order
    own = gnss_curve(plan.beta, plan.sigma)[ORDERS.index(lam)]
    with mp.workdps(DPS):
        exact = (max(0, value) + mp.mpf(own) + mp.log((lam - 1) / mp.mpf(lam))
                 - (mp.log(mp.mpf(1e-5)) + mp.log(lam)) / (lam - 1))
    assert _close_above(eps, exact, rel=1e-9)
    assert sanitised_epsilon(value, plan, 1e-5) == eps
    assert ledger.sanitised_estimates() == [(SOURCE.source_id, lam, value, eps)]
    # the default plan: beta = 0.4 / order, sigma = 2 order
    assert plan.beta == pytest.approx(0.05) and plan.sigma == 16.0
