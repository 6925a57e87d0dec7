"""Host time per attention call: what a call costs the CPU while the GPU is kept busy, so that only host
work (argument checks, struct building, kernel selection, the launches) is counted, not kernel time.

A long `torch.cuda._sleep` kernel is queued first; every timed call then only enqueues its work behind it,
and the batch of calls ends (host clock) well before the sleep does, which the run checks. Rows:

  * fmha through Python: `flash_attn_func` forward, forward + backward (autograd), and varlen
    forward + backward (`flash_attn_varlen_func`), against PyTorch SDPA flash (forward, forward + backward);
    and fmha's internal `_fwd` / `_bwd` alone (its Python layer without the autograd engine);
  * fmha's C ABI from Python with prebuilt argument structs (ctypes, ~1 µs a call): `fmha_fwd`, and the
    backward's `prepare_workspace_async` + `run` on a launcher and workspace made once: the library's
    own host cost.

The problem is the host-overhead one of the tools issue: batch 4, 256 tokens, 16 heads, d 64, causal,
bf16. `--profile` adds cProfile's top functions of the fmha forward and forward + backward; `--decompose` adds
rows that take the forward + backward apart: the forward alone with inputs that require grad, fmha's autograd
Function without fmha in it (a skeleton), the skeleton with fmha's backward, the real forward with a backward
that only allocates, and the backward handed to a worker thread and back (what autograd does with a CUDA
node's backward). Where the C++ autograd operator is in use (fmha.native_autograd()), the rows above take it
and two more rows take the Python Function (FmhaAttnFunc.apply) for comparison.

    FMHA_LIBRARY=.devbuild/libfmha.so.0 PYTHONPATH=python python3 bench/host_overhead.py [--out DIR]
"""

import argparse
import cProfile
import ctypes
import io
import json
import os
import pstats
import queue
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha import _lib as L
from fmha import ops

B, S, H, D = 4, 256, 16, 64
CALLS = 50  # per timed batch: the device's launch queue (~1k launches) must not fill behind the sleep
BATCHES = 11  # the median batch is reported
SLEEP_CYCLES = 400_000_000  # ~0.2 s at H200 clocks: longer than any batch (checked), ~7x a batch of 50 fwd + bwd


def timed(fn, calls=CALLS):
    """Median over BATCHES of the host µs per call of `fn`, each batch behind a queued sleep kernel."""
    for _ in range(20):  # warm-up: launcher caches, CUDA lazy loading
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(BATCHES):
        done = torch.cuda.Event()
        torch.cuda._sleep(SLEEP_CYCLES)
        done.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - t0
        if done.query():
            raise RuntimeError("the GPU went idle during a timed batch (a call waited for it?)")
        per_call.append(elapsed / calls * 1e6)
        torch.cuda.synchronize()
    per_call.sort()
    return per_call[len(per_call) // 2]


class _Skeleton(torch.autograd.Function):
    """fmha's autograd Function (FmhaAttnFunc) without fmha: the same 13 inputs, saved tensors and options,
    outputs allocated but never computed; `backward_work`, when set, runs in the backward (on autograd's
    device thread) in place of the gradients' allocation."""

    backward_work = None

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, scale, mask, left, right, deterministic, with_lse):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.params = (max_q, max_k, scale, mask, left, right, deterministic)
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, _, _ = ctx.saved_tensors
        if _Skeleton.backward_work is not None:
            return _Skeleton.backward_work(dout) + (None,) * 10
        return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)) + (None,) * 10


class _Identity(torch.autograd.Function):
    """The smallest custom Function: what torch.autograd adds to any Python-level operation's backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def c_abi_forward(q, k, v, out, lse):
    """A zero-argument function that calls fmha_fwd with structs built once (the C ABI's host cost)."""
    lib = L.library()
    traits = L.fmha_fwd_traits(
        dtype=L.DTYPE_BF16, hdim_q=D, hdim_v=D, is_group_mode=0, mask_type=L.MASK_BOTTOM_RIGHT,
        bias_type=L.BIAS_NONE, has_dropout=0, o_dtype=L.DTYPE_BF16,
    )

    def tensor(t):  # [b, s, h, d] as fmha's [batch][head][row][col]
        return L.fmha_tensor(t.data_ptr(), t.stride(0), t.stride(2), t.stride(1))

    # The scheduler workspace the Python binding passes (fmha_fwd_args.workspace): made once.
    size = ctypes.c_size_t()
    L.call("fmha_fwd_workspace_size", ctypes.byref(traits), ctypes.byref(size))
    workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
    args = L.fmha_fwd_args(
        q=tensor(q), k=tensor(k), v=tensor(v), o=tensor(out),
        lse=L.fmha_tensor(lse.data_ptr(), lse.stride(0), lse.stride(1), lse.stride(2)),
        batch=B, seqlen_q=S, seqlen_k=S, max_seqlen_q=S, max_seqlen_k=S, nhead_q=H, nhead_k=H,
        scale=0.0, window_size_left=-1, window_size_right=0,
        workspace=workspace.data_ptr(), workspace_size=workspace.numel(),
    )
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream or None)
    traits_ref, args_ref, fwd = ctypes.byref(traits), ctypes.byref(args), lib.fmha_fwd

    def call():
        status = fwd(traits_ref, args_ref, stream)
        if status != L.OK:
            raise L.FmhaError(status, L.last_error_message(), "fmha_fwd")

    call.keep = (workspace, traits, args)  # alive as long as the closure
    return call


