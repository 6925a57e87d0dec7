"""Merging attention states: ``fmha.merge_states`` / ``fmha.merge_state`` (flashinfer's shapes) against a
float64 PyTorch merge, with empty (±inf), all-empty and NaN rows, strided inputs, both LSE bases and every
element type; and attention over all keys equal to the merge of attention over two halves of the keys."""

import math

import pytest
import torch

import fmha

from attn_ref import DEVICE, attention_ref, call_or_skip, keep_mask

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
IDS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}


def merge_ref(v, s):
    """float64 merge of v [seq, n, h, d] with natural-log LSEs s [seq, n, h] → ([seq, h, d], [seq, h])."""
    v, s = v.double(), s.double()
    finite = torch.isfinite(s)
    m = torch.where(finite, s, torch.full_like(s, -math.inf)).amax(dim=1, keepdim=True)
    w = torch.where(finite, torch.exp(s - m.clamp(min=-1e300)), torch.zeros_like(s))
    total = w.sum(dim=1)
    v = torch.where(finite[..., None], v, torch.zeros_like(v))  # empty states' v is never read
    out = (w[..., None] * v).sum(dim=1) / total.clamp(min=1e-300)[..., None]
    lse = m[:, 0] + torch.log(total)
    empty = total == 0
    out[empty] = 0.0
    lse[empty] = -math.inf
    nan = torch.isnan(s).any(dim=1)
    out[nan] = math.nan
    lse[nan] = math.nan
    return out, lse


def random_states(seq, n, h, d, dtype):
    v = torch.rand(seq, n, h, d, device=DEVICE, dtype=torch.float64) * 2 - 1
    s = (torch.rand(seq, n, h, device=DEVICE, dtype=torch.float64) * 12 - 6).float()
    pick = torch.rand(seq, n, h, device=DEVICE)
    s[pick < 0.12] = -math.inf
    s[pick > 0.94] = math.inf
    s[0, :, 0] = torch.tensor([-math.inf, math.inf] * n, device=DEVICE)[:n]  # an all-empty row
    if seq > 1:
        s[-1, n // 2, -1] = math.nan
    v = v.to(dtype)
    v[~torch.isfinite(s)] = math.nan  # must not be read
    return v, s


def check(got_v, got_s, v, s, out_dtype, base_scale=1.0):
    want_v, want_s = merge_ref(v, s * base_scale)
    want_s = want_s / base_scale
    n = v.shape[1]
    fp32 = 2.0**-24 * 8 * (n + 2)
    nan = torch.isnan(want_v)
    assert torch.equal(torch.isnan(got_v), nan)
    err = (got_v.double() - want_v).abs()[~nan]
    tol = (EPS[out_dtype] * want_v.abs() + fp32)[~nan]
    assert bool((err <= tol).all()), f"v error {(err - tol).max().item():e} over the bound"
    nan_s = torch.isnan(want_s)
    assert torch.equal(torch.isnan(got_s), nan_s)
    inf = torch.isinf(want_s)
    assert torch.equal(got_s[inf].double(), want_s[inf])
    finite = ~nan_s & ~inf
    err_s = (got_s.double() - want_s).abs()[finite]
    assert bool((err_s <= fp32 * (want_s.abs()[finite] + n + 1)).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS.get)
@pytest.mark.parametrize("out_dtype", DTYPES, ids=IDS.get)
@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("base", ["e", 2])
def test_merge_states(dtype, out_dtype, n, base):
    v, s = random_states(7, n, 3, 72, dtype)
    got_v, got_s = fmha.merge_states(v, s, lse_base=base, out_dtype=out_dtype)
    assert got_v.dtype == out_dtype and got_s.dtype == torch.float32
    assert got_v.shape == (7, 3, 72) and got_s.shape == (7, 3)
    check(got_v, got_s, v, s, out_dtype, math.log(2.0) if base == 2 else 1.0)


def test_merge_states_strided_and_repeatable():
    """Views (states the middle of a larger buffer, tokens and heads strided) are read in place; two runs
    give the same bits."""
    big_v, big_s = random_states(9, 6, 5, 64, torch.bfloat16)
    v, s = big_v[1:8, 1:5, ::2], big_s[1:8, 1:5, ::2]
    got = fmha.merge_states(v, s)
    check(*got, v, s, torch.bfloat16)
    again = fmha.merge_states(v, s)
    assert torch.equal(got[0].view(torch.int16), again[0].view(torch.int16))
    assert torch.equal(got[1].view(torch.int32), again[1].view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=IDS.get)
def test_merge_state_two_halves_is_the_whole(dtype):
    """flashinfer's merge_state on two attention calls over the halves of the keys (base-2 LSEs, as
    flashinfer's are) equals the attention over all keys within 2× the error of the whole in dtype."""
    seq, sk, h, d = 13, 150, 4, 128
    q = torch.randn(1, seq, h, d, device=DEVICE).to(dtype)
    k = torch.randn(1, sk, h, d, device=DEVICE).to(dtype)
    v = torch.randn(1, sk, h, d, device=DEVICE).to(dtype)
    scale = d**-0.5
    cut = 61
    parts = []
    for lo, hi in [(0, cut), (cut, sk)]:
        o, lse = call_or_skip(
            lambda: fmha.flash_attn_func(q, k[:, lo:hi], v[:, lo:hi], softmax_scale=scale, return_attn_probs=True),
            op="fwd",
            dtype=dtype,
            hdim_q=d,
            hdim_v=d,
            masked=False,
        )[:2]
        parts.append((o[0], lse[0].transpose(0, 1).contiguous() / math.log(2.0)))  # lse [b, h, s] → [s, h]
    got_v, got_s = fmha.merge_state(parts[0][0], parts[0][1], parts[1][0], parts[1][1], lse_base=2)
    keep = keep_mask(seq, sk, "none", -1, -1)
    want_v, want_s = attention_ref(q, k, v, keep, scale)
    pt_v, _ = attention_ref(q, k, v, keep, scale, upcast=False, reorder_ops=True)
    err = (got_v.double() - want_v[0]).abs().max().item()
    base = (pt_v[0].double() - want_v[0]).abs().max().item()
    assert err <= 2 * base + EPS[dtype] / 4 * want_v.abs().max().item(), (err, base)
    err_s = (got_s.double() * math.log(2.0) - want_s[0].transpose(0, 1)).abs().max().item()
    assert err_s <= 1e-5 * (1 + want_s.abs().max().item()), err_s


def test_bad_arguments_raise():
    v, s = random_states(3, 2, 2, 16, torch.float16)
    with pytest.raises(TypeError, match="float32"):
        fmha.merge_states(v, s.double())
    with pytest.raises(ValueError, match="num_states"):
        fmha.merge_states(v[:, :, 0], s)
    with pytest.raises(ValueError, match="lse_base"):
        fmha.merge_states(v, s, lse_base=10)
    with pytest.raises(TypeError, match="dtype"):
        fmha.merge_states(v.to(torch.int16), s)
