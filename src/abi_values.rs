//! The integer values of the C ABI's enumerations and status codes, defined here once: cbindgen emits
//! them into `include/fmha.h` (build.rs parses this file with `src/ffi/`), and the library's enums take
//! their discriminants and parsers from them (`abi_enum!`), so the header, the enums and the checks of
//! every input cannot disagree. Values are fixed: never renumbered, only appended (docs/abi.md).

/// `fmha_fwd_traits.dtype` / `fmha_bwd_traits.dtype`.
pub const FMHA_DTYPE_FP16: i32 = 0;
pub const FMHA_DTYPE_BF16: i32 = 1;
/// fp32: the states and the output of `fmha_merge_attention_states`; reserved for fp32 outputs of fp8
/// inputs (`o_dtype` of the forward traits), which answer FMHA_ERR_UNSUPPORTED.
pub const FMHA_DTYPE_FP32: i32 = 2;
/// fp8 e4m3 inputs, by format (the same byte means different values in the two): OCP E4M3FN (NVIDIA
/// sm_90, AMD gfx950; bias 7, max 448) and E4M3FNUZ (AMD gfx942; bias 8, max 240). The forward
/// operations take them (`fmha_fwd_traits.dtype`, `fmha_kvcache_traits.dtype`), the backward answers
/// FMHA_ERR_UNSUPPORTED; their output is bf16. The host backend computes both; a GPU build without a
/// kernel for the format answers FMHA_ERR_UNSUPPORTED naming `dtype` (kv-cache and dense
/// forward: sm_90a and gfx950 E4M3FN, gfx942 E4M3FNUZ).
pub const FMHA_DTYPE_FP8_E4M3FN: i32 = 3;
pub const FMHA_DTYPE_FP8_E4M3FNUZ: i32 = 4;

/// `mask_type`: no mask; causal or sliding window aligned to the top-left corner; aligned to the
/// bottom-right corner (flash-attn's causal). A window is `window_size_left/right` (-1 = unbounded);
/// causal is left = -1, right = 0.
pub const FMHA_MASK_NONE: i32 = 0;
pub const FMHA_MASK_TOP_LEFT: i32 = 1;
pub const FMHA_MASK_BOTTOM_RIGHT: i32 = 2;

/// `bias_type` (only NONE is supported so far; others answer FMHA_ERR_UNSUPPORTED).
pub const FMHA_BIAS_NONE: i32 = 0;
pub const FMHA_BIAS_ELEMENTWISE: i32 = 1;
pub const FMHA_BIAS_ALIBI: i32 = 2;

/// `fmha_bwd_traits.dq_scheme`: how a deterministic backward sums dQ (non-deterministic runs ignore it).
/// AUTO: the library's choice for the device and shape (docs/perf.md's measurements); SPLIT_SLOTS: every
/// persistent workgroup sums into split slots of its own, which convert_dq adds in a fixed order (CK's
/// scheme; every backend); ORDERED: the work units add into one accumulator, taking turns per q tile
/// in a fixed order (FlashAttention-3's scheme; NVIDIA sm_90a and the host backend, elsewhere
/// FMHA_ERR_UNSUPPORTED). Both are bitwise reproducible; they round differently.
pub const FMHA_DQ_SCHEME_AUTO: i32 = 0;
pub const FMHA_DQ_SCHEME_SPLIT_SLOTS: i32 = 1;
pub const FMHA_DQ_SCHEME_ORDERED: i32 = 2;

/// `fmha_bwd_launcher_prepare_workspace_async` methods.
pub const FMHA_PREPARE_AUTO: i32 = 0;
pub const FMHA_PREPARE_HOST: i32 = 1;
pub const FMHA_PREPARE_DEVICE: i32 = 2;

/// `fmha_memcpy` directions.
pub const FMHA_MEMCPY_HOST_TO_DEVICE: i32 = 1;
pub const FMHA_MEMCPY_DEVICE_TO_HOST: i32 = 2;
pub const FMHA_MEMCPY_DEVICE_TO_DEVICE: i32 = 3;

