"""Adversarial brute-force checks of the smooth-sensitivity claims of mechanisms/pate_costs.py.

F(D) is the run's data-dependent Renyi cost at one order (`_per_query_dependent(...).sum()`,
what `SanitisedCost.prepare(...).value` computes). The module claims:
(a) A_D(d) = `local_sensitivities(..., [d])` bounds |F(D') - F(E')| for every D' within d
    records of D and every neighbour E' of D';
(b) S(D) = `smooth_sensitivity(...)` satisfies S(D) <= e^beta S(E) on neighbours (and the
    lemma behind it, A_D(d) <= A_E(d + 1));
(c) the same with AGT radii (use_radii=True) for the radius-aware neighbour relation, and the
    AGT A(d) is never above the plain one;
and that the costs are monotone in q and A is monotone in d.

Datasets are enumerated exhaustively on small ensembles. One record belongs to one teacher, so
a neighbour replaces one teacher's votes (its column over all queries). Teachers are
exchangeable for F and A, so a dataset is held as the sorted tuple of its teachers' column
codes; a step replaces one code by any code its teacher can move to.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mechanisms import make_mechanism
from mechanisms.inputs import Source, Votes
from mechanisms.noise import REFUSED
from mechanisms.pate import ConfidentGaussianNoisyMax
from mechanisms.pate_costs import (
    SanitisationPlan,
    SanitisedCost,
    _per_query_dependent,
    count_extremes,
    gnmax_cost,
    local_sensitivities,
    smooth_sensitivity,
    threshold_cost,
)

SRC = Source("s", "d" * 64, ("replace-one",), True)
EPS = 1000.0          # the per-query epsilon only gates the sigmas; F and A do not depend on it
ORDERS = (2.0, 4.0, 8.0, 16.0)
BETAS = (0.05, 0.3, 1.0)
SIGMAS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
SLACK = 1e-12
RMAX = 7              # radii are held in -1..RMAX (start <= 4, at most 3 steps away)
RV = RMAX + 2         # number of radius values


# ---------------------------------------------------------------------------------------------
# Cases


class Case:
    """One mechanism, one released label vector, one order, one ensemble shape."""

    def __init__(self, mech, votes, radii, n_classes, labels, order):
        self.mech = mech
        self.votes = np.asarray(votes, dtype=np.int64)
        self.radii = None if radii is None else np.asarray(radii, dtype=np.int64)
        self.n_classes = int(n_classes)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.order = float(order)
        self.inputs = Votes(self.votes, self.radii, self.n_classes, SRC)
        self.threshold = (mech.threshold_for(self.inputs)
                          if isinstance(mech, ConfidentGaussianNoisyMax) else None)

    @property
    def n_queries(self) -> int:
        return self.votes.shape[0]

    @property
    def n_teachers(self) -> int:
        return self.votes.shape[1]

    def with_votes(self, votes, radii=None) -> "Case":
        return Case(self.mech, votes, radii, self.n_classes, self.labels, self.order)

    def describe(self) -> str:
        m = self.mech
        if isinstance(m, ConfidentGaussianNoisyMax):
            mech = (f"confident-gnmax(threshold={m.threshold!r} -> {self.threshold!r}, "
                    f"sigma1={m.sigma1!r}, sigma2={m.sigma2!r})")
        else:
            mech = f"gnmax(sigma={m.sigma!r})"
        radii = None if self.radii is None else self.radii.tolist()
        return (f"{mech}, order={self.order}, n_classes={self.n_classes}, "
                f"labels={self.labels.tolist()}, votes={self.votes.tolist()}, radii={radii}")

    def A(self, distances, use_radii=False):
        return local_sensitivities(self.mech, self.inputs, self.labels, self.order,
                                   np.asarray(distances), use_radii=use_radii)

    def S(self, beta, use_radii=False):
        return smooth_sensitivity(self.mech, self.inputs, self.labels, self.order, beta,
                                  use_radii=use_radii)


def _gnmax(sigma):
    return make_mechanism("gnmax", EPS, 1e-5, sigma=float(sigma))


def _confident(threshold, sigma1, sigma2):
    return make_mechanism("confident-gnmax", EPS, 1e-5, threshold=threshold,
                          sigma1=float(sigma1), sigma2=float(sigma2))


def histograms(n_teachers, n_classes):
    """Every count vector of n_teachers votes over n_classes classes."""
    return np.array([c for c in itertools.product(range(n_teachers + 1), repeat=n_classes)
                     if sum(c) == n_teachers], dtype=np.int64)


def cost_varies(case):
    """Whether some query's cost takes two values over the histograms (else F is constant
    and every bound holds trivially)."""
    h = histograms(case.n_teachers, case.n_classes)
    for answered in {bool(a) for a in case.labels != REFUSED}:
        per = _per_query_dependent(case.mech, h, np.full(len(h), answered), case.threshold,
                                   case.order)
        if np.ptp(per) > 0:
            return True
    return False


def random_case(rng, *, confident, with_radii=False, max_teachers=7, max_columns=9):
    """A small random ensemble whose costs vary (small sigmas, frequent consensus); cases
    whose cost is constant over every histogram are drawn again."""
    while True:
        case = _draw_case(rng, confident, with_radii, max_teachers, max_columns)
        if cost_varies(case):
            return case


def _draw_case(rng, confident, with_radii, max_teachers, max_columns):
    t = int(rng.integers(3, max_teachers + 1))
    c = int(rng.choice([2, 3]))
    q = int(rng.integers(1, 4))
    while c ** q > max_columns:
        q -= 1
    favourite = rng.integers(0, c, size=q)
    agree = rng.uniform(0.2, 1.0, size=q)
    votes = np.where(rng.random((q, t)) < agree[:, None], favourite[:, None],
                     rng.integers(0, c, size=(q, t)))
    radii = rng.integers(-1, 5, size=(q, t)) if with_radii else None
    order = float(rng.choice(ORDERS))
    if confident:
        s1, s2 = (float(x) for x in rng.choice(SIGMAS, size=2))
        kind = int(rng.integers(0, 3))
        threshold = (None if kind == 0 else float(rng.integers(0, t + 1)) if kind == 1
                     else round(float(rng.uniform(0, t)), 3))
        mech = _confident(threshold, s1, s2)
        labels = np.where(rng.random(q) < 0.5, REFUSED, favourite)
    else:
        mech = _gnmax(float(rng.choice(SIGMAS)))
        labels = favourite
    return Case(mech, votes, radii, c, labels, order)


# ---------------------------------------------------------------------------------------------
# Teachers as column codes; F of many datasets at once


class Plain:
    """Codes of a teacher's vote column (one vote per query); a step moves to any column."""

    def __init__(self, n_queries, n_classes):
        self.q, self.c = n_queries, n_classes
        self.columns = np.array(list(itertools.product(range(n_classes), repeat=n_queries)),
                                dtype=np.int64).reshape(-1, n_queries)
        self.powers = n_classes ** np.arange(n_queries)[::-1]
        self.onehot = np.eye(n_classes, dtype=np.int64)[self.columns]      # (codes, Q, C)
        n = len(self.columns)
        self.options = np.broadcast_to(np.arange(n), (n, n))
        self.saturated = np.zeros(n, dtype=bool)

    def teacher_codes(self, votes, radii=None):
        return np.asarray(votes).T @ self.powers

    def encode(self, votes, radii=None):
        return np.sort(self.teacher_codes(votes))

    def decode(self, codes):
        return self.columns[np.asarray(codes)].T, None


