"""Backward correctness: dQ, dK, dV against autograd of float64 (float32) PyTorch math with the field's rule (3x
the error of the same computation in the input precision + a small floor), through the autograd functions
and through the internal call on poisoned gradients; batch and varlen (zero-length sequences give exact
zeros), masks x GQA x head dims x dtypes, deterministic and not, sync and async workspace preparation;
and bitwise determinism over repeated runs.

Runs where the build has a backward (the host backend now; GPU builds once their backward kernels land):
an FMHA_ERR_UNSUPPORTED for a combination the registry does not list skips, with fmha's message.
"""

import pytest
import torch

import fmha
from fmha import ops

from attn_ref import (
    DTYPE_IDS,
    DTYPES,
    FLOOR_GRAD,
    LARGE,
    NONE,
    TOP_LEFT,
    attention_ref,
    call_or_skip,
    check_rule,
    cu_seqlens,
    default_scale,
    flash_mask,
    keep_mask,
    poisoned,
    randn,
    ref_dtype_for,
)

MASKS = {
    "none": ("flash", False, (-1, -1)),
    "causal": ("flash", True, (-1, -1)),
    "causal_top_left": ("fmha", TOP_LEFT, -1, 0),
    "window": ("flash", False, (13, 5)),
    "window_top_left": ("fmha", TOP_LEFT, 6, 20),
}
HEADS = {"mha": (8, 8), "gqa4": (8, 2), "gqa8": (16, 2)} if LARGE else {"mha": (2, 2), "gqa4": (4, 1), "gqa8": (8, 1)}
BATCH_LENGTHS = [(128, 128), (129, 1000), (1000, 127)] if LARGE else [(97, 129)]
LENGTHS = [(1, 1), (17, 1), (1, 17), (127, 128), (129, 127), (17, 1000)]
if LARGE:
    LENGTHS += [(1000, 1000), (4096, 4096), (1, 4096), (4096, 129)]
HEAD_DIMS = [(32, 32), (64, 64), (96, 96), (128, 128), (256, 256), (128, 64), (64, 128), (192, 128)]
VARLEN = {"zeros": ([0, 17, 1, 128, 0, 129], [5, 0, 129, 127, 0, 200])}
if LARGE:
    VARLEN["long"] = ([4096, 1000, 17, 0], [4096, 1, 1000, 4096])


def resolve(mask, sk_bound):
    if mask[0] == "flash":
        return flash_mask(mask[1], mask[2], sk_bound)
    return mask[1:]


def fmha_forward(q, k, v, mask, deterministic, varlen):
    """The public autograd entry point for this mask (flash-attn API, or fmha.attention for top-left)."""
    if mask[0] == "flash":
        if varlen:
            cu_q, cu_k, max_q, max_k = varlen
            return fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=mask[1],
                                               window_size=mask[2], deterministic=deterministic)
        return fmha.flash_attn_func(q, k, v, causal=mask[1], window_size=mask[2], deterministic=deterministic)
    kw = {}
    if varlen:
        kw = dict(zip(("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"), varlen))
    out, _ = fmha.attention(q, k, v, mask="top_left", window_size=mask[2:], deterministic=deterministic, **kw)
    return out


