"""Throughput and latency of `agt serve` on loopback, beside in-process releases.

    python benchmarks/bench_serve.py [--clients 1,8,64] [--sizes 1,1000] [--seconds 5]
        [--repeats 3] [--ledgers sqlite,postgres,postgres-x2]
        [--postgres postgresql://postgres@127.0.0.1:5432] [--out FILE.json]

Setting: the Blobs logistic bundle (configs/blobs.yaml, k = 0..199), the exponential
mechanism on the radius at eps 1e-3 per query, a fresh ledger with a budget no run reaches.
Every request asks new queries (random points, so no answer comes from the cache; the
request bodies are made before the clock starts, so the load generator's JSON does not take
the server's cores, and the in-process doors time only the door). For each
number of concurrent clients (keep-alive connections from this process) and request size:
requests and labels per second, and p50 / p99 latency, over ``--seconds`` of load; the
best of ``--repeats`` runs with the spread (max - min) of the throughput. In the same run,
the in-process door: certification plus `Ledger.release` (what `agt predict` does) and plus
`Ledger.answer_batch` (what the service does), on requests of the same sizes; the ratio is
the cost of HTTP and of the service's batching.

Ledgers (``--ledgers``): ``sqlite`` (a file beside the server), ``postgres`` (a fresh
database on the ``--postgres`` server, keys in the ledger) and ``postgres-x2`` (two
replicas on one such database, the clients spread over both). Each HTTP figure is also
given as a ratio to the in-process ``answer_batch`` of the same backend, measured in the
same run.

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


def bodies(size: int, count: int, seed: int) -> list[bytes]:
    """``count`` request bodies of ``size`` new queries each."""
    x = queries(size * count, seed)
    return [json.dumps({"queries": x[i * size:(i + 1) * size].tolist()}).encode()
            for i in range(count)]


#: the most labels and requests per second the prepared bodies cover (3x the goals); a
#: client that runs out makes more during the run (counted in ``made_during_run``)
PREPARED_LABELS_PER_S = 150_000
PREPARED_REQUESTS_PER_S = 1_500


async def load(urls: list[str], key: str, clients: int, size: int, seconds: float,
               seed: int):
    """``clients`` keep-alive connections, each sending one request after the other for
    ``seconds``. The requests are written with asyncio streams, not an HTTP library, and
    their bodies (new queries each) are made before the clock starts: the load generator
    shares the machine's cores with the server and should take little of them (httpx's
    async client could not keep 64 connections busy on 2 cores; making the JSON of a
    1,000-query body took about as long as the server's certification of it)."""
    latencies: list[float] = []
    per_client = int(seconds * min(PREPARED_REQUESTS_PER_S, PREPARED_LABELS_PER_S / size)
                     / clients) + 2
    prepared = [bodies(size, per_client, (seed * 1000 + i) * 100_000) for i in range(clients)]
    made = [0]
    stop_at = time.perf_counter() + seconds

    async def one(i: int):
        # the clients spread over the replicas in turn
        host, port = urls[i % len(urls)].split("//", 1)[1].split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        k = 0
        try:
            while time.perf_counter() < stop_at:
                if k < per_client:
                    body = prepared[i][k]
                else:
                    made[0] += 1
                    body = bodies(size, 1, ((seed * 1000 + i) * 100_000 + k) * 7 + 1)[0]
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
            "requests": done, "made_during_run": made[0]}


def in_process(bundle_path: Path, size: int, seconds: float, seed: int,
               new_ledger) -> dict:
    """Certify + Ledger.release, and certify + Ledger.answer_batch, in this process, each
    on a fresh ledger of ``new_ledger(name)`` (a path or a URL)."""
    import mechanisms
    from agt.certify import Certifier
    from agt.store import read_bundle
    from mechanisms.ledger import AnswerRequest, hash_queries

    bundle = read_bundle(bundle_path)
    certifier = Certifier(bundle)
    mech = mechanisms.make_mechanism("exp-radius", float(EPSILON))
    out = {}
    for door in ("release", "answer_batch"):
        ledger = mechanisms.Ledger.open(new_ledger(door), budget_epsilon=1e6)
        done, k, wall = 0, 0, 0.0
        while wall < seconds:       # only the door is timed, not making the queries
            x = queries(size, seed * 7919 + k)
            k += 1
            t0 = time.perf_counter()
            cert = certifier.certify(x)
            inputs = mechanisms.Certified.from_certificate(cert, hash_queries(x))
            if door == "release":
                ledger.release(mech, inputs)
            else:
                ledger.answer_batch([AnswerRequest(mech, inputs, "bench")])
            wall += time.perf_counter() - t0
            done += 1
        ledger.close()
        out[door] = {"requests_per_s": done / wall, "labels_per_s": done * size / wall}
    return out


def spread(values: list[float]) -> str:
    return f"{max(values):.0f} (spread {max(values) - min(values):.0f})"


