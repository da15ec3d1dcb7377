"""Experiment (issue 12, not in the engine): relational (zonotope) training bounds for a
trainable linear layer. Measured by benchmarks/bench_wrapping.py to be *looser* than the
interval method on the tasks tried, so it was not made a bound method; kept here, outside
``agt``, as the record of the attempt and a starting point. Its soundness rests on the
argument below and on one run-time check (the nominal trajectory stays in every hull); it
has no falsification tests, and nothing in ``agt`` or ``mechanisms`` imports it.
Measured (README, "Tighter certificates"): on 10-class digits its median half-width stays
below the interval box's for five steps, then clamp-straddling records (slope anywhere in
[0, 1], a first-order error) and the quadratic linearisation error feed back and it explodes;
on the 768-d IMDB-like head the nesting term kappa (every replacement charged for the worst
record of the feature domain) makes it 10x looser at k = 10.

Why. The interval method bounds one SGD step coordinate by coordinate: a box of half-widths
h becomes a box of half-widths about |J| h, |J| the elementwise magnitude of the step
Jacobian J = I - eta A (eta = lr / b, A the batch's summed Hessian of the clamped loss). On
10-class digits |J| has row sums of about 5.5 while J itself has spectral radius 1.0 and
2-norm 1.1 (benchmarks/bench_tightness.py's task digits10_linear): the box grows 3.7x per
step ("wrapping"), the set of reachable parameters barely at all. A zonotope
Z = {c + G e : e in [-1, 1]^m} is carried through the step by the *matrix* J, so the
directions that contract or cancel stay correlated.

Scope: the trainable part is one linear layer (optionally with bias) on exact features,
loss binary or multi-class cross-entropy, optimizer ``sgd`` (with L2), any batch size,
nominal dtype float32 or float64. Parameters are handled as theta = [W | b] (C x d~ with
x~ = [x, 1]); P = C d~.

The step (one batch B of b records, distance k, eta = lr_t / b, l = lr_t * l2). For a box
X = hull(Z) = c +- h, h = |G| 1, and every record i of B:

* f_i = clamp(g_i(c)) (the clamped exact gradient at the centre, an interval for float64
  rounding);
* S_i (over record i's logit box over Z itself, `logit_radii`), an interval matrix containing diag(s_i) J_g,i(xi) for all xi in X: the clamp slopes
  s_i (1 where g_i stays in [-gamma, gamma] over X, 0 where it stays clipped on one side,
  [0, 1] otherwise) times the Jacobian of the exact gradient, S_i[(a,u),(c,v)] =
  s_i[a,u] * dp_a/dz_c * x~_u x~_v, with dp_a/dz_c = p_a (delta_ac - p_c) enclosed over the
  logit box of record i. Integral mean-value form: clamp g_i(theta) - clamp g_i(c)
  = T (theta - c) for some T in S_i, for every theta in X.
* err_i: the gap between the nominal float per-sample clamped gradient and the exact one,
  for any theta in X (the rounding model of agt/interval.py and agt/bounded/losses.py).
* L_i = f_i +- (|S_i| h + err_i): an enclosure of record i's nominal clamped gradient on X.

With A = sum_i mid(S_i), E = sum_i (rad(S_i) h + err_i), F = sum_i f_i, the step is

    F_{B,k}(Z) = (1 - l) c - eta mid(F) + eta mid(R)  +  [(I (1 - l) - eta A) G,  diag(rho)],
    rho = eta (rad(F) + E + rad(R)) + rounding of the nominal update and of this computation,

    R = [ -sum of the k largest (-L_i^L + kappa),  sum of the k largest (L_i^U + kappa) ],
    kappa = gamma + 2 Gamma(h) + 4 eps(h),

where Gamma(h) >= |S_j| h and eps(h) >= err_j bound the linear radius and the float error of
*any* record j of the declared feature domain |x_u| <= feature_bound (Gamma[a,u] =
B~_u min(max_c Q_c / 2, sum_c Q_c / 4), Q_c = sum_v B~_v h[c,v]; |dp_a/dz_c| <= 1/4 and
sum_c |dp_a/dz_c| <= 1/2).

Soundness (validity, Def. 4.3). Let theta be in Z and B'' = B - Rm + N with |Rm| = |N| <= k.
The nominal update is theta - eta sum_{B''} clamp(fl g(theta)) - l theta up to its rounding
(in rho), and sum_{B''} = sum_B - sum_Rm + sum_N. sum_B clamp fl g_i(theta) lies in
F + A (theta - c) +- E by the mean-value form (T - mid S_i is bounded by rad S_i, |theta - c|
<= h) and the err_i. sum_Rm - sum_N lies in R: each removed record contributes at most
L_i^U, each added one at most gamma (clamp), and L_i^U + gamma <= L_i^U + kappa, all terms
>= 0 (L_i^U >= f_i >= -gamma), so the k largest are the worst case; the same on the lower
side. theta - c = G e, so the image is c-part + (I(1-l) - eta A) G e + a vector bounded by
rho: inside F_{B,k}(Z). Induction over the steps from the exact initialisation, and the
float64 rounding of every operation here is added to rho (GEMM: gamma_P |M| h as a box).

Nesting (r(D') >= r(D) - 1, in exact arithmetic like the interval method's proof in
agt/topk.py). Claim: Z' inside Z (as sets) and B' = B - {j} + {j'} (one record replaced, j'
in the declared domain) imply F_{B',k-1}(Z') inside F_{B,k}(Z). Write c', h', S'_i, L'_i for
the quantities on Z'. Hull inclusion gives |c' - c| + h' <= h, hence S'_i inside S_i
(inclusion-isotone interval arithmetic), |mid S_i - mid S'_i| <= rad S_i - rad S'_i, L'_i
inside L_i, Gamma(h') <= Gamma(h), eps(h') <= eps(h). Take the point of F_{B',k-1}(Z') with
theta' in Z' and write it as a point of F_{B,k}(Z) with the same theta = theta' (in Z).
The difference, divided by eta, is
  sum_{i != j} [(mid S_i - T_i)(c' - c) + (mid S_i - mid S'_i)(theta' - c') + e'_i]
    + [f_j + mid S_j (theta' - c)] - [f_j' + mid S'_j' (theta' - c') + e'_j'] + r'
with f_i(c') = f_i(c) + T_i (c' - c), T_i in S_i. The bracket of i != j is bounded by
rad S_i (|c' - c| + h') <= rad S_i h: inside E's share of record i. The j-term lies in L_j,
the j'-term in L'_j', a set of width <= 2 Gamma(h) + 4 eps(h) around a point of
[-gamma, gamma] (plus the width of the interval f_j', at most 2 eps: eps covers the
transcendental slack of the probabilities). It remains that L_j - L'_j' + R'_{k-1} is inside R_k (upper side; the
lower one is symmetric), with u_i = L_i^U + kappa, u'_i <= u_i for i != j:
  j' not among the selected of R'_{k-1}: L_j^U - L'^L_j' + top_{k-1}(u') <= u_j + top_{k-1,
  B - j}(u) <= top_k(u), as -L'^L_j' <= gamma + Gamma + eps <= kappa;
  j' selected: L_j^U - L'^L_j' + u'_j' + top_{k-2, B-j}(u) <= L_j^U + 2 Gamma + 4 eps + kappa
  + top_{k-2}, and top_k(u) >= u_j + min_i u_i + top_{k-2} >= L_j^U + kappa + (kappa - gamma)
  + top_{k-2}: holds as kappa - gamma = 2 Gamma + 4 eps.
By induction over the steps Z(D', k-1) is inside Z(D, k) (and Z(D, k) inside Z(D, k+1):
R_k inside R_{k+1}). A bound method would store the interval hull of Z intersected with the
interval method's box; hulls and intersections of nested families are nested, so the radius
of such a bundle would keep r(D') >= r(D) - 1 (agt/training.py, `served_k0_box`, for k = 0). The declared
feature domain is part of the relation: a neighbour's replaced record must satisfy
|x_u| <= feature_bound, which `zonotope_boxes` checks for every training record.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agt.bounded.losses import softmax_bounds, transcendental_slack
from agt.errors import ConfigError, DataError, SoundnessError
from agt.interval import BOUND_DTYPE, FloatModel, Interval, gamma

_U64 = 2.0**-53
_TINY = torch.finfo(torch.float64).tiny


def _up(x: torch.Tensor, n_terms: int) -> torch.Tensor:
    """Round a float64 sum of n non-negative terms up to a rigorous upper bound."""
    return x * (1.0 + gamma(n_terms + 2, _U64)) + (n_terms + 2) * _TINY


@dataclass(frozen=True)
class LinearTask:
    """The linear model's training problem as the zonotope steps see it."""

    loss: str                 # "binary_cross_entropy" | "cross_entropy"
    n_logits: int             # C
    bias: bool
    gamma: float              # clamp bound
    l2: float
    feature_bound: float      # B: every record of the domain has |x_u| <= B
    fm: FloatModel

    @property
    def slope_bound(self) -> float:
        """sup |d softmax / dz| summed over a row (CE: 1/2) or sigmoid' (BCE: 1/4)."""
        return 0.25 if self.loss == "binary_cross_entropy" else 0.5


