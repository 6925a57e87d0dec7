//! Types shared by the forward and backward C APIs, and the forward entry point.

use super::{boundary, flag, fmha_status, read_extensible, write_out, Extensible};
use crate::abi_values::FMHA_DTYPE_FP32;
use crate::error::{Error, Result};
use crate::fwd::{FwdArgs, FwdTraits};
use crate::problem::mask::MaskType;
use crate::problem::scale::Descale;
use crate::problem::{BiasType, CacheDtype, Mode, SequenceArrays, Tensor};
use crate::runtime::{DeviceAddr, DevicePtr, Stream};
use std::ffi::{c_char, c_void};

use super::runtime::fmha_stream_t;

pub use crate::abi_values::{
    FMHA_BIAS_ALIBI, FMHA_BIAS_ELEMENTWISE, FMHA_BIAS_NONE, FMHA_DTYPE_BF16, FMHA_DTYPE_FP16, FMHA_DTYPE_FP8_E4M3FN,
    FMHA_DTYPE_FP8_E4M3FNUZ, FMHA_MASK_BOTTOM_RIGHT, FMHA_MASK_NONE, FMHA_MASK_TOP_LEFT,
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

/// fp8 descales (device fp32, positive and finite): the descale of (sequence b, kv head g, physical
/// page p) is `data[b * batch_stride + g * head_stride + p * page_stride]`; `data` NULL means 1.
/// Query heads use their kv head's descale. `page_stride` only with `FMHA_KV_SCALE_PAGE` (a kv
/// cache's K and V), where `batch_stride` must be 0; the dense forward's descales are per tensor
/// (strides 0) or per (sequence, kv head). aiter's packed `[num_pages][h_k][2]` tensor is
/// `k = {base, 0, 2, 2 * h_k}`, `v = {base + 1, 0, 2, 2 * h_k}`. Frozen (embedded in other structs).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_scale {
    pub data: *const f32,
    pub batch_stride: i64,
    pub head_stride: i64,
    pub page_stride: i64,
}

/// No descales (every value 1): what fp16/bf16 calls pass.
impl Default for fmha_scale {
    fn default() -> fmha_scale {
        fmha_scale { data: std::ptr::null(), batch_stride: 0, head_stride: 0, page_stride: 0 }
    }
}

impl fmha_scale {
    pub(crate) fn to_descale(self) -> Descale {
        Descale {
            data: DevicePtr::new(self.data as usize),
            batch_stride: self.batch_stride,
            head_stride: self.head_stride,
            page_stride: self.page_stride,
        }
    }
}

/// The element type of q, k and v (`traits.dtype`), and for fp8 inputs the output type
/// (`traits.o_dtype`), which must be bf16 (fp32 is reserved). Other inputs write o in their own type.
pub(crate) fn input_dtype(dtype: i32, o_dtype: i32) -> Result<CacheDtype> {
    let dtype = CacheDtype::from_i32(dtype, "dtype")?;
    if matches!(dtype, CacheDtype::Fp8(_)) {
        match o_dtype {
            FMHA_DTYPE_BF16 => {}
            FMHA_DTYPE_FP32 => {
                return Err(Error::unsupported("o_dtype: fp32 outputs are not supported (pass FMHA_DTYPE_BF16)"))
            }
            other => {
                return Err(Error::invalid("o_dtype", format!("{other}: fp8 inputs write bf16 (FMHA_DTYPE_BF16)")))
            }
        }
    }
    Ok(dtype)
}

/// Forward dispatch key. Extensible: set `struct_size = sizeof(fmha_fwd_traits)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_fwd_traits {
    pub struct_size: usize,
    /// `FMHA_DTYPE_*` of q, k and v: fp16, bf16, or an fp8 format (`FMHA_DTYPE_FP8_E4M3FN`,
    /// `FMHA_DTYPE_FP8_E4M3FNUZ`: forward only). o has the input type, or `o_dtype` for fp8.
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
    /// The output type, read only for fp8 inputs: `FMHA_DTYPE_BF16` (fp32 is reserved). (Read only
    /// then because the first version's size already covered these bytes as padding.)
    pub o_dtype: i32,
}

