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


#: test files that run for minutes on one worker (the tutorials run as printed, the quick
#: studies): started first, so that the other worker fills the time beside them instead of
#: idling while one of them finishes last (longest-first scheduling of `--dist loadfile`)
_LONG_FILES = ("tests/test_docs.py", "tests/experiments/test_experiments.py",
               "tests/experiments/test_tradeoffs.py", "tests/experiments/test_pate_table.py")


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return _LONG_FILES.index(path) if path in _LONG_FILES else len(_LONG_FILES)

    items.sort(key=rank)      # stable: the order inside each group is kept
