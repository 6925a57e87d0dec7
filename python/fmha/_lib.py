"""ctypes view of ``libfmha`` (``include/fmha.h``): library loading, the C structs, the function
prototypes and the status check.

Nothing here knows about PyTorch; :mod:`fmha.ops` builds on it.

Library lookup, first match wins:

1. ``$FMHA_LIBRARY`` (a path to ``libfmha.so``/``libfmha.so.0``; an error if it does not load);
2. inside this package's folder ``libfmha.abi3.so`` (what the wheel ships: setuptools-rust names the cdylib
   like an extension module, ``setup.py``), ``libfmha.so.0`` or ``libfmha.so``; then the last two in the
   folder above it;
3. the system loader (``LD_LIBRARY_PATH``, ``ldconfig``): ``libfmha.so.0``, then ``libfmha.so``.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_float,
    c_int32,
    c_size_t,
    c_uint32,
    c_void_p,
)

# --- constants (fmha.h) --------------------------------------------------------------------------------

DTYPE_FP16 = 0
DTYPE_BF16 = 1
DTYPE_FP32 = 2  # merged states and outputs; reserved for fp32 outputs of fp8 inputs (FMHA_ERR_UNSUPPORTED)
DTYPE_FP8_E4M3FN = 3  # OCP E4M3FN (NVIDIA sm_90, AMD gfx950): kv-cache inputs, bf16 output
DTYPE_FP8_E4M3FNUZ = 4  # E4M3FNUZ (AMD gfx942): kv-cache inputs, bf16 output

MASK_NONE = 0
MASK_TOP_LEFT = 1
MASK_BOTTOM_RIGHT = 2

BIAS_NONE = 0

PREPARE_AUTO = 0
PREPARE_HOST = 1
PREPARE_DEVICE = 2

MEMCPY_HOST_TO_DEVICE = 1
MEMCPY_DEVICE_TO_HOST = 2
MEMCPY_DEVICE_TO_DEVICE = 3

KV_CONTIGUOUS = 0  # one slot per sequence (flash-attn's k_cache [slots][cap][h_k][d] + cache_seqlens)
KV_BLOCK_TABLE = 1  # vLLM's / FA3's [batch][max_pages_per_seq] table + per-sequence lengths
KV_PAGE_CSR = 2  # SGLang's / flashinfer's kv_indptr, page_indices, last_page_len

KV_LAYOUT_STRIDED = 0  # pools addressed by page, row and head strides (NHD and HND)
KV_LAYOUT_VECTORIZED = 1  # CK's / vLLM-ROCm's 16-byte-vector order

KV_SCALE_TENSOR = 0  # fp8 K/V descales per tensor or per (sequence, kv head)
KV_SCALE_PAGE = 1  # fp8 K/V descales per (physical page, kv head)

LSE_NATURAL = 0  # natural-log LSEs (fmha's operations)
LSE_BASE2 = 1  # base-2 LSEs (flashinfer's)

BACKEND_HOST = 0
BACKEND_CUDA = 1
BACKEND_ROCM = 2
BACKEND_NAMES = {BACKEND_HOST: "host", BACKEND_CUDA: "cuda", BACKEND_ROCM: "rocm"}

OK = 0
ERR_INVALID_ARGUMENT = 1
ERR_UNSUPPORTED = 2
ERR_DEVICE_RUNTIME = 3
ERR_OUT_OF_MEMORY = 4
ERR_WORKSPACE_TOO_SMALL = 5
ERR_WORKSPACE_NOT_PREPARED = 6
ERR_NO_DEVICE = 7
ERR_NULL_POINTER = 8
ERR_INTERNAL = 9
ERR_ASYNC_FAILURE = 10

STATUS_NAMES = {
    OK: "FMHA_OK",
    ERR_INVALID_ARGUMENT: "FMHA_ERR_INVALID_ARGUMENT",
    ERR_UNSUPPORTED: "FMHA_ERR_UNSUPPORTED",
    ERR_DEVICE_RUNTIME: "FMHA_ERR_DEVICE_RUNTIME",
    ERR_OUT_OF_MEMORY: "FMHA_ERR_OUT_OF_MEMORY",
    ERR_WORKSPACE_TOO_SMALL: "FMHA_ERR_WORKSPACE_TOO_SMALL",
    ERR_WORKSPACE_NOT_PREPARED: "FMHA_ERR_WORKSPACE_NOT_PREPARED",
    ERR_NO_DEVICE: "FMHA_ERR_NO_DEVICE",
    ERR_NULL_POINTER: "FMHA_ERR_NULL_POINTER",
    ERR_INTERNAL: "FMHA_ERR_INTERNAL",
    ERR_ASYNC_FAILURE: "FMHA_ERR_ASYNC_FAILURE",
}


class FmhaError(RuntimeError):
    """A call into libfmha returned a status other than ``FMHA_OK``.

    ``status`` is the ``fmha_status`` value (compare with ``fmha.ERR_*``), ``message`` the library's
    message for the failed call (``fmha_last_error_message``, read on the calling thread), ``function``
    the C function that failed.
    """

    def __init__(self, status: int, message: str, function: str = ""):
        self.status = int(status)
        self.message = message
        self.function = function
        self.status_name = STATUS_NAMES.get(self.status, f"status {self.status}")
        where = f"{function}: " if function else ""
        super().__init__(f"{where}{self.status_name} ({self.status}): {message}")

    def __reduce__(self):  # picklable (pytest-xdist, multiprocessing)
        return (FmhaError, (self.status, self.message, self.function))


# --- structs -----------------------------------------------------------------------------------------


class fmha_tensor(Structure):
    """``[batch][head][row][column]`` strided view, columns contiguous, strides in elements (frozen)."""

    _fields_ = [
        ("data", c_void_p),
        ("batch_stride", ctypes.c_int64),
        ("head_stride", ctypes.c_int64),
        ("row_stride", ctypes.c_int64),
    ]


class _Extensible(Structure):
    """A struct whose first field is ``size_t struct_size``: set to ``sizeof`` on construction."""

    def __init__(self, **fields):
        super().__init__(**fields)
        self.struct_size = ctypes.sizeof(type(self))


class fmha_scale(Structure):
    """fp8 descales: ``data[b * batch_stride + g * head_stride + p * page_stride]`` (device fp32; NULL = 1)."""

    _fields_ = [
        ("data", c_void_p),
        ("batch_stride", ctypes.c_int64),
        ("head_stride", ctypes.c_int64),
        ("page_stride", ctypes.c_int64),
    ]


class fmha_fwd_traits(_Extensible):
    _fields_ = [
        ("struct_size", c_size_t),
        ("dtype", c_int32),
        ("hdim_q", c_int32),
        ("hdim_v", c_int32),
        ("is_group_mode", c_int32),
        ("mask_type", c_int32),
        ("bias_type", c_int32),
        ("has_dropout", c_int32),
        ("o_dtype", c_int32),
    ]


class fmha_fwd_args(_Extensible):
    _fields_ = [
        ("struct_size", c_size_t),
        ("q", fmha_tensor),
        ("k", fmha_tensor),
        ("v", fmha_tensor),
        ("o", fmha_tensor),
        ("lse", fmha_tensor),
        ("seqstart_q", c_void_p),
        ("seqstart_k", c_void_p),
        ("seqlen_q_ptr", c_void_p),
        ("seqlen_k_ptr", c_void_p),
        ("batch", c_int32),
        ("seqlen_q", c_int32),
        ("seqlen_k", c_int32),
        ("max_seqlen_q", c_int32),
        ("max_seqlen_k", c_int32),
        ("nhead_q", c_int32),
        ("nhead_k", c_int32),
        ("scale", c_float),
        ("window_size_left", c_int32),
        ("window_size_right", c_int32),
        ("q_descale", fmha_scale),
        ("k_descale", fmha_scale),
        ("v_descale", fmha_scale),
        ("workspace", c_void_p),  # the scheduler workspace (fmha_fwd_workspace_size bytes); NULL: none
        ("workspace_size", c_size_t),
    ]


class fmha_bwd_traits(_Extensible):
    _fields_ = [
        ("struct_size", c_size_t),
        ("seqlen_q", c_int32),
        ("seqlen_k", c_int32),
        ("batch", c_int32),
        ("max_seqlen_q", c_int32),
        ("max_seqlen_k", c_int32),
        ("hdim_q", c_int32),
        ("hdim_v", c_int32),
        ("nhead_q", c_int32),
        ("nhead_k", c_int32),
        ("dtype", c_int32),
        ("is_group_mode", c_int32),
        ("mask_type", c_int32),
        ("bias_type", c_int32),
        ("has_dbias", c_int32),
        ("has_dropout", c_int32),
        ("is_store_randval", c_int32),
        ("is_deterministic", c_int32),
        ("dq_scheme", ctypes.c_int64),  # FMHA_DQ_SCHEME_*; 0 = AUTO
    ]


class fmha_bwd_args(_Extensible):
    _fields_ = [
        ("struct_size", c_size_t),
        ("q", fmha_tensor),
        ("k", fmha_tensor),
        ("v", fmha_tensor),
        ("o", fmha_tensor),
        ("lse", fmha_tensor),
        ("d_o", fmha_tensor),
        ("d", fmha_tensor),
        ("dq", fmha_tensor),
        ("dk", fmha_tensor),
        ("dv", fmha_tensor),
        ("workspace", c_void_p),
        ("seqstart_q", c_void_p),
        ("seqstart_k", c_void_p),
        ("seqlen_q_ptr", c_void_p),
        ("seqlen_k_ptr", c_void_p),
        ("batch", c_int32),
        ("seqlen_q", c_int32),
        ("seqlen_k", c_int32),
        ("max_seqlen_q", c_int32),
        ("max_seqlen_k", c_int32),
        ("nhead_q", c_int32),
        ("nhead_k", c_int32),
        ("hdim_q", c_int32),
        ("hdim_v", c_int32),
        ("scale", c_float),
        ("window_size_left", c_int32),
        ("window_size_right", c_int32),
        ("workspace_size", c_size_t),
    ]


fmha_pinned_allocate_fn = ctypes.CFUNCTYPE(c_int32, c_void_p, c_size_t, POINTER(c_void_p))
fmha_pinned_free_fn = ctypes.CFUNCTYPE(None, c_void_p, c_void_p)


class fmha_pinned_allocator(_Extensible):
    _fields_ = [
        ("struct_size", c_size_t),
        ("user_data", c_void_p),
        ("allocate", fmha_pinned_allocate_fn),
        ("free", fmha_pinned_free_fn),
    ]


class fmha_kvcache_traits(_Extensible):
    """kv-cache dispatch key and the bounds every call of a launcher stays within (``fmha.h``)."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("dtype", c_int32),
        ("o_dtype", c_int32),
        ("hdim_q", c_int32),
        ("hdim_v", c_int32),
        ("nhead_q", c_int32),
        ("nhead_k", c_int32),
        ("is_group_mode", c_int32),
        ("mask_type", c_int32),
        ("has_lse", c_int32),
        ("kv_table_kind", c_int32),
        ("kv_layout", c_int32),
        ("kv_scale_granularity", c_int32),
        ("page_size", c_int32),
        ("batch", c_int32),
        ("total_q", c_int32),
        ("max_seqlen_q", c_int32),
        ("max_seqlen_k", c_int32),
        ("max_splits", c_int32),
        ("kv_split_tokens", c_int32),
        ("check_tables", c_int32),
    ]