def reference_grads(q, k, v, dout, mask_resolved, scale, varlen, upcast):
    """Autograd of the reference: float64/float32 (upcast) or the input precision (flash-attn's `pt`)."""
    ref_dtype = torch.float64
    if varlen:
        lens_q = torch.diff(varlen[0]).tolist()
        lens_k = torch.diff(varlen[1]).tolist()
        ref_dtype = ref_dtype_for(q.shape[1] * max(lens_q) * max(lens_k))
    else:
        ref_dtype = ref_dtype_for(q.shape[0] * q.shape[2] * q.shape[1] * k.shape[1])
    cast = (lambda t: t.detach().to(ref_dtype)) if upcast else (lambda t: t.detach().clone())
    qr, kr, vr = (cast(t).requires_grad_() for t in (q, k, v))
    kw = dict(upcast=False, reorder_ops=True) if not upcast else dict(ref_dtype=ref_dtype)
    if varlen:
        cu_q, cu_k = varlen[0].tolist(), varlen[1].tolist()
        outs = []
        for b in range(len(cu_q) - 1):
            qb, kb, vb = qr[cu_q[b]:cu_q[b + 1]][None], kr[cu_k[b]:cu_k[b + 1]][None], vr[cu_k[b]:cu_k[b + 1]][None]
            keep = keep_mask(qb.shape[1], kb.shape[1], *mask_resolved, device=q.device)
            outs.append(attention_ref(qb, kb, vb, keep, scale, **kw)[0][0])
        out = torch.cat(outs, 0)
    else:
        keep = keep_mask(q.shape[1], k.shape[1], *mask_resolved, device=q.device)
        out = attention_ref(qr, kr, vr, keep, scale, **kw)[0]
    return torch.autograd.grad(out, (qr, kr, vr), dout.to(out.dtype))


def check_backward(q, k, v, mask, deterministic, varlen=None, prepare=None, internal=True):
    """fmha's gradients (autograd, then the internal call on poisoned buffers) against the references."""
    d, dv = q.shape[-1], v.shape[-1]
    sk_bound = varlen[3] if varlen else k.shape[1]
    resolved = resolve(mask, sk_bound)
    masked = resolved[0] != NONE
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    out = call_or_skip(lambda: fmha_forward(q, k, v, mask, deterministic, varlen), op="fwd", dtype=q.dtype,
                       hdim_q=d, hdim_v=dv, masked=masked)
    dout = torch.randn_like(out)
    grads = call_or_skip(lambda: torch.autograd.grad(out, (q, k, v), dout), op="bwd", dtype=q.dtype, hdim_q=d,
                         hdim_v=dv, masked=masked, deterministic=deterministic)
    scale = default_scale(d)
    refs = reference_grads(q, k, v, dout, resolved, scale, varlen, upcast=True)
    pts = reference_grads(q, k, v, dout, resolved, scale, varlen, upcast=False)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, refs, pts):
        check_rule(name, g, r, p, 3, FLOOR_GRAD)

    if internal:
        # The same backward through the internal call, with NaN-poisoned gradients: every entry written.
        vl = dict(zip(("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"), varlen or (None,) * 4))
        o, lse = ops._fwd(q.detach(), k.detach(), v.detach(), mask_type=resolved[0], window=resolved[1:], **vl)
        bufs = [poisoned(t.shape, t.dtype) for t in (q, k, v)]
        ops._bwd(dout, q.detach(), k.detach(), v.detach(), o, lse, mask_type=resolved[0], window=resolved[1:],
                 deterministic=deterministic, dq=bufs[0], dk=bufs[1], dv=bufs[2], prepare=prepare, **vl)
        for name, g, r, p, a in zip(("dq", "dk", "dv"), bufs, refs, pts, grads):
            check_rule(name + " (poisoned)", g, r, p, 3, FLOOR_GRAD)
            if deterministic:
                assert torch.equal(g, a), f"{name}: deterministic runs differ (autograd vs internal call)"
    return grads


def varlen_inputs(dtype, lens_q, lens_k, hq, hk, d, dv):
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q = randn(sum(lens_q), hq, d, dtype=dtype)
    k = randn(sum(lens_k), hk, d, dtype=dtype)
    v = randn(sum(lens_k), hk, dv, dtype=dtype)
    return q, k, v, (cu_q, cu_k, max(lens_q), max(lens_k))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("sq,sk", BATCH_LENGTHS, ids=lambda x: str(x))
