"""The private-prediction trade-off study (van der Maaten & Hannun, Sec. 4) on the digits,
with AGT in the race: ``agt reproduce tradeoffs [--quick]``.

Methods (registry names; every guarantee under replace-one, every budget a *total* (eps,
delta) over an inference budget of B queries):
  private training   model-sens, model-sens-gauss (noisy minimiser), loss-pert,
                     loss-pert-gauss (perturbed objective): one session for all B queries;
                     dp-sgd (Opacus, delta > 0 only; Figs. 1-3 and the regimes);
  private prediction pred-sens, pred-sens-gauss (noisy logits), df-exp (Dwork-Feldman
                     exponential mechanism on T disjoint teachers' votes, 2-beta constant),
                     lnmax (PATE-style noisy argmax, discrete Laplace) per query; df-exp-zcdp as one
                     (eps, delta) session over the B queries (Thm 8 via zCDP);
  AGT                ss-argmax, exp-radius, ptr on one AGT model's radius, ens-exp-radius on
                     an AGT ensemble's radius; binary adds gs, ss-cauchy, ss-laplace.
Per-query mechanisms get the per-query (eps, delta) of `mechanisms.accounting.plan_queries`:
standard composition when delta = 0, the better of standard and advanced composition when
delta > 0 (accountant "best"); every row records its accountant.

Modules, each with one job:
  settings  the plan file (configs/experiments/tradeoffs.yaml) -> `TradeoffSettings`
  methods   the methods and their families
  study     data, models per setting, one method's accuracy at one point (`Study`)
  sweeps    the rows behind each figure, and each regime's winner
  report    the PNGs and summary.md
  run       `run_study`: all of the above, and results.json

Outputs (owner-only research output, like every `agt reproduce`): results.json, fig1..fig6
PNGs per task, summary.md with the per-regime winners. No radius, vote or logit is written.
"""

from experiments.tradeoffs.methods import family, methods
from experiments.tradeoffs.report import FIG_FILES
from experiments.tradeoffs.run import NAME, run_study
from experiments.tradeoffs.settings import TradeoffSettings, load_settings
from experiments.tradeoffs.study import STABILITY_SETTINGS, Study

__all__ = ["FIG_FILES", "NAME", "STABILITY_SETTINGS", "Study", "TradeoffSettings", "family",
           "load_settings", "methods", "run_study"]