class fmha_kvcache_args(_Extensible):
    """One kv-cache call's pointers, strides and lengths (``fmha.h``)."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("q", fmha_tensor),
        ("k", fmha_tensor),
        ("v", fmha_tensor),
        ("o", fmha_tensor),
        ("lse", fmha_tensor),
        ("seqstart_q", c_void_p),
        ("batch", c_int32),
        ("seqlen_q", c_int32),
        ("num_pages", c_int32),
        ("max_pages_per_seq", c_int32),
        ("num_page_indices", c_int32),
        ("seqlen_k", c_void_p),
        ("block_table", c_void_p),
        ("block_table_stride", ctypes.c_int64),
        ("kv_indptr", c_void_p),
        ("page_indices", c_void_p),
        ("last_page_len", c_void_p),
        ("cache_batch_idx", c_void_p),
        ("scale", c_float),
        ("window_size_left", c_int32),
        ("window_size_right", c_int32),
        ("q_descale", fmha_scale),
        ("k_descale", fmha_scale),
        ("v_descale", fmha_scale),
        ("workspace", c_void_p),
        ("workspace_size", c_size_t),
        # The run's scheduler workspace (fmha_kvcache_launcher_scheduler_workspace_size bytes); NULL: none.
        ("scheduler_workspace", c_void_p),
        ("scheduler_workspace_size", c_size_t),
    ]


class fmha_merge_args(_Extensible):
    _fields_ = [
        ("struct_size", c_size_t),
        ("num_states", c_int32),
        ("num_rows", c_int32),
        ("nhead", c_int32),
        ("hdim", c_int32),
        ("in_dtype", c_int32),
        ("out_dtype", c_int32),
        ("lse_base", c_int32),
        ("o_in", fmha_tensor),
        ("lse_in", fmha_tensor),
        ("o_out", fmha_tensor),
        ("lse_out", fmha_tensor),
    ]


# sizeof() of the C structs on LP64 Linux (x86-64, aarch64), as a C compiler reports them for fmha.h;
# checked at load time so that a drift between this file and the header fails at import instead of
# passing corrupted arguments.
_EXPECTED_SIZES = {
    fmha_tensor: 32,
    fmha_fwd_traits: 40,
    fmha_fwd_args: 352,
    fmha_bwd_traits: 88,
    fmha_bwd_args: 424,
    fmha_pinned_allocator: 32,
    fmha_kvcache_traits: 88,
    fmha_scale: 32,
    fmha_kvcache_args: 400,
    fmha_merge_args: 168,
}

# --- prototypes --------------------------------------------------------------------------------------

_launcher_p = c_void_p  # fmha_bwd_launcher* / fmha_kvcache_launcher* (opaque)
_stream_t = c_void_p

_PROTOTYPES = {
    "fmha_fwd": (c_int32, [POINTER(fmha_fwd_traits), POINTER(fmha_fwd_args), _stream_t]),
    "fmha_fwd_workspace_size": (c_int32, [POINTER(fmha_fwd_traits), POINTER(c_size_t)]),
    "fmha_registry_json": (c_int32, [c_char_p, c_size_t, POINTER(c_size_t)]),
    "fmha_bwd_launcher_create": (c_int32, [POINTER(fmha_bwd_traits), POINTER(_launcher_p)]),
    "fmha_bwd_launcher_destroy": (c_int32, [_launcher_p]),
    "fmha_bwd_launcher_workspace_size": (c_int32, [_launcher_p, POINTER(c_size_t)]),
    "fmha_bwd_launcher_prepare_workspace": (c_int32, [_launcher_p, c_void_p, c_size_t, c_void_p, c_void_p]),
    "fmha_bwd_launcher_run": (c_int32, [_launcher_p, POINTER(fmha_bwd_args), _stream_t]),
    "fmha_bwd_workspace_size_upper_bound": (c_int32, [POINTER(fmha_bwd_traits), POINTER(c_size_t)]),
    "fmha_bwd_launcher_prepare_workspace_async": (
        c_int32,
        [_launcher_p, c_void_p, c_size_t, c_void_p, c_void_p, _stream_t, POINTER(fmha_pinned_allocator), c_int32],
    ),
    "fmha_kvcache_launcher_create": (c_int32, [POINTER(fmha_kvcache_traits), POINTER(_launcher_p)]),
    "fmha_kvcache_launcher_destroy": (c_int32, [_launcher_p]),
    "fmha_kvcache_launcher_workspace_size": (c_int32, [_launcher_p, POINTER(c_size_t)]),
    "fmha_kvcache_launcher_scheduler_workspace_size": (c_int32, [_launcher_p, POINTER(c_size_t)]),
    "fmha_kvcache_workspace_size_upper_bound": (c_int32, [POINTER(fmha_kvcache_traits), POINTER(c_size_t)]),
    "fmha_kvcache_launcher_prepare_async": (c_int32, [_launcher_p, POINTER(fmha_kvcache_args), _stream_t]),
    "fmha_kvcache_launcher_run": (c_int32, [_launcher_p, POINTER(fmha_kvcache_args), _stream_t]),
    "fmha_kvcache_launcher_check": (c_int32, [_launcher_p, c_void_p, c_size_t, _stream_t]),
    "fmha_kvcache_fwd": (c_int32, [POINTER(fmha_kvcache_traits), POINTER(fmha_kvcache_args), _stream_t]),
    "fmha_merge_attention_states": (c_int32, [POINTER(fmha_merge_args), _stream_t]),
    "fmha_device_malloc": (c_int32, [POINTER(c_void_p), c_size_t]),
    "fmha_device_free": (c_int32, [c_void_p]),
    "fmha_memcpy": (c_int32, [c_void_p, c_void_p, c_size_t, c_int32]),
    "fmha_memcpy_async": (c_int32, [c_void_p, c_void_p, c_size_t, c_int32, _stream_t]),
    "fmha_memset": (c_int32, [c_void_p, c_int32, c_size_t]),
    "fmha_memset_async": (c_int32, [c_void_p, c_int32, c_size_t, _stream_t]),
    "fmha_stream_create": (c_int32, [POINTER(_stream_t)]),
    "fmha_stream_destroy": (c_int32, [_stream_t]),
    "fmha_stream_synchronize": (c_int32, [_stream_t]),
    "fmha_device_synchronize": (c_int32, []),
    "fmha_device_cu_count": (c_int32, [POINTER(c_int32)]),
    "fmha_load_kernels": (c_int32, []),
    "fmha_host_set_cu_count": (c_int32, [c_int32]),
    "fmha_status_string": (c_char_p, [c_int32]),
    "fmha_last_error_message": (c_size_t, [c_char_p, c_size_t]),
    "fmha_version": (c_char_p, []),
    "fmha_version_number": (c_uint32, []),
    "fmha_backend": (c_int32, []),
}

# --- loading -----------------------------------------------------------------------------------------

_lock = threading.Lock()
_lib = None
_lib_path = None


def _candidates():
    env = os.environ.get("FMHA_LIBRARY")
    if env:
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    paths = []
    for folder, names in (
        (here, ("libfmha.abi3.so", "libfmha.so.0", "libfmha.so")),
        (os.path.dirname(here), ("libfmha.so.0", "libfmha.so")),
    ):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.exists(path):
                paths.append(path)
    return paths + ["libfmha.so.0", "libfmha.so"], False


def library() -> ctypes.CDLL:
    """The loaded libfmha (loaded on first use), with prototypes set."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        candidates, from_env = _candidates()
        errors = []
        lib = None
        for path in candidates:
            try:
                lib = ctypes.CDLL(path)
                _lib_path = path
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
                if from_env:
                    break
        if lib is None:
            hint = (
                "FMHA_LIBRARY is set but does not load"
                if from_env
                else "install the package with its library (pip install . in fmha's repository), set "
                "FMHA_LIBRARY to the path of libfmha.so (e.g. target/release/libfmha.so), put libfmha.so.0 next "
                "to the fmha package, or add its folder to LD_LIBRARY_PATH"
            )
            raise OSError(f"fmha: cannot load libfmha ({hint}); tried: " + "; ".join(errors))
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        for struct, size in _EXPECTED_SIZES.items():
            if ctypes.sizeof(struct) != size:  # pragma: no cover - a platform we do not target
                raise ImportError(f"fmha: {struct.__name__} is {ctypes.sizeof(struct)} bytes, expected {size}")
        _lib = lib
        return lib


