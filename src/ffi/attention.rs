//! Types shared by the forward and backward C APIs, and the forward entry point.

use super::{boundary, flag, fmha_status, read_extensible, Extensible};
use crate::error::{Error, Result};
use crate::fwd::{FwdArgs, FwdTraits};
use crate::problem::mask::MaskType;
use crate::problem::{BiasType, Dtype, Mode, SequenceArrays, Tensor};
use crate::runtime::{DeviceAddr, DevicePtr, Stream};
use std::ffi::{c_char, c_void};

use super::runtime::fmha_stream_t;

pub use crate::abi_values::{
    FMHA_BIAS_ALIBI, FMHA_BIAS_ELEMENTWISE, FMHA_BIAS_NONE, FMHA_DTYPE_BF16, FMHA_DTYPE_FP16, FMHA_MASK_BOTTOM_RIGHT,
    FMHA_MASK_NONE, FMHA_MASK_TOP_LEFT,
};

/// A strided tensor `[batch][head][row][column]` in device memory, columns contiguous, strides in
/// elements and non-negative (0 broadcasts an input along that dimension). In group (varlen) mode
/// `batch_stride` is ignored: batch b starts at row `seqstart[b]`. The elements the shape covers must
/// lie in one allocation: `data` plus the extent in bytes may not overflow the address space. Output
/// tensors may not share an element with each other or with an input (they may interleave, e.g. as
/// views of one packed buffer), nor overlap themselves. This struct is frozen (embedded in others);
/// it never grows.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_tensor {
    pub data: *mut c_void,
    pub batch_stride: i64,
    pub head_stride: i64,
    pub row_stride: i64,
}

impl fmha_tensor {
    pub(crate) fn to_tensor(self) -> Tensor {
        Tensor {
            ptr: DeviceAddr(self.data as usize),
            batch_stride: self.batch_stride,
            head_stride: self.head_stride,
            row_stride: self.row_stride,
        }
    }
}

/// Forward dispatch key. Extensible: set `struct_size = sizeof(fmha_fwd_traits)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_fwd_traits {
    pub struct_size: usize,
    /// `FMHA_DTYPE_*` of q, k, v, o.
    pub dtype: i32,
    pub hdim_q: i32,
    pub hdim_v: i32,
    /// 0 = batch mode, 1 = group (varlen) mode.
    pub is_group_mode: i32,
    /// `FMHA_MASK_*`.
    pub mask_type: i32,
    /// `FMHA_BIAS_*`.
    pub bias_type: i32,
    /// 1 requests dropout (not supported yet: answers FMHA_ERR_UNSUPPORTED); 0 or 1.
    pub has_dropout: i32,
}

// SAFETY: repr(C), begins with `struct_size`, every field is an integer.
unsafe impl Extensible for fmha_fwd_traits {
    const FIRST_VERSION_SIZE: usize = 40;
}

/// Forward arguments. Extensible: set `struct_size = sizeof(fmha_fwd_args)`.
///
/// Lengths: batch mode uses `seqlen_q/k` for every batch; group mode passes total physical rows in
/// `seqlen_q/k`, the physical offsets `seqstart_q/k` (`[batch + 1]`, device int32), optional logical
/// lengths `seqlen_q_ptr/seqlen_k_ptr` (`[batch]`, device int32, ≤ physical) and upper bounds
/// `max_seqlen_q/k` of the per-batch physical lengths.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_fwd_args {
    pub struct_size: usize,
    pub q: fmha_tensor,
    pub k: fmha_tensor,
    pub v: fmha_tensor,
    pub o: fmha_tensor,
    /// fp32 natural-log LSE `[batch][nhead_q][seqlen_q]`, `row_stride` must be 1 (group mode:
    /// `[nhead_q][total_q]`). `data = NULL` skips it.
    pub lse: fmha_tensor,
    pub seqstart_q: *const i32,
    pub seqstart_k: *const i32,
    pub seqlen_q_ptr: *const i32,
    pub seqlen_k_ptr: *const i32,
    pub batch: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub max_seqlen_q: i32,
    pub max_seqlen_k: i32,
    pub nhead_q: i32,
    pub nhead_k: i32,
    /// Softmax scale; 0 selects `1 / sqrt(hdim_q)`.
    pub scale: f32,
    pub window_size_left: i32,
    pub window_size_right: i32,
}

