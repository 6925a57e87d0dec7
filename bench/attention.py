#!/usr/bin/env python3
"""Attention forward (and backward) TFLOPS: fmha vs FlashAttention-3 and PyTorch SDPA's flash (FA2) and cuDNN
backends, same run. FA3's forward is tokenspeed-fa3's, its backward flash-attn3-jax's (bench/fa3_jax_backward.py,
a subprocess; D = 128, GQA and varlen included), each where installed.

The FlashAttention grid: B*S = 16k tokens, H*D = 2048, D in {64, 128}, S in {512, 1k, 2k, 4k, 8k, 16k},
causal and not; plus a GQA 32/8 (D = 128, S = 4k, causal) row and a varlen row (a batch of random lengths
summing to 16k tokens, H = 16, D = 128, causal). FLOPs = 4*B*H*Sq*Sk*D (halved when causal; varlen: the sum
over the sequences); backward FLOPs = 2.5 x forward. Each time is the median of many timed runs after
warm-up (triton.testing.do_bench(..., return_mode="median")).

Notes on the comparison:
* SDPA's is_causal is aligned to the top-left corner, fmha's (flash-attn's) causal to the bottom-right; the
  grid is square (Sq = Sk), where the two are the same mask.
* The varlen row runs SDPA on the zero-padded batch [n_seqs, max_len] with is_causal=True (top-left causal
  keeps every valid query away from the padded keys, so the valid rows are exact); its TFLOPS count only the
  varlen FLOPs, so SDPA's padding waste shows as a lower number.
* Every fmha result is compared with SDPA's (flash, else cuDNN): the max abs difference is printed next to
  cuDNN's own difference from flash (the noise level between two correct kernels), and a result far from
  SDPA's (2% of its max magnitude forward, 5% backward) is flagged "MISMATCH" -- a fast but wrong kernel
  shows, and the run exits non-zero.

Usage (on a GPU machine, from the repo root; FMHA_LIBRARY names the library to test):

    FMHA_LIBRARY=.devbuild/libfmha.so.0 python3 bench/attention.py [--backward] [--out DIR] [--dtype bf16]
    python3 bench/attention.py --quick          # D = 128, S in {2k, 4k} + GQA + varlen: a fast look
    python3 bench/attention.py --smoke          # tiny shapes, any backend (CPU tensors on the host backend)

Writes bench-attention.json and bench-attention.md into --out (default: $OUT when set).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fmha  # noqa: E402

TOKENS = 16 * 1024
HIDDEN = 2048
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
IMPLS_FWD = ["fmha", "fa3", "sdpa_flash", "sdpa_cudnn"]
IMPLS_BWD = ["fmha", "fmha_det", "fa3", "sdpa_flash", "sdpa_cudnn"]
LABELS = {"fmha": "fmha", "fmha_det": "fmha det.", "fa3": "FA3", "sdpa_flash": "SDPA flash",
          "sdpa_cudnn": "SDPA cuDNN"}
# FlashAttention-3's forward (tokenspeed-fa3's `flash_attn_interface`, built without a backward), where
# installed (../shared/peers/README.md: the GPU machine gets it as an uploaded wheel).
try:
    import flash_attn_interface as fa3
except ImportError:
    fa3 = None
# FlashAttention-3's backward comes from flash-attn3-jax, run by bench/fa3_jax_backward.py in a process of
# its own (XLA's stream and memory pool) on the batch-mode D = 128 shapes, checked there against JAX's own
# attention; where JAX or the package is missing, its cells read unsupported.
FA3_JAX = os.path.join(REPO, "bench", "fa3_jax_backward.py")
# max |fmha - SDPA| relative to max |SDPA| above which a result is flagged (bf16/fp16 both sides)
MISMATCH_REL = {"fwd": 2e-2, "bwd": 5e-2}


# --- shapes ---------------------------------------------------------------------------------------------


class Shape:
    def __init__(self, name, b, s, hq, hk, d, causal, lengths=None, dv=None):
        self.name, self.b, self.s, self.hq, self.hk, self.d, self.causal = name, b, s, hq, hk, d, causal
        self.dv = d if dv is None else dv  # V's head dim
        self.lengths = lengths  # varlen: the sequence lengths (b = len(lengths), s = max)

    def flops_fwd(self):
        # 2·Sq·Sk·D for Q·Kᵀ plus 2·Sq·Sk·Dv for P·V, per head
        if self.lengths is not None:
            f = sum(2 * self.hq * n * n * (self.d + self.dv) for n in self.lengths)
        else:
            f = 2 * self.b * self.hq * self.s * self.s * (self.d + self.dv)
        return f / 2 if self.causal else f

    def describe(self):
        if self.lengths is not None:
            return (f"varlen {len(self.lengths)} seqs (max {max(self.lengths)}, {sum(self.lengths)} tok) "
                    f"H={self.hq} D={self.d}")
        heads = f"H={self.hq}" if self.hq == self.hk else f"H={self.hq}/{self.hk}"
        dims = f"D={self.d}" if self.dv == self.d else f"D={self.d}/{self.dv}"
        return f"B={self.b} S={self.s} {heads} {dims}"

    def as_dict(self):
        return {"name": self.name, "batch": self.b, "seqlen": self.s, "nhead_q": self.hq, "nhead_k": self.hk,
                "head_dim": self.d, "head_dim_v": self.dv, "causal": self.causal, "varlen_lengths": self.lengths}


def varlen_lengths(total, lo, hi, seed=0):
    """Random lengths in [lo, hi] summing to `total` (fixed seed: the same batch every run)."""
    rng = random.Random(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(lo, hi), total - sum(lengths)))
    return lengths


def head_dims(spec):
    """(D, Dv) from "D" or "D/Dv" (V's head dim apart)."""
    d, _, dv = spec.partition("/")
    return int(d), int(dv or d)


def grid(args):
    tokens, hidden = TOKENS, HIDDEN
    seqlens = [int(x) for x in args.seqlens.split(",")] if args.seqlens else SEQLENS
    dims = [head_dims(spec) for spec in args.dims.split(",")]
    if args.smoke:
        tokens, hidden, seqlens, dims = 512, 256, [128, 256], [(64, 64)]
    elif args.quick:
        seqlens, dims = [2048, 4096], [(128, 128)]
    shapes = []
    for d, dv in dims:
        for s in seqlens:
            for causal in (False, True):
                h = hidden // d
                name = f"d{d}" if dv == d else f"d{d}x{dv}"
                shapes.append(Shape(f"{name}_s{s}_{'causal' if causal else 'full'}", tokens // s, s, h, h, d, causal,
                                    dv=dv))
    if args.smoke:
        shapes.append(Shape("gqa_4_1_d64_s256_causal", 2, 256, 4, 1, 64, True))
        shapes.append(Shape("varlen_d64_causal", 0, 0, 4, 4, 64, True, varlen_lengths(tokens, 16, 256)))
    else:
        shapes.append(Shape("gqa_32_8_d128_s4096_causal", tokens // 4096, 4096, 32, 8, 128, True))
        shapes.append(Shape("varlen_d128_causal", 0, 0, 16, 16, 128, True, varlen_lengths(tokens, 128, 4096)))
    for sh in shapes:
        if sh.lengths is not None:
            sh.b, sh.s = len(sh.lengths), max(sh.lengths)
    return shapes


# --- timing ---------------------------------------------------------------------------------------------


def bench_ms(fn, device, warmup_ms, rep_ms):
    """Median milliseconds of fn()."""
    if device.type == "cuda":
        try:
            from triton.testing import do_bench
        except ImportError:
            do_bench = None
        if do_bench is not None:
            return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
        # fallback: CUDA events
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        est = max(start.elapsed_time(end), 1e-3)
        for _ in range(max(1, int(warmup_ms / est))):
            fn()
        times = []
        for _ in range(max(5, int(rep_ms / est))):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    fn()
    times = []
    t_end = time.perf_counter() + rep_ms / 1000
    while time.perf_counter() < t_end or len(times) < 3:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


# --- implementations -------------------------------------------------------------------------------------


class Unsupported(Exception):
    pass


def sdpa_call(backend, q, k, v, causal, gqa):
    """SDPA on BSHD tensors (BHSD views), forced to one backend; returns BSHD output."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                "sdpa_math": SDPBackend.MATH}
    kw = {"enable_gqa": True} if gqa else {}
    with sdpa_kernel(backends[backend]):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=causal, **kw)
    return out.transpose(1, 2)


def make_inputs(sh, dtype, device, requires_grad):
    g = torch.Generator(device="cpu").manual_seed(1234)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype) \
            .requires_grad_(requires_grad)

    if sh.lengths is None:
        return rnd(sh.b, sh.s, sh.hq, sh.d), rnd(sh.b, sh.s, sh.hk, sh.d), rnd(sh.b, sh.s, sh.hk, sh.dv)
    total = sum(sh.lengths)
    return rnd(total, sh.hq, sh.d), rnd(total, sh.hk, sh.d), rnd(total, sh.hk, sh.dv)


def pad(x, lengths):
    """[total, h, d] → zero-padded [n, max_len, h, d]."""
    out = x.new_zeros(len(lengths), max(lengths), *x.shape[1:])
    start = 0
    for i, n in enumerate(lengths):
        out[i, :n] = x[start:start + n]
        start += n
    return out


def unpad(x, lengths):
    return torch.cat([x[i, :n] for i, n in enumerate(lengths)], 0)


def runner(impl, sh, q, k, v, cu):
    """A no-argument callable computing the forward output (BSHD or THD like q) with `impl`."""
    gqa = sh.hq != sh.hk
    if impl.startswith("fmha"):
        det = impl == "fmha_det"
        if sh.lengths is not None:
            return lambda: fmha.flash_attn_varlen_func(q, k, v, cu, cu, sh.s, sh.s, causal=sh.causal,
                                                       deterministic=det)
        return lambda: fmha.flash_attn_func(q, k, v, causal=sh.causal, deterministic=det)
    if impl == "fa3":
        if fa3 is None:
            raise Unsupported("FA3 is not installed (tokenspeed-fa3's flash_attn_interface)")
        first = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731 - some builds also return the LSE
        if sh.lengths is not None:
            return lambda: first(fa3.flash_attn_varlen_func(q, k, v, cu, cu, sh.s, sh.s, causal=sh.causal))
        return lambda: first(fa3.flash_attn_func(q, k, v, causal=sh.causal))
    if sh.lengths is not None:
        # SDPA on the padded batch; the padding copies are outside the timed region for the forward
        qp, kp, vp = (pad(t.detach(), sh.lengths).requires_grad_(t.requires_grad) for t in (q, k, v))
        return lambda: sdpa_call(impl, qp, kp, vp, sh.causal, gqa), (qp, kp, vp)
    return lambda: sdpa_call(impl, q, k, v, sh.causal, gqa)


def run_impl(impl, sh, q, k, v, cu, dout, direction, device, args):
    """Times `impl`; returns (ms, outputs for the correctness check). `dout` (backward) is shaped like q's
    output (THD for varlen; padded here for SDPA)."""
    made = runner(impl, sh, q, k, v, cu)
    inputs = (q, k, v)
    if isinstance(made, tuple):
        fn, inputs = made
    else:
        fn = made
    try:
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    except fmha.FmhaError as e:
        if e.status == fmha.ERR_UNSUPPORTED:
            raise Unsupported(e.message) from None
        raise
    except RuntimeError as e:  # SDPA: "No available kernel" and friends
        raise Unsupported(str(e).splitlines()[0][:200]) from None
    if direction == "fwd":
        with torch.no_grad():
            ms = bench_ms(fn, device, args.warmup_ms, args.rep_ms)
            out = fn().detach()
        if sh.lengths is not None and impl.startswith("sdpa"):
            out = unpad(out, sh.lengths)
        return ms, [out]
    if sh.lengths is not None and impl.startswith("sdpa"):
        dout = pad(dout, sh.lengths)
    try:
        grads = torch.autograd.grad(out, inputs, dout, retain_graph=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
    except fmha.FmhaError as e:
        if e.status == fmha.ERR_UNSUPPORTED:
            raise Unsupported(e.message) from None
        raise
    except RuntimeError as e:
        raise Unsupported(str(e).splitlines()[0][:200]) from None
    ms = bench_ms(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True), device, args.warmup_ms,
                  args.rep_ms)
    if sh.lengths is not None and impl.startswith("sdpa"):
        grads = [unpad(g, sh.lengths) for g in grads]
    return ms, [g.detach() for g in grads]


def max_diff(a_list, b_list):
    """(max abs diff, max abs diff / max abs reference) over paired tensors; inf where a difference is not
    finite (a NaN would compare as no difference)."""
    diff, scale = 0.0, 0.0
    for a, b in zip(a_list, b_list):
        d = (a.float() - b.float()).abs()
        diff = max(diff, d.max().item() if bool(torch.isfinite(d).all()) else math.inf)
        scale = max(scale, b.float().abs().max().item())
    return diff, diff / max(scale, 1e-30)


# --- the run ----------------------------------------------------------------------------------------------


def fa3_backward(shapes, args):
    """FA3's backward (flash-attn3-jax) on `shapes`: {shape name: result cell}, from the JAX subprocess."""
    todo = [{"name": sh.name, "b": sh.b, "s": sh.s, "h": sh.hq, "hk": sh.hk, "d": sh.d, "causal": sh.causal,
             "lengths": sh.lengths} for sh in shapes if sh.dv == sh.d]
    cells = {}
    if todo:
        try:
            done = subprocess.run([sys.executable, FA3_JAX, "--dtype", args.dtype], input=json.dumps(todo),
                                  capture_output=True, text=True, timeout=args.fa3_jax_timeout)
            if done.returncode != 0:
                raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:] or ''}")
            cells = json.loads(done.stdout)
        except Exception as e:  # noqa: BLE001 - the rival's failure is a cell, not the end of the run
            cells = {t["name"]: {"error": f"fa3_jax_backward.py: {str(e)[:200]}"} for t in todo}
    for sh in shapes:
        cells.setdefault(sh.name, {"unsupported": "FA3's backward (flash-attn3-jax) is run where D = Dv"})
    return cells


def run(args):
    host = fmha.backend() == fmha.BACKEND_HOST
    if host and not args.smoke:
        sys.exit("bench/attention.py: this libfmha is the host backend; load a GPU build with FMHA_LIBRARY "
                 "(or pass --smoke for a tiny CPU run of the script itself)")
    device = torch.device("cpu") if host else torch.device("cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    directions = ["fwd", "bwd"] if args.backward else ["fwd"]
    rows = []
    shapes = grid(args)
    # first, while this process holds little device memory
    fa3_bwd = fa3_backward(shapes, args) if args.backward and device.type == "cuda" else {}
    for sh in shapes:
        for direction in directions:
            impls = IMPLS_BWD if direction == "bwd" else IMPLS_FWD
            flops = sh.flops_fwd() * (2.5 if direction == "bwd" else 1.0)
            row = {"shape": sh.as_dict(), "describe": sh.describe(), "pass": direction, "flops": flops,
                   "results": {}}
            q, k, v = make_inputs(sh, dtype, device, requires_grad=direction == "bwd")
            cu = None
            if sh.lengths is not None:
                offsets = [0]
                for n in sh.lengths:
                    offsets.append(offsets[-1] + n)
                cu = torch.tensor(offsets, dtype=torch.int32, device=device)
            dout = None
            if direction == "bwd":
                dout = torch.randn(*q.shape[:-1], sh.dv, generator=torch.Generator().manual_seed(4321)).to(device,
                                                                                                          dtype)
            outputs = {}
            for impl in impls:
                res = {}
                if direction == "bwd" and impl == "fa3":
                    res = dict(fa3_bwd.get(sh.name, {"unsupported": "FA3's backward runs on the GPU only"}))
                    if "ms" in res:
                        res["tflops"] = flops / (res["ms"] * 1e-3) / 1e12
                        res["mismatch"] = res["rel_diff"] > MISMATCH_REL[direction]
                    row["results"][impl] = res
                    continue
                try:
                    ms, outs = run_impl(impl, sh, q, k, v, cu, dout, direction, device, args)
                    res = {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12}
                    outputs[impl] = outs
                except Unsupported as e:
                    res = {"unsupported": str(e)}
                except torch.cuda.OutOfMemoryError as e:  # noqa: F841 - reported as a cell
                    res = {"error": "out of memory"}
                except Exception as e:  # noqa: BLE001 - one failing cell must not end the run
                    res = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
                row["results"][impl] = res
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            ref_impl = next((i for i in ("sdpa_flash", "sdpa_cudnn") if i in outputs), None)
            if ref_impl is None and device.type == "cpu" and any(i.startswith("fmha") for i in outputs):
                try:  # smoke runs on CPU: SDPA's math backend is the reference
                    outputs["sdpa_math"] = run_impl("sdpa_math", sh, q, k, v, cu, dout, direction, device, args)[1]
                    ref_impl = "sdpa_math"
                except Exception:  # noqa: BLE001
                    ref_impl = None
            row["reference"] = ref_impl
            for impl in ("fmha", "fmha_det", "fa3"):  # every result checked, the rival's too
                if impl in outputs and ref_impl is not None:
                    diff, rel = max_diff(outputs[impl], outputs[ref_impl])
                    row["results"][impl].update(max_abs_diff=diff, rel_diff=rel,
                                                mismatch=rel > MISMATCH_REL[direction])
            if "sdpa_flash" in outputs and "sdpa_cudnn" in outputs:  # the noise level between two good kernels
                row["sdpa_cudnn_vs_flash_max_abs_diff"] = max_diff(outputs["sdpa_cudnn"], outputs["sdpa_flash"])[0]
            rows.append(row)
            print(format_row(row), flush=True)
            del q, k, v, dout, outputs
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


# --- output ----------------------------------------------------------------------------------------------


def cell(res):
    if "tflops" in res:
        t = res["tflops"]
        text = f"{t:.1f}" if t >= 10 else f"{t:.3g}"
        if res.get("mismatch"):
            text += " MISMATCH"
        return text
    if "unsupported" in res:
        return "unsupported"
    return "error"


def ratio(row, a, b):
    ra, rb = row["results"].get(a, {}), row["results"].get(b, {})
    if "tflops" in ra and "tflops" in rb and rb["tflops"] > 0:
        return f"{ra['tflops'] / rb['tflops']:.2f}"
    return "–"


HEADER = ("| shape | causal | pass | fmha | fmha det. | FA3 | SDPA flash | SDPA cuDNN | fmha / FA3 | fmha / flash | "
          "fmha / cuDNN | fmha max abs diff |")
RULE = "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"


def format_row(row):
    r = row["results"]
    det = cell(r["fmha_det"]) if "fmha_det" in r else "–"
    diffs = " / ".join(f"{r[i]['max_abs_diff']:.1e}" for i in ("fmha", "fmha_det") if "max_abs_diff" in r.get(i, {}))
    if "sdpa_cudnn_vs_flash_max_abs_diff" in row:
        diffs += f" (cuDNN vs flash {row['sdpa_cudnn_vs_flash_max_abs_diff']:.1e})"
    fa3_cell = cell(r["fa3"]) if "fa3" in r else "–"
    return (f"| {row['describe']} | {'yes' if row['shape']['causal'] else 'no'} | {row['pass']} | {cell(r['fmha'])} "
            f"| {det} | {fa3_cell} | {cell(r['sdpa_flash'])} | {cell(r['sdpa_cudnn'])} | {ratio(row, 'fmha', 'fa3')} | "
            f"{ratio(row, 'fmha', 'sdpa_flash')} | {ratio(row, 'fmha', 'sdpa_cudnn')} | {diffs.strip() or '–'} |")


def git_commit():
    info = os.path.join(REPO, ".devbuild", "BUILD_INFO")
    if os.path.exists(info):  # written by scripts/gpu-check.sh build (the GPU machine has no .git)
        with open(info) as f:
            for line in f:
                if line.startswith("commit="):
                    return line.split("=", 1)[1].strip()
    try:
        return subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return os.environ.get("FMHA_COMMIT", "unknown")


def metadata(args):
    cuda = torch.cuda.is_available()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "fmha": fmha.version(),
        "fmha_backend": fmha.backend_name(),
        "fmha_library": fmha.library_path(),
        "commit": git_commit(),
        "dtype": args.dtype,
        "timing": f"triton.testing.do_bench median, warmup {args.warmup_ms} ms, rep {args.rep_ms} ms",
        "flops": "fwd 2*B*H*Sq*Sk*(D+Dv) (/2 causal; varlen: sum over sequences); bwd 2.5 x fwd",
    }
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    return meta


def markdown(meta, rows):
    lines = [
        f"## {meta['date']} · {meta['gpu']} · fmha {meta['fmha']} ({meta['fmha_backend']}, commit {meta['commit']})",
        "",
        (
            f"torch {meta['torch']}, CUDA {meta['cuda']}, cuDNN {meta['cudnn']}, triton {meta['triton']}; "
            f"{meta['dtype']}; TFLOPS ({meta['flops']}); {meta['timing']}. Varlen row: SDPA on the zero-padded "
            "batch (varlen FLOPs only). 'fmha max abs diff' is against SDPA flash (else cuDNN), "
            "followed by cuDNN's own difference from flash (the noise level of two correct kernels)."
        ),
        "",
        HEADER,
        RULE,
    ]
    lines += [format_row(r) for r in rows]
    notes = sorted({f"{LABELS[i]}: {res['unsupported']}" for r in rows for i, res in r["results"].items()
                    if "unsupported" in res})
    errors = sorted({f"{LABELS[i]} {r['describe']} {r['pass']}: {res['error']}" for r in rows
                     for i, res in r["results"].items() if "error" in res})
    if notes:
        lines += ["", "Unsupported:"] + [f"- {n}" for n in notes[:20]]
    if errors:
        lines += ["", "Errors:"] + [f"- {e}" for e in errors[:20]]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backward", action="store_true", help="add backward rows (fmha, fmha deterministic, SDPA)")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--dims", default="64,128,256,192/128",
                    help="head dims of the dense rows, comma-separated: D, or D/Dv for V's apart")
    ap.add_argument("--seqlens", help="sequence lengths of the dense rows, comma-separated (default: 512 to 16k)")
    ap.add_argument("--quick", action="store_true", help="D = 128, S in {2k, 4k}, plus the GQA and varlen rows")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; runs on the host backend with CPU tensors")
    ap.add_argument("--warmup-ms", type=int, default=100)
    ap.add_argument("--rep-ms", type=int, default=500)
    ap.add_argument("--fa3-jax-timeout", type=int, default=600,
                    help="seconds for FA3's backward through JAX (bench/fa3_jax_backward.py), all shapes")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for bench-attention.{json,md} ($OUT)")
    args = ap.parse_args()
    if args.smoke:
        args.warmup_ms, args.rep_ms = min(args.warmup_ms, 10), min(args.rep_ms, 50)

    meta = metadata(args)
    print(f"# {meta['gpu']} · {meta['date']} · torch {meta['torch']} · CUDA {meta['cuda']} · cuDNN {meta['cudnn']} "
          f"· fmha {meta['fmha']} ({meta['fmha_backend']}, {meta['fmha_library']}) · commit {meta['commit']}",
          flush=True)
    print(HEADER)
    print(RULE, flush=True)
    rows = run(args)
    md = markdown(meta, rows)
    tail = md.split(RULE + "\n", 1)[1].split("\n\n", 1)
    if len(tail) > 1:  # the notes under the table (unsupported cells, errors)
        print("\n" + tail[1].rstrip())
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench-attention.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "bench-attention.md"), "w") as f:
            f.write(md)
        print(f"wrote {args.out}/bench-attention.json and bench-attention.md")
    mismatches = [r for r in rows for res in r["results"].values() if res.get("mismatch")]
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
