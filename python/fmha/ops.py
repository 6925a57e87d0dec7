"""fmha on PyTorch tensors: the forward and backward calls, the launcher cache and the autograd functions.

Where the memory lives and which stream runs the work depends on the library's backend:

* GPU builds (``fmha.backend()`` is ``BACKEND_CUDA`` or ``BACKEND_ROCM``): tensors are CUDA (HIP) tensors,
  the work is queued on ``torch.cuda.current_stream()`` of the tensors' device and the calls return once
  it is queued, as every PyTorch operation does.
* the host backend (``BACKEND_HOST``): tensors are CPU tensors (the host backend's "device memory" is host
  memory), the work runs on fmha's default stream and the call waits for it, so the results are ready
  when the function returns.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from ctypes import byref, c_size_t, c_void_p

import torch

from . import _lib as L
from . import _native

_DTYPES = {torch.float16: L.DTYPE_FP16, torch.bfloat16: L.DTYPE_BF16}
# fp8 e4m3 inputs by format (those this PyTorch has); the forward writes them as bf16.
_FP8_DTYPES = {
    dtype: code
    for dtype, code in (
        (getattr(torch, "float8_e4m3fn", None), L.DTYPE_FP8_E4M3FN),
        (getattr(torch, "float8_e4m3fnuz", None), L.DTYPE_FP8_E4M3FNUZ),
    )
    if dtype is not None
}
_MASKS = {
    "none": L.MASK_NONE,
    "top_left": L.MASK_TOP_LEFT,
    "bottom_right": L.MASK_BOTTOM_RIGHT,
}


# --- device, stream, layout helpers --------------------------------------------------------------------


_host_backend = None


def _on_host_backend() -> bool:
    """Whether the loaded libfmha is the host backend (asked once: the library stays loaded)."""
    global _host_backend
    if _host_backend is None:
        _host_backend = L.backend() == L.BACKEND_HOST
    return _host_backend


def _check_tensors(named):
    """Same device, the device type this build runs on; `named` is [(name, tensor or None)]."""
    host = _on_host_backend()
    device = None
    for name, t in named:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fmha: {name} must be a torch.Tensor, got {type(t).__name__}")
        if host and t.device.type != "cpu":
            raise ValueError(
                f"fmha: {name} is on {t.device}, but this libfmha is the host backend (fmha.backend() == 0, "
                f"{L.library_path()}): pass CPU tensors, or load a GPU build with FMHA_LIBRARY"
            )
        if not host and t.device.type != "cuda":
            raise ValueError(
                f"fmha: {name} is on {t.device}, but this libfmha is the {L.backend_name()} backend: pass "
                "tensors on the GPU"
            )
        if device is None:
            device = t.device
        elif t.device != device:
            raise ValueError(f"fmha: {name} is on {t.device}, the other tensors on {device}")
    return device


def _device_guard(device):
    """Makes `device` current for the call; a no-op (no context switch) when it already is."""
    if device is None or device.type != "cuda" or device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


# The current stream's raw handle without building a torch.cuda.Stream object (what Triton's launcher
# uses); the public route where this PyTorch lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream_handle(device):
    """fmha_stream_t for the current PyTorch stream (None = the default stream / the host backend)."""
    if device is None or device.type != "cuda":
        return None
    if _raw_stream is not None:
        return _raw_stream(device.index) or None
    return torch.cuda.current_stream(device).cuda_stream or None


def _finish(device):
    """The host backend runs on worker threads: wait, so the CPU tensors are ready on return."""
    if device is None or device.type != "cuda":
        L.stream_synchronize(None)


def _last_dim_contiguous(t):
    if t is None or t.dim() == 0 or t.stride(-1) == 1 or t.size(-1) <= 1:
        return t
    return t.contiguous()


_vector_bytes_cache = None


def _vector_bytes() -> int:
    """The largest tensor alignment (bytes) any kernel instance of this build asks for (registry field
    ``vector_bytes``; 0 = any). GPU kernels that move 16-byte vectors refuse misaligned tensors."""
    global _vector_bytes_cache
    if _vector_bytes_cache is None:
        try:
            instances = L.registry()
        except L.FmhaError:  # e.g. a GPU build without a device: the call itself will say so
            return 0
        _vector_bytes_cache = max([int(i.get("vector_bytes", 0) or 0) for i in instances] + [0])
    return _vector_bytes_cache


def _output_dtype(dtype):
    """What fmha writes for inputs of `dtype`: their own type, bf16 for fp8."""
    return torch.bfloat16 if dtype in _FP8_DTYPES else dtype


def _require_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"fmha: {name} must be a torch.Tensor, got {type(t).__name__}")


def _descale(name, t, batch, nhead_k, device):
    """FA3's descale tensor, ``(batch, nheads_k)`` float32 (anything that broadcasts to it: stride 0 is
    passed as is, nothing is copied) → fmha_scale."""
    if t is None:
        return L.fmha_scale(None, 0, 0, 0)
    _require_tensor(name, t)
    if t.dtype != torch.float32:
        raise TypeError(f"fmha: {name} must be torch.float32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"fmha: {name} is on {t.device}, the other tensors on {device}")
    try:
        e = t.expand(batch, nhead_k)
    except RuntimeError:
        raise ValueError(
            f"fmha: {name} must be (batch, nheads_k) = ({batch}, {nhead_k}) or broadcast to it, got shape "
            f"{tuple(t.shape)}"
        ) from None
    return L.fmha_scale(_ptr(e), e.stride(0), e.stride(1), 0)


def _prepare_input(t):
    """A tensor fmha can read: last dimension contiguous, and -- where the build's kernels need it --
    address and strides aligned to their vector width (copied with ``.contiguous()`` otherwise, as
    flash-attn copies what its kernels cannot read)."""
    t = _last_dim_contiguous(t)
    if t is None or t.numel() == 0:
        return t
    align = _vector_bytes()
    if align:
        size = t.element_size()
        misaligned = t.data_ptr() % align or any((stride * size) % align for stride in t.stride()[:-1])
        # A packed copy helps only when a row is a whole number of vectors; otherwise fmha names the problem.
        if misaligned and (t.size(-1) * size) % align == 0:
            return t.clone(memory_format=torch.contiguous_format)
    return t


def _bshd(t):
    """[batch, seq, head, dim] → fmha_tensor (batch mode)."""
    stride = t.stride()
    return L.fmha_tensor(t.data_ptr() or None, stride[0], stride[2], stride[1])


def _thd(t):
    """[total, head, dim] → fmha_tensor (group mode: batch b starts at row seqstart[b])."""
    return L.fmha_tensor(t.data_ptr() or None, 0, t.stride(1), t.stride(0))


def _lse_tensor(t, group):
    """LSE / D layout: [batch, head, seq] fp32 (batch mode), [head, total] fp32 (group mode)."""
    if group:
        return L.fmha_tensor(t.data_ptr() or None, 0, t.stride(0), t.stride(1))
    return L.fmha_tensor(t.data_ptr() or None, t.stride(0), t.stride(1), t.stride(2))


def _ptr(t):
    return None if t is None else (t.data_ptr() or None)


def _mask_type(mask) -> int:
    if isinstance(mask, str):
        try:
            return _MASKS[mask]
        except KeyError:
            raise ValueError(f"fmha: mask {mask!r} is not one of {sorted(_MASKS)}") from None
    return int(mask)


def _scale(softmax_scale, hdim_q) -> float:
    if softmax_scale is None:
        return float(hdim_q) ** -0.5
    scale = float(softmax_scale)
    # fmha's ABI reads scale 0 as "1/sqrt(hdim_q)" and refuses negative scales: say so here rather than
    # silently computing something else than asked.
    if not scale > 0.0:
        raise ValueError(f"fmha: softmax_scale must be positive (got {softmax_scale}); None selects 1/sqrt(head_dim)")
    return scale


class _Problem:
    """Shapes of one call, checked, from q/k/v (batch mode [b, s, h, d], group mode [total, h, d])."""

    def __init__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
        self.group = cu_seqlens_q is not None or cu_seqlens_k is not None
        codes = {**_DTYPES, **_FP8_DTYPES}
        if q.dtype not in codes:
            raise TypeError(
                f"fmha: q has dtype {q.dtype}; fmha supports torch.float16 and torch.bfloat16 (and for the forward "
                "torch.float8_e4m3fn / torch.float8_e4m3fnuz)"
            )
        for name, t in (("k", k), ("v", v)):
            if t.dtype != q.dtype:
                raise TypeError(f"fmha: {name} has dtype {t.dtype}, q has {q.dtype} (they must agree)")
        self.dtype = codes[q.dtype]
        self.fp8 = q.dtype in _FP8_DTYPES
        want = 3 if self.group else 4
        layout = "[total, heads, head_dim]" if self.group else "[batch, seqlen, heads, head_dim]"
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() != want:
                raise ValueError(f"fmha: {name} must be {layout}, got shape {tuple(t.shape)}")
        if k.shape[:-1] != v.shape[:-1]:
            raise ValueError(f"fmha: k {tuple(k.shape)} and v {tuple(v.shape)} differ in all but the last dim")
        if q.shape[-1] != k.shape[-1]:
            raise ValueError(f"fmha: q {tuple(q.shape)} and k {tuple(k.shape)} differ in head_dim")
        self.hdim_q, self.hdim_v = int(q.shape[-1]), int(v.shape[-1])
        self.nhead_q, self.nhead_k = int(q.shape[-2]), int(k.shape[-2])
        if self.group:
            if cu_seqlens_q is None or cu_seqlens_k is None:
                raise ValueError("fmha: varlen needs both cu_seqlens_q and cu_seqlens_k")
            for name, c in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
                if c.dtype != torch.int32 or c.dim() != 1 or c.numel() < 2:
                    raise ValueError(
                        f"fmha: {name} must be a 1-D torch.int32 tensor of batch + 1 >= 2 offsets, got "
                        f"{c.dtype} of shape {tuple(c.shape)}"
                    )
                if c.stride(0) != 1:
                    raise ValueError(f"fmha: {name} must be contiguous")
            if cu_seqlens_q.numel() != cu_seqlens_k.numel():
                raise ValueError(
                    f"fmha: cu_seqlens_q has {cu_seqlens_q.numel()} entries, cu_seqlens_k {cu_seqlens_k.numel()}"
                )
            self.batch = cu_seqlens_q.numel() - 1
            self.seqlen_q, self.seqlen_k = int(q.shape[0]), int(k.shape[0])
            if max_seqlen_q is None or max_seqlen_k is None:
                raise ValueError("fmha: varlen needs max_seqlen_q and max_seqlen_k (upper bounds, host ints)")
            # A batch is never longer than all rows together: clamping keeps fmha's bound check happy when
            # a caller passes a generous bound (flash-attn accepts any upper bound).
            self.max_seqlen_q = max(0, min(int(max_seqlen_q), self.seqlen_q))
            self.max_seqlen_k = max(0, min(int(max_seqlen_k), self.seqlen_k))
        else:
            if q.shape[0] != k.shape[0]:
                raise ValueError(f"fmha: q has batch {q.shape[0]}, k has {k.shape[0]}")
            self.batch = int(q.shape[0])
            self.seqlen_q, self.seqlen_k = int(q.shape[1]), int(k.shape[1])
            self.max_seqlen_q, self.max_seqlen_k = self.seqlen_q, self.seqlen_k

    def out_shape(self, q):
        return tuple(q.shape[:-1]) + (self.hdim_v,)

    def lse_shape(self):
        if self.group:
            return (self.nhead_q, self.seqlen_q)
        return (self.batch, self.nhead_q, self.seqlen_q)

    def tensor(self, t):
        return _thd(t) if self.group else _bshd(t)

    def call_fields(self, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, window):
        """The fields fmha_fwd_args and fmha_bwd_args share: q, k, v, o, the LSE, sequence starts, lengths,
        heads, scale, window (the C++ operator's ``describe`` sets the same ones)."""
        left, right = window
        return dict(
            q=self.tensor(q),
            k=self.tensor(k),
            v=self.tensor(v),
            o=self.tensor(out),
            lse=_lse_tensor(lse, self.group),
            seqstart_q=_ptr(cu_seqlens_q),
            seqstart_k=_ptr(cu_seqlens_k),
            seqlen_q_ptr=None,
            seqlen_k_ptr=None,
            batch=self.batch,
            seqlen_q=self.seqlen_q,
            seqlen_k=self.seqlen_k,
            max_seqlen_q=self.max_seqlen_q,
            max_seqlen_k=self.max_seqlen_k,
            nhead_q=self.nhead_q,
            nhead_k=self.nhead_k,
            scale=_scale(softmax_scale, self.hdim_q),
            window_size_left=int(left),
            window_size_right=int(right),
        )


def _check_out(name, t, shape, dtype, device):
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != device:
        raise ValueError(
            f"fmha: {name} must be {dtype} of shape {tuple(shape)} on {device}, got {t.dtype} "
            f"{tuple(t.shape)} on {t.device}"
        )
    if t.size(-1) > 1 and t.stride(-1) != 1:
        raise ValueError(f"fmha: {name} must have a contiguous last dimension (stride {t.stride(-1)})")


# --- call templates ----------------------------------------------------------------------------------
#
# Training and inference call attention with the same shapes step after step. The first call of a
# signature (every shape, stride, dtype and option a call reads, but no data pointer) runs the full
# checks and builds the C argument structs; it then keeps those structs as the signature's template,
# and a later call with that signature copies them and sets only the data pointers. Nothing else
# differs between the two paths: a signature the checks would refuse never gets a template.

_TEMPLATE_CAPACITY = 256


class _Templates(dict):
    """Signature → template; cleared when full (a workload has a handful of signatures)."""

    def put(self, key, value):
        if len(self) >= _TEMPLATE_CAPACITY:
            self.clear()
        self[key] = value


def _sig(t):
    """What a call reads of a tensor besides its data pointer."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _sig_without_rows(t):
    """:func:`_sig` of a varlen ``[total, heads, dim]`` tensor without its token count."""
    return (t.shape[1:], t.stride(), t.dtype, t.device)


def _aligned(tensors):
    """Whether the data pointers suit the build's kernels (the strides are part of the signature)."""
    align = _vector_bytes()
    return not align or all(t.data_ptr() % align == 0 for t in tensors)


def _copy(struct):
    return type(struct).from_buffer_copy(struct)


_fwd_templates = _Templates()
_bwd_templates = _Templates()


# --- scheduler workspaces ---------------------------------------------------------------------------
#
# fmha_fwd_args.workspace (fmha_fwd_workspace_size bytes) and fmha_kvcache_args.scheduler_workspace
# (fmha_kvcache_launcher_scheduler_workspace_size bytes), 16 bytes of device memory each today, that the
# sm_90a kernels take tiles from (a counter the call zeroes on its stream), so that calls whose tiles differ
# in cost run a persistent grid. A workspace serves one call at a time. Eager calls share one per
# (operation, stream, device, thread), cached for the life of the process: calls on one stream run in
# stream order, calls on other streams get their own, and so do other threads (a call enqueues the zeroing
# and the kernel separately, so two threads' calls on one stream could interleave them). Each is allocated
# on the stream it serves, so the caching allocator never hands its memory to another stream. A call costs
# the capture query and one dict lookup (about 0.5 µs on an H200 host).

# (operation, stream handle, device index, thread id) → (address, bytes, tensor)
_scheduler_workspaces = {}
_NO_WORKSPACE = (None, 0, None)
# The current stream's capture status without the public wrapper's Python frame (where this PyTorch has it).
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing
_thread_id = threading.get_ident


def _new_scheduler_workspace(size_of, key, device):
    t = torch.empty(max(size_of(key), 1), dtype=torch.uint8, device=device)
    return t.data_ptr(), t.numel(), t


def _scheduler_workspace(operation, size_of, key, device, stream):
    """``(address, bytes, tensor)`` of the scheduler workspace for a call of ``operation`` (``"fwd"``,
    ``"kvcache"``) on ``stream`` of ``device`` (the current device) from this thread; ``(None, 0, None)``
    (NULL) on the host backend. ``size_of(key)`` is the size the operation's size function reports (asked
    only when a workspace is allocated). The caller holds the tensor until the call has returned (while a
    graph is captured, nothing else does)."""
    if device is None or device.type != "cuda":
        return _NO_WORKSPACE
    if _capturing():
        # A CUDA graph gets a workspace of its own for each captured call: two graphs captured on one
        # stream (torch.cuda.graph captures on one side stream) may be replayed concurrently, on other
        # streams, where a shared counter would hand one replay's tiles to the other, and the eager cache's
        # workspace may be in use by eager calls while a graph replays. Allocated during the capture, it
        # comes from the graph's private pool, which the graph keeps for its replays; the caller drops the
        # tensor after the call, and the pool may give the bytes to a later allocation of the same capture,
        # which runs after this call in stream order, as any temporary's.
        return _new_scheduler_workspace(size_of, key, device)
    cache_key = (operation, stream, device.index, _thread_id())
    entry = _scheduler_workspaces.get(cache_key)
    if entry is None:
        entry = _scheduler_workspaces[cache_key] = _new_scheduler_workspace(size_of, key, device)
    return entry


def _fwd_workspace_size(traits):
    size = c_size_t()
    L.call("fmha_fwd_workspace_size", byref(traits), byref(size))
    return size.value


def _fwd_workspace(traits, device, stream):
    """The forward's scheduler workspace (``fmha_fwd_args.workspace``): see :func:`_scheduler_workspace`."""
    return _scheduler_workspace("fwd", _fwd_workspace_size, traits, device, stream)


def _call_fwd(traits, args, device):
    """``fmha_fwd`` on the current stream of ``device``, with its scheduler workspace."""
    with _device_guard(device):
        stream = _stream_handle(device)
        args.workspace, args.workspace_size, keep = _fwd_workspace(traits, device, stream)  # noqa: F841 (held)
        L.call("fmha_fwd", byref(traits), byref(args), stream)
        _finish(device)


# --- forward -----------------------------------------------------------------------------------------


def _fwd_signature(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, mask_type, window):
    """A forward's template signature (raises TypeError / AttributeError for arguments that are not tensors)."""
    return (_sig(q), _sig(k), _sig(v), _sig(cu_seqlens_q), _sig(cu_seqlens_k), max_seqlen_q, max_seqlen_k,
            softmax_scale, mask_type, tuple(window))


def _fwd(q, k, v, **kwargs):
    """One ``fmha_fwd`` call with fmha's own mask semantics; returns ``(out, lse)`` (see :func:`_forward`)."""
    out, lse, _, _ = _forward(q, k, v, **kwargs)
    return out, lse


def _forward(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    mask_type=L.MASK_NONE,
    window=(-1, -1),
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    out=None,
    lse=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
):
    """One ``fmha_fwd`` call with fmha's own mask semantics; returns ``(out, lse, (q, k, v), signature)``:
    the inputs the call read (copies where the kernels could not read the given ones: what a backward
    needs) and the call's template signature (None when the call has no template), which determines
    everything a backward of it reads but dO.

    ``out`` / ``lse`` may be given (preallocated, e.g. poisoned by a test); otherwise ``out`` is allocated
    like q (bf16 for fp8 inputs) and ``lse`` as fp32 ``[b, h, s]`` (``[h, total]`` in varlen mode).
    fp8 inputs take FA3's descales, float32 ``(batch, nheads_k)`` or anything that broadcasts to it (None:
    1); as in FA3 they are ignored for fp16/bf16 inputs.
    """
    signature = None
    if out is None and lse is None and q_descale is None and k_descale is None and v_descale is None:
        try:
            signature = _fwd_signature(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                       mask_type, window)
            template = _fwd_templates.get(signature)
        except (AttributeError, TypeError):  # not tensors, unhashable options: the checks below say what
            signature = template = None
        if template is not None and _aligned((q, k, v)):
            return _fwd_from_template(template, q, k, v, cu_seqlens_q, cu_seqlens_k) + ((q, k, v), signature)
    given = (q, k, v)
    device = _check_tensors(
        [("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("out", out)]
    )
    q, k, v = (_prepare_input(t) for t in (q, k, v))
    p = _Problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out_dtype = _output_dtype(q.dtype)
    if out is None:
        out = q.new_empty(p.out_shape(q), dtype=out_dtype)
    else:
        _check_out("out", out, p.out_shape(q), out_dtype, q.device)
    if lse is None:
        lse = torch.empty(p.lse_shape(), dtype=torch.float32, device=q.device)
    else:
        _check_out("lse", lse, p.lse_shape(), torch.float32, q.device)
    traits = L.fmha_fwd_traits(
        dtype=p.dtype,
        hdim_q=p.hdim_q,
        hdim_v=p.hdim_v,
        is_group_mode=int(p.group),
        mask_type=_mask_type(mask_type),
        bias_type=L.BIAS_NONE,
        has_dropout=0,
        o_dtype=L.DTYPE_BF16 if p.fp8 else p.dtype,
    )
    descales = {
        name: _descale(name, t, p.batch, p.nhead_k, q.device) if p.fp8 else L.fmha_scale()
        for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    }
    args = L.fmha_fwd_args(**p.call_fields(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, window),
                           **descales)
    _call_fwd(traits, args, device)
    # A template serves calls whose inputs need no copy (the copies' strides are not the caller's) and
    # whose outputs fmha allocates.
    if signature is not None and not p.fp8 and all(a is b and a.numel() for a, b in zip((q, k, v), given)):
        _fwd_templates.put(signature, (traits, _copy(args), p.out_shape(q), p.lse_shape(), out.dtype, device))
    else:
        signature = None
    return out, lse, (q, k, v), signature


def _fwd_from_template(template, q, k, v, cu_seqlens_q, cu_seqlens_k):
    traits, args, out_shape, lse_shape, out_dtype, device = template
    out = torch.empty(out_shape, dtype=out_dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    args = _copy(args)
    args.q.data, args.k.data, args.v.data = q.data_ptr(), k.data_ptr(), v.data_ptr()
    args.o.data, args.lse.data = out.data_ptr(), lse.data_ptr()
    args.seqstart_q, args.seqstart_k = _ptr(cu_seqlens_q), _ptr(cu_seqlens_k)
    _call_fwd(traits, args, device)
    return out, lse


# --- backward launchers ---------------------------------------------------------------------------------


class _Launcher:
    """A cached ``fmha_bwd_launcher``. Its lock keeps a call from using the handle while another thread's
    eviction destroys it (the library would refuse the stale handle; the lock makes the retry cheap).
    On a GPU, calls share one workspace per stream (_bwd_launch)."""

    __slots__ = ("handle", "lock", "workspace_size", "prepared")

    def __init__(self, handle, workspace_size):
        self.handle = handle
        self.workspace_size = workspace_size
        self.lock = threading.Lock()
        self.prepared = {}  # stream handle → its workspace (see _bwd_launch)

    def destroy(self):
        with self.lock:
            self.prepared.clear()
            if self.handle is not None:
                # Safe while its work is queued (fmha_bwd_launcher_destroy's contract).
                L.library().fmha_bwd_launcher_destroy(self.handle)
                self.handle = None


_cache_lock = threading.Lock()
_cache: "OrderedDict[tuple, _Launcher]" = OrderedDict()


def _cache_capacity() -> int:
    try:
        return max(1, int(os.environ.get("FMHA_LAUNCHER_CACHE_SIZE", "32")))
    except ValueError:
        return 32


def launcher_cache_info() -> dict:
    """How many backward launchers are cached (and the bound, ``$FMHA_LAUNCHER_CACHE_SIZE``, default 32)."""
    with _cache_lock:
        return {"size": len(_cache), "capacity": _cache_capacity(), "keys": list(_cache)}


def clear_launcher_cache() -> None:
    """Destroys every cached backward launcher (those of the C++ autograd operator's plans once no autograd
    graph holds them)."""
    _plans.clear()
    with _cache_lock:
        entries = list(_cache.values())
        _cache.clear()
    for e in entries:
        e.destroy()


def _traits_key(traits, device):
    return (str(device),) + tuple(getattr(traits, name) for name, _ in traits._fields_[1:])


def _length_bucket(n):
    """The smallest power of two >= n (at least 64): a launcher bound that a range of lengths shares."""
    return max(64, 1 << (max(int(n), 1) - 1).bit_length())


def _launcher(traits, device, key):
    """(key, cached launcher for these traits on `device`; `key` is their `_traits_key`), created on a miss;
    evicts the least recently used."""
    with _cache_lock:
        entry = _cache.get(key)
        if entry is not None:
            _cache.move_to_end(key)
            return key, entry
    handle = c_void_p()
    L.call("fmha_bwd_launcher_create", byref(traits), byref(handle))
    size = c_size_t(0)
    try:
        L.call("fmha_bwd_launcher_workspace_size", handle, byref(size))
    except BaseException:
        L.library().fmha_bwd_launcher_destroy(handle)
        raise
    entry = _Launcher(handle, size.value)
    evicted = []
    with _cache_lock:
        existing = _cache.get(key)
        if existing is not None:  # another thread created one meanwhile: keep that one
            evicted.append(entry)
            entry = existing
            _cache.move_to_end(key)
        else:
            _cache[key] = entry
        capacity = _cache_capacity()
        while len(_cache) > capacity:
            evicted.append(_cache.popitem(last=False)[1])
    for e in evicted:
        e.destroy()
    return key, entry


def _evict(key, entry):
    with _cache_lock:
        if _cache.get(key) is entry:
            del _cache[key]
    entry.destroy()


_PREPARE_METHODS = {"auto": L.PREPARE_AUTO, "host": L.PREPARE_HOST, "device": L.PREPARE_DEVICE}


def _bwd_structs(p, q, k, v, out, lse, dout, d, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, softmax_scale, mask_type,
                 window, deterministic):
    """The backward's ``(fmha_bwd_traits, fmha_bwd_args)`` for problem ``p`` (a :class:`_Problem`) and these
    tensors (``d``: the dot(dO, O) scratch, fp32 in the LSE layout); ``args.workspace`` unset."""
    mask_type = _mask_type(mask_type)
    # Varlen: the launcher's totals and maxima are bounds, so round them up to powers of two and
    # consecutive training steps (whose token counts vary) share one cached launcher and workspace.
    bound = _length_bucket if p.group else (lambda n: n)
    traits = L.fmha_bwd_traits(
        seqlen_q=bound(p.seqlen_q),
        seqlen_k=bound(p.seqlen_k),
        batch=p.batch,
        max_seqlen_q=bound(p.max_seqlen_q),
        max_seqlen_k=bound(p.max_seqlen_k),
        hdim_q=p.hdim_q,
        hdim_v=p.hdim_v,
        nhead_q=p.nhead_q,
        nhead_k=p.nhead_k,
        dtype=p.dtype,
        is_group_mode=int(p.group),
        mask_type=mask_type,
        bias_type=L.BIAS_NONE,
        has_dbias=0,
        has_dropout=0,
        is_store_randval=0,
        is_deterministic=int(bool(deterministic)),
    )
    args = L.fmha_bwd_args(
        d_o=p.tensor(dout),
        d=_lse_tensor(d, p.group),
        dq=p.tensor(dq),
        dk=p.tensor(dk),
        dv=p.tensor(dv),
        workspace=None,
        hdim_q=p.hdim_q,
        hdim_v=p.hdim_v,
        **p.call_fields(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, window),
    )
    return traits, args


def _bwd(
    dout,
    q,
    k,
    v,
    out,
    lse,
    *,
    softmax_scale=None,
    mask_type=L.MASK_NONE,
    window=(-1, -1),
    deterministic=False,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    dq=None,
    dk=None,
    dv=None,
    prepare=None,
    forward_signature=None,
):
    """The backward through a cached launcher; returns ``(dq, dk, dv)`` (dk/dv with k's heads).

    ``prepare`` picks how the workspace is prepared:

    * ``None`` (default): ``$FMHA_PREPARE_METHOD`` when set, else ``"auto"`` -- asynchronously on the current
      stream (varlen: from the device ``cu_seqlens``; batch mode: no seqstarts) with ``FMHA_PREPARE_AUTO``,
      so nothing blocks the host -- except batch mode on the host backend, which uses ``"sync"``. (On a GPU
      the synchronous prepare is a ``cudaMemcpy`` from pageable memory: it would wait for all the work
      queued before it, stalling the host at every backward.)
    * ``"sync"``: ``fmha_bwd_launcher_prepare_workspace`` (varlen: from host copies of the cu_seqlens, which
      synchronizes);
    * ``"auto"``, ``"host"``, ``"device"``: ``fmha_bwd_launcher_prepare_workspace_async`` with that method.
    """
    if prepare is None:
        prepare = os.environ.get("FMHA_PREPARE_METHOD")
    signature = None
    if dq is None and dk is None and dv is None:
        try:
            if forward_signature is not None:
                # The backward of a templated forward (autograd): q, k, v, the cu_seqlens and the options
                # are the forward's, out and lse its outputs, so its signature stands for them (and for
                # their alignment).
                signature = (forward_signature, _sig(dout), bool(deterministic), prepare)
                read = (dout,)
            else:
                signature = (_sig(dout), _sig(q), _sig(k), _sig(v), _sig(out), _sig(lse), _sig(cu_seqlens_q),
                             _sig(cu_seqlens_k), max_seqlen_q, max_seqlen_k, softmax_scale, mask_type,
                             tuple(window), bool(deterministic), prepare)
                read = (q, k, v, out, dout)
            template = _bwd_templates.get(signature)
        except (AttributeError, TypeError):  # not tensors, unhashable options: the checks below say what
            signature = template = None
        if template is not None and _aligned(read):
            return _bwd_from_template(template, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    given = (q, k, v, out, dout, lse)
    device = _check_tensors(
        [
            ("dout", dout),
            ("q", q),
            ("k", k),
            ("v", v),
            ("out", out),
            ("lse", lse),
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
            ("dq", dq),
            ("dk", dk),
            ("dv", dv),
        ]
    )
    q, k, v, out, dout = (_prepare_input(t) for t in (q, k, v, out, dout))
    lse = _last_dim_contiguous(lse)
    p = _Problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    if dout.dtype != q.dtype:
        dout = dout.to(q.dtype)
    _check_out("out", out, p.out_shape(q), q.dtype, q.device)
    _check_out("dout", dout, p.out_shape(q), q.dtype, q.device)
    _check_out("lse", lse, p.lse_shape(), torch.float32, q.device)
    for name, g, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if g is not None:  # the caller's; those allocated here are right by construction
            _check_out(name, g, like.shape, like.dtype, like.device)
    if dq is None:
        dq = torch.empty_like(q)
    if dk is None:
        dk = torch.empty_like(k)
    if dv is None:
        dv = torch.empty_like(v)
    d = torch.empty_like(lse)  # the dot(dO, O) scratch, fp32 in the LSE layout
    traits, args = _bwd_structs(p, q, k, v, out, lse, dout, d, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                                mask_type, window, deterministic)
    host = device is None or device.type != "cuda"
    method = prepare or ("sync" if host and not p.group else "auto")
    if method != "sync" and method not in _PREPARE_METHODS:
        raise ValueError(f"fmha: prepare must be None, 'sync', 'auto', 'host' or 'device', got {method!r}")
    _bwd_launch(traits, _traits_key(traits, device), args, device, method, cu_seqlens_q, cu_seqlens_k)
    # As the forward's: a template serves calls whose tensors need no copy and whose gradients fmha allocates.
    if signature is not None and all(a is b and a.numel() for a, b in zip((q, k, v, out, dout, lse), given)):
        _bwd_templates.put(signature, (traits, _traits_key(traits, device), _copy(args), device, method))
    return dq, dk, dv


def _bwd_from_template(template, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k):
    traits, key, args, device, method = template
    dq, dk, dv, d = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(lse)
    args = _copy(args)
    for field, t in (("q", q), ("k", k), ("v", v), ("o", out), ("lse", lse), ("d_o", dout), ("d", d), ("dq", dq),
                     ("dk", dk), ("dv", dv)):
        getattr(args, field).data = t.data_ptr()
    args.seqstart_q, args.seqstart_k = _ptr(cu_seqlens_q), _ptr(cu_seqlens_k)
    _bwd_launch(traits, key, args, device, method, cu_seqlens_q, cu_seqlens_k)
    return dq, dk, dv


def _bwd_launch(traits, key, args, device, prepare, cu_seqlens_q, cu_seqlens_k):
    """Prepares a workspace (``prepare``: "sync" or an async method) and runs the backward through the
    cached launcher for ``traits`` (cache key ``key``).

    On a GPU the launcher keeps one workspace per stream, which later calls on that stream reuse (stream
    order keeps them apart): no allocation per step. A batch-mode workspace depends only on the launcher
    (no sequence starts) and ``run`` initializes its dq_acc region itself, so it is prepared once; a
    varlen one is prepared again for every call's cu_seqlens."""
    host = device is None or device.type != "cuda"
    reuse = not host and prepare != "sync"
    with _device_guard(device):
        stream = _stream_handle(device)
        host_starts = None
        if prepare == "sync" and cu_seqlens_q is not None:
            host_starts = (cu_seqlens_q.cpu(), cu_seqlens_k.cpu())  # host copies (synchronizes)
        while True:
            key, entry = _launcher(traits, device, key)
            workspace = entry.prepared.get(stream) if reuse else None
            fresh = workspace is None
            if fresh:
                workspace = torch.empty(max(entry.workspace_size, 1), dtype=torch.uint8, device=device)
            prepare_now = fresh or cu_seqlens_q is not None
            try:
                with entry.lock:
                    if entry.handle is None:  # evicted and destroyed by another thread in between: retry
                        continue
                    if prepare_now and prepare == "sync":
                        L.call(
                            "fmha_bwd_launcher_prepare_workspace",
                            entry.handle,
                            workspace.data_ptr(),
                            workspace.numel(),
                            _ptr(host_starts[0]) if host_starts else None,
                            _ptr(host_starts[1]) if host_starts else None,
                        )
                    elif prepare_now:
                        L.call(
                            "fmha_bwd_launcher_prepare_workspace_async",
                            entry.handle,
                            workspace.data_ptr(),
                            workspace.numel(),
                            _ptr(cu_seqlens_q),
                            _ptr(cu_seqlens_k),
                            stream,
                            None,
                            _PREPARE_METHODS[prepare],
                        )
                        if host:
                            # The host backend's stream is cheap to wait for: a failure of the prepare
                            # (e.g. invalid cu_seqlens) then surfaces from `run` with its own message.
                            L.stream_synchronize(None)
                    args.workspace = workspace.data_ptr()
                    L.call("fmha_bwd_launcher_run", entry.handle, byref(args), stream)
                    if reuse and fresh:
                        entry.prepared[stream] = workspace
                _finish(device)
            except L.FmhaError:
                # A launcher whose queued work failed keeps reporting it (FMHA_ERR_ASYNC_FAILURE) to its next
                # call: drop it from the cache, so the error is reported once, here.
                _evict(key, entry)
                raise
            break


# --- autograd ----------------------------------------------------------------------------------------


def _head_dim_multiple(dtype) -> int:
    """The head-dim multiple this build's kernels read (16-byte vectors: 8 for 16-bit types); 1 = any."""
    vector = _vector_bytes()
    return max(1, vector // dtype.itemsize) if vector else 1


def _pad_head_dim(t, multiple):
    """`t` with zero columns appended up to a multiple of `multiple` (flash-attn pads odd head dims alike)."""
    pad = -t.shape[-1] % multiple
    return t if pad == 0 else torch.nn.functional.pad(t, (0, pad))


class FmhaAttnFunc(torch.autograd.Function):
    """Forward saves q, k, v, out, lse (and the cu_seqlens); backward runs fmha's backward launcher. Head
    dims the build's kernels cannot read (not a whole number of 16-byte vectors, e.g. 59) are padded with
    zero columns, which change no score, and the outputs and gradients sliced back, as flash-attn does."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, mask_type,
                left, right, deterministic, with_lse):
        d, dv = q.shape[-1], v.shape[-1]
        multiple = _head_dim_multiple(q.dtype)
        ctx.padded = None
        if d % multiple or dv % multiple:
            softmax_scale = _scale(softmax_scale, d)  # the default follows the unpadded head dim
            q, k, v = (_pad_head_dim(t, multiple) for t in (q, k, v))
            ctx.padded = (multiple, d, dv)
        out, lse, (q, k, v), signature = _forward(
            q,
            k,
            v,
            softmax_scale=softmax_scale,
            mask_type=mask_type,
            window=(left, right),
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
        )
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.params = (max_seqlen_q, max_seqlen_k, softmax_scale, mask_type, left, right, deterministic)
        ctx.forward_signature = signature  # the backward's template key (no signature work on autograd's thread)
        # Only callers that asked for the LSE get it as an output (each output costs the autograd engine a
        # slot); it has no gradient, and without materialized grads autograd fills no zero tensor for it at
        # every backward (on an H200 host, ~100 µs of a training step's forward + backward).
        ctx.set_materialize_grads(False)
        if ctx.padded is not None:
            out = out[..., :dv]
        if not with_lse:
            return out
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse=None):
        if dout is None:  # out took no part in the loss
            return (None,) * 13
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        max_seqlen_q, max_seqlen_k, softmax_scale, mask_type, left, right, deterministic = ctx.params
        if ctx.padded is not None:
            dout = _pad_head_dim(dout, ctx.padded[0])
        dq, dk, dv = _bwd(
            dout,
            q,
            k,
            v,
            out,
            lse,
            softmax_scale=softmax_scale,
            mask_type=mask_type,
            window=(left, right),
            deterministic=deterministic,
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            forward_signature=ctx.forward_signature,
        )
        if ctx.padded is not None:
            _, d, d_v = ctx.padded
            dq, dk, dv = dq[..., :d], dk[..., :d], dv[..., :d_v]
        return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


# --- the C++ autograd operator ---------------------------------------------------------------------------
#
# On a GPU, a call goes through torch.ops.fmha.attention (fmha/_native.py) when that is built for this
# PyTorch and the call's plan key has a plan: its autograd node is C++, so the backward never enters Python.
# A plan holds the forward's template structs and the backward's, built from a call that ran the full checks
# on the Python path: the second call of its key (a key seen once, e.g. a one-off shape, gets no plan).
# Batch mode keys on the forward's template signature. Varlen keys on it without the row counts and the
# maxima, which the operator takes from each call, and with their power-of-two buckets instead (the backward
# launcher's bounds): training steps whose token counts vary share a plan.

_plans = _Templates()  # plan key → _native.Plan, _SEEN (once), or False (not served: a prepare method it lacks)
_SEEN = object()


def _plan_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, mask_type, window,
              deterministic):
    """A call's plan key (raises TypeError / AttributeError for arguments the checks would refuse)."""
    options = (softmax_scale, mask_type, window, deterministic, os.environ.get("FMHA_PREPARE_METHOD"))
    if cu_seqlens_q is None and cu_seqlens_k is None:
        return (_sig(q), _sig(k), _sig(v)) + options
    total_q, total_k = q.shape[0], k.shape[0]
    return (
        _sig_without_rows(q),
        _sig_without_rows(k),
        _sig_without_rows(v),
        _sig(cu_seqlens_q),
        _sig(cu_seqlens_k),
        _length_bucket(total_q),
        _length_bucket(total_k),
        _length_bucket(min(max_seqlen_q, total_q)),
        _length_bucket(min(max_seqlen_k, total_k)),
    ) + options


def _new_plan(template, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, mask_type,
              window, deterministic, prepare):
    """A :class:`fmha._native.Plan` for calls of a forward template's plan key, or False where the operator
    does not serve them (a prepare method it lacks)."""
    method = prepare or "auto"
    if method not in _PREPARE_METHODS:  # "sync" (and typos, which the Python path reports)
        return False
    fwd_traits, fwd_args = template[:2]
    p = _Problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    # The plan takes every data pointer and stride (and in varlen mode the lengths) from each call; these
    # stand in for them.
    bwd_traits, bwd_args = _bwd_structs(p, q, k, v, q, k, q, k, q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale,
                                        mask_type, window, deterministic)
    return _native.Plan(fwd_traits, fwd_args, _fwd_workspace_size(fwd_traits), bwd_traits, bwd_args,
                        _PREPARE_METHODS[method], _vector_bytes())


def native_autograd() -> str:
    """Whether calls go through the C++ autograd operator (``"in use (<path>)"``), or why not: see
    ``fmha._native``; ``$FMHA_NATIVE_AUTOGRAD`` picks the build (a path, or ``0`` for none)."""
    return _native.status()


def _attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, mask_type, left, right,
               deterministic, with_lse):
    """``FmhaAttnFunc.apply`` with these arguments, through the C++ operator where the call has a plan."""
    native = _native.attention()
    key = entry = None
    if native is not None and isinstance(q, torch.Tensor) and q.is_cuda:
        try:
            key = _plan_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, mask_type,
                            (left, right), deterministic)
            entry = _plans.get(key)
        except (AttributeError, TypeError):  # not tensors, unhashable options: the Python path says what
            key = None
        if isinstance(entry, _native.Plan) and _aligned((q, k, v)):
            out, lse = native(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q or 0, max_seqlen_k or 0, entry.id)
            return (out, lse) if with_lse else out
    result = FmhaAttnFunc.apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, mask_type, left, right,
        deterministic, with_lse
    )
    if key is not None and entry is None:
        _plans.put(key, _SEEN)
    elif entry is _SEEN:
        # The template of this very call: it ran the checks, and it exists unless the call copied an input.
        template = _fwd_templates.get(_fwd_signature(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                     softmax_scale, mask_type, (left, right)))
        if template is not None:
            _plans.put(key, _new_plan(template, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      softmax_scale, mask_type, (left, right), deterministic, key[-1]))
    return result


def attention(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    mask="none",
    window_size=(-1, -1),
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    deterministic=False,
):
    """Attention with fmha's own mask semantics; returns ``(out, lse)`` and is differentiable in q, k, v.

    ``mask``: ``"none"``, ``"top_left"`` or ``"bottom_right"`` (or an ``FMHA_MASK_*`` value), with
    ``window_size = (left, right)`` counted from that corner's diagonal, ``-1`` = unbounded; causal is
    ``(-1, 0)``. Layouts as :func:`fmha.flash_attn_func` (batch mode) or :func:`fmha.flash_attn_varlen_func`
    (when ``cu_seqlens_q/k`` are given). A fully masked query row gets ``out = 0`` and ``lse = -inf``.
    """
    left, right = (int(w) for w in window_size)
    return _attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, _mask_type(mask), left,
        right, bool(deterministic), True
    )


# --- flash-attn compatible entry points ----------------------------------------------------------------


def _flash_mask(causal, window_size, seqlen_q_bound, seqlen_k_bound):
    """flash-attn's (causal, window_size) → fmha (mask_type, left, right), aligned to the bottom-right corner.

    A side < 0 is unbounded; causal sets right = 0. A bounded side that nevertheless covers every key of
    every row is dropped too, so that such a window runs the unmasked kernel: with bottom-right alignment
    row i sees keys up to i + sk - sq + right and from i + sk - sq - left, so the left side covers all keys
    when left >= sk - 1 and the right side when right >= sq - 1 (varlen: with the maxima, which bound
    every sequence's lengths). No mask when both sides are unbounded.
    """
    left, right = (int(w) for w in window_size)
    left = -1 if left < 0 or left >= seqlen_k_bound - 1 else left
    right = -1 if right < 0 or right >= seqlen_q_bound - 1 else right
    if causal:
        right = 0
    if left == -1 and right == -1:
        return L.MASK_NONE, -1, -1
    return L.MASK_BOTTOM_RIGHT, left, right


def _refuse_unsupported(dropout_p, softcap, alibi_slopes):
    if dropout_p is not None and float(dropout_p) > 0.0:
        raise NotImplementedError(
            f"fmha: dropout is not supported yet (dropout_p={dropout_p}); pass dropout_p=0.0"
        )
    if softcap is not None and float(softcap) != 0.0:
        raise NotImplementedError(f"fmha: softcap is not supported (softcap={softcap})")
    if alibi_slopes is not None:
        raise NotImplementedError("fmha: alibi_slopes are not supported yet")


def _flash_result(out, lse, q, return_attn_probs):
    """flash-attn's return convention: ``out``, or ``(out, softmax_lse, S_dmask)``. flash-attn fills S_dmask
    only with dropout (its kernels get ``return_softmax and dropout_p > 0``); otherwise it is the empty
    ``torch.empty((0,))`` of q's dtype and device that flash-attn's C++ returns. fmha refuses dropout, so
    S_dmask is always that empty tensor."""
    if not return_attn_probs:
        return out
    return out, lse, q.new_empty((0,))


def _fp8_forward(q, k, v, descales, **kwargs):
    """The fp8 forward (inference: fmha has no fp8 backward, so nothing is recorded for autograd)."""
    if any(t.requires_grad for t in (q, k, v)):
        raise NotImplementedError("fmha: fp8 attention is forward only (q, k or v requires grad)")
    q_descale, k_descale, v_descale = descales
    return _fwd(q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, **kwargs)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    q_descale=None,
    k_descale=None,
    v_descale=None,
):
    """flash-attn's ``flash_attn_func``, same parameters in the same order: q ``[b, s_q, h, d]``, k/v
    ``[b, s_k, h_k, d]`` (``h % h_k == 0``). fp8 (FA3): q, k, v in ``torch.float8_e4m3fn`` or
    ``torch.float8_e4m3fnuz`` with the keywords ``q_descale/k_descale/v_descale`` (float32 ``(b, h_k)`` or
    broadcasting to it; the true value of an element ``x`` is ``x * descale``), output bf16, forward only.

    ``causal`` is aligned to the bottom-right corner (flash-attn's convention); ``window_size = (left,
    right)`` with -1 = unbounded, combined with causal as flash-attn does. Returns ``out`` ``[b, s_q, h,
    d_v]``, or ``(out, softmax_lse, S_dmask)`` with ``return_attn_probs=True`` (``softmax_lse`` ``[b, h, s_q]``
    fp32 natural log, a fully masked row has ``-inf`` where flash-attn reports ``+inf``; ``S_dmask`` is
    ``torch.empty((0,))`` of q's dtype and device, which is what flash-attn returns without dropout).
    ``deterministic`` selects the bitwise reproducible backward. dK/dV come back with ``h_k`` heads.
    Head dims the GPU kernels cannot read (16-bit types: not a multiple of 8) are padded with zero columns
    and the results sliced back, as flash-attn does. ``dropout_p > 0``, ``softcap != 0`` and
    ``alibi_slopes`` raise ``NotImplementedError``.
    """
    _refuse_unsupported(dropout_p, softcap, alibi_slopes)
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or not isinstance(k, torch.Tensor) or k.dim() != 4:
        raise ValueError("fmha: flash_attn_func takes q [batch, seqlen_q, heads, head_dim] and k/v [batch, "
                         "seqlen_k, heads_k, head_dim]")
    mask_type, left, right = _flash_mask(causal, window_size, q.shape[1], k.shape[1])
    if q.dtype in _FP8_DTYPES:
        out, lse = _fp8_forward(
            q, k, v, (q_descale, k_descale, v_descale), softmax_scale=softmax_scale, mask_type=mask_type,
            window=(left, right)
        )
    elif return_attn_probs:
        out, lse = _attention(
            q, k, v, None, None, None, None, softmax_scale, mask_type, left, right, bool(deterministic), True
        )
    else:
        return _attention(
            q, k, v, None, None, None, None, softmax_scale, mask_type, left, right, bool(deterministic), False
        )
    return _flash_result(out, lse, q, return_attn_probs)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    q_descale=None,
    k_descale=None,
    v_descale=None,
):
    """flash-attn's ``flash_attn_varlen_func``, same parameters in the same order: q ``[total_q, h, d]``,
    k/v ``[total_k, h_k, d]``, int32 ``cu_seqlens_q/k`` ``[batch + 1]`` on the tensors' device
    (``cu_seqlens[-1]`` must equal the total rows), ``max_seqlen_q/k`` host ints (upper bounds of the
    per-sequence lengths). Zero-length sequences are allowed. Returns ``out`` ``[total_q, h, d_v]`` or
    ``(out, softmax_lse, S_dmask)`` with ``softmax_lse`` ``[h, total_q]`` fp32 and S_dmask as
    :func:`flash_attn_func`. Masks per sequence as :func:`flash_attn_func`.
    The backward prepares its workspace on the current stream from the device cu_seqlens: no host
    synchronization. ``block_table`` (a paged KV cache) raises ``NotImplementedError``. fp8 inputs and
    their descales (``(batch, h_k)``) as :func:`flash_attn_func`.
    """
    _refuse_unsupported(dropout_p, softcap, alibi_slopes)
    if block_table is not None:
        raise NotImplementedError("fmha: block_table (a paged KV cache) is not supported by flash_attn_varlen_func yet")
    mask_type, left, right = _flash_mask(causal, window_size, int(max_seqlen_q), int(max_seqlen_k))
    if q.dtype in _FP8_DTYPES:
        out, lse = _fp8_forward(
            q, k, v, (q_descale, k_descale, v_descale), softmax_scale=softmax_scale, mask_type=mask_type,
            window=(left, right), cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k)
        )
    else:
        res = _attention(
            q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), softmax_scale, mask_type,
            left, right, bool(deterministic), bool(return_attn_probs)
        )
        if not return_attn_probs:
            return res
        out, lse = res
    return _flash_result(out, lse, q, return_attn_probs)


