"""A compiled CPU kernel of the exact rule's merge: clamp, batch sum and streaming top-k of
one fragment in a single pass over its values (numba, no C sources in the repository),
reading the values or computing them from a linear layer's factors.

The plain CPU path (agt/topk.py) clamps a fragment into a workspace, sums it, and runs an
introselect over ``buffer | fragment`` for every row: every value is selected, at whatever
a machine's selection costs per value (5-8 ns on some x86 machines without a SIMD sort).
This kernel reads each value once in a vectorised scan (a block of values holding a
candidate twice): it clamps it, adds it to the row's float64 sum and compares it with the
buffer's worst value (the floor). Only a value better than the floor is appended to a
candidate area; when that area fills, a selection keeps the k best of
buffer and candidates and raises the floor. In a random order the floor passes the k-th
best of the values seen so early that about k (1 + ln(n / k)) of a row's n values are
ever appended, so for k much smaller than n almost all the work is the one pass; for k
near a tenth of n nearly every value still meets a selection (the buffer's k values take
part in each), and the selection decides the cost.

Exactness (the same multisets as the plain path). Every value is either appended or not
better than the floor at its arrival. The floor is always the worst of k values of the
input (the buffer's, or after a selection the k kept ones), so a value not appended has
at least k input values at least as good as itself: dropping it does not change the
multiset of the k best (the floor lemma of `agt.topk.block_pool`, with ties
interchangeable in a sum). A selection keeps the k best of buffer and candidates (the merge
lemma of agt/topk.py). Hence the buffer ends with the k best of ``buffer | fragment``, as
multisets, and the bounds are the exact rule's. The selection below moves values and
writes back copies of the pivot for the values equal to it: equal values are the same
number, so the multiset's sums do not change (+0.0 and -0.0 compare equal and add the same
to any non-zero sum; a sum of only zeros is zero either way).

Fill. The buffer's +-inf fill (slots that never held a value; a clamped value is finite)
is not loaded: until k values are held the floor is -inf and every value is appended, and
a row that saw fewer than k values in all is filled back. Dropping the fill changes no
multiset of k best values (it loses to every value) and spares a selection over it.

Factored bounds (`merge_outer`). The per-sample weight bounds of a linear layer are
computed here from their factors, by the formulas of `agt.bounded.layers.OuterBounds.values`
in the same dtype (an exact input: one rounded product per bound, whichever order the two
terms are added in; an interval input: the least and greatest of the four rounded corner
products, NaN propagated as torch.minimum and torch.maximum do), one row at a time into a
scratch row that the merge above then reads: the same values, hence the same multisets, as
merging the materialised bounds, without writing them to memory.

The batch sum is a float64 sum of the clamped values: each block of SCAN values is summed in
an order the compiler picks (reassociated to vectorise it, fixed in the compiled kernel,
so every call adds alike), the block sums in row order. Any order is inside the allowance
of `agt.topk.rounding_allowance`, like the plain path's blocked sums; the compiler's
licence is reassociation only, so NaN and infinities keep their IEEE meaning.
The smallest values are selected as the largest of the negated values: negation is exact
and commutes with rounding and with the symmetric clamp, so the sum and the buffer are
negated back exactly. NaN: never appended (it beats no floor), but it enters the row's sum,
so the row's bounds are NaN on either path, as with the prefilter.
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:            # pragma: no cover - numba is optional (the `fast` extra);
    numba = None               # without it agt/topk.py keeps its plain path

#: Ranges of at least SAMPLE_FROM values take two pivots from a sorted sample of SAMPLE values
#: (SAMPLE_LARGE from LARGE_FROM values on), BAND (BAND_LARGE) sample ranks either side of the
#: rank of the k-th largest: about one standard deviation of that rank (a miss costs a
#: round over the side that holds it, a wider band a longer next round).
SAMPLE = 15
SAMPLE_FROM = 128
SAMPLE_LARGE = 31
LARGE_FROM = 1024
BAND = 2
BAND_LARGE = 3
#: Values per block of the scan: one vector loop clamps, sums and tests a block against the
#: floor; only a block with a candidate is read again value by value.
SCAN = 64
#: Candidate room per row beyond the buffer's k values: a selection runs whenever it fills.
MIN_ROOM = 64


def available() -> bool:
    """Whether the compiled kernel can run here (numba importable)."""
    return numba is not None


def candidate_room(k: int) -> int:
    """Candidates appended between two selections: at least MIN_ROOM, and 2k (replayed on
    rows of the IMDB-like benchmark, fragments of 2,000: 13% fewer values selected than
    with k at k = 1000, merges 5-15% faster at k = 100 and 1000; a larger room keeps a
    stale floor longer)."""
    return max(MIN_ROOM, 2 * k)


if numba is not None:
    _jit = numba.njit(nogil=True, cache=True)

    @_jit
    def _xorshift(state):
        state ^= state << np.uint32(13)
        state ^= state >> np.uint32(17)
        return state ^ (state << np.uint32(5))

    @_jit
    def _median3(a, b, c):
        if a > b:
            if b > c:
                return b
            return c if a > c else a
        if a > c:
            return a
        return c if b > c else b

    @_jit
    def _sorted_sample(w, lo, m, out, size, state):   # pragma: no cover - compiled
        """out[:size] <- values of w[lo:lo + m] at xorshift positions, largest first."""
        for t in range(size):
            state = _xorshift(state)
            x = w[lo + np.int64(state % np.uint32(m))]
            j = t - 1
            while j >= 0 and out[j] < x:
                out[j + 1] = out[j]
                j -= 1
            out[j + 1] = x
        return state

    @_jit
    def select_largest(w, band, rest, n, k):   # pragma: no cover - compiled
        """Reorder w[:n] so that w[:k] holds its k largest values (a multiset; values equal
        to a pivot may come back as copies of it), 0 < k <= n; w[k:n + 1] is left as
        scratch. w needs one spare slot (n + 1 values: the branch-free compaction writes
        one value past the range it fills); ``band`` and ``rest`` are scratch of n values.

        Invariant: w[:lo] holds values of the k largest, w[lo:hi] the values still in
        question, of which the ``need`` largest complete them. Each round is one
        branch-free pass over w[lo:hi] (every value is written to each output, and only the
        output it belongs to advances; the values above the upper pivot move forward in
        place, each written at or before its own position).

        * Band round (long ranges): two pivots from a sorted sample, a few sample ranks
          either side of the rank of the need-th largest: the values above the upper pivot
          are in, those below the lower are out, the band between goes on; where the
          need-th largest falls outside the band (a sampling miss) the search goes on in
          the side that holds it.
        * Three-way round (short ranges, or a band round that split nothing): one pivot,
          a median of three; values equal to it are counted and, where the need-th largest
          is among them, written as copies of it.

        Positions come from a xorshift generator seeded by n: deterministic."""
        if w.shape[0] <= n or band.shape[0] < n or rest.shape[0] < n or not 0 < k <= n:
            raise ValueError("select_largest: needs 0 < k <= n, n + 1 slots in w, n in the "
                             "scratch arrays")
        lo = 0
        hi = n
        need = k
        state = np.uint32((n * 2654435761) & 0xFFFFFFFF) | np.uint32(1)
        rounds = 0
        stuck = False
        while 0 < need < hi - lo:
            m = hi - lo
            rounds += 1
            if m <= 16 or rounds > 64:
                # short ranges (and, never seen, a run of bad pivots): insertion sort,
                # largest first, in place (an allocation costs more than 16 values' sort)
                for i in range(lo + 1, hi):
                    x = w[i]
                    j = i - 1
                    while j >= lo and w[j] < x:
                        w[j + 1] = w[j]
                        j -= 1
                    w[j + 1] = x
                return
            if m >= SAMPLE_FROM and not stuck:
                size = SAMPLE_LARGE if m >= LARGE_FROM else SAMPLE
                width = BAND_LARGE if m >= LARGE_FROM else BAND
                state = _sorted_sample(w, lo, m, band, size, state)
                t = (need * (size + 1)) // m - 1           # sample rank of the need-th
                upper = band[t - width] if t - width >= 0 else np.inf
                lower = band[t + width] if t + width < size else -np.inf
                n_in = 0
                n_band = 0
                n_out = 0
                for i in range(lo, hi):
                    x = w[i]
                    is_in = x > upper
                    is_out = x < lower
                    w[lo + n_in] = x
                    band[n_band] = x
                    rest[n_out] = x
                    n_in += is_in
                    n_out += is_out
                    n_band += 1 - is_in - is_out
                if n_in == 0 and n_out == 0:
                    # the band is the whole range (the pass wrote over w[lo]): put it back,
                    # and split it with a three-way round
                    for i in range(m):
                        w[lo + i] = band[i]
                    stuck = True
                    continue
                stuck = False
                if need <= n_in:
                    hi = lo + n_in
                    continue
                lo += n_in
                need -= n_in
                for i in range(n_band):
                    w[lo + i] = band[i]
                if need <= n_band:
                    hi = lo + n_band
                    continue
                lo += n_band
                need -= n_band
                for i in range(n_out):
                    w[lo + i] = rest[i]
                hi = lo + n_out
                continue
            stuck = False
            state = _xorshift(state)
            a = w[lo + np.int64(state % np.uint32(m))]
            state = _xorshift(state)
            b = w[lo + np.int64(state % np.uint32(m))]
            state = _xorshift(state)
            p = _median3(a, b, w[lo + np.int64(state % np.uint32(m))])
            n_better = 0
            n_rest = 0
            n_worse = 0
            for i in range(lo, hi):
                x = w[i]
                is_better = x > p
                w[lo + n_better] = x
                rest[n_rest] = x
                n_better += is_better
                n_rest += 1 - is_better
                n_worse += x < p
            if need <= n_better:
                hi = lo + n_better
                continue
            lo += n_better
            need -= n_better
            n_equal = n_rest - n_worse
            fill = min(need, n_equal)
            for i in range(lo, lo + fill):
                w[i] = p
            if need <= n_equal:
                return
            lo += n_equal
            need -= n_equal
            d = 0
            for i in range(n_rest):
                x = rest[i]
                w[lo + d] = x
                d += x < p
            hi = lo + d

    # merge_rows' sums may be reassociated (vectorised): any order is inside the allowance,
    # and the order a compiled kernel picks is the same on every call; no other flag (NaN
    # and infinities keep their IEEE meaning)
    _scan_jit = numba.njit(nogil=True, cache=True, fastmath={"reassoc"})

    @_jit
    def _offer(w, better, rest, row, j0, j1, limit, negate, floor, m, k, room):   # pragma: no cover
        """Append the values of row[j0:j1], clamped to [-limit, limit] (and negated where
        ``negate``), that beat the floor to the candidates w[:m], selecting whenever the
        room is full; while fewer than k values are held (floor -inf) every value is
        appended, and the floor is set when the k-th arrives. Returns (m, floor)."""
        full = k + room
        edge = k if m < k else full       # the count at which the floor is set next
        for j in range(j0, j1):
            v = row[j]
            v = limit if v > limit else v
            v = -limit if v < -limit else v
            x = -v if negate else v
            # branch-free append: w[m] is a free slot (at most full - 1 values are held
            # here), and whether a value beats the floor is a coin toss for a branch
            # predictor where k is a tenth of the row (replayed rows of the IMDB-like
            # benchmark: merges 1.2-1.3x faster at k = 100 and 1000)
            w[m] = x
            m += x > floor
            if m == edge:
                if edge == full:
                    select_largest(w, better, rest, m, k)
                    m = k
                floor = _smallest(w, k)
                edge = full
        return m, floor

    @_jit
    def _smallest(w, k):   # pragma: no cover - compiled
        floor = w[0]
        for i in range(1, k):
            floor = w[i] if w[i] < floor else floor
        return floor

    @_scan_jit
    def _merge_row(row, held, w, better, rest, limit, negate, room, top):   # pragma: no cover
        """Clamp ``row`` to [-limit, limit], replace ``held`` (k values) by the k best of
        ``held`` and the clamped row (best: largest of -value where ``negate``; ``held``
        holds values, not negated ones) and return the row's float64 sum. ``top``: +inf
        in the values' dtype; w needs k + room + 1 slots, better and rest k + room.

        The held values that are fill (-inf in the negated-or-not order: a slot that never
        held a value; a clamped value is finite) are not loaded: they would lose every
        selection. Until k values are held the floor is -inf (everything is appended);
        the buffer is filled back to k with the fill if fewer were seen in all.

        The row is read in blocks of SCAN values: a vectorised loop clamps them, sums them
        and tells whether one beats the floor; only such a block (and the tail) is read
        again, value by value, to append its candidates."""
        f = row.shape[0]
        k = held.shape[0]
        m = 0
        for j in range(k):
            x = -held[j] if negate else held[j]
            if x > -top:
                w[m] = x
                m += 1
        if k == 0:
            floor = top                 # nothing is ever offered: the sums only
        elif m == k:
            floor = _smallest(w, k)
        else:
            floor = -top
        main = f - f % SCAN
        total = 0.0
        # (the block loop runs to main, the tail apart: a loop to f with a test for the
        # tail inside measured 5x slower, no longer vectorised)
        for j0 in range(0, main, SCAN):
            part = 0.0
            hit = False
            for j in range(j0, j0 + SCAN):
                v = row[j]
                v = limit if v > limit else v
                v = -limit if v < -limit else v
                part += v
                hit |= (-v if negate else v) > floor
            total += part
            if hit:
                m, floor = _offer(w, better, rest, row, j0, j0 + SCAN, limit, negate,
                                  floor, m, k, room)
        for j in range(main, f):
            v = row[j]
            v = limit if v > limit else v
            v = -limit if v < -limit else v
            total += v
        m, floor = _offer(w, better, rest, row, main, f, limit, negate, floor, m, k, room)
        if m > k:
            select_largest(w, better, rest, m, k)
        for j in range(m, k):
            w[j] = -top
        for j in range(k):
            held[j] = -w[j] if negate else w[j]
        return total

    @_jit
    def merge_rows(vals, buf, sums, limit, negate, room, top):   # pragma: no cover - compiled
        """For every row r: clamp vals[r] to [-limit, limit], add its float64 sum to sums[r]
        and replace buf[r] by the k best of buf[r] and the clamped vals[r] (`_merge_row`;
        k = 0: the sums only)."""
        k = buf.shape[1]
        w = np.empty(k + room + 1, dtype=vals.dtype)     # + 1: select_largest's spare slot
        better = np.empty(k + room, dtype=vals.dtype)
        rest = np.empty(k + room, dtype=vals.dtype)
        for r in range(vals.shape[0]):
            sums[r] += _merge_row(vals[r], buf[r], w, better, rest, limit, negate, room, top)

    @_jit
    def _lower(x, y):   # pragma: no cover - compiled
        """min(x, y) with NaN propagated, as torch.minimum."""
        return x if (x < y) | (x != x) else y

    @_jit
    def _upper(x, y):   # pragma: no cover - compiled
        """max(x, y) with NaN propagated, as torch.maximum."""
        return x if (x > y) | (x != x) else y

    @_scan_jit
    def merge_outer_rows(d_lo, d_hi, a_lo, a_hi, exact, i0, i1, buf_lo, buf_hi, sum_lo, sum_hi,
                         limit, room, top):   # pragma: no cover - compiled
        """The merges of a linear layer's per-sample weight bounds, computed here from their
        factors instead of read (`agt.bounded.layers.OuterBounds.values`, in the values'
        dtype): for output unit o, input i (row r = o * in + i) and sample s,

        * ``exact`` (a_lo is a_hi = a), with a+ = max(a, 0) and a- = min(a, 0), NaN kept:
          lo = d_lo[o, s] a+[i, s] + d_hi[o, s] a-[i, s] and
          hi = d_hi[o, s] a+[i, s] + d_lo[o, s] a-[i, s] (one of the two products is zero,
          so each value is one rounded product, whatever the order of the two terms);
        * otherwise the four corners: lo (hi) = the least (greatest) of d_lo a_lo,
          d_lo a_hi, d_hi a_lo and d_hi a_hi at [o, s] and [i, s], NaN propagated.

        Each lo row is merged into buf_lo[r] (largest) and sum_lo[r], each hi row into
        buf_hi[r] (smallest) and sum_hi[r], for the inputs i0 <= i < i1 (the input's factors
        stay in cache while every output unit takes them)."""
        out_f, n = d_lo.shape
        in_f = a_lo.shape[0]
        k = buf_lo.shape[1]
        w = np.empty(k + room + 1, dtype=a_lo.dtype)
        better = np.empty(k + room, dtype=a_lo.dtype)
        rest = np.empty(k + room, dtype=a_lo.dtype)
        lo = np.empty(n, dtype=a_lo.dtype)
        hi = np.empty(n, dtype=a_lo.dtype)
        zero = limit - limit            # 0 in the values' dtype
        for i in range(i0, i1):
            al = a_lo[i]
            ah = a_hi[i]
            for o in range(out_f):
                dl = d_lo[o]
                dh = d_hi[o]
                if exact:
                    for s in range(n):
                        x = al[s]
                        pos = zero if x < 0 else x
                        neg = zero if x > 0 else x
                        lo[s] = dl[s] * pos + dh[s] * neg
                        hi[s] = dh[s] * pos + dl[s] * neg
                else:
                    for s in range(n):
                        p1 = dl[s] * al[s]
                        p2 = dl[s] * ah[s]
                        p3 = dh[s] * al[s]
                        p4 = dh[s] * ah[s]
                        lo[s] = _lower(_lower(p1, p2), _lower(p3, p4))
                        hi[s] = _upper(_upper(p1, p2), _upper(p3, p4))
                r = o * in_f + i
                sum_lo[r] += _merge_row(lo, buf_lo[r], w, better, rest, limit, False, room, top)
                sum_hi[r] += _merge_row(hi, buf_hi[r], w, better, rest, limit, True, room, top)


def merge_fragment(values: np.ndarray, buffer: np.ndarray | None, sums: np.ndarray,
                   gamma: float, largest: bool) -> None:
    """Clamp ``values`` (rows, F) to [-gamma, gamma] (gamma rounded to their dtype, as torch
    rounds a clamp limit), add each row's float64 sum to ``sums`` (rows,) and merge the row
    into ``buffer`` (rows, k), in place: afterwards each buffer row holds the k largest
    (smallest) of its old values and the clamped fragment row, as a multiset (module
    docstring). All three arrays C-contiguous, values and buffer of one float dtype.
    ``buffer`` None (a box of k = 0): the clamp and the sums only."""
    if buffer is None:
        buffer = np.empty((values.shape[0], 0), dtype=values.dtype)
    if not (values.flags.c_contiguous and buffer.flags.c_contiguous and sums.flags.c_contiguous):
        raise ValueError("internal: merge_fragment needs C-contiguous arrays")
    k = buffer.shape[1]
    kind = values.dtype.type
    merge_rows(values, buffer, sums, kind(gamma), not largest, candidate_room(k), kind(np.inf))


def merge_outer(d_lo: np.ndarray, d_hi: np.ndarray, a_lo: np.ndarray, a_hi: np.ndarray | None,
                inputs: tuple[int, int], buf_lo: np.ndarray | None, buf_hi: np.ndarray | None,
                sum_lo: np.ndarray, sum_hi: np.ndarray, gamma: float) -> None:
    """`merge_fragment` of both sides of a linear layer's per-sample weight bounds, computed
    from their factors (`agt.bounded.layers.OuterBounds` of one box: d_lo, d_hi (out, b);
    the input a_lo (in, b), exact where a_hi is None, else the interval [a_lo, a_hi]) for
    the rows of the inputs ``inputs`` = (i0, i1) of every output unit (row o * in + i).
    buf_lo: (out * in, k) the k largest clamped lower bounds, buf_hi the k smallest
    clamped upper bounds (None: k = 0, the sums only); sum_lo, sum_hi (out * in,) float64.
    C-contiguous arrays of one float dtype (the sums float64)."""
    exact = a_hi is None
    a_hi = a_lo if exact else a_hi
    out_f, in_f = d_lo.shape[0], a_lo.shape[0]
    arrays = (d_lo, d_hi, a_lo, a_hi, sum_lo, sum_hi) + tuple(
        x for x in (buf_lo, buf_hi) if x is not None)
    if not all(x.flags.c_contiguous for x in arrays):
        raise ValueError("internal: merge_outer needs C-contiguous arrays")
    if (buf_lo is None) != (buf_hi is None) or d_hi.shape != d_lo.shape \
            or a_hi.shape != a_lo.shape or a_lo.shape[1] != d_lo.shape[1] \
            or sum_lo.shape != (out_f * in_f,):
        raise ValueError("internal: merge_outer got arrays of mismatched shapes")
    if buf_lo is None:
        buf_lo = buf_hi = np.empty((out_f * in_f, 0), dtype=a_lo.dtype)
    kind = a_lo.dtype.type
    merge_outer_rows(d_lo, d_hi, a_lo, a_hi, exact, inputs[0], inputs[1], buf_lo, buf_hi,
                     sum_lo, sum_hi, kind(gamma), candidate_room(buf_lo.shape[1]), kind(np.inf))
