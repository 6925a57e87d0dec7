"""Attention over a KV cache (``fmha_kvcache_*`` in ``include/fmha.h``) on PyTorch tensors.

* :func:`flash_attn_with_kvcache`: flash-attn's function of that name (FA2's parameters in FA2's order,
  FA3's additions -- ``page_table``, ``cu_seqlens_q``, ``cu_seqlens_k_new``, ``max_seqlen_q``, the fp8
  descales -- as keywords): a contiguous cache (one slot per sequence) or a paged one (a block table),
  with optional new tokens appended to the cache in place before the attention.
* :class:`BatchPrefillWithPagedKVCacheWrapper`: flashinfer's wrapper of that name over a CSR page table
  (``kv_indptr``, ``kv_indices``, ``kv_last_page_len``): ``plan`` once per batch layout on the host,
  ``run`` per layer.

Devices and streams as in :mod:`fmha.ops`: CUDA tensors and PyTorch's current stream on GPU builds; CPU
tensors on the host backend, where every call waits for its work so that the CPU tensors are ready when
it returns.

fp8: q, k and v in ``torch.float8_e4m3fn`` (``FMHA_DTYPE_FP8_E4M3FN``) or ``torch.float8_e4m3fnuz``
(``FMHA_DTYPE_FP8_E4M3FNUZ``), one format for all three; the output is bf16. A descale ``d`` means the
true value of a stored element ``x`` is ``x * d``.
"""

from __future__ import annotations

import math
from ctypes import byref, c_size_t, c_void_p

import torch

from . import _lib as L
from .ops import (
    _FP8_DTYPES,
    _check_tensors,
    _descale,
    _device_guard,
    _finish,
    _flash_mask,
    _on_host_backend,
    _output_dtype,
    _prepare_input,
    _refuse_unsupported,
    _require_tensor,
    _scale,
    _scheduler_workspace,
    _stream_handle,
)

_HALF_DTYPES = {torch.float16: L.DTYPE_FP16, torch.bfloat16: L.DTYPE_BF16}
_KV_DTYPES = {**_HALF_DTYPES, **_FP8_DTYPES}
_DTYPE_NAMES = "torch.float16, torch.bfloat16, torch.float8_e4m3fn or torch.float8_e4m3fnuz"
_LOG2E = 1.0 / math.log(2.0)
_MAX_SPLITS = 256


# --- shared helpers ------------------------------------------------------------------------------------


def _ptr(t):
    return None if t is None else (t.data_ptr() or None)


def _dtype_code(dtype, name) -> int:
    code = _KV_DTYPES.get(dtype)
    if code is None:
        raise TypeError(f"fmha: {name} has dtype {dtype}; fmha's kv cache takes {_DTYPE_NAMES}")
    return code


