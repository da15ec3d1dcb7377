"""The exact rule's merge of factored bounds in torch, on any device (the GPU's counterpart of
the compiled CPU kernel `agt.topk_kernel.merge_outer`).

A linear layer hands over its per-sample weight bounds as factors
(`agt.bounded.layers.OuterBounds`: for G boxes, d (G, out, n) and the input (in, n), exact
or an interval). `merge_outer` cuts the (out, in, n) index space into blocks of output units,
inputs and samples, each of at most ``block_elements`` values per box, and per block:

1. forms the bounds of the block on the factors' device (`OuterBounds.block`, the one torch
   definition of the formula: value for value what `OuterBounds.values` gives);
2. clamps them to [-gamma, gamma] (torch rounds gamma to the values' dtype, as the compiled
   kernel does) and adds each parameter's float64 sum of the clamped values to the batch sums;
3. merges them into the selection buffers of every box at once: the boxes' buffers are
   stacked, each padded with its +-inf fill to the largest k of the group, K; one
   ``topk(K, sorted=True)`` over ``[stacked buffers | block values]`` keeps, per box and
   parameter, the K best in order, and box g keeps their first k_g.

Only one block of bounds exists at a time: memory is O(block_elements G) beside the
factors and the buffers, never the (batch x parameters) bound tensor.

Same multisets as the reference paths (the compiled kernel and the materialised-bounds path
of `agt.topk.DescentAccumulator.add`):

* Values. The block's entries are those of `OuterBounds.values` (elementwise formulas in the
  values' dtype: an exact input gives one rounded product per bound; an interval input the
  least and greatest of four rounded corner products), clamped the same way.
* Selection. Merge lemma (agt/topk.py): top_k(A u B) = top_k(top_k(A) u B) as multisets, in
  any grouping of the values into blocks and sample chunks, so the buffer after the last
  block of a parameter holds the k best of its old values and all n new values. Sorted
  prefix: the first k_g of the K best in descending (ascending) order are k_g values each at
  least (at most) as good as every other value of the row, i.e. the k_g best; ties are equal
  numbers, interchangeable in every sum (+0.0 and -0.0 included). The padding is the fill,
  which loses to every clamped (finite) value, so it is kept only where a box saw fewer than
  k_g values, as the fill of the reference paths.
* NaN. torch orders NaN above every number, so a NaN bound may enter a buffer where the
  compiled kernel drops it; it enters the row's batch sum on every path, so that row's
  bounds are NaN whatever its buffer holds.

Rounding. The top-k sums are not computed here: `DescentAccumulator.bounds` sorts each
buffer and adds it in that fixed order, so equal multisets give bit-equal top-k sums on
every path. The batch sums are float64 sums of the same clamped values (each cast exactly to
float64) in another order than the reference's (whose own two paths already differ: the
compiled kernel reassociates blocks of 64, the plain path adds blocks of 16 in the compute
dtype). Their error is at most gamma_{n-1}(2^-53) times the sum of the magnitudes, within the
a-priori allowance `agt.topk.rounding_allowance` charged for *any* order, which is all that
the soundness and the nesting arguments of agt/topk.py use: a bound from this path lies within
the same allowance of the same real number as the reference's, so it is sound and nests as
the reference's does. (A sum over blocks and sample chunks is still one summation tree of
the n values: each block's sum is a tree, and adding it to the running sum joins the trees;
the bound gamma_{h} sum |x| for a tree of height h <= n - 1 covers it.) The two computed
bounds therefore lie apart by at most the two sums' errors, 2 gamma_{n-1} n gamma / b (plus
the plain path's compute-dtype blocks where it is the reference), and the rounding of the
three final operations; neither need contain the other at the last bit, and no padding is
added to force it: a path-dependent padding would enter the nesting argument (D and D' at
distance k must carry the same allowance). The tests check equal multisets, bit-equal
top-k sums, and the gap against that bound.
"""

from __future__ import annotations

from typing import Sequence

import torch


