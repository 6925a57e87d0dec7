"""Forward correctness: O and LSE against float64 (float32) PyTorch math with the field's rule (2x the error of
the same computation in the input precision + a small floor), on poisoned outputs, over masks x GQA x head
dims x dtypes x lengths, batch and varlen (with zero-length sequences).

The host backend runs a small grid on CPU tensors; a GPU build runs the larger one (lengths up to 4096;
FMHA_TEST_QUICK=1 selects the small grid there too).
"""

import math

import pytest
import torch

import fmha
from fmha import ops

from attn_ref import (
    DEVICE,
    DTYPE_IDS,
    DTYPES,
    FLOOR_LSE,
    FLOOR_OUT,
    LARGE,
    NONE,
    TOP_LEFT,
    attention_ref,
    attention_ref_varlen,
    call_or_skip,
    check_rule,
    cu_seqlens,
    default_scale,
    flash_mask,
    keep_mask,
    max_err,
    poisoned,
    randn,
    ref_dtype_for,
)

# Mask cases: ("flash", causal, window) goes through flash-attn's conventions (bottom-right);
# ("fmha", kind, left, right) is fmha's own mask (top-left needs it).
MASKS = {
    "none": ("flash", False, (-1, -1)),
    "causal": ("flash", True, (-1, -1)),
    "causal_top_left": ("fmha", TOP_LEFT, -1, 0),
    "window": ("flash", False, (13, 5)),
    "window_causal": ("flash", True, (24, 7)),
    "window_left_open": ("flash", False, (-1, 9)),
    "window_right_open": ("flash", False, (11, -1)),
    "window_top_left": ("fmha", TOP_LEFT, 6, 20),
}
GQA = {"mha": (2, 2), "gqa4": (4, 1), "gqa8": (8, 1)}  # (nhead_q, nhead_k)
GQA_LARGE = {"mha": (8, 8), "gqa4": (8, 2), "gqa8": (16, 2)}
HEADS = GQA_LARGE if LARGE else GQA

# (seqlen_q, seqlen_k) pairs of the lengths grid: 1, 17, 127, 128, 129, 1000 (+4096 on the large grid),
# unequal both ways; 192, 193 and 385 around the edges of sm_90a's 192-row D = 64 tiles.
LENGTHS = [
    (1, 1), (1, 17), (17, 1), (17, 17), (127, 128), (128, 128), (129, 127), (128, 129), (17, 1000), (1000, 129),
    (1000, 1000), (192, 193), (385, 192),
]
if LARGE:
    LENGTHS += [(1, 4096), (129, 4096), (4096, 1000), (4096, 4096), (1000, 17)]
CORE_LENGTHS = [(97, 129)] if not LARGE else [(128, 128), (129, 1000), (1000, 127)]

HEAD_DIMS = [(32, 32), (64, 64), (96, 96), (128, 128), (256, 256), (128, 64), (64, 128), (192, 128)]

VARLEN = {
    # zero-length q and k sequences, lengths around tile edges
    "zeros": ([0, 17, 1, 128, 0, 129], [5, 0, 129, 127, 0, 200]),
    "decode": ([1, 1, 1, 1], [17, 1, 128, 0]),
    "empty_sides": ([127, 0, 3], [0, 128, 0]),
}
if LARGE:
    VARLEN["long"] = ([4096, 1000, 17, 0], [4096, 1, 1000, 4096])


def resolve(mask, sk_bound):
    """(kind, left, right) with fmha's semantics for a MASKS entry."""
    if mask[0] == "flash":
        return flash_mask(mask[1], mask[2], sk_bound)
    return mask[1:]


