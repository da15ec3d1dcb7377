"""The compiled single-pass merge (agt/topk_kernel.py): its selection keeps exactly the
multisets a sort keeps, its merges keep the k best of buffer and clamped fragment on rows
with ties, signed zeros, saturation and +-inf fill, its sums are float64 sums of the clamped
values, the merge of factored bounds (`OuterBounds`, kept over fragments) keeps what merging
the materialised bounds keeps, and a kernel that loses a value is caught by the checks and by
retraining on either path."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import agt.topk as topk_mod
from agt import topk_kernel

pytestmark = pytest.mark.skipif(not topk_kernel.available(), reason="numba is not importable")


def best_k(values: np.ndarray, k: int, largest: bool) -> np.ndarray:
    srt = np.sort(values, axis=-1)
    return srt[..., ::-1][..., :k] if largest else srt[..., :k]


def random_row(rng: np.random.Generator, n: int, kind: int) -> np.ndarray:
    """Continuous values, a few distinct values (ties), signed zeros, or saturated ones."""
    if kind == 0:
        return rng.normal(size=n)
    if kind == 1:
        return rng.choice([-1.0, -0.5, 0.0, 0.25, 1.0], size=n)
    if kind == 2:
        return rng.choice([-0.0, 0.0, 1e-300, -1e-300], size=n)
    return np.clip(rng.normal(scale=3.0, size=n), -1.0, 1.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_select_keeps_the_k_largest(dtype):
    """Property test over random lengths (short ones take the sort, long ones the sampled
    pivot), every kind of row and k from 1 to n; w carries the spare slot."""
    rng = np.random.default_rng(0)
    sampled = 0
    for case in range(1500):
        n = int(rng.choice([1, 2, 5, 17, 40, 130, 300, 2100]))
        k = int(rng.integers(1, n + 1))
        row = random_row(rng, n, case % 4).astype(dtype)
        w = np.empty(n + 1, dtype=dtype)
        w[:n] = row
        topk_kernel.select_largest(w, np.empty(n, dtype=dtype), np.empty(n, dtype=dtype), n, k)
        assert np.array_equal(np.sort(w[:k]), np.sort(best_k(row, k, True))), (n, k, case)
        sampled += n >= topk_kernel.SAMPLE_FROM
    assert sampled > 300


def test_select_refuses_a_range_without_its_spare_slot():
    w = np.zeros(8)
    with pytest.raises(ValueError, match="n \\+ 1 slots"):
        topk_kernel.select_largest(w, np.zeros(8), np.zeros(8), 8, 3)
    with pytest.raises(ValueError):
        topk_kernel.select_largest(np.zeros(9), np.zeros(8), np.zeros(8), 8, 0)
    with pytest.raises(ValueError):
        topk_kernel.select_largest(np.zeros(9), np.zeros(8), np.zeros(7), 8, 3)


def merge_cases(seed: int, n_cases: int):
    rng = np.random.default_rng(seed)
    for case in range(n_cases):
        rows = int(rng.integers(1, 6))
        width = int(rng.integers(1, 900))
        k = int(rng.integers(1, 300))
        frag = np.stack([random_row(rng, width, (case + r) % 4) * 2 for r in range(rows)])
        largest = bool(case % 2)
        start = int(case // 2 % 3)
        if start == 0:        # the +-inf fill of a first fragment
            buf = np.full((rows, k), -np.inf if largest else np.inf)
        elif start == 1:      # the k best of earlier values
            buf = best_k(rng.normal(size=(rows, k + 50)), k, largest).copy()
        else:                 # any k values (a buffer the floor lemma allows)
            buf = np.stack([random_row(rng, k, case % 4) for _ in range(rows)])
        yield frag, buf, k, largest


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("room", [1, 64])
def test_merge_keeps_the_k_best_of_buffer_and_clamped_fragment(monkeypatch, dtype, room):
    """Many rounds of selection (room 1: a selection per candidate) and few (room 64), over
    rows of every kind: the buffer ends with the k best of buffer and clamped fragment, the
    sum is the float64 sum of the clamped values (within its own rounding)."""
    monkeypatch.setattr(topk_kernel, "MIN_ROOM", room)
    monkeypatch.setattr(topk_kernel, "candidate_room", lambda k: room)
    gamma = 0.7
    limit = float(dtype(gamma))
    for frag, buf, k, largest in merge_cases(1, 300):
        frag = frag.astype(dtype)
        buf = buf.astype(dtype)
        clamped = np.clip(frag, -dtype(gamma), dtype(gamma))
        want = best_k(np.concatenate([buf, clamped], axis=1), k, largest)
        sums = np.full(frag.shape[0], 0.25)
        topk_kernel.merge_fragment(frag, buf, sums, gamma, largest)
        assert np.array_equal(np.sort(buf, axis=-1), np.sort(want, axis=-1))
        for r in range(frag.shape[0]):
            exact = math.fsum([0.25] + [float(v) for v in clamped[r]])
            width = frag.shape[1]
            assert abs(sums[r] - exact) <= 2 * width * 2.0**-53 * (width * limit + 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_box_without_buffer_gets_the_sums_only(dtype):
    """k = 0 (buffer None): the float64 sums of the clamped values, rows of every width
    (blocks of the scan and a tail)."""
    rng = np.random.default_rng(4)
    for width in (1, 63, 64, 65, 300):
        frag = (rng.normal(size=(3, width)) * 2).astype(dtype)
        sums = np.zeros(3)
        topk_kernel.merge_fragment(frag, None, sums, 0.5, bool(width % 2))
        clamped = np.clip(frag, -dtype(0.5), dtype(0.5))
        for r in range(3):
            exact = math.fsum(float(v) for v in clamped[r])
            assert abs(sums[r] - exact) <= 2 * width * 2.0**-53 * width * 0.5


def test_merge_propagates_nan_into_the_sum():
    frag = np.array([[0.1, np.nan, -0.2, 0.3]], dtype=np.float32)
    buf = np.full((1, 2), -np.inf, dtype=np.float32)
    sums = np.zeros(1)
    topk_kernel.merge_fragment(frag, buf, sums, 1.0, True)
    assert math.isnan(sums[0])
    assert np.array_equal(np.sort(buf[0]), np.array([0.1, 0.3], dtype=np.float32))


def test_merge_refuses_strided_arrays():
    frag = np.zeros((3, 10))[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        topk_kernel.merge_fragment(frag, np.zeros((3, 2)), np.zeros(3), 1.0, True)


LOSSY_CALLS = []


def lossy_merge(values, buffer, sums, gamma, largest):
    """The kernel followed by a bug: each row's best buffered value replaced by its worst."""
    topk_kernel.__dict__["_real_merge"](values, buffer, sums, gamma, largest)
    if buffer is None:                  # a box of k = 0: nothing buffered to lose
        return
    LOSSY_CALLS.append(values.shape)
    srt = np.sort(buffer, axis=-1)
    buffer[:] = np.concatenate([srt[:, :-1], srt[:, :1]], axis=1) if largest else \
        np.concatenate([srt[:, -1:], srt[:, 1:]], axis=1)


