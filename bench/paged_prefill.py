"""Paged prefill on a GPU: fmha's kv-cache operation against fmha's own dense forward on the same tokens
and against the rivals that can run in the same process (FA3 from tokenspeed-fa3, flashinfer's fa3 and fa2
backends), every output checked against PyTorch SDPA before it is timed. fp8: the same problem quantised
per tensor to e4m3 (OCP; descale = amax / 448), fmha and FA3 on the same codes, checked against SDPA on the
dequantised inputs. Times are GPU time per call (`timed`: calls queued behind a sleep kernel, so the host's
launch work is hidden); at milliseconds per call the host's share is below 1 % anyway.

The problem is `../shared/spec/inference.md` §4.3's (and `../shared/peers/peer_bench.py`'s): 8 sequences
of 2-4k new tokens appended to 0-8k cached ones, 32 query / 8 kv heads, d 128, bf16, causal aligned to
each sequence's end, pages of 1, 16 and 128 tokens scattered in a shuffled pool (`--dim`, `--pages`: other
head dims and page sizes). FLOPs are counted on the
kept (causal) pairs: 4 * Hq * d * sum(new * cached + new * (new + 1) / 2).

    FMHA_LIBRARY=.../libfmha.so.0 PYTHONPATH=python:/tmp/site python3 bench/paged_prefill.py [--out DIR]
"""

import argparse
import itertools
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

QLENS = [2048, 4096, 3072, 2560, 3584, 2048, 4096, 3000]
CACHED = [0, 8192, 1024, 4096, 6000, 2048, 512, 7777]
HQ, HKV, D = 32, 8, 128
PAGES = (1, 16, 128)
TOL = 0.05  # max |o - sdpa| for bf16 outputs of O(1) (peer_bench's rule)
TOL_FP8 = 0.1  # fp8 inputs and P: within 2x the bf16 bound of the dequantised reference


SLEEP_CYCLES_PER_MS = 2_000_000  # torch.cuda._sleep spins clock cycles (~2 GHz on an H100/H200)


def latency(fn, warmup_ms=100, rep_ms=500):
    """Median milliseconds from a call's start to its GPU work's end, one call at a time (CUDA events
    around each call, synchronized after it): the host's launch work is counted."""
    fn()
    torch.cuda.synchronize()
    start = time.time()
    while time.time() - start < warmup_ms / 1e3:
        fn()
    torch.cuda.synchronize()
    times = []
    start = time.time()
    while time.time() - start < rep_ms / 1e3 or len(times) < 10:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def timed(fn, rep_ms=500):
    """Median GPU milliseconds per call of fn: batches of back-to-back calls queued behind a sleep kernel
    and timed by CUDA events after it, so that the host's launch work is hidden, as in a CUDA graph or a
    deep queue. A batch counts only when the sleep was still running after it was queued; a call that
    waits for the GPU can never satisfy that and raises."""
    once = latency(fn, warmup_ms=20, rep_ms=50)  # host + GPU: bounds the host's share
    calls = max(5, min(100, math.ceil(20 / once)))  # ~20 ms of work; few enough launches for CUDA's queue
    sleep_ms = 1.5 * calls * once + 2
    per_call = []
    start = time.time()
    while len(per_call) < 5 or (time.time() - start < rep_ms / 1e3 and len(per_call) < 50):
        behind, a, b = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda._sleep(int(sleep_ms * SLEEP_CYCLES_PER_MS))
        behind.record()
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        queued_in_time = not behind.query()
        b.synchronize()
        if queued_in_time:
            per_call.append(a.elapsed_time(b) / calls)
        elif sleep_ms > 2000:
            raise RuntimeError("the GPU ran dry while calls were queued: a call waits for the GPU")
        else:
            sleep_ms *= 2
    per_call.sort()
    return per_call[len(per_call) // 2]


def problem(dev):
    torch.manual_seed(1)
    L = [a + b for a, b in zip(QLENS, CACHED)]
    kseq = [torch.randn(x, HKV, D, device=dev, dtype=torch.bfloat16) for x in L]
    vseq = [torch.randn(x, HKV, D, device=dev, dtype=torch.bfloat16) for x in L]
    q = torch.randn(sum(QLENS), HQ, D, device=dev, dtype=torch.bfloat16)
    cu_q = torch.tensor([0] + list(itertools.accumulate(QLENS)), dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0] + list(itertools.accumulate(L)), dtype=torch.int32, device=dev)
    from torch.nn.attention.bias import causal_lower_right

    refs = []
    for i, n in enumerate(QLENS):
        qi = q[cu_q[i]:cu_q[i + 1]].transpose(0, 1)[None]
        ki = kseq[i].repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)[None]
        vi = vseq[i].repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)[None]
        with torch.no_grad():
            refs.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=causal_lower_right(n, L[i]))[0].transpose(0, 1))
    flops = 4 * HQ * D * sum(a * b + a * (a + 1) / 2 for a, b in zip(QLENS, CACHED))
    return dict(q=q, cu_q=cu_q, cu_k=cu_k, L=L, kseq=kseq, vseq=vseq, ref=torch.cat(refs), flops=flops)


