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

Install: ``pip install .`` in the repository root builds the crate's ``libfmha`` (a Rust toolchain is
needed) into the package. ``FMHA_BACKEND`` picks the backend it is built for: ``host`` (the default, CPU),
``cuda`` or ``rocm`` (the cargo features of those names, with their toolchains as for ``cargo build``), e.g.
``FMHA_BACKEND=cuda pip install .``.

The library is ``$FMHA_LIBRARY``, else the one inside this package (a wheel's ``libfmha.abi3.so``, or a
``libfmha.so.0``/``libfmha.so`` put there), else the system loader's. The ctypes layer (``version()``,
``backend()``, ``registry()``, the constants, :class:`FmhaError`) needs no PyTorch; the attention functions
and wrappers import it on first use.

On a GPU build the tensors are CUDA tensors and the work runs on PyTorch's current
stream; on the host backend (``fmha.backend() == fmha.BACKEND_HOST``) CPU tensors are used and each call
returns when its work is done. Every failed C call raises :class:`FmhaError` with fmha's status and message.

Environment: ``FMHA_LIBRARY`` (the library to load), ``FMHA_LAUNCHER_CACHE_SIZE`` (backward launchers kept,
least recently used dropped; default 32; on a GPU each keeps its workspace, one per stream, for the next
call: ``fmha.clear_launcher_cache()`` frees them), ``FMHA_PREPARE_METHOD`` (``auto``/``host``/``device``/``sync``: how
the backward prepares its workspace; default ``auto``, i.e. on the stream with no host synchronization,
and ``sync`` for batch mode on the host backend), ``FMHA_NATIVE_AUTOGRAD`` (the C++ autograd operator: unset, the
package's build for the running PyTorch when it has one; a path; ``0`` for the Python ``autograd.Function``;
``fmha.native_autograd()`` says which is used).
"""

import importlib

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
# The PyTorch layer loads on first use (PEP 562), so that the ctypes layer above works where PyTorch is
# not installed: a wheel's smoke test, or a process that only asks the library what it serves.
_TORCH_MODULES = ("kvcache", "merge", "ops")
_TORCH_NAMES = {
    "BatchDecodeWithPagedKVCacheWrapper": "kvcache",
    "BatchPrefillWithPagedKVCacheWrapper": "kvcache",
    "flash_attn_with_kvcache": "kvcache",
    "merge_state": "merge",
    "merge_states": "merge",
    "FmhaAttnFunc": "ops",
    "attention": "ops",
    "clear_launcher_cache": "ops",
    "flash_attn_func": "ops",
    "flash_attn_kvpacked_func": "ops",
    "flash_attn_qkvpacked_func": "ops",
    "flash_attn_varlen_func": "ops",
    "flash_attn_varlen_kvpacked_func": "ops",
    "flash_attn_varlen_qkvpacked_func": "ops",
    "launcher_cache_info": "ops",
    "native_autograd": "ops",
    "registry_supports": "ops",
}


def __getattr__(name):
    if name == "__version__":
        # The package is built from the crate, so its version is the library's (Cargo.toml's).
        try:
            return version()
        except OSError as e:
            raise AttributeError(f"fmha.__version__: {e}") from e
    module = _TORCH_NAMES.get(name) or (name if name in _TORCH_MODULES else None)
    if module is None:
        raise AttributeError(f"module 'fmha' has no attribute {name!r}")
    try:
        loaded = importlib.import_module(f".{module}", __name__)
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        raise ModuleNotFoundError(
            f"fmha.{name} needs PyTorch, which is not installed (fmha's ctypes layer works without it)",
            name="torch",
        ) from e
    value = loaded if module == name else getattr(loaded, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_TORCH_NAMES) | set(_TORCH_MODULES) | {"__version__"})


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
    "merge_state",
    "merge_states",
    "native_autograd",
    "registry",
    "registry_supports",
    "version",
]