def run_forward(q, k, v, mask, *, scale=None, cu_q=None, cu_k=None, max_q=None, max_k=None):
    """fmha forward on poisoned out/lse through the internal call, plus (for flash-attn masks) the public
    flash-attn entry point, which must give the same bits. Returns (out, lse)."""
    varlen = cu_q is not None
    sk_bound = max_k if varlen else k.shape[1]
    kind, left, right = resolve(mask, sk_bound)
    out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    lse_shape = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
    out = poisoned(out_shape, q.dtype)
    lse = poisoned(lse_shape, torch.float32)
    masked = kind != NONE

    def call():
        return ops._fwd(
            q, k, v, softmax_scale=scale, mask_type=kind, window=(left, right), cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k, out=out, lse=lse,
        )

    call_or_skip(call, op="fwd", dtype=q.dtype, hdim_q=q.shape[-1], hdim_v=v.shape[-1], masked=masked)
    assert not torch.isnan(out).any(), "fmha left entries of out unwritten (NaN poison survived)"
    assert not torch.isnan(lse).any(), "fmha left entries of lse unwritten (NaN poison survived)"
    if mask[0] == "flash":
        causal, window = mask[1], mask[2]
        if varlen:
            out2, lse2, probs = fmha.flash_attn_varlen_func(
                q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=causal, window_size=window,
                return_attn_probs=True,
            )
        else:
            out2, lse2, probs = fmha.flash_attn_func(
                q, k, v, softmax_scale=scale, causal=causal, window_size=window, return_attn_probs=True
            )
        assert probs.shape == (0,), "S_dmask without dropout is flash-attn's empty tensor"
        assert torch.equal(out2, out), "flash_attn API and the internal call disagree"
        assert torch.equal(lse2, lse), "flash_attn API and the internal call disagree on lse"
    return out, lse, (kind, left, right)


def check_batch(dtype, b, sq, sk, hq, hk, d, dv, mask, scale=None):
    q = randn(b, sq, hq, d, dtype=dtype)
    k = randn(b, sk, hk, d, dtype=dtype)
    v = randn(b, sk, hk, dv, dtype=dtype)
    check_tensors(q, k, v, mask, scale)


def check_tensors(q, k, v, mask, scale=None):
    """Batch-mode q, k, v ([b, s, h, d], any strides with a contiguous last dim) against the reference."""
    (b, sq, hq, d), sk = q.shape, k.shape[1]
    out, lse, resolved = run_forward(q, k, v, mask, scale=scale)
    keep = keep_mask(sq, sk, *resolved)
    s = default_scale(d) if scale is None else scale
    ref_dtype = ref_dtype_for(b * hq * sq * sk)
    out_ref, lse_ref = attention_ref(q, k, v, keep, s, ref_dtype=ref_dtype)
    out_pt, lse_pt = attention_ref(q, k, v, keep, s, upcast=False, reorder_ops=True)
    check_rule("out", out, out_ref, out_pt, 2, FLOOR_OUT)
    check_rule("lse", lse, lse_ref, lse_pt, 2, FLOOR_LSE)


def check_varlen(dtype, lens_q, lens_k, hq, hk, d, dv, mask):
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    q = randn(sum(lens_q), hq, d, dtype=dtype)
    k = randn(sum(lens_k), hk, d, dtype=dtype)
    v = randn(sum(lens_k), hk, dv, dtype=dtype)
    max_q, max_k = max(lens_q), max(lens_k)
    out, lse, resolved = run_forward(q, k, v, mask, cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k)
    s = default_scale(d)
    ref_dtype = ref_dtype_for(hq * max_q * max_k)
    out_ref, lse_ref = attention_ref_varlen(q, k, v, cu_q, cu_k, resolved, s, ref_dtype=ref_dtype)
    out_pt, lse_pt = attention_ref_varlen(q, k, v, cu_q, cu_k, resolved, s, upcast=False, reorder_ops=True)
    check_rule("out", out, out_ref, out_pt, 2, FLOOR_OUT)
    check_rule("lse", lse, lse_ref, lse_pt, 2, FLOOR_LSE)
    # sequences with no keys: exactly zero output and -inf LSE
    lens_q_t = torch.tensor(lens_q)
    for b, n in enumerate(lens_k):
        if n == 0 and lens_q[b] > 0:
            rows = slice(int(lens_q_t[:b].sum()), int(lens_q_t[: b + 1].sum()))
            assert torch.all(out[rows] == 0), f"sequence {b} has no keys: out must be 0"
            assert torch.all(lse[:, rows] == float("-inf")), f"sequence {b} has no keys: lse must be -inf"


