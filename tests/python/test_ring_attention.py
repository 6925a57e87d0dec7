"""Ring attention over two ranks (examples/python/ring_attention.py): every rank's shard of a causal GQA
attention, attended shard by shard as K/V pass around the ring and merged with fmha.merge_state, against
one fmha forward over the whole sequence and float64. NCCL with one GPU per rank on a GPU build (needs two
GPUs, else skipped), gloo with CPU tensors on the host backend (so CI runs the algorithm too)."""

import os
import sys
import tempfile
import time

import pytest
import torch
import torch.multiprocessing as mp

from attn_ref import HOST

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "examples", "python"))

import ring_attention  # noqa: E402

WORLD = 2
DEADLINE_S = 150


def _rank(rank, init_method, shape, causal, seed, results):
    import torch.distributed as dist

    device = ring_attention.init(rank, WORLD, init_method)
    try:
        results.put(ring_attention.check(device, shape=shape, causal=causal, seed=seed))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put(f"FAIL rank {rank}: {type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_ring_attention_matches_one_forward(causal):
    if not HOST and torch.cuda.device_count() < WORLD:
        pytest.skip(f"ring attention needs {WORLD} GPUs, this machine has {torch.cuda.device_count()}")
    shape = (1, 256, 4, 2, 64) if HOST else (2, 4096, 32, 8, 128)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    seed = int(torch.randint(0, 1 << 31, (1,)))  # every rank draws the same inputs from it
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init_method = "file://" + os.path.join(tmp, "rendezvous")
        procs = mp.start_processes(
            _rank, args=(init_method, shape, causal, seed, results), nprocs=WORLD, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + DEADLINE_S
        while not procs.join(timeout=5):
            if time.monotonic() > deadline:
                for p in procs.processes:
                    p.kill()
                pytest.fail(f"ring attention did not finish in {DEADLINE_S} s")
    lines = [results.get() for _ in range(WORLD)]
    print("\n".join(lines))
    assert not [x for x in lines if x.startswith("FAIL")], "\n".join(lines)
