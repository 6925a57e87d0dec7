"""flash-attn's packed variants (flash_attn_qkvpacked_func, flash_attn_kvpacked_func and their varlen forms):
out and the gradients of the packed tensors against float64 autograd of the reference with the field's rule
(2x / 3x the same-precision error + a floor), the same bits as the unpacked functions on contiguous copies
(the packed ones only take views: strides handled, nothing lost on the way back to dqkv / dkv), no copies
of the inputs, flash-attn's return convention, refusals and shape errors naming the argument."""

import pytest
import torch

import fmha
from fmha import ops

from attn_ref import (
    DTYPE_IDS,
    DTYPES,
    FLOOR_GRAD,
    FLOOR_OUT,
    attention_ref,
    attention_ref_varlen,
    call_or_skip,
    check_rule,
    cu_seqlens,
    default_scale,
    flash_mask,
    keep_mask,
    randn,
)

H, H_K, D = 4, 2, 64
LENS_Q, LENS_K = [17, 0, 40, 1], [23, 5, 40, 0]  # zero-length sequences on both sides


def references(inputs, forward, dout):
    """(out, gradients of inputs) of ``forward(*inputs, **kw)`` in float64 (ref) and in the input precision
    with flash-attn's reorder_ops (pt)."""
    results = []
    for kw in ({}, {"upcast": False, "reorder_ops": True}):
        xs = [(t.detach().double() if not kw else t.detach().clone()).requires_grad_() for t in inputs]
        out = forward(*xs, **kw)
        results.append((out, torch.autograd.grad(out, xs, dout.to(out.dtype))))
    return results


def check_packed(names, inputs, packed, unpacked, reference, masked, pack_dim):
    """``packed(*inputs)`` against ``reference`` (out and every input's gradient), and bitwise against
    ``unpacked(q, k, v)`` on contiguous copies of the views (deterministic backward)."""
    dtype, d = inputs[0].dtype, inputs[0].shape[-1]
    out = call_or_skip(lambda: packed(*inputs), op="fwd", dtype=dtype, hdim_q=d, hdim_v=d, masked=masked)
    dout = torch.randn_like(out)
    grads = call_or_skip(lambda: torch.autograd.grad(out, inputs, dout), op="bwd", dtype=dtype, hdim_q=d,
                         hdim_v=d, masked=masked, deterministic=True)
    (out_ref, grads_ref), (out_pt, grads_pt) = references(inputs, reference, dout)
    check_rule("out", out, out_ref, out_pt, 2, FLOOR_OUT)
    for name, t, g, r, p in zip(names, inputs, grads, grads_ref, grads_pt):
        assert g.shape == t.shape, f"d{name} has shape {tuple(g.shape)}, {name} {tuple(t.shape)}"
        check_rule("d" + name, g, r, p, 3, FLOOR_GRAD)

    # q, k, v as separate contiguous leaves (copies of the views), through the unpacked function.
    split = [t.detach().unbind(pack_dim) if name in ("qkv", "kv") else (t.detach(),) for name, t in zip(names, inputs)]
    leaves = [part.contiguous().requires_grad_() for parts in split for part in parts]
    out_u = unpacked(*leaves)
    grads_u = list(torch.autograd.grad(out_u, leaves, dout))
    assert torch.equal(out, out_u), "the packed and the unpacked call give different outputs"
    for name, g, parts in zip(names, grads, split):
        mine, grads_u = grads_u[: len(parts)], grads_u[len(parts):]
        assert torch.equal(g, torch.stack(mine, pack_dim) if len(parts) > 1 else mine[0]), (
            f"d{name} differs from the unpacked call's gradients"
        )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_qkvpacked(dtype, causal):
    qkv = randn(2, 77, 3, H, D, dtype=dtype, requires_grad=True)
    keep = keep_mask(77, 77, *flash_mask(causal, (-1, -1)))
    check_packed(
        ["qkv"], [qkv],
        lambda x: fmha.flash_attn_qkvpacked_func(x, causal=causal, deterministic=True),
        lambda q, k, v: fmha.flash_attn_func(q, k, v, causal=causal, deterministic=True),
        lambda x, **kw: attention_ref(*x.unbind(2), keep, default_scale(D), **kw)[0],
        causal, 2,
    )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_kvpacked_gqa(dtype, causal):
    q = randn(2, 45, H, D, dtype=dtype, requires_grad=True)
    kv = randn(2, 77, 2, H_K, D, dtype=dtype, requires_grad=True)
    keep = keep_mask(45, 77, *flash_mask(causal, (-1, -1)))
    check_packed(
        ["q", "kv"], [q, kv],
        lambda q, kv: fmha.flash_attn_kvpacked_func(q, kv, causal=causal, deterministic=True),
        lambda q, k, v: fmha.flash_attn_func(q, k, v, causal=causal, deterministic=True),
        lambda q, kv, **kw: attention_ref(q, *kv.unbind(2), keep, default_scale(D), **kw)[0],
        causal, 2,
    )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_varlen_qkvpacked(dtype, causal):
    cu = cu_seqlens(LENS_K)
    qkv = randn(sum(LENS_K), 3, H, D, dtype=dtype, requires_grad=True)
    mask = flash_mask(causal, (-1, -1))
    check_packed(
        ["qkv"], [qkv],
        lambda x: fmha.flash_attn_varlen_qkvpacked_func(x, cu, max(LENS_K), causal=causal, deterministic=True),
        lambda q, k, v: fmha.flash_attn_varlen_func(q, k, v, cu, cu, max(LENS_K), max(LENS_K), causal=causal,
                                                     deterministic=True),
        lambda x, **kw: attention_ref_varlen(*x.unbind(1), cu, cu, mask, default_scale(D), **kw)[0],
        causal, 1,
    )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_varlen_kvpacked_gqa(dtype, causal):
    cu_q, cu_k = cu_seqlens(LENS_Q), cu_seqlens(LENS_K)
    q = randn(sum(LENS_Q), H, D, dtype=dtype, requires_grad=True)
    kv = randn(sum(LENS_K), 2, H_K, D, dtype=dtype, requires_grad=True)
    mask = flash_mask(causal, (-1, -1))
    bounds = (max(LENS_Q), max(LENS_K))
    check_packed(
        ["q", "kv"], [q, kv],
        lambda q, kv: fmha.flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, *bounds, causal=causal,
                                                           deterministic=True),
        lambda q, k, v: fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, *bounds, causal=causal, deterministic=True),
        lambda q, kv, **kw: attention_ref_varlen(q, *kv.unbind(1), cu_q, cu_k, mask, default_scale(D), **kw)[0],
        causal, 1,
    )