def extended(x: torch.Tensor, bias: bool) -> torch.Tensor:
    """x~ = [x, 1] (or x without a bias), float64 exact."""
    x = x.to(BOUND_DTYPE)
    if not bias:
        return x
    return torch.cat([x, torch.ones(x.shape[0], 1, dtype=BOUND_DTYPE, device=x.device)], 1)


def half_widths(G: torch.Tensor) -> torch.Tensor:
    """h = |G| 1, rounded up (the interval hull's half-widths)."""
    if G.shape[1] == 0:
        return torch.zeros(G.shape[0], dtype=BOUND_DTYPE, device=G.device)
    return _up(G.abs().sum(1), G.shape[1])


def logit_radii(xt: torch.Tensor, G: torch.Tensor, h: torch.Tensor, chunk: int = 256
                ) -> torch.Tensor:
    """q[i, c] = max |x~_i . (theta_c - c_c)| over theta in Z = |x~_i^T G_c| 1, the exact radius
    of record i's logit c over the zonotope (not over its hull: the hull forgets the
    correlations that keep logits tight), rounded up; h (C, d~): Z's half-widths. (b, C)."""
    b, dt = xt.shape
    n_logits, m = h.shape[0], G.shape[1]
    if m == 0:
        return torch.zeros(b, n_logits, dtype=BOUND_DTYPE, device=xt.device)
    Gc = G.reshape(n_logits, dt, m)
    out = torch.empty(b, n_logits, dtype=BOUND_DTYPE, device=xt.device)
    for i0 in range(0, b, chunk):
        proj = torch.einsum("iu,cum->icm", xt[i0:i0 + chunk], Gc)
        out[i0:i0 + chunk] = proj.abs().sum(-1)
    # rounding of each inner product (<= gamma_dt |x~| |G| summed over m) and of the sum
    out = out + gamma(dt + 2, _U64) * (xt.abs() @ h.T)
    return _up(out, m)


