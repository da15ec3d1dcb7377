"""The GPU check: one command that runs agt's CUDA code path and times it against the CPU.

    python benchmarks/gpu_check.py --out gpu_check.json [--budget 420]
        [--imdb-n 25000] [--octmnist-n 20000] [--imdb-queries 5000]
        [--octmnist-queries 1000] [--quick]

Stages, each recorded in the JSON as soon as it ends (so a run cut short keeps what it did):

1. device: GPU name, memory, torch, CUDA and cuDNN versions, CPU cores.
2. tests: the tests marked ``cuda`` (tests/agt/test_cuda.py and test_hidden_screen.py's
   screened-vs-reference search on the GPU; tests/agt/test_cuda.py: CUDA- and CPU-trained bundles
   of one config each hold the other's nominal parameters in their k >= 1 boxes; a
   CUDA-trained bundle survives retraining on neighbours, on both devices; strict kernels
   active and restored), the torch merge of factored bounds on the GPU against the CPU's
   reference multisets (tests/agt/test_topk_torch.py, marked ``cuda``) and the strict-kernel
   tests, which then take their CUDA branch.
3. imdb: the IMDB head (configs/imdb.yaml: MLP 768-100-1, sgdm, 3 full-batch steps,
   float32) on generated data of the paper's size (25,000 x 768 by default), k grid
   {0, 10, 100, 1000}: nominal training and AGT training on CUDA and on the CPU, AGT time
   per k relative to nominal on the same device, and certifying 5,000 queries (with the
   hidden-layer screen; on 300 of them also with it switched off, radii compared; on CUDA
   the CPU's radii and predictions for the same bundle, as the fraction that agree). On
   CUDA the AGT training takes the factored exact rule's torch merge (agt/topk_torch.py);
   a second AGT training with every bound materialised (AGT_FACTORED_MERGE=materialise,
   the path before it) gives its time per k and how far the two bundles' boxes lie apart.
4. octmnist: the OctMNIST head (configs/octmnist.yaml: a frozen conv prefix, dense head
   3200-100-1, sgdm with Nesterov, 4 full-batch steps) on generated 28 x 28 images (a subset
   of the paper's 97,477 by default, to fit the check's time), k grid {0, 10, 100}: the same
   figures, certifying 1,000 queries.

Every timing is one run (the device is lent for minutes), after an untimed small training in
the same process; the JSON says so. The CPU figures use every core of the machine the check
runs on. Nothing here needs the real data.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agt.threads import apply_recommended_environment  # noqa: E402

apply_recommended_environment()      # before torch loads: deterministic cuBLAS needs it

from benchmarks._common import imdb_data, octmnist_data, pipeline_config  # noqa: E402,F401

IMDB_K = "0,10,100,1000"
OCTMNIST_K = "0,10,100"


def device_info() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "cpu_cores": os.cpu_count(), "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count)
    return info


def run_tests(out_dir: Path) -> dict:
    """The cuda-marked tests and the strict-kernel tests, in a child pytest."""
    report = out_dir / "cuda_tests.xml"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         f"--junitxml={report}", "tests/agt/test_cuda.py", "tests/agt/test_strict_kernels.py",
         "tests/agt/test_hidden_screen.py::"
         "test_screened_search_on_cuda_decides_as_the_reference_on_cuda",
         "tests/agt/test_topk_torch.py::test_cuda_torch_merge_keeps_the_cpu_reference_multisets",
         "tests/agt/test_topk_torch.py::"
         "test_cuda_training_takes_the_torch_merge_and_matches_the_cpu_bundle"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    summary = {"returncode": proc.returncode, "seconds": round(time.perf_counter() - t0, 1),
               "tail": proc.stdout[-2500:] + proc.stderr[-1000:]}
    if report.is_file():
        import xml.etree.ElementTree as ET

        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        summary.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors",
                                                          "skipped")})
        summary["skipped_tests"] = [c.get("name") for c in suite.iter("testcase")
                                    if c.find("skipped") is not None]
    return summary


def time_pipeline(name: str, n: int, device: str, k_values: str, queries: int) -> dict:
    """Nominal and AGT training, and certification, of one pipeline on one device."""
    import numpy as np
    import torch

    from agt.certify import Certifier
    from agt.store import from_result
    from agt.training import train

    ds = imdb_data(n) if name == "imdb" else octmnist_data(n)
    cfg = pipeline_config(name, device, k_values)
    # a small run first, untimed: the process's first training pays the device's start-up
    # (CUDA context, kernel loading, allocator growth), which is not the pipeline's cost
    small = imdb_data(200) if name == "imdb" else octmnist_data(50)
    train(pipeline_config(name, device, "0,1"), small)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    out = {"device": device, "n_train": n, "k_values": k_values}
    t0 = time.perf_counter()
    train(cfg, ds, with_bounds=False)
    sync()
    out["nominal_s"] = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    res = train(cfg, ds)
    sync()
    out["agt_s"] = time.perf_counter() - t0
    n_k = len(res.k_values)
    out["agt_per_k_over_nominal"] = out["agt_s"] / n_k / out["nominal_s"]
    if device == "cuda":
        out["peak_gpu_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if device == "cuda":
        # the factored exact rule's torch merge (agt/topk_torch.py) took the run above; the
        # same training with every bound materialised (the path before it) for comparison
        import agt.topk as topk

        topk.FACTORED_OFF = True
        try:
            t0 = time.perf_counter()
            old = train(cfg, ds)
            sync()
            out["agt_materialised_s"] = time.perf_counter() - t0
        finally:
            topk.FACTORED_OFF = False
        out["agt_materialised_per_k_over_nominal"] = (out["agt_materialised_s"] / n_k
                                                      / out["nominal_s"])
        out["factored_vs_materialised_max_box_gap"] = max(
            float((x[n] - y[n]).abs().max())
            for x, y in ((res.lower, old.lower), (res.upper, old.upper)) for n in x)
    bundle = from_result(res)
    xq = ds.x_test[:queries]
    t0 = time.perf_counter()
    cert = Certifier(bundle, device=device).certify(xq)
    sync()
    out["certify_s"] = time.perf_counter() - t0
    out["queries"] = len(xq)
    out["queries_per_s"] = len(xq) / out["certify_s"]
    out["certified_fraction"] = {str(k): round(v, 4) for k, v in
                                 cert.certified_fraction().items()}
    # the hidden-layer screen against the reference on this device (a few hundred queries:
    # the reference carries a weight box per query), and the radii of both devices
    certifier = Certifier(bundle, device=device)
    few = xq[:min(len(xq), 300)]
    t0 = time.perf_counter()
    screened = certifier.certify(few)
    sync()
    screened_s = time.perf_counter() - t0
    certifier._hidden = False
    t0 = time.perf_counter()
    reference = certifier.certify(few)
    sync()
    out["reference_queries_per_s"] = len(few) / (time.perf_counter() - t0)
    out["screened_queries_per_s_small"] = len(few) / screened_s
    out["screened_radii_equal_reference"] = bool(np.array_equal(screened.radius,
                                                                reference.radius))
    if device == "cuda":
        cpu = Certifier(bundle, device="cpu").certify(xq)
        out["cpu_gpu_same_predictions"] = float((cpu.prediction == cert.prediction).mean())
        out["cpu_gpu_same_radii"] = float((cpu.radius == cert.radius).mean())
    out["test_accuracy"] = float((cert.prediction == ds.y_test[:queries]).mean())
    return out


def _child(kind: str, kwargs: dict, timeout: float) -> dict:
    """A stage in a fresh process (its own peak memory, a clean CUDA context) under a
    timeout; a stage that runs out of time is recorded as such."""
    code = ("import json, sys; sys.path.insert(0, 'benchmarks'); import gpu_check; "
            f"print('RESULT ' + json.dumps(gpu_check.{kind}(**json.loads(sys.argv[1]))))")
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], cwd=ROOT,
                              capture_output=True, text=True, timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        return {"timeout_s": round(timeout, 1), **kwargs}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": (proc.stderr or proc.stdout)[-2000:], **kwargs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--budget", type=float, default=420.0,
                    help="seconds for the whole check; later stages get what is left")
    ap.add_argument("--imdb-n", type=int, default=25_000)
    ap.add_argument("--octmnist-n", type=int, default=20_000)
    ap.add_argument("--imdb-queries", type=int, default=5_000)
    ap.add_argument("--octmnist-queries", type=int, default=1_000)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a dry run on a laptop)")
    ap.add_argument("--no-tests", action="store_true", help="timings only")
    args = ap.parse_args()
    if args.quick:
        args.imdb_n, args.octmnist_n = 1_000, 300
        args.imdb_queries, args.octmnist_queries = 300, 100
    start = time.perf_counter()
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    result = {"note": "one run per figure (the device is lent for minutes), after an untimed "
                      "warm-up training; CPU figures use every core of this machine",
              "device": device_info()}

    def save():
        result["elapsed_s"] = round(time.perf_counter() - start, 1)
        out_path.write_text(json.dumps(result, indent=1))

    def left() -> float:
        return args.budget - (time.perf_counter() - start)

    save()
    if not args.no_tests:
        result["tests"] = run_tests(out_path.parent)
        save()
    devices = ["cuda", "cpu"] if result["device"]["cuda_available"] else ["cpu"]
    plan = [(name, n, k_values, queries, device)
            for name, n, k_values, queries in (
                ("imdb", args.imdb_n, IMDB_K, args.imdb_queries),
                ("octmnist", args.octmnist_n, OCTMNIST_K, args.octmnist_queries))
            for device in devices]
    for i, (name, n, k_values, queries, device) in enumerate(plan):
        # every stage left gets an equal share of the time left
        result.setdefault(name, {})[device] = _child("time_pipeline", dict(
            name=name, n=n, device=device, k_values=k_values, queries=queries),
            left() / (len(plan) - i))
        gpu, cpu = result[name].get("cuda", {}), result[name].get("cpu", {})
        if "agt_s" in gpu and "agt_s" in cpu:
            result[name]["cpu_over_cuda"] = {k: cpu[k] / gpu[k]
                                             for k in ("nominal_s", "agt_s", "certify_s")}
        save()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
