"""The exact selection rule (agt/topk.py): the streamed, partition-based accumulator selects
exactly the multisets a naive sort selects, its bounds enclose the exactly rounded naive
bounds within the rounding allowance, it agrees with the first implementation
(tests/agt/topk_reference.py), and deliberately wrong variants are caught."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import agt.topk as topk_mod
from agt import topk_kernel
from agt.errors import SoundnessError
from agt.interval import FloatModel, Interval
from agt.topk import (
    DescentAccumulator,
    clamp_limit,
    kth_values,
    nesting_allowance,
    rounding_allowance,
    select,
)
from tests.agt.topk_reference import ReferenceDescentAccumulator

pytestmark = pytest.mark.usefixtures("one_thread")

GAMMA = 0.3


@pytest.fixture(params=["fused", "numpy", "torch"])
def backend(request, monkeypatch):
    """Run under every selection backend: the compiled single-pass kernel (agt.topk_kernel,
    the CPU default), numpy's selections (the plain CPU path), torch.topk (other devices)."""
    if request.param == "fused" and not topk_kernel.available():
        pytest.skip("numba is not importable here")
    monkeypatch.setattr(topk_mod, "NUMPY_ON_CPU", request.param != "torch")
    monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", request.param == "fused")
    return request.param


@pytest.fixture(params=["numpy", "torch"])
def plain_backend(request, monkeypatch):
    """The workspace path of the merges (where the block prefilter runs), on each backend."""
    monkeypatch.setattr(topk_mod, "NUMPY_ON_CPU", request.param == "numpy")
    monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", False)
    return request.param


def sample_bounds(rng, G, P, b, kind, dtype=torch.float64):
    """Per-sample bounds (G, P, b), samples last. kinds: 'continuous'; 'ties' (a handful of
    distinct values, many beyond +-gamma, so clamping creates ties at +-gamma too)."""
    if kind == "ties":
        grid = np.array([-0.7, -GAMMA, -0.1, 0.0, 0.05, 0.1, GAMMA, 0.5])
        lo = rng.choice(grid, size=(G, P, b))
        hi = lo + rng.choice([0.0, 0.0, 0.1, 0.4], size=(G, P, b))
    else:
        lo = rng.uniform(-0.5, 0.4, size=(G, P, b))
        hi = lo + rng.uniform(0, 0.3, size=(G, P, b))
    return torch.as_tensor(lo).to(dtype), torch.as_tensor(hi).to(dtype)


def stream(acc, lo, hi, frag, row_chunk=None):
    """Feed (G, P, b) bounds fragment by fragment and in parameter-row chunks."""
    P, b = lo.shape[1], lo.shape[2]
    rc = row_chunk or P
    for f0 in range(0, b, frag):
        for r0 in range(0, P, rc):
            r1 = min(P, r0 + rc)
            acc.add(r0, r1, Interval(lo[:, r0:r1, f0:f0 + frag], hi[:, r0:r1, f0:f0 + frag]))
        acc.samples_seen(min(frag, b - f0))
    return acc


def naive(lo, hi, k):
    """Thm 4.6 by sorting every parameter's b values, sums exactly rounded (math.fsum), the
    clamp in the values' dtype (as the nominal computation does), intersected with the range
    of clamped means: (lower, upper) arrays (P,) for one box (P, b)."""
    gam = clamp_limit(GAMMA, lo.dtype)
    gl = np.sort(lo.clamp(-GAMMA, GAMMA).double().numpy(), axis=1)          # ascending
    gu = np.sort(hi.clamp(-GAMMA, GAMMA).double().numpy(), axis=1)[:, ::-1]  # descending
    b = gl.shape[1]
    keep = max(b - k, 0)          # k >= b: nothing is kept
    lower = np.array([math.fsum(list(r[:keep]) + [-k * gam]) for r in gl]) / b
    upper = np.array([math.fsum(list(r[:keep]) + [k * gam]) for r in gu]) / b
    return np.maximum(lower, -gam), np.minimum(upper, gam)