// SAFETY: repr(C), begins with `struct_size`, every field is an integer, a float or a raw pointer.
unsafe impl Extensible for fmha_fwd_args {
    const FIRST_VERSION_SIZE: usize = 240;
}

pub(crate) fn mask_type(value: i32) -> Result<MaskType> {
    MaskType::from_i32(value)
}

impl fmha_fwd_traits {
    pub(crate) fn to_traits(self) -> Result<FwdTraits> {
        Ok(FwdTraits {
            dtype: Dtype::from_i32(self.dtype, "dtype")?,
            hdim_q: i64::from(self.hdim_q),
            hdim_v: i64::from(self.hdim_v),
            mode: Mode::from_flag(self.is_group_mode, "is_group_mode")?,
            mask_type: mask_type(self.mask_type)?,
            bias_type: BiasType::from_i32(self.bias_type)?,
            has_dropout: flag(self.has_dropout, "has_dropout")?,
        })
    }
}

impl fmha_fwd_args {
    pub(crate) fn to_args(self) -> Result<FwdArgs> {
        Ok(FwdArgs {
            q: self.q.to_tensor(),
            k: self.k.to_tensor(),
            v: self.v.to_tensor(),
            o: self.o.to_tensor(),
            lse: self.lse.to_tensor(),
            sequences: SequenceArrays {
                seqstart_q: DevicePtr::new(self.seqstart_q as usize),
                seqstart_k: DevicePtr::new(self.seqstart_k as usize),
                seqlen_q: DevicePtr::new(self.seqlen_q_ptr as usize),
                seqlen_k: DevicePtr::new(self.seqlen_k_ptr as usize),
            },
            batch: i64::from(self.batch),
            seqlen_q: i64::from(self.seqlen_q),
            seqlen_k: i64::from(self.seqlen_k),
            max_seqlen_q: i64::from(self.max_seqlen_q),
            max_seqlen_k: i64::from(self.max_seqlen_k),
            nhead_q: i64::from(self.nhead_q),
            nhead_k: i64::from(self.nhead_k),
            scale: self.scale,
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
        })
    }
}

/// Runs attention forward on `stream`: O = softmax(scale · Q Kᵀ + mask) V and the natural-log LSE.
/// Returns once the work is queued; errors found while it runs are reported by the next synchronize.
#[no_mangle]
pub extern "C" fn fmha_fwd(
    traits: *const fmha_fwd_traits,
    args: *const fmha_fwd_args,
    stream: fmha_stream_t,
) -> fmha_status {
    boundary(|| {
        let traits = read_extensible(traits, "traits")?.to_traits()?;
        let args = read_extensible(args, "args")?.to_args()?;
        crate::fwd::run(&traits, &args, Stream(stream as usize))
    })
}

/// Writes the kernel instances of this build for the current device as a JSON array into `buffer`
/// (NUL-terminated, truncated to `length - 1` bytes) and the full length (without NUL) into
/// `*required`. `buffer` may be NULL to ask for the length.
#[no_mangle]
pub extern "C" fn fmha_registry_json(buffer: *mut c_char, length: usize, required: *mut usize) -> fmha_status {
    boundary(|| {
        if required.is_null() {
            return Err(Error::null("required"));
        }
        let arch = crate::runtime::current()?.arch()?;
        let json = crate::registry::to_json(&crate::registry::instances(arch));
        super::write_out(required, "required", json.len())?;
        super::copy_c_string(&json, buffer, length);
        Ok(())
    })
}
