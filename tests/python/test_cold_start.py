"""No host synchronization on a cold start: with the GPU kept busy for over a second, the first forward and
backward of a never-seen shape return in a small fraction of that time, for batch mode, varlen and varlen
deterministic. Each case runs in a fresh process (cold_start_probe.py), after one fmha call of another shape
or after fmha.load_kernels() at startup (loading a kernel module can wait for the device, docs/perf.md).
GPU builds only."""

import json
import os
import subprocess
import sys

import pytest

from attn_ref import GPU

BUSY_MS = 1500.0
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cold_start_probe.py")


def probe(mode, *extra):
    result = subprocess.run(
        [sys.executable, PROBE, "--mode", mode, "--busy-ms", str(BUSY_MS), *extra],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert result.returncode == 0, f"probe failed:\n{result.stdout}\n{result.stderr}"
    line = [l for l in result.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)


@pytest.mark.skipif(not GPU, reason="the host backend runs the work on its own threads: nothing to overlap")
@pytest.mark.parametrize("start", ["--warm", "--load-kernels"])
@pytest.mark.parametrize("mode", ["batch", "varlen", "varlen_det"])
def test_first_call_of_a_new_shape_does_not_wait_for_the_gpu(mode, start):
    r = probe(mode, start)
    print(json.dumps(r))
    assert r["finite"]
    assert r["until_done_ms"] > 0.9 * BUSY_MS, f"the GPU was not kept busy: {r}"
    assert r["host_ms"] < 0.1 * BUSY_MS, f"forward + backward blocked the host: {r}"
