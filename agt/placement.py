"""Interval boxes under a per-epoch placement budget (config ``k_placement: per-epoch``).

Valid certificates, tighter on minibatches; the computed boxes of neighbours nest
(graded passes, Rounding below), so the radii are smooth and feed every release.

The paper's interval pass (Thm 4.6 applied at every step) lets *every* batch hold up to k
replaced records. Under replace-one the replaced records of a neighbour D'' occupy at most
k fixed slots, and each epoch visits every slot once (batches are slots of a
data-independent permutation, agt/training.py), so the batches of one epoch hold at most k
replaced records *together*. This module tracks that budget by a dynamic programme over
"replaced records met so far in this epoch".

States. For a grid value k and an epoch, B_k[j] (j = 0..k) is a box (parameters, and the
momentum buffer under sgdm) of the runs on every D'' within distance k whose replaced slots
met so far in this epoch number exactly j. Write Step_b(X, c) for the engine's bound of one
update on batch b from the box X when up to c of the batch's records are replaced (the top-c
rule of agt/topk.py followed by the optimizer's interval update, agt/optim.py).

    epoch start:  B_k[0] = S_k, B_k[j] empty for j > 0        (S_k: the box the epoch starts in)
    batch b:      B_k[j'] <- hull over j <= j' of Step_b(B_k[j], j' - j)     (j' <= k)
    epoch end:    S_k <- hull over j of B_k[j]                 (every slot is met again)

The k-box after any step is hull_j B_k[j]; the first epoch starts every k from the initial
parameters, so one chain of states j = 0..max(k) serves the whole grid until its end.

Validity (every D'' within k, every float run of the nominal rule included). Induction over
the steps: a run of D'' that has met j replaced slots before batch b lies in B_k[j]; batch
b holds some c <= k - j of its replaced slots, and Step_b(X, c) contains the update of every
parameter point of X on every batch that differs from b in at most c records (Thm 4.6, with
the rounding of the nominal computation, agt/interval.py), so the run lies in
Step_b(B_k[j], c), inside B_k[j + c]. An epoch meets each slot once, so the count restarts
at 0 with S_k containing the run. QED

Nesting (r(D') >= r(D) - 1, in real arithmetic). Let D' differ from D in one slot s,
k' <= k - 1. Claim: at every step B'_{k'}[j] is inside B_k[j] while s has not been met in
the current epoch, and inside B_k[j + 1] after it; and S'_{k'} inside S_k. The bounds are
inclusion isotone in the box (the real-number pass; see Rounding) and, on a batch b' that
differs from b in one record,
Step_{b'}(X, c) lies inside Step_b(X, c + 1) (agt/topk.py: the nesting allowance 2 k w_k
makes this hold for the computed bounds, not only for the real numbers). Batches without s
are equal for D and D': B'_{k'}[j'] = hull_{j <= j'} Step_b(B'_{k'}[j], j' - j) is inside
the same hull for D at budget k (before s: the same indices; after s: shifted by one). On
the batch holding s, Step_{b'}(B'_{k'}[j], c) lies in Step_b(B_k[j], c + 1), a part of
B_k[j + c + 1]: the shift starts (j + c + 1 <= k' + 1 <= k). At the epoch end the hulls
nest, so S'_{k'} lies in S_k, and so do the final boxes. This is the condition the
interval method's smoothness proof rests on (box(D', g_{i-1}) inside box(D, g_i)), so the
grid radii would keep r(D') >= r(D) - 1. QED for real arithmetic; for the computed boxes
see Rounding.

Rounding. The argument needs the computed bounds to be inclusion isotone in the box. Each
operation is isotone in real arithmetic, but a computed one is only up to its rounding: an
adversarial review found a sub-box's computed bound outside the box's by one float64 ulp
(midpoint-radius products), 2.8e-10 at |theta| ~ 0.3 in float32 (outward casts), where the
programme compared D' at state j with D at state j + 1 through the same c. (The per-batch
path compares D' at k - 1 with D at k on every batch, so each of its steps carries the
margin that the allowance w_k (1 + 2k) of agt/topk.py leaves beyond the sums' rounding.)
So every transition into state j' of a chain of budget kappa has its descent bound widened
by 2 w_kappa u, u = kappa + j' in the per-k chains of later epochs and u = j' in the first
epoch's shared chain (w_kappa: `agt.topk.nesting_allowance` of the batch at kappa, the same
for D and D' under replace-one and increasing in kappa), then clamped to the clamp range
(an isotone map). Every comparison of the claim is then against a D transition with a
larger u, which leaves it at least 2 w more: in later epochs kappa > kappa' (and j' + 1
against j' after s); in the first epoch both runs use the same chain, compare j' + 1 with
j' once s was met, and before s are the same computation on the same batches (equal
boxes, no slack needed, so state 0 of the first epoch, which holds the k = 0 box, carries
none). Leaks up to 2 w per step are absorbed (fewer in the worst case: two sums of
different multisets may already use up to 2 w_c of the a-priori allowance).

Leaks beyond the slack: a second review built a sub-box whose computed ReLU mask flips from
active to undecided (the pre-activation's lower bound 5e-17 on the box, -1.7e-16 on the
sub-box), which widens one record's gradient bound to its whole clamp range, gamma / b in
the mean: far beyond any rounding slack. So every interval pass of the
programme is graded (agt/interval.py, graded widening) by its box's state: grade j in the
first epoch's shared chain, cap + j in the per-k chain of budget cap later. By the graded
lemma a computed pass on a box A inside B at grades g_A <= g_B - 1 stays inside the pass on
B, whatever the kernels' summation order or mask decisions. Every comparison of the claim
has that margin on D's side: in later epochs D' at (kappa', j) against D at (kappa, j)
before s or (kappa, j + 1) after it, with kappa' <= kappa - 1, so kappa' + j <= kappa + j -
1; in the first epoch after s, D' at j against D at j + 1; on the batch holding s, the
same source states, D' at kappa' + j against D at kappa + j (later epochs) or both at j
(first epoch), where the boxes are equal (next sentence) and so are the kept records'
bounds (the same rows of passes of the same shapes and grouping; a row's floats do not
depend on the other rows' values). What is left is the first epoch before s: D and D' run
the same chain on the same batches from the same initial box, so their states are the
same computation on the same operands and shapes, hence the same floats. Both rest on
run-to-run determinism of the kernels, the assumption the frozen prefix's features make
too (docs/design.md, Soundness); it holds on CPU (kept rows are bit-identical whatever
one other row holds, and final boxes with 1 and 2 threads); on other devices training runs
under deterministic kernels (`agt.tensors.strict_kernels`). Per-k chains in the first epoch
(grades cap + j) would remove it at sum over the grid of (k + 1) boxes per step there
instead of max(k) + 1. The selection sums of different multisets keep the transition slack
above. Bundles written before these passes were graded claim no
nesting proof (`agt.store.Bundle.smooth_radii`, agt/config.py SMOOTH_PLACEMENTS): their
certificates are valid (the validity argument needs no isotonicity), and releases that
spend radii refuse them. The slack costs about 1e-7 gamma (k + j') per step in float32,
1e-14 gamma in float64; grading widens each pass by 8 g times its float64 rounding.

Widening the start boxes to be nested in k (cummin / cummax over the grid, as the
paper path does each step) keeps both arguments: it only enlarges boxes, and it enlarges
D's at k by boxes of smaller budgets, which contain D''s at smaller budgets by the claim.

With one batch per epoch the programme gives Step_b(S_k, k) at the epoch end, the paper's
box: the engine then runs the paper's pass (cheaper, and the same bound).

Cost: the first epoch evaluates max(k) + 1 boxes per step (the paper pass: one per grid
value); every later epoch sum over the grid of (k + 1). Each box needs one interval pass;
its c values come from one selection buffer (prefix sums of the top-c rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from agt.errors import SoundnessError
from agt.interval import BOUND_DTYPE, Interval, nested_along_first

#: evaluate(theta boxes (G, ...), velocity boxes (G, ...) or None, c (L,), group (L,),
#: buffers (G,), cap, units (L,), grades (G,)) -> (theta (L, ...), velocity (L, ...) or
#: None): Step_b(box group[l], c[l]) for a chain of budget ``cap``, its descent bound widened
#: by the transition slack 2 w_cap units[l], each box's interval pass graded by grades[g]
#: (module docstring, Rounding)
StepEvaluator = Callable[[dict, dict | None, torch.Tensor, torch.Tensor, list, int,
                          torch.Tensor, torch.Tensor], tuple[dict, dict | None]]


def successor_counts(j: int, cap: int) -> range:
    """The numbers c of replaced records the next batch may hold after j were met this
    epoch, under a budget of ``cap``."""
    return range(0, cap - j + 1)


@dataclass
class _Chain:
    """States j = 0..cap of the grid positions ``members`` (all with the same start box):
    lo / hi (cap + 1, ...) per parameter (and per velocity, or None), ``alive`` (cap + 1,)."""
    members: list[int]
    cap: int
    shared: bool            # the first epoch's chain, serving every grid value
    lo: dict[str, torch.Tensor]
    hi: dict[str, torch.Tensor]
    v_lo: dict[str, torch.Tensor] | None
    v_hi: dict[str, torch.Tensor] | None
    alive: torch.Tensor


def _empty_like(t: torch.Tensor, rows: int, fill: float) -> torch.Tensor:
    return torch.full((rows, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)


def _start(members: list[int], cap: int, shared: bool, lo: dict, hi: dict,
           v_lo: dict | None, v_hi: dict | None) -> _Chain:
    """A chain whose state 0 is the box (lo, hi) (each (1, ...)) and the others empty."""
    def states(t, fill):
        out = _empty_like(t, cap + 1, fill)
        out[0] = t[0]
        return out
    alive = torch.zeros(cap + 1, dtype=torch.bool)
    alive[0] = True
    return _Chain(members, cap, shared,
                  {n: states(t, float("inf")) for n, t in lo.items()},
                  {n: states(t, -float("inf")) for n, t in hi.items()},
                  None if v_lo is None else {n: states(t, float("inf")) for n, t in v_lo.items()},
                  None if v_hi is None else {n: states(t, -float("inf")) for n, t in v_hi.items()},
                  alive)


class EpochBudgetBoxes:
    """The dynamic programme of the module docstring for the grid ``k_values``.

    ``theta0``: the initial parameters (exact boxes). `step` advances every chain by one
    batch through ``evaluate``; `end_epoch` restarts the budget; `boxes` gives the k-boxes
    (hull over j) of every grid value."""

    def __init__(self, k_values: tuple[int, ...], theta0: dict[str, torch.Tensor],
                 max_boxes: int):
        self.k_values = tuple(int(k) for k in k_values)
        self.max_boxes = max(1, int(max_boxes))
        point = {n: t.to(BOUND_DTYPE).unsqueeze(0) for n, t in theta0.items()}
        self.chains = [_start(list(range(len(self.k_values))), max(self.k_values), True,
                              point, point, None, None)]

    # -- the k-boxes ------------------------------------------------------------------------
    def boxes(self) -> tuple[dict[str, Interval], dict[str, Interval] | None]:
        """Hull over j <= k of the states of k's chain, for every grid value (K, ...)."""
        K = len(self.k_values)
        first = self.chains[0]
        out_lo = {n: _empty_like(t, K, 0.0) for n, t in first.lo.items()}
        out_hi = {n: _empty_like(t, K, 0.0) for n, t in first.hi.items()}
        has_v = first.v_lo is not None
        v_lo = {n: _empty_like(t, K, 0.0) for n, t in first.v_lo.items()} if has_v else None
        v_hi = {n: _empty_like(t, K, 0.0) for n, t in first.v_hi.items()} if has_v else None
        for chain in self.chains:
            rows = torch.tensor([self.k_values[m] for m in chain.members])
            targets = torch.tensor(chain.members)
            for src_lo, src_hi, dst_lo, dst_hi in ((chain.lo, chain.hi, out_lo, out_hi),
                                                   (chain.v_lo, chain.v_hi, v_lo, v_hi)):
                if dst_lo is None:
                    continue
                for n in src_lo:
                    lo = torch.cummin(src_lo[n], dim=0).values[rows]
                    hi = torch.cummax(src_hi[n], dim=0).values[rows]
                    dst_lo[n][targets] = lo
                    dst_hi[n][targets] = hi
        for dst_lo, dst_hi in ((out_lo, out_hi), (v_lo, v_hi)):
            if dst_lo is None:
                continue
            for n in dst_lo:
                if not bool((dst_lo[n] <= dst_hi[n]).all()):
                    raise SoundnessError("internal: an empty k-box in the placement programme")
        theta = {n: Interval(out_lo[n], out_hi[n]) for n in out_lo}
        velocity = None if v_lo is None else {n: Interval(v_lo[n], v_hi[n]) for n in v_lo}
        return theta, velocity

    # -- one batch ----------------------------------------------------------------------------
    def step(self, evaluate: StepEvaluator) -> None:
        for chain in self.chains:
            self._advance(chain, evaluate)

    def _advance(self, chain: _Chain, evaluate: StepEvaluator) -> None:
        alive = chain.alive.nonzero().flatten().tolist()
        new_lo = {n: torch.full_like(t, float("inf")) for n, t in chain.lo.items()}
        new_hi = {n: torch.full_like(t, -float("inf")) for n, t in chain.hi.items()}
        new_vlo = new_vhi = None
        new_alive = torch.zeros_like(chain.alive)
        for s0 in range(0, len(alive), self.max_boxes):
            states = alive[s0:s0 + self.max_boxes]
            sel = torch.tensor(states)
            theta = {n: Interval(chain.lo[n][sel], chain.hi[n][sel]) for n in chain.lo}
            velocity = None if chain.v_lo is None else {
                n: Interval(chain.v_lo[n][sel], chain.v_hi[n][sel]) for n in chain.v_lo}
            counts = [successor_counts(j, chain.cap) for j in states]
            c = torch.tensor([ci for cs in counts for ci in cs], dtype=torch.int64)
            group = torch.tensor([g for g, cs in enumerate(counts) for _ in cs],
                                 dtype=torch.int64)
            target = torch.tensor([j + ci for j, cs in zip(states, counts) for ci in cs])
            # transition slack in units of 2 w_cap, and the passes' grades: the budget state
            # (+ the cap after the first epoch), larger on D's side of every comparison
            # (module docstring, Rounding)
            units = target if chain.shared else target + chain.cap
            grades = sel if chain.shared else sel + chain.cap
            out_theta, out_v = evaluate(theta, velocity, c, group, [max(cs) for cs in counts],
                                        chain.cap, units, grades)
            for n, box in out_theta.items():
                _hull_into(new_lo[n], new_hi[n], box, target)
            if out_v is not None:
                if new_vlo is None:
                    new_vlo = {n: _empty_like(chain.lo[n], chain.cap + 1, float("inf"))
                               for n in out_v}
                    new_vhi = {n: _empty_like(chain.hi[n], chain.cap + 1, -float("inf"))
                               for n in out_v}
                for n, box in out_v.items():
                    _hull_into(new_vlo[n], new_vhi[n], box, target)
            new_alive[target] = True
        chain.lo, chain.hi, chain.v_lo, chain.v_hi = new_lo, new_hi, new_vlo, new_vhi
        chain.alive = new_alive

    # -- the epoch's end ----------------------------------------------------------------------
    def end_epoch(self) -> None:
        """Restart the budget: every grid value gets its own chain, starting from its k-box
        (widened to be nested in k, module docstring)."""
        theta, velocity = self.boxes()
        theta = {n: nested_along_first(b) for n, b in theta.items()}
        velocity = None if velocity is None else {n: nested_along_first(b)
                                                  for n, b in velocity.items()}
        self.chains = []
        for m, k in enumerate(self.k_values):
            row = slice(m, m + 1)
            self.chains.append(_start(
                [m], k, False, {n: b.lo[row] for n, b in theta.items()},
                {n: b.hi[row] for n, b in theta.items()},
                None if velocity is None else {n: b.lo[row] for n, b in velocity.items()},
                None if velocity is None else {n: b.hi[row] for n, b in velocity.items()}))


def _hull_into(lo: torch.Tensor, hi: torch.Tensor, box: Interval, target: torch.Tensor) -> None:
    """lo[t] <- min(lo[t], box.lo[l]), hi[t] <- max(...) for every l with target[l] = t."""
    index = target.to(lo.device).view(-1, *([1] * (lo.dim() - 1))).expand_as(box.lo)
    lo.scatter_reduce_(0, index, box.lo, reduce="amin")
    hi.scatter_reduce_(0, index, box.hi, reduce="amax")