@pytest.mark.parametrize("d", [64, 128] if LARGE else [64])
@pytest.mark.parametrize("heads", list(HEADS), ids=str)
@pytest.mark.parametrize("mask", list(MASKS), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_batch(dtype, mask, heads, d, sq, sk, deterministic):
    hq, hk = HEADS[heads]
    q, k, v = randn(2, sq, hq, d, dtype=dtype), randn(2, sk, hk, d, dtype=dtype), randn(2, sk, hk, d, dtype=dtype)
    check_backward(q, k, v, MASKS[mask], deterministic)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("heads", list(HEADS), ids=str)
@pytest.mark.parametrize("mask", list(MASKS), ids=str)
@pytest.mark.parametrize("lengths", list(VARLEN), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_varlen(dtype, lengths, mask, heads, deterministic):
    hq, hk = HEADS[heads]
    lens_q, lens_k = VARLEN[lengths]
    q, k, v, vl = varlen_inputs(dtype, lens_q, lens_k, hq, hk, 64, 64)
    dq, dk, dv = check_backward(q, k, v, MASKS[mask], deterministic, varlen=vl)
    # zero-length sequences: a sequence with no queries gives exactly zero dK/dV, one with no keys zero dQ
    cu_q, cu_k = vl[0].tolist(), vl[1].tolist()
    for b in range(len(lens_q)):
        if lens_q[b] == 0 and lens_k[b] > 0:
            assert torch.all(dk[cu_k[b]:cu_k[b + 1]] == 0) and torch.all(dv[cu_k[b]:cu_k[b + 1]] == 0), (
                f"sequence {b} has no queries: dK/dV must be exactly 0")
        if lens_k[b] == 0 and lens_q[b] > 0:
            assert torch.all(dq[cu_q[b]:cu_q[b + 1]] == 0), f"sequence {b} has no keys: dQ must be exactly 0"


@pytest.mark.parametrize("mask", ["none", "causal"], ids=str)
@pytest.mark.parametrize("sq,sk", LENGTHS, ids=lambda x: str(x))
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_lengths(dtype, sq, sk, mask):
    b = 1 if max(sq, sk) >= 4096 else 2
    hq, hk = (8, 2) if LARGE else (2, 1)
    q, k, v = randn(b, sq, hq, 64, dtype=dtype), randn(b, sk, hk, 64, dtype=dtype), randn(b, sk, hk, 64, dtype=dtype)
    check_backward(q, k, v, MASKS[mask], False, internal=False)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("dims", HEAD_DIMS, ids=lambda x: f"d{x[0]}x{x[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_head_dims(dtype, dims, deterministic):
    d, dv = dims
    q, k, v = randn(2, 65, 4, d, dtype=dtype), randn(2, 80, 2, d, dtype=dtype), randn(2, 80, 2, dv, dtype=dtype)
    check_backward(q, k, v, MASKS["causal"], deterministic, internal=False)


@pytest.mark.parametrize("padding", ["build", "forced"])
@pytest.mark.parametrize("dims", [(59, 59), (111, 111), (59, 111), (100, 36)], ids=lambda x: f"d{x[0]}x{x[1]}")
def test_odd_head_dims_are_padded(dims, padding, monkeypatch):
    """Head dims that are not whole 16-byte vectors: the flash-attn entry points pad them with zero columns
    for kernels that read vectors (a GPU build; "forced" makes the host backend take the same path) and
    slice the output and gradients back; the softmax scale stays the unpadded head dim's."""
    if padding == "forced":
        monkeypatch.setattr(ops, "_vector_bytes", lambda: 16)
    d, dv = dims
    dtype = torch.bfloat16
    q, k, v = randn(2, 65, 4, d, dtype=dtype), randn(2, 80, 2, d, dtype=dtype), randn(2, 80, 2, dv, dtype=dtype)
    grads = check_backward(q, k, v, MASKS["causal"], False, internal=False)
    assert [tuple(g.shape) for g in grads] == [tuple(t.shape) for t in (q, k, v)]
    out, lse, _ = fmha.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (2, 65, 4, dv) and lse.shape == (2, 4, 65)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("prepare", ["sync", "auto", "host", "device"])
@pytest.mark.parametrize("mode", ["batch", "varlen"])
def test_prepare_methods(mode, prepare, deterministic):
    """The workspace prepared synchronously (host seqstarts) and asynchronously (device seqstarts, each
    method) gives correct gradients."""
    dtype = torch.bfloat16
    if mode == "varlen":
        q, k, v, vl = varlen_inputs(dtype, [40, 0, 77, 1], [64, 9, 0, 100], 4, 2, 64, 64)
        check_backward(q, k, v, MASKS["causal"], deterministic, varlen=vl, prepare=prepare)
    else:
        q, k, v = randn(2, 70, 4, 64, dtype=dtype), randn(2, 90, 2, 64, dtype=dtype), randn(2, 90, 2, 64, dtype=dtype)
        check_backward(q, k, v, MASKS["window"], deterministic, prepare=prepare)


def _repeat_grads(fn, runs):
    first = fn()
    for i in range(runs - 1):
        again = fn()
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), f"{name} differs bitwise between run 0 and run {i + 1} (deterministic=True)"
    return first


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_deterministic_varlen_gqa_causal(dtype):
    """20 backward runs with deterministic=True give bitwise identical dQ/dK/dV (varlen, GQA, causal)."""
    lens_q = [200, 0, 33, 129, 1] if not LARGE else [1000, 0, 333, 4096, 1, 129]
    lens_k = [256, 17, 0, 129, 300] if not LARGE else [1200, 17, 0, 4096, 300, 129]
    hq, hk = (8, 2) if not LARGE else (16, 2)
    q, k, v, vl = varlen_inputs(dtype, lens_q, lens_k, hq, hk, 64, 64)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = call_or_skip(lambda: fmha.flash_attn_varlen_func(q, k, v, *vl, causal=True, deterministic=True),
                       op="fwd", dtype=dtype, hdim_q=64, hdim_v=64, masked=True)
    dout = torch.randn_like(out)

    def grads():
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    call_or_skip(grads, op="bwd", dtype=dtype, hdim_q=64, hdim_v=64, masked=True, deterministic=True)
    _repeat_grads(grads, 20)


def test_deterministic_batch():
    dtype = torch.float16
    q, k, v = randn(2, 150, 8, 128, dtype=dtype), randn(2, 260, 1, 128, dtype=dtype), randn(2, 260, 1, 128,
                                                                                             dtype=dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = call_or_skip(lambda: fmha.flash_attn_func(q, k, v, window_size=(50, 10), deterministic=True), op="fwd",
                       dtype=dtype, hdim_q=128, hdim_v=128, masked=True)
    dout = torch.randn_like(out)
    fn = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # noqa: E731
    call_or_skip(fn, op="bwd", dtype=dtype, hdim_q=128, hdim_v=128, masked=True, deterministic=True)
    _repeat_grads(fn, 5)


def test_loss_backward_through_module():
    """A plain training-style use: loss.backward() fills .grad of leaf tensors with the right shapes
    (dK/dV with the kv heads), for expanded/strided upstream gradients too."""
    dtype = torch.bfloat16
    q = randn(2, 33, 4, 64, dtype=dtype, requires_grad=True)
    k = randn(2, 40, 2, 64, dtype=dtype, requires_grad=True)
    v = randn(2, 40, 2, 64, dtype=dtype, requires_grad=True)
    out = call_or_skip(lambda: fmha.flash_attn_func(q, k, v, causal=True), op="fwd", dtype=dtype, hdim_q=64,
                       hdim_v=64, masked=True)
    call_or_skip(lambda: out.sum().backward(), op="bwd", dtype=dtype, hdim_q=64, hdim_v=64, masked=True)
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    assert all(torch.isfinite(g).all() for g in (q.grad, k.grad, v.grad))