def _canonical_dtype(dtype, name):
    """A torch.dtype from a torch.dtype or its name ("float16", "torch.bfloat16", "float8_e4m3fn")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
        if isinstance(found, torch.dtype):
            return found
    raise TypeError(f"fmha: {name} must be a torch.dtype or its name, got {dtype!r}")


def _traits(*, dtype, **fields):
    """The launcher's traits: strided pools, one descale per tensor or (sequence, kv head), fp8 writing
    bf16 (the layouts and granularities this binding passes)."""
    fp8 = dtype in (L.DTYPE_FP8_E4M3FN, L.DTYPE_FP8_E4M3FNUZ)
    return L.fmha_kvcache_traits(
        dtype=dtype,
        o_dtype=L.DTYPE_BF16 if fp8 else dtype,
        kv_layout=L.KV_LAYOUT_STRIDED,
        kv_scale_granularity=L.KV_SCALE_TENSOR,
        kv_split_tokens=0,
        **fields,
    )


def _int32_vector(name, t, length):
    """A 1-D int32 device array of `length` entries (contiguous: copied on the device otherwise)."""
    _require_tensor(name, t)
    if t.dtype != torch.int32 or t.dim() != 1 or (length is not None and t.shape[0] != length):
        want = f"{length} entries" if length is not None else "entries"
        raise ValueError(
            f"fmha: {name} must be a 1-D torch.int32 tensor of {want}, got {t.dtype} of shape {tuple(t.shape)}"
        )
    return t.contiguous()


def _rows_tensor(t, group):
    """q / o: [batch, seq, head, dim] (batch mode) or [total, head, dim] (group mode) → fmha_tensor."""
    if group:
        return L.fmha_tensor(_ptr(t), 0, t.stride(1), t.stride(0))
    return L.fmha_tensor(_ptr(t), t.stride(0), t.stride(2), t.stride(1))


def _lse_tensor(t, group):
    """LSE: [batch, head, seq] (batch mode) or [head, total] (group mode), fp32, row stride 1."""
    if t is None:
        return L.fmha_tensor(None, 0, 0, 0)
    if group:
        return L.fmha_tensor(_ptr(t), 0, t.stride(0), t.stride(1))
    return L.fmha_tensor(_ptr(t), t.stride(0), t.stride(1), t.stride(2))


def _pool_tensor(t, layout):
    """A page pool: NHD [pages, page_size, heads, dim] or HND [pages, heads, page_size, dim] → fmha_tensor
    (batch stride = page stride, row stride = token stride)."""
    if layout == "HND":
        return L.fmha_tensor(_ptr(t), t.stride(0), t.stride(1), t.stride(2))
    return L.fmha_tensor(_ptr(t), t.stride(0), t.stride(2), t.stride(1))


def _check_pool(name, t, dtype):
    _require_tensor(name, t)
    if t.dim() != 4:
        raise ValueError(f"fmha: {name} must be a 4-D page pool, got shape {tuple(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"fmha: {name} has dtype {t.dtype}, expected {dtype} (q, k and v share one dtype)")
    if t.size(-1) > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"fmha: {name} must have a contiguous last dimension (stride {t.stride(-1)}); a cache is used in "
            "place, so fmha does not copy it"
        )


class _KvLauncher:
    """An ``fmha_kvcache_launcher`` handle, destroyed with its owner (safe while its work is queued)."""

    __slots__ = ("handle",)

    def __init__(self, traits):
        self.handle = None  # a failed create leaves nothing to destroy
        handle = c_void_p()
        L.call("fmha_kvcache_launcher_create", byref(traits), byref(handle))
        self.handle = handle

    def workspace_size(self) -> int:
        size = c_size_t(0)
        L.call("fmha_kvcache_launcher_workspace_size", self.handle, byref(size))
        return size.value

    def scheduler_workspace_size(self) -> int:
        size = c_size_t(0)
        L.call("fmha_kvcache_launcher_scheduler_workspace_size", self.handle, byref(size))
        return size.value

    def destroy(self):
        handle, self.handle = self.handle, None
        if handle is not None and handle.value:
            try:
                L.library().fmha_kvcache_launcher_destroy(handle)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass

    def __del__(self):
        self.destroy()


def _kvcache_scheduler_workspace_size(traits):
    """The scheduler workspace bytes of a launcher for ``traits`` (what ``fmha_kvcache_fwd``'s run takes)."""
    launcher = _KvLauncher(traits)
    try:
        return launcher.scheduler_workspace_size()
    finally:
        launcher.destroy()


def _kvcache_scheduler_workspace(size_of, key, device, stream):
    """The run's scheduler workspace (``fmha_kvcache_args.scheduler_workspace``), ``size_of(key)`` bytes: one
    per (stream, device, thread), a fresh one per captured call, NULL on the host backend (see
    :func:`fmha.ops._scheduler_workspace`)."""
    return _scheduler_workspace("kvcache", size_of, key, device, stream)


# --- flash-attn: flash_attn_with_kvcache -----------------------------------------------------------------


def _new_token_slots(k, cu_seqlens_k_new, batch, group_new):
    """(sequence, position within the new tokens) of every new token, as int64 device vectors, and the new
    tokens per sequence (a device vector, or an int in batch mode). No host synchronization."""
    device = k.device
    if group_new:
        total = k.shape[0]
        cu = cu_seqlens_k_new.to(torch.int64)
        if _on_host_backend():  # cheap here (host memory); on a GPU it would synchronize
            steps = cu[1:] - cu[:-1]
            if int(cu[0]) != 0 or int(cu[-1]) != total or bool((steps < 0).any()):
                raise ValueError(
                    f"fmha: cu_seqlens_k_new must rise from 0 to the {total} rows of k, got {cu.tolist()}"
                )
        t = torch.arange(total, device=device, dtype=torch.int64)
        seq = torch.searchsorted(cu[1:], t, right=True)
        j = t - cu[seq]
        return seq, j, (cu[1:] - cu[:-1])
    s_new = k.shape[1]
    seq = torch.arange(batch, device=device, dtype=torch.int64).repeat_interleave(s_new)
    j = torch.arange(s_new, device=device, dtype=torch.int64).repeat(batch)
    return seq, j, s_new


def _append_to_cache(k_cache, v_cache, k, v, *, seq, j, cache_seqlens, cache_batch_idx, page_table, capacity):
    """Writes the new tokens (`k`/`v` as [tokens, heads_k, dim]) into the cache in place: token j of
    sequence b goes to position cache_seqlens[b] + j of the sequence (through the page table when paged).
    Device tensor operations only (no host synchronization); on the host backend the positions are checked
    first, so that a cache too small is named instead of surfacing as an indexing error."""
    pos = cache_seqlens.to(torch.int64)[seq] + j
    if page_table is not None:
        page_size = k_cache.shape[1]
        blocks = page_table.shape[1]
        if _on_host_backend() and pos.numel() and int(pos.max()) >= capacity:
            b = int(seq[int(torch.argmax((pos >= capacity).to(torch.int8)))])
            raise ValueError(
                f"fmha: cache_seqlens[{b}] + the new tokens of sequence {b} need more than the {blocks} page_table "
                f"entries x {page_size} tokens = {capacity} positions of its row"
            )
        page = page_table.to(torch.int64)[seq, pos // page_size]
        row = pos % page_size
        if _on_host_backend() and page.numel():
            bad = (page < 0) | (page >= k_cache.shape[0])
            if bool(bad.any()):
                i = int(torch.argmax(bad.to(torch.int8)))
                raise ValueError(
                    f"fmha: page_table[{int(seq[i])}][{int(pos[i]) // page_size}] = {int(page[i])} is outside "
                    f"[0, {k_cache.shape[0]}) (the pages of k_cache), needed to append the new tokens"
                )
    else:
        if _on_host_backend() and pos.numel() and int(pos.max()) >= capacity:
            b = int(seq[int(torch.argmax((pos >= capacity).to(torch.int8)))])
            raise ValueError(
                f"fmha: cache_seqlens[{b}] + the new tokens of sequence {b} exceed the cache's capacity "
                f"(k_cache seqlen_cache = {capacity})"
            )
        page = seq if cache_batch_idx is None else cache_batch_idx.to(torch.int64)[seq]
        row = pos
        if _on_host_backend() and cache_batch_idx is not None and page.numel():
            bad = (page < 0) | (page >= k_cache.shape[0])
            if bool(bad.any()):
                i = int(torch.argmax(bad.to(torch.int8)))
                raise ValueError(
                    f"fmha: cache_batch_idx[{int(seq[i])}] = {int(page[i])} is outside [0, {k_cache.shape[0]}) "
                    "(the slots of k_cache)"
                )
    if k_cache.dtype in _FP8_DTYPES:  # fp8 indexing kernels are not in every PyTorch build: move the bytes
        k_cache, v_cache, k, v = (t.view(torch.uint8) for t in (k_cache, v_cache, k, v))
    k_cache[page, row] = k
    v_cache[page, row] = v


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    page_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    max_seqlen_q=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    qv=None,
    rotary_seqlens=None,
    attention_chunk=0,
    scheduler_metadata=None,
    pack_gqa=None,
    sm_margin=0,
):
    """flash-attn's ``flash_attn_with_kvcache``: attention of q over a KV cache, after appending new tokens
    to it. FA2's parameters come first in FA2's order; FA3's additions are keyword-only.

    Shapes (``d`` = head_dim, ``d_v`` = v's head_dim):

    * ``q``: ``(batch, seqlen_q, nheads, d)``, or with ``cu_seqlens_q`` (int32 ``[batch + 1]``, and the host
      int ``max_seqlen_q``, an upper bound of the per-sequence rows) varlen ``(total_q, nheads, d)``.
    * ``k_cache``/``v_cache`` without a page table: ``(batch_cache, seqlen_cache, nheads_k, d)``, one slot
      per sequence (slot ``cache_batch_idx[b]``, default ``b``); with ``page_table`` (alias
      ``block_table``; int32 ``(batch, max_blocks)``): ``(num_blocks, page_block_size, nheads_k, d)``,
      token ``j`` of sequence ``b`` at row ``j % page_block_size`` of block ``page_table[b, j //
      page_block_size]``. Any page size works; entries past a sequence's last block are never read.
      ``nheads % nheads_k == 0`` (GQA/MQA). The last dimension must be contiguous.
    * ``cache_seqlens``: int or int32 ``(batch,)``: the tokens already in the cache (``None``: the whole
      cache, ``seqlen_cache`` or ``max_blocks * page_block_size`` tokens).
    * ``k``/``v`` (optional, new tokens): ``(batch, seqlen_new, nheads_k, d)``, or with
      ``cu_seqlens_k_new`` (int32 ``[batch + 1]``) ``(total_new, nheads_k, d)``. They are written into
      ``k_cache``/``v_cache`` **in place** at positions ``cache_seqlens[b] .. cache_seqlens[b] +
      seqlen_new - 1`` (through the page table when paged; flash-attn's semantics), and the attention runs
      over ``cache_seqlens[b] + seqlen_new`` tokens. ``cache_seqlens`` itself is not changed. The append is
      done with PyTorch indexing on the current stream, before fmha's kernel; the caller makes sure the
      cache is large enough (the host backend checks it and names the field).

    ``causal`` and ``window_size = (left, right)`` (``-1`` = unbounded) are aligned to the bottom-right
    corner: the queries are the last tokens of each sequence. ``softmax_scale`` defaults to
    ``1/sqrt(d)``. ``num_splits``: split-KV (each sequence's keys cut into chunks attended in parallel,
    then combined in a fixed order): 1 never splits, 0 lets fmha choose from the shapes and the device,
    ``n > 1`` allows up to ``n`` chunks per sequence.

    fp8: ``q``, the caches (and ``k``/``v``) in ``torch.float8_e4m3fn`` or ``torch.float8_e4m3fnuz``;
    ``q_descale``/``k_descale``/``v_descale``: float32 ``(batch, nheads_k)`` (FA3: one descale per sequence
    and kv head; query head ``h`` uses that of kv head ``h // (nheads // nheads_k)``), or anything that
    broadcasts to it (e.g. ``t.expand(batch, nheads_k)``: stride 0 is passed on, not copied). The output is
    bf16. As in FA3, descales are ignored for fp16/bf16 inputs.

    Returns ``out`` (``q``'s shape with ``d_v``), or ``(out, softmax_lse)`` with ``return_softmax_lse=True``:
    natural-log LSE, fp32 ``(batch, nheads, seqlen_q)`` (varlen: ``(nheads, total_q)``); a row with no key
    gets ``out = 0`` and ``lse = -inf``.

    Not supported (``NotImplementedError``): rotary embedding (``rotary_cos``/``rotary_sin``: apply RoPE to
    q and k before the call), ``cache_leftpad``, ``softcap``, ``alibi_slopes``, ``qv``, ``attention_chunk``.
    ``scheduler_metadata``, ``pack_gqa``, ``sm_margin`` and ``rotary_interleaved`` are FA3 tuning knobs and
    are ignored. No backward.
    """
    if rotary_cos is not None or rotary_sin is not None or rotary_seqlens is not None:
        raise NotImplementedError(
            "fmha: rotary embedding inside flash_attn_with_kvcache (rotary_cos/rotary_sin) is not supported; "
            "apply RoPE to q and k before the call"
        )
    _refuse_unsupported(0.0, softcap, alibi_slopes)
    if cache_leftpad is not None:
        raise NotImplementedError("fmha: cache_leftpad is not supported by flash_attn_with_kvcache")
    if qv is not None:
        raise NotImplementedError("fmha: qv is not supported by flash_attn_with_kvcache")
    if attention_chunk:
        raise NotImplementedError(f"fmha: attention_chunk is not supported (attention_chunk={attention_chunk})")
    if page_table is not None and block_table is not None and page_table is not block_table:
        raise ValueError("fmha: pass the page table as page_table or as block_table, not both")
    if page_table is None:
        page_table = block_table
    paged = page_table is not None
    group = cu_seqlens_q is not None
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _require_tensor(name, t)
    if isinstance(cache_seqlens, bool) or not (cache_seqlens is None or isinstance(cache_seqlens, (int, torch.Tensor))):
        raise TypeError(f"fmha: cache_seqlens must be None, an int or a torch.Tensor, got {type(cache_seqlens).__name__}")
    device = _check_tensors(
        [
            ("q", q),
            ("k_cache", k_cache),
            ("v_cache", v_cache),
            ("k", k),
            ("v", v),
            ("cache_seqlens", cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None),
            ("cache_batch_idx", cache_batch_idx),
            ("page_table", page_table),
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k_new", cu_seqlens_k_new),
        ]
    )

    # dtypes: q, the caches and the new tokens share one.
    dtype_code = _dtype_code(q.dtype, "q")
    fp8 = q.dtype in _FP8_DTYPES
    _check_pool("k_cache", k_cache, q.dtype)
    _check_pool("v_cache", v_cache, q.dtype)

    # q and the heads.
    layout = "[total_q, nheads, head_dim] (with cu_seqlens_q)" if group else "[batch, seqlen_q, nheads, head_dim]"
    if q.dim() != (3 if group else 4):
        raise ValueError(f"fmha: q must be {layout}, got shape {tuple(q.shape)}")
    q = _prepare_input(q)
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(
            f"fmha: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in all but the last dim"
        )
    hdim_q, hdim_v = int(q.shape[-1]), int(v_cache.shape[-1])
    if k_cache.shape[-1] != hdim_q:
        raise ValueError(f"fmha: q {tuple(q.shape)} and k_cache {tuple(k_cache.shape)} differ in head_dim")
    nhead_q, nhead_k = int(q.shape[-2]), int(k_cache.shape[2])
    if nhead_k < 1 or nhead_q % nhead_k:
        raise ValueError(
            f"fmha: q has {nhead_q} heads, k_cache {nhead_k}: the query heads must be a multiple of the kv heads"
        )
    num_pages, page_size = int(k_cache.shape[0]), int(k_cache.shape[1])
    if num_pages < 1 or page_size < 1:
        raise ValueError(f"fmha: k_cache {tuple(k_cache.shape)} has no token slots")

    # Sequences and query rows.
    if group:
        cu_seqlens_q = _int32_vector("cu_seqlens_q", cu_seqlens_q, None)
        if cu_seqlens_q.numel() < 1:
            raise ValueError("fmha: cu_seqlens_q must have batch + 1 >= 1 entries")
        batch = cu_seqlens_q.numel() - 1
        total_q = int(q.shape[0])
        if max_seqlen_q is None:
            raise ValueError("fmha: varlen (cu_seqlens_q) needs max_seqlen_q (a host int, an upper bound)")
        max_sq = max(0, min(int(max_seqlen_q), total_q))
        seqlen_q = total_q
    else:
        if cu_seqlens_k_new is not None:
            raise ValueError("fmha: cu_seqlens_k_new needs varlen queries (cu_seqlens_q)")
        batch, seqlen_q = int(q.shape[0]), int(q.shape[1])
        total_q, max_sq = batch * seqlen_q, seqlen_q

    # The table and each sequence's capacity.
    if paged:
        if cache_batch_idx is not None:
            raise ValueError("fmha: cache_batch_idx does not apply to a paged cache (page_table)")
        _require_tensor("page_table", page_table)
        if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != batch:
            raise ValueError(
                f"fmha: page_table must be a 2-D torch.int32 tensor (batch = {batch}, max_blocks), got "
                f"{page_table.dtype} of shape {tuple(page_table.shape)}"
            )
        if page_table.shape[1] < 1:
            raise ValueError("fmha: page_table must have at least one entry per sequence")
        if page_table.size(1) > 1 and page_table.stride(1) != 1:
            page_table = page_table.contiguous()
        capacity = int(page_table.shape[1]) * page_size
    else:
        if cache_batch_idx is not None:
            cache_batch_idx = _int32_vector("cache_batch_idx", cache_batch_idx, batch)
        elif num_pages < batch:
            raise ValueError(
                f"fmha: k_cache has {num_pages} slots (batch_cache), fewer than the {batch} sequences of q; pass "
                "cache_batch_idx to pick a slot per sequence"
            )
        capacity = page_size

    if cache_seqlens is None:
        cache_lens = None
    elif isinstance(cache_seqlens, int):
        if cache_seqlens < 0:
            raise ValueError(f"fmha: cache_seqlens = {cache_seqlens} is negative")
        cache_lens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=k_cache.device)
    else:
        if cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1 or cache_seqlens.shape[0] != batch:
            raise ValueError(
                f"fmha: cache_seqlens must be an int or a 1-D torch.int32 tensor of batch = {batch} lengths, got "
                f"{cache_seqlens.dtype} of shape {tuple(cache_seqlens.shape)}"
            )
        cache_lens = cache_seqlens.contiguous()

    # New tokens: appended to the cache in place, attended to after the cached ones.
    if (k is None) != (v is None):
        raise ValueError("fmha: pass both k and v (new tokens), or neither")
    if k is not None:
        if cache_lens is None:
            raise ValueError("fmha: appending k/v needs cache_seqlens (where each sequence's new tokens go)")
        group_new = cu_seqlens_k_new is not None
        want = 3 if group_new else 4
        new_layout = "[total_new, nheads_k, head_dim] (with cu_seqlens_k_new)" if group_new else (
            "[batch, seqlen_new, nheads_k, head_dim]"
        )
        for name, t, d, cache in (("k", k, hdim_q, k_cache), ("v", v, hdim_v, v_cache)):
            if t.dtype != q.dtype:
                raise TypeError(f"fmha: {name} has dtype {t.dtype}, the cache {q.dtype} (they must agree)")
            if t.dim() != want or t.shape[-2] != nhead_k or t.shape[-1] != d or (not group_new and t.shape[0] != batch):
                raise ValueError(
                    f"fmha: {name} must be {new_layout} with nheads_k = {nhead_k}, head_dim = {d}"
                    + ("" if group_new else f", batch = {batch}")
                    + f"; got shape {tuple(t.shape)}"
                )
        if k.shape[:-1] != v.shape[:-1]:
            raise ValueError(f"fmha: k {tuple(k.shape)} and v {tuple(v.shape)} differ in all but the last dim")
        if group_new:
            cu_seqlens_k_new = _int32_vector("cu_seqlens_k_new", cu_seqlens_k_new, batch + 1)
        seq, j, new_lens = _new_token_slots(k, cu_seqlens_k_new, batch, group_new)
        k_tokens = k.reshape(-1, nhead_k, hdim_q)
        v_tokens = v.reshape(-1, nhead_k, hdim_v)
        _append_to_cache(
            k_cache,
            v_cache,
            k_tokens,
            v_tokens,
            seq=seq,
            j=j,
            cache_seqlens=cache_lens,
            cache_batch_idx=cache_batch_idx,
            page_table=page_table,
            capacity=capacity,
        )
        seqlen_k = (cache_lens + new_lens).to(torch.int32)
    elif cache_lens is not None:
        seqlen_k = cache_lens
    else:
        seqlen_k = torch.full((batch,), capacity, dtype=torch.int32, device=k_cache.device)

    # Outputs.
    out_dtype = _output_dtype(q.dtype)
    out_shape = tuple(q.shape[:-1]) + (hdim_v,)
    out = torch.empty(out_shape, dtype=out_dtype, device=q.device)
    lse = None
    if return_softmax_lse:
        lse_shape = (nhead_q, total_q) if group else (batch, nhead_q, seqlen_q)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)

    mask_type, left, right = _flash_mask(causal, window_size, max_sq, capacity)
    traits = _traits(
        dtype=dtype_code,
        hdim_q=hdim_q,
        hdim_v=hdim_v,
        nhead_q=nhead_q,
        nhead_k=nhead_k,
        is_group_mode=int(group),
        mask_type=mask_type,
        has_lse=int(bool(return_softmax_lse)),
        kv_table_kind=L.KV_BLOCK_TABLE if paged else L.KV_CONTIGUOUS,
        page_size=page_size,
        batch=batch,
        total_q=total_q,
        max_seqlen_q=max_sq,
        max_seqlen_k=capacity,
        max_splits=max(0, min(int(num_splits or 0), _MAX_SPLITS)),
        check_tables=0,
    )
    args = L.fmha_kvcache_args(
        q=_rows_tensor(q, group),
        k=_pool_tensor(k_cache, "NHD"),
        v=_pool_tensor(v_cache, "NHD"),
        o=_rows_tensor(out, group),
        lse=_lse_tensor(lse, group),
        seqstart_q=_ptr(cu_seqlens_q) if group else None,
        batch=batch,
        seqlen_q=seqlen_q,
        num_pages=num_pages,
        max_pages_per_seq=int(page_table.shape[1]) if paged else 0,
        num_page_indices=0,
        seqlen_k=_ptr(seqlen_k),
        block_table=_ptr(page_table) if paged else None,
        block_table_stride=int(page_table.stride(0)) if paged else 0,
        kv_indptr=None,
        page_indices=None,
        last_page_len=None,
        cache_batch_idx=_ptr(cache_batch_idx),
        scale=_scale(softmax_scale, hdim_q),
        window_size_left=left,
        window_size_right=right,
        q_descale=_descale("q_descale", q_descale, batch, nhead_k, q.device) if fp8 else L.fmha_scale(),
        k_descale=_descale("k_descale", k_descale, batch, nhead_k, q.device) if fp8 else L.fmha_scale(),
        v_descale=_descale("v_descale", v_descale, batch, nhead_k, q.device) if fp8 else L.fmha_scale(),
        workspace=None,
        workspace_size=0,
    )
    # A splitting launcher (decode against long caches) keeps its plan and partial results here.
    ws_size = c_size_t(0)
    L.call("fmha_kvcache_workspace_size_upper_bound", byref(traits), byref(ws_size))
    workspace = torch.empty(ws_size.value, dtype=torch.uint8, device=q.device)
    args.workspace, args.workspace_size = _ptr(workspace), ws_size.value
    with _device_guard(device):
        stream = _stream_handle(device)
        scheduler = _kvcache_scheduler_workspace(_kvcache_scheduler_workspace_size, traits, device, stream)
        args.scheduler_workspace, args.scheduler_workspace_size, keep = scheduler  # noqa: F841 (held)
        L.call("fmha_kvcache_fwd", byref(traits), byref(args), stream)
        _finish(device)
    return (out, lse) if return_softmax_lse else out


