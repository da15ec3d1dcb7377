"""The compiled single-pass merge (agt/topk_kernel.py): its selection keeps exactly the
multisets a sort keeps, its merges keep the k best of buffer and clamped fragment on rows
with ties, signed zeros, saturation and +-inf fill, its sums are float64 sums of the clamped
values, and a kernel that loses a value is caught by the checks and by retraining."""

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