// SAFETY: repr(C), begins with `struct_size`, every field is an integer.
unsafe impl Extensible for fmha_fwd_traits {}

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
    /// fp8 descales, per tensor (strides 0) or per (sequence, kv head) (`page_stride` must be 0); all
    /// zero (NULL data) for fp16/bf16. O = softmax(scale · dq · dk · q̂ k̂ᵀ) · dv · v̂ on the codes q̂, k̂, v̂.
    pub q_descale: fmha_scale,
    pub k_descale: fmha_scale,
    pub v_descale: fmha_scale,
    /// Added in 0.3: an optional scheduler workspace, `fmha_fwd_workspace_size` bytes of device memory
    /// (16-byte aligned); NULL: none. With it, sm_90a calls whose tiles differ in cost (masked ones) run a
    /// persistent grid that takes tiles from a counter in it (the call zeroes it on `stream` first, so its
    /// contents on entry do not matter); without it, one CTA per tile. Like any buffer it serves one call
    /// at a time: calls that may overlap in time (on other streams, from other threads even on one
    /// stream, graphs replayed concurrently) need their own. It may share no byte with the tensors or
    /// the descales. The host backend checks it and does not use it.
    pub workspace: *mut c_void,
    /// Added in 0.3: the bytes at `workspace` (ignored when it is NULL); at least
    /// `fmha_fwd_workspace_size`.
    pub workspace_size: usize,
}

// SAFETY: repr(C), begins with `struct_size`, every field is an integer, a float or a raw pointer.
unsafe impl Extensible for fmha_fwd_args {
    /// The struct of 0.1 and 0.2, up to `window_size_right` (before the fp8 descales); the struct with
    /// the fp8 descales, up to `v_descale` (before the scheduler workspace).
    const EARLIER_VERSION_SIZES: &'static [usize] = &[240, 336];
}

pub(crate) fn mask_type(value: i32) -> Result<MaskType> {
    MaskType::from_i32(value)
}

