"""Certifier throughput: Blobs queries against the k = 0..199 bundle, and the two hidden-layer
heads of the paper's tasks (IMDB 768-100-1, OctMNIST 3200-100-1 behind its conv prefix),
screened against the reference.

    python benchmarks/bench_certify.py [--queries 1000000] [--repeats 3] [--octmnist 2000]
                                       [--imdb 10000]

Blobs (configs/blobs.yaml, a linear 6-2 model): the screened binary search (the default,
agt/certify/margin_screen.py) against the same search with the screen switched off and, on 10,000
queries, the linear scan; all three must give the same radii. OctMNIST head (generated
28 x 28 images, a random frozen prefix, configs/octmnist.yaml's k grid, a bundle trained on
300 images: the certifier's cost depends on the model and the grid, not on n): the prefix's
feature boxes and the box tests of the binary search, timed apart; then the whole search
with the hidden-layer screen (agt/certify/hidden_screen.py) against the same search with
it switched off. IMDB head (generated 768-d embeddings of imdb_data's shape, configs/
imdb.yaml's 17 k values, a bundle trained on 300 records): the same comparison. Both
heads' radii must be identical with and without the screen on every query. Every figure is
the minimum over the repeats with the spread (max - min), all in one run, 2 threads; the
reference runs once (it takes minutes).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agt.certify import Certifier  # noqa: E402
from agt.config import load_config  # noqa: E402
from agt.data import blobs_features, load_dataset  # noqa: E402
from agt.store import from_result  # noqa: E402
from agt.training import train  # noqa: E402
from benchmarks._common import imdb_data, octmnist_data, pipeline_config  # noqa: E402


def timed(fn, repeats: int) -> tuple[list[float], object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def fmt(times: list[float], n: int) -> str:
    lo = min(times)
    return (f"{lo:7.3f} s (+{max(times) - lo:.3f}) = {n / lo:12,.0f} queries/s")


def blobs(n: int, repeats: int) -> None:
    cfg = load_config(str(ROOT / "configs/blobs.yaml"), {"device": "cpu"})
    ds = load_dataset(cfg.data.name, cfg.data.options)
    certifier = Certifier(from_result(train(cfg, ds)))
    rng = np.random.default_rng(0)
    centres = rng.choice([-1.25, 1.25], size=(n, 1))
    queries = blobs_features(centres + rng.normal(scale=0.35, size=(n, 2)), "cubic")
    certifier.certify(queries[:100])
    fast_t, fast = timed(lambda: certifier.certify(queries), repeats)
    screen, certifier._screen = certifier._screen, False
    plain_t, plain = timed(lambda: certifier.certify(queries), max(1, repeats - 1))
    small = queries[:10_000]
    lin_t, lin = timed(lambda: certifier.certify_linear(small), 1)
    certifier._screen = screen
    assert np.array_equal(fast.radius, plain.radius)
    assert np.array_equal(fast.radius[:10_000], lin.radius)
    print(f"Blobs, {n:,} queries, k = 0..199 (mean k* = {fast.max_certified_k.mean():.1f}), "
          f"{repeats} repeats")
    print(f"  screened search   : {fmt(fast_t, n)}")
    print(f"  unscreened search : {fmt(plain_t, n)}")
    print(f"  linear scan (10k) : {fmt(lin_t, len(small))}")
    print(f"  screened / unscreened: {min(plain_t) / min(fast_t):.1f}x faster; same radii")


def octmnist(n_queries: int, repeats: int) -> None:
    k_values = "0..10,15,20,30,40,50,75,100,150,200"
    ds = octmnist_data(300)
    bundle = from_result(train(pipeline_config("octmnist", "cpu", k_values), ds))
    certifier = Certifier(bundle)
    xq = np.concatenate([ds.x_test] * (1 + n_queries // len(ds.x_test)))[:n_queries]
    certifier.certify(xq[:10])
    checked = certifier._check_queries(xq)
    with torch.no_grad():
        feat_t, _ = timed(lambda: certifier._features(checked), repeats)
    total_t, cert = timed(lambda: certifier.certify(xq), repeats)
    box = [t - min(feat_t) for t in total_t]
    print(f"OctMNIST head (prefix 1x28x28 -> 3200, head 3200-100-1, {len(bundle.k_values)} "
          f"k values), {n_queries:,} queries; certified at k=0: "
          f"{(cert.max_certified_k >= 0).mean():.2f}")
    print(f"  prefix feature boxes : {fmt(feat_t, n_queries)}")
    print(f"  box tests (search)   : {fmt(box, n_queries)}")
    print(f"  whole certify        : {fmt(total_t, n_queries)}")
    screened_against_reference(certifier, xq, total_t, cert, "OctMNIST head")


def screened_against_reference(certifier: Certifier, xq, screened_t: list[float], cert,
                               name: str) -> None:
    """The same search with the hidden-layer screen switched off, once; radii compared on
    every query."""
    assert certifier.hidden_screen is not None, f"{name}: no hidden-layer screen"
    hidden, certifier._hidden = certifier._hidden, False
    ref_t, ref = timed(lambda: certifier.certify(xq), 1)
    certifier._hidden = hidden
    same = np.array_equal(ref.radius, cert.radius) and np.array_equal(ref.prediction,
                                                                       cert.prediction)
    print(f"  reference (screen off): {fmt(ref_t, len(xq))}")
    print(f"  screened / reference  : {ref_t[0] / min(screened_t):.1f}x faster "
          f"(spread of the screened runs {max(screened_t) / min(screened_t) - 1:.0%}); "
          f"radii identical on all {len(xq):,} queries: {same}")
    assert same, f"{name}: the screen changed a radius"


def imdb(n_queries: int, repeats: int) -> None:
    ds = imdb_data(300)
    bundle = from_result(train(pipeline_config("imdb", "cpu"), ds))
    certifier = Certifier(bundle)
    extra = imdb_data(10, seed=1).x_test
    xq = np.concatenate([ds.x_test, extra] * (1 + n_queries // 20_000))[:n_queries]
    certifier.certify(xq[:10])
    total_t, cert = timed(lambda: certifier.certify(xq), repeats)
    print(f"IMDB head (768-100-1, {len(bundle.k_values)} k values), {n_queries:,} queries; "
          f"mean radius {cert.radius.mean():.2f}")
    print(f"  screened search       : {fmt(total_t, n_queries)}")
    screened_against_reference(certifier, xq, total_t, cert, "IMDB head")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--octmnist", type=int, default=2_000, help="OctMNIST queries (0: skip)")
    ap.add_argument("--imdb", type=int, default=10_000, help="IMDB head queries (0: skip)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.queries:
        blobs(args.queries, args.repeats)
    if args.imdb:
        imdb(args.imdb, args.repeats)
    if args.octmnist:
        octmnist(args.octmnist, args.repeats)


if __name__ == "__main__":
    main()