# --- flashinfer: BatchPrefillWithPagedKVCacheWrapper -----------------------------------------------------


def _scale_value(name, x):
    """A host float scale (flashinfer's q_scale/k_scale/v_scale for fp16/bf16 caches)."""
    if isinstance(x, torch.Tensor):
        raise TypeError(
            f"fmha: {name} must be a float for fp16/bf16 caches (it scales the softmax or the output on the host "
            "side); tensor scales are fp8 descales"
        )
    value = float(x)
    if not (value > 0.0 and math.isfinite(value)):
        raise ValueError(f"fmha: {name} must be positive and finite, got {x}")
    return value


class BatchPrefillWithPagedKVCacheWrapper:
    """flashinfer's ``BatchPrefillWithPagedKVCacheWrapper`` on fmha: prefill/append attention of a batch of
    ragged queries over a paged KV cache described by a CSR page table (flashinfer's / SGLang's
    ``kv_indptr``, ``kv_indices``, ``kv_last_page_len``: ``FMHA_KV_PAGE_CSR``).

    :meth:`plan` runs once per batch layout, on the host: it reads the index arrays' lengths on the host,
    creates the launchers, keeps device copies of the arrays, sizes and allocates the workspace and enqueues
    the prepare (which checks every length and page id on the stream; :meth:`check` reports what it found).
    :meth:`run` runs once per layer and only enqueues ``fmha_kvcache_launcher_run`` on the current stream
    (plus the allocation of its output and, for fp8 scales given as floats, a one-element fill): no host
    synchronization and no host-to-device copy, so it can be captured in a CUDA graph. (On the host backend
    every call waits for its work, as all of fmha's Python functions do there.)

    ``workspace_buffer``: a uint8 device tensor fmha may use (flashinfer's ``float_workspace_buffer``; fmha
    needs a few hundred bytes of it), or ``None`` to allocate one in :meth:`plan`. ``kv_layout``: ``"NHD"``
    (pools ``[num_pages, page_size, num_kv_heads, head_dim]``) or ``"HND"`` (``[num_pages, num_kv_heads,
    page_size, head_dim]``).

    Example::

        wrapper = fmha.BatchPrefillWithPagedKVCacheWrapper(kv_layout="NHD")
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, num_qo_heads=32, num_kv_heads=8,
                     head_dim=128, page_size=16, causal=True, q_data_type=torch.bfloat16)
        for layer in range(num_layers):
            o = wrapper.run(q[layer], (k_cache[layer], v_cache[layer]))
    """

    def __init__(self, workspace_buffer=None, kv_layout="NHD"):
        if kv_layout not in ("NHD", "HND"):
            raise ValueError(f"fmha: kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
        if workspace_buffer is not None:
            _require_tensor("workspace_buffer", workspace_buffer)
            if workspace_buffer.dtype != torch.uint8 or not workspace_buffer.is_contiguous():
                raise ValueError("fmha: workspace_buffer must be a contiguous torch.uint8 tensor")
            _check_tensors([("workspace_buffer", workspace_buffer)])
        self._kv_layout = kv_layout
        self._user_workspace = workspace_buffer
        self._plan = None
        self._launchers = {}

    @property
    def kv_layout(self) -> str:
        return self._kv_layout

    # -- plan -------------------------------------------------------------------------------------------

    def _device(self, arrays):
        if self._user_workspace is not None:
            return self._user_workspace.device
        if _on_host_backend():
            return torch.device("cpu")
        for t in arrays:
            if t.device.type == "cuda":
                return t.device
        return torch.device("cuda", torch.cuda.current_device())

    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type=torch.float16,
        kv_data_type=None,
        o_data_type=None,
        non_blocking=True,
        *,
        num_pages=None,
        check_tables=True,
        num_splits=0,
    ):
        """Plans the batch (flashinfer's ``plan``, same parameters in the same order).

        ``qo_indptr`` ``[batch + 1]``: query rows of sequence ``b`` are ``qo_indptr[b]..qo_indptr[b + 1]``;
        ``paged_kv_indptr`` ``[batch + 1]``, ``paged_kv_indices`` ``[paged_kv_indptr[-1]]`` (physical page ids),
        ``paged_kv_last_page_len`` ``[batch]`` (``1..page_size`` tokens in each sequence's last page): the
        KV length of sequence ``b`` is ``(n - 1) * page_size + last_page_len[b]`` with ``n`` its pages (0 when
        ``n = 0``). Integer tensors on the host or the device (read on the host here: this synchronizes).
        ``causal`` and ``window_left`` (``-1`` = unbounded) are aligned to each sequence's KV length (its
        queries are its last tokens). ``sm_scale`` defaults to ``1/sqrt(head_dim)``. ``q_data_type`` and
        ``kv_data_type`` must agree (fp16, bf16, fp8 e4m3fn/e4m3fnuz); ``o_data_type`` is their type, bf16 for
        fp8.

        fmha's additions (keywords): ``num_pages``, the pages of the pools :meth:`run` will get (default
        ``max(paged_kv_indices) + 1``): the prepare checks the page ids against it; ``check_tables``: check
        every page id, not only the lengths (default True); ``num_splits``: split-KV (0 = fmha chooses from
        the plan's shapes and the device, 1 = never split, ``n`` = at most ``n`` chunks per sequence).

        Not supported (``NotImplementedError``): ``custom_mask``/``packed_custom_mask``, ``pos_encoding_mode``
        other than ``"NONE"`` (RoPE, ALiBi), ``logits_soft_cap > 0``. ``use_fp16_qk_reduction`` and
        ``non_blocking`` are accepted and have no effect.
        """
        if custom_mask is not None or packed_custom_mask is not None:
            raise NotImplementedError("fmha: custom masks are not supported; use causal / window_left")
        if pos_encoding_mode != "NONE":
            raise NotImplementedError(
                f"fmha: pos_encoding_mode={pos_encoding_mode!r} is not supported (only 'NONE'); apply RoPE to q "
                "and k before the call"
            )
        if logits_soft_cap is not None and float(logits_soft_cap) > 0.0:
            raise NotImplementedError(f"fmha: logits_soft_cap is not supported (logits_soft_cap={logits_soft_cap})")
        q_dtype = _canonical_dtype(q_data_type, "q_data_type")
        kv_dtype = q_dtype if kv_data_type is None else _canonical_dtype(kv_data_type, "kv_data_type")
        dtype_code = _dtype_code(q_dtype, "q_data_type")
        _dtype_code(kv_dtype, "kv_data_type")
        if kv_dtype != q_dtype:
            raise TypeError(
                f"fmha: q_data_type {q_dtype} and kv_data_type {kv_dtype} differ: fmha runs q, k and v in one type "
                "(quantize q to the cache's fp8 type, with q_scale)"
            )
        o_dtype = _output_dtype(q_dtype)
        if o_data_type is not None and _canonical_dtype(o_data_type, "o_data_type") != o_dtype:
            raise TypeError(f"fmha: o_data_type must be {o_dtype} for {q_dtype} inputs, got {o_data_type}")
        num_qo_heads, num_kv_heads, page_size = int(num_qo_heads), int(num_kv_heads), int(page_size)
        head_dim_qk = int(head_dim)
        head_dim_vo = head_dim_qk if head_dim_vo is None else int(head_dim_vo)
        if page_size < 1:
            raise ValueError(f"fmha: page_size must be at least 1, got {page_size}")

        named = [
            ("qo_indptr", qo_indptr),
            ("paged_kv_indptr", paged_kv_indptr),
            ("paged_kv_indices", paged_kv_indices),
            ("paged_kv_last_page_len", paged_kv_last_page_len),
        ]
        for name, t in named:
            _require_tensor(name, t)
            if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"fmha: {name} must be a 1-D integer tensor, got {t.dtype} of shape {tuple(t.shape)}")
        batch = qo_indptr.numel() - 1
        if batch < 0:
            raise ValueError("fmha: qo_indptr must have batch + 1 >= 1 entries")
        if paged_kv_indptr.numel() != batch + 1:
            raise ValueError(
                f"fmha: paged_kv_indptr has {paged_kv_indptr.numel()} entries, qo_indptr {batch + 1} (batch + 1 each)"
            )
        if paged_kv_last_page_len.numel() != batch:
            raise ValueError(
                f"fmha: paged_kv_last_page_len has {paged_kv_last_page_len.numel()} entries, expected batch = {batch}"
            )
        device = self._device([t for _, t in named])

        # The bounds, from host copies (flashinfer's plan reads them on the host too). Bad values are left
        # to the prepare, which names them (check()).
        qo_host = qo_indptr.to("cpu", torch.int64)
        kv_host = paged_kv_indptr.to("cpu", torch.int64)
        last_host = paged_kv_last_page_len.to("cpu", torch.int64)
        total_q = max(int(qo_host[-1]), 0)
        max_sq = max([0] + (qo_host[1:] - qo_host[:-1]).tolist())
        pages = (kv_host[1:] - kv_host[:-1]).clamp(min=0)
        kv_lens = torch.where(pages > 0, (pages - 1) * page_size + last_host, torch.zeros_like(pages))
        max_sk = max([0] + kv_lens.tolist())
        num_page_indices = int(paged_kv_indices.numel())
        if num_pages is None:
            num_pages = int(paged_kv_indices.max()) + 1 if num_page_indices else 1
        num_pages = max(int(num_pages), 1)

        # Device copies (the launcher reads them on every run).
        qo_dev = qo_indptr.to(device, torch.int32).contiguous()
        kv_indptr_dev = paged_kv_indptr.to(device, torch.int32).contiguous()
        indices_dev = paged_kv_indices.to(device, torch.int32).contiguous()
        last_dev = paged_kv_last_page_len.to(device, torch.int32).contiguous()

        causal = bool(causal)
        window_left = int(window_left)
        mask_type, left, right = _flash_mask(causal, (window_left, -1), max_sq, max_sk)
        scale = _scale(sm_scale, head_dim_qk)

        def traits(has_lse):
            return _traits(
                dtype=dtype_code,
                hdim_q=head_dim_qk,
                hdim_v=head_dim_vo,
                nhead_q=num_qo_heads,
                nhead_k=num_kv_heads,
                is_group_mode=1,
                mask_type=mask_type,
                has_lse=int(has_lse),
                kv_table_kind=L.KV_PAGE_CSR,
                page_size=page_size,
                batch=batch,
                total_q=total_q,
                max_seqlen_q=max_sq,
                max_seqlen_k=max_sk,
                max_splits=max(0, min(int(num_splits or 0), _MAX_SPLITS)),
                check_tables=int(bool(check_tables)),
            )

        launchers = {False: _KvLauncher(traits(False)), True: _KvLauncher(traits(True))}
        ws_size = max(launchers[False].workspace_size(), launchers[True].workspace_size())
        workspace = self._user_workspace
        if workspace is not None:
            if workspace.numel() < ws_size or workspace.data_ptr() % 16:
                raise ValueError(
                    f"fmha: workspace_buffer must be 16-byte aligned and hold at least {ws_size} bytes "
                    f"(it has {workspace.numel()})"
                )
        else:
            workspace = torch.empty(max(ws_size, 16), dtype=torch.uint8, device=device)

        self._launchers = launchers
        self._plan = dict(
            device=device,
            batch=batch,
            total_q=total_q,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_vo,
            page_size=page_size,
            q_dtype=q_dtype,
            o_dtype=o_dtype,
            causal=causal,
            window_left=window_left,
            mask=(left, right),
            scale=scale,
            qo_indptr=qo_dev,
            kv_indptr=kv_indptr_dev,
            kv_indices=indices_dev,
            last_page_len=last_dev,
            num_page_indices=num_page_indices,
            num_pages=num_pages,
            workspace=workspace,
            workspace_size=ws_size,
        )

        # The prepare validates the whole call, so it gets stand-ins for the tensors run() will pass: q and
        # the pools broadcast from one row (inputs may use stride 0), o a scratch buffer it does not write.
        placeholder = torch.zeros(max(head_dim_qk, head_dim_vo), dtype=q_dtype, device=device)
        broadcast = L.fmha_tensor(_ptr(placeholder), 0, 0, 0)
        o_scratch = torch.empty((total_q, num_qo_heads, head_dim_vo), dtype=o_dtype, device=device)
        args = self._args(q=broadcast, k=broadcast, v=broadcast, o=_rows_tensor(o_scratch, True), lse=None,
                          num_pages=num_pages, scales=None, scale=scale)
        with _device_guard(device):
            L.call("fmha_kvcache_launcher_prepare_async", launchers[False].handle, byref(args),
                   _stream_handle(device))
            _finish(device)
        del placeholder, o_scratch

    begin_forward = plan

    def _args(self, *, q, k, v, o, lse, num_pages, scales, scale):
        p = self._plan
        left, right = p["mask"]
        none = L.fmha_scale(None, 0, 0, 0)
        q_d, k_d, v_d = scales if scales is not None else (none, none, none)
        return L.fmha_kvcache_args(
            q=q,
            k=k,
            v=v,
            o=o,
            lse=lse if lse is not None else L.fmha_tensor(None, 0, 0, 0),
            seqstart_q=_ptr(p["qo_indptr"]),
            batch=p["batch"],
            seqlen_q=p["total_q"],
            num_pages=num_pages,
            max_pages_per_seq=0,
            num_page_indices=p["num_page_indices"],
            seqlen_k=None,
            block_table=None,
            block_table_stride=0,
            kv_indptr=_ptr(p["kv_indptr"]),
            page_indices=_ptr(p["kv_indices"]),
            last_page_len=_ptr(p["last_page_len"]),
            cache_batch_idx=None,
            scale=scale,
            window_size_left=left,
            window_size_right=right,
            q_descale=q_d,
            k_descale=k_d,
            v_descale=v_d,
            workspace=_ptr(p["workspace"]),
            workspace_size=p["workspace_size"],
        )

    # -- run --------------------------------------------------------------------------------------------

    def _unpack(self, paged_kv_cache):
        if isinstance(paged_kv_cache, (tuple, list)):
            if len(paged_kv_cache) != 2:
                raise ValueError("fmha: paged_kv_cache must be a (k_cache, v_cache) pair or one tensor")
            return paged_kv_cache[0], paged_kv_cache[1]
        _require_tensor("paged_kv_cache", paged_kv_cache)
        if paged_kv_cache.dim() != 5 or paged_kv_cache.shape[1] != 2:
            raise ValueError(
                "fmha: a single paged_kv_cache tensor must be [num_pages, 2, page_size, num_kv_heads, head_dim] "
                f"(NHD) or [num_pages, 2, num_kv_heads, page_size, head_dim] (HND), got {tuple(paged_kv_cache.shape)}"
            )
        return paged_kv_cache[:, 0], paged_kv_cache[:, 1]

    def _fp8_scale(self, name, x, device):
        """An fp8 descale (flashinfer's q_scale/k_scale/v_scale) → fmha_scale and the tensor to keep alive:
        a float, a one-element tensor (per tensor) or a [num_kv_heads] tensor (per kv head)."""
        if x is None:
            return L.fmha_scale(None, 0, 0, 0), None
        heads = self._plan["num_kv_heads"]
        if not isinstance(x, torch.Tensor):
            value = _scale_value(name, x)
            t = torch.full((1,), value, dtype=torch.float32, device=device)  # a fill: no host-to-device copy
            return L.fmha_scale(_ptr(t), 0, 0, 0), t
        if x.dtype != torch.float32 or x.device != device:
            raise TypeError(f"fmha: {name} must be a float32 tensor on {device}, got {x.dtype} on {x.device}")
        if x.numel() == 1:
            return L.fmha_scale(_ptr(x), 0, 0, 0), x
        if x.dim() == 1 and x.shape[0] == heads:
            return L.fmha_scale(_ptr(x), 0, x.stride(0), 0), x
        raise ValueError(f"fmha: {name} must be a float, a one-element tensor or [num_kv_heads = {heads}], got "
                         f"shape {tuple(x.shape)}")

    def run(
        self,
        q,
        paged_kv_cache,
        *,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out=None,
        lse=None,
        return_lse=False,
        lse_base="log2",
        window_left=None,
    ):
        """Attention of ``q`` ``[qo_indptr[-1], num_qo_heads, head_dim]`` over ``paged_kv_cache`` (flashinfer's
        ``run``): a ``(k_cache, v_cache)`` pair of pools in the wrapper's ``kv_layout``, or one tensor
        ``[num_pages, 2, ...]`` (``[:, 0]`` keys, ``[:, 1]`` values). Only enqueues work (see the class).

        ``q_scale``/``k_scale``/``v_scale``: flashinfer's calibration scales (true value = stored value ×
        scale). fp8 inputs: fmha's descales -- a float, a one-element float32 tensor, or a ``[num_kv_heads]``
        tensor (per kv head). fp16/bf16 inputs: floats, folded into the softmax scale (q, k) or multiplied
        into the output (v), as flashinfer does.

        Returns ``out`` ``[qo_indptr[-1], num_qo_heads, head_dim_vo]`` (``o_data_type``), or ``(out, lse)`` with
        ``return_lse=True``: ``lse`` ``[qo_indptr[-1], num_qo_heads]`` fp32 in base 2 like flashinfer's
        (``lse_base="ln"``: natural log); ``-inf`` for a row with no key. ``out``/``lse`` may be given
        (preallocated, flashinfer's shapes). ``window_left``, if given, must be the plan's.
        """
        p = self._plan
        if p is None:
            raise RuntimeError("fmha: call plan() before run()")
        if lse_base not in ("log2", "ln"):
            raise ValueError(f"fmha: lse_base must be 'log2' or 'ln', got {lse_base!r}")
        if window_left is not None and int(window_left) != p["window_left"]:
            raise ValueError(
                f"fmha: window_left={window_left} differs from the plan's {p['window_left']} (plan again to change it)"
            )
        k_cache, v_cache = self._unpack(paged_kv_cache)
        device = _check_tensors([("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out), ("lse", lse)])
        if device != p["device"]:
            raise ValueError(f"fmha: the tensors are on {device}, the plan on {p['device']}")
        dtype, fp8 = p["q_dtype"], p["q_dtype"] in _FP8_DTYPES
        heads_q, heads_k, d, dv, page = (
            p["num_qo_heads"], p["num_kv_heads"], p["head_dim_qk"], p["head_dim_vo"], p["page_size"]
        )
        if q.dtype != dtype:
            raise TypeError(f"fmha: q has dtype {q.dtype}, the plan's q_data_type is {dtype}")
        if tuple(q.shape) != (p["total_q"], heads_q, d):
            raise ValueError(
                f"fmha: q must be [qo_indptr[-1], num_qo_heads, head_dim] = {(p['total_q'], heads_q, d)}, got "
                f"{tuple(q.shape)}"
            )
        q = _prepare_input(q)
        for name, t, dim in (("k_cache", k_cache, d), ("v_cache", v_cache, dv)):
            _check_pool(name, t, dtype)
            want = (page, heads_k, dim) if self._kv_layout == "NHD" else (heads_k, page, dim)
            if tuple(t.shape[1:]) != want:
                what = "[num_pages, page_size, num_kv_heads, head_dim]" if self._kv_layout == "NHD" else (
                    "[num_pages, num_kv_heads, page_size, head_dim]"
                )
                raise ValueError(
                    f"fmha: {name} must be {what} = [num_pages, {', '.join(map(str, want))}] ({self._kv_layout}), "
                    f"got {tuple(t.shape)}"
                )
        if k_cache.shape[0] != v_cache.shape[0]:
            raise ValueError(f"fmha: k_cache has {k_cache.shape[0]} pages, v_cache {v_cache.shape[0]}")

        o_dtype = p["o_dtype"]
        out_shape = (p["total_q"], heads_q, dv)
        if out is None:
            out = torch.empty(out_shape, dtype=o_dtype, device=device)
        elif tuple(out.shape) != out_shape or out.dtype != o_dtype or (out.size(-1) > 1 and out.stride(-1) != 1):
            raise ValueError(
                f"fmha: out must be {o_dtype} of shape {out_shape} with a contiguous last dimension, got {out.dtype} "
                f"{tuple(out.shape)}"
            )
        if lse is not None:
            if tuple(lse.shape) != (p["total_q"], heads_q) or lse.dtype != torch.float32:
                raise ValueError(
                    f"fmha: lse must be torch.float32 of shape {(p['total_q'], heads_q)}, got {lse.dtype} "
                    f"{tuple(lse.shape)}"
                )
            return_lse = True
        lse_hn = torch.empty((heads_q, p["total_q"]), dtype=torch.float32, device=device) if return_lse else None

        scale, keep = p["scale"], []
        if fp8:
            scales = []
            for name, x in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
                s, t = self._fp8_scale(name, x, device)
                scales.append(s)
                keep.append(t)
            v_factor = None
        else:
            scales = None
            for name, x in (("q_scale", q_scale), ("k_scale", k_scale)):
                if x is not None:
                    scale *= _scale_value(name, x)
            v_factor = None if v_scale is None else _scale_value("v_scale", v_scale)

        args = self._args(
            q=_rows_tensor(q, True),
            k=_pool_tensor(k_cache, self._kv_layout),
            v=_pool_tensor(v_cache, self._kv_layout),
            o=_rows_tensor(out, True),
            lse=_lse_tensor(lse_hn, True),
            num_pages=int(k_cache.shape[0]),
            scales=scales,
            scale=scale,
        )
        launcher = self._launchers[bool(return_lse)]
        with _device_guard(device):
            stream = _stream_handle(device)
            args.scheduler_workspace, args.scheduler_workspace_size, held = _kvcache_scheduler_workspace(
                _KvLauncher.scheduler_workspace_size, launcher, device, stream
            )
            keep.append(held)  # the workspace's tensor lives until the run was queued
            L.call("fmha_kvcache_launcher_run", launcher.handle, byref(args), stream)
            _finish(device)
        del keep  # the scale tensors lived until the run was queued (stream-ordered reuse after that)
        if v_factor is not None and v_factor != 1.0:
            out.mul_(v_factor)
        if not return_lse:
            return out
        if lse_base == "log2":
            lse_hn.mul_(_LOG2E)
        if lse is not None:
            lse.copy_(lse_hn.t())
            return out, lse
        return out, lse_hn.t()

    def run_return_lse(self, q, paged_kv_cache, **kwargs):
        """``run(..., return_lse=True)`` (flashinfer's ``run_return_lse``)."""
        return self.run(q, paged_kv_cache, return_lse=True, **kwargs)

    def check(self):
        """What the plan's prepare found in the index arrays (``fmha_kvcache_launcher_check``; blocking: it
        waits for the current stream). Returns ``None`` when every length and page id is valid; raises
        :class:`fmha.FmhaError` with ``FMHA_ERR_ASYNC_FAILURE`` naming the field, the sequence and the value
        otherwise (the GPU kernels clamp such values, so the rows of that sequence are unspecified)."""
        p = self._plan
        if p is None:
            raise RuntimeError("fmha: call plan() before check()")
        device = p["device"]
        with _device_guard(device):
            L.call(
                "fmha_kvcache_launcher_check",
                self._launchers[False].handle,
                _ptr(p["workspace"]),
                p["workspace_size"],
                _stream_handle(device),
            )


__all__ = ["BatchPrefillWithPagedKVCacheWrapper", "flash_attn_with_kvcache"]


class BatchDecodeWithPagedKVCacheWrapper(BatchPrefillWithPagedKVCacheWrapper):
    """flashinfer's ``BatchDecodeWithPagedKVCacheWrapper`` on fmha: one query token per sequence against a
    paged KV cache in flashinfer's CSR format, with split-KV (each sequence's keys cut into chunks attended
    in parallel and combined in a fixed order) where the batch alone does not fill the GPU, and the query
    heads of one kv head packed into one tile on Hopper.

    :meth:`plan` once per batch layout (host), :meth:`run` per layer (no host synchronization, CUDA-graph
    safe), :meth:`check` as the prefill wrapper. ``q`` is ``[batch, num_qo_heads, head_dim]``.
    ``use_tensor_cores`` and flashinfer's other constructor options are accepted and have no effect.
    """

    def __init__(self, workspace_buffer=None, kv_layout="NHD", use_tensor_cores=False, **_flashinfer_options):
        super().__init__(workspace_buffer, kv_layout)

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        window_left=-1,
        logits_soft_cap=None,
        q_data_type=torch.float16,
        kv_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
        *,
        num_pages=None,
        check_tables=True,
        num_splits=0,
    ):
        """Plans the batch (flashinfer's decode ``plan``, same parameters in the same order; ``data_type``
        is flashinfer's older name of ``q_data_type``). The keywords are the prefill wrapper's."""
        _require_tensor("indptr", indptr)
        batch = indptr.numel() - 1
        qo_indptr = torch.arange(max(batch, 0) + 1, dtype=torch.int32)
        super().plan(
            qo_indptr, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
            pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale, window_left=window_left,
            logits_soft_cap=logits_soft_cap, q_data_type=q_data_type if data_type is None else data_type,
            kv_data_type=kv_data_type, num_pages=num_pages, check_tables=check_tables, num_splits=num_splits,
        )

    begin_forward = plan