def test_retraining_attack_on_the_kernel_path(monkeypatch):
    """The attack against boxes whose merges went through the kernel (fragments of 50: every
    fragment after the first) finds nothing; against a kernel that loses one value per row
    it breaks the boxes, so the attack bites on this path. The naive-sort checks of the
    accumulator reject the lossy kernel too."""
    from agt.interval import FloatModel
    from agt.topk import DescentAccumulator
    from tests.agt.test_topk import GAMMA, check_against_naive, escapes, sample_bounds, stream
    from tests.helpers import LOGISTIC_CE, blobs, config

    monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", True)
    # the weights' bounds as values (the path of a layer with an interval input), not factors
    monkeypatch.setattr(DescentAccumulator, "takes_outer", lambda self, outer: False)
    ds = blobs(400, seed=14)
    cfg = config(LOGISTIC_CE, n_epochs=1, k_values=[0, 3, 10], fragment_size=50)
    calls = []
    real = topk_kernel.merge_fragment

    def counting(*args):
        calls.append(1)
        real(*args)

    monkeypatch.setattr(topk_kernel, "merge_fragment", counting)
    assert escapes(cfg, ds, 15) == 0
    assert calls

    monkeypatch.setitem(topk_kernel.__dict__, "_real_merge", real)
    monkeypatch.setattr(topk_kernel, "merge_fragment", lossy_merge)
    LOSSY_CALLS.clear()
    assert escapes(cfg, ds, 15) > 0
    assert LOSSY_CALLS

    rng = np.random.default_rng(5)
    b, P, ks = 300, 6, [4, 12]
    lo, hi = sample_bounds(rng, len(ks), P, b, "continuous", dtype=torch.float64)
    lo, hi = lo * 0.5, hi * 0.5
    LOSSY_CALLS.clear()
    acc = stream(DescentAccumulator(len(ks), P, ks, GAMMA, torch.device("cpu")), lo, hi, 50)
    with pytest.raises(AssertionError, match="unsound"):
        check_against_naive(acc.bounds(torch.tensor(ks), FloatModel(torch.float64)), lo, hi,
                            ks, [0, 1], FloatModel(torch.float64))
    assert LOSSY_CALLS


