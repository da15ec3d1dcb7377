"""The torch merge of factored bounds (agt/topk_torch.py, the GPU's path; AGT_FACTORED_MERGE=torch
on the CPU): the same multisets as the materialised-bounds path and the compiled kernel, hence
bit-equal top-k sums, batch sums within the order bound of float64 sums, blocks within their
budget, and a small AGT training whose bundles match the compiled path's. The same comparisons
run on a GPU in the tests marked ``cuda``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import agt.memory as memory_mod
import agt.topk as topk_mod
from agt import topk_kernel
from agt.interval import FloatModel
from agt.interval import gamma as gamma_n
from agt.topk_torch import block_shape
from tests.agt.test_topk_kernel import as_outer, clamped_sums, outer_factors, run_outer

U64 = 2.0**-53
HAS_NUMBA = topk_kernel.available()
NO_CUDA = not torch.cuda.is_available()


def _run(monkeypatch, fragments, sizes, gamma, dtype, path: str, device="cpu"):
    """An accumulator fed the fragments by ``path``: "torch" (the torch merge), "compiled"
    (the numba kernel) or "plain" (their materialised values, added by rows)."""
    monkeypatch.setattr(topk_mod, "FACTORED_TORCH_ON_CPU", path == "torch")
    monkeypatch.setattr(topk_mod, "FUSED_ON_CPU", path == "compiled")
    if device == "cpu":
        return run_outer(fragments, sizes, gamma, path != "plain", dtype)
    from agt.topk import DescentAccumulator

    P = fragments[0][0].shape[1] * fragments[0][2].shape[-2]
    acc = DescentAccumulator(len(sizes), P, sizes, gamma, torch.device(device), dtype)
    for parts in fragments:
        factors = as_outer(*parts)
        factors = type(factors)(*(None if t is None else t.to(device) for t in
                                  (factors.d_lo, factors.d_hi, factors.a, factors.a_hi)))
        assert acc.takes_outer(factors)
        acc.add_outer(factors)
        acc.samples_seen(factors.n_samples)
    acc.flush()
    return acc


def _compare(got, want, fragments, sizes, gamma, dtype, blocked=False):
    """Equal multisets per box, bit-equal top-k sums for every k of each box's grid, the torch
    merge's batch sums within the float64 order bound of the exact sums, and bounds apart by
    at most the two paths' sum errors (``blocked``: the reference adds blocks of 16 in the
    compute dtype, `agt.topk.blocked_sum`)."""
    k_all, group = [], []
    for g, k in enumerate(sizes):
        for kk in sorted({0, 1, k // 2, k, k + 3}):   # k >= b where the box saw fewer
            if kk <= k or k >= sum(f[0].shape[-1] for f in fragments):
                k_all.append(kk)
                group.append(g)
        for mine, theirs in ((got.top_lo[g], want.top_lo[g]), (got.low_hi[g], want.low_hi[g])):
            if k:
                assert torch.equal(mine.cpu().sort(-1).values, theirs.cpu().sort(-1).values), g
    ks, groups = torch.tensor(k_all), torch.tensor(group)
    for bufs, largest in (("top_lo", True), ("low_hi", False)):
        mine = got._selected_sums(getattr(got, bufs), ks.to(got.sum_lo.device),
                                  groups.to(got.sum_lo.device), largest)
        theirs = want._selected_sums(getattr(want, bufs), ks, groups, largest)
        assert torch.equal(mine.cpu(), theirs.cpu()), bufs
    n = sum(f[0].shape[-1] for f in fragments)
    tol = 2 * n * U64 * n * gamma          # two float64 sums of n clamped values, any order
    exact_lo, exact_hi = clamped_sums(fragments, gamma, dtype)
    for mine, exact in ((got.sum_lo, exact_lo), (got.sum_hi, exact_hi)):
        exact = np.broadcast_to(exact, mine.shape)
        assert np.abs(mine.cpu().numpy() - exact).max() <= tol / 2
    fm = FloatModel(dtype)
    if blocked:     # the reference's compute-dtype blocks, charged by `_sum_slack`
        tol += 2 * gamma_n(topk_mod.SUM_BLOCK, fm.unit_roundoff) * n * gamma
    a = got.bounds(ks.to(got.sum_lo.device), fm, groups.to(got.sum_lo.device))
    b = want.bounds(ks, fm, groups)
    for x, y in ((a.lo, b.lo), (a.hi, b.hi)):
        assert float((x.cpu() - y).abs().max()) <= 4 * tol / n


def _cases(rng, dtype, inputs):
    """Random factor fragments (ties, exact and signed zeros, negative values, saturation)
    and k grids with k = 0, k within the batch and k beyond it."""
    ndtype = np.float32 if dtype == torch.float32 else np.float64
    for case in range(4):
        out_f, in_f = int(rng.integers(1, 5)), int(rng.integers(1, 7))
        sizes = [[0, int(rng.integers(1, 30)), 600], [3], [0], [1, 1, 7, 2]][case]
        shared = case % 2 == 0
        groups = 1 if shared else len(sizes)
        input_groups = {"exact": 0, "interval-shared": 1, "interval-per-box": groups}[inputs]
        widths = [int(w) for w in rng.integers(1, 150, size=int(rng.integers(1, 4)))]
        fragments = [outer_factors(rng, groups, out_f, in_f, w, ndtype, input_groups)
                     for w in widths]
        yield fragments, sizes, float(rng.choice([0.05, 0.4, 2.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("inputs", ["exact", "interval-shared", "interval-per-box"])
@pytest.mark.parametrize("block", [1, 40, 1 << 24])
def test_torch_merge_keeps_the_reference_multisets(monkeypatch, dtype, inputs, block):
    """Against the materialised-bounds path and (with numba) the compiled kernel: blocks of
    one value (one output, input and sample each), of a few rows, and of everything."""
    monkeypatch.setattr(memory_mod, "FACTORED_BLOCK_ELEMENTS", block)
    rng = np.random.default_rng(11)
    for fragments, sizes, gamma in _cases(rng, dtype, inputs):
        got = _run(monkeypatch, fragments, sizes, gamma, dtype, "torch")
        for path in ("plain", "compiled") if HAS_NUMBA else ("plain",):
            want = _run(monkeypatch, fragments, sizes, gamma, dtype, path)
            _compare(got, want, fragments, sizes, gamma, dtype, blocked=path == "plain")


def test_torch_merge_propagates_nan_into_the_sums(monkeypatch):
    """A NaN input (and an infinite d times a zero input) gives NaN sums in the same rows as
    the materialised path: those rows' bounds are NaN whatever their buffers hold."""
    rng = np.random.default_rng(8)
    d_lo, d_hi, a, a_hi = outer_factors(rng, 1, 3, 4, 90, np.float32, 0)
    a[2, 5] = np.nan
    d_hi[0, 1, 7] = np.inf
    a[:, 7] = 0.0
    parts = [(d_lo, d_hi, a, a_hi)]
    got = _run(monkeypatch, parts, [5], 0.5, torch.float32, "torch")
    want = _run(monkeypatch, parts, [5], 0.5, torch.float32, "plain")
    for mine, theirs in ((got.sum_lo, want.sum_lo), (got.sum_hi, want.sum_hi)):
        assert torch.equal(torch.isnan(mine), torch.isnan(theirs))
        assert bool(torch.isnan(mine).any())


