"""The certifier: per query, the largest grid index whose box certifies the served class.

`Certifier.certify` runs a binary search over the grid per query (boxes are nested in k,
validated on load, so certification is monotone in k); each step asks one test per query,
`_certified`, which is the reference (the box test `margin_lower_bound`, or'd with the
stability ball and the trajectory test where the bundle has them, and'd with the overflow
test). A screen (agt/certify/margin_screen.py for one linear layer,
agt/certify/hidden_screen.py for hidden layers) may answer a step in its place only where
it is proven to give the reference's answer; `certify_linear` scans every box in order and is
the reference the search is tested against. A small batch behind a screen has every (query,
box) pair tested in one pass first (`Certifier._verdict_table`), and the same search then
reads its steps' answers from that table: the same answers, one pass instead of
ceil(log2(K + 1)).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from agt import interval as iv
from agt.bounded.layers import rule_for
from agt.bounded.network import Network
from agt.certify import prefix_box
from agt.certify.certificate import Certificate
from agt.certify.hidden_screen import HiddenLayerScreen
from agt.certify.margin_screen import LinearMarginScreen
from agt.errors import BundleError, DataError
from agt.interval import BOUND_DTYPE, FloatModel, Interval
from agt.stability import parameter_norm
from agt.store import Bundle
from agt.tensors import grid_pairs, overflow_limit, predicted_classes, strict_kernels, torch_dtype

# elements of the widest per-query tensor in one chunk: its temporaries (8 MB) stay below
# glibc's largest mmap threshold (32 MB), so they reuse heap pages instead of mapping fresh
# ones every step (4-5x faster behind a hidden layer than chunks of 1 << 23, same radii)
_QUERY_ELEMENTS = 1 << 20
_SCREEN_CHUNK = 1 << 16       # queries per chunk of the screened search
_SCREEN_ELEMENTS = 1 << 23    # its per-query tensors are small: (2 in, C) columns
_SCREEN_SLOTS = 16            # reference tests per screened step, padded
_HIDDEN_CHUNK = 1 << 13       # queries per chunk of the hidden-layer screen
_HIDDEN_ELEMENTS = 1 << 23    # its widest per-query tensors: rows of the first layer's width
# reference tests per step behind the hidden-layer screen, padded: each costs a query's
# own pass through its weight box (about 8 ms for 768-100-1, as much as the screen spends
# on 300 queries), and the screen leaves far fewer than one pair per chunk and step to the
# reference on random queries
_HIDDEN_SLOTS = 2
# the largest verdict table (`Certifier._verdict_table`) behind the linear screen, in
# (query, box) pairs times its floats per pair (`Certifier._table_width`): below it a
# chunk's every pair is tested in one pass instead of ceil(log2(K + 1)) passes of one pair
# per query each. A pass costs a fixed 0.5 ms of operator overhead on small batches (Blobs,
# K = 200: 4.2 ms for 8 passes of 1 query, 1.0 ms for the table of 200 pairs, 2.1 ms for 64
# queries, 2.9 ms for 96; the table loses from about 150 queries): the budget keeps the
# table to where it is clearly faster
_TABLE_ELEMENTS = 1 << 19
# the same behind the hidden-layer screen, whose pairs cost several times more per float
# (the 6-128-2 network, K = 200: 11.4 ms per step-by-step search of 1 query against 6.1 ms
# for its table; 2 queries: 11.4 against 13.5)
_HIDDEN_TABLE_ELEMENTS = 1 << 18
_PREFIX_CHUNK = 512           # queries per chunk behind a frozen prefix: its feature pass
                              # holds (queries x patches x positions) float64 tensors
# queries per pass of the midpoint-radius prefix box: its unfolded inputs stay in cache
# (32 rows: 2-3x faster than 512 on the OctMNIST prefix); a fixed number, so a query's
# floats depend on its chunk only, the same for the bundles of D and D'
_PREFIX_ROWS = 32
# queries per block of the served pass of a model with convolutions: its unfolded patches
# (C k k x positions per query, 100 kB on the OctMNIST prefix) stay in cache and reuse heap
# pages (2-3x less CPU than one pass over 1,024 queries)
_SERVED_ROWS = 64
_U64 = 2.0**-53


class Certifier:
    """Certify queries against one bundle: the served prediction and its stability radius.

    Build one per bundle (it prepares the model and the bound passes once) and call
    `certify`; ``agt.certify`` is the one-call form. A bundle with an input scale gets every
    query scaled by it first (agt/scaling.py).

    Args:
        bundle: the bounds bundle.
        device: where to evaluate the boxes ("cpu" or "cuda").
        served: optionally the model actually served (parameters or module), checked to
            equal the bundle's nominal parameters.
        trajectory: an `agt.trajectory.TrajectoryBounds` of this bundle (linear heads;
            needs the training data): a query is then also certified where its margin bound
            along the training run certifies, and the certificate holds under replace-one.

    Raises:
        BundleError: trajectory bounds of another bundle, or a model the certifier cannot
            test (one that does not end in a linear layer).
    """
    def __init__(self, bundle: Bundle, device: str | torch.device = "cpu",
                 served: dict[str, torch.Tensor] | torch.nn.Module | None = None,
                 trajectory=None):
        """``trajectory``: an `agt.trajectory.TrajectoryBounds` of this bundle (linear heads;
        needs the training data): a query is then also certified where its margin bound
        along the training run certifies, and the certificate holds under replace-one."""
        self.bundle = bundle
        if trajectory is not None and trajectory.bundle_id != bundle.bundle_id:
            raise BundleError("the trajectory bounds were built for another bundle")
        self.trajectory = trajectory
        self.device = torch.device(device)
        self.spec = bundle.spec
        self.dtype = torch_dtype(bundle.dtype)
        self.fm = FloatModel(self.dtype)
        self.k_values = tuple(bundle.k_values)
        self.k_float = torch.tensor(self.k_values, dtype=BOUND_DTYPE, device=self.device)
        self.contiguous = bundle.k_grid.contiguous
        if served is not None:
            check_served_model(bundle, served)
        self.nominal = {k: v.to(self.device, self.dtype) for k, v in bundle.nominal.items()}
        self.prefix = Network.prefix(self.spec)
        body_layers = self.spec.layers[self.spec.frozen_layers:]
        if body_layers[-1].kind != "linear":
            raise BundleError("certification needs a model ending in a linear layer")
        self.body = Network(body_layers[:-1], self.spec.frozen_layers)
        self.last = len(self.spec.layers) - 1
        self.full = Network(self.spec.layers, 0)
        self.n_logits = self.spec.n_logits
        self.trainable = self.spec.trainable_param_names()
        self.lower = {n: bundle.lower[n].to(self.device) for n in self.trainable}
        self.upper = {n: bundle.upper[n].to(self.device) for n in self.trainable}
        #: per box (K,): the largest |parameter| of each trainable tensor in it; and of each
        #: frozen tensor (exact)
        self.box_magnitude = {n: Interval(self.lower[n], self.upper[n]).magnitude()
                              .flatten(1).amax(1).to(BOUND_DTYPE) for n in self.trainable}
        self.frozen_magnitude = {n: v.abs().max().to(BOUND_DTYPE) for n, v in self.nominal.items()
                                 if n not in self.trainable}
        self.ball = None
        if bundle.ball_radius is not None:
            if len(self.spec.layers) != 1 or self.spec.frozen_layers:
                raise BundleError("a stability bundle needs a model of one trainable linear layer")
            if tuple(np.shape(bundle.ball_radius)) != (len(self.k_values),):
                raise BundleError(f"the stability radii have shape {np.shape(bundle.ball_radius)}, "
                                  f"the k grid has {len(self.k_values)} values")
            self.ball = torch.as_tensor(bundle.ball_radius, dtype=BOUND_DTYPE, device=self.device)
            self.center_norm = parameter_norm({n: self.nominal[n] for n in self.trainable})
        weight = f"{self.last}.weight"
        #: the frozen prefix's feature boxes by midpoint-radius products
        #: (agt/certify/prefix_box.py); False: the interval rules of `Network.feature_boxes`
        self.midrad_prefix = bool(self.prefix.layers) and prefix_box.supported(
            self.prefix.layers, self.dtype)
        #: the linear margin screen (agt/certify/margin_screen.py), built on the first search;
        #: False where the model has none
        self._screen: LinearMarginScreen | bool = (
            not self.prefix.layers and not self.body.layers and self.ball is None
            and self.trajectory is None and weight in self.lower
            and LinearMarginScreen.fits(self.lower, weight))
        #: the hidden-layer screen (agt/certify/hidden_screen.py), built on the first
        #: search; False where the model has none
        self._hidden: HiddenLayerScreen | bool = (
            self._screen is False and self.ball is None and self.trajectory is None
            and _hidden_screen_fits(self.body, self.lower, self.upper))

    # -- inputs and nominal predictions -----------------------------------------------------
    def _check_queries(self, x) -> torch.Tensor:
        x = torch.as_tensor(np.asarray(x), dtype=torch.float64)
        shape = tuple(self.spec.require_input_shape())
        if tuple(x.shape[1:]) != shape:
            raise DataError(f"queries have feature shape {tuple(x.shape[1:])}, the model "
                            f"expects {shape}")
        if not bool(torch.isfinite(x).all()):
            bad = int((~torch.isfinite(x.reshape(x.shape[0], -1))).any(1).nonzero()[0])
            raise DataError(f"query {bad} contains NaN or infinite values")
        if self.bundle.input_scale is not None:     # public, recorded scale (agt/scaling.py)
            x = torch.from_numpy(self.bundle.input_scale.apply(x.numpy()))
        return x.to(self.device, self.dtype)

    def predict(self, x) -> np.ndarray:
        """The served model's classes (no certification).

        Args:
            x: the queries, (Q, *features), in the original units.

        Returns:
            (Q,) int64 classes.
        """
        xq = self._check_queries(x)
        with torch.no_grad(), strict_kernels(self.device):
            z = self._served_logits(xq)
        return predicted_classes(z).cpu().numpy()

    def _served_logits(self, xq: torch.Tensor) -> torch.Tensor:
        """The served model's logits (its own float pass, `Network.forward_nominal`), in
        blocks of `_SERVED_ROWS` queries where the model has convolutions (their unfolded
        patches are the pass's largest tensors), else in one pass. Only the speed
        depends on the blocks: every certificate bounds the served pass in any batch
        layout and summation order (agt/certify/prefix_box.py, agt/interval.py)."""
        if not any(layer.kind == "conv2d" for layer in self.spec.layers) \
                or xq.shape[0] <= _SERVED_ROWS:
            return self.full.forward_nominal(self.nominal, xq)[0]
        return torch.cat([self.full.forward_nominal(self.nominal, xq[i:i + _SERVED_ROWS])[0]
                          for i in range(0, xq.shape[0], _SERVED_ROWS)])

    def _features(self, xq: torch.Tensor):
        """Inputs of the trainable part for the bound pass: exact, or a widened Interval
        (1, b, ...) behind a frozen prefix (one pass: the bundles of D and D' certify the
        same query batch through the same public prefix, so its features are the same
        floats in both). The prefix's box is the midpoint-radius one
        (agt/certify/prefix_box.py) where it applies (``midrad_prefix``), else the training
        pass's interval rules (`Network.feature_boxes`); the reference test and the screens
        all read this one box."""
        if not self.prefix.layers:
            return xq.to(BOUND_DTYPE)
        frozen = {k: v for k, v in self.nominal.items() if k not in self.trainable}
        if self.midrad_prefix:
            return prefix_box.feature_boxes(self.prefix.layers, 0, frozen, xq, self.dtype,
                                            _PREFIX_ROWS)
        return self.prefix.feature_boxes(frozen, xq, self.fm, max(1, xq.shape[0]))

    # -- certification of given (query, box) pairs ------------------------------------------
    def _certified(self, feats, pred: torch.Tensor, j: torch.Tensor,
                   x_mag: torch.Tensor) -> torch.Tensor:
        """Whether query q is certified at grid index j[q]: its box certifies, or (bound
        method stability) its L2 ball does."""
        ok = self._box_certified(feats, pred, j)
        if self.ball is not None:
            ok = ok | self._ball_certified(feats, pred, j)
        if self.trajectory is not None:
            traj = self.trajectory.certified(feats.cpu(), pred.cpu(), j.cpu())
            ok = ok | traj.to(ok.device)
        return ok & self._fits_dtype(x_mag, j)

    def _fits_dtype(self, x_mag: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Whether the served computation of query q cannot overflow its dtype for any
        parameters in box j[q]. Every test above models rounding, not overflow: two logits
        that both overflow to inf make argmax pick the lower index whatever the margin (an
        adversarial review flipped a float32 query certified at k = 1 this way). The box
        encloses every neighbour's parameters for each method (the ball's boxes enclose the
        ball, the trajectory's neighbours lie in the interval boxes), so the a-priori
        magnitudes of the forward pass over the box (`Network.forward_magnitudes`, every
        partial sum included) must stay below max(dtype) / 16, as in training. The pass runs
        from the raw query (``x_mag``: its largest |entry|, as the dtype holds it) through
        the frozen prefix too, whose exact parameters the served model shares (a review
        overflowed a float32 prefix to inf while the float64 features stayed finite)."""
        mags = dict(self.frozen_magnitude)
        mags.update({n: m[j] for n, m in self.box_magnitude.items()})
        worst = self.full.forward_magnitudes(mags, x_mag)
        return worst <= overflow_limit(self.dtype)

    def _ball_certified(self, feats: torch.Tensor, pred: torch.Tensor,
                        j: torch.Tensor) -> torch.Tensor:
        """Whether every parameter theta with ||theta - c||_F <= rho_j (c the served linear
        layer) makes the served float computation predict pred (agt/stability.py).

        Exact margin at theta: m(theta) >= m(c) - s rho ||x~||, s = sqrt(2) for the margin
        z_p - z_j of two rows (||D_p - D_j|| <= sqrt(2) ||D||_F), 1 for a single logit. The
        served dtype computes each logit with error <= coeff(d + 2) ||theta_row|| ||x~|| +
        abs, so both logits together within S(M) = 2 (coeff sqrt(2) M ||x~|| + abs) for
        ||theta|| <= M = ||c|| + rho (the certifier's box test widens by the same factor 2).
        m(c) is evaluated in float64 and lowered by its a-priori rounding bound tau. The test
        is isotone under the nesting of agt/stability.py: a neighbour's centre differs by
        at most rho_k(D) - rho_{k-1}(D') - xi, and xi covers tau and the norm roundings."""
        x = feats.reshape(feats.shape[0], -1)
        W = self.nominal[f"{self.last}.weight"].to(BOUND_DTYPE)
        bias = self.nominal.get(f"{self.last}.bias")
        d = x.shape[1]
        d_terms = d + (1 if bias is not None else 0)
        x_norm = torch.sqrt((x * x).sum(-1) + (1.0 if bias is not None else 0.0))
        x_norm = x_norm * (1.0 + iv.gamma(d + 4, _U64)) * (1.0 + 1e-12)
        rho = self.ball[j]
        tau_coeff = iv.gamma(2 * d_terms + 4, _U64) * (1.0 + 1e-6)
        if self.n_logits == 1:
            z = x @ W[0]
            mag = x.abs() @ W[0].abs()
            if bias is not None:
                b0 = bias.to(BOUND_DTYPE)[0]
                z, mag = z + b0, mag + b0.abs()
            margin = torch.where(pred == 1, z, -z) - tau_coeff * mag
            scale = 1.0
        else:
            ar = torch.arange(x.shape[0], device=x.device)
            diff = W[pred][:, None, :] - W[None]                                 # (Q, C, d)
            margin = (diff * x[:, None, :]).sum(-1)
            mag = ((W[pred].abs()[:, None, :] + W.abs()[None]) * x.abs()[:, None, :]).sum(-1)
            if bias is not None:
                b64 = bias.to(BOUND_DTYPE)
                margin = margin + (b64[pred][:, None] - b64[None])
                mag = mag + b64[pred].abs()[:, None] + b64.abs()[None]
            margin = margin - tau_coeff * mag
            margin[ar, pred] = torch.inf
            margin = margin.min(-1).values
            scale = math.sqrt(2.0)
        big = (self.center_norm + rho) * (1.0 + 1e-12)
        served = 2.0 * (self.fm.coeff(d_terms + 2) * math.sqrt(2.0) * big * x_norm
                        + self.fm.absolute(d_terms + 2))
        need = (scale * rho * x_norm + served) * (1.0 + 1e-12)
        return margin > need

    def _box_certified(self, feats, pred: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Whether query q is certified in box j[q] (one box per query). feats: exact (Q, ...)
        or Interval (1, Q, ...)."""
        params = {n: Interval(self.lower[n][j], self.upper[n][j]) for n in self.trainable}
        return self.margin_lower_bound(feats, pred, params, self.fm.graded(self.k_float[j])) > 0

    def margin_lower_bound(self, feats, pred: torch.Tensor, params: dict[str, Interval],
                           fm: FloatModel) -> torch.Tensor:
        """Per query q, a lower bound on the served model's margin of its predicted class
        (the logit for a prediction of 1 and minus it for 0; min over other classes of
        z_pred - z_c) over the parameter box `params` (one box per query, leading
        dimension Q). The box test grades each query's pass by its box's k
        (agt/interval.py), so the computed bound is isotone in the box: a box inside it
        tested at a smaller k, such as box(D', k - 1) of a neighbour, or box j - 1 of the
        same bundle (the binary search's premise), gets a bound at least as large.

        Args:
            feats: the inputs of the trainable part (exact, or an Interval behind a prefix).
            pred: (Q,) the served classes.
            params: name -> the Interval box of each trainable parameter, leading dimension Q.
            fm: the float model whose rounding the bound accounts for.

        Returns:
            (Q,) float64 lower bounds; > 0 certifies the query at that box.
        """
        if isinstance(feats, Interval):
            x_box = Interval(feats.lo[0].unsqueeze(1), feats.hi[0].unsqueeze(1))  # (Q, 1, ...)
        else:
            x_box = Interval.exact(feats.unsqueeze(1))
        h = x_box
        for idx, layer in enumerate(self.body.layers):
            gidx = self.body.first + idx
            lp = {s: params[f"{gidx}.{s}"] for s in ("weight", "bias") if f"{gidx}.{s}" in params}
            h, _ = rule_for(layer).forward_bounds(layer, lp, h, fm)
        return self.head_margin(h.map(lambda t: t[:, 0]), pred,
                                params[f"{self.last}.weight"],
                                params.get(f"{self.last}.bias"), fm)

    def head_margin(self, h: Interval, pred: torch.Tensor, W: Interval,
                    bias: Interval | None, fm: FloatModel) -> torch.Tensor:
        """The last layer's part of `margin_lower_bound`: per query q, the lower bound on
        the margin of pred[q] from its hidden box h (Q, in) and last-layer box W (Q, C, in),
        bias (Q, C) or None, by the four-corner products, their sum and the widening for
        the served rounding of both logits (the hidden-layer screen runs this same code,
        agt/certify/hidden_screen.py).

        Args:
            h: (Q, in) the box of the last layer's input per query.
            pred: (Q,) the served classes.
            W: (Q, C, in) the last layer's weight box per query.
            bias: (Q, C) its bias box, or None.
            fm: the float model whose rounding the bound accounts for.

        Returns:
            (Q,) float64 lower bounds on the margin; > 0 certifies the query at that box.
        """
        Q = pred.shape[0]
        if self.n_logits == 1:
            z = iv.mul(W[:, 0], h, fm)
            z = iv.sum_intervals(z, -1, fm)
            if bias is not None:
                z = iv.add(z, bias[:, 0], fm)
            return torch.where(pred == 1, z.lo, -z.hi)
        ar = torch.arange(Q, device=pred.device)
        wc = W[ar, pred]                                                       # (Q, in)
        diff = Interval(wc.lo[:, None, :] - W.hi, wc.hi[:, None, :] - W.lo)   # (Q, C, in)
        hh = h.map(lambda t: t[:, None, :])
        margin = iv.sum_intervals(iv.mul(diff, hh, fm), -1, fm)      # (Q, C)
        mag = ((wc.magnitude()[:, None, :] + W.magnitude()) * hh.magnitude()).sum(-1)
        lo = margin.lo
        if bias is not None:
            bc = bias[ar, pred]
            lo = lo + (bc.lo[:, None] - bias.hi)
            mag = mag + bc.magnitude()[:, None] + bias.magnitude()
        # the served model rounds z_c and z_j separately: widen for both computations
        n_in = W.shape[-1]
        lo = lo - 2.0 * (mag * fm.coeff(n_in + 2) + fm.absolute(n_in + 2)
                         + fm.graded_extra(lo, mag, n_in + 2))
        lo[ar, pred] = torch.inf
        return lo.min(dim=-1).values

    def _query_chunk(self) -> int:
        p = sum(int(self.lower[n][0].numel()) for n in self.trainable)
        width = max(p, self.n_logits * 8)
        if self._hidden:
            # per query and step the screen holds a few rows of the first layer's width
            # (inputs, products) and the per-query boxes of the layers after it
            first = self.body.layers[0]
            rest = p - first.in_features * first.out_features
            cap = _PREFIX_CHUNK if self.prefix.layers else _HIDDEN_CHUNK
            return max(1, min(cap, _HIDDEN_ELEMENTS // (first.in_features + 8 * rest + 1)))
        if self._screen:
            # the screen touches 2 in x C floats per query and step: keep a chunk in cache
            width = max(width, 1 << 6)
            return max(1, min(_SCREEN_CHUNK, _SCREEN_ELEMENTS // width))
        return max(1, _QUERY_ELEMENTS // width)

    @property
    def screen(self) -> LinearMarginScreen | None:
        """The linear margin screen of this bundle, or None where the model has none."""
        if self._screen is True:
            weight, bias = f"{self.last}.weight", f"{self.last}.bias"
            self._screen = LinearMarginScreen(self.lower, self.upper, weight,
                                              bias if bias in self.lower else None,
                                              self.k_float, self.fm)
        return self._screen or None

    @property
    def hidden_screen(self) -> HiddenLayerScreen | None:
        """The hidden-layer screen of this bundle, or None where the model has none."""
        if self._hidden is True:
            body = tuple((self.body.first + i, layer)
                         for i, layer in enumerate(self.body.layers))
            self._hidden = HiddenLayerScreen(self.lower, self.upper, body, self.last,
                                             self.k_float, self.fm, self.head_margin)
        return self._hidden or None

    def _screened_test(self, feats, pred: torch.Tensor, x_mag: torch.Tensor):
        """The test `_certified(feats, pred, j, x_mag)` as a function of j, through the
        linear screen (agt/certify/margin_screen.py) or the hidden-layer screen
        (agt/certify/hidden_screen.py) where the model allows one: the same decisions, with
        only the pairs the screen cannot tell sent to the reference. Those go in a fixed
        number of padded slots per step, so the work per step does not depend on the data
        unless more than `_SCREEN_SLOTS` pairs of a chunk sit within the screen's error bar
        of zero (margins within about 1e-11 of their magnitude from zero)."""
        screen, hidden = self.screen, self.hidden_screen
        if screen is not None:
            x_split, norm1 = screen.split(feats)

            def decide(j):
                return screen.decide(x_split, norm1, pred, j)
        elif hidden is not None:
            parts = hidden.prepare(feats)

            def decide(j):
                return hidden.decide(parts, pred, j)
        else:
            return lambda j: self._certified(feats, pred, j, x_mag)

        n_slots = _SCREEN_SLOTS if screen is not None else _HIDDEN_SLOTS

        def test(j: torch.Tensor) -> torch.Tensor:
            sure, unsure = decide(j)
            ok = sure & self._fits_dtype(x_mag, j)
            return self._refer_unsure(ok, unsure, feats, pred, j, x_mag, n_slots)

        return test

    def _refer_unsure(self, ok: torch.Tensor, unsure: torch.Tensor, feats, pred: torch.Tensor,
                      box: torch.Tensor, x_mag: torch.Tensor, n_slots: int,
                      query: torch.Tensor | None = None) -> torch.Tensor:
        """``ok`` with the pairs a screen could not tell (``unsure``) decided by the
        reference, `_certified`, in padded slots: max(n, ceil(u / n) n) pairs for u of
        them (n = ``n_slots``), so the work does not depend on which pairs they are.
        Pair i is query ``query[i]`` (i itself where None) at grid index ``box[i]``."""
        idx = unsure.nonzero().flatten()
        slots = max(n_slots, -(-idx.numel() // n_slots) * n_slots)
        padded = torch.zeros(slots, dtype=idx.dtype, device=idx.device)
        padded[:idx.numel()] = idx
        q = padded if query is None else query[padded]
        rows = feats.map(lambda t: t[:, q]) if isinstance(feats, Interval) else feats[q]
        ref = self._certified(rows, pred[q], box[padded], x_mag[q])
        ok[idx] = ref[:idx.numel()]
        return ok

    def _table_width(self) -> int | None:
        """Floats per (query, box) pair of a verdict table (its cost per pair, for
        `_TABLE_ELEMENTS` and `_HIDDEN_TABLE_ELEMENTS`), None where the model has no
        screen: the linear screen's gathered columns (2 in x C), the hidden-layer screen's
        parameters of one box (the first layer's products, the per-pair boxes of the
        layers after it)."""
        if self._screen:
            weight = self.lower[f"{self.last}.weight"]
            return 2 * int(weight.shape[2]) * int(weight.shape[1])
        if self._hidden:
            return sum(int(self.lower[n][0].numel()) for n in self.trainable)
        return None

    def _verdict_table(self, feats, pred: torch.Tensor, x_mag: torch.Tensor):
        """(Q, K) bool: the test `_certified(feats, pred, j, x_mag)` of every query at every
        grid index j, in one pass; None where the model has no screen (the reference's
        passes are then the cost, and one over Q K pairs saves nothing).

        The same decisions as the search's per-step test (`_screened_test`): the screen's
        `decide_grid` decides each pair by the same formulas and bar as `decide` (wherever
        the screen decides a pair its decision is the reference's, whatever pairs are
        tested beside it), the overflow test is per pair, and the pairs the
        screen cannot tell go to the reference in padded slots, max(n, ceil(u / n) n) for
        u of them (n = `_SCREEN_SLOTS` or `_HIDDEN_SLOTS`), so the work is that of Q K
        pairs and n reference slots whatever the radii, unless more than n pairs of the
        table sit within the screen's error bar of zero."""
        screen, hidden = self.screen, self.hidden_screen
        if screen is not None:
            sure, unsure = screen.decide_grid(*screen.split(feats), pred)
            n_slots = _SCREEN_SLOTS
        elif hidden is not None:
            sure, unsure = hidden.decide_grid(hidden.prepare(feats), pred)
            n_slots = _HIDDEN_SLOTS
        else:
            return None
        Q, K = sure.shape
        query, box = grid_pairs(Q, K, pred.device)                       # row q K + k
        ok = sure.flatten() & self._fits_dtype(x_mag.index_select(0, query), box)
        ok = self._refer_unsure(ok, unsure.flatten(), feats, pred, box, x_mag, n_slots, query)
        return ok.reshape(Q, K)

    # -- public ---------------------------------------------------------------------------
    def certify(self, x, radii: bool = True) -> Certificate:
        """Binary search for the largest certified box per query (owner-only result).

        Per chunk of queries, ceil(log2(K + 1)) steps whatever the radii, each testing one
        box per query. Where the chunk's (query, box) pairs times the screen's floats per
        pair stay within `_TABLE_ELEMENTS` (`_HIDDEN_TABLE_ELEMENTS` behind hidden layers:
        about 100 Blobs queries, one query of a small network), every pair is tested in
        one pass instead (`_verdict_table`: the work of Q K pairs, whatever the radii) and
        the steps read their answers from it: each pair's answer is the per-step test's,
        so the radii are the same, and a small batch pays one pass of fixed operator
        overhead instead of one per step.

        Args:
            x: the queries, (Q, *features), in the original units.
            radii: False for the nominal predictions only (radius and max_certified_k None),
                for releases that spend no radius.

        Returns:
            The `Certificate`.

        Raises:
            DataError: queries of another feature shape, or with NaN or infinite values.
        """
        xq = self._check_queries(x)
        with torch.no_grad(), strict_kernels(self.device):
            z = self._served_logits(xq)
            pred = predicted_classes(z)
            if not radii:
                return self._finish(pred, None)
            best = torch.full((xq.shape[0],), -1, dtype=torch.int64, device=self.device)
            step = self._query_chunk()
            K = len(self.k_values)
            x_mag = _query_magnitude(xq)
            width = self._table_width()
            budget = _HIDDEN_TABLE_ELEMENTS if self._hidden else _TABLE_ELEMENTS
            for q0 in range(0, xq.shape[0], step):
                sl = slice(q0, q0 + step)
                feats = self._features(xq[sl])
                p = pred[sl]
                # a small chunk: every (query, box) verdict in one pass, then the same
                # search reads them (`_verdict_table`; the same verdicts, so the same radii)
                table = (self._verdict_table(feats, p, x_mag[sl])
                         if width is not None and p.shape[0] * K * width <= budget
                         else None)
                if table is not None:
                    def test(j, table=table):
                        return table.gather(1, j[:, None]).squeeze(1)
                else:
                    test = self._screened_test(feats, p, x_mag[sl])
                lo = torch.zeros_like(p)            # candidate range [lo, hi] for the answer+1
                hi = torch.full_like(p, K)
                # invariant: boxes < lo certified (as far as tested), boxes >= hi not. Always
                # ceil(log2(K + 1)) steps, whatever the radii: the search's duration must not
                # tell a radius apart (a service answers refused and cached queries too); a
                # verdict table's work is that of all Q K pairs, whatever the radii
                for _ in range(K.bit_length()):
                    mid = (lo + hi) // 2
                    active = lo < hi
                    ok = test(mid.clamp(max=K - 1)) & active
                    lo = torch.where(ok, mid + 1, lo)
                    hi = torch.where(active & ~ok, mid, hi)
                best[sl] = lo - 1
        return self._finish(pred, best)

    def certify_linear(self, x) -> Certificate:
        """Reference: test every box in order; k* = the last k of the certified prefix.

        Args:
            x: the queries, (Q, *features).

        Returns:
            The `Certificate` (equal to `certify`'s; slower, for tests).
        """
        xq = self._check_queries(x)
        with torch.no_grad(), strict_kernels(self.device):
            z = self._served_logits(xq)
            pred = predicted_classes(z)
            feats = self._features(xq)
            x_mag = _query_magnitude(xq)
            alive = torch.ones_like(pred, dtype=torch.bool)
            best = torch.full_like(pred, -1)
            for j in range(len(self.k_values)):
                ok = self._certified(feats, pred, torch.full_like(pred, j), x_mag) & alive
                best = torch.where(ok, torch.full_like(best, j), best)
                alive = ok
        return self._finish(pred, best)

    def _finish(self, pred: torch.Tensor, best_index: torch.Tensor | None) -> Certificate:
        idx = max_k = None
        if best_index is not None:
            idx = best_index.cpu().numpy().astype(np.int64)
            kv = np.asarray(self.k_values, dtype=np.int64)
            max_k = np.where(idx >= 0, kv[np.clip(idx, 0, None)], -1).astype(np.int64)
        b = self.bundle
        relations = ("replace-one",) if self.trajectory is not None else tuple(b.relations)
        return Certificate(pred.cpu().numpy(), max_k, idx, self.k_values,
                           self.contiguous, self.spec.n_classes, b.bundle_id,
                           b.protected_dataset_sha256, relations, b.smooth_radii,
                           b.selection)


def _hidden_screen_fits(body: Network, lower: dict[str, torch.Tensor],
                        upper: dict[str, torch.Tensor]) -> bool:
    """Whether the hidden-layer screen covers this trainable part: linear and ReLU layers,
    the first linear, and tables within `HiddenLayerScreen.fits`."""
    layers = body.layers
    return (bool(layers) and layers[0].kind == "linear"
            and all(layer.kind in ("linear", "relu") for layer in layers)
            and HiddenLayerScreen.fits(lower, upper, body.first))


def _query_magnitude(xq: torch.Tensor) -> torch.Tensor:
    """(Q,) float64: the largest |entry| of each query as the served dtype holds it."""
    return xq.abs().flatten(1).amax(1).to(BOUND_DTYPE) if xq.numel() else \
        torch.zeros(xq.shape[0], dtype=BOUND_DTYPE, device=xq.device)


def check_served_model(bundle: Bundle, served) -> None:
    """Refuse a served model whose architecture or nominal parameters differ from the bundle."""
    state = served.state_dict() if isinstance(served, torch.nn.Module) else dict(served)
    expected = bundle.spec.param_shapes
    if set(state) != set(expected):
        raise BundleError(f"served model parameters {sorted(state)} do not match the bundle's "
                          f"{sorted(expected)}: different architecture")
    for name, value in state.items():
        ref = bundle.nominal[name]
        if tuple(value.shape) != tuple(ref.shape):
            raise BundleError(f"served parameter '{name}' has shape {tuple(value.shape)}, the "
                              f"bundle has {tuple(ref.shape)}")
        if not torch.equal(value.detach().cpu().to(ref.dtype), ref):
            raise BundleError(f"served parameter '{name}' differs from the bundle's nominal "
                              f"parameters: the certificates do not apply to this model")
