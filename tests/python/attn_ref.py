"""Reference attention, masks, the field's comparison rule and helpers shared by the Python tests.

The comparison rule (flash-attention's, design.md "Correctness rules"): with `ref` the attention computed in
float64 (float32 for very large problems on the GPU) from the same low-precision inputs, and `pt` the same
computation done in the input precision (flash-attn's `attention_ref(upcast=False, reorder_ops=True)`),

    max|kernel - ref| <= MULT * max|pt - ref| + floor        MULT = 2 (out, lse), 3 (dq, dk, dv).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

import fmha
from fmha import ops

HOST = fmha.backend() == fmha.BACKEND_HOST
GPU = not HOST
# The large grid (long sequences, more heads and head dims): GPU builds, unless FMHA_TEST_QUICK=1;
# FMHA_TEST_LARGE=1 selects it on the host backend too (slow: for a thorough local run).
LARGE = (GPU and os.environ.get("FMHA_TEST_QUICK", "0") in ("", "0")) or os.environ.get("FMHA_TEST_LARGE") == "1"
DEVICE = torch.device("cpu") if HOST else torch.device("cuda")
DTYPES = [torch.float16, torch.bfloat16]
DTYPE_IDS = {torch.float16: "fp16", torch.bfloat16: "bf16"}

# Absolute floors under the ratio rule (keep a 0 × ratio from failing on rounding noise).
FLOOR_OUT = 1e-5
FLOOR_LSE = 1e-5
FLOOR_GRAD = 1e-4

NONE, TOP_LEFT, BOTTOM_RIGHT = "none", "top_left", "bottom_right"


# --- masks --------------------------------------------------------------------------------------------


def keep_mask(sq, sk, kind, left, right, device=DEVICE):
    """[sq, sk] bool: which (row, column) pairs take part, fmha's semantics (mask.rs): a window (left, right)
    around the diagonal of `kind`'s corner, -1 = unbounded; bottom-right shifts the diagonal by sk - sq."""
    keep = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if kind == NONE:
        return keep
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    off = 0 if kind == TOP_LEFT else sk - sq
    if left >= 0:
        keep &= j >= i + off - left
    if right >= 0:
        keep &= j <= i + off + right
    return keep


def flash_mask(causal, window_size, seqlen_k_bound=None):
    """flash-attn's (causal, window_size) as (kind, left, right), its semantics taken literally: a side < 0
    is unbounded, any other value is a window side however large (it may cover every key), causal sets
    right = 0, bottom-right aligned, no mask if both sides are unbounded. (`seqlen_k_bound` is unused; the
    binding may drop a side that covers everything, which `keep_mask` shows to be the same mask.)"""
    left, right = window_size
    left = -1 if left < 0 else left
    right = -1 if right < 0 else right
    if causal:
        right = 0
    if left == -1 and right == -1:
        return NONE, -1, -1
    return BOTTOM_RIGHT, left, right


# --- reference attention --------------------------------------------------------------------------------


def ref_dtype_for(numel_scores):
    """float64, except float32 for problems whose score matrix would not fit comfortably on the GPU."""
    if DEVICE.type == "cuda" and numel_scores > (1 << 28):
        return torch.float32
    return torch.float64


def attention_ref(q, k, v, keep, scale, *, upcast=True, reorder_ops=False, ref_dtype=torch.float64):
    """q [b, sq, hq, d], k/v [b, sk, hk, d(v)], keep [sq, sk] → (out [b, sq, hq, dv], lse [b, hq, sq] fp64/32).

    upcast=True: math in `ref_dtype`, out returned unrounded. upcast=False: the input precision, with
    flash-attn's reorder_ops (scale k instead of q). Fully masked rows: out 0, lse -inf.
    """
    dtype_og = q.dtype
    if upcast:
        q, k, v = q.to(ref_dtype), k.to(ref_dtype), v.to(ref_dtype)
    g = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    if reorder_ops:
        scores = torch.einsum("bthd,bshd->bhts", q, k * scale)
    else:
        scores = torch.einsum("bthd,bshd->bhts", q * scale, k)
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores.float() if not upcast else scores, dim=-1)
    empty = ~keep.any(dim=-1, keepdim=True)  # [sq, 1]: fully masked rows
    attn = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(~keep, 0.0)
    out = torch.einsum("bhts,bshd->bthd", attn.to(v.dtype), v)
    return (out if upcast else out.to(dtype_og)), lse


def attention_ref_varlen(q, k, v, cu_q, cu_k, mask, scale, **kw):
    """Varlen [total, h, d] reference: per-sequence `attention_ref`; mask = (kind, left, right)."""
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qb = q[cu_q[b] : cu_q[b + 1]].unsqueeze(0)
        kb = k[cu_k[b] : cu_k[b + 1]].unsqueeze(0)
        vb = v[cu_k[b] : cu_k[b + 1]].unsqueeze(0)
        keep = keep_mask(qb.shape[1], kb.shape[1], *mask, device=q.device)
        o, lse_b = attention_ref(qb, kb, vb, keep, scale, **kw)
        outs.append(o[0])
        lses.append(lse_b[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


# --- the comparison rule ----------------------------------------------------------------------------------


def max_err(a, b):
    """max |a - b| over the finite reference entries; infinities must match exactly (same sign)."""
    a = a.to(torch.float64)
    b = b.to(torch.float64)
    inf_b = torch.isinf(b)
    if inf_b.any():
        assert torch.equal(a[inf_b], b[inf_b]), "infinite reference entries (fully masked rows) differ"
    fin = ~inf_b
    if not fin.any():
        return 0.0
    return (a[fin] - b[fin]).abs().max().item()


def check_rule(name, kernel, ref, pt, mult, floor):
    """kernel vs ref within mult × (pt vs ref) + floor; returns the errors for messages."""
    assert kernel.shape == ref.shape, f"{name}: shape {tuple(kernel.shape)} != reference {tuple(ref.shape)}"
    assert not torch.isnan(kernel).any(), f"{name}: NaN in the result (poisoned entry not written?)"
    err, err_pt = max_err(kernel, ref), max_err(pt, ref)
    assert err <= mult * err_pt + floor, (
        f"{name}: max error {err:.3e} > {mult} x same-precision error {err_pt:.3e} + {floor:g}"
    )
    return err, err_pt


def poisoned(shape, dtype, device=DEVICE):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


# --- registry-aware skipping ------------------------------------------------------------------------------


def call_or_skip(fn, *, op, dtype, hdim_q, hdim_v, masked, deterministic=False):
    """Runs fn(); an FMHA_ERR_UNSUPPORTED for a combination the registry does not list skips the test, for
    one it lists fails it (the registry is what the build claims to serve)."""
    try:
        return fn()
    except fmha.FmhaError as e:
        if e.status != fmha.ERR_UNSUPPORTED:
            raise
        if ops.registry_supports(op, dtype, hdim_q, hdim_v, masked, deterministic):
            raise AssertionError(
                f"{op} answered UNSUPPORTED for a combination the registry lists "
                f"({DTYPE_IDS.get(dtype, dtype)} hdim {hdim_q}x{hdim_v} masked={masked} "
                f"deterministic={deterministic}): {e}"
            ) from e
        pytest.skip(f"{op} not in this build ({fmha.backend_name()}): {e.message}")


def randn(*shape, dtype, requires_grad=False):
    t = torch.randn(*shape, dtype=dtype, device=DEVICE)
    return t.requires_grad_(requires_grad)


def cu_seqlens(lengths):
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=DEVICE)


def default_scale(d):
    return 1.0 / math.sqrt(d)
