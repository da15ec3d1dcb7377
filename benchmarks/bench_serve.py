"""Throughput and latency of `agt serve` on loopback, beside in-process releases.

    python benchmarks/bench_serve.py [--clients 1,8,64] [--sizes 1,1000] [--seconds 5]
        [--repeats 3] [--out FILE.json]

Setting: the Blobs logistic bundle (configs/blobs.yaml, k = 0..199), the exponential
mechanism on the radius at eps 1e-3 per query, a fresh ledger with a budget no run reaches.
Every request asks new queries (random points, so no answer comes from the cache). For each
number of concurrent clients (keep-alive connections from this process) and request size:
requests and labels per second, and p50 / p99 latency, over ``--seconds`` of load; the
best of ``--repeats`` runs with the spread (max - min) of the throughput. In the same run,
the in-process door: certification plus `Ledger.release` (what `agt predict` does) and plus
`Ledger.answer_batch` (what the service does), on requests of the same sizes; the ratio is
the cost of HTTP and of the service's batching.

Goals on a 2-core machine: at least 500 single-query requests per second with p99 under 50 ms
at 8 clients, and at least 50,000 labels per second with 1,000-query requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EPSILON = "0.001"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def queries(n: int, seed: int) -> np.ndarray:
    """Random points of the Blobs feature map: new bytes every time (no cache hits)."""
    from agt.data.blobs import blobs_features

    rng = np.random.default_rng(seed)
    return blobs_features(rng.normal(size=(n, 2)) * 1.5)


async def load(url: str, key: str, clients: int, size: int, seconds: float, seed: int):
    """``clients`` keep-alive connections, each sending one request after the other for
    ``seconds``. The requests are written with asyncio streams, not an HTTP library: the
    load generator shares the machine's cores with the server and should take little of
    them (httpx's async client could not keep 64 connections busy on 2 cores)."""
    host, port = url.split("//", 1)[1].split(":")
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def one(i: int):
        reader, writer = await asyncio.open_connection(host, int(port))
        k = 0
        try:
            while time.perf_counter() < stop_at:
                body = json.dumps({"queries": queries(size, (seed * 1000 + i) * 100_000 + k)
                                   .tolist()}).encode()
                k += 1
                head = (f"POST /v1/predict HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
                        f"{key}\r\nContent-Type: application/json\r\nContent-Length: "
                        f"{len(body)}\r\n\r\n").encode()
                t0 = time.perf_counter()
                writer.write(head + body)
                await writer.drain()
                status_and_headers = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in
                              status_and_headers.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                answer = await reader.readexactly(length)
                latencies.append(time.perf_counter() - t0)
                if not status_and_headers.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(status_and_headers[:40] + answer[:200])
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    lat = np.array(latencies) * 1000
    done = len(latencies)
    return {"requests_per_s": done / wall, "labels_per_s": done * size / wall,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "requests": done}


def in_process(bundle_path: Path, size: int, seconds: float, seed: int) -> dict:
    """Certify + Ledger.release, and certify + Ledger.answer_batch, in this process."""
    import mechanisms
    from agt.certify import Certifier
    from agt.store import read_bundle
    from mechanisms.ledger import AnswerRequest, hash_query

    bundle = read_bundle(bundle_path)
    certifier = Certifier(bundle)
    mech = mechanisms.make_mechanism("exp-radius", float(EPSILON))
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for door in ("release", "answer_batch"):
            ledger = mechanisms.Ledger.open(Path(tmp) / f"{door}.db", budget_epsilon=1e6)
            done, k = 0, 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                x = queries(size, seed * 7919 + k)
                k += 1
                cert = certifier.certify(x)
                inputs = mechanisms.Certified.from_certificate(cert, [hash_query(q) for q in x])
                if door == "release":
                    ledger.release(mech, inputs)
                else:
                    ledger.answer_batch([AnswerRequest(mech, inputs, "bench")])
                done += 1
            wall = time.perf_counter() - t0
            ledger.close()
            out[door] = {"requests_per_s": done / wall, "labels_per_s": done * size / wall}
    return out


def spread(values: list[float]) -> str:
    return f"{max(values):.0f} (spread {max(values) - min(values):.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--sizes", default="1,1000")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write the figures as JSON")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    from agt.cli.main import main as agt
    from agt.service.keys import KeyStore

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        assert agt(["train", "--config", str(ROOT / "configs" / "blobs.yaml"), "--out",
                    str(d / "b.h5"), "--quiet"]) == 0
        store = KeyStore.load(d / "keys.json", create=True)
        key = store.add("client")[0]
        store.save()
        port = free_port()
        env = dict(os.environ, OMP_NUM_THREADS="1")
        server = subprocess.Popen(
            [sys.executable, "-c", "import sys; from agt.cli.main import main; "
             "sys.exit(main(sys.argv[1:]))", "serve", "--bounds", str(d / "b.h5"),
             "--mechanism", "exp-radius", "--epsilon", EPSILON, "--ledger", str(d / "l.db"),
             "--budget-epsilon", "1e6", "--keys", str(d / "keys.json"), "--port", str(port)],
            cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        import httpx
        for _ in range(600):
            if server.poll() is not None:
                raise RuntimeError(f"agt serve exited: {server.stderr.read()[-2000:]}")
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        results = {"http": {}, "in_process": {}}
        try:
            for size in sizes:
                for c in clients:
                    runs = [asyncio.run(load(url, key, c, size, args.seconds, seed=r + 10 * c))
                            for r in range(args.repeats)]
                    best = max(runs, key=lambda r: r["requests_per_s"])
                    results["http"][f"{c}x{size}"] = {"runs": runs, "best": best}
                    print(f"HTTP {c:>3} clients x {size:>5} queries: requests/s "
                          f"{spread([r['requests_per_s'] for r in runs])}, labels/s "
                          f"{best['labels_per_s']:.0f}, p50 {best['p50_ms']:.1f} ms, p99 "
                          f"{best['p99_ms']:.1f} ms", flush=True)
                runs = [in_process(d / "b.h5", size, args.seconds, seed=r)
                        for r in range(args.repeats)]
                results["in_process"][str(size)] = runs
                for door in ("release", "answer_batch"):
                    rates = [r[door]["requests_per_s"] for r in runs]
                    print(f"in-process {door:<12} x {size:>5} queries: requests/s "
                          f"{spread(rates)}, labels/s {max(rates) * size:.0f}", flush=True)
                    http_best = max(v["best"]["requests_per_s"] for k, v in
                                    results["http"].items() if k.endswith(f"x{size}"))
                    print(f"  best HTTP / in-process {door}: {http_best / max(rates):.2f}")
        finally:
            server.terminate()
            server.wait(timeout=60)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