class Agt:
    """Codes of a teacher's (vote, radius) column; a step follows the brief's relation (c):
    per query the radius moves by -1, 0 or +1 (staying >= -1) and the vote may change only
    when the radius is <= 0 before and after."""

    def __init__(self, n_queries, n_classes):
        self.q, self.c = n_queries, n_classes
        base = n_classes * RV                         # per query: vote * RV + (radius + 1)
        self.base = base
        one = []
        for code in range(base):
            v, r = divmod(code, RV)
            r -= 1
            opts = set()
            for r2 in (r - 1, r, r + 1):
                if r2 < -1 or r2 > RMAX:
                    continue
                for v2 in range(n_classes):
                    if v2 == v or (r <= 0 and r2 <= 0):
                        opts.add(v2 * RV + r2 + 1)
            one.append(sorted(opts))
        k1 = max(len(o) for o in one)
        per_query = np.array([o + [o[0]] * (k1 - len(o)) for o in one], dtype=np.int64)
        n = base ** n_queries
        digits = np.array(list(itertools.product(range(base), repeat=n_queries)),
                          dtype=np.int64).reshape(n, n_queries)
        self.digits = digits
        self.powers = base ** np.arange(n_queries)[::-1]
        pick = np.array(list(itertools.product(range(k1), repeat=n_queries)),
                        dtype=np.int64).reshape(-1, n_queries)            # (K, Q)
        moved = per_query[digits[:, None, :], pick[None, :, :]]           # (codes, K, Q)
        self.options = moved @ self.powers
        self.onehot = np.eye(n_classes, dtype=np.int64)[digits // RV]
        self.saturated = np.any(digits % RV == RV - 1, axis=1)      # a radius at RMAX

    def teacher_codes(self, votes, radii):
        assert np.all(np.asarray(radii) < RMAX)
        qc = np.asarray(votes) * RV + np.asarray(radii) + 1               # (Q, T)
        return qc.T @ self.powers

    def encode(self, votes, radii):
        return np.sort(self.teacher_codes(votes, radii))

    def decode(self, codes):
        d = self.digits[np.asarray(codes)]                                 # (T, Q)
        return (d // RV).T, (d % RV - 1).T


def F_of_counts(case, counts):
    """F for count arrays of shape (..., Q, C)."""
    shape = counts.shape[:-2]
    q, c = counts.shape[-2:]
    answered = np.broadcast_to(case.labels != REFUSED, shape + (q,)).reshape(-1)
    per = _per_query_dependent(case.mech, counts.reshape(-1, c), answered, case.threshold,
                               case.order)
    return per.reshape(shape + (q,)).sum(axis=-1)


def expand(space, states):
    """Every one-teacher step from each state: the neighbours' counts (N, T, K, Q, C) and
    codes (N, T, K, T)."""
    n, t = states.shape
    assert not space.saturated[states].any(), "radius range too small for this depth"
    opts = space.options[states]                                            # (N, T, K)
    k = opts.shape[-1]
    own = space.onehot[states]                                              # (N, T, Q, C)
    counts = own.sum(axis=1)
    nb_counts = counts[:, None, None] - own[:, :, None] + space.onehot[opts]
    nb_codes = np.broadcast_to(states[:, None, None, :], (n, t, k, t)).copy()
    for i in range(t):
        nb_codes[:, i, :, i] = opts[:, i]
    return counts, nb_counts, nb_codes


def check_local_bound(case, space, a_of_d, max_d, budget=400_000):
    """Walk the datasets within d steps of D (d = 0, 1, ...) and check every neighbour of each
    against a_of_d[d]; returns the deepest d checked."""
    states = space.encode(case.votes, case.radii)[None]
    checked = -1
    for d in range(max_d + 1):
        t, k = states.shape[1], space.options.shape[1]
        if len(states) * t * k > budget:
            break
        counts, nb_counts, nb_codes = expand(space, states)
        for j in range(case.n_queries):
            radii = case.radii[j] if isinstance(space, Agt) else None
            upper, lower = count_extremes(case.votes[j], radii, case.n_classes, [d])
            outside = np.flatnonzero(np.any((counts[:, j] > upper[0]) |
                                            (counts[:, j] < lower[0]), axis=1))
            assert not len(outside), (
                f"count_extremes misses a histogram at distance {d}, query {j}: "
                f"{counts[outside[0], j].tolist()} outside L={lower[0].tolist()} "
                f"U={upper[0].tolist()}; {case.describe()}")
        f0 = F_of_counts(case, counts)
        f1 = F_of_counts(case, nb_counts)
        gap = np.abs(f1 - f0[:, None, None])
        worst = np.unravel_index(np.argmax(gap), gap.shape)
        bound = float(a_of_d[d])
        if gap[worst] > bound + SLACK:
            n, i, j = worst
            dv, dr = space.decode(states[n])
            ev, er = space.decode(nb_codes[n, i, j])
            raise AssertionError(
                f"local sensitivity bound broken at distance {d}: |F(D') - F(E')| = "
                f"{gap[worst]!r} > A_D({d}) = {bound!r}; {case.describe()}; "
                f"D' votes={dv.tolist()} radii={None if dr is None else dr.tolist()} "
                f"F(D')={f0[n]!r}; E' votes={ev.tolist()} "
                f"radii={None if er is None else er.tolist()} F(E')={f1[n, i, j]!r}")
        checked = d
        nxt = np.sort(nb_codes.reshape(-1, t), axis=1)
        states = np.unique(np.concatenate([states, nxt]), axis=0)
    return checked


def neighbours(case, space):
    """The neighbouring cases E of D (one teacher's column moved by one step)."""
    codes = space.teacher_codes(case.votes, case.radii)
    seen = set()
    for t0, code in enumerate(codes):
        for new in np.unique(space.options[code]):
            if new == code or (t0, new) in seen:
                continue
            seen.add((t0, new))
            votes = case.votes.copy()
            radii = case.radii
            v, r = space.decode([new])
            votes[:, t0] = v[:, 0]
            if r is not None:
                radii = radii.copy()
                radii[:, t0] = r[:, 0]
            yield case.with_votes(votes, radii)


def check_smooth(case, space, use_radii):
    """S(D) <= e^beta S(E) and A_D(d) <= A_E(d + 1) on every neighbour E."""
    ds = np.arange(0, 40)
    a_d = case.A(ds, use_radii)
    s_d = {b: case.S(b, use_radii) for b in BETAS}
    count = 0
    for e in neighbours(case, space):
        count += 1
        a_e = e.A(ds + 1, use_radii)
        bad = np.flatnonzero(a_d > a_e + SLACK)
        assert not len(bad), (
            f"A_D(d) > A_E(d + 1) at d={int(bad[0])}: {a_d[bad[0]]!r} > {a_e[bad[0]]!r} "
            f"(use_radii={use_radii}); D: {case.describe()}; E: votes={e.votes.tolist()} "
            f"radii={None if e.radii is None else e.radii.tolist()}")
        for b in BETAS:
            s_e = e.S(b, use_radii)
            assert s_d[b] <= math.exp(b) * s_e * (1 + 1e-9), (
                f"smoothness broken: S(D)={s_d[b]!r} > e^beta S(E)={math.exp(b) * s_e!r} "
                f"(beta={b}, use_radii={use_radii}); D: {case.describe()}; "
                f"E: votes={e.votes.tolist()} "
                f"radii={None if e.radii is None else e.radii.tolist()}")
    return count


# ---------------------------------------------------------------------------------------------
# Sanity: F as the module computes it, and the neighbour enumerations


def test_F_matches_prepared_value():
    rng = np.random.default_rng(11)
    for i in range(12):
        case = random_case(rng, confident=bool(i % 2))
        plan = SanitisationPlan.default(case.order)
        prepared = SanitisedCost.prepare(case.mech, case.inputs, case.labels, plan)
        space = Plain(case.n_queries, case.n_classes)
        counts = space.onehot[space.encode(case.votes)].sum(axis=0)
        assert F_of_counts(case, counts) == prepared.value
        assert prepared.sensitivity == case.S(plan.beta)


def _agt_moves(vote, radius, n_classes=3):
    space = Agt(1, n_classes)
    code = space.encode([[vote]], [[radius]])[0]
    out = set()
    for new in np.unique(space.options[code]):
        v, r = space.decode([new])
        out.add((int(v[0, 0]), int(r[0, 0])))
    return out


def test_agt_relation_as_briefed():
    free = {(v, r) for v in range(3) for r in (-1, 0)}
    assert _agt_moves(1, 0) == free | {(1, 1)}
    assert _agt_moves(0, -1) == free
    assert _agt_moves(2, 1) == {(2, 0), (2, 1), (2, 2)}
    assert _agt_moves(2, 3) == {(2, 2), (2, 3), (2, 4)}


# ---------------------------------------------------------------------------------------------
# 1. The local-sensitivity bound A(d), plain


@pytest.mark.parametrize("confident", [False, True])
def test_plain_local_bound_within_distance(confident):
    rng = np.random.default_rng(2024 + confident)
    depths = []
    for _ in range(30):
        case = random_case(rng, confident=confident)
        space = Plain(case.n_queries, case.n_classes)
        a = case.A(np.arange(4))
        depths.append(check_local_bound(case, space, a, max_d=3))
    assert min(depths) >= 1 and max(depths) == 3, depths


@pytest.mark.parametrize("order", (2.0, 4.0))
def test_plain_local_bound_tight_ensembles(order):
    """Two or three queries, near-unanimous and split ensembles, both mechanisms."""
    votes_list = [[[0, 0, 0, 0, 0], [1, 1, 1, 1, 0]], [[0, 0, 1, 1, 0], [0, 1, 0, 1, 1]],
                  [[0, 0, 0, 0], [0, 0, 0, 1], [1, 1, 0, 0]]]
    for votes in votes_list:
        q = len(votes)
        for mech, labels in [(_gnmax(0.5), [0] * q), (_gnmax(1.0), [0] * q),
                             (_confident(None, 0.5, 0.75), [0] + [REFUSED] * (q - 1)),
                             (_confident(3.0, 1.0, 0.5), [REFUSED] + [1] * (q - 1))]:
            case = Case(mech, votes, None, 2, labels, order)
            if order == 2.0:
                assert cost_varies(case), case.describe()
            space = Plain(case.n_queries, case.n_classes)
            assert check_local_bound(case, space, case.A(np.arange(3)), max_d=2) == 2


@pytest.mark.parametrize("order,n_teachers", [(8.0, 16), (16.0, 32)])
def test_high_orders_need_large_ensembles(order, n_teachers):
    """At orders 8 and 16 the Thm 6 bound only moves for vote gaps of about 2 (order - 1),
    so the small ensembles above leave these costs constant: check larger ones here (one or
    two queries, two classes), plain and AGT, local bound and smoothness."""
    rng = np.random.default_rng(int(order))
    found = 0
    for trial in range(40):
        q = 1 + trial % 2
        lead = rng.integers(0, 2, size=q)
        votes = np.where(rng.random((q, n_teachers)) < rng.uniform(0.8, 1.0), lead[:, None],
                         1 - lead[:, None])
        radii = rng.integers(-1, 3, size=(q, n_teachers))
        if trial % 3 == 2:
            mech = _confident(float(rng.integers(0, 4)), float(rng.choice(SIGMAS[:3])),
                              float(rng.choice(SIGMAS[:3])))
            labels = np.where(rng.random(q) < 0.5, REFUSED, lead)
        else:
            mech = _gnmax(float(rng.choice(SIGMAS[:4])))
            labels = lead
        case = Case(mech, votes, radii, 2, labels, order)
        if not cost_varies(case):
            continue
        found += 1
        a_plain = case.A(np.arange(3))
        assert check_local_bound(case, Plain(q, 2), a_plain, max_d=2) == 2
        if q == 1:
            a_agt = case.A(np.arange(3), use_radii=True)
            assert np.all(a_agt <= a_plain)
            assert check_local_bound(case, Agt(q, 2), a_agt, max_d=2, budget=250_000) >= 1
            check_smooth(case, Agt(q, 2), True)
        check_smooth(case, Plain(q, 2), False)
        if found == 4:
            break
    assert found >= 3, found


# ---------------------------------------------------------------------------------------------
# 2. Smoothness, plain


@pytest.mark.parametrize("confident", [False, True])
def test_plain_smoothness(confident):
    rng = np.random.default_rng(77 + confident)
    for _ in range(15):
        case = random_case(rng, confident=confident, max_teachers=6)
        assert check_smooth(case, Plain(case.n_queries, case.n_classes), False) > 0


@settings(max_examples=40, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 32 - 1), confident=st.booleans())
def test_plain_smoothness_hypothesis(seed, confident):
    rng = np.random.default_rng(seed)
    case = random_case(rng, confident=confident, max_teachers=5, max_columns=4)
    assert check_smooth(case, Plain(case.n_queries, case.n_classes), False) > 0


# ---------------------------------------------------------------------------------------------
# 3. AGT radii


@pytest.mark.parametrize("confident", [False, True])
def test_agt_local_bound_within_distance(confident):
    rng = np.random.default_rng(313 + confident)
    depths = []
    for _ in range(25):
        case = random_case(rng, confident=confident, with_radii=True, max_teachers=5,
                           max_columns=4)
        space = Agt(case.n_queries, case.n_classes)
        a = case.A(np.arange(3), use_radii=True)
        depths.append(check_local_bound(case, space, a, max_d=2, budget=250_000))
    assert min(depths) >= 1 and depths.count(2) >= 5, depths


@pytest.mark.parametrize("confident", [False, True])
def test_agt_smoothness(confident):
    rng = np.random.default_rng(4242 + confident)
    for i in range(14):
        case = random_case(rng, confident=confident, with_radii=True, max_teachers=5,
                           max_columns=4 if i % 3 else 9)
        assert check_smooth(case, Agt(case.n_queries, case.n_classes), True) > 0


@settings(max_examples=25, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 32 - 1), confident=st.booleans())
def test_agt_hypothesis(seed, confident):
    rng = np.random.default_rng(seed)
    case = random_case(rng, confident=confident, with_radii=True, max_teachers=4,
                       max_columns=4)
    space = Agt(case.n_queries, case.n_classes)
    assert check_smooth(case, space, True) > 0
    check_local_bound(case, space, case.A(np.arange(3), use_radii=True), max_d=2,
                      budget=60_000)