def test_a_block_fits_its_budget_and_the_blocks_cover_the_factors():
    for out_f, in_f, n, boxes, buffered, k_max, budget in [
            (100, 768, 5000, 17, 16, 16, 1 << 24), (3, 4, 90, 1, 1, 5, 7),
            (7, 5, 3, 2, 2, 600, 1 << 12), (1, 1, 1, 1, 0, 0, 1), (4, 9, 50, 3, 2, 4, 500)]:
        rows, inputs, samples = block_shape(out_f, in_f, n, boxes, buffered, k_max, budget)
        assert 1 <= rows <= out_f and 1 <= inputs <= in_f and 1 <= samples <= n
        size = rows * inputs * ((boxes + buffered) * samples + buffered * k_max)
        # over budget only where a single parameter's one-sample workspace exceeds it
        assert size <= budget or (rows, inputs, samples) == (1, 1, 1)
        assert rows == 1 or inputs == in_f        # a block of several rows takes whole rows


def test_a_broken_torch_merge_is_caught(monkeypatch):
    """A merge that keeps the k-th best value in every slot (one value lost per row) differs
    from the reference multisets: the comparison above would fail."""
    import agt.topk_torch as topk_torch

    real = topk_torch._merge_block

    def lossy(values, sums, stacked, box_index, where, gamma, k_max, largest):
        real(values, sums, stacked, box_index, where, gamma, k_max, largest)
        if stacked is not None:
            o0, o1, i0, i1 = where
            held = stacked[:, o0:o1, i0:i1]
            held.copy_(held[..., k_max - 1:k_max].expand_as(held))

    monkeypatch.setattr(topk_torch, "_merge_block", lossy)
    rng = np.random.default_rng(3)
    fragments = [outer_factors(rng, 1, 2, 3, 60, np.float64, 0)]
    got = _run(monkeypatch, fragments, [4], 0.4, torch.float64, "torch")
    want = _run(monkeypatch, fragments, [4], 0.4, torch.float64, "plain")
    with pytest.raises(AssertionError):
        _compare(got, want, fragments, [4], 0.4, torch.float64, blocked=True)


