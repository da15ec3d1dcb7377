"""Streaming top-k/bottom-k accumulation and the descent-direction bound (paper Thm 4.6).

For a batch of size b, per-sample clamped gradient bounds g_i^L <= g_i <= g_i^U (elementwise
per parameter, valid for every parameter in the current box) and a distance k:

    delta_L = ( sum of the smallest (b - k) of g_i^L  -  k * gamma ) / b
    delta_U = ( sum of the largest  (b - k) of g_i^U  +  k * gamma ) / b

bound the clamped mean gradient of every batch obtained by replacing up to k records (and,
with the divisor of the actual batch, by removing up to k and adding up to k; the
intersection with [-gamma, gamma], where every clamped mean lies, keeps k >= b sound).

Streaming: ``sum of the smallest (b - k) = sum of all - sum of the largest k``, so per
parameter we keep the running sum of all g^L and a buffer of its k largest values (and the
sum of all g^U with a buffer of its k smallest), merged fragment by fragment: memory is
O(P k), not O(P b).

Why the fast path is the exact rule. The bound is a function of two sums and of
the *multiset* of selected values; a selection only moves values, it never rounds. So any
procedure that ends with the same multiset per parameter gives the same real-number bound,
its float64 sums carry the same a-priori rounding allowance (`rounding_allowance`: any
summation order), and everything proven for the exact rule (soundness, and the nesting
box(D', k-1) inside box(D, k) behind the smooth radius, a real-arithmetic statement) carries
over unchanged. The computed sums of two different multisets can break that real-number
nesting by up to twice the allowance w (each lies within w of its real value), so the bound
for k is widened by w_k (1 + 2k), not w: the computed bound for D' at k - 1 is then at least
D's at k (every later operation of a step is isotone in its boxes). This needs
w_{k-1}(D') <= w_k(D); under add-remove D' has one record more or fewer, so w_k is the
allowance of the worst batch size within distance k (`nesting_allowance`). The path:

* Merge lemma. For multisets A, B and k <= |A|: top_k(A u B) = top_k(top_k(A) u B) as
  multisets of values. (An element of A outside top_k(A) has k elements of A at least as
  large; ties are interchangeable in a sum.) The first fragment fills the buffer (A is
  then the +-inf fill, which loses to every value), later ones are merged into it; the
  fill survives only while fewer than k values were seen, and counts 0 in the sums (the
  prefix sums zero it after sorting, where it sorts behind every value).
* Selection on the CPU by numpy: ``ndarray.partition`` (introselect, SIMD on x86) puts a
  row's k largest last, in place: measured 8-10x faster than ``torch.topk`` and
  ``torch.kthvalue`` on rows of 2000-10000 values. On rows that are mostly ties (the
  exact zeros of ReLU masks, gradients saturated at +-gamma) introselect slows down 3-10x
  and a full SIMD sort is faster, so `select` sorts when sample rows say so. Row blocks go
  to torch's thread count (numpy releases the GIL). Other devices use ``torch.topk``.
* The k largest of -g^U are minus the k smallest of g^U, and the clamp is symmetric: the
  upper side selects the k smallest of g^U directly (no negation pass; sums flip sign exactly).
* One buffer per box, of that box's own k (a box with k = 0 keeps none); a box shared by
  every k (the first step) keeps one buffer of the largest k, sorted once at the end, whose
  prefix sums give every smaller k.
* The clamp writes straight into the merge workspace ``[buffer | fragment]`` and the batch
  sum reads the clamped fragment there: no concatenation, no fresh allocations per chunk.
* Block prefilter (`block_pool`). Where k is small against the fragment, the selection runs
  over a pool instead of the whole row: the blocks of B values with the best extremes (one
  cheap max pass), and after the first fragment only the blocks whose extreme beats the
  buffer's worst value. The pool keeps the same multiset (the block and floor lemmas in
  its docstring), so this is the exact rule; it cuts the values selected per row from
  k + F to about k + k B on the IMDB-like benchmark's k = 10 and 100.

* Compiled merge (`agt.topk_kernel`, with numba; the CPU default where it imports). One
  pass per row clamps each value, adds it to the float64 batch sum and offers it to the
  buffer only if it beats the buffer's worst value; a selection runs only when the
  candidates fill their room. The same multisets (its module docstring); in a random order
  about k (1 + ln(n / k)) values per row and step become candidates, and no workspace.
  Without numba, or off the CPU, the path above.
* Factored bounds (`DescentAccumulator.add_outer`). A linear layer hands over its
  per-sample weight bounds as factors (`agt.bounded.layers.OuterBounds`: the widened
  output gradient and the input, exact or an interval; O(b (in + G out)) numbers for
  2 G out in b bounds). The compiled merge computes each row's bounds where it merges
  them, so none is written to memory (the IMDB-like benchmark's first layer: 6.1 GB of
  bounds written and read per box and step before), and the factors of several fragments
  are kept and merged at once: a buffer's k values meet a selection once per merge, not
  once per fragment. The bounds are the ones `OuterBounds.values` gives, value for value, so the
  multisets are those of the path above (the merge lemma holds in any grouping).
  Off the CPU (and on it under AGT_FACTORED_MERGE=torch) the torch merge
  (`agt.topk_torch`) takes the factors instead: blocks of output units, inputs and samples
  formed on the device by `OuterBounds.block`, one ``topk`` per block for every box of the
  group; the same multisets (its module docstring).

Ideas of the issue not kept (benchmarks/bench_imdb.py, bench_heatmap.py): thresholds from the
nominal order statistics (the variational form is equal to exact only at a threshold between
the k-th and (k+1)-th largest *bound*, which nominal thresholds rarely hit, and no nesting
proof is known for thresholds that depend on the data); the variational form at the exact order
statistic (equal to exact, but that statistic is known only after the last fragment: a
second pass over the values); lower-precision selection keys (the selection is no longer the
bottleneck, and ties in a coarser key would need an exact correction); compacting a later
fragment's single candidate values (beyond the running k-th best) with tensor operations:
measured slower on the IMDB-like benchmark where introselect is SIMD-fast (k = 10: 17-19 s
vs 15-16 s, k = 1000: 37-41 s vs 20-21 s), and on a machine where it is not, building the
pool cost as much as the selection it saved (k = 1000: 13 ms vs 12 ms per row chunk). The
compiled merge does that compaction value by value inside its one scan, where it costs a
comparison per value, not a pass per tensor operation.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np
import torch

from agt.errors import SoundnessError
from agt.interval import BOUND_DTYPE, FloatModel, Interval
from agt.interval import gamma as gamma_n

_U64 = 2.0**-53
SUM_BLOCK = 16


def blocked_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim, returned in float64: blocks of SUM_BLOCK values are summed in
    the input dtype (worst-case relative error gamma_16(u) of the block's absolute sum,
    accounted for by the callers), the block sums in float64. Several times faster than a
    float64 cast of every value."""
    if x.dtype == BOUND_DTYPE:
        return x.sum(-1)
    n = x.shape[-1]
    main = n - n % SUM_BLOCK
    # each partial sum adds SUM_BLOCK values (strided: vectorises well), then float64
    out = x[..., :main].reshape(*x.shape[:-1], SUM_BLOCK, main // SUM_BLOCK).sum(-2)
    out = out.to(BOUND_DTYPE).sum(-1)
    if main < n:
        out = out + x[..., main:].to(BOUND_DTYPE).sum(-1)
    return out


def _sum_slack(fm: FloatModel) -> float:
    """Relative (to b * gamma) error of blocked sums in the compute dtype."""
    return gamma_n(SUM_BLOCK, fm.unit_roundoff)


def clamp_limit(gamma: float, *dtypes: torch.dtype) -> float:
    """The largest magnitude a clamp to [-gamma, gamma] can return in any of ``dtypes``:
    torch rounds the limit to the tensor's dtype first (to nearest: float32(0.3) > 0.3), so
    a clamped float32 gradient, and any mean of such, can exceed gamma by u * gamma. Bounds
    use this value for the k * gamma term and their final clamp."""
    return max([float(gamma)] + [float(torch.tensor(gamma, dtype=d)) for d in dtypes])


def rounding_allowance(b: int, n_terms: int, gamma: float, fm: FloatModel) -> float:
    """Outward widening of a descent bound (a mean over b clamped values, |values| <= gamma)
    computed from float64 sums of at most ``n_terms`` terms in any order: their rounding
    (two sums), the nominal mean (accumulated in float64, rounded once to the training
    dtype), the blocked compute-dtype partial sums, and per-product underflow."""
    return ((2.0 * gamma_n(n_terms, _U64) * n_terms / b + 2.0 * fm.unit_roundoff
             + 8 * _U64 + _sum_slack(fm)) * gamma + 2.0 * fm.absolute(1))


def nesting_allowance(b: int, k: torch.Tensor, gamma: float, fm: FloatModel) -> torch.Tensor:
    """Per distance k (int tensor (M,)): the `rounding_allowance` of the descent bound for k
    of *any* batch size b'' in [b - k, b + k]: its two float64 sums add b'' values
    (blocked) and k selected ones, at most b + 2k + 8 terms with the final operations.

    The allowance decreases with the divisor and grows with the number of terms, so it is
    largest at b'' = b - k and b + 2k + 8 terms. For an add-remove neighbour D' (batch size
    b +- 1) the range of D' at k - 1 lies inside D's at k, hence w_{k-1}(D') <= w_k(D):
    the nesting argument of the module docstring needs exactly this (with w evaluated at
    each dataset's own b, w(D') exceeded w(D) by ~2e-17 gamma when D' had one record more).
    It depends on b and k only: not on how the trainer groups the k grid into boxes
    (groups sized from the batch would let D and D' see different group maxima)."""
    values, inverse = torch.unique(k.cpu(), return_inverse=True)
    per_value = torch.tensor([rounding_allowance(max(1, b - kk), b + 2 * kk + 8, gamma, fm)
                              for kk in values.tolist()], dtype=BOUND_DTYPE)
    return per_value[inverse]


#: CPU selections through numpy (SIMD introselect/sort); False: torch everywhere. Both give the
#: same multisets; the tests run the accumulator under each.
NUMPY_ON_CPU = True


def _numpy_ok(t: torch.Tensor) -> bool:
    return NUMPY_ON_CPU and t.device.type == "cpu"


#: Above this fraction of equal neighbours in sorted sample rows, a full sort beats
#: introselect: numpy's partition slows down 3-10x on rows full of duplicates (exact zeros of
#: ReLU masks, gradients saturated at +-gamma), its SIMD sort does not (measured: 50% zeros,
#: float64, 3000 per row: partition 2.5-8 ns, sort 1.7 ns per value; no duplicates: 1.0 vs
#: 2.8; the two cross near 20-30%).
SORT_ABOVE_DUPLICATES = 0.2
#: Rows this short are sorted without sampling them first: the sampling costs more than
#: any difference between the two (many small boxes: ensemble teachers, the first step's
#: one pass per k).
SORT_ROWS_UP_TO = 256


def _spaced(n: int, parts: int) -> np.ndarray:
    """``parts + 1`` integer cuts from 0 to n, as even as integers allow (what
    ``np.linspace(0, n, parts + 1).astype(int)`` gives, without its per-call overhead)."""
    return np.arange(parts + 1, dtype=np.int64) * n // parts


def _duplicate_heavy(a: np.ndarray) -> bool:
    """Estimate, from up to 4 sorted sample rows, whether the rows of ``a`` are mostly ties."""
    rows = a.reshape(-1, a.shape[-1])
    n_pick = min(rows.shape[0], 4)
    pick = rows[_spaced(rows.shape[0] - 1, n_pick - 1) if n_pick > 1 else [0]]
    srt = np.sort(pick, axis=-1)
    return float(np.mean(srt[:, 1:] == srt[:, :-1])) > SORT_ABOVE_DUPLICATES


def select(ws: torch.Tensor, k: int, largest: bool) -> torch.Tensor:
    """The k largest (or smallest) entries of every row of ``ws`` (..., n), 0 < k <= n, in
    any order.

    CPU: reorders each row in place (introselect, ``numpy.ndarray.partition``, or a full
    sort when the rows are mostly ties) so that its last (first) k entries are its k largest
    (smallest) and returns that view; the row stays a permutation of its values. Otherwise
    ``torch.topk`` (a new tensor). A selection only moves values, it never rounds: every
    way gives the same multiset."""
    n = ws.shape[-1]
    if not _numpy_ok(ws):
        return ws.topk(k, dim=-1, largest=largest, sorted=False).values
    if k < n:
        a = ws.numpy()
        if n <= SORT_ROWS_UP_TO or _duplicate_heavy(a):
            _by_rows(lambda rows: rows.sort(axis=-1), a)
        else:
            kth = n - k if largest else k - 1
            _by_rows(lambda rows: rows.partition(kth, axis=-1), a)
    return ws[..., n - k:] if largest else ws[..., :k]


#: CPU merges through the compiled single-pass kernel (agt.topk_kernel) where numba is
#: importable; False: the plain path (workspace, clamp, blocked sum, selection). Both keep
#: the same multisets; the tests run the accumulator under each.
FUSED_ON_CPU = True
_FUSED_DTYPES = (torch.float32, torch.float64)
_FACTORED_ENV = os.environ.get("AGT_FACTORED_MERGE", "").strip().lower()
#: CPU merges of factored bounds (`DescentAccumulator.add_outer`) through the torch merge
#: (`agt.topk_torch`, what every other device runs) instead of the compiled kernel: for
#: tests and comparisons. Set by the environment variable AGT_FACTORED_MERGE=torch.
FACTORED_TORCH_ON_CPU = _FACTORED_ENV == "torch"
#: No factored merge on any device: linear layers' bounds are materialised by row chunks and
#: added (the path before factored bounds; for comparisons).
#: Set by AGT_FACTORED_MERGE=materialise.
FACTORED_OFF = _FACTORED_ENV == "materialise"

#: The block prefilter of the merges (`block_pool`); False: the plain path everywhere (the
#: tests compare both ways).
BLOCK_PREFILTER = True
#: The most values in one block of the prefilter.
MAX_BLOCK = 32


def _block_size(width: int, k: int) -> int:
    """The power of two nearest below sqrt(width / k), within [1, MAX_BLOCK]: a pool of about
    k blocks of B values after a scan of width / B block extremes costs k B + width / B,
    least at B = sqrt(width / k)."""
    target = math.sqrt(width / max(k, 1))
    return min(MAX_BLOCK, 1 << max(0, int(math.floor(math.log2(max(1.0, target))))))


def block_pool(frag: torch.Tensor, k: int, largest: bool,
               held: torch.Tensor | None = None, seen: int = 0) -> torch.Tensor | None:
    """A small pool with the same k largest (smallest) values as ``held`` and ``frag``
    together, or None where blocks would not shrink the selection.

    ``frag`` (rows, F) is cut into blocks of B consecutive values (a shorter tail stays whole
    in the pool); a block's extreme is its largest (smallest) value. Without ``held`` (the
    first fragment), the pool is the k blocks of the best extremes and the tail. With
    ``held`` (rows, k), any k values per row (the buffer; ``seen`` values lie behind it),
    the pool is ``held``, the q blocks of the best extremes and the tail, where q is the most
    blocks of one row whose extreme beats held's worst value ``floor`` strictly, at most k.
    Below "better" is "larger" (largest) or "smaller"; values are totally ordered (NaN
    aside, see the end). Every pool is a sub-multiset of its input, so it suffices that it
    holds every value better than the input's k-th best value v and at least k values at
    least as good as v: then its k best values are the input's, as multisets.

    Block lemma (k blocks chosen). Let t be the k-th best block extreme. The k chosen
    extremes are k values at least as good as t, so v is at least as good as t. A value
    better than t lies in the tail or in a block whose extreme is better than t; fewer than
    k blocks have one, and the top-k of the extremes chooses all of them. So the pool holds
    every value better than v (if v is better than t, every copy of v too), and at least k
    values at least as good as v (the k chosen extremes where v = t; otherwise the values
    better than t, of which there are at least k): top_k(pool) = top_k(blocks and tail).

    Floor lemma (later fragments). Every value of held is at least as good as floor, so v,
    the k-th best of held and frag, is at least as good as floor. A fragment value better
    than floor lies in the tail or in a block whose extreme beats floor; a row with at most q
    such blocks has all of them chosen (they rank before every block that does not beat
    floor, whatever the tie-break), so the pool holds held and every fragment value better
    than floor. If v is better than floor, that is every value at least as good as v (at
    least k of them); if v = floor, every value better than v and held's k values. A
    row with more than k such blocks (q = k) has the k best blocks chosen, and by the block
    lemma and the merge lemma of the module docstring, used twice, top_k(held u frag) =
    top_k(held u top_k(frag)) = top_k(held u chosen blocks u tail).

    So the buffers are the exact rule's: only the order of the buffered values, hence of
    their float64 sums, differs from the plain path, and the allowance covers any order.
    A NaN value breaks the total order: a block holding one ranks first by ``topk`` and
    never beats a floor, so the buffers can differ from the plain path's; the bounds do not,
    since the NaN makes its row's batch sum, hence both paths' bounds, NaN. (The buffers
    read directly, by `order_statistics`, hold nominal values, which training checks
    finite.)

    Args:
        frag: (rows, F) clamped values of one fragment (a view is fine).
        k: the buffer size, 1 <= k.
        largest: keep the k largest (else the k smallest).
        held: (rows, k) the buffer, or None for the first fragment (then F >= k).
        seen: values per row behind ``held``.

    Returns:
        A new (rows, m) tensor, m >= k, or None."""
    if not BLOCK_PREFILTER:
        return None
    rows, width = frag.shape
    bsize = _block_size(max(width, seen), k)
    n_blocks = width // bsize
    # a pool of more than a quarter of the blocks saves less than the block pass costs;
    # later fragments are judged first by the hits a random order would give (k F / seen,
    # with a margin for the most of any row), before any pass over the values
    expected = k if held is None else min(k, 1.25 * k * width / max(seen, 1))
    if bsize < 2 or n_blocks < 4 or expected * 4 > n_blocks:
        return None
    blocks = frag[:, :n_blocks * bsize].reshape(rows, n_blocks, bsize)
    extremes = blocks.amax(-1) if largest else blocks.amin(-1)
    if held is None:
        q = k
    else:
        floor = held.amin(-1, keepdim=True) if largest else held.amax(-1, keepdim=True)
        beats = extremes > floor if largest else extremes < floor
        q = min(k, int(beats.sum(-1).max()))
        if q * 4 > n_blocks:
            return None
    parts = [] if held is None else [held]
    if q:
        pick = extremes.topk(q, dim=-1, largest=largest, sorted=False).indices
        parts.append(blocks.gather(1, pick.unsqueeze(-1).expand(rows, q, bsize))
                     .reshape(rows, q * bsize))
    if n_blocks * bsize < width:
        parts.append(frag[:, n_blocks * bsize:])
    return torch.cat(parts, dim=1)


#: Row blocks of at least this many values are spread over torch's intra-op thread count:
#: numpy's sort and partition release the GIL but use one thread each.
PARALLEL_MIN_VALUES = 1 << 17
#: Bytes of factored bounds (`DescentAccumulator.add_outer`) kept before they are merged: the
#: more fragments one merge takes, the fewer times a buffer meets a selection.
DEFER_BYTES = 256 << 20
_pool: tuple[int, int, ThreadPoolExecutor] | None = None   # (pid, workers, executor)


def _by_row_ranges(fn, n_rows: int, n_values: int) -> None:
    """Call ``fn(r0, r1)`` on disjoint row ranges covering [0, n_rows), on
    ``torch.get_num_threads()`` threads when the rows hold at least PARALLEL_MIN_VALUES
    values in all (``fn`` must release the GIL to gain anything, and touch only its rows)."""
    global _pool
    workers = min(torch.get_num_threads(), n_rows)
    if workers <= 1 or n_values < PARALLEL_MIN_VALUES:
        fn(0, n_rows)
        return
    if _pool is None or _pool[:2] != (os.getpid(), workers):   # new after a fork, too
        _pool = (os.getpid(), workers, ThreadPoolExecutor(workers, thread_name_prefix="agt-select"))
    cuts = _spaced(n_rows, workers)
    list(_pool[2].map(lambda i: fn(int(cuts[i]), int(cuts[i + 1])), range(workers)))


def _by_rows(fn, a: np.ndarray) -> None:
    """Apply ``fn``, an in-place operation along the last axis, to ``a`` in blocks of its
    first axis on ``torch.get_num_threads()`` threads (disjoint blocks: no two threads touch
    one value)."""
    _by_row_ranges(lambda r0, r1: fn(a[r0:r1]), a.shape[0], a.size)


def kth_values(buffer: torch.Tensor, ks: Sequence[int], largest: bool) -> list[torch.Tensor]:
    """For every k of ``ks`` (1 <= k <= n): the k-th largest (smallest) entry of each row of
    ``buffer`` (..., n), a tensor of the buffer's shape without its last dim. On the CPU one
    selection at several ranks serves every k."""
    n = buffer.shape[-1]
    if not _numpy_ok(buffer):
        srt = buffer.sort(dim=-1, descending=largest).values
        return [srt[..., k - 1] for k in ks]
    rank = {k: (n - k if largest else k - 1) for k in ks}
    part = np.partition(buffer.numpy(), sorted(set(rank.values())), axis=-1)
    return [torch.from_numpy(np.ascontiguousarray(part[..., rank[k]])) for k in ks]


def _sorted_rows(x: torch.Tensor, descending: bool) -> torch.Tensor:
    """Rows of x sorted (numpy's SIMD sort on the CPU): a canonical order for prefix sums."""
    if not _numpy_ok(x):
        return x.sort(dim=-1, descending=descending).values
    srt = np.sort(x.numpy(), axis=-1)
    # copy(), not ascontiguousarray(): a reversed view of width 1 counts as contiguous and
    # keeps its negative stride, which torch refuses
    return torch.from_numpy(srt[..., ::-1].copy() if descending else srt)


class DescentAccumulator:
    """Running sums and selection buffers of clamped per-sample gradient bounds of one
    parameter (flattened to P entries) for G parameter boxes at once.

    Per box g and parameter: ``sum_lo``/``sum_hi``, the float64 sums of all clamped lower /
    upper bounds; ``top_lo[g]``, the k_g largest clamped lower bounds; ``low_hi[g]``, the k_g
    smallest clamped upper bounds (the k largest of -g^U of Thm 4.6, without a negation pass:
    the bound uses their sum, and negation commutes exactly with sums and the symmetric
    clamp). ``k_max``: the buffer size, one int for every box or one per box (a box's buffer
    holds its own k; a box shared by several k, the largest).

    Values arrive as sound bounds in the compute dtype (float32 for float32 training: the
    bound passes round outward when they cast), so buffering them loses nothing. `bounds`
    equals the naive rule (sort each parameter's b values) up to float64 summation order, for
    which it adds the a-priori allowance (module docstring)."""

    def __init__(self, n_groups: int, n_params: int, k_max: int | Sequence[int], gamma: float,
                 device: torch.device, dtype: torch.dtype = BOUND_DTYPE):
        sizes = [int(k_max)] * n_groups if isinstance(k_max, int) else [int(k) for k in k_max]
        if len(sizes) != n_groups or min(sizes, default=0) < 0:
            raise SoundnessError(f"internal: {n_groups} boxes need one buffer size >= 0 each, "
                                 f"got {sizes}")
        self.gamma = float(gamma)
        self.k_sizes = sizes
        self.k_max = max(sizes, default=0)
        self.dtype = dtype
        self.count = 0
        self.sum_lo = torch.zeros(n_groups, n_params, dtype=BOUND_DTYPE, device=device)
        self.sum_hi = torch.zeros_like(self.sum_lo)
        # +-inf fill: slots not yet holding a value never win a selection
        self.top_lo = [torch.full((n_params, k), -float("inf"), dtype=dtype, device=device)
                       if k else None for k in sizes]
        self.low_hi = [torch.full((n_params, k), float("inf"), dtype=dtype, device=device)
                       if k else None for k in sizes]
        self._scratch: torch.Tensor | None = None
        # rows of the first fragment already added (None once samples_seen was called)
        self._first_rows: torch.Tensor | None = torch.zeros(n_params, dtype=torch.bool)
        self._pending: list = []            # OuterBounds not merged yet (add_outer)
        self._pending_bytes = 0

    def takes_outer(self, outer) -> bool:
        """Whether `add_outer` takes these factored bounds (`agt.bounded.layers.OuterBounds`,
        every row of this parameter): their dtype is the buffers', and a factored merge runs
        here (`_factored_merge`). Otherwise the caller adds `OuterBounds.values` by rows."""
        groups = (1, self.sum_lo.shape[0])
        return (outer.a.dtype == self.dtype and outer.d_lo.dtype == self.dtype
                and (outer.exact or (outer.a_hi.dtype == self.dtype and outer.a.dim() == 3
                                     and outer.a.shape[0] in groups))
                and outer.in_features * outer.d_lo.shape[1] == self.sum_lo.shape[1]
                and outer.d_lo.shape[0] in groups and outer.a.device == self.sum_lo.device
                and self._factored_merge(outer.a) is not None)

    def _factored_merge(self, values: torch.Tensor) -> str | None:
        """Which merge takes factored bounds on ``values``' device: "torch"
        (`agt.topk_torch`) off the CPU, and on the CPU under FACTORED_TORCH_ON_CPU; else
        "compiled" (`agt.topk_kernel`) where it runs; else None (the caller materialises)."""
        if FACTORED_OFF or values.dtype not in _FUSED_DTYPES:
            return None
        if values.device.type != "cpu" or FACTORED_TORCH_ON_CPU:
            return "torch"
        return "compiled" if self._fused(values) else None

    def add_outer(self, outer) -> None:
        """Add one fragment's per-sample weight bounds of a linear layer, given as factors
        (`agt.bounded.layers.OuterBounds`, all rows; `takes_outer` must hold), then call
        `samples_seen` as after `add`.

        The factors are kept until `flush` (at the latest when the bounds are read, or
        when they hold DEFER_BYTES): one compiled merge then computes each row's bounds
        of all kept fragments where it uses them (agt/topk_kernel.merge_outer) and merges
        them in one pass. The same multisets as adding `OuterBounds.values` fragment by
        fragment (the merge lemma in any grouping), no per-sample bound in memory, and a
        buffer's k values meet a selection once per flush instead of once per fragment."""
        if self._first_rows is not None:
            if bool(self._first_rows.any()):
                raise SoundnessError("internal: rows added twice before samples_seen")
            self._first_rows[:] = True
        if self._pending and self._pending[0].exact != outer.exact:
            self.flush()                 # one merge takes fragments of one kind
        self._pending.append(outer)
        self._pending_bytes += sum(t.numel() * t.element_size()
                                   for t in (outer.d_lo, outer.d_hi, outer.a, outer.a_hi)
                                   if t is not None)
        if self._pending_bytes >= DEFER_BYTES:
            self.flush()

    def flush(self) -> None:
        """Merge the factored bounds kept by `add_outer` (nothing to do if none are kept)."""
        if not self._pending:
            return
        G = self.sum_lo.shape[0]
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if self._factored_merge(pending[0].a) != "compiled":   # the torch merge runs anywhere
            self._flush_torch(pending)
            return
        from agt import topk_kernel
        exact = pending[0].exact
        d_lo = torch.cat([o.d_lo.expand(G, -1, -1) for o in pending], -1)
        d_hi = torch.cat([o.d_hi.expand(G, -1, -1) for o in pending], -1)
        if exact:
            a_lo, a_hi = torch.cat([o.a for o in pending], -1)[None], None   # (1, in, n)
        else:
            shared = all(o.a.shape[0] == 1 for o in pending)
            a_lo = torch.cat([o.a if shared else o.a.expand(G, -1, -1) for o in pending], -1)
            a_hi = torch.cat([o.a_hi if shared else o.a_hi.expand(G, -1, -1)
                              for o in pending], -1)
        in_f, n = a_lo.shape[-2:]
        for g, k in enumerate(self.k_sizes):
            lo = np.ascontiguousarray(d_lo[g].numpy())
            hi = np.ascontiguousarray(d_hi[g].numpy())
            ga = g if a_lo.shape[0] > 1 else 0
            x_lo = np.ascontiguousarray(a_lo[ga].numpy())
            x_hi = None if a_hi is None else np.ascontiguousarray(a_hi[ga].numpy())
            bufs = (self.top_lo[g].numpy(), self.low_hi[g].numpy()) if k else (None, None)
            s_lo, s_hi = self.sum_lo[g].numpy(), self.sum_hi[g].numpy()
            _by_row_ranges(lambda i0, i1: topk_kernel.merge_outer(
                lo, hi, x_lo, x_hi, (i0, i1), bufs[0], bufs[1], s_lo, s_hi, self.gamma),
                in_f, self.sum_lo.shape[1] * n)

    def _flush_torch(self, pending: list) -> None:
        """`flush` by the torch merge (`agt.topk_torch.merge_outer`): the kept fragments'
        factors joined along the samples, merged block by block on their device (blocks of
        at most `agt.memory.FACTORED_BLOCK_ELEMENTS` values per box)."""
        from agt import memory, topk_torch
        from agt.bounded.layers import OuterBounds
        G = self.sum_lo.shape[0]
        d_groups = max(int(o.d_lo.shape[0]) for o in pending)
        d_lo = torch.cat([o.d_lo.expand(d_groups, -1, -1) for o in pending], -1)
        d_hi = torch.cat([o.d_hi.expand(d_groups, -1, -1) for o in pending], -1)
        if pending[0].exact:
            joined = OuterBounds(d_lo, d_hi, torch.cat([o.a for o in pending], -1))
        else:
            a_groups = max(int(o.a.shape[0]) for o in pending)
            joined = OuterBounds(d_lo, d_hi,
                                 torch.cat([o.a.expand(a_groups, -1, -1) for o in pending], -1),
                                 torch.cat([o.a_hi.expand(a_groups, -1, -1) for o in pending],
                                           -1))
        if d_groups not in (1, G):
            raise SoundnessError(f"internal: factors of {d_groups} boxes for {G} buffers")
        topk_torch.merge_outer(joined, self.top_lo, self.low_hi, self.sum_lo, self.sum_hi,
                               self.gamma, memory.FACTORED_BLOCK_ELEMENTS)

    def add(self, start: int, stop: int, grads: Interval) -> None:
        """grads: Interval (G or 1, stop - start, f) of per-sample gradient bounds of the
        parameter entries [start, stop) for f samples (samples last); clamped here. Each
        fragment adds every row once, then calls `samples_seen`."""
        # the merges below read self.count as the number of values merged into the buffers
        self.flush()
        if grads.lo.dtype != self.dtype or grads.hi.dtype != self.dtype:
            # wider values would be rounded into the buffers (unsound); narrower ones would be
            # clamped in another dtype than the one whose clamp limit `bounds` assumes
            raise SoundnessError(f"internal: {grads.lo.dtype} bounds for {self.dtype} "
                                 "selection buffers (they would be rounded or clamped apart)")
        if self._first_rows is not None:
            # the first-fragment shortcut of _merge overwrites the buffer rows: a second add
            # of the same rows before samples_seen would drop the first one's values
            if bool(self._first_rows[start:stop].any()):
                raise SoundnessError(f"internal: rows [{start}, {stop}) added twice before "
                                     "samples_seen")
            self._first_rows[start:stop] = True
        shared = grads.lo.shape[0] == 1
        f = grads.lo.shape[-1]
        if (not shared and self.count == 0 and f <= SORT_ROWS_UP_TO
                and max(self.k_sizes, default=0) <= f):
            self._add_first_short(start, stop, grads)
            return
        for g, k in enumerate(self.k_sizes):
            src = 0 if shared else g
            for values, sums, buffers, largest in (
                    (grads.lo[src], self.sum_lo, self.top_lo, True),
                    (grads.hi[src], self.sum_hi, self.low_hi, False)):
                if self._fused(values):
                    self._merge_fused(values, sums[g, start:stop],
                                      buffers[g][start:stop] if k else None, largest)
                    continue
                # workspace [buffer | fragment]: the clamp writes the fragment in place, the sum
                # reads it there, the merge selects over the whole row
                ws = self._workspace(values.shape[0], k + values.shape[1], values.device)
                frag = ws[:, k:]
                torch.clamp(values, -self.gamma, self.gamma, out=frag)
                sums[g, start:stop] += blocked_sum(frag)
                if k:
                    self._merge(ws, buffers[g], start, stop, k, largest)

    @staticmethod
    def _fused(values: torch.Tensor) -> bool:
        """Whether the compiled single-pass kernel (agt.topk_kernel) takes this merge."""
        if not (FUSED_ON_CPU and _numpy_ok(values) and values.dtype in _FUSED_DTYPES):
            return False
        from agt import topk_kernel  # numba loads on the first CPU merge, not on import
        return topk_kernel.available()

    def _merge_fused(self, values: torch.Tensor, sums: torch.Tensor,
                     buffer: torch.Tensor | None, largest: bool) -> None:
        """Clamp, batch sum and merge of one fragment in one pass per row (agt.topk_kernel:
        the same multisets as `_merge`, float64 sums in a fixed order; a box of k = 0, no
        buffer: the sums only), rows spread over torch's thread count."""
        from agt import topk_kernel
        vals = np.ascontiguousarray(values.numpy())
        buf = None if buffer is None else buffer.numpy()
        out = sums.numpy()
        _by_row_ranges(lambda r0, r1: topk_kernel.merge_fragment(
            vals[r0:r1], None if buf is None else buf[r0:r1], out[r0:r1], self.gamma,
            largest), vals.shape[0], vals.size)

    def _add_first_short(self, start: int, stop: int, grads: Interval) -> None:
        """`add` for the first fragment of short rows (f <= SORT_ROWS_UP_TO values, at least
        every box's k): all boxes clamped, summed and sorted at once, each buffer then takes
        its box's k best entries of the sorted rows. The same multisets as the per-box
        merge (sorting only moves values), without a Python round per box."""
        for values, sums, buffers, largest in ((grads.lo, self.sum_lo, self.top_lo, True),
                                               (grads.hi, self.sum_hi, self.low_hi, False)):
            frag = values.clamp(-self.gamma, self.gamma)                 # (G, rows, f)
            sums[:, start:stop] += blocked_sum(frag)
            srt = frag.sort(dim=-1).values
            f = srt.shape[-1]
            for g, k in enumerate(self.k_sizes):
                if k:
                    buffers[g][start:stop] = srt[g, :, f - k:] if largest else srt[g, :, :k]

    def _workspace(self, rows: int, width: int, device: torch.device) -> torch.Tensor:
        """A (rows, width) scratch tensor, reused across calls (a fresh allocation of this
        size costs page faults every time)."""
        need = rows * width
        if self._scratch is None or self._scratch.numel() < need or self._scratch.device != device:
            self._scratch = torch.empty(need, dtype=self.dtype, device=device)
        return self._scratch[:need].view(rows, width)

    def _merge(self, ws: torch.Tensor, buffer: torch.Tensor, start: int, stop: int, k: int,
               largest: bool) -> None:
        """buffer[start:stop] <- the k largest (smallest) of buffer[start:stop] and the
        fragment ws[:, k:] (merge lemma, module docstring)."""
        frag = ws[:, k:]
        if self.count == 0 and frag.shape[1] >= k:
            pool = block_pool(frag, k, largest)       # first fragment: nothing buffered yet
            kept = select(frag if pool is None else pool, k, largest)
        else:
            held = buffer[start:stop]
            # a buffer still holding fill (fewer than k values seen) takes the plain path
            pool = block_pool(frag, k, largest, held, self.count) if self.count >= k else None
            if pool is None:
                ws[:, :k] = held
                pool = ws
            kept = select(pool, k, largest)
        buffer[start:stop] = kept

    def samples_seen(self, n: int) -> None:
        self.count += n
        if self.count:
            self._first_rows = None

    def bounds(self, k: torch.Tensor, fm: FloatModel,
               group: torch.Tensor | None = None) -> Interval:
        """Descent-direction bounds for distances ``k`` (int tensor (M,)), each computed from
        group ``group[m]`` of this accumulator (default: group m). Returns Interval (M, P)."""
        self.flush()
        b = self.count
        device = self.sum_lo.device
        if group is None:
            group = torch.arange(k.shape[0])
        k = k.to(device)
        group = group.to(device)
        sizes = torch.tensor(self.k_sizes, dtype=k.dtype, device=device)
        # a k beyond its buffer is fine where the buffer holds every value seen (k >= b:
        # all of them are selected)
        if bool(((k > sizes[group]) & (sizes[group] < b)).any()):
            raise SoundnessError(f"internal: distances {k.tolist()} exceed the selection "
                                 f"buffers {self.k_sizes} of their boxes")
        sum_lo = self.sum_lo[group]
        sum_hi = self.sum_hi[group]
        kf = k.to(BOUND_DTYPE)[:, None]
        top_lo = self._selected_sums(self.top_lo, k, group, largest=True)
        low_hi = self._selected_sums(self.low_hi, k, group, largest=False)
        gam = clamp_limit(self.gamma, fm.nominal_dtype, self.dtype)
        lower = (sum_lo - top_lo - kf * gam) / b
        upper = (sum_hi - low_hi + kf * gam) / b
        # w_k also bounds how far each computed bound lies from its real-number value, so the
        # extra 2 k w_k makes the *computed* boxes nest as the real ones do: D' at k - 1 is
        # at most 2 w_k looser than D at k before it, and 2 w_k tighter after (module
        # docstring); w_k covers every batch size within distance k, so D' (add-remove: one
        # record more or fewer) never carries a larger allowance at k - 1 than D at k
        w = nesting_allowance(b, k, gam, fm).to(device)[:, None]
        widen = w * (1.0 + 2.0 * kf)
        return Interval((lower - widen).clamp_min(-gam), (upper + widen).clamp_max(gam))

    def _selected_sums(self, buffers: list, k: torch.Tensor, group: torch.Tensor,
                       largest: bool) -> torch.Tensor:
        """Sum of the k[m] largest (smallest) buffered values of group[m], per parameter, in
        float64: (M, P)."""
        out = torch.zeros(k.shape[0], self.sum_lo.shape[1], dtype=BOUND_DTYPE,
                          device=self.sum_lo.device)
        # members of each group, from Python lists: one pass instead of a tensor comparison
        # per group (many small boxes made those the cost)
        k_list = k.tolist()
        members_of: dict[int, list[int]] = {}
        for m, g in enumerate(group.tolist()):
            members_of.setdefault(g, []).append(m)
        for g, member_list in sorted(members_of.items()):
            buffer = buffers[g]
            if buffer is None or max(k_list[m] for m in member_list) <= 0:
                continue
            kb = buffer.shape[1]
            full = all(k_list[m] >= kb for m in member_list)
            members = torch.tensor(member_list, dtype=torch.int64, device=k.device)
            ks = k[members]
            idx = (ks - 1).clamp(0, kb - 1)   # k > kb only where the buffer holds every value
            unfilled = self.count < kb     # some slots may still hold the +-inf fill
            chunk = max(1, (1 << 21) // kb)
            for p0 in range(0, buffer.shape[0], chunk):
                part = buffer[p0:p0 + chunk]
                if full:
                    if unfilled:   # k >= b: the sum runs over all b values, fill counts 0
                        part = torch.where(torch.isinf(part), torch.zeros_like(part), part)
                    out[members, p0:p0 + chunk] = part.to(BOUND_DTYPE).sum(-1)
                    continue
                # one sorted buffer, prefix sums for every k of the box. Sort first, then
                # zero the fill: the fill (-inf for the largest, +inf for the smallest) sorts
                # behind every value, so the first min(k, b) entries are the k best values
                # and the rest add 0. Zeroing before sorting would move the zeros in front of
                # negative (positive) values and loosen the bound for k < b < k_max.
                srt = _sorted_rows(part, descending=largest)
                if unfilled:
                    srt = torch.where(torch.isinf(srt), torch.zeros_like(srt), srt)
                csum = torch.cumsum(srt.to(BOUND_DTYPE), dim=-1)
                picked = csum[:, idx].T                                     # (m, p)
                out[members, p0:p0 + chunk] = torch.where((ks > 0)[:, None], picked,
                                                          torch.zeros_like(picked))
        return out


class ThresholdAccumulator:
    """The descent bound of Thm 4.6 through its variational form, without selections.

    For any threshold tau (Ogryczak-Tamir; sum of the k largest = min over tau of
    k tau + sum_i (g_i - tau)_+):

        sum of the smallest (b - k) of g  >=  sum_i min(g_i, tau)  - k tau
        sum of the largest  (b - k) of g  <=  sum_i max(g_i, tau') - k tau'

    with equality when tau (tau') is the k-th largest (smallest) value. Soundness holds for
    every tau, so the thresholds can come from a cheap source: the order statistics of the
    *nominal* clamped per-sample gradients (which lie inside every box's gradient bounds),
    giving bounds that are exact at zero-width boxes and nearly exact for the narrow boxes
    where certification succeeds. Cost: one clamp and one sum per bound and element,
    no top-k buffers.

    ``tau_lo``/``tau_hi``: (M, P) thresholds, ``k``: (M,) distances; grads of (M or 1) boxes.
    """

    def __init__(self, k: torch.Tensor, tau_lo: torch.Tensor, tau_hi: torch.Tensor, gamma: float):
        self.gamma = float(gamma)
        self.k = k
        self.count = 0
        self.tau_lo = tau_lo.clamp(-self.gamma, self.gamma)
        self.tau_hi = tau_hi.clamp(-self.gamma, self.gamma)
        self.sum_lo = torch.zeros(tau_lo.shape, dtype=BOUND_DTYPE, device=tau_lo.device)
        self.sum_hi = torch.zeros_like(self.sum_lo)
        self.k_max = int(k.max()) if k.numel() else 0
        self.value_dtype = BOUND_DTYPE

    def takes_outer(self, outer) -> bool:
        """Never: factored bounds reach this rule as `OuterBounds.values`."""
        return False

    def add(self, start: int, stop: int, grads: Interval) -> None:
        dtype = self.value_dtype = grads.lo.dtype
        t_lo = self.tau_lo[:, start:stop, None].to(dtype)
        t_hi = self.tau_hi[:, start:stop, None].to(dtype)
        lo = torch.clamp(grads.lo, min=torch.full_like(t_lo, -self.gamma), max=t_lo)
        hi = torch.clamp(grads.hi, min=t_hi, max=torch.full_like(t_hi, self.gamma))
        self.sum_lo[:, start:stop] += blocked_sum(lo)
        self.sum_hi[:, start:stop] += blocked_sum(hi)

    def samples_seen(self, n: int) -> None:
        self.count += n

    def bounds(self, fm: FloatModel) -> Interval:
        b = self.count
        kf = self.k.to(BOUND_DTYPE)[:, None].to(self.sum_lo.device)
        # tau was cast to the compute dtype for the clamp: use that value here too
        t_lo = self.tau_lo.to(fm.nominal_dtype).to(BOUND_DTYPE)
        t_hi = self.tau_hi.to(fm.nominal_dtype).to(BOUND_DTYPE)
        gam = clamp_limit(self.gamma, fm.nominal_dtype, self.value_dtype)
        lower = (self.sum_lo - kf * t_lo - kf * gam) / b
        upper = (self.sum_hi - kf * t_hi + kf * gam) / b
        w = rounding_allowance(b, b + 2 * self.k_max + 8, gam, fm)
        return Interval((lower - w).clamp_min(-gam), (upper + w).clamp_max(gam))


def order_statistics(acc: DescentAccumulator, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From an accumulator fed with point values g: per k, the k-th largest (tau_lo) and the
    k-th smallest (tau_hi) value per parameter; +gamma / -gamma for k = 0 (no threshold)."""
    acc.flush()
    device = acc.sum_lo.device
    P = acc.sum_lo.shape[1]
    k = k.to(device)
    tau_lo = torch.full((k.shape[0], P), acc.gamma, dtype=BOUND_DTYPE, device=device)
    tau_hi = torch.full_like(tau_lo, -acc.gamma)
    if acc.k_max == 0:
        return tau_lo, tau_hi
    ks = k.tolist()
    positive = [m for m, kk in enumerate(ks) if kk > 0]
    for buf, out, largest in ((acc.top_lo[0], tau_lo, True), (acc.low_hi[0], tau_hi, False)):
        cols = kth_values(buf, [ks[m] for m in positive], largest)
        for m, col in zip(positive, cols):
            col = col.to(device=device, dtype=BOUND_DTYPE)
            # fewer than k samples seen (infinite fill): every value is beyond tau
            fill = -acc.gamma if largest else acc.gamma
            out[m] = torch.where(torch.isinf(col), torch.full_like(col, fill), col)
    return tau_lo, tau_hi