def _unpack(name, packed, count, varlen):
    """flash-attn's packed ``qkv`` / ``kv`` → ``count`` views along the packing dim, no copies. A gradient
    reaches the packed tensor through autograd's ``unbind``, which writes the views' gradients into one
    tensor of the packed shape."""
    _require_tensor(name, packed)
    heads = "nheads" if count == 3 else "nheads_k"
    layout = f"[total, {count}, {heads}, head_dim]" if varlen else f"[batch, seqlen, {count}, {heads}, head_dim]"
    dim = 1 if varlen else 2
    if packed.dim() != dim + 3 or packed.shape[dim] != count:
        raise ValueError(f"fmha: {name} must be {layout}, got shape {tuple(packed.shape)}")
    return packed.unbind(dim)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn's ``flash_attn_qkvpacked_func``: :func:`flash_attn_func` on ``qkv`` ``[b, s, 3, h, d]``
    (q, k, v are views of it, no copies; the gradient comes back as one ``dqkv`` of qkv's shape). Returns
    and refusals as :func:`flash_attn_func`."""
    q, k, v = _unpack("qkv", qkv, 3, varlen=False)
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs
    )


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn's ``flash_attn_kvpacked_func``: :func:`flash_attn_func` on q ``[b, s_q, h, d]`` and ``kv``
    ``[b, s_k, 2, h_k, d]`` (views, no copies; one ``dkv`` of kv's shape). Returns and refusals as
    :func:`flash_attn_func`."""
    k, v = _unpack("kv", kv, 2, varlen=False)
    return flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs
    )


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn's ``flash_attn_varlen_qkvpacked_func``: :func:`flash_attn_varlen_func` on ``qkv`` ``[total,
    3, h, d]`` with one ``cu_seqlens`` / ``max_seqlen`` for queries and keys (views, no copies; one ``dqkv``).
    Returns and refusals as :func:`flash_attn_varlen_func`."""
    q, k, v = _unpack("qkv", qkv, 3, varlen=True)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal, window_size,
        softcap, alibi_slopes, deterministic, return_attn_probs
    )


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash-attn's ``flash_attn_varlen_kvpacked_func``: :func:`flash_attn_varlen_func` on q ``[total_q, h,
    d]`` and ``kv`` ``[total_k, 2, h_k, d]`` (views, no copies; one ``dkv``). Returns and refusals as
    :func:`flash_attn_varlen_func`."""
    k, v = _unpack("kv", kv, 2, varlen=True)
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
        window_size, softcap, alibi_slopes, deterministic, return_attn_probs
    )


