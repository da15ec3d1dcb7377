"""Subsample-and-aggregate on Blobs: train and certify a T = 25 ensemble (issue 4 benchmark).

Setting: configs/blobs.yaml (6-2 logistic, cross-entropy, 1 full-batch epoch, k = 0..199).
5000 training records split by index mod 25 give 200 records per teacher; the config's batch
(5000) is capped at the part size, so every teacher trains full batch with b = 200 and the
grid 0..199 is the largest it allows (k < b): no further cap is needed. (With T > 25 the
parts shrink below 200 and the grid would have to be capped at 0..floor(5000/T) - 1;
`check_ensemble_plan` refuses it otherwise.)

Reports, on this machine:
  * the single model on all 5000 records (AGT, k = 0..199) and its certification,
  * the ensemble: total training time, time per teacher and its ratio to the single model,
    certification of the test split (25 teachers), the nominal vote accuracy and the
    ensemble radii.

    python benchmarks/bench_ensemble.py [--teachers 25] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

sys.path.insert(0, ".")
from agt.certify import Certifier  # noqa: E402
from agt.config import load_config  # noqa: E402
from agt.data import load_dataset  # noqa: E402
from agt.ensemble import EnsembleCertifier, train_ensemble  # noqa: E402
from agt.store import from_result  # noqa: E402
from agt.training import train  # noqa: E402
from benchmarks._common import peak_rss_mb  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--teachers", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config("configs/blobs.yaml", {"device": args.device})
    ds = load_dataset(cfg.data.name, cfg.data.options)
    T = args.teachers
    train(cfg, ds)                                   # warm-up (imports, allocator)

    single_runs = [timed(lambda: train(cfg, ds)) for _ in range(args.repeats)]
    result, t_single = min(single_runs, key=lambda r: r[1])
    certifier = Certifier(from_result(result), device=args.device)
    cert, t_single_cert = timed(lambda: certifier.certify(ds.x_test))

    ens_runs = [timed(lambda: train_ensemble(cfg, ds, T)) for _ in range(args.repeats)]
    ens, t_ens = min(ens_runs, key=lambda r: r[1])
    per_teacher = np.asarray(ens.training_seconds)
    ecert, t_ens_cert = timed(lambda: EnsembleCertifier(ens, device=args.device).certify(ds.x_test))

    sizes = ens.manifest["partition"]["sizes"]
    acc_single = float((cert.prediction == ds.y_test).mean())
    acc_vote = float((ecert.prediction == ds.y_test).mean())
    acc_teachers = (ecert.teacher_predictions == ds.y_test[:, None]).mean(0)
    print(f"Blobs logistic, n={ds.n_train}, k = 0..{cfg.k_values[-1]} ({len(cfg.k_values)} values), "
          f"{cfg.n_epochs} full-batch epoch(s), device {args.device}, {args.threads} threads, "
          f"best of {args.repeats}")
    print(f"  single model (n={ds.n_train}) AGT training : {t_single:8.3f} s")
    print(f"  single model certify {ds.n_test} queries  : {t_single_cert:8.3f} s")
    print(f"  ensemble T={T} ({min(sizes)}..{max(sizes)} records each)")
    print(f"    total training (incl. partitioning) : {t_ens:8.3f} s")
    print(f"    per teacher (AGT run only)           : {per_teacher.mean():8.3f} s mean, "
          f"{per_teacher.min():.3f}..{per_teacher.max():.3f} s")
    print(f"    per teacher / single model           : {per_teacher.mean() / t_single:8.3f}x"
          f"   (total ensemble / single: {t_ens / t_single:.2f}x)")
    print(f"    certify {ds.n_test} queries x {T} teachers   : {t_ens_cert:8.3f} s "
          f"({t_ens_cert / T:.3f} s per teacher; single model {t_single_cert:.3f} s)")
    print(f"  accuracy: single {acc_single:.4f}; vote {acc_vote:.4f}; teachers mean "
          f"{acc_teachers.mean():.4f} (min {acc_teachers.min():.4f})")
    print(f"  radii: single model mean k* {cert.radius.mean():.1f}; teachers mean "
          f"{ecert.teacher_radii.mean():.1f}; ensemble Thm 5.3 mean {ecert.radius.mean():.1f} "
          f"(median {np.median(ecert.radius):.0f}, max {ecert.radius.max()}), tight mean "
          f"{ecert.radius_tight.mean():.1f}; votes needed to flip m mean {ecert.flips.mean():.1f}")
    print(f"  peak RSS {peak_rss_mb():.0f} MiB")


if __name__ == "__main__":
    main()