def check_against_naive(res: Interval, lo, hi, ks, groups, fm):
    """Sound (encloses the exactly rounded naive bound) and as tight as exact: within the
    documented widening w_k (1 + 2k) plus the rounding it covers (at most w_k)."""
    b = lo.shape[-1]
    for m, (k, g) in enumerate(zip(ks, groups)):
        nl, nu = naive(lo[g], hi[g], k)
        got_l, got_u = res.lo[m].numpy(), res.hi[m].numpy()
        assert np.all(got_l <= nl) and np.all(got_u >= nu), f"unsound at k={k}"
        w = float(nesting_allowance(b, torch.tensor([k]), clamp_limit(GAMMA, lo.dtype), fm)[0])
        slack = (2 + 2 * k) * w
        np.testing.assert_allclose(got_l, nl, rtol=0, atol=slack, err_msg=f"loose at k={k}")
        np.testing.assert_allclose(got_u, nu, rtol=0, atol=slack, err_msg=f"loose at k={k}")


def check_buffers(acc, lo, hi, g, k):
    """The buffered multisets are exactly the k largest lower / k smallest upper bounds."""
    want_top = np.sort(lo[g].clamp(-GAMMA, GAMMA).numpy(), axis=1)[:, ::-1][:, :k]
    want_low = np.sort(hi[g].clamp(-GAMMA, GAMMA).numpy(), axis=1)[:, :k]
    got_top = np.sort(acc.top_lo[g].numpy(), axis=1)[:, ::-1]
    got_low = np.sort(acc.low_hi[g].numpy(), axis=1)
    assert np.array_equal(got_top, want_top) and np.array_equal(got_low, want_low)


@pytest.mark.parametrize("kind", ["continuous", "ties"])
@pytest.mark.parametrize("frag", [1, 7, 16, 40, 53])
def test_per_box_buffers_equal_naive_sort(backend, kind, frag):
    """One box per k (k = 0, small, large, b - 1), fragments smaller and larger than k."""
    rng = np.random.default_rng(hash((kind, frag)) % 2**32)
    b, P = 53, 9
    ks = [0, 1, 5, 20, b - 1]
    lo, hi = sample_bounds(rng, len(ks), P, b, kind)
    acc = stream(DescentAccumulator(len(ks), P, ks, GAMMA, torch.device("cpu")), lo, hi, frag,
                 row_chunk=4)
    assert acc.top_lo[0] is None and acc.low_hi[0] is None           # k = 0 keeps no buffer
    for g, k in enumerate(ks):
        if k:
            check_buffers(acc, lo, hi, g, k)
    fm = FloatModel(torch.float64)
    res = acc.bounds(torch.tensor(ks), fm)
    check_against_naive(res, lo, hi, ks, list(range(len(ks))), fm)


@pytest.mark.parametrize("kind", ["continuous", "ties"])     # partition / sort paths
def test_row_blocks_on_threads_equal_naive_sort(monkeypatch, kind):
    """Selections split into row blocks over two threads give the same multisets."""
    monkeypatch.setattr(topk_mod, "PARALLEL_MIN_VALUES", 1)
    rng = np.random.default_rng(21)
    b, P, ks = 60, 17, [0, 4, 33]
    lo, hi = sample_bounds(rng, len(ks), P, b, kind)
    torch.set_num_threads(2)
    try:
        acc = stream(DescentAccumulator(len(ks), P, ks, GAMMA, torch.device("cpu")), lo, hi, 25)
    finally:
        torch.set_num_threads(1)
    for g, k in enumerate(ks):
        if k:
            check_buffers(acc, lo, hi, g, k)


@pytest.mark.parametrize("frag", [5, 30, 64])
def test_shared_box_prefix_sums_give_every_k(backend, frag):
    """The first step: one box, one buffer of the largest k, bounds for every k <= k_max."""
    rng = np.random.default_rng(frag)
    b, P = 64, 11
    lo, hi = sample_bounds(rng, 1, P, b, "ties")
    ks = list(range(0, 40)) if frag != 5 else [0, 1]   # [0, 1]: a buffer of width 1
    acc = stream(DescentAccumulator(1, P, [max(ks)], GAMMA, torch.device("cpu")), lo, hi, frag)
    fm = FloatModel(torch.float64)
    res = acc.bounds(torch.tensor(ks), fm, torch.zeros(len(ks), dtype=torch.int64))
    check_against_naive(res, lo, hi, ks, [0] * len(ks), fm)
    # nested in k, as the smooth radius needs
    assert bool((res.lo[1:] <= res.lo[:-1]).all() and (res.hi[1:] >= res.hi[:-1]).all())


