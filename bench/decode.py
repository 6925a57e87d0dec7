"""Split-KV decode on a GPU: fmha's kv-cache operation (one query token per sequence against a paged
cache) against FA3 (tokenspeed-fa3) and flashinfer's decode in the same process, every output checked
against PyTorch SDPA on the first sequences before it is timed.

The shapes are `../shared/spec/inference.md` §4.3's (and `../shared/peers/peer_bench.py`'s): 32 query /
8 kv heads, d 128, bf16, pages of 16 tokens scattered in a shuffled pool; batch 64 or 128 of 1k-32k
tokens, and 128 sequences of log-uniform lengths in [1k, 32k]. GB/s = bytes of K and V read
(sum L * Hkv * D * 2 * 2) / time.

    FMHA_LIBRARY=.../libfmha.so.0 PYTHONPATH=python:/tmp/site python3 bench/decode.py [--out DIR]
"""

import argparse
import itertools
import json
import math
import os

import torch
import torch.nn.functional as F

from paged_prefill import timed

SHAPES = [(64, 1024), (64, 8192), (128, 4096), (64, 32768), (128, "mixed")]
HQ, HKV, D, P = 32, 8, 128, 16
NREF = 4
TOL = 0.05


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
    refs = []
    for i in range(min(NREF, batch)):
        ids = table[i, :pages[i]].long().to(dev)
        k = kc[ids].reshape(-1, HKV, D)[:L[i]].transpose(0, 1)[None]
        v = vc[ids].reshape(-1, HKV, D)[:L[i]].transpose(0, 1)[None]
        with torch.no_grad():
            refs.append(F.scaled_dot_product_attention(q[i][None, :, None], k, v, enable_gqa=True)[0, :, 0])
    return dict(
        L=L, kc=kc, vc=vc, q=q, table=table.to(dev), ref=torch.stack(refs),
        seqlens=torch.tensor(L, dtype=torch.int32, device=dev),
        indptr=torch.tensor([0] + list(itertools.accumulate(pages)), dtype=torch.int32, device=dev),
        indices=perm.to(dev),
        last=torch.tensor([x - (p - 1) * P for x, p in zip(L, pages)], dtype=torch.int32, device=dev),
        bytes=sum(L) * HKV * D * 2 * 2,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--shapes", type=shapes, default=SHAPES,
                    help="comma-separated BxL (L a length or 'mixed'); default the issue's five rows")
    args = ap.parse_args()
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

        def cell(name, make):
            try:
                fn = make()
                out = fn().reshape(batch, HQ, D)[:len(pr["ref"])]
                torch.cuda.synchronize()
                err = (out.float() - pr["ref"].float()).abs().max().item()
                if not err <= TOL:
                    rows.append(dict(impl=name, B=batch, L=length, status=f"wrong: max err {err:.3g}"))
                else:
                    ms = timed(fn)
                    rows.append(dict(impl=name, B=batch, L=length, us=ms * 1e3, gbps=pr["bytes"] / ms / 1e6,
                                     err=err, status="ok"))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(impl=name, B=batch, L=length, status=f"error: {str(e)[:200]}"))
            print(rows[-1], flush=True)

        for splits in (0, 1):
            cell(f"fmha num_splits={splits}", lambda: (lambda: fmha.flash_attn_with_kvcache(
                q4, pr["kc"], pr["vc"], cache_seqlens=pr["seqlens"], page_table=pr["table"], causal=True,
                num_splits=splits)))

        def wrapper(module):
            """flashinfer's decode wrapper API (fmha's or flashinfer's): plan once, time run."""
            ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
            w = module.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
            w.plan(pr["indptr"], pr["indices"], pr["last"], HQ, HKV, D, P, q_data_type=torch.bfloat16,
                   kv_data_type=torch.bfloat16)
            return lambda: w.run(pr["q"], (pr["kc"], pr["vc"]))

        cell("fmha decode wrapper", lambda: wrapper(fmha))
        if "fa3" in rivals:
            cell("fa3", lambda: (lambda: rivals["fa3"].flash_attn_with_kvcache(
                q4, pr["kc"], pr["vc"], cache_seqlens=pr["seqlens"], page_table=pr["table"], causal=True)))
        if "flashinfer" in rivals:
            cell("flashinfer decode", lambda: wrapper(rivals["flashinfer"]))
        del pr
        torch.cuda.empty_cache()

    print("\nimpl                     B    L      GB/s    us")
    for r in rows:
        if r["status"] == "ok":
            print(f"{r['impl']:<24} {r['B']:<4} {str(r['L']):<6} {r['gbps']:7.0f} {r['us']:8.1f}")
        else:
            print(f"{r['impl']:<24} {r['B']:<4} {str(r['L']):<6} {r['status']}")
    if args.out:
        with open(os.path.join(args.out, "decode.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