@pytest.mark.parametrize("sq,sk", CORE_LENGTHS, ids=lambda x: str(x))
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("heads", list(HEADS), ids=str)
@pytest.mark.parametrize("mask", list(MASKS), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_masks_gqa(dtype, mask, heads, d, sq, sk):
    hq, hk = HEADS[heads]
    check_batch(dtype, 2, sq, sk, hq, hk, d, d, MASKS[mask])


@pytest.mark.parametrize("mask", ["none", "causal", "window", "causal_top_left"], ids=str)
@pytest.mark.parametrize("sq,sk", LENGTHS, ids=lambda x: str(x))
@pytest.mark.parametrize("d", [64, 128] if LARGE else [64])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_lengths(dtype, d, sq, sk, mask):
    hq, hk = (8, 2) if LARGE else (4, 2)
    b = 2 if max(sq, sk) < 4096 else 1
    check_batch(dtype, b, sq, sk, hq, hk, d, d, MASKS[mask])


@pytest.mark.parametrize("mask", ["none", "causal", "window"], ids=str)
@pytest.mark.parametrize("dims", HEAD_DIMS, ids=lambda x: f"d{x[0]}x{x[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_head_dims(dtype, dims, mask):
    d, dv = dims
    check_batch(dtype, 2, 129, 127, 4, 2, d, dv, MASKS[mask])


@pytest.mark.parametrize("mask", ["none", "causal", "window", "causal_top_left", "window_top_left"], ids=str)
@pytest.mark.parametrize("heads", list(HEADS), ids=str)
@pytest.mark.parametrize("lengths", list(VARLEN), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_varlen(dtype, lengths, heads, mask):
    hq, hk = HEADS[heads]
    lens_q, lens_k = VARLEN[lengths]
    check_varlen(dtype, lens_q, lens_k, hq, hk, 64, 64, MASKS[mask])


@pytest.mark.parametrize("dims", [(128, 128), (96, 64)] if LARGE else [(64, 64)], ids=lambda x: f"d{x[0]}x{x[1]}")
def test_varlen_head_dims(dims):
    check_varlen(torch.bfloat16, [33, 0, 129], [65, 17, 0], 4, 2, dims[0], dims[1], MASKS["causal"])


@pytest.mark.parametrize("scale", [0.05, 0.3, 1.0])
def test_softmax_scale(scale):
    check_batch(torch.bfloat16, 1, 65, 80, 2, 1, 64, 64, MASKS["causal"], scale=scale)


def test_strided_inputs():
    """Views into a packed qkv buffer (non-contiguous batch/row/head strides) and a transposed layout."""
    dtype = torch.bfloat16
    b, s, h, d = 2, 67, 4, 64
    qkv = randn(b, s, 3, h, d, dtype=dtype)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    out = fmha.flash_attn_func(q, k, v, causal=True)
    ref = fmha.flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(out, ref)
    # BHSD memory viewed as BSHD
    qt = randn(b, h, s, d, dtype=dtype).transpose(1, 2)
    kt = randn(b, h, s, d, dtype=dtype).transpose(1, 2)
    vt = randn(b, h, s, d, dtype=dtype).transpose(1, 2)
    assert torch.equal(fmha.flash_attn_func(qt, kt, vt), fmha.flash_attn_func(qt.contiguous(), kt.contiguous(),
                                                                               vt.contiguous()))
    # last dim not contiguous: the binding copies
    qs = randn(b, s, h, 2 * d, dtype=dtype)[..., ::2]
    assert qs.stride(-1) == 2
    assert torch.equal(fmha.flash_attn_func(qs, k, v), fmha.flash_attn_func(qs.contiguous(), k, v))


def test_strides_without_tma():
    """Row strides that are not whole 16-byte multiples, and a base off the 16-byte grid: the GPU kernels'
    16-byte vectors cannot read such tensors, so the Python layer copies them (as flash-attn does); the
    results follow the rule as dense ones do."""
    dtype = torch.bfloat16
    b, s, h, d = 2, 200, 4, 64

    def rows_view(pad, offset):
        rows = randn(b, s, h * d + pad + offset, dtype=dtype)
        return rows[..., offset:offset + h * d].unflatten(-1, (h, d))

    q, k, v = rows_view(4, 0), rows_view(0, 0), rows_view(0, 4)
    assert q.stride(1) * 2 % 16 != 0 and v.data_ptr() % 16 != 0
    check_tensors(q, k, v, MASKS["causal"])
    check_tensors(k, v, q, MASKS["none"])


@pytest.mark.parametrize("d", [64, 128, 256])
def test_broadcast_batch_without_tma(d):
    """K and V shared by every batch entry (an expanded tensor, batch stride 0) are read in place; Hopper's
    TMA cannot describe a zero stride, so there the cp.async forward runs, at every head-dim bucket."""
    dtype = torch.bfloat16
    b, h = 3, 2
    q = randn(b, 200, h, d, dtype=dtype)
    k = randn(1, 150, h, d, dtype=dtype).expand(b, -1, -1, -1)
    v = randn(1, 150, h, d, dtype=dtype).expand(b, -1, -1, -1)
    assert k.stride(0) == 0
    check_tensors(q, k, v, MASKS["causal"])
    check_tensors(q, k, v, MASKS["none"])


def test_window_conventions():
    """flash-attn's window rules: a side < 0 is unbounded, any other side is a window (bottom-right aligned)
    however large, so it equals no mask only when it covers every row; causal overrides the right side."""
    dtype = torch.float16
    q, k, v = randn(1, 40, 2, 64, dtype=dtype), randn(1, 30, 2, 64, dtype=dtype), randn(1, 30, 2, 64, dtype=dtype)
    full = fmha.flash_attn_func(q, k, v)
    # left >= sk - 1 and right >= sq - 1 cover every key of every row.
    assert torch.equal(fmha.flash_attn_func(q, k, v, window_size=(29, 39)), full)
    assert torch.equal(fmha.flash_attn_func(q, k, v, window_size=(-5, 1000)), full)
    # (30, 30) with sq 40 > sk 30: row i sees keys up to i + 20, so the first rows miss some keys.
    windowed = fmha.flash_attn_func(q, k, v, window_size=(30, 30))
    assert not torch.equal(windowed, full)
    assert torch.equal(windowed, fmha.attention(q, k, v, mask="bottom_right", window_size=(30, 30))[0])
    assert torch.equal(
        fmha.flash_attn_func(q, k, v, causal=True, window_size=(-1, 7)), fmha.flash_attn_func(q, k, v, causal=True)
    )
    assert torch.equal(
        fmha.flash_attn_func(q, k, v, causal=True, window_size=(5, 3)),
        fmha.flash_attn_func(q, k, v, window_size=(5, 0)),
    )
    # bottom-right causal with sq > sk: the first sq - sk rows see no key → 0
    out = fmha.flash_attn_func(q, k, v, causal=True)
    assert torch.all(out[:, :10] == 0) and not torch.all(out[:, 10:] == 0)



# --- fp8 (FA3's keywords): forward only, bf16 output ---------------------------------------------------

FP8 = [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e4m3fnuz", None)) if d is not None]


def _fp8_inputs(fp8, shapes, h, h_k, batch):
    """Random true values in [0, 1), their fp8 codes under per-(sequence, kv head) descales for q and k and
    one broadcast (stride 0) descale for v, and the dequantized float64 values the reference takes."""
    gen = lambda *s: torch.rand(*s, device=DEVICE, dtype=torch.float64)  # noqa: E731
    descales = [0.5 + gen(batch, h_k).float(), 0.5 + gen(batch, h_k).float(),
                torch.tensor(0.75, device=DEVICE).expand(batch, h_k)]
    codes, dequantized = [], []
    for (shape, heads, seq_of_row), d in zip(shapes, descales):
        per_row = d.double()[seq_of_row].repeat_interleave(heads // h_k, dim=-1)[..., None]  # [rows.., heads, 1]
        x8 = (gen(*shape) / per_row).to(fp8)
        codes.append(x8)
        dequantized.append(x8.double() * per_row)
    return codes, descales, dequantized


def _fp8_accumulation(q, k, scale):
    """[b, h, sq]: what fp8 tensor cores may add to each row's scores and LSE (tests/common/mod.rs's
    fp8_accumulation): Hopper's e4m3 wgmma keeps about 14 bits of the running sum and rounds it at every
    32-deep k step, so ceil(d / 32) * 2^-12 of the scaled sum of the products' magnitudes, at the row's
    largest. With inputs of one sign the roundings add up (an H200, these inputs: LSEs low by about
    1.4 * 2^-13 per step)."""
    d = q.shape[-1]
    k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    abs_dot = torch.einsum("bqhd,bkhd->bhqk", q.abs(), k.abs()).amax(-1)
    return -(-d // 32) * 2.0**-12 * scale * abs_dot


@pytest.mark.parametrize("fp8", FP8, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
def test_fp8_forward(fp8, causal):
    """flash_attn_func and flash_attn_varlen_func on fp8 q/k/v with FA3's descales: bf16 out against the
    float64 attention of the dequantized inputs (the bound of test_kvcache.test_fp8_descales: P rounded to
    fp8 and O to bf16 stay well under 0.06, a missing or misapplied descale is ~0.5 off); LSE as tight as
    fp16/bf16's plus what fp8 tensor cores' accumulation may add (`_fp8_accumulation`)."""
    h, h_k, d, batch, sq, sk = 4, 2, 128, 2, 70, 131
    rows = torch.arange(batch, device=DEVICE)[:, None].expand(batch, sq)
    keys = torch.arange(batch, device=DEVICE)[:, None].expand(batch, sk)
    (q8, k8, v8), (q_d, k_d, v_d), (q, k, v) = _fp8_inputs(
        fp8, [((batch, sq, h, d), h, rows), ((batch, sk, h_k, d), h_k, keys), ((batch, sk, h_k, d), h_k, keys)],
        h, h_k, batch,
    )
    run = lambda: fmha.flash_attn_func(  # noqa: E731
        q8, k8, v8, causal=causal, return_attn_probs=True, q_descale=q_d, k_descale=k_d, v_descale=v_d
    )
    out, lse, _ = call_or_skip(run, op="fwd", dtype=fp8, hdim_q=d, hdim_v=d, masked=causal)
    assert out.dtype == torch.bfloat16 and out.shape == (batch, sq, h, d)
    keep = keep_mask(sq, sk, *flash_mask(causal, (-1, -1), sk))
    o_ref, lse_ref = attention_ref(q, k, v, keep, 1 / math.sqrt(d))
    assert max_err(out, o_ref) < 0.06, f"fp8 out: max abs error {max_err(out, o_ref):.4f}"
    lse_err = (lse.double() - lse_ref).abs()
    assert (lse_err <= 1e-4 * (1 + lse_ref.abs()) + _fp8_accumulation(q, k, 1 / math.sqrt(d))).all(), (
        f"fp8 lse: max abs error {lse_err.max().item():.2e}"
    )

    # The same tokens in varlen layout give the same result (one tile loop, same descales per sequence).
    cu = cu_seqlens([sq] * batch)
    cu_k = cu_seqlens([sk] * batch)
    out_v, lse_v, _ = fmha.flash_attn_varlen_func(
        q8.flatten(0, 1), k8.flatten(0, 1), v8.flatten(0, 1), cu, cu_k, sq, sk, causal=causal,
        return_attn_probs=True, q_descale=q_d, k_descale=k_d, v_descale=v_d,
    )
    assert torch.equal(out_v, out.flatten(0, 1))
    assert torch.equal(lse_v, lse.permute(1, 0, 2).flatten(1, 2))


def test_fp8_forward_refuses_gradients_and_bad_descales():
    """fp8 is forward only; descales must be float32 (batch, nheads_k) or broadcast to it."""
    if not FP8:
        pytest.skip("this PyTorch has no float8 dtypes")
    fp8 = FP8[0]
    q = torch.rand(1, 8, 2, 64, device=DEVICE).to(fp8)
    with pytest.raises(ValueError, match="q_descale"):
        fmha.flash_attn_func(q, q, q, q_descale=torch.ones(3, 3, device=DEVICE))
    with pytest.raises(TypeError, match="k_descale"):
        fmha.flash_attn_func(q, q, q, k_descale=torch.ones(1, 2, device=DEVICE, dtype=torch.float64))
    leaf = torch.rand(1, 8, 2, 64, device=DEVICE).to(fp8).requires_grad_(True)
    with pytest.raises(NotImplementedError, match="forward only"):
        fmha.flash_attn_func(leaf, q, q)