@pytest.mark.parametrize("frag", [3, 8, 20])
def test_shared_buffer_larger_than_the_batch(backend, frag):
    """A batch smaller than the largest k (minibatches with a wide k grid): the shared buffer
    keeps some of its +-inf fill. Every k < b must still be exact, also on rows whose values
    all have one sign (a fill counted as 0 before sorting would sort in front of negative
    lower bounds or positive upper bounds and loosen them), and k >= b gives the trivial
    bound."""
    rng = np.random.default_rng(100 + frag)
    b, P = 20, 12
    lo, hi = sample_bounds(rng, 1, P, b, "continuous")
    shift = torch.tensor([-0.45, 0.0, 0.45]).repeat(P // 3)[None, :, None].double()
    lo, hi = lo + shift, hi + shift
    ks = list(range(0, 31))
    acc = stream(DescentAccumulator(1, P, [max(ks)], GAMMA, torch.device("cpu")), lo, hi, frag)
    fm = FloatModel(torch.float64)
    res = acc.bounds(torch.tensor(ks), fm, torch.zeros(len(ks), dtype=torch.int64))
    check_against_naive(res, lo, hi, ks, [0] * len(ks), fm)


def test_float32_values_float64_sums(backend):
    """float32 compute dtype: the selection keeps float32 values (no rounding), sums in
    float64, bounds within the float32 allowance of the exactly rounded naive bound."""
    rng = np.random.default_rng(3)
    b, P = 300, 6
    ks = [0, 3, 100, b - 1]
    lo, hi = sample_bounds(rng, len(ks), P, b, "continuous", torch.float32)
    acc = stream(DescentAccumulator(len(ks), P, ks, GAMMA, torch.device("cpu"), torch.float32),
                 lo, hi, 64)
    for g, k in enumerate(ks):
        if k:
            check_buffers(acc, lo, hi, g, k)
    fm = FloatModel(torch.float32)
    check_against_naive(acc.bounds(torch.tensor(ks), fm), lo, hi, ks, list(range(len(ks))), fm)


def test_saturated_float32_gradients_stay_inside():
    """float32(0.3) > 0.3: a float32 clamp to [-0.3, 0.3] returns +-0.30000001192..., and so
    does the nominal mean when every gradient saturates. The bounds must contain it."""
    b, P = 40, 3
    ones = torch.ones(1, P, b, dtype=torch.float32)
    fm = FloatModel(torch.float32)
    for k in (0, 5):
        acc = stream(DescentAccumulator(1, P, [k], GAMMA, torch.device("cpu"), torch.float32),
                     ones, ones, 16)
        res = acc.bounds(torch.tensor([k]), fm)
        nominal = float(torch.tensor(1.0).clamp(-GAMMA, GAMMA))
        assert nominal > GAMMA and bool((res.hi >= nominal).all()), k


@pytest.mark.parametrize("values, buffers", [(torch.float64, torch.float32),
                                             (torch.float32, torch.float64)])
def test_values_of_another_dtype_than_the_buffers_are_refused(values, buffers):
    acc = DescentAccumulator(1, 2, 3, GAMMA, torch.device("cpu"), buffers)
    x = torch.zeros(1, 2, 5, dtype=values)
    with pytest.raises(SoundnessError, match="rounded or clamped apart"):
        acc.add(0, 2, Interval(x, x))


def test_rows_added_twice_in_the_first_fragment_are_refused():
    """The first fragment overwrites the buffers' fill; adding the same rows again before
    samples_seen would lose values, so it is refused (later fragments merge)."""
    acc = DescentAccumulator(1, 4, 2, GAMMA, torch.device("cpu"))
    x = torch.zeros(1, 2, 5, dtype=torch.float64)
    acc.add(0, 2, Interval(x, x))
    acc.add(2, 4, Interval(x, x))
    with pytest.raises(SoundnessError, match="added twice"):
        acc.add(1, 3, Interval(x[:, :2], x[:, :2]))
    acc.samples_seen(5)
    acc.add(0, 2, Interval(x, x))


@pytest.mark.parametrize("shared", [False, True])
def test_equals_reference_implementation(backend, shared):
    """Same bounds as the torch.topk implementation this module replaced, on data with ties,
    clamping and several fragments (shared: the first-step layout, G = 1 for every k)."""
    rng = np.random.default_rng(7 + shared)
    b, P = 90, 13
    ks = [0, 2, 9, 31]
    G = 1 if shared else len(ks)
    lo, hi = sample_bounds(rng, G, P, b, "ties")
    group = torch.zeros(len(ks), dtype=torch.int64) if shared else None
    sizes = [max(ks)] if shared else ks
    new = stream(DescentAccumulator(G, P, sizes, GAMMA, torch.device("cpu")), lo, hi, 20)
    old = stream(ReferenceDescentAccumulator(G, P, max(ks), GAMMA, torch.device("cpu")),
                 lo, hi, 20)
    fm = FloatModel(torch.float64)
    a = new.bounds(torch.tensor(ks), fm, group)
    r = old.bounds(torch.tensor(ks), fm, group)
    torch.testing.assert_close(a.lo, r.lo, rtol=0, atol=1e-15)
    torch.testing.assert_close(a.hi, r.hi, rtol=0, atol=1e-15)


def test_select_and_kth_values_backends_agree():
    rng = np.random.default_rng(11)
    x = torch.as_tensor(rng.choice([-1.0, 0.0, 0.5, 2.0], size=(3, 8, 40)))
    for k in (1, 7, 39, 40):
        for largest in (True, False):
            want = np.sort(x.numpy(), axis=-1)
            want = want[..., ::-1][..., :k] if largest else want[..., :k]
            for flag in (True, False):
                topk_mod.NUMPY_ON_CPU = flag
                try:
                    got = select(x.clone(), k, largest)
                    got = np.sort(got.numpy(), axis=-1)
                    got = got[..., ::-1] if largest else got
                    assert np.array_equal(got, want)
                    vals = kth_values(x[0], [k], largest)[0].numpy()
                    assert np.array_equal(vals, want[0][..., k - 1])
                finally:
                    topk_mod.NUMPY_ON_CPU = True


# -- the block prefilter ----------------------------------------------------------------------

def best_k(values: np.ndarray, k: int, largest: bool) -> np.ndarray:
    """The k largest (smallest) values of every row, sorted: the multiset a pool must keep."""
    srt = np.sort(values, axis=-1)
    return (srt[:, ::-1][:, :k] if largest else srt[:, :k]).copy()


def pool_cases(seed: int, n_cases: int):
    """Random (frag, held, k) cases: continuous rows, rows of a few distinct values (ties at
    the block extremes and at the floor), clamp-saturated rows, widths that leave a tail
    shorter than a block, buffers of the k best earlier values and arbitrary ones."""
    rng = np.random.default_rng(seed)
    for case in range(n_cases):
        rows = int(rng.integers(1, 9))
        width = int(rng.integers(8, 700))
        k = int(rng.integers(1, max(2, width // 8)))
        kind = case % 3
        if kind == 0:
            frag = rng.normal(size=(rows, width))
        elif kind == 1:
            frag = rng.choice([-1.0, -0.5, 0.0, 0.25, 1.0], size=(rows, width))
        else:
            frag = np.clip(rng.normal(scale=2 * GAMMA, size=(rows, width)), -GAMMA, GAMMA)
        earlier = rng.normal(size=(rows, k + int(rng.integers(0, 3 * k + 1))))
        if kind == 1:
            earlier = rng.choice([-1.0, -0.5, 0.0, 0.25, 1.0], size=earlier.shape)
        yield frag, earlier, k, bool(case % 2)


def test_block_pool_keeps_the_k_best_values():
    """Property test of the block and floor lemmas (agt.topk.block_pool): the pool's k best
    values are the k best of the fragment (first fragment) and of buffer + fragment (later
    ones), as multisets, over random rows with and without ties; the prefilter must take
    the block path in most cases, so the check is not vacuous."""
    used = 0
    for frag, earlier, k, largest in pool_cases(1, 400):
        for dtype in (torch.float64, torch.float32):
            f = torch.as_tensor(frag).to(dtype)
            pool = topk_mod.block_pool(f, k, largest)
            if pool is not None:
                used += 1
                assert pool.dtype == dtype and pool.shape[1] >= k
                assert np.array_equal(best_k(pool.numpy(), k, largest),
                                      best_k(f.numpy(), k, largest))
            held = torch.as_tensor(best_k(earlier, k, largest)).to(dtype)
            for buffer in (held, held.flip(0) if held.shape[0] > 1 else held):
                pool = topk_mod.block_pool(f, k, largest, buffer.contiguous(), earlier.shape[1])
                if pool is not None:
                    used += 1
                    both = torch.cat([buffer, f], dim=1).numpy()
                    assert np.array_equal(best_k(pool.numpy(), k, largest),
                                          best_k(both, k, largest))
    assert used > 1000


def test_block_pool_on_a_workspace_view():
    """The fragment is a view into the merge workspace (rows strided by buffer + fragment)."""
    rng = np.random.default_rng(2)
    ws = torch.as_tensor(rng.normal(size=(5, 3 + 400)))
    frag = ws[:, 3:]
    pool = topk_mod.block_pool(frag, 3, True)
    assert pool is not None
    assert np.array_equal(best_k(pool.numpy(), 3, True), best_k(frag.numpy(), 3, True))
    held = torch.as_tensor(best_k(rng.normal(size=(5, 50)), 3, True))
    pool = topk_mod.block_pool(frag, 3, True, held, 50)
    assert pool is not None
    assert np.array_equal(best_k(pool.numpy(), 3, True),
                          best_k(torch.cat([held, frag], dim=1).numpy(), 3, True))


def test_block_pool_declines_where_blocks_would_not_shrink_the_row(monkeypatch):
    """Short rows, large k, or a floor that most blocks beat: None (the plain path)."""
    rng = np.random.default_rng(3)
    frag = torch.as_tensor(rng.normal(size=(4, 2000)))
    assert topk_mod.block_pool(frag[:, :12], 2, True) is None        # fewer than 4 blocks
    assert topk_mod.block_pool(frag, 1000, True) is None              # k close to the row
    low_floor = torch.full((4, 100), -5.0)          # every block beats it: 100 of 250 blocks
    assert topk_mod.block_pool(frag, 100, True, low_floor, 20000) is None
    high_floor = torch.full((4, 100), 5.0)          # no block beats it: the buffer alone
    pool = topk_mod.block_pool(frag, 100, True, high_floor, 20000)
    assert pool is not None and torch.equal(pool, high_floor)
    assert topk_mod.block_pool(frag, 300, True, low_floor[:, :1].expand(4, 300), 2000) is None
    monkeypatch.setattr(topk_mod, "BLOCK_PREFILTER", False)
    assert topk_mod.block_pool(frag, 10, True) is None


@pytest.mark.parametrize("kind", ["continuous", "ties"])
def test_accumulator_with_and_without_the_prefilter(plain_backend, monkeypatch, kind):
    """The accumulator with the prefilter (first and later fragments both through blocks)
    keeps exactly the multisets of the naive sort, and its bounds equal those of the plain
    path within the allowance."""
    calls = {"first": 0, "later": 0}
    real = topk_mod.block_pool

    def counting(frag, k, largest, held=None, seen=0):
        pool = real(frag, k, largest, held, seen)
        if pool is not None:
            calls["first" if held is None else "later"] += 1
        return pool

    monkeypatch.setattr(topk_mod, "block_pool", counting)
    rng = np.random.default_rng(31)
    b, P, ks = 1200, 6, [0, 1, 4, 12, 150]
    lo, hi = sample_bounds(rng, len(ks), P, b, kind)
    fm = FloatModel(torch.float64)
    acc = stream(DescentAccumulator(len(ks), P, ks, GAMMA, torch.device("cpu")), lo, hi, 300,
                 row_chunk=4)
    assert calls["first"] > 0 and calls["later"] > 0
    for g, k in enumerate(ks):
        if k:
            check_buffers(acc, lo, hi, g, k)
    with_blocks = acc.bounds(torch.tensor(ks), fm)
    check_against_naive(with_blocks, lo, hi, ks, list(range(len(ks))), fm)
    monkeypatch.setattr(topk_mod, "BLOCK_PREFILTER", False)
    plain = stream(DescentAccumulator(len(ks), P, ks, GAMMA, torch.device("cpu")), lo, hi, 300,
                   row_chunk=4).bounds(torch.tensor(ks), fm)
    torch.testing.assert_close(with_blocks.lo, plain.lo, rtol=0, atol=1e-15)
    torch.testing.assert_close(with_blocks.hi, plain.hi, rtol=0, atol=1e-15)


def test_a_pool_missing_one_value_is_caught(monkeypatch):
    """A prefilter that loses one value of its pool (a block too few, a tail dropped) keeps
    the wrong multisets: the buffer and bound checks reject it."""
    monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", False)
    real = topk_mod.block_pool

    def lossy(frag, k, largest, held=None, seen=0):
        pool = real(frag, k, largest, held, seen)
        if pool is None:
            return None
        srt = pool.sort(dim=-1, descending=largest).values
        return torch.cat([srt[:, 1:], srt[:, -1:]], dim=1)    # the best value replaced

    monkeypatch.setattr(topk_mod, "block_pool", lossy)
    rng = np.random.default_rng(32)
    b, P, ks = 1200, 6, [4, 12]
    lo, hi = sample_bounds(rng, len(ks), P, b, "continuous")
    lo, hi = lo * 0.5, hi * 0.5               # inside the clamp: no ties at +-gamma
    acc = stream(DescentAccumulator(len(ks), P, ks, GAMMA, torch.device("cpu")), lo, hi, 300)
    fm = FloatModel(torch.float64)
    with pytest.raises(AssertionError):
        check_buffers(acc, lo, hi, 0, ks[0])
    with pytest.raises(AssertionError, match="unsound"):
        check_against_naive(acc.bounds(torch.tensor(ks), fm), lo, hi, ks, [0, 1], fm)


# -- deliberately wrong variants must be caught ---------------------------------------------

def variational_lower(lo, k, rank):
    """sum_i min(g_i, tau) - k tau - k gamma over b, with tau the rank-th largest clamped
    value (the variational form of Thm 4.6; rank = k makes it equal to the exact rule)."""
    g = lo.clamp(-GAMMA, GAMMA).double().numpy()
    tau = np.sort(g, axis=1)[:, ::-1][:, rank - 1]
    b = g.shape[1]
    return np.array([math.fsum(list(np.minimum(r, t)) + [-k * t, -k * GAMMA])
                     for r, t in zip(g, tau)]) / b


def test_variational_form_is_exact_only_at_the_kth_order_statistic():
    """At the k-th order statistic the variational form equals the exact rule; one order
    statistic off (rank k - 1) it is a different, looser bound, and the tightness check
    fails on it."""
    rng = np.random.default_rng(5)
    lo, hi = sample_bounds(rng, 1, 7, 40, "continuous")
    k = 6
    exact_l, _ = naive(lo[0], hi[0], k)
    np.testing.assert_allclose(variational_lower(lo[0], k, k), exact_l, rtol=0, atol=1e-15)
    off = variational_lower(lo[0], k, k - 1)
    assert np.all(off <= exact_l + 1e-15) and np.any(off < exact_l - 1e-6)
    fm = FloatModel(torch.float64)
    wrong = Interval(torch.as_tensor(off)[None], torch.as_tensor(naive(lo[0], hi[0], k)[1])[None])
    with pytest.raises(AssertionError, match="loose"):
        check_against_naive(wrong, lo, hi, [k], [0], fm)


def off_by_one_select(ws, k, largest):
    """A broken selection: the k values kept are the 2nd..(k+1)-th largest (smallest), one
    order statistic off, so the sum of the k largest is underestimated."""
    n = ws.shape[-1]
    if k >= n:
        return topk_mod.torch.topk(ws, k, dim=-1, largest=largest).values
    vals = ws.topk(k + 1, dim=-1, largest=largest, sorted=True).values
    return vals[..., 1:].contiguous()


def test_off_by_one_selection_is_caught(monkeypatch):
    """The naive-sort checks reject a selection one order statistic off (unsound bounds)."""
    rng = np.random.default_rng(9)
    b, P, ks = 40, 5, [3, 12]
    lo, hi = sample_bounds(rng, len(ks), P, b, "continuous")
    monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", False)
    monkeypatch.setattr(topk_mod, "select", off_by_one_select)
    acc = stream(DescentAccumulator(len(ks), P, ks, GAMMA, torch.device("cpu")), lo, hi, 10)
    fm = FloatModel(torch.float64)
    with pytest.raises(AssertionError, match="unsound"):
        check_against_naive(acc.bounds(torch.tensor(ks), fm), lo, hi, ks, [0, 1], fm)
    with pytest.raises(AssertionError):
        check_buffers(acc, lo, hi, 1, ks[1])


@pytest.mark.parametrize("kind", ["continuous", "ties"])
def test_selecting_k_minus_one_is_caught(monkeypatch, kind):
    """A variant that subtracts the k - 1 largest (smallest) values instead of k: the bound
    checks must reject it (unsound where the k-th value has the sign that helps, loose
    where it has the other)."""
    rng = np.random.default_rng(17)
    b, P, ks = 50, 8, [1, 6, 25]
    lo, hi = sample_bounds(rng, len(ks), P, b, kind)
    acc = stream(DescentAccumulator(len(ks), P, ks, GAMMA, torch.device("cpu")), lo, hi, 12)
    fm = FloatModel(torch.float64)
    check_against_naive(acc.bounds(torch.tensor(ks), fm), lo, hi, ks, [0, 1, 2], fm)
    right = DescentAccumulator._selected_sums

    def k_minus_one(self, buffers, k, group, largest):
        return right(self, buffers, (k - 1).clamp_min(0), group, largest)

    monkeypatch.setattr(DescentAccumulator, "_selected_sums", k_minus_one)
    with pytest.raises(AssertionError, match="unsound|loose"):
        check_against_naive(acc.bounds(torch.tensor(ks), fm), lo, hi, ks, [0, 1, 2], fm)


# -- the training loop on the new path -------------------------------------------------------

def reference_accumulator(n_groups, n_params, k_buffers, gamma, device, dtype):
    """The first implementation's accumulator behind the new constructor (one buffer
    size for all)."""
    k = k_buffers if isinstance(k_buffers, int) else max(k_buffers)
    return ReferenceDescentAccumulator(n_groups, n_params, k, gamma, device, dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_training_bounds_equal_reference_path(monkeypatch, dtype):
    """Whole AGT runs (MLP, 3 full-batch steps, fragments and row chunks, a contiguous and a
    sparse part of the k grid, a k close to the batch): the new selection gives the bounds
    of the torch.topk implementation. Not bit for bit: float64 sums over other memory
    layouts add in another order (inside the allowance), and three steps amplify that to
    ~1e-14, the tolerance of test_fragmented_equals_unfragmented. The compiled kernel (the
    CPU default) sums float32 values straight in float64, where the plain path and the
    reference sum blocks of 16 in float32 first (rounding of up to gamma_16(u) of a block's
    sum, inside the allowance): on float32 it is compared with the reference at 1e-8, the
    plain path still at the tight tolerance; a selection error would show at gamma / b ~
    3e-4."""
    from agt import bound_pass, memory
    from agt.training import train
    from tests.helpers import MLP, blobs, config

    ds = blobs(200, seed=40)
    cfg = config(MLP, "cross_entropy", n_epochs=3, k_values=[0, 1, 2, 3, 7, 30, 120, 199],
                 fragment_size=45, dtype=dtype, clip_gamma=0.06)
    fused = train(cfg, ds)
    monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", False)
    new = train(cfg, ds)
    monkeypatch.setattr(memory, "WORK_ELEMENTS", 3000)     # several row chunks
    chunked = train(cfg, ds)
    monkeypatch.setattr(bound_pass, "DescentAccumulator", reference_accumulator)
    old = train(cfg, ds)
    fused_atol = 1e-12 if dtype == "float64" else 1e-8
    for name in new.lower:
        for this, other, atol in ((new, old, 1e-12), (new, chunked, 1e-12),
                                  (fused, old, fused_atol)):
            torch.testing.assert_close(this.lower[name], other.lower[name], rtol=1e-9, atol=atol)
            torch.testing.assert_close(this.upper[name], other.upper[name], rtol=1e-9, atol=atol)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_boxes_nest_between_neighbours_with_fragments(dtype):
    """box(D', k-1) inside box(D, k) for neighbours D' (replace, add, remove one record), with
    fragments smaller than k so that every merge path runs: the inclusion that makes the
    smooth radius smooth, on the new selection.

    The inclusion is exact in real arithmetic. With saturated gradients (gamma 0.06) its
    margin can be exactly 0, and the float64 computations for D and D' then round apart by
    an ulp (3e-18 and 6e-17 here, the same values with the first implementation), so
    the check allows 1e-15; a selection error would show at gamma / b ~ 1e-4."""
    from agt.training import train
    from tests.agt.test_training import perturb
    from tests.helpers import MLP, blobs, config

    ds = blobs(240, seed=42)
    cfg = config(MLP, "cross_entropy", n_epochs=3, k_values="0..24", fragment_size=17,
                 dtype=dtype, clip_gamma=0.06)
    res = train(cfg, ds)
    rng = np.random.default_rng(43)
    for kind in ("random", "adversarial", "remove", "add"):
        res2 = train(cfg, perturb(ds, kind, 1, rng))
        for name in res.lower:
            assert bool((res2.lower[name][:-1] >= res.lower[name][1:] - 1e-15).all()), (kind, name)
            assert bool((res2.upper[name][:-1] <= res.upper[name][1:] + 1e-15).all()), (kind, name)


def escapes(cfg, ds, seed: int) -> int:
    """Parameters of nominal runs on 10 targeted neighbours (10 records replaced) outside
    the third box (k = 10 in the callers' grids) trained on ds: the retraining attack of
    tests/agt/test_training.py."""
    from agt.training import train, train_nominal
    from tests.agt.test_training import targeted

    res = train(cfg, ds)
    rng = np.random.default_rng(seed)
    escaped = 0
    for _ in range(10):
        p = train_nominal(cfg, targeted(cfg, ds, 10, rng))
        for name in p:
            v = p[name].double()
            escaped += int(((v < res.lower[name][2]) | (v > res.upper[name][2])).sum())
    return escaped



def test_falsification_catches_an_off_by_one_selection(monkeypatch):
    """The retraining attack of tests/agt/test_training.py breaks the boxes of a selection one
    order statistic off: the falsification tests bite on this code path."""
    from tests.helpers import LOGISTIC_CE, blobs, config

    ds = blobs(400, seed=14)
    cfg = config(LOGISTIC_CE, n_epochs=1, k_values=[0, 3, 10])
    monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", False)
    monkeypatch.setattr(topk_mod, "select", off_by_one_select)
    assert escapes(cfg, ds, 15) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nesting_allowance_covers_every_neighbour_batch_size(dtype):
    """The computed boxes nest only if D' at k - 1 carries no larger allowance than D at k.
    Under add-remove D' has b +- 1 records, and the allowance at a dataset's own b grew with
    b (a review: by ~2e-17 gamma per record); w_k covers every batch size within distance
    k, so w_{k-1}(b +- 1) <= w_k(b), and it is never below the allowance the sums of the
    bound for k need (b values and k selected ones). It depends on (b, k) only (a second
    review: an allowance from the group's largest k changed when D' grouped the k grid
    differently)."""
    fm = FloatModel(dtype)
    for b in (2, 3, 10, 53, 1400, 1681, 25_000, 10**6):
        ks = torch.tensor(sorted({0, 1, 2, 7, 40, 47, b // 2, b - 1}))
        w = nesting_allowance(b, ks, GAMMA, fm)
        for m, k in enumerate(ks.tolist()):
            assert float(w[m]) >= rounding_allowance(b, b + k + 8, GAMMA, fm), (b, k)
            if k == 0:
                continue
            for b2 in (b - 1, b + 1):
                w2 = float(nesting_allowance(b2, torch.tensor([k - 1]), GAMMA, fm)[0])
                assert w2 <= float(w[m]), (b, b2, k)
    # what the per-b allowance got wrong: one record more, one k less, a larger allowance
    b, k_max = 25_000, 200
    assert (rounding_allowance(b + 1, b + 1 + k_max + 8, GAMMA, FloatModel(torch.float64))
            > rounding_allowance(b, b + k_max + 8, GAMMA, FloatModel(torch.float64)))


def test_a_bound_does_not_depend_on_how_the_k_grid_is_grouped():
    """The bound for k is the same whichever buffer (box group) computes it: the trainer
    groups the k grid by the batch size, so a neighbour with one record fewer may group it
    differently, and the nesting argument compares D at k with D' at k - 1 bound by bound
    (a review: the allowance read the group's largest k)."""
    rng = np.random.default_rng(11)
    b, P, k = 60, 7, 9
    lo, hi = sample_bounds(rng, 1, P, b, "continuous")
    fm = FloatModel(torch.float64)
    got = []
    for sizes in ([k], [k + 1], [40]):
        acc = stream(DescentAccumulator(1, P, sizes, GAMMA, torch.device("cpu")), lo, hi, 25)
        got.append(acc.bounds(torch.tensor([k]), fm, torch.tensor([0])))
    # the selected sums may round differently (a prefix sum of a longer buffer), by far
    # less than an allowance that read the group's largest k would differ (~2e-13 here)
    for other in got[1:]:
        assert float((other.lo - got[0].lo).abs().max()) <= 1e-15
        assert float((other.hi - got[0].hi).abs().max()) <= 1e-15
