"""Reproduce the comparisons of the paper's section 6 (``agt reproduce blobs|octmnist|imdb``).

Each experiment is a module with ``NAME`` and ``run(ctx) -> Outcome`` that writes
``<out>/<dataset>/<experiment>/`` (results.json, PNG plots, table.md):

  heatmap    Fig. 3  smooth-sensitivity bound over the input plane (blobs only)
  single     Fig. 2  single model: accuracy vs per-query epsilon, GS vs SS vs non-private
  ensembles  Fig. 4  accuracy vs ensemble size T: GS noisy argmax, SS ensemble, PTR
  budget     Fig. 5  accuracy vs number of queries Q at a fixed total budget; DP-SGD
  kgrid      Fig. 6  bound tightness vs number of k values
  teacher    table   student accuracy from privately labelled public data

Settings come from the experiment plan ``configs/experiments/<dataset>.yaml``
(experiments/plan.py); the dataset pipelines are in experiments/pipelines.py and the shared
state of one run (models trained once, seeds, output helpers) in experiments/context.py.
"""

from experiments.runner import EXPERIMENTS, reproduce, summary_table

__all__ = ["EXPERIMENTS", "reproduce", "summary_table"]