def _calls():
    """(name, packed tensor's name, a call of each packed function with **kw on valid bf16 inputs)."""
    dtype = torch.bfloat16
    qkv = randn(1, 9, 3, H, D, dtype=dtype)
    q, kv = randn(1, 9, H, D, dtype=dtype), randn(1, 11, 2, H_K, D, dtype=dtype)
    cu_q, cu_k = cu_seqlens([4, 5]), cu_seqlens([6, 5])
    return {
        "flash_attn_qkvpacked_func": ("qkv", lambda x=qkv, **kw: fmha.flash_attn_qkvpacked_func(x, **kw)),
        "flash_attn_kvpacked_func": ("kv", lambda x=kv, **kw: fmha.flash_attn_kvpacked_func(q, x, **kw)),
        "flash_attn_varlen_qkvpacked_func": (
            "qkv", lambda x=qkv[0], **kw: fmha.flash_attn_varlen_qkvpacked_func(x, cu_q, 5, **kw)),
        "flash_attn_varlen_kvpacked_func": (
            "kv", lambda x=kv[0], **kw: fmha.flash_attn_varlen_kvpacked_func(q[0], x, cu_q, cu_k, 5, 6, **kw)),
    }


@pytest.mark.parametrize("name", sorted(_calls()))
def test_return_attn_probs(name):
    """flash-attn's convention: (out, softmax_lse, S_dmask), S_dmask the empty tensor it returns without
    dropout; out and lse as the unpacked function's."""
    _, call = _calls()[name]
    out = call_or_skip(call, op="fwd", dtype=torch.bfloat16, hdim_q=D, hdim_v=D, masked=False)
    out2, lse, s_dmask = call(return_attn_probs=True)
    assert torch.equal(out, out2)
    assert lse.dtype == torch.float32 and torch.isfinite(lse).all()
    assert lse.shape == ((H, out.shape[0]) if out.dim() == 3 else (out.shape[0], H, out.shape[1]))
    assert s_dmask.shape == (0,) and s_dmask.dtype == out.dtype and s_dmask.device == out.device


@pytest.mark.parametrize("name", sorted(_calls()))
def test_refusals_and_shapes(name):
    argument, call = _calls()[name]
    with pytest.raises(NotImplementedError, match="dropout"):
        call(dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="softcap"):
        call(softcap=5.0)
    with pytest.raises(NotImplementedError, match="alibi"):
        call(alibi_slopes=torch.ones(H))
    good = call.__defaults__[0]
    with pytest.raises(ValueError, match=rf"{argument} must be \[.*, {good.shape[-3]}, "):
        call(good.narrow(-3, 0, 1))  # one part instead of 3 (qkv) or 2 (kv)
    with pytest.raises(ValueError, match=f"{argument} must be"):
        call(good[0])  # a dimension short
    with pytest.raises(TypeError, match=f"{argument} must be a torch.Tensor"):
        call(good.tolist())


def test_unpack_takes_views():
    """No copies: q, k, v are views into the packed tensor (autograd routes their gradients back into it)."""
    qkv = randn(2, 5, 3, H, D, dtype=torch.float16)
    for i, t in enumerate(ops._unpack("qkv", qkv, 3, varlen=False)):
        assert t._base is qkv and t.data_ptr() == qkv[:, :, i].data_ptr() and t.stride() == qkv[:, :, i].stride()
    kv = randn(7, 2, H_K, D, dtype=torch.float16)
    for i, t in enumerate(ops._unpack("kv", kv, 2, varlen=True)):
        assert t._base is kv and t.data_ptr() == kv[:, i].data_ptr()