def paginate(pr, P, dev, seed=2):
    """The sequences' K/V scattered over a shuffled pool of pages [pages, P, Hkv, D], with a block table
    and the CSR arrays; unused slots hold finite values."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    L = pr["L"]
    pages = [math.ceil(x / P) for x in L]
    n = sum(pages)
    perm = torch.randperm(n + 8, generator=g)[:n].to(torch.int32)
    kc = torch.randn(n + 8, P, HKV, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.zeros(len(L), max(pages), dtype=torch.int32)
    off = 0
    for i, (x, np_) in enumerate(zip(L, pages)):
        ids = perm[off:off + np_]
        table[i, :np_] = ids
        pad = np_ * P - x
        kc[ids.long().to(dev)] = F.pad(pr["kseq"][i], (0, 0, 0, 0, 0, pad)).view(np_, P, HKV, D)
        vc[ids.long().to(dev)] = F.pad(pr["vseq"][i], (0, 0, 0, 0, 0, pad)).view(np_, P, HKV, D)
        off += np_
    indptr = torch.tensor([0] + list(itertools.accumulate(pages)), dtype=torch.int32, device=dev)
    last = torch.tensor([x - (p - 1) * P for x, p in zip(L, pages)], dtype=torch.int32, device=dev)
    return dict(kc=kc, vc=vc, table=table.to(dev), indptr=indptr, indices=perm.to(dev), last=last,
                seqlens=torch.tensor(L, dtype=torch.int32, device=dev))


def quantize(x):
    """Per-tensor e4m3 (OCP) codes of x and the descale (a one-element float32 tensor)."""
    d = (x.float().abs().amax() / 448.0).clamp(min=1e-12).reshape(1, 1)
    return (x.float() / d).to(torch.float8_e4m3fn), d


def fp8_reference(pr, q8, qd, kd, vd, pg, P):
    """SDPA (bf16 inputs would round the dequantised values again: float32) on the dequantised codes."""
    from torch.nn.attention.bias import causal_lower_right

    cu_q, L = pr["cu_q"], pr["L"]
    qf = q8.float() * qd
    out = []
    for i, n in enumerate(QLENS):
        pages = pg["table"][i, :math.ceil(L[i] / P)].long()
        kf = (pg["kc"][pages].reshape(-1, HKV, D)[:L[i]].float() / kd).to(torch.float8_e4m3fn).float() * kd
        vf = (pg["vc"][pages].reshape(-1, HKV, D)[:L[i]].float() / vd).to(torch.float8_e4m3fn).float() * vd
        qi = qf[cu_q[i]:cu_q[i + 1]].transpose(0, 1)[None]
        ki = kf.repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)[None]
        vi = vf.repeat_interleave(HQ // HKV, dim=1).transpose(0, 1)[None]
        with torch.no_grad():
            out.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=causal_lower_right(n, L[i]))[0].transpose(0, 1))
    return torch.cat(out)


def main():
    global D
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--no-flashinfer", action="store_true", help="skip flashinfer (its JIT takes minutes)")
    ap.add_argument("--dim", type=int, default=D, help="head dim of Q, K and V (default %(default)s)")
    ap.add_argument("--pages", default=",".join(map(str, PAGES)), help="page sizes (default %(default)s)")
    ap.add_argument("--no-fp8", action="store_true", help="skip the fp8 rows")
    args = ap.parse_args()
    D = args.dim
    pages = [int(x) for x in args.pages.split(",")]
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

    pr = problem(dev)
    q, cu_q, ref = pr["q"], pr["cu_q"], pr["ref"]
    maxq, maxk = max(QLENS), max(pr["L"])
    rows = []

    def cell(name, page, make, want=None, tol=TOL):
        want = ref if want is None else want
        try:
            fn = make()
            out = fn()
            torch.cuda.synchronize()
            err = (out.float() - want.float()).abs().max().item()
            if not err <= tol:
                rows.append(dict(impl=name, page=page, status=f"wrong: max err {err:.3g}"))
                return
            ms = timed(fn)
            rows.append(dict(impl=name, page=page, ms=ms, tflops=pr["flops"] / ms / 1e9, err=err, status="ok"))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(impl=name, page=page, status=f"error: {str(e)[:200]}"))
        print(rows[-1], flush=True)

    k_dense, v_dense = torch.cat(pr["kseq"]), torch.cat(pr["vseq"])
    cell("fmha dense", "-", lambda: (lambda: fmha.flash_attn_varlen_func(
        q, k_dense, v_dense, cu_q, pr["cu_k"], maxq, maxk, causal=True)))
    for P in pages:
        pg = paginate(pr, P, dev)
        cell("fmha paged", P, lambda: (lambda: fmha.flash_attn_with_kvcache(
            q, pg["kc"], pg["vc"], cache_seqlens=pg["seqlens"], page_table=pg["table"], cu_seqlens_q=cu_q,
            max_seqlen_q=maxq, causal=True)))

        def fmha_wrapper():
            w = fmha.BatchPrefillWithPagedKVCacheWrapper(kv_layout="NHD")
            w.plan(cu_q, pg["indptr"], pg["indices"], pg["last"], HQ, HKV, D, P, causal=True,
                   q_data_type=torch.bfloat16)
            return lambda: w.run(q, (pg["kc"], pg["vc"]))

        cell("fmha paged (plan/run)", P, fmha_wrapper)
        if "fa3" in rivals:
            cell("fa3 paged", P, lambda: (lambda: rivals["fa3"].flash_attn_with_kvcache(
                q, pg["kc"], pg["vc"], cache_seqlens=pg["seqlens"], page_table=pg["table"], cu_seqlens_q=cu_q,
                max_seqlen_q=maxq, causal=True)))
        if "flashinfer" in rivals:
            for backend in ("fa3", "fa2"):
                def fi(backend=backend):
                    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
                    w = rivals["flashinfer"].BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
                    w.plan(cu_q, pg["indptr"], pg["indices"], pg["last"], HQ, HKV, D, P, causal=True,
                           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
                    return lambda: w.run(q, (pg["kc"], pg["vc"]))

                cell(f"flashinfer {backend} paged", P, fi)
        if args.no_fp8:
            continue
        # fp8: per-tensor e4m3 codes of the same pages; FA3 takes (batch, Hkv) descales.
        q8, qd = quantize(q)
        k8, kd = quantize(pg["kc"])
        v8, vd = quantize(pg["vc"])
        ref8 = fp8_reference(pr, q8, qd, kd, vd, pg, P)
        ds = {n: x.expand(len(QLENS), HKV) for n, x in (("q", qd), ("k", kd), ("v", vd))}
        cell("fmha paged fp8", P, lambda: (lambda: fmha.flash_attn_with_kvcache(
            q8, k8, v8, cache_seqlens=pg["seqlens"], page_table=pg["table"], cu_seqlens_q=cu_q, max_seqlen_q=maxq,
            causal=True, q_descale=ds["q"], k_descale=ds["k"], v_descale=ds["v"])), ref8, TOL_FP8)
        if "fa3" in rivals:
            cell("fa3 paged fp8", P, lambda: (lambda: rivals["fa3"].flash_attn_with_kvcache(
                q8, k8, v8, cache_seqlens=pg["seqlens"], page_table=pg["table"], cu_seqlens_q=cu_q,
                max_seqlen_q=maxq, causal=True, q_descale=ds["q"], k_descale=ds["k"], v_descale=ds["v"])),
                ref8, TOL_FP8)
        del pg, k8, v8, ref8
        torch.cuda.empty_cache()

    dense = next((r["tflops"] for r in rows if r["impl"] == "fmha dense" and r["status"] == "ok"), None)
    print(f"\n{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{sum(QLENS)} new tokens on {sum(CACHED)} cached, Hq/Hkv {HQ}/{HKV}, d {D}, bf16, causal; "
          f"{pr['flops'] / 1e12:.2f} TFLOP")
    print(f"{'impl':28} {'page':>5} {'ms':>8} {'TFLOPS':>8} {'/ fmha dense':>12}  status")
    for r in rows:
        if r["status"] == "ok":
            rel = f"{r['tflops'] / dense:.2f}" if dense else "-"
            print(f"{r['impl']:28} {r['page']!s:>5} {r['ms']:8.3f} {r['tflops']:8.1f} {rel:>12}  ok (err {r['err']:.3f})")
        else:
            print(f"{r['impl']:28} {r['page']!s:>5} {'':>8} {'':>8} {'':>12}  {r['status']}")
    bf16 = {r["page"]: r["tflops"] for r in rows if r["impl"] == "fmha paged" and r["status"] == "ok"}
    for r in rows:
        if r["impl"] == "fmha paged fp8" and r["status"] == "ok" and r["page"] in bf16:
            print(f"fmha fp8 / fmha bf16 at page {r['page']}: {r['tflops'] / bf16[r['page']]:.2f}")
    if args.out:
        with open(os.path.join(args.out, "paged_prefill.json"), "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows, flops=pr["flops"]), f, indent=1)
    return 0 if all(r["status"] == "ok" or not r["impl"].startswith("fmha") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
