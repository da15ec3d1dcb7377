"""Query-time certification: the largest certified stable distance k* per query.

A prediction is *certified at k* (paper Def. 4.1, Lemma 4.4) when every parameter in the
k-box gives the same class *and* that class equals the one the served nominal model
releases. Binary (one logit z): class 1 needs z_L > 0, class 0 needs z_U < 0. Multi-class:
for the released class c and every j != c, the margin z_c - z_j, bounded directly through
the last linear layer as ((W_c - W_j) h + b_c - b_j) over the box, must have a positive
lower bound (tighter than comparing separate logit intervals). Logit boxes are widened for
the rounding of the served float computation, so "certified" speaks about the model the
served code would compute on any dataset within distance k.

Stability radius r (what the mechanisms spend; the smooth bound must itself be smooth,
docs/design.md): the *index* j of the largest certified grid value g_j (agt/kgrid.py):
k* itself on a contiguous grid {0, 1, ..., K}, and -1 (like k*) where not even the k = 0
box certifies. It drops by at most 1 between neighbouring datasets when the bounds come
from a selection rule with a nesting proof (`Certificate.smooth_radii`).

Who decides what (every decision, and so every radius, is the reference's):

  certifier.py      `Certifier`: the binary search per query and the reference test of one
                    (query, box) pair: the interval pass of the box test
                    (`Certifier.margin_lower_bound`), the stability ball and the trajectory
                    bound where the bundle has them, and the overflow test.
  margin_screen.py  one trainable linear layer on exact inputs: decides a pair by one small
                    product where its error bar allows, and hands every other pair to the
                    reference test; proven to agree with the reference.
  hidden_screen.py  trainable linear and ReLU layers with a hidden layer (exact inputs or a
                    frozen prefix's feature boxes): evaluates the reference's formulas
                    (rearranged where the real value stays the same, e.g. one logit behind
                    a ReLU as sums over units) with the first layer's products shared by
                    all queries of a box (float32, around box 0's midpoint), with a
                    rigorous bound on its distance to the reference's computed bound
                    (per-query coefficients);
                    decides a pair where that bound allows and hands every other pair to
                    the reference test; proven to agree with the reference.
                    Other models (convolutions in the trainable part, a prefix followed by
                    a single linear layer, a stability ball, a trajectory bound): the
                    reference decides every pair.
  prefix_box.py     the feature boxes behind a frozen float32 prefix (linear, conv2d, ReLU,
                    flatten): one float64 midpoint product and one float32 radius product
                    per layer with a rigorous rounding radius (Rump's midpoint-radius
                    arithmetic, Higham's bound); the reference and both screens read the
                    same box, so it decides nothing by itself.
  certificate.py    `Certificate`: the owner-only result.

A Certificate is owner-only (radii are deterministic functions of the private data); it
carries the provenance a release needs (the protected dataset's hash, the relations the
bounds hold under, whether the radii are smooth), and `mechanisms.Certified.from_certificate`
turns it into the inputs of `Ledger.release`, the only way to a released label.
"""

import agt._first_use  # noqa: F401 (threading settings before torch loads)
from agt.certify.certificate import Certificate
from agt.certify.certifier import Certifier, check_served_model

__all__ = ["Certificate", "Certifier", "check_served_model"]