impl fmha_fwd_traits {
    pub(crate) fn to_traits(self) -> Result<FwdTraits> {
        Ok(FwdTraits {
            dtype: input_dtype(self.dtype, self.o_dtype)?,
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
            q_descale: self.q_descale.to_descale(),
            k_descale: self.k_descale.to_descale(),
            v_descale: self.v_descale.to_descale(),
            workspace: DevicePtr::new(self.workspace as usize),
            workspace_size: self.workspace_size,
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

/// Writes into `*bytes` the size of the scheduler workspace `fmha_fwd_args.workspace` that a forward
/// with `traits` takes (16 bytes today, on every backend; ask rather than assume it). The traits are
/// validated as `fmha_fwd` validates them (the same status and message); nothing else is read, and no
/// device is needed. A workspace serves any number of forward calls, one at a time (see
/// `fmha_fwd_args.workspace`).
#[no_mangle]
pub extern "C" fn fmha_fwd_workspace_size(traits: *const fmha_fwd_traits, bytes: *mut usize) -> fmha_status {
    boundary(|| {
        let traits = read_extensible(traits, "traits")?.to_traits()?;
        write_out(bytes, "bytes", crate::fwd::workspace_size(&traits)?)
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
        super::write_json(&crate::registry::to_json(&crate::registry::instances(arch)), buffer, length, required)
    })
}

/// Writes what `fmha_fwd(traits, args, stream)` would launch on the current device as JSON into
/// `buffer`, as `fmha_registry_json` does: `{"operation":"fwd","arch":…,"stages":[{"kernel":"fwd",
/// "instance":{…},"note":null}]}` with the instance as `fmha_registry_json` lists it. The arguments are
/// validated as `fmha_fwd` validates them (the same status and message); nothing is launched and no
/// memory is read.
#[no_mangle]
pub extern "C" fn fmha_fwd_plan_json(
    traits: *const fmha_fwd_traits,
    args: *const fmha_fwd_args,
    buffer: *mut c_char,
    length: usize,
    required: *mut usize,
) -> fmha_status {
    boundary(|| {
        if required.is_null() {
            return Err(Error::null("required"));
        }
        let traits = read_extensible(traits, "traits")?.to_traits()?;
        let args = read_extensible(args, "args")?.to_args()?;
        super::write_json(&crate::fwd::plan(&traits, &args)?.to_json(), buffer, length, required)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::last_error;
    use crate::ffi::status::{FMHA_ERR_NO_DEVICE, FMHA_ERR_NULL_POINTER, FMHA_OK};
    use std::ptr::{null, null_mut};

    fn traits() -> fmha_fwd_traits {
        fmha_fwd_traits {
            struct_size: std::mem::size_of::<fmha_fwd_traits>(),
            dtype: FMHA_DTYPE_BF16,
            hdim_q: 128,
            hdim_v: 128,
            is_group_mode: 0,
            mask_type: FMHA_MASK_NONE,
            bias_type: FMHA_BIAS_NONE,
            has_dropout: 0,
            o_dtype: 0,
        }
    }

    #[test]
    fn workspace_size_is_the_constant_for_every_valid_traits() {
        for (dtype, o_dtype) in [(FMHA_DTYPE_FP16, 0), (FMHA_DTYPE_BF16, 0), (FMHA_DTYPE_FP8_E4M3FN, FMHA_DTYPE_BF16)] {
            for (hdim_q, hdim_v) in [(1, 1), (64, 64), (128, 128), (192, 128), (256, 256)] {
                for (mask_type, is_group_mode) in
                    [(FMHA_MASK_NONE, 0), (FMHA_MASK_TOP_LEFT, 1), (FMHA_MASK_BOTTOM_RIGHT, 1)]
                {
                    let t = fmha_fwd_traits { dtype, o_dtype, hdim_q, hdim_v, mask_type, is_group_mode, ..traits() };
                    let mut bytes = 0;
                    assert_eq!(fmha_fwd_workspace_size(&t, &mut bytes), FMHA_OK, "{t:?}: {}", last_error());
                    assert_eq!(bytes, 16); // (workspace::SCHEDULER_WORKSPACE_BYTES: the header's 16 bytes)
                }
            }
        }
    }

    /// Null pointers are named; bad traits get the status and message `fmha_fwd` gives them, and
    /// nothing is written.
    #[test]
    fn workspace_size_refuses_the_traits_fmha_fwd_refuses() {
        let mut bytes = 7;
        assert_eq!(fmha_fwd_workspace_size(null(), &mut bytes), FMHA_ERR_NULL_POINTER);
        assert!(last_error().starts_with("traits"), "{}", last_error());
        assert_eq!(fmha_fwd_workspace_size(&traits(), null_mut()), FMHA_ERR_NULL_POINTER);
        assert!(last_error().starts_with("bytes"), "{}", last_error());
        assert_eq!(bytes, 7);
        // Arguments that are never reached: each call stops at the traits.
        // SAFETY: all-zero bytes are a valid fmha_fwd_args (integers, floats, raw pointers).
        let args = fmha_fwd_args { struct_size: std::mem::size_of::<fmha_fwd_args>(), ..unsafe { std::mem::zeroed() } };
        let t = traits();
        for bad in [
            fmha_fwd_traits { struct_size: 8, ..t },
            fmha_fwd_traits { dtype: 7, ..t },
            fmha_fwd_traits { dtype: crate::abi_values::FMHA_DTYPE_FP32, ..t },
            fmha_fwd_traits { dtype: FMHA_DTYPE_FP8_E4M3FN, o_dtype: FMHA_DTYPE_FP16, ..t },
            fmha_fwd_traits { dtype: FMHA_DTYPE_FP8_E4M3FN, o_dtype: crate::abi_values::FMHA_DTYPE_FP32, ..t },
            fmha_fwd_traits { hdim_q: 0, ..t },
            fmha_fwd_traits { hdim_v: 257, ..t },
            fmha_fwd_traits { is_group_mode: -1, ..t },
            fmha_fwd_traits { mask_type: 3, ..t },
            fmha_fwd_traits { mask_type: 4, ..t },
            fmha_fwd_traits { bias_type: FMHA_BIAS_ALIBI, ..t },
            fmha_fwd_traits { bias_type: FMHA_BIAS_ELEMENTWISE, ..t },
            fmha_fwd_traits { bias_type: -1, ..t },
            fmha_fwd_traits { has_dropout: 1, ..t },
            fmha_fwd_traits { has_dropout: 2, ..t },
        ] {
            let status = fmha_fwd_workspace_size(&bad, &mut bytes);
            let message = last_error();
            assert_ne!(status, FMHA_OK, "{bad:?}");
            assert_eq!(bytes, 7, "{bad:?}: written on failure");
            let fwd_status = fmha_fwd(&bad, &args, null_mut());
            if fwd_status != FMHA_ERR_NO_DEVICE {
                assert_eq!((status, message), (fwd_status, last_error()), "{bad:?}");
            }
        }
    }
}
