"""Empirical privacy audits of release mechanisms (owner-only test bench, never a release).

  stats.py     Clopper-Pearson bounds, distinguishing events, the eps lower bound (the test)
  core.py      `audit(mechanism, inputs, neighbour)`: releases on both sides, the verdict
  cases.py     neighbouring inputs for the registry's mechanisms, chosen by their exact laws
  plot.py      the two label distributions

Imported on its own (``import mechanisms.audit``): ``import mechanisms`` does not load it,
nor scipy, which its statistics use.
"""

from mechanisms.audit.core import AuditResult, audit, claim_for, output_law
from mechanisms.audit.stats import epsilon_lower_bound, exact_loss

__all__ = ["AuditResult", "audit", "claim_for", "output_law", "epsilon_lower_bound",
           "exact_loss"]
