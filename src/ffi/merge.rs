//! The standalone merge of attention states (spec/inference.md §3.5): what ring/context parallelism,
//! chunked prefill across calls and cascade (shared-prefix) attention need.

use super::attention::fmha_tensor;
use super::runtime::fmha_stream_t;
use super::{boundary, fmha_status, read_extensible, Extensible};
use crate::error::Result;
use crate::merge::MergeArgs;
use crate::problem::merge::{LseBase, StateDtype};
use crate::runtime::Stream;

pub use crate::abi_values::{FMHA_LSE_BASE2, FMHA_LSE_NATURAL};

/// Merge arguments. Extensible: set `struct_size = sizeof(fmha_merge_args)`.
///
/// State s of (row r, head h) is `(O, LSE) = (o_in[s][h][r][0..hdim], lse_in[s][h][r])`, O normalised
/// over the state's own keys: `o_in` and `lse_in` are `fmha_tensor`s whose `batch_stride` is the state
/// stride (in elements, like every stride; the LSE's one column is its element). The merged state is
/// written to `o_out[h][r][0..hdim]` and `lse_out[h][r]` (their `batch_stride` is unused). flashinfer's
/// `v [seq][states][heads][d]` is `o_in = {v, heads * d, d, states * heads * d}`.
///
/// Per (row, head), in fp32 and in state order: `M = max LSE_s`, `w_s = exp(LSE_s - M)`,
/// `O = Σ w_s O_s / Σ w_s`, `LSE = M + log Σ w_s`, rounded once to `out_dtype`. An LSE of -inf or +inf
/// (the field's fill for an empty call) is an empty state of weight 0 whose O is not read; no state left
/// gives O = 0 and LSE = -inf; a NaN LSE makes the row NaN. Deterministic (bitwise reproducible); no
/// workspace.
///
/// Outputs share no byte with anything else, except that `o_out` may be state 0 of `o_in` exactly
/// (same `data`, `head_stride` and `row_stride`, `out_dtype == in_dtype`) and `lse_out` state 0 of
/// `lse_in` (same `data`, `head_stride` and `row_stride`): the merge is then done in place.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_merge_args {
    pub struct_size: usize,
    /// States per (row, head), >= 0.
    pub num_states: i32,
    /// Rows (tokens) and heads, >= 0.
    pub num_rows: i32,
    pub nhead: i32,
    /// Elements of a row of O, >= 1.
    pub hdim: i32,
    /// `FMHA_DTYPE_FP32`, `FMHA_DTYPE_BF16` or `FMHA_DTYPE_FP16`: the type of `o_in` and of `o_out`.
    pub in_dtype: i32,
    pub out_dtype: i32,
    /// `FMHA_LSE_NATURAL` (fmha's operations) or `FMHA_LSE_BASE2` (flashinfer's): the base of both
    /// `lse_in` and `lse_out`.
    pub lse_base: i32,
    /// `[num_states][nhead][num_rows][hdim]` by strides, columns contiguous.
    pub o_in: fmha_tensor,
    /// fp32 `[num_states][nhead][num_rows]` by strides (any row stride).
    pub lse_in: fmha_tensor,
    /// `[nhead][num_rows][hdim]` by head and row strides, columns contiguous.
    pub o_out: fmha_tensor,
    /// fp32 `[nhead][num_rows]` by head and row strides; `data` NULL: not written.
    pub lse_out: fmha_tensor,
}

// SAFETY: repr(C), begins with `struct_size`, every field is an integer or a raw pointer.
unsafe impl Extensible for fmha_merge_args {}

impl fmha_merge_args {
    fn to_args(self) -> Result<MergeArgs> {
        Ok(MergeArgs {
            num_states: i64::from(self.num_states),
            num_rows: i64::from(self.num_rows),
            nhead: i64::from(self.nhead),
            hdim: i64::from(self.hdim),
            in_dtype: StateDtype::from_i32(self.in_dtype, "in_dtype")?,
            out_dtype: StateDtype::from_i32(self.out_dtype, "out_dtype")?,
            lse_base: LseBase::from_i32(self.lse_base, "lse_base")?,
            o_in: self.o_in.to_tensor(),
            lse_in: self.lse_in.to_tensor(),
            o_out: self.o_out.to_tensor(),
            lse_out: self.lse_out.to_tensor(),
        })
    }
}

/// Enqueues the merge of attention states `args` describes on `stream` and returns once it is queued.
#[no_mangle]
pub extern "C" fn fmha_merge_attention_states(args: *const fmha_merge_args, stream: fmha_stream_t) -> fmha_status {
    boundary(|| {
        let args = read_extensible(args, "args")?.to_args()?;
        crate::merge::run(&args, Stream(stream as usize))
    })
}