def _jacobian_enclosure(p_lo: torch.Tensor, p_hi: torch.Tensor, loss: str):
    """Interval of dp_a/dz_c = p_a (delta_ac - p_c) over p in the box [p_lo, p_hi]: (b, C, C)."""
    # diagonal p (1 - p): concave, minimum at an end, maximum 1/4 at p = 1/2
    end_lo, end_hi = p_lo * (1 - p_lo), p_hi * (1 - p_hi)
    d_lo = torch.minimum(end_lo, end_hi)
    half_in = (p_lo <= 0.5) & (p_hi >= 0.5)
    d_hi = torch.where(half_in, torch.full_like(p_lo, 0.25), torch.maximum(end_lo, end_hi))
    if loss == "binary_cross_entropy":
        return d_lo[..., None], d_hi[..., None]
    j_lo = -(p_hi[:, :, None] * p_hi[:, None, :])
    j_hi = -(p_lo[:, :, None] * p_lo[:, None, :])
    eye = torch.eye(p_lo.shape[1], dtype=torch.bool, device=p_lo.device)
    j_lo = torch.where(eye, torch.diag_embed(d_lo), j_lo)
    j_hi = torch.where(eye, torch.diag_embed(d_hi), j_hi)
    # float64 rounding of these products: a few ulps of values <= 1
    return j_lo - 8 * _U64, j_hi + 8 * _U64


