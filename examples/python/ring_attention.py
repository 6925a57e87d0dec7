"""Ring attention (context parallelism) with fmha: a causal sequence split into contiguous shards, one per
rank; each rank keeps its queries, passes its K/V shard around the ring, attends to every shard that
precedes or is its own (fmha's forward with LSE), and merges the partial states with
``fmha.merge_state``. The result equals one forward over the whole sequence to the field's error rule.

    torchrun --nproc-per-node 2 examples/python/ring_attention.py        # NCCL, one GPU per rank
    FMHA_LIBRARY=target/release/libfmha.so torchrun --nproc-per-node 2 examples/python/ring_attention.py
                                                                          # host backend: gloo, CPU tensors

With NCCL keep NVLink multicast off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1).
tests/python/test_ring_attention.py runs `check` on two processes.
"""

from __future__ import annotations

import math
import os
import sys

import torch
import torch.distributed as dist

import fmha


def ring_attention(q, k, v, causal=True, group=None):
    """q ``[b, s, h, d]``, k/v ``[b, s, h_k, d]``: this rank's shard (rank r holds tokens ``r·s .. (r+1)·s``
    of each sequence). Returns this shard's output ``[b, s, h, d]`` and LSE ``[b, h, s]`` (natural log).

    While step t attends to the shard of rank ``r − t``, the next shard is already on its way (one
    send/receive pair per step). Partial states are merged in fp32 (one rounding to q's dtype at the end),
    in step order, so the result does not depend on timing."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    b, s, h, d = q.shape
    rows = lambda o: o.reshape(b * s, h, o.shape[-1])  # noqa: E731 - states as [tokens, heads, d]
    out = lse = None
    kv = torch.stack([k, v]).contiguous()
    for step in range(world):
        pending = []
        if step + 1 < world:
            incoming = torch.empty_like(kv)
            pending = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, kv, (rank + 1) % world, group),
                dist.P2POp(dist.irecv, incoming, (rank - 1) % world, group),
            ])
        src = (rank - step) % world
        if not causal or src <= rank:
            # The diagonal shard is causal (square, so either corner); earlier shards are fully visible.
            o, l, _ = fmha.flash_attn_func(q, kv[0], kv[1], causal=causal and src == rank, return_attn_probs=True)
            o, l = rows(o).float(), l.transpose(1, 2).reshape(b * s, h)
            if out is None:
                out, lse = o, l
            else:
                out, lse = fmha.merge_state(out, lse, o, l, out_dtype=torch.float32)
        for req in pending:
            req.wait()
        if pending:
            kv = incoming
    return out.to(q.dtype).reshape(b, s, h, d), lse.reshape(b, s, h).transpose(1, 2)


def reference(q, k, v, first_row, causal):
    """float64 attention of queries at global positions ``first_row + i`` against all keys ``[b, S, h_k, d]``."""
    g = q.shape[2] // k.shape[2]
    q64, k64, v64 = q.double(), k.double().repeat_interleave(g, 2), v.double().repeat_interleave(g, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q64, k64) / math.sqrt(q.shape[-1])
    if causal:
        i = torch.arange(q.shape[1], device=q.device)[:, None] + first_row
        j = torch.arange(k.shape[1], device=q.device)[None, :]
        scores = scores.masked_fill(j > i, -math.inf)
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, -1), v64), torch.logsumexp(scores, -1)


def check(device, shape=(2, 1024, 8, 2, 128), dtype=torch.bfloat16, causal=True, seed=0):
    """Ring attention on this rank's shard vs one fmha forward over the whole sequence, both against
    float64: the ring's output error at most 2× the single forward's plus bf16's half-ulp at 1
    (design.md's rule), its LSE within 1e-4 relative. Every rank draws the same full inputs. Returns a
    one-line summary; raises AssertionError on a mismatch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    b, S, h, hk, d = shape
    s = S // world
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, S, n, d, generator=gen).to(device, dtype) for n in (h, hk, hk))
    mine = slice(rank * s, (rank + 1) * s)
    out, lse = ring_attention(q[:, mine].contiguous(), k[:, mine].contiguous(), v[:, mine].contiguous(), causal)
    whole, whole_lse, _ = fmha.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    o_ref, lse_ref = reference(q[:, mine], k, v, rank * s, causal)
    ring_err = (out.double() - o_ref).abs().max().item()
    one_err = (whole[:, mine].double() - o_ref).abs().max().item()
    lse_err = (lse.double() - lse_ref).abs().max().item()
    floor = 0.25 * 2.0**-7
    assert ring_err <= 2 * one_err + floor, f"rank {rank}: ring error {ring_err:.3g} vs one forward's {one_err:.3g}"
    assert lse_err <= 1e-4 * (1 + lse_ref.abs().max().item()), f"rank {rank}: LSE error {lse_err:.3g}"
    assert torch.equal(whole_lse[..., mine].isinf(), lse.isinf()), f"rank {rank}: empty rows differ"
    return f"rank {rank}/{world}: ring max err {ring_err:.3g}, one forward {one_err:.3g}, LSE err {lse_err:.3g}"


def init(rank, world, init_method):
    """Joins the process group: NCCL with one GPU per rank on a GPU build, gloo with CPU tensors on the
    host backend. Returns the device of this rank's tensors."""
    if fmha.backend_name() == "host":
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
        return torch.device("cpu")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    torch.cuda.set_device(rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world, device_id=device)
    return device


if __name__ == "__main__":
    device = init(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://")
    try:
        print(check(device), flush=True)
    finally:
        dist.destroy_process_group()
    sys.exit(0)