def _train_both(monkeypatch, cfg, ds):
    """The same training with the reference factored merge (compiled with numba, else the
    materialised bounds) and with the torch merge; asserts the torch merge ran."""
    import agt.topk_torch as topk_torch
    from agt.training import train

    monkeypatch.setattr(topk_mod, "FACTORED_TORCH_ON_CPU", False)
    want = train(cfg, ds)
    calls = []
    real = topk_torch.merge_outer

    def counting(*args):
        calls.append(args[0].n_samples)
        real(*args)

    monkeypatch.setattr(topk_torch, "merge_outer", counting)
    monkeypatch.setattr(topk_mod, "FACTORED_TORCH_ON_CPU", True)
    got = train(cfg, ds)
    assert calls
    return got, want


@pytest.mark.parametrize("dtype,batch", [("float32", "full"), ("float64", 100)])
def test_training_with_the_torch_merge_gives_the_reference_bundle(monkeypatch, dtype, batch):
    """Blobs MLP with a hidden layer (interval inputs to the second layer), full batch or
    minibatches, fragments of 70 records: the nominal trajectory is the same number for
    number; float32 boxes are bit-equal (its float64 batch sums of a few hundred float32
    values came out equal on both paths); float64 boxes differ only by the batch sums' order,
    a few units of the last place per step."""
    from tests.helpers import MLP, blobs, config

    cfg = config(MLP, dtype=dtype, n_epochs=2, batch_size=batch, k_values=[0, 1, 3, 10, 60],
                 fragment_size=70)
    got, want = _train_both(monkeypatch, cfg, blobs(300, seed=4))
    for name in want.lower:
        assert torch.equal(got.nominal[name], want.nominal[name])
        for mine, theirs in ((got.lower[name], want.lower[name]),
                             (got.upper[name], want.upper[name])):
            gap = float((mine - theirs).abs().max())
            if dtype == "float32":
                assert gap == 0.0, name
            else:
                assert gap <= 64 * U64 * cfg.clip_gamma, (name, gap)


@pytest.mark.cuda
@pytest.mark.skipif(NO_CUDA, reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("inputs", ["exact", "interval-per-box"])
def test_cuda_torch_merge_keeps_the_cpu_reference_multisets(monkeypatch, dtype, inputs):
    """The same comparison with the torch merge on the GPU."""
    rng = np.random.default_rng(12)
    for fragments, sizes, gamma in _cases(rng, dtype, inputs):
        got = _run(monkeypatch, fragments, sizes, gamma, dtype, "torch", device="cuda")
        want = _run(monkeypatch, fragments, sizes, gamma, dtype, "plain")
        _compare(got, want, fragments, sizes, gamma, dtype, blocked=True)


@pytest.mark.cuda
@pytest.mark.skipif(NO_CUDA, reason="no CUDA device")
def test_cuda_training_takes_the_torch_merge_and_matches_the_cpu_bundle():
    """A CUDA training routes its factored bounds through the torch merge, and each device's
    nominal parameters lie inside the other device's k >= 1 boxes (the nominal passes of two
    devices may round apart, so the boxes are compared through what they must contain)."""
    import agt.topk_torch as topk_torch
    from agt.training import train
    from tests.helpers import MLP, assert_each_holds_the_others_nominal, blobs, config

    ds = blobs(300, seed=4)
    settings = dict(n_epochs=2, k_values=[0, 1, 3, 10, 60], fragment_size=70)
    cpu = train(config(MLP, **settings), ds)
    calls = []
    real = topk_torch.merge_outer

    def counting(*args):
        calls.append(1)
        real(*args)

    topk_torch.merge_outer = counting
    try:
        gpu = train(config(MLP, device="cuda", **settings), ds)
    finally:
        topk_torch.merge_outer = real
    assert calls
    assert_each_holds_the_others_nominal({"cpu": cpu, "cuda": gpu})