def test_agt_smoothness_radius_crossings():
    """Radii at the 0/1 boundary, where a teacher turns free or certified."""
    cases = [
        ([[0, 0, 0, 1]], [[0, 1, 1, 1]]),
        ([[0, 0, 0, 1], [1, 1, 0, 0]], [[1, 0, -1, 1], [0, 1, 1, 2]]),
        ([[0, 0, 1, 1, 0]], [[1, 1, 1, 0, -1]]),
    ]
    for votes, radii in cases:
        q = len(votes)
        for mech, labels in [(_gnmax(0.5), [0] * q), (_confident(None, 0.5, 0.5), [REFUSED] * q),
                             (_confident(2.0, 0.75, 1.0), [0] * q)]:
            for order in (2.0, 4.0):
                case = Case(mech, votes, radii, 2, labels, order)
                assert order > 2.0 or cost_varies(case), case.describe()
                space = Agt(q, 2)
                check_smooth(case, space, True)
                check_local_bound(case, space, case.A(np.arange(3), use_radii=True), max_d=2,
                                  budget=250_000)


def test_agt_never_above_plain():
    rng = np.random.default_rng(99)
    ds = np.arange(0, 60)
    for i in range(60):
        case = random_case(rng, confident=bool(i % 2), with_radii=True)
        plain, agt = case.A(ds), case.A(ds, use_radii=True)
        bad = np.flatnonzero(agt > plain)
        assert not len(bad), (f"AGT A(d) above plain at d={int(bad[0])}: {agt[bad[0]]!r} > "
                              f"{plain[bad[0]]!r}; {case.describe()}")
        for b in BETAS:
            assert case.S(b, use_radii=True) <= case.S(b)


