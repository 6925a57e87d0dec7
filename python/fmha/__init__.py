"""fmha for Python: a ctypes binding of libfmha's C ABI (``include/fmha.h``) and PyTorch autograd functions
with flash-attn's names and semantics.

    import fmha
    out = fmha.flash_attn_func(q, k, v, causal=True)                     # q [b, s, h, d], k/v [b, s_k, h_k, d]
    out = fmha.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)  # [total, h, d], int32 cu_seqlens
    out = fmha.flash_attn_qkvpacked_func(qkv, causal=True)    # qkv [b, s, 3, h, d]; kv [b, s_k, 2, h_k, d] etc.
    out = fmha.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, page_table=table)
    wrapper = fmha.BatchPrefillWithPagedKVCacheWrapper(kv_layout="NHD")   # flashinfer's paged prefill
    wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, h, h_k, d, page_size, causal=True)
    out = wrapper.run(q, (k_cache, v_cache))                              # per layer, no host sync
    decode = fmha.BatchDecodeWithPagedKVCacheWrapper(kv_layout="NHD")     # flashinfer's decode (split-KV)
    v, s = fmha.merge_states(v, s)            # flashinfer's: v [seq, states, h, d], s [seq, states, h] fp32
    v, s = fmha.merge_state(v_a, s_a, v_b, s_b, lse_base=2)   # two states; flashinfer's LSEs are base 2

The library is ``$FMHA_LIBRARY``, else ``libfmha.so.0``/``libfmha.so`` next to this package, else the
system loader's. On a GPU build the tensors are CUDA tensors and the work runs on PyTorch's current
stream; on the host backend (``fmha.backend() == fmha.BACKEND_HOST``) CPU tensors are used and each call
returns when its work is done. Every failed C call raises :class:`FmhaError` with fmha's status and message.

Environment: ``FMHA_LIBRARY`` (the library to load), ``FMHA_LAUNCHER_CACHE_SIZE`` (backward launchers kept,
least recently used dropped; default 32), ``FMHA_PREPARE_METHOD`` (``auto``/``host``/``device``/``sync``: how
the backward prepares its workspace; default ``auto``, i.e. on the stream with no host synchronization,
and ``sync`` for batch mode on the host backend).
"""

from ._lib import (  # noqa: F401
    BACKEND_CUDA,
    BACKEND_HOST,
    BACKEND_ROCM,
    DTYPE_BF16,
    DTYPE_FP16,
    DTYPE_FP32,
    DTYPE_FP8_E4M3FN,
    DTYPE_FP8_E4M3FNUZ,
    ERR_ASYNC_FAILURE,
    ERR_DEVICE_RUNTIME,
    ERR_INTERNAL,
    ERR_INVALID_ARGUMENT,
    ERR_NO_DEVICE,
    ERR_NULL_POINTER,
    ERR_OUT_OF_MEMORY,
    ERR_UNSUPPORTED,
    ERR_WORKSPACE_NOT_PREPARED,
    ERR_WORKSPACE_TOO_SMALL,
    KV_BLOCK_TABLE,
    KV_CONTIGUOUS,
    KV_LAYOUT_STRIDED,
    KV_LAYOUT_VECTORIZED,
    KV_PAGE_CSR,
    KV_SCALE_PAGE,
    KV_SCALE_TENSOR,
    LSE_BASE2,
    LSE_NATURAL,
    MASK_BOTTOM_RIGHT,
    MASK_NONE,
    MASK_TOP_LEFT,
    OK,
    PREPARE_AUTO,
    PREPARE_DEVICE,
    PREPARE_HOST,
    FmhaError,
    backend,
    backend_name,
    cu_count,
    last_error_message,
    library,
    library_path,
    load_kernels,
    registry,
    status_string,
    version,
    version_number,
)
from .kvcache import (  # noqa: F401
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    flash_attn_with_kvcache,
)
from .merge import merge_state, merge_states  # noqa: F401
from .ops import (  # noqa: F401
    FmhaAttnFunc,
    attention,
    clear_launcher_cache,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    launcher_cache_info,
    registry_supports,
)

__version__ = "0.2.0"

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "FmhaError",
    "attention",
    "backend",
    "backend_name",
    "clear_launcher_cache",
    "cu_count",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "launcher_cache_info",
    "load_kernels",
    "registry",
    "registry_supports",
    "version",
]
