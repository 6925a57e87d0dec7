"""One cold-start measurement, run in a fresh process by test_cold_start.py (and by hand on a GPU machine):
the GPU is kept busy for `--busy-ms` with torch.cuda._sleep, then the first fmha call of a never-seen shape
is made and the host time it took is printed as JSON, with every C call of it that took over 1 ms.

    python3 tests/python/cold_start_probe.py --mode varlen_det [--busy-ms 1500] [--warm]

--warm: an fmha forward and backward of another shape run first (the library, its kernels and its pools
are initialized); without it the measured call is the first fmha call of the process. --load-kernels:
fmha.load_kernels() at startup instead, while the GPU is idle.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python"))

import torch  # noqa: E402

import fmha  # noqa: E402
from fmha import _lib  # noqa: E402

slow_calls = []
_call = _lib.call


def timed_call(name, *args):
    started = time.perf_counter()
    try:
        return _call(name, *args)
    finally:
        took = (time.perf_counter() - started) * 1e3
        if took > 1.0:
            slow_calls.append((name, round(took, 3)))


_lib.call = timed_call


def tensors(mode, lengths, heads=(16, 4), dim=128):
    dev = torch.device("cuda")
    hq, hk = heads
    if mode == "batch":
        b, s = len(lengths), max(lengths)
        q = torch.randn(b, s, hq, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, s, hk, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, s, hk, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
        return (q, k, v), {}
    total = sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=dev)
    q = torch.randn(total, hq, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(total, hk, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(total, hk, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)
    return (q, k, v), dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths))


def attention(mode, qkv, extra):
    q, k, v = qkv
    det = mode == "varlen_det"
    if mode == "batch":
        return fmha.flash_attn_func(q, k, v, causal=True, deterministic=det)
    return fmha.flash_attn_varlen_func(
        q, k, v, extra["cu_seqlens_q"], extra["cu_seqlens_k"], extra["max_seqlen_q"], extra["max_seqlen_k"],
        causal=True, deterministic=det,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["batch", "varlen", "varlen_det"], required=True)
    parser.add_argument("--busy-ms", type=float, default=1500.0)
    parser.add_argument("--warm", action="store_true")
    parser.add_argument("--phase", choices=["fwd", "bwd", "both"], default="both")
    parser.add_argument("--direct", action="store_true", help="fmha.ops._fwd/_bwd instead of autograd")
    parser.add_argument("--profile", action="store_true", help="cProfile the measured calls (top entries)")
    parser.add_argument("--load-kernels", action="store_true", help="fmha.load_kernels() at startup (GPU idle)")
    parser.add_argument("--single-thread", action="store_true",
                        help="autograd runs the backward on the calling thread (so --profile sees it)")
    a = parser.parse_args()
    if a.single_thread:
        torch.autograd.set_multithreading_enabled(False)
    torch.cuda.init()
    # PyTorch's own first-use costs stay out of the measurement: the CUDA context, cuBLAS, the caching
    # allocator, and the modules autograd imports at the first backward with an explicit gradient (about
    # 2 s of Python imports on the GPU machine, 2026-11-23).
    x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    y = x @ x
    y.backward(torch.ones_like(y))
    torch.cuda.synchronize()
    if a.load_kernels:
        fmha.load_kernels()
    if a.warm:
        qkv, extra = tensors(a.mode, [96, 33, 160])
        out = attention(a.mode, qkv, extra)
        out.backward(torch.ones_like(out))
        torch.cuda.synchronize()
    lengths = [1000, 3000, 17, 0, 2048, 511] if a.mode != "batch" else [1536] * 4
    qkv, extra = tensors(a.mode, lengths)
    grad = None
    torch.cuda.synchronize()
    # Calibrate _sleep's cycles per ms on this GPU, after a spin that brings an idle GPU to its running
    # clock (a rate measured at an idle clock makes the busy period far shorter than asked); the fastest
    # of three rates errs toward a longer busy period.
    torch.cuda._sleep(200_000_000)
    rates = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(20_000_000)
        end.record()
        end.synchronize()
        rates.append(20_000_000 / start.elapsed_time(end))
    cycles_per_ms = max(rates)
    slow_calls.clear()
    result = {"mode": a.mode, "warm": a.warm, "busy_ms": a.busy_ms}
    t0 = time.perf_counter()
    torch.cuda._sleep(int(a.busy_ms * cycles_per_ms))
    profiler = None
    if a.profile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    t1 = time.perf_counter()
    if a.direct:
        q, k, v = qkv
        kw = dict(mask_type=fmha.MASK_BOTTOM_RIGHT, window=(-1, 0))
        if a.mode != "batch":
            kw.update(extra)
        out, lse = fmha.ops._fwd(q.detach(), k.detach(), v.detach(), **kw)
    else:
        out = attention(a.mode, qkv, extra)
    if grad is None:
        grad = torch.ones_like(out)
    t2 = time.perf_counter()
    if a.phase in ("bwd", "both"):
        if a.phase == "bwd":
            torch.cuda.synchronize()
            torch.cuda._sleep(int(a.busy_ms * cycles_per_ms))
            t2 = time.perf_counter()
        if a.direct:
            fmha.ops._bwd(grad, q.detach(), k.detach(), v.detach(), out, lse, deterministic=a.mode == "varlen_det", **kw)
        else:
            out.backward(grad)
    t3 = time.perf_counter()
    if profiler is not None:
        profiler.disable()
        import io
        import pstats
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        print(text.getvalue(), file=sys.stderr)
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    result.update(
        sleep_enqueue_ms=round((t1 - t0) * 1e3, 3),
        fwd_host_ms=round((t2 - t1) * 1e3, 3),
        bwd_host_ms=round((t3 - t2) * 1e3, 3),
        host_ms=round((t3 - t1) * 1e3, 3),
        until_done_ms=round((t4 - t1) * 1e3, 3),
        slow_calls=slow_calls,
        finite=bool(torch.isfinite(out).all().item() and (a.direct or torch.isfinite(qkv[0].grad).all().item())),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
