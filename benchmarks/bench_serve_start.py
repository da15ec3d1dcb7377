"""How long `agt serve` takes to become ready, and what its first answers cost.

    python benchmarks/bench_serve_start.py [--repeats 3] [--clients 8]

Setting: the Blobs logistic bundle of `bench_serve.py` (configs/blobs.yaml), `exp-radius`
at eps 0.001, a fresh SQLite ledger and keys file per start. Per start of an `agt serve`
process: the time from launching it to the first 200 from ``/healthz`` (the model has
answered its warm-up query by then), polled every 10 ms; then the latency of the first
single-query request; then, on a second fresh process, ``--clients`` single-query requests
sent at once as soon as it is ready (the slowest of them: before the warm-up existed, every
concurrent first request waited for the model's first use). Each figure is given as the
best of ``--repeats`` starts with the spread (max - min).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_serve import EPSILON, free_port, queries  # noqa: E402


def start(d: Path, key_file: Path, ledger: Path) -> tuple[subprocess.Popen, str, float]:
    """A fresh `agt serve`; returns (process, url, seconds from launch to ready)."""
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from agt.cli.main import main; "
         "sys.exit(main(sys.argv[1:]))", "serve", "--bounds", str(d / "b.h5"),
         "--mechanism", "exp-radius", "--epsilon", EPSILON, "--ledger", str(ledger),
         "--budget-epsilon", "1e6", "--keys", str(key_file), "--port", str(port)],
        cwd=d, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)
    with httpx.Client(timeout=5) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"agt serve exited: {proc.stderr.read()[-2000:]}")
            try:
                if client.get(url + "/healthz").status_code == 200:
                    return proc, url, time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.01)


def predict_ms(url: str, key: str, seed: int) -> float:
    import httpx

    body = {"queries": queries(1, seed).tolist()}
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/predict", json=body, timeout=60,
                   headers={"authorization": f"Bearer {key}"})
    ms = (time.perf_counter() - t0) * 1000
    if r.status_code != 200:
        raise RuntimeError(r.text[:200])
    return ms


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def spread(values: list[float], unit: str, digits: int = 0) -> str:
    return f"{min(values):.{digits}f} {unit} (spread {max(values) - min(values):.{digits}f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    args = ap.parse_args()
    from agt.cli.main import main as agt
    from agt.service.keys import KeyStore

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        assert agt(["train", "--config", str(ROOT / "configs" / "blobs.yaml"), "--out",
                    str(d / "b.h5"), "--quiet"]) == 0
        store = KeyStore.load(d / "keys.json", create=True)
        key = store.add("client")[0]
        store.save()
        ready, first, together = [], [], []
        for r in range(args.repeats):
            proc, url, seconds = start(d, d / "keys.json", d / f"a{r}.db")
            try:
                ready.append(seconds)
                first.append(predict_ms(url, key, 10 * r))
            finally:
                stop(proc)
            proc, url, _ = start(d, d / "keys.json", d / f"b{r}.db")
            try:
                times: list[float] = []
                threads = [threading.Thread(target=lambda i=i: times.append(
                    predict_ms(url, key, 1000 * r + i))) for i in range(args.clients)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                together.append(max(times))
            finally:
                stop(proc)
            print(f"start {r + 1}: ready after {seconds:.2f} s, first answer "
                  f"{first[-1]:.1f} ms, slowest of {args.clients} first answers at once "
                  f"{together[-1]:.1f} ms", flush=True)
        print(f"launch to ready: {spread(ready, 's', 2)}; first answer: "
              f"{spread(first, 'ms', 1)}; slowest of {args.clients} first answers at once: "
              f"{spread(together, 'ms', 1)}")


if __name__ == "__main__":
    main()