def block_shape(out_f: int, in_f: int, n: int, n_boxes: int, n_buffered: int, k_max: int,
                block_elements: int) -> tuple[int, int, int]:
    """(output units, inputs, samples) per block so that a block's bounds (n_boxes values per
    entry) and its selection workspace (n_buffered boxes, k_max + samples values per
    parameter) hold at most about ``block_elements`` values; at least one of each.

    Args:
        out_f: output units of the layer.
        in_f: inputs of the layer.
        n: samples of the factors.
        n_boxes: boxes of the factors (G, or 1 where shared).
        n_buffered: boxes with a selection buffer (k > 0).
        k_max: the largest buffer.
        block_elements: the budget, values per block.

    Returns:
        (rows, inputs, samples) per block."""
    per_sample = n_boxes + n_buffered
    budget = max(1, int(block_elements))
    samples = max(1, min(n, (budget - n_buffered * k_max) // per_sample))
    per_pair = per_sample * samples + n_buffered * k_max
    inputs = max(1, min(in_f, budget // per_pair))
    rows = max(1, min(out_f, budget // (per_pair * in_f))) if inputs == in_f else 1
    return rows, inputs, samples


def merge_outer(outer, top_lo: Sequence[torch.Tensor | None],
                low_hi: Sequence[torch.Tensor | None], sum_lo: torch.Tensor,
                sum_hi: torch.Tensor, gamma: float, block_elements: int) -> None:
    """Merge the factored bounds ``outer`` (all rows of one parameter, n samples) into the
    buffers and batch sums of G boxes, in place (module docstring).

    Args:
        outer: the factors (`agt.bounded.layers.OuterBounds`; G or 1 boxes, on one device).
        top_lo: per box, its (out * in, k_g) buffer of the k_g largest clamped lower bounds,
            or None (k_g = 0: the sums only); fill -inf.
        low_hi: per box, the k_g smallest clamped upper bounds, or None; fill +inf.
        sum_lo: (G, out * in) float64 sums of the clamped lower bounds.
        sum_hi: (G, out * in) float64 sums of the clamped upper bounds.
        gamma: the clamp.
        block_elements: values per block (the memory budget of one block).

    Raises:
        ValueError: shapes that do not fit together."""
    G = sum_lo.shape[0]
    out_f, in_f, n = int(outer.d_lo.shape[1]), outer.in_features, outer.n_samples
    if sum_lo.shape != (G, out_f * in_f) or sum_hi.shape != sum_lo.shape \
            or len(top_lo) != G or len(low_hi) != G or outer.d_lo.shape[0] not in (1, G):
        raise ValueError("internal: merge_outer got factors and buffers of mismatched shapes")
    sizes = [0 if b is None else int(b.shape[1]) for b in top_lo]
    boxes = [g for g, k in enumerate(sizes) if k]
    k_max = max(sizes, default=0)
    n_fact = max(int(outer.d_lo.shape[0]), 1 if outer.exact else int(outer.a.shape[0]))
    rows, inputs, samples = block_shape(out_f, in_f, n, n_fact, len(boxes), k_max,
                                        block_elements)
    sides = []
    for buffers, sums, largest in ((top_lo, sum_lo, True), (low_hi, sum_hi, False)):
        stacked = _stack(buffers, boxes, k_max, out_f, in_f, largest)
        sides.append((sums.view(G, out_f, in_f), stacked, largest))
    box_index = torch.tensor(boxes, dtype=torch.int64, device=sum_lo.device)
    for o0 in range(0, out_f, rows):
        o1 = min(out_f, o0 + rows)
        for i0 in range(0, in_f, inputs):
            i1 = min(in_f, i0 + inputs)
            for s0 in range(0, n, samples):
                s1 = min(n, s0 + samples)
                lo, hi = outer.block((o0, o1), (i0, i1), (s0, s1))
                for values, (sums, stacked, largest) in zip((lo, hi), sides):
                    _merge_block(values, sums[:, o0:o1, i0:i1], stacked, box_index,
                                 (o0, o1, i0, i1), gamma, k_max, largest)
    for buffers, (_, stacked, _) in zip((top_lo, low_hi), sides):
        for j, g in enumerate(boxes):
            buffers[g].copy_(stacked[j, :, :, :sizes[g]].reshape(out_f * in_f, sizes[g]))


def _stack(buffers, boxes: list[int], k_max: int, out_f: int, in_f: int,
           largest: bool) -> torch.Tensor | None:
    """The buffers of ``boxes`` as one (len(boxes), out, in, k_max) tensor, each padded with
    its fill (-inf for the largest, +inf for the smallest), or None without boxes."""
    if not boxes:
        return None
    first = buffers[boxes[0]]
    fill = -float("inf") if largest else float("inf")
    stacked = torch.full((len(boxes), out_f, in_f, k_max), fill, dtype=first.dtype,
                         device=first.device)
    for j, g in enumerate(boxes):
        k = buffers[g].shape[1]
        stacked[j, :, :, :k] = buffers[g].view(out_f, in_f, k)
    return stacked


def _merge_block(values: torch.Tensor, sums: torch.Tensor, stacked: torch.Tensor | None,
                 box_index: torch.Tensor, where: tuple[int, int, int, int], gamma: float,
                 k_max: int, largest: bool) -> None:
    """Clamp one block's bounds (G or 1, rows, inputs, samples), add their float64 sums to
    ``sums`` (G, rows, inputs; a view of the batch sums) and merge them into the stacked
    buffers' entries of the block (the K best of old and new, in order)."""
    clamped = values.clamp(-gamma, gamma)
    sums += clamped.sum(-1, dtype=torch.float64)
    if stacked is None:
        return
    o0, o1, i0, i1 = where
    held = stacked[:, o0:o1, i0:i1]                                   # (B, rows, in, K)
    new = clamped if clamped.shape[0] == 1 else clamped.index_select(0, box_index)
    new = new.expand(held.shape[0], -1, -1, -1)
    workspace = torch.cat((held, new), dim=-1)
    held.copy_(workspace.topk(k_max, dim=-1, largest=largest, sorted=True).values)
