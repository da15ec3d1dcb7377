"""Optimizer updates: the nominal rule (training dtype) and its sound interval twin.

Nominal rule (PyTorch ``torch.optim.SGD`` semantics, all constants rounded once to the
training dtype): with d the mean clamped gradient,

    g = d + l2 * theta
    sgd:   theta <- theta - lr_t * g
    sgdm:  v <- g                      at the first step,
           v <- momentum * v + (1 - dampening) * g   afterwards,
           dir = g + momentum * v (nesterov) or v;   theta <- theta - lr_t * dir

Interval rule. Each new quantity is an affine function of the *independent* boxes
[theta], [v], [d] in which every variable appears once, e.g. for sgdm after the first step

    theta' = (1 - lr c l2) theta - lr c d - lr m2 v,   c = 1 + momentum (1 - dampening)
                                                       (nesterov; c = 1 - dampening, m2 =
                                                       momentum otherwise),

so evaluating it with interval arithmetic gives its exact range over the boxes (sound
and inclusion-isotone, also with momentum *and* L2: no dependency between theta and v is
lost that the nominal computation would exploit). The result is widened for the rounding
of the nominal dtype (each term sees at most 8 roundings) and of float64, relative to the
magnitudes of the nominal computation's *intermediates*: theta enters once as itself and
once through lr c l2 theta, so its magnitude coefficient is 1 + |lr c l2|, not
|1 - lr c l2| (which cancels when lr c l2 is near 1 while the roundings of d + l2 theta and
of lr g stay of size u |theta|: `magnitude_coefficients`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agt.config import TrainConfig
from agt.interval import FloatModel, Interval

_N_OPS = 8


def round_to(value: float, dtype: torch.dtype) -> float:
    """The value the nominal computation actually uses for a Python constant."""
    return float(torch.tensor(value, dtype=dtype).item())


@dataclass(frozen=True)
class PublicMagnitudes:
    """`UpdateRule.public_magnitudes`: per step t = 0..T the bound on every entry of each
    parameter tensor (``params[t][name]``) and velocity (``velocity[t][name]``) of the
    nominal run on any dataset, and per update the largest intermediate (``worst[t]``)."""

    params: list[dict[str, float]]
    velocity: list[dict[str, float]]
    worst: list[float]


@dataclass(frozen=True)
class UpdateRule:
    optimizer: str
    l2: float
    momentum: float
    damp1: float          # 1 - dampening, rounded
    nesterov: bool

    @staticmethod
    def from_config(cfg: TrainConfig, dtype: torch.dtype) -> "UpdateRule":
        return UpdateRule(cfg.optimizer, round_to(cfg.l2_reg, dtype), round_to(cfg.momentum, dtype),
                          round_to(1.0 - cfg.dampening, dtype), cfg.nesterov)

    # -- nominal --------------------------------------------------------------------------
    def nominal(self, theta: torch.Tensor, buf: torch.Tensor | None, d: torch.Tensor,
                lr: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        g = d + self.l2 * theta if self.l2 != 0.0 else d
        if self.optimizer == "sgd":
            return theta - lr * g, None
        if buf is None:
            buf = g.clone()
        else:
            buf = buf * self.momentum + g * self.damp1
        direction = g + self.momentum * buf if self.nesterov else buf
        return theta - lr * direction, buf

    def public_magnitudes(self, start: dict[str, float], lrs: list[float], d_max: float,
                          dtype: torch.dtype) -> "PublicMagnitudes":
        """Bounds on |theta_t| and |v_t| per parameter tensor that hold for the nominal run
        on *every* dataset, from the config alone: ``start`` the largest |entry| of each
        initial tensor, ``lrs`` the rounded learning rate of every step, ``d_max`` a bound
        on every entry of the mean clamped gradient d whatever the records (the nominal
        rule clamps the mean too, agt/training.py), ``dtype`` the nominal dtype.

        Recursion (the nominal rule above, |.| of each intermediate; m = |momentum|, a =
        |1 - dampening|): G = d_max + l2 P_t for g; sgd: P_{t+1} = P_t + lr G; sgdm:
        V_{t+1} = G at the first step, m V_t + a G afterwards, dir = G + m V_{t+1}
        (nesterov) or V_{t+1}, P_{t+1} = P_t + lr dir. Rounding: every operation of the
        nominal rule (a product or a sum) is off by at most u |x| + eta (to nearest; eta
        half the smallest subnormal step of the dtype, the absolute error of a product that
        underflows: without it a zero weight stepped by a subnormal lr d exceeded the bound,
        found by a review), and its mirror in this float64 recursion by at most as much, so
        the result q of each is charged as q (1 + 32 u) + 16 eta, generously.
        ``worst[t]``: the largest intermediate of update t (g, the velocity terms, the
        direction, lr dir, the new parameters)."""
        info = torch.finfo(dtype)
        u = info.eps / 2.0
        eta = max(info.tiny * u, 5e-324)
        grow, floor = 1.0 + 32.0 * u, 16.0 * eta

        def charged(q: float) -> float:
            return q * grow + floor

        m, a, l2 = abs(self.momentum), abs(self.damp1), abs(self.l2)
        params = [dict(start)]
        velocity = [{n: 0.0 for n in start}]
        worst = []
        for t, lr in enumerate(lrs):
            lr = abs(lr)
            new_p, new_v, top = {}, {}, 0.0
            for n, p in params[-1].items():
                g = charged(d_max + charged(l2 * p))
                if self.optimizer == "sgd":
                    v, direction, terms = 0.0, g, (g,)
                else:
                    v_prev = velocity[-1][n]
                    v = g if t == 0 else charged(charged(m * v_prev) + charged(a * g))
                    direction = charged(g + charged(m * v)) if self.nesterov else v
                    terms = (g, v, direction, charged(m * v_prev), charged(a * g))
                step = charged(lr * direction)
                new_p[n] = charged(p + step)
                new_v[n] = v
                top = max(top, new_p[n], step, *terms)
            params.append(new_p)
            velocity.append(new_v)
            worst.append(top)
        return PublicMagnitudes(params, velocity, worst)

    # -- interval -------------------------------------------------------------------------
    def coefficients(self, lr: float, first_step: bool) -> tuple[dict, dict | None]:
        """Affine coefficients {theta, v, d} of theta' and (for sgdm) v'."""
        lam, mu = self.l2, self.momentum
        if self.optimizer == "sgd":
            return {"theta": 1.0 - lr * lam, "d": -lr}, None
        if first_step:
            v_new = {"theta": lam, "d": 1.0}
            c = 1.0 + mu if self.nesterov else 1.0
            return {"theta": 1.0 - lr * c * lam, "d": -lr * c}, v_new
        v_new = {"theta": self.damp1 * lam, "d": self.damp1, "v": mu}
        if self.nesterov:
            c = 1.0 + mu * self.damp1
            theta_new = {"theta": 1.0 - lr * c * lam, "d": -lr * c, "v": -lr * mu * mu}
        else:
            theta_new = {"theta": 1.0 - lr * self.damp1 * lam, "d": -lr * self.damp1,
                         "v": -lr * mu}
        return theta_new, v_new

    def magnitude_coefficients(self, lr: float, first_step: bool) -> tuple[dict, dict | None]:
        """Coefficients of the magnitude bound of every intermediate of the nominal update
        (the same keys as `coefficients`): theta's coefficient 1 - lr c l2 is charged as
        1 + |lr c l2|, since the nominal computes d + l2 theta and lr g before the
        difference that cancels. The other coefficients are single products."""
        coef_theta, coef_v = self.coefficients(lr, first_step)
        mag_theta = {k: abs(c) for k, c in coef_theta.items()}
        mag_theta["theta"] = 1.0 + abs(1.0 - coef_theta["theta"])
        mag_v = None if coef_v is None else {k: abs(c) for k, c in coef_v.items()}
        return mag_theta, mag_v

    def bounds(self, theta: Interval, v: Interval | None, d: Interval, lr: float,
               first_step: bool, fm: FloatModel) -> tuple[Interval, Interval | None]:
        coef_theta, coef_v = self.coefficients(lr, first_step)
        mag_theta, mag_v = self.magnitude_coefficients(lr, first_step)
        boxes = {"theta": theta, "v": v, "d": d}
        new_theta = affine(coef_theta, boxes, fm, mag_theta)
        new_v = affine(coef_v, boxes, fm, mag_v) if coef_v is not None else None
        return new_theta, new_v


def affine(coefs: dict[str, float], boxes: dict[str, Interval | None], fm: FloatModel,
           mag_coefs: dict[str, float] | None = None) -> Interval:
    """Range of sum_i c_i X_i over independent boxes X_i, widened for rounding relative to
    sum_i m_i |X_i| (``mag_coefs`` m_i, default |c_i|: the magnitudes of the nominal
    computation's intermediates)."""
    mag_coefs = {k: abs(c) for k, c in coefs.items()} if mag_coefs is None else mag_coefs
    lo = hi = mag = None
    for name, c in coefs.items():
        m = mag_coefs.get(name, abs(c))
        if c == 0.0 and m == 0.0:
            continue
        box = boxes[name]
        if box is None:
            raise RuntimeError(f"internal: missing box '{name}' in affine update")
        t_lo, t_hi = (c * box.lo, c * box.hi) if c >= 0 else (c * box.hi, c * box.lo)
        t_mag = m * box.magnitude()
        lo = t_lo if lo is None else lo + t_lo
        hi = t_hi if hi is None else hi + t_hi
        mag = t_mag if mag is None else mag + t_mag
    if lo is None:
        ref = next(b for b in boxes.values() if b is not None)
        zero = torch.zeros_like(ref.lo)
        return Interval(zero, zero)
    return fm.widen(lo, hi, mag, _N_OPS)
