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

    theta' = (1 - lr c l2) theta - lr c d - lr m2 v,   c = 1 + momentum (1 - dampening),
                                                       m2 = momentum^2 (nesterov; c = 1 -
                                                       dampening, m2 = momentum otherwise),

so evaluating it with interval arithmetic gives its exact range over the boxes (sound
and inclusion-isotone, also with momentum *and* L2: no dependency between theta and v is
lost that the nominal computation would exploit). The result is widened for the rounding
of the nominal dtype (each term sees at most 8 roundings) and of float64, relative to the
magnitudes of the nominal computation's *intermediates*: theta enters once as itself and
once through lr c l2 theta, so its magnitude coefficient is 1 + |lr c l2|, not
|1 - lr c l2| (which cancels when lr c l2 is near 1 while the roundings of d + l2 theta and
of lr g stay of size u |theta|: `magnitude_coefficients`). The coefficients are float64
products of the rounded constants, each within a few u64 of its exact value as long as no
product underflows; `check_coefficients` refuses a learning rate where one would (a
subnormal float64 lr times the momentum rounded to 0 and dropped the velocity's share,
found by a review).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

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
        rule clamps the mean too, agt/nominal.py), ``dtype`` the nominal dtype.

        Recursion (the nominal rule above, |.| of each intermediate; m = |momentum|, a =
        |1 - dampening|): G = d_max + l2 P_t for g; sgd: P_{t+1} = P_t + lr G; sgdm:
        V_{t+1} = G at the first step, m V_t + a G afterwards, dir = G + m V_{t+1}
        (nesterov) or V_{t+1}, P_{t+1} = P_t + lr dir. Rounding: every operation of the
        nominal rule (a product or a sum) is off by at most u |x| + eta (to nearest; eta
        the absolute error of a product that underflows: half the smallest subnormal step
        of float32, float64's smallest subnormal for float64, which is more than half its
        step; without it a zero weight stepped by a subnormal lr d exceeded the bound, found
        by a review), and its mirror in this float64 recursion by at most as much, so the
        result q of each is charged as q (1 + 32 u) + 16 eta, generously; a NaN (from an
        infinite constant) counts as inf.
        ``worst[t]``: the largest intermediate of update t (g, the velocity terms, the
        direction, lr dir, the new parameters)."""
        info = torch.finfo(dtype)
        u = info.eps / 2.0
        eta = max(info.tiny * u, 5e-324)
        grow, floor = 1.0 + 32.0 * u, 16.0 * eta

        def charged(q: float) -> float:
            out = q * grow + floor
            return out if out == out else math.inf

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
    def check_coefficients(self, lr: float, first_step: bool) -> bool:
        """Whether every coefficient of `coefficients` lies within 8 u64 times its magnitude
        coefficient (`magnitude_coefficients`, the scale the update's widening charges) of
        its exact value, computed in rational arithmetic from the same rounded constants.
        Products of normal float64 numbers always do (a few roundings, relative); false
        where one underflowed, an absolute error the widening does not charge."""
        exact_theta, exact_v = self.coefficients(Fraction(lr), first_step, exact=True)
        got_theta, got_v = self.coefficients(lr, first_step)
        mag_theta, mag_v = self.magnitude_coefficients(lr, first_step)
        for exact, got, mag in ((exact_theta, got_theta, mag_theta),
                                (exact_v or {}, got_v or {}, mag_v or {})):
            for key, value in exact.items():
                if abs(Fraction(got[key]) - value) > Fraction(8 * 2.0 ** -53) * Fraction(mag[key]):
                    return False
        return True

    def coefficients(self, lr, first_step: bool, exact: bool = False) -> tuple[dict, dict | None]:
        """Affine coefficients {theta, v, d} of theta' and (for sgdm) v': float64, or with
        ``exact`` (``lr`` a Fraction) the same formulas in rational arithmetic."""
        num = Fraction if exact else float
        lam, mu, damp1, one = num(self.l2), num(self.momentum), num(self.damp1), num(1)
        if self.optimizer == "sgd":
            return {"theta": one - lr * lam, "d": -lr}, None
        if first_step:
            v_new = {"theta": lam, "d": one}
            c = one + mu if self.nesterov else one
            return {"theta": one - lr * c * lam, "d": -lr * c}, v_new
        v_new = {"theta": damp1 * lam, "d": damp1, "v": mu}
        if self.nesterov:
            c = one + mu * damp1
            theta_new = {"theta": one - lr * c * lam, "d": -lr * c, "v": -lr * mu * mu}
        else:
            theta_new = {"theta": one - lr * damp1 * lam, "d": -lr * damp1,
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