class Ledgers:
    """Fresh ledgers of one backend: files in a folder, or databases on a PostgreSQL
    server (dropped at the end)."""

    def __init__(self, kind: str, folder: Path, server: str):
        self.kind, self.folder, self.server, self.made = kind, folder, server, []

    def new(self, name: str) -> str:
        if self.kind == "sqlite":
            path = self.folder / f"{name}-{len(self.made)}.db"
            self.made.append(path)
            return str(path)
        import psycopg
        db = f"agt_bench_{name}_{os.getpid()}_{len(self.made)}"
        with psycopg.connect(f"{self.server}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {db}")
            conn.execute(f"CREATE DATABASE {db}")
        self.made.append(db)
        return f"{self.server}/{db}"

    def drop(self) -> None:
        if self.kind == "sqlite":
            return
        import psycopg
        with psycopg.connect(f"{self.server}/postgres", autocommit=True) as conn:
            for db in self.made:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                             "datname = %s AND pid <> pg_backend_pid()", (db,))
                conn.execute(f"DROP DATABASE IF EXISTS {db}")


def start_servers(d: Path, ledger: str, keys: list[str], replicas: int) -> list:
    """``replicas`` `agt serve` processes on one ledger; returns (process, url) pairs."""
    import httpx

    out = []
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for _ in range(replicas):
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-c", "import sys; from agt.cli.main import main; "
             "sys.exit(main(sys.argv[1:]))", "serve", "--bounds", str(d / "b.h5"),
             "--mechanism", "exp-radius", "--epsilon", EPSILON, "--ledger", ledger,
             "--budget-epsilon", "1e6", *keys, "--port", str(port)],
            cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        out.append((server, url))
        for _ in range(600):
            if server.poll() is not None:
                raise RuntimeError(f"agt serve exited: {server.stderr.read()[-2000:]}")
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,8,64")
    ap.add_argument("--sizes", default="1,1000")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ledgers", default="sqlite",
                    help="comma-separated: sqlite, postgres, postgres-x2")
    ap.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432",
                    help="a PostgreSQL server (trust or a password in the URL)")
    ap.add_argument("--out", help="write the figures as JSON")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    sizes = [int(s) for s in args.sizes.split(",")]
    kinds = args.ledgers.split(",")
    from agt.cli.main import main as agt
    from agt.service.keys import KeyStore, LedgerKeyStore

    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        assert agt(["train", "--config", str(ROOT / "configs" / "blobs.yaml"), "--out",
                    str(d / "b.h5"), "--quiet"]) == 0
        for kind in kinds:
            backend = "sqlite" if kind == "sqlite" else "postgres"
            replicas = 2 if kind.endswith("-x2") else 1
            ledgers = Ledgers(backend, d, args.postgres)
            ledger = ledgers.new("serve")
            if backend == "sqlite":
                store = KeyStore.load(d / "keys.json", create=True)
                key = store.add("client")[0]
                store.save()
                key_args = ["--keys", str(d / "keys.json")]
            else:                   # the keys in the ledger (what replicas share)
                store = LedgerKeyStore(ledger)
                key = store.add("client")[0]
                store.close()
                key_args = []
            servers = start_servers(d, ledger, key_args, replicas)
            urls = [u for _, u in servers]
            res = results[kind] = {"http": {}, "in_process": {}}
            try:
                for size in sizes:
                    for c in clients:
                        runs = [asyncio.run(load(urls, key, c, size, args.seconds,
                                                 seed=r + 10 * c + 1000 * size))
                                for r in range(args.repeats)]
                        best = max(runs, key=lambda r: r["requests_per_s"])
                        res["http"][f"{c}x{size}"] = {"runs": runs, "best": best}
                        print(f"[{kind}] HTTP {c:>3} clients x {size:>5} queries: requests/s "
                              f"{spread([r['requests_per_s'] for r in runs])}, labels/s "
                              f"{best['labels_per_s']:.0f}, p50 {best['p50_ms']:.1f} ms, p99 "
                              f"{best['p99_ms']:.1f} ms", flush=True)
                    runs = [in_process(d / "b.h5", size, args.seconds, seed=r,
                                       new_ledger=ledgers.new)
                            for r in range(args.repeats)]
                    res["in_process"][str(size)] = runs
                    for door in ("release", "answer_batch"):
                        rates = [r[door]["requests_per_s"] for r in runs]
                        print(f"[{kind}] in-process {door:<12} x {size:>5} queries: "
                              f"requests/s {spread(rates)}, labels/s {max(rates) * size:.0f}",
                              flush=True)
                    door = max(r["answer_batch"]["requests_per_s"] for r in runs)
                    for c in clients:
                        http = res["http"][f"{c}x{size}"]["best"]["requests_per_s"]
                        print(f"[{kind}]   {c} clients x {size}: HTTP / in-process "
                              f"answer_batch {http / door:.2f}", flush=True)
            finally:
                for server, _ in servers:
                    server.terminate()
                    server.wait(timeout=60)
                ledgers.drop()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
