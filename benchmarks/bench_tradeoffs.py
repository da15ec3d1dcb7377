"""The trade-off study's wall time and the share spent training vs releasing.

Runs `agt reproduce tradeoffs` (full plan, or --quick) into a scratch folder and prints the
total wall time, the time spent training (convex fits, teachers, AGT models and bounds,
loss perturbation's solves, which are training by nature), releasing (ledgered draws
and exact expectations) and choosing the AGT and DP-SGD settings on the public surrogate,
with their shares. Run by hand, not a test:

    python benchmarks/bench_tradeoffs.py [--quick] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, ".")
from experiments.tradeoffs import load_settings, run_study  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    settings = load_settings(quick=args.quick)
    for r in range(args.repeats):
        with tempfile.TemporaryDirectory() as out:
            t = run_study(settings, out, quick=args.quick)["timing"]
        total, tr, rel = t["total_seconds"], t["training_seconds"], t["releasing_seconds"]
        tune = t["tuning_seconds"]
        other = total - tr - rel - tune
        print(f"run {r + 1}{' (quick)' if args.quick else ''}: total {total:.1f} s; training "
              f"{tr:.1f} s ({tr / total:.0%}); releasing {rel:.1f} s ({rel / total:.0%}); "
              f"choosing settings on the public surrogate {tune:.1f} s ({tune / total:.0%}); "
              f"plots and bookkeeping {other:.1f} s ({other / total:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