def outer_factors(rng: np.random.Generator, groups: int, out_f: int, in_f: int, b: int,
                  dtype, input_groups: int = 0) -> tuple:
    """Factors of `OuterBounds`: d_lo <= d_hi with signs of every kind, some large enough to
    saturate the clamp, exact zeros; an input with zeros, signed zeros and ties: exact
    (``input_groups`` 0: a, None) or an interval per input box (a_lo <= a_hi, (A, in, b),
    some of zero width, some across zero)."""
    d = rng.normal(size=(2, groups, out_f, b)) * rng.choice([0.05, 0.5, 3.0], size=(1, 1, out_f, 1))
    d[:, :, :, ::7] = 0.0
    d_lo, d_hi = d.min(0), d.max(0)
    shape = (in_f, b) if input_groups == 0 else (input_groups, in_f, b)
    a = np.where(rng.random(shape) < 0.2, rng.choice([0.0, -0.0, 1.0, -1.0], size=shape),
                 rng.normal(size=shape))
    a_hi = None
    if input_groups:
        a_hi = a + np.where(rng.random(shape) < 0.3, 0.0, np.abs(rng.normal(size=shape)))
        a_hi = a_hi.astype(dtype)
    return d_lo.astype(dtype), d_hi.astype(dtype), a.astype(dtype), a_hi


def as_outer(d_lo, d_hi, a, a_hi):
    from agt.bounded.layers import OuterBounds

    return OuterBounds(torch.from_numpy(d_lo), torch.from_numpy(d_hi), torch.from_numpy(a),
                       None if a_hi is None else torch.from_numpy(a_hi))