def c_abi_backward(q, k, v, out, lse, dout):
    """fmha's backward through the C ABI with a launcher, a workspace and structs made once: the
    `prepare_workspace_async` (device method) and `run` of every training step."""
    lib = L.library()
    traits = L.fmha_bwd_traits(
        seqlen_q=S, seqlen_k=S, batch=B, max_seqlen_q=S, max_seqlen_k=S, hdim_q=D, hdim_v=D, nhead_q=H, nhead_k=H,
        dtype=L.DTYPE_BF16, is_group_mode=0, mask_type=L.MASK_BOTTOM_RIGHT,
    )
    launcher = ctypes.c_void_p()
    L.call("fmha_bwd_launcher_create", ctypes.byref(traits), ctypes.byref(launcher))
    size = ctypes.c_size_t()
    L.call("fmha_bwd_launcher_workspace_size", launcher, ctypes.byref(size))
    workspace = torch.empty(max(size.value, 1), dtype=torch.uint8, device=q.device)
    d = torch.empty_like(lse)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))

    def tensor(t):  # [b, s, h, d] as fmha's [batch][head][row][col]
        return L.fmha_tensor(t.data_ptr(), t.stride(0), t.stride(2), t.stride(1))

    def rows(t):  # [b, h, s] fp32
        return L.fmha_tensor(t.data_ptr(), t.stride(0), t.stride(1), t.stride(2))

    args = L.fmha_bwd_args(
        q=tensor(q), k=tensor(k), v=tensor(v), o=tensor(out), lse=rows(lse), d_o=tensor(dout), d=rows(d),
        dq=tensor(dq), dk=tensor(dk), dv=tensor(dv), workspace=workspace.data_ptr(), batch=B, seqlen_q=S,
        seqlen_k=S, max_seqlen_q=S, max_seqlen_k=S, nhead_q=H, nhead_k=H, hdim_q=D, hdim_v=D, scale=0.0,
        window_size_left=-1, window_size_right=0, workspace_size=workspace.numel(),
    )
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream or None)
    prepare, run = lib.fmha_bwd_launcher_prepare_workspace_async, lib.fmha_bwd_launcher_run
    ws, ws_size, args_ref = ctypes.c_void_p(workspace.data_ptr()), ctypes.c_size_t(workspace.numel()), ctypes.byref(args)

    def call():
        for name, status in (
            ("prepare_workspace_async", prepare(launcher, ws, ws_size, None, None, stream, None, L.PREPARE_DEVICE)),
            ("run", run(launcher, args_ref, stream)),
        ):
            if status != L.OK:
                raise L.FmhaError(status, L.last_error_message(), f"fmha_bwd_launcher_{name}")

    call.keep = (workspace, d, dq, dk, dv, traits, args)  # alive as long as the closure
    return call


