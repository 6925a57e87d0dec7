"""pytest setup for fmha's Python tests.

Runs on the build that `FMHA_LIBRARY` names (else the package's own lookup): the host backend with CPU
tensors and a small grid, or a GPU build with CUDA tensors and the full grid. Inputs are random and fresh
each run; the seed is printed in the header and `FMHA_TEST_SEED=<seed>` replays a run.

The package is the source tree's (python/), or with `FMHA_TEST_INSTALLED=1` the installed one (a wheel
with its own libfmha). Without PyTorch only the tests that need none can run (test_signatures.py).
"""

import os
import sys
import time
import zlib

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(REPO, "python")
INSTALLED = os.environ.get("FMHA_TEST_INSTALLED") == "1"
if not INSTALLED:
    sys.path.insert(0, SOURCE)

try:
    import torch
except ModuleNotFoundError:
    torch = None

import fmha  # noqa: E402

if INSTALLED and os.path.abspath(fmha.__file__).startswith(SOURCE + os.sep):
    raise RuntimeError(f"FMHA_TEST_INSTALLED=1, but fmha is imported from the source tree ({fmha.__file__})")

SEED = int(os.environ.get("FMHA_TEST_SEED", str(time.time_ns() % (1 << 31))))


def pytest_report_header(config):
    try:
        lib = f"fmha {fmha.version()} backend {fmha.backend_name()} from {fmha.library_path()}"
        n = len(fmha.registry())
        lib += f", {n} registry instances"
    except Exception as e:  # noqa: BLE001 - the header must not hide the error
        lib = f"fmha library not loaded: {e}"
    lib += f" (package {os.path.dirname(fmha.__file__)})"
    if torch is None:
        return [lib, f"no torch, FMHA_TEST_SEED={SEED}"]
    dev = ""
    if torch.cuda.is_available():
        dev = f", GPU {torch.cuda.get_device_name()}"
    return [lib, f"torch {torch.__version__}{dev}, FMHA_TEST_SEED={SEED}"]


@pytest.fixture(autouse=True)
def _seed(request):
    """A fresh seed per test, derived from the run's seed and the test's id (reproducible with the seed)."""
    if torch is not None:
        torch.manual_seed(SEED ^ zlib.crc32(request.node.nodeid.encode()))
    yield
