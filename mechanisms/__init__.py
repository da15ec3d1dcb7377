"""mechanisms: DP noise and privacy accounting for smooth-sensitivity private prediction.

Consumes what `agt` certifies (nominal predictions, stability radii, teacher votes), never
trains, and depends on nothing of `agt` but its errors. The one way to turn certified
predictions into released labels is `Ledger.release(mechanism, inputs)`:

  inputs.py       Certified / Votes / Source: the owner-only inputs that cross the door
  base.py         the Mechanism interface and the registry (one name per mechanism)
  global_sens.py  gs: global-sensitivity Laplace threshold (binary)
  smooth.py       ss-laplace, ss-cauchy (binary), ss-argmax (C classes): smooth sensitivity
  votes.py        vote arithmetic: counts, the answer, flips, ensemble radii (no noise)
  ensemble.py     lnmax, ens-ss-*, ens-ptr*, ens-ptr-gs, df-exp*: releases over votes
  radius.py       exp-radius, ptr, svt (and ens-*): spend the radius, any number of classes
  convex.py       model-sens, pred-sens (+ Gaussian): linear models with a sensitivity bound
  loss_perturbation.py  loss-pert (+ Gaussian): draws B, the owner's solver trains on it
  guarantee.py    Guarantee (eps, delta, relation) and relation conversion
  accounting.py   composition (standard, advanced, tight PLD), its inverse, query plans
  expectation.py  exact expected answered fraction, agreement, accuracy; Monte Carlo check
  release_plan.py plan_release: every mechanism x accountant for B queries (owner-only)
  release_check.py check_release: refuse a release expected to answer too little
  ledger/         the ledger bound to one dataset and one relation: check, record, draw
                  (SQLite or PostgreSQL; charge.py is where a spend is checked and committed)
  noise.py        secure generators, closed forms of threshold and PTR releases
  exact.py        exact samplers (Bernoulli, exp(-gamma), arctan / pi, discrete Laplace)
  rounding.py     directed rounding of exact rationals to floats

Every epsilon is with respect to a neighbouring relation; a ledger composes only guarantees
under its own relation (converting add-remove ones to replace-one by group privacy).

The names below load on first use (PEP 562): ``import mechanisms`` loads neither torch nor
the mechanism modules; the registry fills when it is first asked for (`base.load_registry`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:          # for type checkers and the API reference; not run
    from mechanisms.base import MECHANISMS, REFUSED, Mechanism, make_mechanism, mechanism_names
    from mechanisms.guarantee import ADD_REMOVE, RELATIONS, REPLACE_ONE, Guarantee
    from mechanisms.inputs import Certified, Source, Votes
    from mechanisms.ledger import Ledger, LedgerEntry, Release, default_ledger_path, hash_query
    from mechanisms.release_check import check_release
    from mechanisms.release_plan import PlanRow, ReleasePlan, plan_release

#: public name -> the module that defines it
_LAZY = {
    **dict.fromkeys(("MECHANISMS", "REFUSED", "Mechanism", "make_mechanism",
                     "mechanism_names"), "mechanisms.base"),
    **dict.fromkeys(("ADD_REMOVE", "RELATIONS", "REPLACE_ONE", "Guarantee"),
                    "mechanisms.guarantee"),
    **dict.fromkeys(("Certified", "Source", "Votes"), "mechanisms.inputs"),
    **dict.fromkeys(("Ledger", "LedgerEntry", "Release", "default_ledger_path", "hash_query"),
                    "mechanisms.ledger"),
    **dict.fromkeys(("plan_release", "ReleasePlan", "PlanRow"), "mechanisms.release_plan"),
    "check_release": "mechanisms.release_check",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        if name == "MECHANISMS":
            module.load_registry()
        value = getattr(module, name)
    else:
        try:
            value = importlib.import_module(f"mechanisms.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"mechanisms.{name}":
                raise
            raise AttributeError(f"module 'mechanisms' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = ["Mechanism", "MECHANISMS", "REFUSED", "make_mechanism", "mechanism_names",
           "Guarantee", "RELATIONS", "REPLACE_ONE", "ADD_REMOVE", "Certified", "Votes",
           "Source", "Ledger", "LedgerEntry", "Release", "default_ledger_path", "hash_query",
           "plan_release", "ReleasePlan", "PlanRow", "check_release"]
