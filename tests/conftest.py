"""Test-session settings: deterministic, and robust on a loaded 2-core machine."""

import os

from agt.threads import apply_recommended_environment

# what the command line does before torch loads: OpenMP threads that spin while waiting make
# tiny tensor ops hundreds of times slower when another process holds the other core, and
# CUDA runs need the deterministic cuBLAS workspace (agt.tensors.strict_kernels)
apply_recommended_environment()

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def private_ledger_dir(tmp_path_factory):
    """Default ledgers (~/.agt/ledgers) go to a temporary folder during the tests."""
    previous = os.environ.get("AGT_LEDGER_DIR")
    os.environ["AGT_LEDGER_DIR"] = str(tmp_path_factory.mktemp("ledgers"))
    yield
    if previous is None:
        os.environ.pop("AGT_LEDGER_DIR", None)
    else:
        os.environ["AGT_LEDGER_DIR"] = previous


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only add contention (and make timings erratic)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
