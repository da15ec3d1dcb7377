"""Memory budgets of the per-sample gradient passes, and the cuts of the work that fit them.

The nominal direction (agt/nominal.py) and the interval pass (agt/bound_pass.py) hold the
per-sample gradients of a fragment of the batch for a range of parameter rows at a time,
and the interval pass stacks a group of boxes (one per k value, or per state of the
placement programme, agt/placement.py) into one pass. The budgets below decide how large
these pieces are; every cut computes a sound bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import torch

#: elements of the float64 temporaries of one chunk of parameter rows
WORK_ELEMENTS = 1 << 21
#: bytes of the top-k selection buffers of one interval pass
BUFFER_BYTES = 768 << 20
#: values of one block of factored bounds formed by the torch merge (`agt.topk_torch`, the
#: GPU's path), every box together: the block's bounds and its selection workspace, in the
#: training dtype (2^24: 128 MiB in float64; the clamp, sum and topk temporaries a few times
#: that).
#: The records of a fragment (the config's ``fragment_size``) bound the factors instead.
FACTORED_BLOCK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class PassFootprint:
    """What one box costs in an interval pass: ``activations``, the entries of every
    layer's output for one record; ``parameters``, the trainable parameters' entries;
    ``itemsize``, the bytes of one entry in the training dtype."""
    activations: int
    parameters: int
    itemsize: int

    @property
    def slot_bytes(self) -> int:
        """Bytes of one selection slot per box: a lower and an upper buffer entry for
        every parameter, in the training dtype."""
        return 2 * self.itemsize * self.parameters


def row_chunks(src, n_samples: int, n_groups: int) -> Iterator[tuple[int, int]]:
    """Consecutive row ranges [r0, r1) of a gradient source (`agt.bounded.layers.GradSource`)
    whose per-sample gradients of ``n_samples`` records and ``n_groups`` boxes fit the work
    budget (at least one row each).

    Args:
        src: the per-sample gradient source of one parameter.
        n_samples: the records of the fragment.
        n_groups: the boxes of the pass (1 for the nominal direction).

    Returns:
        An iterator over the (r0, r1) ranges, covering rows 0..src.n_rows once."""
    per_row = max(1, n_samples * n_groups * src.row_size)
    rows = max(1, WORK_ELEMENTS // per_row)
    for r0 in range(0, src.n_rows, rows):
        yield r0, min(src.n_rows, r0 + rows)


def k_groups(k_values: torch.Tensor, batch: int, fragment_size: int, footprint: PassFootprint,
             buffers: bool = True) -> Iterator[tuple[int, int]]:
    """Consecutive groups [g0, g1) of the k values sized to the memory budgets: the
    activations of the group's boxes for a fragment within the work budget and, with
    ``buffers`` (the exact rule's selections), their selection buffers (a box of distance k
    holds min(k, batch) slots) within the buffer budget. A group holds at least one k."""
    frag = min(batch, fragment_size)
    K = k_values.shape[0]
    g0 = 0
    while g0 < K:
        g1 = g0 + 1
        while g1 < K:
            size = g1 + 1 - g0
            if size * frag * footprint.activations * 8 > WORK_ELEMENTS * 4 or \
                    (buffers and int(k_values[g0:g1 + 1].clamp_max(batch).sum())
                     * footprint.slot_bytes > BUFFER_BYTES):
                break
            g1 += 1
        yield g0, g1
        g0 = g1


def boxes_per_pass(k_values: tuple[int, ...], batch_size: int, fragment_size: int,
                   footprint: PassFootprint) -> int:
    """How many boxes one interval pass of the placement programme (agt/placement.py) may
    hold: the budgets of `k_groups`, with every box's selection buffer as large as max(k),
    and its max(k) + 1 successor boxes within the buffer budget.

    Args:
        k_values: the k grid.
        batch_size: the size of every batch but the last.
        fragment_size: the config's fragment size.
        footprint: what one box costs.

    Returns:
        The number of boxes, at least 1."""
    frag = min(batch_size, fragment_size)
    by_work = (WORK_ELEMENTS * 4) // max(1, frag * footprint.activations * 8)
    k_big = min(max(k_values), batch_size)      # buffers hold at most a batch
    by_buffers = BUFFER_BYTES // max(1, (k_big + 1) * footprint.slot_bytes)
    # each box yields up to max(k) + 1 successors: descent, parameter and velocity boxes
    # (lo and hi, float64) and the gathered source boxes of the update
    by_outputs = BUFFER_BYTES // max(1, 8 * (max(k_values) + 1) * 8 * footprint.parameters)
    return max(1, min(by_work, by_buffers, by_outputs))


def footprint_of(activation_shapes: list[tuple[int, ...]], parameter_shapes: list[torch.Size],
                 dtype: torch.dtype) -> PassFootprint:
    """The `PassFootprint` of a network whose layers output ``activation_shapes`` (per
    record) and whose trainable parameters have ``parameter_shapes``."""
    return PassFootprint(sum(math.prod(s) for s in activation_shapes),
                         sum(math.prod(s) for s in parameter_shapes), dtype.itemsize)