def _prob_bounds(z_lo: torch.Tensor, z_hi: torch.Tensor, loss: str, slack: float):
    """Probability bounds over a logit box (b, C), widened by the transcendental slack (so
    they hold for the exact and for the nominal float evaluation, agt/bounded/losses.py)."""
    if loss == "binary_cross_entropy":
        lo, hi = torch.sigmoid(z_lo), torch.sigmoid(z_hi)
    else:
        lo, hi = softmax_bounds(Interval(z_lo, z_hi))
    return (lo - slack).clamp(0.0, 1.0), (hi + slack).clamp(0.0, 1.0)


def _grad_box(p_lo, p_hi, onehot, xt, widen):
    """Per-sample gradient (p - y) x~_u over the probability box: (b, C, d~) lo, hi."""
    e_lo = (p_lo - onehot)[:, :, None]
    e_hi = (p_hi - onehot)[:, :, None]
    x = xt[:, None, :]
    a, b_ = e_lo * x, e_hi * x
    lo, hi = torch.minimum(a, b_), torch.maximum(a, b_)
    mag = torch.maximum(lo.abs(), hi.abs())
    return lo - widen * mag - _TINY, hi + widen * mag + _TINY


def zonotope_step(c: torch.Tensor, G: torch.Tensor, xt: torch.Tensor, y: torch.Tensor, k: int,
                  lr: float, task: LinearTask, stats: dict | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step of the zonotope (c (C, d~), G (P, m)) on batch (xt (b, d~), y (b,)) for
    distance k: returns (c', G') with G' = [M G, diag(rho)] (module docstring). ``stats``
    receives where the new error generators come from (for bench_wrapping.py)."""
    fm = task.fm
    C, dt = c.shape
    P = C * dt
    b = xt.shape[0]
    eta = lr / b
    u = fm.unit_roundoff
    slack = transcendental_slack(fm, C)
    h = half_widths(G).reshape(C, dt)
    xa = xt.abs()
    theta_mag = c.abs() + h                                       # |theta| over the hull
    # logit boxes over the hull, and the centre's logits (float64 rounding widened)
    zc = xt @ c.T
    round_z = gamma(dt + 2, _U64) * (xa @ c.abs().T) + _TINY * (dt + 2)
    q = logit_radii(xt, G, h)                                     # (b, C) over Z itself
    onehot = (torch.nn.functional.one_hot(y, C).to(BOUND_DTYPE) if task.loss == "cross_entropy"
              else y.to(BOUND_DTYPE)[:, None])
    p_lo, p_hi = _prob_bounds(zc - q - round_z, zc + q + round_z, task.loss, slack)
    pc_lo, pc_hi = _prob_bounds(zc - round_z, zc + round_z, task.loss, slack)
    widen = gamma(4, _U64)
    # clamp slopes from the gradient range over the hull
    g_lo, g_hi = _grad_box(p_lo, p_hi, onehot, xt, widen)
    gam = task.gamma
    one = (g_lo >= -gam) & (g_hi <= gam)
    zero = (g_lo >= gam) | (g_hi <= -gam)
    # clamped gradient at the centre (interval for rounding and the slack)
    f_lo, f_hi = _grad_box(pc_lo, pc_hi, onehot, xt, widen)
    f_lo, f_hi = f_lo.clamp(-gam, gam), f_hi.clamp(-gam, gam)
    # T = s * dp/dz: (b, C, d~, C)
    j_lo, j_hi = _jacobian_enclosure(p_lo, p_hi, task.loss)
    j_lo, j_hi = j_lo[:, :, None, :], j_hi[:, :, None, :]
    one_, zero_ = one[..., None], zero[..., None]
    zeros = torch.zeros((), dtype=BOUND_DTYPE, device=c.device)
    t_lo = torch.where(one_, j_lo, torch.where(zero_, zeros, j_lo.clamp_max(0.0)))
    t_hi = torch.where(one_, j_hi, torch.where(zero_, zeros, j_hi.clamp_min(0.0)))
    del j_lo, j_hi, one_, zero_
    t_mid, t_rad = Interval(t_lo, t_hi).midrad()
    del t_lo, t_hi
    t_rad = t_rad + gamma(b + 4, _U64) * t_mid.abs()            # rounding of A's sums
    t_mag = t_mid.abs() + t_rad
    # A = sum_i mid T_i[a,u,c] x~_u x~_v  ->  (C, d~, C, d~)
    Y = (t_mid * xt[:, None, :, None]).reshape(b, C * dt * C)
    A = (Y.T @ xt).reshape(C, dt, C, dt).reshape(P, P)
    del Y, t_mid
    # per-sample float error of the nominal clamped gradient, for any theta in the hull
    dz = (fm.coeff(dt) * (xa @ theta_mag.T) + fm.absolute(dt)).amax(1)       # (b,)
    err_scalar = slack + task.slope_bound * dz + 2.02 * u + 4 * _TINY
    err = xa[:, None, :] * err_scalar[:, None, None]                         # (b, 1, d~)
    # linear radius |S_i| h and its rad part, per sample: |x~_u| sum_c T[.,a,u,c] q[., c]
    lin_rad = _up(xa[:, None, :] * torch.einsum("iauc,ic->iau", t_mag, q), C + 2)
    E_rad = _up(torch.einsum("iu,iauc,ic->au", xa, t_rad, q), b * C + 2)
    if stats is not None:
        straddle = (~one & ~zero)[..., None]
        E_str = torch.einsum("iu,iauc,ic->au", xa, t_rad * straddle, q)
        stats.update(straddle_fraction=float(straddle.double().mean()),
                     clamp_share=float(E_str.sum() / E_rad.sum().clamp_min(_TINY)))
    del t_mag, t_rad
    L_lo = f_lo - lin_rad - err
    L_hi = f_hi + lin_rad + err
    # the declared domain's worst record: Gamma(h), eps(h)
    bt = torch.full((dt,), float(task.feature_bound), dtype=BOUND_DTYPE, device=c.device)
    if task.bias:
        bt[-1] = 1.0
    Q = _up(h @ bt, dt)                                                      # (C,)
    row = torch.minimum(task.slope_bound * Q.max(), 0.25 * Q.sum()) if C > 1 else 0.25 * Q[0]
    Gam = bt * row * (1.0 + 1e-6)                                           # (d~,)
    dz_max = float((fm.coeff(dt) * (theta_mag @ bt) + fm.absolute(dt)).max())
    eps_dom = bt * (slack + task.slope_bound * dz_max + 2.02 * u + 4 * _TINY)
    kappa = gam * (1.0 + 4 * _U64) + 2.0 * Gam + 4.0 * eps_dom + 8 * gam * _U64   # (d~,)
    # replacement term R (per parameter (a, u)): k largest of L^U + kappa and of -L^L + kappa
    if k > 0:
        if k > b:
            raise ConfigError(f"distance k = {k} exceeds the batch size {b}")
        r_hi = _up(torch.topk((L_hi + kappa).reshape(b, P), k, dim=0).values.sum(0), k)
        r_lo = -_up(torch.topk((kappa - L_lo).reshape(b, P), k, dim=0).values.sum(0), k)
    else:
        r_hi = r_lo = torch.zeros(P, dtype=BOUND_DTYPE, device=c.device)
    r_mid, r_rad = Interval(r_lo, r_hi).midrad()
    F_mid, F_rad = Interval(f_lo.sum(0).reshape(P), f_hi.sum(0).reshape(P)).midrad()
    F_rad = F_rad + _up(gamma(b + 2, _U64) * torch.maximum(f_lo.abs(), f_hi.abs()).sum(0)
                        .reshape(P), 1)
    E = E_rad.reshape(P) + _up((err.expand(b, C, dt)).sum(0).reshape(P), b)
    # linear part M = (1 - l) I - eta A and its product with G
    shrink = 1.0 - lr * task.l2
    M = -eta * A
    M.diagonal().add_(shrink)
    G_lin = M @ G if G.shape[1] else G
    hv = h.reshape(P)
    gemm_round = _up(gamma(P + 4, _U64) * (M.abs() @ hv), P)
    # nominal update rounding: d = fl(sum / b) (float64 sum, cast), theta - lr (d + l2 theta)
    tm = theta_mag.reshape(P)
    nominal_round = (4.0 * u * (tm + lr * (gam + task.l2 * tm))
                     + lr * (gamma(b + 2, _U64) + u) * gam + 8 * _TINY)
    c_flat = c.reshape(P)
    c_new = shrink * c_flat - eta * F_mid + eta * r_mid
    c_round = gamma(6, _U64) * (abs(shrink) * c_flat.abs() + eta * F_mid.abs() + eta * r_mid.abs())
    rho = eta * (F_rad + E + r_rad) + gemm_round + nominal_round + c_round
    rho = _up(rho, 8) + _TINY
    G_new = torch.cat([G_lin, torch.diag(rho)], 1)
    if stats is not None:
        stats.update(half_width=float(h.median()), linearisation=float((eta * E_rad).median()),
                     float_error=float((eta * (E - E_rad.reshape(P))).median()),
                     replacement=float((eta * r_rad).median()),
                     kappa_over_gamma=float(kappa.max() / gam))
    return c_new.reshape(C, dt), G_new


def hull(c: torch.Tensor, G: torch.Tensor) -> Interval:
    """Interval hull of the zonotope, outward-rounded: (C, d~)."""
    h = half_widths(G).reshape(c.shape)
    pad = gamma(2, _U64) * (c.abs() + h) + _TINY
    return Interval(c - h - pad, c + h + pad)


def check_domain(x: torch.Tensor, feature_bound: float) -> None:
    """Every training record must lie in the declared domain |x_u| <= feature_bound."""
    worst = float(x.abs().max()) if x.numel() else 0.0
    if worst > feature_bound:
        raise DataError(f"bound_method zonotope: a training feature has |x| = {worst:g} > "
                        f"feature_bound = {feature_bound:g}; the certificate covers neighbours "
                        f"whose records lie in the declared domain |x| <= feature_bound, so "
                        f"set feature_bound to a public bound of the data (or rescale it)")


def zonotope_boxes(x: torch.Tensor, y: torch.Tensor, init_w: torch.Tensor,
                   init_b: torch.Tensor | None, batches: list, lrs: list[float],
                   k_values: tuple[int, ...], task: LinearTask,
                   trajectory: list | None = None, progress=None,
                   stats: dict | None = None) -> dict[int, Interval]:
    """Hull boxes (C, d~) of the zonotopes after every batch of ``batches`` for each k >= 1
    of ``k_values``. ``trajectory``: the nominal theta (C, d~) after each step, checked to lie
    in every hull (an internal soundness check). ``stats``: k -> list of per-step records of
    `zonotope_step`."""
    check_domain(x, task.feature_bound)
    xt_all = extended(x, task.bias)
    w0 = init_w.to(BOUND_DTYPE)
    c0 = torch.cat([w0, init_b.to(BOUND_DTYPE)[:, None]], 1) if task.bias else w0.clone()
    P = c0.numel()
    out = {}
    for k in k_values:
        if k == 0:
            continue
        c, G = c0.clone(), torch.zeros(P, 0, dtype=BOUND_DTYPE, device=c0.device)
        for step, (idx, lr) in enumerate(zip(batches, lrs)):
            record = {} if stats is not None else None
            c, G = zonotope_step(c, G, xt_all[idx], y[idx], k, lr, task, record)
            if stats is not None:
                stats.setdefault(k, []).append(record)
            if trajectory is not None:
                box = hull(c, G)
                theta = trajectory[step].to(BOUND_DTYPE)
                if not bool(((box.lo <= theta) & (theta <= box.hi)).all()):
                    raise SoundnessError(f"internal soundness check failed: the nominal "
                                         f"parameters left the zonotope of k = {k} at step "
                                         f"{step}; refusing to write certificates")
            if progress is not None:
                progress()
        out[k] = hull(c, G)
    return out
