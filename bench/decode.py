"""Split-KV decode on a GPU: fmha's kv-cache operation (one query token per sequence against a paged
cache) against FA3 (tokenspeed-fa3) and flashinfer's decode in the same process, every output checked
against PyTorch SDPA on the first sequences before it is timed. fp8 rows: the same cache quantised per tensor to
e4m3 (OCP; descale = amax / 448); fmha and FA3 take fp8 q too, flashinfer's decode takes bf16 q with the fp8
cache (its scales as floats); each is checked against SDPA on its own dequantised inputs.

The shapes are `../shared/spec/inference.md` §4.3's (and `../shared/peers/peer_bench.py`'s): 32 query /
8 kv heads, d 128 (`--dim`: another), bf16, pages of 16 tokens scattered in a shuffled pool; batch 64 or 128 of 1k-32k
tokens, and 128 sequences of log-uniform lengths in [1k, 32k]. GB/s = bytes of K and V read
(sum L * Hkv * D * bytes * 2) / time, where time is the GPU's per call (`timed`: calls queued behind a sleep
kernel, as a serving engine's CUDA graph runs them); `call us` is one call's latency from its start to
its GPU work's end (`latency`: the host's launch work counted, which decides the small rows when calls are
not captured in a graph).

    FMHA_LIBRARY=.../libfmha.so.0 PYTHONPATH=python:/tmp/site python3 bench/decode.py [--out DIR]
"""

import argparse
import itertools
import json
import math
import os

import torch
import torch.nn.functional as F

from paged_prefill import latency, quantize, timed

SHAPES = [(64, 1024), (64, 8192), (128, 4096), (64, 32768), (128, "mixed")]
HQ, HKV, D, P = 32, 8, 128, 16
NREF = 4
TOL = 0.05
TOL_FP8 = 0.1  # as bench/paged_prefill.py


def shapes(text):
    """`--shapes`: "64x8192,128xmixed" -> [(64, 8192), (128, "mixed")]."""
    out = []
    for entry in text.split(","):
        batch, length = entry.strip().split("x", 1)
        out.append((int(batch), length if length == "mixed" else int(length)))
    return out


def lengths(batch, length):
    if length != "mixed":
        return [length] * batch
    g = torch.Generator().manual_seed(3)
    return [int(round(2 ** (10 + 5 * torch.rand(1, generator=g).item()))) for _ in range(batch)]


