"""``python -m fmha.bench``: fmha-bench's shape matrices from Python, fmha beside its PyTorch rivals.

    python -m fmha.bench --matrix smoke                       # fmha, SDPA (and FA3 where installed)
    python -m fmha.bench --matrix full --impl fmha,fa3,sdpa_cudnn --csv full.csv --json full.json
    python -m fmha.bench --matrix my.toml --filter op=fwd --filter hdim_q=128

The matrices are fmha-bench's (``fmha/matrices/*.toml``, or any file in that format: groups whose lists
expand to their product; see ``smoke.toml``); the cases, FLOP and byte counts are the same, so the two
tools' rows line up. fmha-bench times the library through its C ABI; this times what a PyTorch user
calls -- ``fmha.attention`` (forward; backward through ``torch.autograd.grad``),
``fmha.flash_attn_varlen_func`` semantics for varlen, fp8 through ``fmha.flash_attn_func`` and the paged
cases through ``fmha.flash_attn_with_kvcache`` -- and the rivals on the same tensors:

* ``sdpa_flash``, ``sdpa_cudnn``, ``sdpa_math``: ``torch.nn.functional.scaled_dot_product_attention`` with
  that backend, for the dense cases it can express (batch mode, no mask or causal where both corners
  agree; GQA through ``enable_gqa``);
* ``fa3``: FlashAttention-3's forward (``flash_attn_interface``, e.g. tokenspeed-fa3), dense, varlen, fp8
  and paged, when installed.

Every rival's output is compared with fmha's (``max_abs_diff``); a difference above 2 % (forward) or
5 % (backward) of the larger output's magnitude marks the row ``mismatch`` and the run exits non-zero.
Times are the median of ``--repeat`` calls after ``--warmup``, by CUDA events on a GPU and the host
clock on the host backend.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import statistics
import sys
import time

from . import _lib as L

MATRICES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "matrices")
IMPLS = ("fmha", "fa3", "sdpa_flash", "sdpa_cudnn", "sdpa_math")
MISMATCH_REL = {"fwd": 2e-2, "bwd": 5e-2, "kvcache": 2e-2}
# Two fp8 kernels each round P to e4m3 (3 mantissa bits) before P·V, in their own way: their outputs
# differ by several percent of the output's magnitude (spec/inference.md's fp8 rule allows 4x the
# rounding baseline).
MISMATCH_REL_FP8 = 1e-1
FIELDS = ("op", "dtype", "batch", "nhead_q", "nhead_k", "hdim_q", "hdim_v", "seqlen_q", "seqlen_k", "mask",
          "varlen", "deterministic", "page_size", "table", "splits")
COLUMNS = FIELDS + ("impl", "status", "message", "latency_ms", "tflops", "gb_per_s", "flops", "bytes",
                    "max_abs_diff", "mismatch")


class Unsupported(Exception):
    """The implementation cannot run the case (the row says why)."""


# --- matrices ------------------------------------------------------------------------------------------


def _toml(path):
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.9/3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise SystemExit("fmha.bench: reading a matrix on Python < 3.11 needs `pip install tomli`") from None
    with open(path, "rb") as f:
        return tomllib.load(f)


def _pair(field, text):
    """"a" → (a, a), "a/b" → (a, b)."""
    try:
        parts = [int(x) for x in str(text).split("/")]
    except ValueError:
        raise ValueError(f"{field}: {text!r} is not N or N/M") from None
    if len(parts) not in (1, 2):
        raise ValueError(f"{field}: {text!r} is not N or N/M")
    return parts[0], parts[-1]


def parse_mask(text):
    """CK's mask syntax → (kind, left, right): kind "none", "top_left" or "bottom_right"."""
    corners = {"t": "top_left", "b": "bottom_right"}
    if text == "0":
        return "none", -1, -1
    if text in ("1", "t", "2", "b"):
        return corners[{"1": "t", "2": "b"}.get(text, text)], -1, 0
    prefix, _, rest = text.partition(":")
    try:
        if prefix in ("xt", "xb"):
            w = int(rest)
            left, right = (w // 2, w - 1 - w // 2) if w > 0 else (-1, 0)
            return corners[prefix[1]], left, right
        if prefix in corners:
            values = [int(x) for x in rest.split(",")]
            if len(values) == 2 or (len(values) == 3 and values[2] == 0):
                return corners[prefix], values[0], values[1]
    except ValueError:
        pass
    raise ValueError(f"mask: cannot parse {text!r} (expected 0, t, b, t:l,r, b:l,r, xt:w or xb:w)")


def load_matrix(name_or_path):
    """The cases of a built-in matrix (smoke, full, nightly) or a TOML file, as dicts of FIELDS."""
    path = os.path.join(MATRICES, f"{name_or_path}.toml")
    if not os.path.exists(path):
        path = name_or_path
    if not os.path.exists(path):
        raise SystemExit(f"fmha.bench: --matrix {name_or_path!r} is neither a built-in matrix "
                         f"({', '.join(sorted(f[:-5] for f in os.listdir(MATRICES)))}) nor a file")
    cases = []
    for g, group in enumerate(_toml(path).get("group", [])):
        try:
            cases.extend(_expand(group))
        except ValueError as e:
            raise SystemExit(f"fmha.bench: matrix {name_or_path}, group {g + 1}: {e}") from None
    return cases


def _expand(g):
    known = {"op", "dtype", "heads", "hdim", "seqlen", "batch", "tokens", "mask", "varlen", "deterministic",
             "page_size", "table", "splits"}
    unknown = set(g) - known
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))}")
    if bool(g.get("batch")) == bool(g.get("tokens")):
        raise ValueError("give exactly one of batch and tokens")
    out = []
    for op, dtype, heads, hdim, seqlen, mask, varlen, det, page, table, splits in itertools.product(
        g["op"], g["dtype"], g["heads"], g["hdim"], g["seqlen"], g.get("mask", ["0"]), g.get("varlen", [False]),
        g.get("deterministic", [False]), g.get("page_size", [16]), g.get("table", ["block"]), g.get("splits", [0]),
    ):
        if op not in ("fwd", "bwd", "kvcache"):
            raise ValueError(f"op: {op!r} is not fwd, bwd or kvcache")
        if dtype not in ("fp16", "bf16", "fp8", "fp8fnuz"):
            raise ValueError(f"dtype: {dtype!r} is not fp16, bf16, fp8 or fp8fnuz")
        if table not in ("block", "csr"):
            raise ValueError(f"table: {table!r} is not block or csr")
        parse_mask(mask)
        sq, sk = _pair("seqlen", seqlen)
        batches = g["batch"] if g.get("batch") else [max(1, t // max(sq, 1)) for t in g["tokens"]]
        for batch in batches:
            hq, hk = _pair("heads", heads)
            dq, dv = _pair("hdim", hdim)
            case = dict(op=op, dtype=dtype, batch=batch, nhead_q=hq, nhead_k=hk, hdim_q=dq, hdim_v=dv, seqlen_q=sq,
                        seqlen_k=sk, mask=mask, varlen=bool(varlen), deterministic=bool(det) and op == "bwd",
                        page_size=page if op == "kvcache" else 0, table=table if op == "kvcache" else "",
                        splits=splits if op == "kvcache" else 0)
            if case not in out:
                out.append(case)
    return out


def seqlens(case):
    """Each sequence's (seqlen_q, seqlen_k): fmha-bench's spread in varlen mode (sequence i of n has
    ceil(len · (i + 1) / n) of each), the given lengths otherwise."""
    n = case["batch"]
    if not case["varlen"]:
        return [(case["seqlen_q"], case["seqlen_k"])] * n
    return [(-(-case["seqlen_q"] * (i + 1) // n), -(-case["seqlen_k"] * (i + 1) // n)) for i in range(n)]


def kept_pairs(case):
    """(query, key) pairs the mask keeps over the whole problem (fmha-bench's count)."""
    kind, left, right = parse_mask(case["mask"])
    total = 0
    for sq, sk in seqlens(case):
        if kind == "none":
            total += sq * sk
            continue
        off = sk - sq if kind == "bottom_right" else 0
        for i in range(sq):
            lo = 0 if left < 0 else max(0, i + off - left)
            hi = sk if right < 0 else min(sk, i + off + right + 1)
            total += max(0, hi - lo)
    return total


def work(case):
    """(flops, bytes) of one call, as fmha-bench counts them."""
    e = 1 if case["dtype"].startswith("fp8") else 2
    lens = seqlens(case)
    tq, tk = sum(s[0] for s in lens), sum(s[1] for s in lens)
    hq, hk, dq, dv = case["nhead_q"], case["nhead_k"], case["hdim_q"], case["hdim_v"]
    flops = 2.0 * kept_pairs(case) * hq * (dq + dv)
    io = tq * hq * dq * e + tk * hk * (dq + dv) * e + tq * hq * dv * 2
    if case["op"] == "bwd":
        return 2.5 * flops, 2.0 * io
    return flops, float(io)


# --- the calls -----------------------------------------------------------------------------------------


def _torch_dtype(torch, name):
    return {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": getattr(torch, "float8_e4m3fn", None),
            "fp8fnuz": getattr(torch, "float8_e4m3fnuz", None)}[name]


class Problem:
    """The tensors of one case (fresh random inputs; q/k/v `[b, s, h, d]`, `[total, h, d]` in varlen
    mode, paged pools for the kv cache) and a callable per implementation."""

    def __init__(self, case, device, seed):
        import torch

        self.torch, self.case, self.device = torch, case, device
        g = torch.Generator().manual_seed(seed)
        self.dtype = _torch_dtype(torch, case["dtype"])
        if self.dtype is None:
            raise Unsupported(f"this PyTorch has no {case['dtype']} dtype")
        self.lens = seqlens(case)
        hq, hk, dq, dv = case["nhead_q"], case["nhead_k"], case["hdim_q"], case["hdim_v"]

        def rand(*shape):
            x = torch.rand(*shape, generator=g) * 2 - 1
            return x.to(device=device, dtype=self.dtype)

        self.kind, self.left, self.right = parse_mask(case["mask"])
        if case["op"] == "kvcache":
            self._paged(rand, g)
        elif case["varlen"]:
            tq, tk = sum(s[0] for s in self.lens), sum(s[1] for s in self.lens)
            self.q, self.k, self.v = rand(tq, hq, dq), rand(tk, hk, dq), rand(tk, hk, dv)
            self.cu_q = self._cu([s[0] for s in self.lens])
            self.cu_k = self._cu([s[1] for s in self.lens])
        else:
            b, sq, sk = case["batch"], case["seqlen_q"], case["seqlen_k"]
            self.q, self.k, self.v = rand(b, sq, hq, dq), rand(b, sk, hk, dq), rand(b, sk, hk, dv)
        if case["op"] == "bwd":
            for t in (self.q, self.k, self.v):
                t.requires_grad_()
            shape = self.q.shape[:-1] + (dv,)
            self.dout = (torch.rand(*shape, generator=g) * 2 - 1).to(device=device, dtype=self.dtype)

    def _cu(self, lengths):
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        return self.torch.tensor(offsets, dtype=self.torch.int32, device=self.device)

    def _paged(self, rand, g):
        torch, case = self.torch, self.case
        p, hq, hk, dq, dv = case["page_size"], case["nhead_q"], case["nhead_k"], case["hdim_q"], case["hdim_v"]
        pages = [-(-sk // p) for _, sk in self.lens]
        num_pages = max(1, sum(pages))
        order = torch.randperm(num_pages, generator=g).tolist()
        width = max(pages + [1])
        table = torch.zeros(case["batch"], width, dtype=torch.int32)
        at = 0
        for b, n in enumerate(pages):
            table[b, :n] = torch.tensor(order[at:at + n], dtype=torch.int32)
            at += n
        self.page_table = table.to(self.device)
        self.k_cache, self.v_cache = rand(num_pages, p, hk, dq), rand(num_pages, p, hk, dv)
        self.cache_seqlens = torch.tensor([sk for _, sk in self.lens], dtype=torch.int32, device=self.device)
        tq = sum(s[0] for s in self.lens)
        self.q = rand(tq, hq, dq)
        self.cu_q = self._cu([s[0] for s in self.lens])

    def fn(self, impl):
        """A no-argument callable giving the output (the gradients (dq, dk, dv) for a backward case)."""
        op = self.case["op"]
        if op == "kvcache":
            forward = self._kvcache(impl)
        else:
            forward = self._dense(impl)
        if op != "bwd":
            return forward
        torch = self.torch
        out = forward()  # the graph, built once; each timed call is the backward alone
        inputs = (self.q, self.k, self.v)
        return lambda: torch.autograd.grad(out, inputs, self.dout, retain_graph=True)

    def _dense(self, impl):
        import fmha

        torch, c = self.torch, self.case
        fp8 = c["dtype"].startswith("fp8")
        if impl == "fmha":
            if fp8:
                causal = self.kind == "bottom_right" and self.left < 0 and self.right == 0
                if self.kind == "top_left" or (self.kind != "none" and not causal):
                    raise Unsupported("the fp8 case goes through flash_attn_func (bottom-right causal or none)")
                if c["varlen"]:
                    return lambda: fmha.flash_attn_varlen_func(self.q, self.k, self.v, self.cu_q, self.cu_k,
                                                               c["seqlen_q"], c["seqlen_k"], causal=causal)
                return lambda: fmha.flash_attn_func(self.q, self.k, self.v, causal=causal)
            varlen = dict(cu_seqlens_q=self.cu_q, cu_seqlens_k=self.cu_k, max_seqlen_q=c["seqlen_q"],
                          max_seqlen_k=c["seqlen_k"]) if c["varlen"] else {}
            return lambda: fmha.attention(self.q, self.k, self.v, mask=self.kind, window_size=(self.left, self.right),
                                          deterministic=c["deterministic"], **varlen)[0]
        if impl == "fa3":
            fa3 = _fa3()
            if self.kind == "top_left" and c["seqlen_q"] != c["seqlen_k"]:
                raise Unsupported("FA3's causal is bottom-right")
            if c["op"] == "bwd":
                raise Unsupported("this FA3 build has no backward")
            kw = dict(causal=self.kind != "none" and self.left < 0 and self.right == 0,
                      window_size=(self.left, self.right) if self.kind != "none" else (-1, -1))
            first = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731
            if c["varlen"]:
                return lambda: first(fa3.flash_attn_varlen_func(self.q, self.k, self.v, self.cu_q, self.cu_k,
                                                                c["seqlen_q"], c["seqlen_k"], **kw))
            return lambda: first(fa3.flash_attn_func(self.q, self.k, self.v, **kw))
        # SDPA: batch mode; flash and cuDNN take no mask or causal (top-left), the math backend any mask
        # as an explicit boolean one.
        if fp8 or c["varlen"]:
            raise Unsupported("SDPA: no fp8 / varlen")
        square = c["seqlen_q"] == c["seqlen_k"]
        causal = self.kind != "none" and self.left < 0 and self.right == 0 and (self.kind == "top_left" or square)
        mask = None
        if self.kind != "none" and not causal:
            if impl != "sdpa_math":
                raise Unsupported("SDPA flash/cuDNN: only no mask or causal (top-left)")
            mask = self._keep_mask()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                   "sdpa_math": SDPBackend.MATH}[impl]
        q, k, v = (t.transpose(1, 2) for t in (self.q, self.k, self.v))
        gqa = c["nhead_q"] != c["nhead_k"]

        def call():
            with sdpa_kernel(backend):
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                                     enable_gqa=gqa)
            return o.transpose(1, 2)

        return call

    def _keep_mask(self):
        """The case's mask as SDPA's boolean ``[seqlen_q, seqlen_k]`` (True = attend), fmha's semantics."""
        torch, c = self.torch, self.case
        sq, sk = c["seqlen_q"], c["seqlen_k"]
        i = torch.arange(sq, device=self.device)[:, None]
        j = torch.arange(sk, device=self.device)[None, :]
        diagonal = i + (sk - sq if self.kind == "bottom_right" else 0)
        keep = torch.ones(sq, sk, dtype=torch.bool, device=self.device)
        if self.left >= 0:
            keep &= j >= diagonal - self.left
        if self.right >= 0:
            keep &= j <= diagonal + self.right
        return keep

    def _kvcache(self, impl):
        import fmha

        c = self.case
        if self.kind == "top_left" or (self.kind != "none" and self.right != 0):
            raise Unsupported("flash_attn_with_kvcache: causal (bottom-right) with an optional left window")
        if c["table"] == "csr":
            if impl != "fmha":
                raise Unsupported("a CSR page list: flashinfer's interface (fmha's BatchPrefillWithPagedKVCacheWrapper)")
            return self._csr()
        kw = dict(cache_seqlens=self.cache_seqlens, page_table=self.page_table, cu_seqlens_q=self.cu_q,
                  max_seqlen_q=max(s[0] for s in self.lens), causal=self.kind != "none", num_splits=c["splits"],
                  window_size=(self.left, -1) if self.kind != "none" else (-1, -1))
        if impl == "fmha":
            return lambda: fmha.flash_attn_with_kvcache(self.q, self.k_cache, self.v_cache, **kw)
        if impl == "fa3":
            fa3 = _fa3()
            first = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731
            return lambda: first(fa3.flash_attn_with_kvcache(self.q, self.k_cache, self.v_cache, **kw))
        raise Unsupported("SDPA has no paged KV cache")


    def _csr(self):
        """fmha through flashinfer's paged prefill interface (the CSR page list), planned once."""
        import fmha

        torch, c = self.torch, self.case
        p = c["page_size"]
        counts = [-(-sk // p) for _, sk in self.lens]
        indptr = self._cu(counts)
        indices = torch.cat([self.page_table[b, :n] for b, n in enumerate(counts)] + [
            torch.zeros(0, dtype=torch.int32, device=self.device)])
        last = torch.tensor([0 if sk == 0 else (sk - 1) % p + 1 for _, sk in self.lens], dtype=torch.int32,
                            device=self.device)
        wrapper = fmha.BatchPrefillWithPagedKVCacheWrapper(kv_layout="NHD")
        wrapper.plan(self.cu_q, indptr, indices, last, c["nhead_q"], c["nhead_k"], c["hdim_q"], p,
                     causal=self.kind != "none", window_left=self.left if self.kind != "none" else -1,
                     q_data_type=self.dtype, kv_data_type=self.dtype, num_splits=c["splits"])
        return lambda: wrapper.run(self.q, (self.k_cache, self.v_cache))


def _fa3():
    try:
        import flash_attn_interface
    except ImportError:
        raise Unsupported("FA3 is not installed (flash_attn_interface)") from None
    return flash_attn_interface


def _time(fn, device, warmup, repeat):
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _outputs(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _max_diff(a_list, b_list):
    diff = scale = 0.0
    for a, b in zip(a_list, b_list):
        diff = max(diff, (a.float() - b.float()).abs().max().item() if a.numel() else 0.0)
        scale = max(scale, a.float().abs().max().item() if a.numel() else 0.0, b.float().abs().max().item() if b.numel() else 0.0)
    return diff, diff / max(scale, 1e-30)


def run_case(case, impls, device, warmup, repeat, seed):
    """The rows of one case: one per implementation."""
    import torch

    flops, nbytes = work(case)
    rows, reference = [], None
    try:
        problem = Problem(case, device, seed)
    except Unsupported as e:
        return [dict(case, impl=i, status="unsupported", message=str(e)) for i in impls]
    for impl in impls:
        row = dict(case, impl=impl, status="ok", message="", flops=flops, bytes=nbytes)
        try:
            fn = problem.fn(impl)
            outputs = [t.detach() for t in _outputs(fn())]
            ms = _time(fn, device, warmup, repeat)
            row.update(latency_ms=ms, tflops=flops / (ms * 1e-3) / 1e12 if ms > 0 else None,
                       gb_per_s=nbytes / (ms * 1e-3) / 1e9 if ms > 0 else None)
            if reference is None:
                reference = outputs  # fmha's, listed first
            else:
                diff, rel = _max_diff(outputs, reference)
                limit = MISMATCH_REL_FP8 if case["dtype"].startswith("fp8") else MISMATCH_REL[case["op"]]
                row.update(max_abs_diff=diff, mismatch=rel > limit)
        except Unsupported as e:
            row.update(status="unsupported", message=str(e))
        except L.FmhaError as e:
            row.update(status="unsupported" if e.status == L.ERR_UNSUPPORTED else "error", message=str(e))
        except RuntimeError as e:  # SDPA's "no available kernel" and the like
            row.update(status="unsupported", message=str(e).splitlines()[0][:200])
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _matches(flt, case):
    field, op, value = flt
    if field not in case:
        raise SystemExit(f"fmha.bench: --filter: {field!r} is not a case field ({', '.join(FIELDS)})")
    text = str(case[field]).lower() if isinstance(case[field], bool) else str(case[field])
    return value in text if op == "~" else text == value


def _filter(text):
    for op in ("=", "~"):
        field, sep, value = text.partition(op)
        if sep and field and "=" not in field and "~" not in field:
            return field, op, value
    raise argparse.ArgumentTypeError(f"{text!r} is not FIELD=VALUE or FIELD~TEXT")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fmha.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--matrix", default="smoke", help="smoke, full, nightly, or a TOML file (fmha-bench's format)")
    ap.add_argument("--filter", type=_filter, action="append", default=[],
                    help="FIELD=VALUE or FIELD~TEXT on the case fields; repeatable")
    ap.add_argument("--impl", default="fmha,fa3,sdpa_flash,sdpa_cudnn",
                    help=f"comma-separated, fmha first (the reference of the diffs): {', '.join(IMPLS)}")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    impls = [i for i in args.impl.split(",") if i]
    bad = [i for i in impls if i not in IMPLS]
    if bad or not impls or impls[0] != "fmha":
        ap.error(f"--impl: fmha first, then any of {', '.join(IMPLS[1:])} (got {args.impl!r})")
    if args.repeat < 1:
        ap.error("--repeat: must be at least 1")
    try:
        import torch
    except ModuleNotFoundError:
        raise SystemExit("python -m fmha.bench needs PyTorch: pip install torch (or fmha[torch])") from None

    host = L.backend() == L.BACKEND_HOST
    device = torch.device("cpu") if host else torch.device("cuda")
    cases = [c for c in load_matrix(args.matrix) if all(_matches(f, c) for f in args.filter)]
    rows = []
    for n, case in enumerate(cases):
        for row in run_case(case, impls, device, args.warmup, args.repeat, args.seed + n):
            rows.append(row)
            label = " ".join(f"{k}={case[k]}" for k in FIELDS if case[k] not in ("", 0, False))
            if row["status"] == "ok":
                diff = f", diff {row['max_abs_diff']:.1e}" if "max_abs_diff" in row else ""
                flag = " MISMATCH" if row.get("mismatch") else ""
                print(f"{label} {row['impl']}: {row['latency_ms']:.4f} ms, {row['tflops']:.3g} TFLOPS, "
                      f"{row['gb_per_s']:.4g} GB/s{diff}{flag}", flush=True)
            else:
                print(f"{label} {row['impl']}: {row['status']}: {row['message']}", flush=True)
    meta = {"tool": "python -m fmha.bench", "fmha": L.version(), "backend": L.backend_name(),
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
            "matrix": args.matrix, "warmup": args.warmup, "repeat": args.repeat, "seed": args.seed,
            "unix_time": int(time.time())}
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    mismatches = sum(1 for r in rows if r.get("mismatch"))
    errors = sum(1 for r in rows if r["status"] == "error")
    ran = sum(1 for r in rows if r["status"] == "ok")
    print(f"fmha.bench: {len(cases)} cases, {ran} rows ran, {errors} errors, {mismatches} mismatches "
          f"({meta['device']}, {meta['backend']})")
    return 1 if mismatches or errors else 0


if __name__ == "__main__":
    sys.exit(main())
