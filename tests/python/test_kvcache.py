"""Attention over a KV cache: flash-attn's ``flash_attn_with_kvcache`` (contiguous and paged caches, new tokens
appended in place, varlen queries, fp8 with descales) and flashinfer's ``BatchPrefillWithPagedKVCacheWrapper``
(CSR page table, NHD and HND pools), against a float64 PyTorch reference computed from each sequence's
tokens in logical order -- never through the page table -- with the field's rule for fp16/bf16 (2x the error
of the same computation in the input precision + a small floor).

The caches are poisoned: every slot that holds no token of a sequence (free pages, the rest of a last page,
the rows past a slot's length) is NaN, and the block tables' padding entries are out-of-range ids, so a read
of anything but the sequence's own tokens shows in the output. Shapes are small: the host backend runs them
on the CPU.
"""

import ctypes
import inspect
import math
import os
import threading

import pytest
import torch

import fmha
from fmha import _lib, kvcache as kv

from attn_ref import (
    BOTTOM_RIGHT,
    DEVICE,
    DTYPE_IDS,
    FLOOR_LSE,
    FLOOR_OUT,
    GPU,
    HOST,
    attention_ref,
    call_or_skip,
    check_rule,
    flash_mask,
    keep_mask,
    max_err,
)

FP8 = [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e4m3fnuz", None)) if d is not None]
FP8_IDS = {d: str(d).removeprefix("torch.") for d in FP8}

# flash-attn's (causal, window_size), bottom-right aligned.
MASKS = {
    "none": (False, (-1, -1)),
    "causal": (True, (-1, -1)),
    "window": (False, (4, 2)),
    "window_causal": (True, (6, -1)),
}
HEADS = {"mha": (2, 2), "gqa": (4, 2), "mqa": (4, 1)}  # (nheads, nheads_k)
PADDING_IDS = (-1, 2**31 - 1, 1 << 20)  # what a block table's unused entries may hold


def kvcache_call(fn, dtype, hdim, masked):
    """fn(), skipped where this build's registry has no kv-cache kernel for the combination (GPU builds
    before the kernel lands); a listed one must run."""
    return call_or_skip(fn, op="kvcache", dtype=dtype, hdim_q=hdim, hdim_v=hdim, masked=masked)


def nan_like(shape, dtype):
    """A tensor of NaN (fp8: the format's NaN code) on the test device."""
    if dtype in FP8:
        nan = 0x80 if dtype == getattr(torch, "float8_e4m3fnuz", None) else 0x7F
        return torch.full(shape, nan, dtype=torch.uint8, device=DEVICE).view(dtype)
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def rand(*shape, dtype):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def reference(qs, ks, vs, causal, window, scale):
    """Per-sequence reference: qs[b] [sq, h, d], ks[b]/vs[b] [sk, h_k, d] in logical order →
    (out in float64, lse in float64, out in the input precision) as lists of [sq, h, dv] / [h, sq]."""
    kind, left, right = flash_mask(causal, window)
    outs, lses, pts = [], [], []
    for q, k, v in zip(qs, ks, vs):
        keep = keep_mask(q.shape[0], k.shape[0], kind, left, right)
        o, lse = attention_ref(q[None], k[None], v[None], keep, scale)
        o_pt, _ = attention_ref(q[None], k[None], v[None], keep, scale, upcast=False, reorder_ops=True)
        outs.append(o[0])
        lses.append(lse[0])
        pts.append(o_pt[0])
    return outs, lses, pts


def compare(name, out, lse, ref, group):
    """out/lse of a call against `reference`'s lists (batch mode: stacked; varlen: concatenated)."""
    outs, lses, pts = ref
    if group:
        o_ref, o_pt, lse_ref = torch.cat(outs, 0), torch.cat(pts, 0), torch.cat(lses, 1)
    else:
        o_ref, o_pt, lse_ref = torch.stack(outs), torch.stack(pts), torch.stack(lses)
    check_rule(f"{name} out", out, o_ref, o_pt, 2, FLOOR_OUT)
    if lse is not None:
        assert lse.shape == lse_ref.shape, f"{name} lse: shape {tuple(lse.shape)} != {tuple(lse_ref.shape)}"
        err = max_err(lse, lse_ref)  # fp32 statistics of the same scores: far tighter than the outputs
        finite = lse_ref[torch.isfinite(lse_ref)]
        bound = 1e-4 * (1 + (finite.abs().max().item() if finite.numel() else 0.0)) + FLOOR_LSE
        assert err <= bound, f"{name} lse: max error {err:.3e} > {bound:.3e}"


class PagedCache:
    """Sequences' K/V scattered over a shuffled pool of pages, NaN everywhere else."""

    def __init__(self, ks, vs, page_size, capacity=None, free_pages=3, layout="NHD", like=None):
        """`like`: another PagedCache whose page assignment (and pool size) this one reuses."""
        self.page_size, self.layout = page_size, layout
        if like is not None:
            self.pages_per_seq, self.pages, num_pages = like.pages_per_seq, like.pages, like.k.shape[0]
        else:
            lengths = [k.shape[0] for k in ks]
            capacity = capacity or lengths
            self.pages_per_seq = [max(1, -(-cap // page_size)) for cap in capacity]
            num_pages = sum(self.pages_per_seq) + free_pages
            order = torch.randperm(num_pages).tolist()
            self.pages, at = [], 0
            for n in self.pages_per_seq:
                self.pages.append(order[at : at + n])
                at += n
        heads, d, dv, dtype = ks[0].shape[1], ks[0].shape[2], vs[0].shape[2], ks[0].dtype
        shape = (lambda dim: (num_pages, page_size, heads, dim)) if layout == "NHD" else (
            lambda dim: (num_pages, heads, page_size, dim)
        )
        self.k, self.v = nan_like(shape(d), dtype), nan_like(shape(dv), dtype)
        for b, (k, v) in enumerate(zip(ks, vs)):
            self.write(b, 0, k, v)

    def slot(self, b, j):
        return self.pages[b][j // self.page_size], j % self.page_size

    def write(self, b, start, k, v):
        for i in range(k.shape[0]):
            page, row = self.slot(b, start + i)
            if self.layout == "NHD":
                self.k[page, row], self.v[page, row] = k[i], v[i]
            else:
                self.k[page, :, row], self.v[page, :, row] = k[i], v[i]

    def block_table(self, width=None):
        """[batch, width] int32, the entries past each sequence's pages padding (out-of-range ids)."""
        width = width or max(self.pages_per_seq) + 1
        rows = []
        for b, pages in enumerate(self.pages):
            pad = PADDING_IDS[b % len(PADDING_IDS)]
            rows.append(pages + [pad] * (width - len(pages)))
        return torch.tensor(rows, dtype=torch.int32, device=DEVICE)

    def csr(self, lengths):
        """flashinfer's kv_indptr, kv_indices, kv_last_page_len for sequences of `lengths` tokens."""
        indptr, indices, last = [0], [], []
        for b, n in enumerate(lengths):
            used = -(-n // self.page_size)
            indices += self.pages[b][:used]
            indptr.append(indptr[-1] + used)
            last.append(n - (used - 1) * self.page_size if used else 0)
        as_tensor = lambda x: torch.tensor(x, dtype=torch.int32, device=DEVICE)  # noqa: E731
        return as_tensor(indptr), as_tensor(indices), as_tensor(last)


# --- flash_attn_with_kvcache ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=DTYPE_IDS.get)
@pytest.mark.parametrize("heads", list(HEADS), ids=str)
@pytest.mark.parametrize("mask", list(MASKS), ids=str)
def test_paged_block_table(mask, heads, dtype):
    """A block table over a shuffled pool, padding entries out of range, one empty sequence, a page size
    that divides nothing; batch-mode queries (the last tokens of each sequence), LSE."""
    causal, window = MASKS[mask]
    h, h_k = HEADS[heads]
    d, page_size, sq = 32, 5, 6
    lengths = [23, 9, 0]
    ks = [rand(n, h_k, d, dtype=dtype) for n in lengths]
    vs = [rand(n, h_k, d, dtype=dtype) for n in lengths]
    q = rand(len(lengths), sq, h, d, dtype=dtype)
    cache = PagedCache(ks, vs, page_size)
    table = cache.block_table()
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    masked = causal or window != (-1, -1)
    out, lse = kvcache_call(
        lambda: fmha.flash_attn_with_kvcache(
            q, cache.k, cache.v, cache_seqlens=lens, page_table=table, causal=causal, window_size=window,
            return_softmax_lse=True,
        ),
        dtype, d, masked,
    )
    assert out.shape == q.shape and out.dtype == dtype and lse.shape == (len(lengths), h, sq)
    ref = reference(list(q), ks, vs, causal, window, 1 / math.sqrt(d))
    compare("paged", out, lse, ref, group=False)
    # block_table is flash-attn 2's name for the same argument.
    again = fmha.flash_attn_with_kvcache(
        q, cache.k, cache.v, cache_seqlens=lens, block_table=table, causal=causal, window_size=window
    )
    assert torch.equal(again, out)


@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
def test_contiguous_append(causal):
    """flash-attn's contiguous cache with cache_batch_idx; the new k/v land in the cache in place (checked
    element by element: nothing else changes) and are attended to after the cached tokens."""
    dtype, h, h_k, d, cap, s_new = torch.bfloat16, 4, 1, 32, 40, 4
    slots = [4, 0, 2]
    cached = [10, 0, 33]
    k_cache, v_cache = nan_like((5, cap, h_k, d), dtype), nan_like((5, cap, h_k, d), dtype)
    for b, (slot, n) in enumerate(zip(slots, cached)):
        k_cache[slot, :n], v_cache[slot, :n] = rand(n, h_k, d, dtype=dtype), rand(n, h_k, d, dtype=dtype)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    q = rand(3, s_new, h, d, dtype=dtype)
    k, v = rand(3, s_new, h_k, d, dtype=dtype), rand(3, s_new, h_k, d, dtype=dtype)
    lens = torch.tensor(cached, dtype=torch.int32, device=DEVICE)
    idx = torch.tensor(slots, dtype=torch.int32, device=DEVICE)
    out, lse = kvcache_call(
        lambda: fmha.flash_attn_with_kvcache(
            q, k_cache, v_cache, k, v, cache_seqlens=lens, cache_batch_idx=idx, causal=causal,
            return_softmax_lse=True,
        ),
        dtype, d, causal,
    )
    # The cache: the new tokens at cache_seqlens[b].., everything else as it was; cache_seqlens unchanged.
    k_want, v_want = k_before.clone(), v_before.clone()
    for b, (slot, n) in enumerate(zip(slots, cached)):
        k_want[slot, n : n + s_new], v_want[slot, n : n + s_new] = k[b], v[b]
    assert torch.equal(k_cache.isnan(), k_want.isnan()) and torch.equal(k_cache.nan_to_num(), k_want.nan_to_num())
    assert torch.equal(v_cache.isnan(), v_want.isnan()) and torch.equal(v_cache.nan_to_num(), v_want.nan_to_num())
    assert lens.tolist() == cached
    ks = [torch.cat([k_before[slot, :n], k[b]]) for b, (slot, n) in enumerate(zip(slots, cached))]
    vs = [torch.cat([v_before[slot, :n], v[b]]) for b, (slot, n) in enumerate(zip(slots, cached))]
    compare("contiguous append", out, lse, reference(list(q), ks, vs, causal, (-1, -1), 1 / math.sqrt(d)), False)


def test_contiguous_whole_cache_int_seqlens():
    """No cache_seqlens: the whole slot; an int cache_seqlens: the same length for every sequence."""
    dtype, h, d = torch.float16, 2, 64
    k_cache, v_cache = rand(2, 19, h, d, dtype=dtype), rand(2, 19, h, d, dtype=dtype)
    q = rand(2, 3, h, d, dtype=dtype)
    out = kvcache_call(lambda: fmha.flash_attn_with_kvcache(q, k_cache, v_cache), dtype, d, False)
    ref = reference(list(q), list(k_cache), list(v_cache), False, (-1, -1), 1 / math.sqrt(d))
    compare("whole cache", out, None, ref, False)
    out = fmha.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=11, causal=True, softmax_scale=0.3)
    ref = reference(list(q), list(k_cache[:, :11]), list(v_cache[:, :11]), True, (-1, -1), 0.3)
    compare("int cache_seqlens", out, None, ref, False)


def test_paged_append():
    """New tokens appended through the page table (across page boundaries, into a fresh sequence's first
    page): exactly their slots change."""
    dtype, h, h_k, d, page_size, s_new = torch.bfloat16, 4, 2, 32, 4, 5
    cached = [7, 0, 12]
    capacity = [n + s_new for n in cached]
    ks = [rand(n, h_k, d, dtype=dtype) for n in cached]
    vs = [rand(n, h_k, d, dtype=dtype) for n in cached]
    cache = PagedCache(ks, vs, page_size, capacity=capacity)
    table = cache.block_table()
    k_before, v_before = cache.k.clone(), cache.v.clone()
    q = rand(3, s_new, h, d, dtype=dtype)
    k, v = rand(3, s_new, h_k, d, dtype=dtype), rand(3, s_new, h_k, d, dtype=dtype)
    lens = torch.tensor(cached, dtype=torch.int32, device=DEVICE)
    out = kvcache_call(
        lambda: fmha.flash_attn_with_kvcache(q, cache.k, cache.v, k, v, cache_seqlens=lens, page_table=table,
                                             causal=True),
        dtype, d, True,
    )
    k_want, v_want = k_before.clone(), v_before.clone()
    for b, n in enumerate(cached):
        for i in range(s_new):
            page, row = cache.slot(b, n + i)
            k_want[page, row], v_want[page, row] = k[b, i], v[b, i]
    for got, want in ((cache.k, k_want), (cache.v, v_want)):
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())
    ks = [torch.cat([ks[b], k[b]]) for b in range(3)]
    vs = [torch.cat([vs[b], v[b]]) for b in range(3)]
    compare("paged append", out, None, reference(list(q), ks, vs, True, (-1, -1), 1 / math.sqrt(d)), False)


@pytest.mark.parametrize("mask", ["none", "causal", "window"], ids=str)
def test_varlen_chunked_prefill(mask):
    """Chunked prefill: varlen queries (cu_seqlens_q, an empty one included) whose new tokens (varlen,
    cu_seqlens_k_new) are appended to a paged cache; LSE [nheads, total_q]."""
    causal, window = MASKS[mask]
    dtype, h, h_k, d, page_size = torch.float16, 4, 2, 32, 3
    cached, added = [5, 2, 0, 11], [3, 0, 7, 1]
    capacity = [c + a for c, a in zip(cached, added)]
    ks = [rand(n, h_k, d, dtype=dtype) for n in cached]
    vs = [rand(n, h_k, d, dtype=dtype) for n in cached]
    cache = PagedCache(ks, vs, page_size, capacity=capacity)
    cu = torch.tensor([0] + torch.tensor(added).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    total = sum(added)
    q = rand(total, h, d, dtype=dtype)
    k, v = rand(total, h_k, d, dtype=dtype), rand(total, h_k, d, dtype=dtype)
    lens = torch.tensor(cached, dtype=torch.int32, device=DEVICE)
    out, lse = kvcache_call(
        lambda: fmha.flash_attn_with_kvcache(
            q, cache.k, cache.v, k, v, cache_seqlens=lens, page_table=cache.block_table(), cu_seqlens_q=cu,
            cu_seqlens_k_new=cu, max_seqlen_q=max(added), causal=causal, window_size=window,
            return_softmax_lse=True,
        ),
        dtype, d, mask != "none",
    )
    assert out.shape == (total, h, d) and lse.shape == (h, total)
    starts = cu.tolist()
    qs = [q[starts[b] : starts[b + 1]] for b in range(4)]
    ks = [torch.cat([ks[b], k[starts[b] : starts[b + 1]]]) for b in range(4)]
    vs = [torch.cat([vs[b], v[starts[b] : starts[b + 1]]]) for b in range(4)]
    compare("varlen", out, lse, reference(qs, ks, vs, causal, window, 1 / math.sqrt(d)), group=True)


@pytest.mark.parametrize("fp8", FP8, ids=FP8_IDS.get)
def test_fp8_descales(fp8):
    """fp8 q/k/v with FA3's per-(sequence, kv head) descales, one of them broadcast (stride 0); bf16 output.

    The reference is the float64 attention of the dequantized inputs (stored value x descale), so the
    quantization of the inputs themselves is no error here. What remains is how fp8 attention computes:
    the kernel rounds the softmax probabilities P to fp8 (as FA3 does) before the P.V product, a relative
    error of at most 2^-4 per probability, and rounds O to bf16 (2^-9 relative). With V in [0, 1) the
    output error is at most 2^-4 x sum_j P_j |V_j| < 0.0625 if every rounding went the same way; they do
    not (round-to-nearest errors of the many P_j cancel in the sum), so 0.06 is a loose bound that
    still catches a missing or misapplied descale (those are errors of the order of the outputs, ~0.5).
    The LSE comes from fp32 scores of the dequantized values, as tight as fp16/bf16's, except that fp8
    tensor cores (Hopper's e4m3 wgmma) keep about 14 bits of a dot product's running sum: a score may be
    off by 2^-13 of the sum of its products' magnitudes (tests/kvcache.rs bounds it the same way).
    """
    h, h_k, d, page_size, sq = 4, 2, 64, 6, 5
    lengths = [17, 30, 5]
    batch = len(lengths)
    gen = lambda *s: torch.rand(*s, device=DEVICE, dtype=torch.float64)  # noqa: E731 - values in [0, 1)
    q_d = 0.5 + gen(batch, h_k).float()
    k_d = 0.5 + gen(batch, h_k).float()
    v_d = torch.tensor(0.75, device=DEVICE).expand(batch, h_k)  # one descale for all: stride 0

    def quantize(x, d, heads):  # x [n, heads, dim] true values → fp8 codes with descale d[heads_k]
        return (x / d.double().repeat_interleave(heads // h_k)[None, :, None]).to(fp8)

    q_true = [gen(sq, h, d) for _ in lengths]
    k_true = [gen(n, h_k, d) for n in lengths]
    v_true = [gen(n, h_k, d) for n in lengths]
    q8 = torch.stack([quantize(q_true[b], q_d[b], h) for b in range(batch)])
    k8 = [quantize(k_true[b], k_d[b], h_k) for b in range(batch)]
    v8 = [quantize(v_true[b], v_d[b], h_k) for b in range(batch)]
    cache = PagedCache(k8, v8, page_size)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    out, lse = kvcache_call(
        lambda: fmha.flash_attn_with_kvcache(
            q8, cache.k, cache.v, cache_seqlens=lens, page_table=cache.block_table(), causal=True,
            q_descale=q_d, k_descale=k_d, v_descale=v_d, return_softmax_lse=True,
        ),
        fp8, d, True,
    )
    assert out.dtype == torch.bfloat16 and out.shape == (batch, sq, h, d)
    deq = lambda x8, desc, heads: x8.double() * desc.double().repeat_interleave(heads // h_k)[None, :, None]  # noqa: E731
    scale = 1 / math.sqrt(d)
    worst = 0.0
    for b in range(batch):
        qb, kb, vb = deq(q8[b], q_d[b], h), deq(k8[b], k_d[b], h_k), deq(v8[b], v_d[b], h_k)
        keep = keep_mask(sq, lengths[b], BOTTOM_RIGHT, -1, 0)
        o_ref, lse_ref = attention_ref(qb[None], kb[None], vb[None], keep, scale)
        worst = max(worst, max_err(out[b], o_ref[0]))
        rep = h // h_k
        abs_dot = torch.einsum("ihd,jhd->hij", qb.abs(), kb.abs().repeat_interleave(rep, dim=1)).max().item()
        accumulation = 2.0**-13 * scale * abs_dot
        assert max_err(lse[b], lse_ref[0]) < 1e-4 * (1 + lse_ref[0].abs().max().item()) + accumulation
    assert worst < 0.06, f"fp8 out: max abs error {worst:.4f} against the dequantized reference"


def test_fp8_contiguous_append():
    """fp8 new tokens are appended byte for byte; no descales means 1."""
    fp8 = FP8[0]
    h, d, cap = 2, 32, 16
    k_cache = torch.rand(2, cap, h, d, device=DEVICE).to(fp8)
    v_cache = torch.rand(2, cap, h, d, device=DEVICE).to(fp8)
    k, v = torch.rand(2, 3, h, d, device=DEVICE).to(fp8), torch.rand(2, 3, h, d, device=DEVICE).to(fp8)
    q = torch.rand(2, 3, h, d, device=DEVICE).to(fp8)
    lens = torch.tensor([4, 13], dtype=torch.int32, device=DEVICE)
    out = kvcache_call(
        lambda: fmha.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens), fp8, d, False
    )
    for b, n in enumerate([4, 13]):
        assert torch.equal(k_cache[b, n : n + 3].view(torch.uint8), k[b].view(torch.uint8))
        assert torch.equal(v_cache[b, n : n + 3].view(torch.uint8), v[b].view(torch.uint8))
        keep = keep_mask(3, n + 3, "none", -1, -1)
        o_ref, _ = attention_ref(q[b : b + 1].double(), k_cache[b : b + 1, : n + 3].double(),
                                 v_cache[b : b + 1, : n + 3].double(), keep, 1 / math.sqrt(d))
        assert max_err(out[b], o_ref[0]) < 0.06


# --- flashinfer's wrapper ---------------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True], ids=["pair", "packed"])
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_wrapper(layout, causal, packed):
    """plan once, run for two layers (different pools, the same table); flashinfer's base-2 LSE
    [total_q, heads] by default, natural log on request; check() finds nothing."""
    dtype, h, h_k, d, page_size = torch.bfloat16, 4, 2, 32, 4
    lengths_q = [5, 1, 0, 8]
    lengths_k = [13, 1, 4, 8]  # ≥ the queries: they are the last tokens (an empty sequence of queries too)
    cu = torch.tensor([0] + torch.tensor(lengths_q).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    total = cu[-1].item()
    layers = []
    for _ in range(2):
        ks = [rand(n, h_k, d, dtype=dtype) for n in lengths_k]
        vs = [rand(n, h_k, d, dtype=dtype) for n in lengths_k]
        layers.append((rand(total, h, d, dtype=dtype), ks, vs))
    # One page layout shared by the layers (each has its own pools).
    caches = [PagedCache(layers[0][1], layers[0][2], page_size, layout=layout)]
    caches.append(PagedCache(layers[1][1], layers[1][2], page_size, layout=layout, like=caches[0]))
    indptr, indices, last = caches[0].csr(lengths_k)
    wrapper = fmha.BatchPrefillWithPagedKVCacheWrapper(kv_layout=layout)
    kvcache_call(
        lambda: wrapper.plan(cu, indptr, indices, last, h, h_k, d, page_size, causal=causal, q_data_type=dtype),
        dtype, d, causal,
    )
    assert wrapper.check() is None
    for layer, ((q, ks, vs), cache) in enumerate(zip(layers, caches)):
        kv = torch.stack([cache.k, cache.v], dim=1) if packed else (cache.k, cache.v)
        out, lse2 = wrapper.run(q, kv, return_lse=True)
        assert out.shape == (total, h, d) and lse2.shape == (total, h)
        qs = [q[cu[b] : cu[b + 1]] for b in range(len(lengths_q))]
        ref = reference(qs, ks, vs, causal, (-1, -1), 1 / math.sqrt(d))
        compare(f"wrapper layer {layer}", out, (lse2 * math.log(2)).t(), ref, group=True)
        out_ln, lse_ln = wrapper.run_return_lse(q, kv, lse_base="ln")
        assert torch.equal(out_ln, out)
        assert max_err(lse_ln, lse2 * math.log(2)) < 1e-5
        assert torch.equal(wrapper.run(q, kv), out)


@pytest.fixture
def many_cus():
    """The host backend plans split-KV chunks for an H100-sized GPU (its default, one CU per thread,
    rarely splits); a GPU plans for its own."""
    if HOST:
        fmha.library().fmha_host_set_cu_count(132)
    yield
    if HOST:
        fmha.library().fmha_host_set_cu_count(os.cpu_count() or 1)


@pytest.mark.parametrize("num_splits", [0, 1, 3, 16])
def test_decode_wrapper_splits(num_splits, many_cus):
    """flashinfer's decode wrapper: one token per sequence against long and short paged caches (one empty),
    split or not; equal to the reference, and the same bits on a rerun (a fixed combine order)."""
    dtype, h, h_k, d, page_size = torch.bfloat16, 8, 2, 128, 16
    lengths_k = [1500, 1, 0, 129, 700]
    ks = [rand(n, h_k, d, dtype=dtype) for n in lengths_k]
    vs = [rand(n, h_k, d, dtype=dtype) for n in lengths_k]
    q = rand(len(lengths_k), h, d, dtype=dtype)
    cache = PagedCache(ks, vs, page_size)
    indptr, indices, last = cache.csr(lengths_k)
    wrapper = fmha.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    kvcache_call(
        lambda: wrapper.plan(indptr, indices, last, h, h_k, d, page_size, q_data_type=dtype, num_splits=num_splits),
        dtype, d, False,
    )
    assert wrapper.check() is None
    out, lse2 = wrapper.run(q, (cache.k, cache.v), return_lse=True)
    ref = reference([q[b : b + 1] for b in range(len(lengths_k))], ks, vs, False, (-1, -1), 1 / math.sqrt(d))
    compare(f"decode num_splits={num_splits}", out, (lse2 * math.log(2)).t(), ref, group=True)
    again, lse_again = wrapper.run(q, (cache.k, cache.v), return_lse=True)
    assert torch.equal(again, out) and torch.equal(lse_again, lse2)


@pytest.mark.parametrize("num_splits", [0, 1, 4])
def test_kvcache_decode_splits(num_splits, many_cus):
    """flash_attn_with_kvcache with few query rows (speculative decoding: 3) and num_splits, block table."""
    dtype, h, h_k, d, page_size, sq = torch.float16, 4, 1, 64, 16, 3
    lengths = [2000, 3, 640]
    ks = [rand(n, h_k, d, dtype=dtype) for n in lengths]
    vs = [rand(n, h_k, d, dtype=dtype) for n in lengths]
    q = rand(len(lengths), sq, h, d, dtype=dtype)
    cache = PagedCache(ks, vs, page_size)
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    out, lse = kvcache_call(
        lambda: fmha.flash_attn_with_kvcache(
            q, cache.k, cache.v, cache_seqlens=lens, page_table=cache.block_table(), causal=True,
            num_splits=num_splits, return_softmax_lse=True,
        ),
        dtype, d, True,
    )
    compare(f"kvcache num_splits={num_splits}", out, lse,
            reference(list(q), ks, vs, True, (-1, -1), 1 / math.sqrt(d)), group=False)


@pytest.mark.skipif(HOST, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_decode_cuda_graph_replays_with_new_lengths(num_splits):
    """flash_attn_with_kvcache captured once in a CUDA graph (prepare, forward and combine), replayed after
    the device-resident cache_seqlens changed: each replay equals an eager call on the new lengths bit for
    bit (the prepare re-plans on the device) and the reference; no host synchronization inside."""
    dtype, h, h_k, d, page_size, capacity = torch.bfloat16, 8, 2, 128, 16, 1500
    batch = 6
    ks = [rand(capacity, h_k, d, dtype=dtype) for _ in range(batch)]
    vs = [rand(capacity, h_k, d, dtype=dtype) for _ in range(batch)]
    cache = PagedCache(ks, vs, page_size)
    table = cache.block_table()
    q = rand(batch, 1, h, d, dtype=dtype)
    lens = torch.full((batch,), capacity, dtype=torch.int32, device=DEVICE)

    def call():
        return fmha.flash_attn_with_kvcache(
            q, cache.k, cache.v, cache_seqlens=lens, page_table=table, causal=True, num_splits=num_splits,
            return_softmax_lse=True,
        )

    kvcache_call(call, dtype, d, False)  # skips when the build has no kernel
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call()
    for trial in range(4):
        new = [0, 1, capacity] + [int(x) for x in torch.randint(1, capacity + 1, (batch - 3,))]
        new = [new[i] for i in torch.randperm(batch).tolist()] if trial else new
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        eager_out, eager_lse = call()
        torch.cuda.synchronize()
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse), f"replay {trial}: lengths {new}"
        ref = reference(list(q), [k[:n] for k, n in zip(ks, new)], [v[:n] for v, n in zip(vs, new)], True,
                        (-1, -1), 1 / math.sqrt(d))
        compare(f"graph replay {trial} num_splits={num_splits}", out, lse, ref, group=False)


@pytest.mark.skipif(HOST, reason="CUDA graphs need a GPU")
def test_decode_wrapper_run_in_a_cuda_graph():
    """The decode wrapper's run captured in a CUDA graph after plan (flashinfer's pattern): replays give
    the eager run's bits, also after the K/V pages changed in place."""
    dtype, h, h_k, d, page_size = torch.bfloat16, 8, 2, 128, 16
    lengths = [900, 17, 0, 2048]
    ks = [rand(n, h_k, d, dtype=dtype) for n in lengths]
    vs = [rand(n, h_k, d, dtype=dtype) for n in lengths]
    cache = PagedCache(ks, vs, page_size)
    indptr, indices, last = cache.csr(lengths)
    q = rand(len(lengths), h, d, dtype=dtype)
    wrapper = fmha.BatchDecodeWithPagedKVCacheWrapper(None, "NHD")
    kvcache_call(lambda: wrapper.plan(indptr, indices, last, h, h_k, d, page_size, q_data_type=dtype), dtype, d,
                 False)
    eager = wrapper.run(q, (cache.k, cache.v))
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wrapper.run(q, (cache.k, cache.v))
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        out = wrapper.run(q, (cache.k, cache.v))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    cache.k.mul_(-1)
    graph.replay()
    assert torch.equal(out, wrapper.run(q, (cache.k, cache.v)))
    assert not torch.equal(out, eager)


def test_wrapper_window_scales_and_preallocated():
    """window_left, sm_scale and flashinfer's float k_scale/v_scale (folded into the softmax scale and
    multiplied into the output for bf16), into preallocated out/lse."""
    dtype, h, h_k, d, page_size = torch.float16, 2, 1, 64, 7
    lengths = [20, 9]
    ks = [rand(n, h_k, d, dtype=dtype) for n in lengths]
    vs = [rand(n, h_k, d, dtype=dtype) for n in lengths]
    cache = PagedCache(ks, vs, page_size)
    indptr, indices, last = cache.csr(lengths)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32, device=DEVICE)
    q = rand(9, h, d, dtype=dtype)
    wrapper = fmha.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1 << 12, dtype=torch.uint8, device=DEVICE))
    kvcache_call(
        lambda: wrapper.plan(cu, indptr, indices, last, h, h_k, d, page_size, causal=True, window_left=5,
                             sm_scale=0.2, q_data_type="float16"),
        dtype, d, True,
    )
    out = torch.full((9, h, d), float("nan"), dtype=dtype, device=DEVICE)
    lse = torch.full((9, h), float("nan"), dtype=torch.float32, device=DEVICE)
    got, got_lse = wrapper.run(q, (cache.k, cache.v), k_scale=0.5, v_scale=2.0, out=out, lse=lse, lse_base="ln")
    assert got is out and got_lse is lse
    qs = [q[:6], q[6:]]
    outs, lses, pts = reference(qs, ks, vs, True, (5, -1), 0.2 * 0.5)
    ref = ([o * 2 for o in outs], lses, [p * 2 for p in pts])
    compare("wrapper window", out, lse.t(), ref, group=True)
    with pytest.raises(ValueError, match="window_left"):
        wrapper.run(q, (cache.k, cache.v), window_left=3)


def test_wrapper_fp8():
    """fp8 pools with flashinfer's scales: a float k_scale, a per-kv-head v_scale tensor; bf16 output."""
    fp8 = FP8[0]
    h, h_k, d, page_size = 4, 2, 32, 5
    lengths = [11, 6]
    ks = [torch.rand(n, h_k, d, device=DEVICE).to(fp8) for n in lengths]
    vs = [torch.rand(n, h_k, d, device=DEVICE).to(fp8) for n in lengths]
    cache = PagedCache(ks, vs, page_size)
    indptr, indices, last = cache.csr(lengths)
    cu = torch.tensor([0, 4, 7], dtype=torch.int32, device=DEVICE)
    q = torch.rand(7, h, d, device=DEVICE).to(fp8)
    wrapper = fmha.BatchPrefillWithPagedKVCacheWrapper(kv_layout="NHD")
    kvcache_call(
        lambda: wrapper.plan(cu, indptr, indices, last, h, h_k, d, page_size, causal=True, q_data_type=fp8,
                             kv_data_type=fp8, o_data_type=torch.bfloat16),
        fp8, d, True,
    )
    v_scale = torch.tensor([0.5, 1.5], device=DEVICE)
    out = wrapper.run(q, (cache.k, cache.v), k_scale=0.8, v_scale=v_scale)
    assert out.dtype == torch.bfloat16
    for b, (lo, hi) in enumerate([(0, 4), (4, 7)]):
        vb = vs[b].double() * v_scale.double()[None, :, None]
        keep = keep_mask(hi - lo, lengths[b], BOTTOM_RIGHT, -1, 0)
        o_ref, _ = attention_ref(q[None, lo:hi].double(), ks[b][None].double() * 0.8, vb[None], keep,
                                 1 / math.sqrt(d))
        assert max_err(out[lo:hi], o_ref[0]) < 0.06 * 1.5  # V in [0, 1.5): the bound of test_fp8_descales, scaled


def test_wrapper_check_reports_bad_tables():
    """The prepare checks the CSR arrays on the stream; check() names the field, sequence and value."""
    h, d, page_size = 2, 32, 4
    cu = torch.tensor([0, 2, 4], dtype=torch.int32, device=DEVICE)
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device=DEVICE)
    wrapper = fmha.BatchPrefillWithPagedKVCacheWrapper()
    bad_page = torch.tensor([0, 9, 1], dtype=torch.int32, device=DEVICE)
    last = torch.tensor([3, 4], dtype=torch.int32, device=DEVICE)
    kvcache_call(
        lambda: wrapper.plan(cu, indptr, bad_page, last, h, h, d, page_size, num_pages=4,
                             q_data_type=torch.bfloat16),
        torch.bfloat16, d, False,
    )
    with pytest.raises(fmha.FmhaError) as info:
        wrapper.check()
    assert info.value.status == fmha.ERR_ASYNC_FAILURE
    assert "page_indices" in info.value.message and "9" in info.value.message
    bad_last = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    wrapper.plan(cu, indptr, torch.tensor([0, 3, 1], dtype=torch.int32, device=DEVICE), bad_last, h, h, d,
                 page_size, q_data_type=torch.bfloat16)
    with pytest.raises(fmha.FmhaError, match="last_page_len"):
        wrapper.check()


def test_wrapper_argument_errors():
    wrapper = fmha.BatchPrefillWithPagedKVCacheWrapper()
    with pytest.raises(ValueError, match="kv_layout"):
        fmha.BatchPrefillWithPagedKVCacheWrapper(kv_layout="NDH")
    with pytest.raises(RuntimeError, match="plan"):
        wrapper.run(torch.zeros(1, 2, 32, dtype=torch.float16, device=DEVICE), (None, None))
    one = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
    with pytest.raises(NotImplementedError, match="pos_encoding_mode"):
        wrapper.plan(one, one, one[:1], one[1:], 2, 2, 32, 4, pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(TypeError, match="kv_data_type"):
        wrapper.plan(one, one, one[:1], one[1:], 2, 2, 32, 4, q_data_type=torch.bfloat16, kv_data_type=FP8[0])
    kvcache_call(lambda: wrapper.plan(one, one, one[:1], one[1:], 2, 2, 32, 4, q_data_type=torch.bfloat16),
                 torch.bfloat16, 32, False)
    pool = torch.zeros(1, 4, 2, 32, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=r"q must be \[qo_indptr\[-1\]"):
        wrapper.run(torch.zeros(3, 2, 32, dtype=torch.bfloat16, device=DEVICE), (pool, pool))
    with pytest.raises(ValueError, match="k_cache must be"):
        wrapper.run(torch.zeros(1, 2, 32, dtype=torch.bfloat16, device=DEVICE), (pool.transpose(1, 2), pool))


# --- the run's scheduler workspace ----------------------------------------------------------------------


def _spy_kvcache_runs(monkeypatch):
    """(function, address, bytes) of the scheduler workspace of every kv-cache run from here on."""
    seen = []
    call = _lib.call

    def spy(name, *args):
        if name in ("fmha_kvcache_fwd", "fmha_kvcache_launcher_run"):
            a = args[1]._obj
            seen.append((name, a.scheduler_workspace, a.scheduler_workspace_size))
        return call(name, *args)

    monkeypatch.setattr(_lib, "call", spy)
    return seen


class _SmallCalls:
    """flash_attn_with_kvcache over a small block table, and a planned flashinfer wrapper's run over the
    same cache (CSR): each returns its output."""

    def __init__(self):
        dtype, h, h_k, self.d, page_size = torch.bfloat16, 4, 2, 32, 4
        self.dtype = dtype
        lengths = [13, 2, 6]
        ks = [rand(n, h_k, self.d, dtype=dtype) for n in lengths]
        vs = [rand(n, h_k, self.d, dtype=dtype) for n in lengths]
        self.cache = PagedCache(ks, vs, page_size)
        self.table = self.cache.block_table()
        self.lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
        self.q = rand(len(lengths), 2, h, self.d, dtype=dtype)
        cu = torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=DEVICE)
        indptr, indices, last = self.cache.csr(lengths)
        self.wrapper = fmha.BatchPrefillWithPagedKVCacheWrapper()
        kvcache_call(
            lambda: self.wrapper.plan(cu, indptr, indices, last, h, h_k, self.d, page_size, causal=True,
                                      q_data_type=dtype),
            dtype, self.d, True,
        )

    def call(self):
        return kvcache_call(
            lambda: fmha.flash_attn_with_kvcache(self.q, self.cache.k, self.cache.v, cache_seqlens=self.lens,
                                                 page_table=self.table, causal=True),
            self.dtype, self.d, True,
        )

    def run(self):
        return self.wrapper.run(self.q.reshape(-1, *self.q.shape[2:]), (self.cache.k, self.cache.v))


def test_scheduler_workspace_struct_and_size():
    """fmha_kvcache_args ends with the scheduler workspace (after the 384 bytes of 0.2), NULL by default;
    fmha_kvcache_launcher_scheduler_workspace_size through ctypes: 16 bytes, a NULL out pointer refused."""
    args = _lib.fmha_kvcache_args()
    assert ctypes.sizeof(_lib.fmha_kvcache_args) == args.struct_size == 400
    assert _lib.fmha_kvcache_args.scheduler_workspace.offset == 384
    assert _lib.fmha_kvcache_args.scheduler_workspace_size.offset == 392
    assert args.scheduler_workspace is None and args.scheduler_workspace_size == 0
    small = _SmallCalls()
    for launcher in small.wrapper._launchers.values():
        assert launcher.scheduler_workspace_size() == 16
        with pytest.raises(fmha.FmhaError) as info:
            _lib.call("fmha_kvcache_launcher_scheduler_workspace_size", launcher.handle, None)
        assert info.value.status == fmha.ERR_NULL_POINTER and "bytes" in info.value.message


def test_scheduler_workspace_passed_on_gpu_only(monkeypatch):
    """flash_attn_with_kvcache and the wrapper's run pass no scheduler workspace on the host backend, and on
    a GPU one of the size function's bytes, 16-byte aligned, the same one for every eager call on a stream;
    the outputs have the bits of runs without one."""
    small = _SmallCalls()
    seen = _spy_kvcache_runs(monkeypatch)
    outs = [small.call(), small.run(), small.call(), small.run()]
    assert [name for name, _, _ in seen] == ["fmha_kvcache_fwd", "fmha_kvcache_launcher_run"] * 2
    if HOST:
        assert all((address, n) == (None, 0) for _, address, n in seen), seen
    else:
        assert all(address and address % 16 == 0 and n == 16 for _, address, n in seen), seen
        assert seen[0][1] == seen[2][1] and seen[1][1] == seen[3][1], seen
    monkeypatch.setattr(kv, "_kvcache_scheduler_workspace", lambda *_: (None, 0, None))
    assert torch.equal(small.call(), outs[0]) and torch.equal(small.run(), outs[1])
    assert seen[-1][1:] == (None, 0)


def test_scheduler_workspace_is_checked_through_the_c_abi(monkeypatch):
    """A scheduler workspace too small, misaligned or inside an input is refused by fmha_kvcache_fwd and
    fmha_kvcache_launcher_run, naming the field (the host backend checks it too, and does not use it)."""
    small = _SmallCalls()
    buffer = torch.zeros(64, dtype=torch.uint8, device=DEVICE)
    base = buffer.data_ptr()
    assert base % 16 == 0
    cases = [
        ((base, 8), fmha.ERR_WORKSPACE_TOO_SMALL, ["scheduler_workspace_size", "8",
                                                   "fmha_kvcache_launcher_scheduler_workspace_size"]),
        ((base + 4, 32), fmha.ERR_INVALID_ARGUMENT, ["scheduler_workspace", "aligned"]),
        ((small.q.data_ptr(), 16), fmha.ERR_INVALID_ARGUMENT, ["scheduler_workspace", "the input q"]),
    ]
    for (address, size), status, needles in cases:
        monkeypatch.setattr(kv, "_kvcache_scheduler_workspace", lambda *_, w=(address, size, buffer): w)
        for fn, function in ((small.call, "fmha_kvcache_fwd"), (small.run, "fmha_kvcache_launcher_run")):
            with pytest.raises(fmha.FmhaError) as info:
                fn()
            e = info.value
            assert (e.status, e.function) == (status, function), e
            assert all(n in e.message for n in needles), (e.message, needles)
    monkeypatch.setattr(kv, "_kvcache_scheduler_workspace", lambda *_: (base, 64, buffer))
    small.call()
    small.run()


@pytest.mark.skipif(HOST, reason="the scheduler workspace is passed on a GPU only")
def test_scheduler_workspace_per_stream_thread_and_captured_call(monkeypatch):
    """Eager kv-cache runs reuse one cached scheduler workspace per (stream, thread), another on another
    stream or thread; a CUDA graph's captured runs get fresh ones, cached nowhere, and replays give the
    eager runs' bits."""
    small = _SmallCalls()
    seen = _spy_kvcache_runs(monkeypatch)
    eager = (small.call(), small.run())
    main = {name: address for name, address, _ in seen}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        small.call()
        small.run()
    torch.cuda.current_stream().wait_stream(side)
    on_side = [address for _, address, _ in seen[-2:]]
    assert not set(on_side) & set(main.values()), (on_side, main)
    thread = threading.Thread(target=lambda: (small.call(), small.run()))
    thread.start()
    thread.join()
    other = [address for _, address, _ in seen[-2:]]
    assert not set(other) & (set(on_side) | set(main.values())), (other, on_side, main)
    cached = len(fmha.ops._scheduler_workspaces)

    graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
    outs = []
    for graph in graphs:
        with torch.cuda.graph(graph):
            outs.append((small.call(), small.run()))
    captured = [address for _, address, _ in seen[-4:]]
    assert len(set(captured)) == 4 and not set(captured) & (set(main.values()) | set(on_side) | set(other))
    assert len(fmha.ops._scheduler_workspaces) == cached  # nothing cached for the graphs
    for graph in graphs:
        graph.replay()
    torch.cuda.synchronize()
    for out in outs:
        assert torch.equal(out[0], eager[0]) and torch.equal(out[1], eager[1])


# --- errors ---------------------------------------------------------------------------------------------


def test_bad_inputs_name_the_field():
    dtype, h, d = torch.bfloat16, 2, 32
    q = rand(2, 3, h, d, dtype=dtype)
    pool = rand(6, 4, h, d, dtype=dtype)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([5, 6], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="cache_seqlens"):
        fmha.flash_attn_with_kvcache(q, pool, pool, cache_seqlens=lens.long(), page_table=table)
    with pytest.raises(ValueError, match="page_table"):
        fmha.flash_attn_with_kvcache(q, pool, pool, cache_seqlens=lens, page_table=table[:1])
    with pytest.raises(TypeError, match="k_cache"):
        fmha.flash_attn_with_kvcache(q, pool.float(), pool.float(), cache_seqlens=lens, page_table=table)
    with pytest.raises(ValueError, match="heads"):
        fmha.flash_attn_with_kvcache(rand(2, 3, 3, d, dtype=dtype), pool, pool, cache_seqlens=lens,
                                     page_table=table)
    with pytest.raises(ValueError, match="k_cache must have a contiguous last dimension"):
        fmha.flash_attn_with_kvcache(q, pool.transpose(-1, -2), pool, cache_seqlens=lens, page_table=table)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        fmha.flash_attn_with_kvcache(q[0], pool, pool, cache_seqlens=lens, page_table=table,
                                     cu_seqlens_q=torch.tensor([0, 1, 3]), max_seqlen_q=2)
    with pytest.raises(ValueError, match="both k and v"):
        fmha.flash_attn_with_kvcache(q, pool, pool, k=q[:, :, :h], cache_seqlens=lens, page_table=table)
    with pytest.raises(ValueError, match="q_descale"):
        q8 = q.to(FP8[0])
        fmha.flash_attn_with_kvcache(q8, pool.to(FP8[0]), pool.to(FP8[0]), cache_seqlens=lens, page_table=table,
                                     q_descale=torch.ones(3, h, device=DEVICE))


@pytest.mark.skipif(GPU, reason="the host backend checks device values when it runs; a GPU kernel clamps them")
def test_bad_device_values_name_the_field():
    """A page id out of range in a used entry of the table, a cache too small for the new tokens: the error
    names the field (the host backend reads the device arrays; the GPU kernels clamp, see check())."""
    dtype, h, d = torch.bfloat16, 2, 32
    q = rand(2, 3, h, d, dtype=dtype)
    pool = rand(6, 4, h, d, dtype=dtype)
    table = torch.tensor([[0, 1], [2, 7]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([5, 6], dtype=torch.int32, device=DEVICE)
    with pytest.raises(fmha.FmhaError) as info:
        fmha.flash_attn_with_kvcache(q, pool, pool, cache_seqlens=lens, page_table=table)
    assert "block_table" in info.value.message and "7" in info.value.message
    table[1, 1] = 3  # the error was reported once: the next call runs
    fmha.flash_attn_with_kvcache(q, pool, pool, cache_seqlens=lens, page_table=table)
    new = rand(2, 3, h, d, dtype=dtype)
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\]"):
        fmha.flash_attn_with_kvcache(q, pool, pool, new, new, cache_seqlens=lens, page_table=table)
    with pytest.raises(ValueError, match="cache_batch_idx"):
        fmha.flash_attn_with_kvcache(q, pool, pool, cache_seqlens=0,
                                     cache_batch_idx=torch.tensor([0, 6], dtype=torch.int32), k=new, v=new)


def test_unsupported_features():
    dtype, h, d = torch.bfloat16, 2, 32
    q = rand(1, 2, h, d, dtype=dtype)
    cache = rand(1, 8, h, d, dtype=dtype)
    cos = torch.ones(8, d // 2, device=DEVICE)
    with pytest.raises(NotImplementedError, match="rotary"):
        fmha.flash_attn_with_kvcache(q, cache, cache, rotary_cos=cos, rotary_sin=cos, cache_seqlens=4)
    with pytest.raises(NotImplementedError, match="softcap"):
        fmha.flash_attn_with_kvcache(q, cache, cache, softcap=30.0)
    with pytest.raises(NotImplementedError, match="cache_leftpad"):
        fmha.flash_attn_with_kvcache(q, cache, cache, cache_leftpad=torch.zeros(1, dtype=torch.int32))


# flash-attn 2.7's flash_attn_with_kvcache and flashinfer's plan: name and default, in order. fmha takes
# them positionally in that order; FA3's additions (page_table, cu_seqlens_q, the descales...) and fmha's
# own are keyword-only, since FA3 inserted `qv` after `v` and a positional call cannot mean both.
EMPTY = inspect.Parameter.empty
POSITIONAL = {
    fmha.flash_attn_with_kvcache: [
        ("q", EMPTY), ("k_cache", EMPTY), ("v_cache", EMPTY), ("k", None), ("v", None), ("rotary_cos", None),
        ("rotary_sin", None), ("cache_seqlens", None), ("cache_batch_idx", None), ("cache_leftpad", None),
        ("block_table", None), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
        ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
        ("return_softmax_lse", False),
    ],
    fmha.BatchPrefillWithPagedKVCacheWrapper.plan: [
        ("self", EMPTY), ("qo_indptr", EMPTY), ("paged_kv_indptr", EMPTY), ("paged_kv_indices", EMPTY),
        ("paged_kv_last_page_len", EMPTY), ("num_qo_heads", EMPTY), ("num_kv_heads", EMPTY), ("head_dim", EMPTY),
        ("page_size", EMPTY), ("head_dim_vo", None), ("custom_mask", None), ("packed_custom_mask", None),
        ("causal", False), ("pos_encoding_mode", "NONE"), ("use_fp16_qk_reduction", False), ("sm_scale", None),
        ("window_left", -1), ("logits_soft_cap", None), ("rope_scale", None), ("rope_theta", None),
        ("q_data_type", torch.float16), ("kv_data_type", None), ("o_data_type", None), ("non_blocking", True),
    ],
}


@pytest.mark.parametrize("fn", list(POSITIONAL), ids=lambda f: f.__qualname__)
def test_signatures(fn):
    params = list(inspect.signature(fn).parameters.values())
    positional = [(p.name, p.default) for p in params if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == POSITIONAL[fn]
    assert all(p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY) for p in params)
    if fn is fmha.flash_attn_with_kvcache:
        keywords = {p.name for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY}
        assert {"page_table", "cu_seqlens_q", "max_seqlen_q", "q_descale", "k_descale", "v_descale"} <= keywords


def test_exports():
    for name in ("flash_attn_with_kvcache", "BatchPrefillWithPagedKVCacheWrapper", "BatchDecodeWithPagedKVCacheWrapper"):
        assert name in fmha.__all__ and getattr(fmha, name).__doc__
    for method in ("plan", "run", "run_return_lse", "check"):
        assert getattr(fmha.BatchPrefillWithPagedKVCacheWrapper, method).__doc__
    assert HOST or GPU