def profile(fn, calls=CALLS, batches=10):
    pr = cProfile.Profile()
    for _ in range(batches):
        torch.cuda._sleep(SLEEP_CYCLES)
        pr.enable()
        for _ in range(calls):
            fn()
        pr.disable()
        torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(15)
    return text.getvalue()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--decompose", action="store_true",
                    help="add rows that split the forward + backward's host time into its parts")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    # SDPA takes [b, h, s, d]: views of the same memory.
    qt, kt, vt = (t.transpose(1, 2) for t in (qg, kg, vg))
    cu = torch.arange(0, (B + 1) * S, S, device=dev, dtype=torch.int32)
    qv, kv_, vv = (t.detach().reshape(B * S, H, D).clone().requires_grad_() for t in (q, k, v))
    dout_v = dout.reshape(B * S, H, D)
    out, lse, _ = fmha.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)

    def fmha_fwd():
        fmha.flash_attn_func(q, k, v, causal=True)

    def fmha_fwd_bwd():
        o = fmha.flash_attn_func(qg, kg, vg, causal=True)
        torch.autograd.grad(o, (qg, kg, vg), dout)

    def fmha_varlen_fwd_bwd():
        o = fmha.flash_attn_varlen_func(qv, kv_, vv, cu, cu, S, S, causal=True)
        torch.autograd.grad(o, (qv, kv_, vv), dout_v)

    # The same calls through the Python autograd.Function, for a same-run comparison while the C++ operator
    # (fmha.native_autograd()) serves the rows above.
    def python_function(inputs, grad):
        def run():
            o = ops.FmhaAttnFunc.apply(*inputs, None, None, None, None, None, L.MASK_BOTTOM_RIGHT, -1, 0, False, False)
            if grad:
                torch.autograd.grad(o, inputs, dout)
        return run

    # fmha's Python layer without torch.autograd: what the wrappers cost apart from the autograd engine.
    def fmha_fwd_direct():
        ops._fwd(q, k, v, mask_type=L.MASK_BOTTOM_RIGHT, window=(-1, 0))

    def fmha_bwd_direct():
        ops._bwd(dout, q, k, v, out, lse, mask_type=L.MASK_BOTTOM_RIGHT, window=(-1, 0))

    def identity_grad():  # the autograd engine's own cost for one Python Function node
        torch.autograd.grad(_Identity.apply(qg), (qg,), dout)

    def sdpa_fwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(qt.detach(), kt.detach(), vt.detach(), is_causal=True)

    def sdpa_fwd_bwd():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        torch.autograd.grad(o, (qg, kg, vg), dout.transpose(1, 2))

    # --decompose: where a training step's host time goes besides the rows above.
    def fmha_fwd_graph():  # the forward of a training step: inputs that require grad, no backward
        fmha.flash_attn_func(qg, kg, vg, causal=True)

    def skeleton(work):
        def run():
            _Skeleton.backward_work = work
            o = _Skeleton.apply(qg, kg, vg, None, None, None, None, None, L.MASK_BOTTOM_RIGHT, -1, 0, False, False)
            torch.autograd.grad(o, (qg, kg, vg), dout)
        return run

    def saved_bwd(g):  # what FmhaAttnFunc.backward runs, on the saved tensors of one real forward
        return ops._bwd(g, q, k, v, out, lse, mask_type=L.MASK_BOTTOM_RIGHT, window=(-1, 0))

    def fwd_bwd_allocating_only():  # the real forward and autograd's backward, whose fmha work only allocates
        real = ops._bwd
        ops._bwd = lambda *args, **kwargs: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
        try:
            fmha_fwd_bwd()
        finally:
            ops._bwd = real

    # _bwd handed to a waiting worker thread and back, as autograd hands a CUDA node's backward to its
    # device thread: the cost of the hand-off to a thread on another core.
    handoff, handback = queue.SimpleQueue(), queue.SimpleQueue()

    def worker():
        while (fn := handoff.get()) is not None:
            fn()
            handback.put(None)

    def bwd_on_worker_thread():
        handoff.put(fmha_bwd_direct)
        handback.get()

    decomposition = []
    if args.decompose:
        threading.Thread(target=worker, daemon=True).start()
        decomposition = [
            ("fmha forward, inputs requiring grad", fmha_fwd_graph),
            ("autograd skeleton of fmha's Function", skeleton(None)),
            ("skeleton + fmha _bwd in its backward", skeleton(saved_bwd)),
            ("fmha forward + allocating-only backward", fwd_bwd_allocating_only),
            ("fmha _bwd on a worker thread", bwd_on_worker_thread),
        ]

    rows = [
        ("fmha forward (flash_attn_func)", fmha_fwd),
        ("SDPA flash forward", sdpa_fwd),
        ("fmha fmha_fwd (C ABI, prebuilt structs)", c_abi_forward(q, k, v, out, lse)),
        ("fmha _fwd (Python, no autograd)", fmha_fwd_direct),
        ("fmha _bwd (Python, no autograd)", fmha_bwd_direct),
        ("autograd of an identity Function (reference)", identity_grad),
        ("fmha forward + backward", fmha_fwd_bwd),
        ("fmha backward (C ABI: prepare_async + run)", c_abi_backward(q, k, v, out, lse, dout)),
        ("SDPA flash forward + backward", sdpa_fwd_bwd),
        ("fmha varlen forward + backward", fmha_varlen_fwd_bwd),
    ] + decomposition
    autograd = fmha.native_autograd()
    if autograd.startswith("in use"):
        rows += [
            ("fmha forward, Python Function", python_function((q, k, v), False)),
            ("fmha forward + backward, Python Function", python_function((qg, kg, vg), True)),
        ]
    results = []
    print(f"host µs per call, GPU kept busy; b {B}, s {S}, h {H}, d {D}, causal, bf16; "
          f"{torch.cuda.get_device_name()}; C++ autograd operator: {autograd}")
    for name, fn in rows:
        us = timed(fn)
        results.append({"row": name, "host_us": us})
        print(f"{name:<42} {us:8.1f} µs", flush=True)
    profiles = {}
    if args.profile:
        for name, fn in (("fmha forward", fmha_fwd), ("fmha forward + backward", fmha_fwd_bwd)):
            profiles[name] = profile(fn)
            print(f"\n== cProfile: {name}\n{profiles[name]}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "fmha": fmha.version(),
                "library": L.library_path(), "autograd": autograd,
                "shape": {"b": B, "s": S, "h": H, "d": D, "causal": True}}
        with open(os.path.join(args.out, "host_overhead.json"), "w") as f:
            json.dump({"meta": meta, "rows": results, "profiles": profiles}, f, indent=1)


if __name__ == "__main__":
    main()
