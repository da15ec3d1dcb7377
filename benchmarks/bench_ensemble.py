"""Ensembles: scale-out over teachers and certification cost.

Scale-out (default part): T = 50 teachers trained serially, in 2 local worker processes, and
on Ray (a local instance with 2 CPUs) -- "cold" when train_ensemble starts and stops its own
Ray instance (what `agt train --ray-address local` does), "warm" when Ray was started
beforehand (a running cluster) -- on two data sets:

  * Blobs, the paper's 6-2 logistic model (configs/blobs.yaml, 1 full-batch epoch) on 5000
    records: 100 records per teacher, k = 0..99 (k < the teacher's batch). Tiny teachers
    (~0.02 s): the engine's fixed costs dominate.
  * digits (scikit-learn's bundled 8x8 digits, 1797 images, 64 pixels / 16, 10 classes; 80/20
    split with a fixed permutation): a 64-64-10 ReLU MLP, cross-entropy, 10 full-batch epochs,
    k = 0..19, 28-29 records per teacher: teachers of about 1 s on this machine. Skipped with
    a note when scikit-learn is not installed (pip install scikit-learn).

Every teacher runs with 1 intra-op thread in every backend (agt/threads.py), so the four runs
must give the same ensemble id (checked and printed). Per run: wall time; the teachers'
own training seconds (measured inside the workers); speedup = serial wall / wall (both the
minimum over repeats); engine overhead per teacher = (workers x wall - sum of teacher
seconds) / T, i.e. worker time not spent training (start-up, transfer, idle at the end),
for the run with the smallest wall time. Reported: min and (min..max) over the repeats of
one run; repeats interleave the backends. The machine is shared (2 cores, other processes
running): numbers are noisy, load averages are printed.

    python benchmarks/bench_ensemble.py [--teachers 50] [--repeats 3] [--workers 2]
                                        [--only blobs,digits] [--no-ray] [--certify]

``--certify`` adds the certification report: single model vs a T = 25 ensemble on Blobs
(training, certification of the test split, accuracy, radii).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch starts its OpenMP pool

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, ".")
from agt.certify import Certifier  # noqa: E402
from agt.config import config_from_dict, load_config  # noqa: E402
from agt.data import Dataset, load_dataset  # noqa: E402
from agt.ensemble import EnsembleCertifier, train_ensemble  # noqa: E402
from agt.store import from_result  # noqa: E402
from agt.training import train  # noqa: E402
from benchmarks._common import peak_rss_mb  # noqa: E402
from mechanisms.votes import aggregate, ensemble_radius, flips_needed  # noqa: E402

# ------------------------------------------------------------------------------------------
# Scale-out

def blobs_case(T: int):
    cfg = load_config("configs/blobs.yaml", {"device": "cpu"})
    ds = load_dataset(cfg.data.name, cfg.data.options)
    batch = cfg.batch_for(ds.n_train // T)
    return "Blobs 6-2 logistic", cfg.replace(k_values=list(cfg.k_values.below(batch))), ds


def digits_case(T: int):
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        return None
    x, y = load_digits(return_X_y=True)
    perm = np.random.default_rng(0).permutation(len(x))
    x, y = x[perm] / 16.0, y[perm].astype(np.int64)
    n = int(0.8 * len(x))
    ds = Dataset("digits", x[:n], y[:n], x[n:], y[n:], 10)
    cfg = config_from_dict(dict(
        model=[{"linear": {"in": 64, "out": 64}}, {"relu": {}}, {"linear": {"in": 64, "out": 10}}],
        loss="cross_entropy", learning_rate=0.5, lr_decay=0.01, clip_gamma=0.5, n_epochs=10,
        batch_size="full", k_values="0..19", dtype="float64", device="cpu", seed=0))
    return "digits 64-64-10 MLP", cfg, ds


def spread(values) -> str:
    v = np.asarray(values)
    return f"{v.min():7.2f} ({v.min():.2f}..{v.max():.2f})"


def scale_out(name, cfg, ds, T, workers, repeats, use_ray) -> None:
    runs = {"serial": [], f"process x{workers}": []}
    if use_ray:
        runs[f"ray cold x{workers}"] = []
        runs[f"ray warm x{workers}"] = []
    ids = {}

    def once(label, **kw):
        t0 = time.perf_counter()
        ens = train_ensemble(cfg, ds, T, **kw)
        wall = time.perf_counter() - t0
        runs[label].append((wall, float(np.sum(ens.training_seconds))))
        ids.setdefault(label, set()).add(ens.ensemble_id)
        return ens

    print(f"\n== {name}: T = {T} teachers ({min(ds.n_train // T, ds.n_train)}+ records each), "
          f"k = 0..{cfg.k_values[-1]}, {repeats} repeats; load avg {os.getloadavg()[0]:.2f} ==")
    ens = None
    for _ in range(repeats):
        ens = once("serial")
        once(f"process x{workers}", workers=workers)
        if use_ray:
            import ray
            once(f"ray cold x{workers}", backend="ray", workers=workers)
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR)
            try:
                once(f"ray warm x{workers}", backend="ray", workers=workers)
            finally:
                ray.shutdown()
    acc = None
    if ds.x_test is not None:
        votes = EnsembleCertifier(ens).predict_teachers(ds.x_test)
        counts = np.apply_along_axis(np.bincount, 1, votes, minlength=ds.n_classes)
        acc = float((counts.argmax(1) == ds.y_test).mean())
    serial_best = min(w for w, _ in runs["serial"])
    print(f"{'backend':16s} {'wall s: min (min..max)':>26s} {'teacher s (sum)':>16s} "
          f"{'speedup':>8s} {'overhead/teacher':>17s}")
    for label, rs in runs.items():
        walls = [w for w, _ in rs]
        best_wall, best_sum = min(rs)
        w = 1 if label == "serial" else workers
        overhead = (w * best_wall - best_sum) / T
        print(f"{label:16s} {spread(walls):>26s} {best_sum:16.2f} "
              f"{serial_best / best_wall:7.2f}x {overhead * 1000:13.1f} ms")
    same = len({i for s in ids.values() for i in s}) == 1
    print(f"mean teacher training: {np.mean([s for _, s in runs['serial']]) / T:.3f} s; "
          f"ensemble ids identical across all runs and backends: {same}; "
          f"vote accuracy {acc:.4f}; load avg now {os.getloadavg()[0]:.2f}")


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def certify_report(args) -> None:
    """Single model vs a T-teacher ensemble, training and certification."""
    torch.set_num_threads(args.threads)
    print("\n== certification: single model vs ensemble ==")
    cfg = load_config("configs/blobs.yaml", {"device": args.device})
    ds = load_dataset(cfg.data.name, cfg.data.options)
    T = args.certify_teachers
    train(cfg, ds)                                   # warm-up (imports, allocator)

    single_runs = [timed(lambda: train(cfg, ds)) for _ in range(args.repeats)]
    result, t_single = min(single_runs, key=lambda r: r[1])
    certifier = Certifier(from_result(result), device=args.device)
    cert, t_single_cert = timed(lambda: certifier.certify(ds.x_test))

    ens_runs = [timed(lambda: train_ensemble(cfg, ds, T, threads=args.threads))
                for _ in range(args.repeats)]
    ens, t_ens = min(ens_runs, key=lambda r: r[1])
    per_teacher = np.asarray(ens.training_seconds)
    ecert, t_ens_cert = timed(lambda: EnsembleCertifier(ens, device=args.device).certify(ds.x_test))

    sizes = ens.manifest["partition"]["sizes"]
    acc_single = float((cert.prediction == ds.y_test).mean())
    votes, radii = ecert.teacher_predictions, ecert.teacher_radii
    answer = aggregate(votes, ecert.n_classes)
    thm, tight = (ensemble_radius(votes, radii, rule, ecert.n_classes)
                  for rule in ("thm5.3", "tight"))
    acc_vote = float((answer == ds.y_test).mean())
    acc_teachers = (ecert.teacher_predictions == ds.y_test[:, None]).mean(0)
    print(f"Blobs logistic, n={ds.n_train}, k = 0..{cfg.k_values[-1]} "
          f"({len(cfg.k_values)} values), "
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
          f"{radii.mean():.1f}; ensemble Thm 5.3 mean {thm.mean():.1f} "
          f"(median {np.median(thm):.0f}, max {thm.max()}), min-cost (default) mean "
          f"{tight.mean():.1f}; votes needed to flip m mean "
          f"{flips_needed(votes, ecert.n_classes).mean():.1f}")
    print(f"  peak RSS {peak_rss_mb():.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--teachers", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="blobs,digits")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--certify", action="store_true", help="add the certification report")
    ap.add_argument("--certify-teachers", type=int, default=25)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2, help="threads of the certification report")
    args = ap.parse_args()
    use_ray = not args.no_ray
    if use_ray:
        try:
            import ray  # noqa: F401
        except ImportError:
            print("Ray is not installed (pip install -e \".[distributed]\"): Ray rows skipped")
            use_ray = False
    print(f"{os.cpu_count()} cores, torch {torch.__version__}, 1 thread per teacher")
    for case in args.only.split(","):
        made = {"blobs": blobs_case, "digits": digits_case}[case](args.teachers)
        if made is None:
            print(f"\n== {case}: scikit-learn is not installed (pip install scikit-learn); "
                  f"skipped ==")
            continue
        scale_out(*made, args.teachers, args.workers, args.repeats, use_ray)
    if args.certify:
        certify_report(args)


if __name__ == "__main__":
    main()
