"""Cost of graded interval passes (agt 0.3.6, agt/interval.py): training and certification
time and certified radii, graded against the pre-0.3.6 passes in one run.

"ungraded" re-creates the earlier engine inside this process: GRADE_FACTOR 0 (every
graded widening adds nothing) and the first step's single pass shared by every k. Runs
alternate ungraded / graded, ``--repeats`` times; times are the minimum over the repeats
with the spread (max - min) beside them; radii are deterministic and taken from the last
repeat.

    python benchmarks/bench_graded.py --tasks blobs,blobs_mlp_mb1,digits10_linear --repeats 3
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tightness import task_setup  # noqa: E402

import agt.bounded.losses as losses_mod  # noqa: E402
import agt.interval as iv  # noqa: E402
import agt.training as training_mod  # noqa: E402
from agt.certify import Certifier  # noqa: E402
from agt.config import load_config  # noqa: E402
from agt.data import load_dataset  # noqa: E402
from agt.store import from_result  # noqa: E402

TASKS = ("blobs", "blobs_mlp", "blobs_mlp_mb1", "digits10_linear", "digits_bin_mb", "imdb_head")


@contextlib.contextmanager
def ungraded():
    """The passes of agt <= 0.3.5: no graded part, one shared pass on the first step."""
    trainer = training_mod._Trainer
    original = trainer.descent_bounds

    def shared_first_step(self, boxes, k_values, idx, shared, stats=None):
        if shared and stats is None:
            first = {n: box[:1] for n, box in boxes.items()}
            return self._group_pass(first, k_values, idx,
                                    torch.zeros(k_values.shape[0], dtype=torch.int64),
                                    [int(k_values.max())])
        return original(self, boxes, k_values, idx, shared, stats)

    saved = iv.GRADE_FACTOR, losses_mod.GRADE_FACTOR
    iv.GRADE_FACTOR = losses_mod.GRADE_FACTOR = 0.0
    trainer.descent_bounds = shared_first_step
    try:
        yield
    finally:
        iv.GRADE_FACTOR, losses_mod.GRADE_FACTOR = saved
        trainer.descent_bounds = original


def setup(name: str):
    if name == "blobs":
        cfg = load_config("configs/blobs.yaml", {"device": "cpu"})
        return cfg, load_dataset(cfg.data.name, cfg.data.options)
    cfg, ds, _, n_teachers = task_setup(name)
    if n_teachers:
        raise SystemExit(f"{name}: ensembles are not part of this benchmark")
    return cfg, ds


def measure(cfg, ds) -> tuple[float, float, np.ndarray]:
    t0 = time.perf_counter()
    res = training_mod.train(cfg, ds)
    t_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    cert = Certifier(from_result(res)).certify(ds.x_test)
    return t_train, time.perf_counter() - t0, cert.max_certified_k


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print("| task | train s ungraded | train s graded | ratio | certify s ungraded | "
          "certify s graded | median k* (ungraded -> graded) | queries whose k* changed |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.tasks.split(","):
        cfg, ds = setup(name)
        times = {"ungraded": ([], []), "graded": ([], [])}
        radii = {}
        for _ in range(args.repeats):
            for mode in ("ungraded", "graded"):
                ctx = ungraded() if mode == "ungraded" else contextlib.nullcontext()
                with ctx:
                    t_train, t_cert, kstar = measure(cfg, ds)
                times[mode][0].append(t_train)
                times[mode][1].append(t_cert)
                radii[mode] = kstar

        def fmt(values):
            return f"{min(values):.2f} (+{max(values) - min(values):.2f})"

        tu, tg = times["ungraded"], times["graded"]
        changed = int((radii["ungraded"] != radii["graded"]).sum())
        print(f"| {name} | {fmt(tu[0])} | {fmt(tg[0])} | {min(tg[0]) / min(tu[0]):.2f}x | "
              f"{fmt(tu[1])} | {fmt(tg[1])} | {np.median(radii['ungraded']):g} -> "
              f"{np.median(radii['graded']):g} | {changed} of {len(radii['graded'])} |",
              flush=True)


if __name__ == "__main__":
    main()