# --- registry queries ---------------------------------------------------------------------------------


def registry_supports(operation, dtype, hdim_q, hdim_v, masked, deterministic=False, instances=None) -> bool:
    """Whether this build's registry lists an instance serving the request, by fmha's selection rule (same
    operation, dtype, masked-ness and, for the backward, determinism; head dims at most the instance's and
    multiples of its ``hdim_multiple``).

    ``operation``: ``"fwd"``, ``"bwd"`` or ``"kvcache"``; ``dtype``: ``torch.float16``/``torch.bfloat16``
    (and for ``"fwd"`` and ``"kvcache"`` ``torch.float8_e4m3fn``/``torch.float8_e4m3fnuz``) or the registry's names
    ``"fp16"``/``"bf16"``/``"fp8_e4m3fn"``/``"fp8_e4m3fnuz"``.
    """
    if isinstance(dtype, torch.dtype):
        names = {torch.float16: "fp16", torch.bfloat16: "bf16"}
        for attr in ("float8_e4m3fn", "float8_e4m3fnuz"):
            if hasattr(torch, attr):
                names[getattr(torch, attr)] = "fp8_" + attr.removeprefix("float8_")
        dtype = names.get(dtype, str(dtype))
    instances = L.registry() if instances is None else instances
    for i in instances:
        if (
            i.get("operation") == operation
            and i.get("dtype") == dtype
            and bool(i.get("masked")) == bool(masked)
            and bool(i.get("deterministic")) == (bool(deterministic) and operation == "bwd")
            and hdim_q <= int(i.get("hdim_q", 0))
            and hdim_v <= int(i.get("hdim_v", 0))
            and hdim_q % max(1, int(i.get("hdim_multiple", 1) or 1)) == 0
            and hdim_v % max(1, int(i.get("hdim_multiple", 1) or 1)) == 0
        ):
            return True
    return False


__all__ = [
    "attention",
    "clear_launcher_cache",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "launcher_cache_info",
    "registry_supports",
]
