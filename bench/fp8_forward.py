#!/usr/bin/env python3
"""Dense forward TFLOPS of fmha: fp8 e4m3fn (per-(sequence, kv head) descales, bf16 out) vs bf16, and FA3's fp8
forward on the same codes and descales where installed (tokenspeed-fa3), same run.

Shapes: B*S = 16k tokens, H = 16, D = 128, S in {2k, 8k} (--seqlens), causal and not. FLOPs =
4*B*H*S*S*D (halved when causal); times are medians (bench/attention.py's bench_ms). Before its time is
printed, each fp8 result is compared with fmha's bf16 result on the same dequantised values (both against
the float32 attention of a 256-row slice): a missing or misapplied descale is flagged "MISMATCH" and the run
exits non-zero. FA3's result is checked the same way.

    FMHA_LIBRARY=.devbuild/libfmha.so.0 python3 bench/fp8_forward.py [--seqlens 2048 8192]
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention import bench_ms, fa3  # noqa: E402

import fmha  # noqa: E402


def reference_rows(q, k, v, causal, rows=256):
    """float32 attention of the last `rows` queries of batch 0 (bottom-right causal), [rows, h, d]."""
    s = q.shape[1]
    qf, kf, vf = (t[0].float().transpose(0, 1) for t in (q[:, s - rows :], k, v))
    scores = qf @ kf.transpose(1, 2) / math.sqrt(q.shape[-1])
    if causal:
        i = torch.arange(s - rows, s, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(s, device=q.device)[None, :] > i, float("-inf"))
    return (scores.softmax(-1) @ vf).transpose(0, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--warmup-ms", type=int, default=100)
    ap.add_argument("--rep-ms", type=int, default=500)
    args = ap.parse_args()
    device = torch.device("cuda")
    h, d, tokens = 16, 128, 16384
    print(f"{torch.cuda.get_device_name()}  fmha {fmha.version()}  B*S = {tokens}, H = {h}, D = {d}")
    print(
        f"{'S':>6} {'causal':>6} {'bf16 TFLOPS':>12} {'fp8 TFLOPS':>11} {'fp8/bf16':>9} {'fp8 err':>9} {'bf16 err':>9}"
        f" {'FA3 fp8':>8} {'fp8/FA3':>8}"
    )
    failed = False
    for s in args.seqlens:
        b = tokens // s
        gen = torch.Generator(device=device).manual_seed(s)
        descales = [0.5 + torch.rand(b, h, device=device, generator=gen) for _ in range(3)]
        codes, true = [], []
        for desc in descales:
            x = torch.randn(b, s, h, d, device=device, generator=gen)
            x8 = (x / desc[:, None, :, None]).to(torch.float8_e4m3fn)
            codes.append(x8)
            true.append(x8.float() * desc[:, None, :, None])
        q8, k8, v8 = codes
        q, k, v = (t.to(torch.bfloat16) for t in true)
        for causal in (False, True):
            fp8 = lambda: fmha.flash_attn_func(  # noqa: E731
                q8, k8, v8, causal=causal, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2]
            )
            bf16 = lambda: fmha.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
            ref = reference_rows(*true, causal)
            err8 = (fp8()[0, s - 256 :].float() - ref).abs().max().item()
            err16 = (bf16()[0, s - 256 :].float() - ref).abs().max().item()
            bad = not err8 < max(0.06, 8 * err16)
            failed |= bad
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            t8, t16 = (bench_ms(f, device, args.warmup_ms, args.rep_ms) for f in (fp8, bf16))
            tf8, tf16 = flops / t8 / 1e9, flops / t16 / 1e9
            rival = f" {'-':>8} {'-':>8}"
            if fa3 is not None:
                # (some builds also return the LSE)
                fa3_fp8 = lambda: fa3.flash_attn_func(  # noqa: E731
                    q8, k8, v8, causal=causal, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2]
                )
                out = fa3_fp8()
                out = out[0] if isinstance(out, tuple) else out
                err_fa3 = (out[0, s - 256 :].float() - ref).abs().max().item()
                bad_fa3 = not err_fa3 < max(0.06, 8 * err16)
                failed |= bad_fa3
                tfa3 = flops / bench_ms(fa3_fp8, device, args.warmup_ms, args.rep_ms) / 1e9
                rival = f" {tfa3:>8.1f} {tf8 / tfa3:>8.2f}" + ("  FA3 MISMATCH" if bad_fa3 else "")
            print(
                f"{s:>6} {str(causal):>6} {tf16:>12.1f} {tf8:>11.1f} {tf8 / tf16:>9.2f} {err8:>9.4f} {err16:>9.4f}"
                + rival
                + ("  MISMATCH" if bad else "")
            )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