def clamped_sums(fragments, gamma: float, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Exact (math.fsum) sums of the clamped materialised bounds, per box and row."""
    per_lo, per_hi = [], []
    for factors in fragments:
        values = as_outer(*factors).values(0, factors[0].shape[1])
        per_lo.append(values.lo.clamp(-gamma, gamma).double().numpy())
        per_hi.append(values.hi.clamp(-gamma, gamma).double().numpy())
    lo, hi = np.concatenate(per_lo, -1), np.concatenate(per_hi, -1)
    return (np.vectorize(math.fsum, signature="(n)->()")(lo),
            np.vectorize(math.fsum, signature="(n)->()")(hi))


def run_outer(fragments, sizes, gamma, outer: bool, dtype):
    """A DescentAccumulator fed `OuterBounds` fragments: through add_outer (compiled, kept
    until read) or through add of their materialised values (the plain path)."""
    from agt.topk import DescentAccumulator

    groups = len(sizes)
    P = fragments[0][0].shape[1] * fragments[0][2].shape[-2]
    acc = DescentAccumulator(groups, P, sizes, gamma, torch.device("cpu"), dtype)
    for parts in fragments:
        factors = as_outer(*parts)
        if outer:
            assert acc.takes_outer(factors)
            acc.add_outer(factors)
        else:
            acc.add(0, P, factors.values(0, parts[0].shape[1]))
        acc.samples_seen(factors.n_samples)
    acc.flush()
    return acc


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("defer", [1, 1 << 30])
@pytest.mark.parametrize("inputs", ["exact", "interval-shared", "interval-per-box"])
def test_outer_merge_keeps_what_the_materialised_bounds_keep(monkeypatch, dtype, defer, inputs):
    """Factored bounds merged by the kernel (every fragment at once, or each on its own with
    a 1-byte deferral) leave the buffers holding exactly the multisets that merging their
    materialised values leaves, per box (k = 0, k within the batch, k beyond it: the fill
    stays), with shared (G = 1) and per-box factors, for an exact input and for interval
    inputs (one shared by every box, or one per box); the sums are float64 sums of the
    clamped bounds (against math.fsum: the plain path's float32 blocks would add their own
    rounding)."""
    ndtype = np.float32 if dtype == torch.float32 else np.float64
    monkeypatch.setattr(topk_mod, "DEFER_BYTES", defer)
    rng = np.random.default_rng(7)
    for case in range(6):
        out_f, in_f = int(rng.integers(1, 5)), int(rng.integers(1, 7))
        sizes = [0, int(rng.integers(1, 30)), 600]
        shared = case % 2 == 0
        input_groups = {"exact": 0, "interval-shared": 1, "interval-per-box": len(sizes)}[inputs]
        widths = [int(w) for w in rng.integers(1, 200, size=int(rng.integers(1, 4)))]
        fragments = [outer_factors(rng, 1 if shared else len(sizes), out_f, in_f, w, ndtype,
                                   input_groups) for w in widths]
        gamma = float(rng.choice([0.05, 0.4, 2.0]))
        got = run_outer(fragments, sizes, gamma, True, dtype)
        monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", False)
        want = run_outer(fragments, sizes, gamma, False, dtype)
        monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", True)
        for g, k in enumerate(sizes):
            for mine, theirs in ((got.top_lo[g], want.top_lo[g]), (got.low_hi[g], want.low_hi[g])):
                if k:
                    assert torch.equal(mine.sort(-1).values, theirs.sort(-1).values), (case, g)
        exact_lo, exact_hi = clamped_sums(fragments, gamma, dtype)
        total = sum(widths)
        tol = 2 * total * 2.0**-53 * total * gamma       # float64 sums of clamped values
        for mine, exact in ((got.sum_lo, exact_lo), (got.sum_hi, exact_hi)):
            exact = np.broadcast_to(exact, mine.shape)
            assert np.abs(mine.numpy() - exact).max() <= tol, case


@pytest.mark.parametrize("input_groups", [0, 1])
def test_outer_merge_propagates_nan_like_the_materialised_bounds(input_groups):
    """A NaN input (and an infinite d times a zero input) gives NaN bounds on both paths: the
    rows it reaches get NaN sums, in the same rows (exact and interval inputs)."""
    rng = np.random.default_rng(8)
    d_lo, d_hi, a, a_hi = outer_factors(rng, 1, 3, 4, 90, np.float32, input_groups)
    a[..., 2, 5] = np.nan
    d_hi[0, 1, 7] = np.inf
    a[..., :, 7] = 0.0
    if a_hi is not None:
        a_hi[..., :, 7] = 0.0
    parts = [(d_lo, d_hi, a, a_hi)]
    got = run_outer(parts, [5], 0.5, True, torch.float32)
    topk_mod.FUSED_ON_CPU, saved = False, topk_mod.FUSED_ON_CPU
    try:
        want = run_outer(parts, [5], 0.5, False, torch.float32)
    finally:
        topk_mod.FUSED_ON_CPU = saved
    for mine, theirs in ((got.sum_lo, want.sum_lo), (got.sum_hi, want.sum_hi)):
        assert torch.equal(torch.isnan(mine), torch.isnan(theirs))
        assert bool(torch.isnan(mine).any())


def test_outer_accumulator_refuses_a_second_add_before_samples_seen():
    from agt.errors import SoundnessError
    from agt.topk import DescentAccumulator

    factors = as_outer(*outer_factors(np.random.default_rng(9), 1, 2, 3, 10, np.float32))
    acc = DescentAccumulator(1, 6, 3, 0.5, torch.device("cpu"), torch.float32)
    acc.add_outer(factors)
    with pytest.raises(SoundnessError, match="twice"):
        acc.add_outer(factors)
    wrong = DescentAccumulator(1, 7, 3, 0.5, torch.device("cpu"), torch.float32)
    assert not wrong.takes_outer(factors)          # another parameter's size
    other = DescentAccumulator(1, 6, 3, 0.5, torch.device("cpu"), torch.float64)
    assert not other.takes_outer(factors)          # another dtype


LOSSY_OUTER_CALLS = []


def lossy_outer(d_lo, d_hi, a, a_hi, inputs, buf_lo, buf_hi, sum_lo, sum_hi, gamma):
    """merge_outer followed by a bug: each of its rows' buffered values all replaced by the
    worst of them (a merge that keeps one value)."""
    topk_kernel.__dict__["_real_outer"](d_lo, d_hi, a, a_hi, inputs, buf_lo, buf_hi, sum_lo,
                                        sum_hi, gamma)
    if buf_lo is None:
        return
    LOSSY_OUTER_CALLS.append(inputs)
    in_f = a.shape[0]
    rows = [o * in_f + i for o in range(d_lo.shape[0]) for i in range(*inputs)]
    for buf, largest in ((buf_lo, True), (buf_hi, False)):
        worst = buf[rows].min(-1) if largest else buf[rows].max(-1)
        buf[rows] = worst[:, None]


def test_retraining_attack_on_the_outer_path(monkeypatch):
    """A logistic model's weights (an exact input) take the factored path: retraining on
    targeted neighbours escapes none of its boxes, fragments of 50 kept and merged at once;
    a merge_outer that keeps one value per row is caught by the same attack when each
    fragment is merged on its own (a 1-byte deferral: the bug strikes 8 times a step; once
    a step, or one value lost, moved the boxes of this small model too little for these
    retrainings to reach)."""
    from tests.agt.test_topk import escapes
    from tests.helpers import LOGISTIC_CE, blobs, config

    monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", True)
    ds = blobs(400, seed=14)
    cfg = config(LOGISTIC_CE, n_epochs=1, k_values=[0, 3, 10], fragment_size=50)
    calls = []
    real = topk_kernel.merge_outer

    def counting(*args):
        calls.append(args[0].shape[1])              # samples per merge
        real(*args)

    monkeypatch.setattr(topk_kernel, "merge_outer", counting)
    assert escapes(cfg, ds, 15) == 0
    assert calls and max(calls) > 50                # fragments were merged together

    monkeypatch.setitem(topk_kernel.__dict__, "_real_outer", real)
    monkeypatch.setattr(topk_kernel, "merge_outer", lossy_outer)
    monkeypatch.setattr(topk_mod, "DEFER_BYTES", 1)
    LOSSY_OUTER_CALLS.clear()
    assert escapes(cfg, ds, 15) > 0
    assert LOSSY_OUTER_CALLS