# ---------------------------------------------------------------------------------------------
# 4. Monotonicity


def _q_grid():
    envelope = np.exp(np.arange(-740.0, 0.0, 0.005))
    around = np.concatenate([envelope, np.nextafter(envelope, 0), np.nextafter(envelope, 1)])
    return np.unique(np.concatenate([np.logspace(-330, 0, 50_001), np.linspace(0, 1, 50_001),
                                     around, [0.0, 5e-324, 1.0]]))


def test_costs_non_decreasing_in_q():
    q = _q_grid()
    for sigma in SIGMAS:
        for order in ORDERS:
            for name, f in (("gnmax_cost", gnmax_cost), ("threshold_cost", threshold_cost)):
                c = f(q, sigma, order)
                drops = np.flatnonzero(np.diff(c) < 0)
                assert not len(drops), (
                    f"{name}(q, {sigma}, {order}) decreases between q={q[drops[0]]!r} "
                    f"({c[drops[0]]!r}) and q={q[drops[0] + 1]!r} ({c[drops[0] + 1]!r})")
                assert np.all(c >= 0) and np.all(np.isfinite(c))


def test_A_non_decreasing_in_d_and_S_dominates():
    rng = np.random.default_rng(5)
    ds = np.arange(0, 80)
    for i in range(40):
        case = random_case(rng, confident=bool(i % 2), with_radii=True)
        for use_radii in (False, True):
            a = case.A(ds, use_radii)
            drops = np.flatnonzero(np.diff(a) < 0)
            assert not len(drops), (f"A(d) decreases at d={int(drops[0])} "
                                    f"(use_radii={use_radii}): {a.tolist()}; "
                                    f"{case.describe()}")
            for b in BETAS:
                s = case.S(b, use_radii)
                assert s >= float(np.max(np.exp(-b * ds) * a)), (b, use_radii, case.describe())