/// `fmha_backend()`.
pub const FMHA_BACKEND_HOST: i32 = 0;
pub const FMHA_BACKEND_CUDA: i32 = 1;
pub const FMHA_BACKEND_ROCM: i32 = 2;

/// `fmha_kvcache_traits.kv_table_kind`: how a sequence's KV tokens are found in the cache. CONTIGUOUS:
/// one slot per sequence (flash-attn's `k_cache [slots][cap][h_k][d]` + `cache_seqlens`); BLOCK_TABLE:
/// vLLM's / FA3's `[batch][max_pages_per_seq]` table + per-sequence lengths; PAGE_CSR: SGLang's /
/// flashinfer's `kv_indptr`, `page_indices`, `last_page_len`.
pub const FMHA_KV_CONTIGUOUS: i32 = 0;
pub const FMHA_KV_BLOCK_TABLE: i32 = 1;
pub const FMHA_KV_PAGE_CSR: i32 = 2;

/// `fmha_kvcache_traits.kv_layout`: STRIDED pools are addressed by page, row and head strides (NHD and
/// HND); VECTORIZED is CK's / vLLM-ROCm's byte order with 16-byte vectors along the head dimension (K)
/// and the page (V).
pub const FMHA_KV_LAYOUT_STRIDED: i32 = 0;
pub const FMHA_KV_LAYOUT_VECTORIZED: i32 = 1;

/// `fmha_kvcache_traits.kv_scale_granularity`: the K/V descales of fp8 caches are one value per tensor
/// or per (sequence, kv head) (`fmha_scale` strides), or one per (physical page, kv head) (CK's KV
/// block scale; needs a paged table kind). The sm_90a kernels take per-page descales for pages of a
/// multiple of their fp8 key tile (128 tokens), the gfx942/gfx950 kernels for pages of a multiple of 64:
/// FMHA_ERR_UNSUPPORTED otherwise.
pub const FMHA_KV_SCALE_TENSOR: i32 = 0;
pub const FMHA_KV_SCALE_PAGE: i32 = 1;

/// `fmha_merge_args.lse_base`: the base of the logarithm of the LSEs a merge reads and writes. fmha's
/// operations write natural-log LSEs; flashinfer's are base 2 (`log2 Σ exp2(s)` of scores scaled by
/// log2 e).
pub const FMHA_LSE_NATURAL: i32 = 0;
pub const FMHA_LSE_BASE2: i32 = 1;

/// `fmha_status` values: `FMHA_OK`, or the error of a failed call.
pub const FMHA_OK: i32 = 0;
pub const FMHA_ERR_INVALID_ARGUMENT: i32 = 1;
pub const FMHA_ERR_UNSUPPORTED: i32 = 2;
pub const FMHA_ERR_DEVICE_RUNTIME: i32 = 3;
pub const FMHA_ERR_OUT_OF_MEMORY: i32 = 4;
pub const FMHA_ERR_WORKSPACE_TOO_SMALL: i32 = 5;
pub const FMHA_ERR_WORKSPACE_NOT_PREPARED: i32 = 6;
pub const FMHA_ERR_NO_DEVICE: i32 = 7;
pub const FMHA_ERR_NULL_POINTER: i32 = 8;
pub const FMHA_ERR_INTERNAL: i32 = 9;
pub const FMHA_ERR_ASYNC_FAILURE: i32 = 10;

/// Defines an `i32` enum whose variants carry ABI values (the constants above), with `ALL` (every
/// variant, in declaration order), `name()` (the short name of each value) and `parse(value)` (the
/// variant of an ABI value, or `None`). `from_i32` lives beside each enum: what an unknown value means
/// (invalid, or a named-but-unsupported value) is the enum's business.
macro_rules! abi_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $value:path => $text:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[repr(i32)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The variant with this ABI value.
            pub fn parse(value: i32) -> Option<$name> {
                Self::ALL.iter().copied().find(|v| *v as i32 == value)
            }

            /// The value's short name.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// "0 = a, 1 = b, ...": the valid values, for messages.
            pub fn choices() -> String {
                Self::ALL.iter().map(|v| format!("{} = {}", *v as i32, v.name())).collect::<Vec<_>>().join(", ")
            }
        }
    };
}
pub(crate) use abi_enum;