def library_path() -> str | None:
    """The path (or name) libfmha was loaded from, or None before the first call."""
    return _lib_path


def last_error_message() -> str:
    """``fmha_last_error_message`` of the calling thread (empty after a successful call)."""
    lib = library()
    n = lib.fmha_last_error_message(None, 0)
    if n == 0:
        return ""
    buf = ctypes.create_string_buffer(n + 1)
    lib.fmha_last_error_message(buf, n + 1)
    return buf.value.decode("utf-8", errors="replace")


def call(name: str, *args) -> None:
    """Calls ``name`` and raises :class:`FmhaError` on a status other than ``FMHA_OK``.

    ctypes makes the call and this function reads the message on the same OS thread, so the
    thread-local message belongs to this call.
    """
    status = getattr(library(), name)(*args)
    if status != OK:
        raise FmhaError(status, last_error_message(), name)


def status_string(status: int) -> str:
    return library().fmha_status_string(int(status)).decode()


def version() -> str:
    """The library's version string, e.g. ``"0.2.0"``."""
    return library().fmha_version().decode()


def version_number() -> int:
    return int(library().fmha_version_number())


def backend() -> int:
    """``BACKEND_HOST`` (0), ``BACKEND_CUDA`` (1) or ``BACKEND_ROCM`` (2)."""
    return int(library().fmha_backend())


def backend_name() -> str:
    return BACKEND_NAMES.get(backend(), f"unknown ({backend()})")


def registry() -> list:
    """The kernel instances of this build for the current device (``fmha_registry_json``, parsed)."""
    required = c_size_t(0)
    call("fmha_registry_json", None, 0, ctypes.byref(required))
    buf = ctypes.create_string_buffer(required.value + 1)
    call("fmha_registry_json", buf, required.value + 1, ctypes.byref(required))
    return json.loads(buf.value.decode())


def cu_count() -> int:
    count = c_int32(0)
    call("fmha_device_cu_count", ctypes.byref(count))
    return count.value


def load_kernels() -> None:
    """Loads fmha's kernels onto the current device now (``fmha_load_kernels``): call it at startup, while the
    GPU is idle, so that the first fmha call does not wait for work already queued on the device."""
    call("fmha_load_kernels")


def stream_synchronize(stream=None) -> None:
    call("fmha_stream_synchronize", stream)