def problem(batch, length, dev):
    """K/V scattered over a shuffled pool of pages, the block table and CSR arrays, q, and SDPA's output
    for the first NREF sequences."""
    L = lengths(batch, length)
    torch.manual_seed(4)
    pages = [math.ceil(x / P) for x in L]
    n = sum(pages)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(5)).to(torch.int32)
    kc = torch.randn(n, P, HKV, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.zeros(batch, max(pages), dtype=torch.int32)
    off = 0
    for i, np_ in enumerate(pages):
        table[i, :np_] = perm[off:off + np_]
        off += np_
    q = torch.randn(batch, HQ, D, device=dev, dtype=torch.bfloat16)
    return dict(
        L=L, kc=kc, vc=vc, q=q, table=table.to(dev), ref=reference(q, kc, vc, table, L),
        seqlens=torch.tensor(L, dtype=torch.int32, device=dev),
        indptr=torch.tensor([0] + list(itertools.accumulate(pages)), dtype=torch.int32, device=dev),
        indices=perm.to(dev),
        last=torch.tensor([x - (p - 1) * P for x, p in zip(L, pages)], dtype=torch.int32, device=dev),
        bytes=sum(L) * HKV * D * 2 * 2,
    )


def reference(q, kc, vc, table, L):
    """SDPA for the first NREF sequences (float32 when the inputs are dequantised fp8 codes)."""
    refs = []
    for i in range(min(NREF, len(L))):
        ids = table[i, :math.ceil(L[i] / P)].long().to(kc.device)
        k = kc[ids].reshape(-1, HKV, D)[:L[i]].transpose(0, 1)[None].to(q.dtype)
        v = vc[ids].reshape(-1, HKV, D)[:L[i]].transpose(0, 1)[None].to(q.dtype)
        with torch.no_grad():
            refs.append(F.scaled_dot_product_attention(q[i][None, :, None], k, v, enable_gqa=True)[0, :, 0])
    return torch.stack(refs)


def main():
    global D
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--shapes", type=shapes, default=SHAPES,
                    help="comma-separated BxL (L a length or 'mixed'); default the issue's five rows")
    ap.add_argument("--dim", type=int, default=D, help="head dim of Q, K and V (default %(default)s)")
    ap.add_argument("--no-fp8", action="store_true", help="skip the fp8 rows")
    args = ap.parse_args()
    D = args.dim
    dev = torch.device("cuda")
    import fmha

    rivals = {}
    try:
        import flash_attn_interface as fa3

        rivals["fa3"] = fa3
    except Exception as e:  # noqa: BLE001 - a rival that cannot load is reported, not fatal
        print("fa3 unavailable:", e)
    if not args.no_flashinfer:
        try:
            import flashinfer

            rivals["flashinfer"] = flashinfer
        except Exception as e:  # noqa: BLE001
            print("flashinfer unavailable:", e)

    rows = []
    for batch, length in args.shapes:
        pr = problem(batch, length, dev)
        q4 = pr["q"].view(batch, 1, HQ, D)

        def cell(name, make, ref=pr["ref"], tol=TOL, nbytes=pr["bytes"]):
            try:
                fn = make()
                out = fn().reshape(batch, HQ, D)[:len(ref)]
                torch.cuda.synchronize()
                err = (out.float() - ref.float()).abs().max().item()
                if not err <= tol:
                    rows.append(dict(impl=name, B=batch, L=length, status=f"wrong: max err {err:.3g}"))
                else:
                    ms = timed(fn)
                    rows.append(dict(impl=name, B=batch, L=length, us=ms * 1e3, gbps=nbytes / ms / 1e6,
                                     call_us=latency(fn) * 1e3, err=err, status="ok"))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(impl=name, B=batch, L=length, status=f"error: {str(e)[:200]}"))
            print(rows[-1], flush=True)

        for splits in (0, 1):
            cell(f"fmha num_splits={splits}", lambda: (lambda: fmha.flash_attn_with_kvcache(
                q4, pr["kc"], pr["vc"], cache_seqlens=pr["seqlens"], page_table=pr["table"], causal=True,
                num_splits=splits)))

        def wrapper(module, kv=None, kv_dtype=torch.bfloat16, **scales):
            """flashinfer's decode wrapper API (fmha's or flashinfer's) on bf16 q and the cache `kv` (default
            the bf16 one; `scales`: run's k_scale/v_scale): plan once, time run."""
            kv = (pr["kc"], pr["vc"]) if kv is None else kv
            ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
            w = module.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
            w.plan(pr["indptr"], pr["indices"], pr["last"], HQ, HKV, D, P, q_data_type=torch.bfloat16,
                   kv_data_type=kv_dtype)
            return lambda: w.run(pr["q"], kv, **scales)

        cell("fmha decode wrapper", lambda: wrapper(fmha))
        if "fa3" in rivals:
            cell("fa3", lambda: (lambda: rivals["fa3"].flash_attn_with_kvcache(
                q4, pr["kc"], pr["vc"], cache_seqlens=pr["seqlens"], page_table=pr["table"], causal=True)))
        if "flashinfer" in rivals:
            cell("flashinfer decode", lambda: wrapper(rivals["flashinfer"]))

        # fp8: per-tensor codes of the same cache; fmha and FA3 take (batch, Hkv) descales.
        if args.no_fp8:
            del pr
            torch.cuda.empty_cache()
            continue
        q8, qd = quantize(pr["q"])
        k8, kd = quantize(pr["kc"])
        v8, vd = quantize(pr["vc"])
        deq = [x.float() * d for x, d in ((k8, kd), (v8, vd))]
        ref8 = reference(q8.float() * qd, *deq, pr["table"], pr["L"])
        fp8 = dict(ref=ref8, tol=TOL_FP8, nbytes=pr["bytes"] // 2)
        ds = {n: x.expand(batch, HKV) for n, x in (("q", qd), ("k", kd), ("v", vd))}
        q84 = q8.view(batch, 1, HQ, D)
        for splits in (0, 1):
            cell(f"fmha fp8 num_splits={splits}", lambda: (lambda: fmha.flash_attn_with_kvcache(
                q84, k8, v8, cache_seqlens=pr["seqlens"], page_table=pr["table"], causal=True, num_splits=splits,
                q_descale=ds["q"], k_descale=ds["k"], v_descale=ds["v"])), **fp8)
        if "fa3" in rivals:
            cell("fa3 fp8", lambda: (lambda: rivals["fa3"].flash_attn_with_kvcache(
                q84, k8, v8, cache_seqlens=pr["seqlens"], page_table=pr["table"], causal=True,
                q_descale=ds["q"], k_descale=ds["k"], v_descale=ds["v"])), **fp8)
        if "flashinfer" in rivals:
            cell("flashinfer fp8 kv (bf16 q)", lambda: wrapper(rivals["flashinfer"], (k8, v8), torch.float8_e4m3fn,
                                                               k_scale=kd.item(), v_scale=vd.item()),
                 ref=reference(pr["q"].float(), *deq, pr["table"], pr["L"]), tol=TOL_FP8, nbytes=pr["bytes"] // 2)
        del pr, k8, v8, deq
        torch.cuda.empty_cache()

    print("\nimpl                        B    L      GB/s    us  call us")
    for r in rows:
        if r["status"] == "ok":
            print(f"{r['impl']:<27} {r['B']:<4} {str(r['L']):<6} {r['gbps']:7.0f} {r['us']:8.1f} {r['call_us']:8.1f}")
        else:
            print(f"{r['impl']:<27} {r['B']:<4} {str(r['L']):<6} {r['status']}")
    if args.out:
        with open(os.path.join(args.out, "decode.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
