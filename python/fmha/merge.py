"""Merging attention states (``fmha_merge_attention_states`` in ``include/fmha.h``) on PyTorch tensors,
with flashinfer's names and shapes:

* :func:`merge_states`: ``v [seq, num_states, heads, d]``, ``s [seq, num_states, heads]`` → ``(v, s)``
  merged, ``[seq, heads, d]`` and ``[seq, heads]``;
* :func:`merge_state`: two states ``v_a, v_b [seq, heads, d]``, ``s_a, s_b [seq, heads]``.

A state is an attention output normalised over its own keys and the LSE (log-sum-exp of the scores) of
those keys, e.g. the ``(out, lse)`` of one GPU's KV shard in ring/context parallelism, or of a shared
prefix and a suffix (cascade attention). The merge is the attention over all their keys: per (token,
head), in fp32 and in state order, ``w_i = exp(s_i - max s)``, ``v = Σ w_i v_i / Σ w_i``,
``s = max s + log Σ w_i``, rounded once to the output type. An LSE of -inf or +inf is an empty state
(weight 0, its ``v`` not read); no state left gives ``v = 0, s = -inf``; a NaN LSE makes its row NaN.
Deterministic (bitwise reproducible).

``lse_base``: fmha's LSEs are natural logarithms (the default, ``"e"``); flashinfer's are base 2 (pass
``lse_base=2``, as its own ``merge_state(s)`` expect); the merged LSE is returned in the same base.

``v`` may be fp16, bf16 or fp32 (the merged ``v`` has its type, or ``out_dtype``); ``s`` is fp32. The
work runs on PyTorch's current stream with no host synchronization (on the host backend, CPU tensors,
each call returns when its work is done).
"""

from __future__ import annotations

import math
from ctypes import byref

import torch

from . import _lib as L
from .ops import _check_tensors, _device_guard, _finish, _last_dim_contiguous, _stream_handle

_STATE_DTYPES = {torch.float16: L.DTYPE_FP16, torch.bfloat16: L.DTYPE_BF16, torch.float32: L.DTYPE_FP32}


def _lse_base(base) -> int:
    if base in ("e", "natural", math.e):
        return L.LSE_NATURAL
    if base in (2, "2", "base2"):
        return L.LSE_BASE2
    raise ValueError(f"fmha: lse_base must be 'e' (natural log, fmha's) or 2 (flashinfer's), got {base!r}")


def _state_dtype(name, dtype) -> int:
    code = _STATE_DTYPES.get(dtype)
    if code is None:
        raise TypeError(
            f"fmha: {name} has dtype {dtype}; merged states are torch.float16, torch.bfloat16 or torch.float32"
        )
    return code


def _ptr(t):
    return t.data_ptr() or None


def merge_states(v, s, *, lse_base="e", out_dtype=None):
    """Merges ``v [seq, num_states, heads, d]`` with LSEs ``s [seq, num_states, heads]`` (fp32) over the
    states → ``(v_merged [seq, heads, d], s_merged [seq, heads])``. Strided inputs are read in place
    (the last dimension of ``v`` contiguous, else it is copied)."""
    device = _check_tensors([("v", v), ("s", s)])
    if v.dim() != 4 or s.dim() != 3 or tuple(s.shape) != tuple(v.shape[:3]):
        raise ValueError(
            f"fmha: merge_states takes v [seq, num_states, heads, d] and s [seq, num_states, heads], got "
            f"{tuple(v.shape)} and {tuple(s.shape)}"
        )
    if s.dtype != torch.float32:
        raise TypeError(f"fmha: s must be torch.float32 (LSEs), got {s.dtype}")
    in_dtype = _state_dtype("v", v.dtype)
    out_dtype = v.dtype if out_dtype is None else out_dtype
    out_code = _state_dtype("out_dtype", out_dtype)
    v = _last_dim_contiguous(v)
    seq, states, heads, d = v.shape
    v_out = torch.empty((seq, heads, d), dtype=out_dtype, device=v.device)
    s_out = torch.empty((seq, heads), dtype=torch.float32, device=v.device)
    args = L.fmha_merge_args(
        num_states=states,
        num_rows=seq,
        nhead=heads,
        hdim=d,
        in_dtype=in_dtype,
        out_dtype=out_code,
        lse_base=_lse_base(lse_base),
        # The batch stride of a state tensor is the state stride; rows are tokens.
        o_in=L.fmha_tensor(_ptr(v), v.stride(1), v.stride(2), v.stride(0)),
        lse_in=L.fmha_tensor(_ptr(s), s.stride(1), s.stride(2), s.stride(0)),
        o_out=L.fmha_tensor(_ptr(v_out), 0, v_out.stride(1), v_out.stride(0)),
        lse_out=L.fmha_tensor(_ptr(s_out), 0, s_out.stride(1), s_out.stride(0)),
    )
    with _device_guard(device):
        L.call("fmha_merge_attention_states", byref(args), _stream_handle(device))
        _finish(device)
    return v_out, s_out


def merge_state(v_a, s_a, v_b, s_b, *, lse_base="e", out_dtype=None):
    """Merges two states ``v_a, v_b [seq, heads, d]`` with LSEs ``s_a, s_b [seq, heads]`` (fp32), a then b
    → ``(v_merged [seq, heads, d], s_merged [seq, heads])``. (The two are stacked into one tensor of
    states first: :func:`merge_states` on states that already share a tensor copies nothing.)"""
    _check_tensors([("v_a", v_a), ("s_a", s_a), ("v_b", v_b), ("s_b", s_b)])
    if v_a.shape != v_b.shape or s_a.shape != s_b.shape or v_a.dtype != v_b.dtype:
        raise ValueError(
            f"fmha: merge_state takes two states of one shape and dtype, got v {tuple(v_a.shape)} {v_a.dtype} and "
            f"{tuple(v_b.shape)} {v_b.dtype}, s {tuple(s_a.shape)} and {tuple(s_b.shape)}"
        )
    if v_a.dim() != 3 or s_a.dim() != 2:
        raise ValueError(
            f"fmha: merge_state takes v [seq, heads, d] and s [seq, heads], got {tuple(v_a.shape)} and "
            f"{tuple(s_a.shape)}"
        )
    return merge_states(
        torch.stack([v_a, v_b], dim=1), torch.stack([s_a, s_b], dim=1), lse_base=lse_base, out_dtype=out_dtype
    )
