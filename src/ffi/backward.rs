//! The backward C API: the launcher handle and its functions.

use super::attention::{fmha_tensor, mask_type};
use super::handle::HandleTable;
use super::runtime::fmha_stream_t;
use super::{boundary, flag, fmha_status, read_extensible, read_slice, write_out, Extensible};
use crate::bwd::{launcher, BwdArgs, BwdLauncher, BwdTraits, DqScheme};
use crate::error::{Error, Result};
use crate::problem::{BiasType, CacheDtype, Mode, SequenceArrays};
use crate::runtime::{DevicePtr, Stream};
use std::ffi::{c_char, c_void};
use std::sync::Arc;

/// Backward dispatch key and problem shape (the workspace is sized from it). Extensible: set
/// `struct_size = sizeof(fmha_bwd_traits)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_bwd_traits {
    pub struct_size: usize,
    /// Batch mode: per-batch lengths. Group mode: upper bounds of the total physical rows
    /// (`seqstart[batch]`): the workspace is sized for them, and one launcher serves every varlen batch
    /// whose totals and per-batch lengths fit.
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub batch: i32,
    /// Upper bounds of the per-batch physical lengths (group mode); batch mode: 0 or seqlen.
    pub max_seqlen_q: i32,
    pub max_seqlen_k: i32,
    pub hdim_q: i32,
    pub hdim_v: i32,
    pub nhead_q: i32,
    pub nhead_k: i32,
    /// `FMHA_DTYPE_*`.
    pub dtype: i32,
    /// 0 = batch mode, 1 = group (varlen) mode.
    pub is_group_mode: i32,
    /// `FMHA_MASK_*`.
    pub mask_type: i32,
    /// `FMHA_BIAS_*` (only NONE is supported so far).
    pub bias_type: i32,
    /// The flags below are 0 or 1; any other value is FMHA_ERR_INVALID_ARGUMENT.
    /// 1: bias gradient (not supported yet: FMHA_ERR_UNSUPPORTED).
    pub has_dbias: i32,
    /// 1: dropout (not supported yet: FMHA_ERR_UNSUPPORTED).
    pub has_dropout: i32,
    /// 1: store dropout random values (not supported yet: FMHA_ERR_UNSUPPORTED).
    pub is_store_randval: i32,
    /// 1: bitwise reproducible dQ, summed in a fixed order (`dq_scheme`).
    pub is_deterministic: i32,
    /// `FMHA_DQ_SCHEME_*`: how deterministic mode sums dQ (0 = AUTO, the library's choice for the device
    /// and shape; ignored when `is_deterministic` is 0). 64 bits so that it starts past 0.1's struct,
    /// whose last 4 bytes are padding a caller may have left unset.
    pub dq_scheme: i64,
}

// SAFETY: repr(C), begins with `struct_size`, every field is an integer.
unsafe impl Extensible for fmha_bwd_traits {
    /// 0.1's struct, up to `is_deterministic`.
    const EARLIER_VERSION_SIZES: &'static [usize] = &[80];
}

/// Backward arguments. Extensible: set `struct_size = sizeof(fmha_bwd_args)`. dK and dV have
/// `nhead_k` heads: the GQA/MQA reduction over query heads happens inside the library.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_bwd_args {
    pub struct_size: usize,
    pub q: fmha_tensor,
    pub k: fmha_tensor,
    pub v: fmha_tensor,
    /// The forward's output and LSE (fp32, natural log, unit row stride).
    pub o: fmha_tensor,
    pub lse: fmha_tensor,
    pub d_o: fmha_tensor,
    /// fp32 scratch in the LSE layout (written by the first stage).
    pub d: fmha_tensor,
    pub dq: fmha_tensor,
    pub dk: fmha_tensor,
    pub dv: fmha_tensor,
    /// A workspace prepared for these sequence starts by a launcher with these traits (16-byte
    /// aligned). One workspace serves one run at a time, like any buffer: runs that overlap in time
    /// (other streams, other threads) need workspaces of their own.
    pub workspace: *mut c_void,
    pub seqstart_q: *const i32,
    pub seqstart_k: *const i32,
    pub seqlen_q_ptr: *const i32,
    pub seqlen_k_ptr: *const i32,
    /// Must equal the launcher's traits, except in group mode, where seqlen_q/k and max_seqlen_q/k
    /// may be smaller than the traits' bounds.
    pub batch: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub max_seqlen_q: i32,
    pub max_seqlen_k: i32,
    pub nhead_q: i32,
    pub nhead_k: i32,
    pub hdim_q: i32,
    pub hdim_v: i32,
    /// Softmax scale of the forward; 0 selects `1 / sqrt(hdim_q)`.
    pub scale: f32,
    pub window_size_left: i32,
    pub window_size_right: i32,
    /// Added in 0.2: the bytes at `workspace`; checked against `fmha_bwd_launcher_workspace_size`. 0 (and
    /// callers of 0.1, whose `struct_size` ends before this field) skips the check.
    pub workspace_size: usize,
}

// SAFETY: repr(C), begins with `struct_size`, every field is an integer, a float or a raw pointer.
unsafe impl Extensible for fmha_bwd_args {
    /// 0.1's struct, up to `window_size_right`.
    const EARLIER_VERSION_SIZES: &'static [usize] = &[416];
}

/// A backward launcher (opaque). The handle is a checked id, not an address: a destroyed or foreign
/// handle is FMHA_ERR_INVALID_ARGUMENT naming the argument.
pub struct fmha_bwd_launcher {
    _opaque: [u8; 0],
}

/// The live launchers.
static LAUNCHERS: HandleTable<BwdLauncher> = HandleTable::new(0x4C41, "fmha_bwd_launcher");

impl fmha_bwd_traits {
    /// The traits, validated field by field (enum values, flags).
    pub fn to_traits(self) -> Result<BwdTraits> {
        Ok(BwdTraits {
            dtype: match CacheDtype::from_i32(self.dtype, "dtype")? {
                CacheDtype::Half(dtype) => dtype,
                CacheDtype::Fp8(_) => {
                    return Err(Error::unsupported("dtype: the backward takes fp16 and bf16 (fp8 is forward only)"))
                }
            },
            mode: Mode::from_flag(self.is_group_mode, "is_group_mode")?,
            mask_type: mask_type(self.mask_type)?,
            bias_type: BiasType::from_i32(self.bias_type)?,
            has_dbias: flag(self.has_dbias, "has_dbias")?,
            has_dropout: flag(self.has_dropout, "has_dropout")?,
            is_store_randval: flag(self.is_store_randval, "is_store_randval")?,
            deterministic: flag(self.is_deterministic, "is_deterministic")?,
            dq_scheme: DqScheme::from_i64(self.dq_scheme, "dq_scheme")?,
            batch: i64::from(self.batch),
            seqlen_q: i64::from(self.seqlen_q),
            seqlen_k: i64::from(self.seqlen_k),
            max_seqlen_q: i64::from(self.max_seqlen_q),
            max_seqlen_k: i64::from(self.max_seqlen_k),
            nhead_q: i64::from(self.nhead_q),
            nhead_k: i64::from(self.nhead_k),
            hdim_q: i64::from(self.hdim_q),
            hdim_v: i64::from(self.hdim_v),
        })
    }
}

impl fmha_bwd_args {
    pub(crate) fn to_args(self) -> Result<BwdArgs> {
        Ok(BwdArgs {
            q: self.q.to_tensor(),
            k: self.k.to_tensor(),
            v: self.v.to_tensor(),
            o: self.o.to_tensor(),
            lse: self.lse.to_tensor(),
            d_o: self.d_o.to_tensor(),
            d: self.d.to_tensor(),
            dq: self.dq.to_tensor(),
            dk: self.dk.to_tensor(),
            dv: self.dv.to_tensor(),
            workspace: DevicePtr::new(self.workspace as usize),
            workspace_size: self.workspace_size,
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
            hdim_q: i64::from(self.hdim_q),
            hdim_v: i64::from(self.hdim_v),
            scale: self.scale,
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
        })
    }
}

fn launcher_ref(launcher: *const fmha_bwd_launcher) -> Result<Arc<BwdLauncher>> {
    LAUNCHERS.get(launcher as usize, "launcher")
}

/// Creates a backward launcher for `traits` on the current device into `*launcher`: selects the
/// kernel instance and fixes the workspace layout (it uses the device's CU count).
#[no_mangle]
pub extern "C" fn fmha_bwd_launcher_create(
    traits: *const fmha_bwd_traits,
    launcher: *mut *mut fmha_bwd_launcher,
) -> fmha_status {
    boundary(|| {
        if launcher.is_null() {
            return Err(Error::null("launcher"));
        }
        let traits = read_extensible(traits, "traits")?.to_traits()?;
        let handle = LAUNCHERS.insert(BwdLauncher::new(traits)?)?;
        write_out(launcher, "launcher", handle as *mut fmha_bwd_launcher)
    })
}

/// Destroys a launcher (NULL is a no-op). Work it already queued is unaffected, and a call using it
/// on another thread finishes first. A destroyed handle (destroying it again included) is
/// FMHA_ERR_INVALID_ARGUMENT.
#[no_mangle]
pub extern "C" fn fmha_bwd_launcher_destroy(launcher: *mut fmha_bwd_launcher) -> fmha_status {
    boundary(|| {
        if !launcher.is_null() {
            drop(LAUNCHERS.remove(launcher as usize, "launcher")?);
        }
        Ok(())
    })
}

/// The workspace bytes `run` needs with this launcher (metadata region + dq_acc upper bound).
#[no_mangle]
pub extern "C" fn fmha_bwd_launcher_workspace_size(
    launcher: *const fmha_bwd_launcher,
    bytes: *mut usize,
) -> fmha_status {
    boundary(|| {
        let size = launcher_ref(launcher)?.workspace_size();
        write_out(bytes, "bytes", size)
    })
}

/// Writes the stages `fmha_bwd_launcher_run` launches as JSON into `buffer`, as `fmha_registry_json`
/// does: `{"operation":"bwd","arch":…,"stages":[…]}`, in order `dot_do_o`, `zero_dq_acc` (when the
/// mode needs it; its `note` says which part of dq_acc), `dq_dk_dv` (with its `instance`),
/// `convert_dq`. The GPU backends zero dq_acc in the dot_do_o launch: their first stage is then
/// `dot_do_o_and_zero_dq_acc`, with the zeroing's `note`.
#[no_mangle]
pub extern "C" fn fmha_bwd_launcher_plan_json(
    launcher: *const fmha_bwd_launcher,
    buffer: *mut c_char,
    length: usize,
    required: *mut usize,
) -> fmha_status {
    boundary(|| {
        if required.is_null() {
            return Err(Error::null("required"));
        }
        super::write_json(&launcher_ref(launcher)?.plan().to_json(), buffer, length, required)
    })
}

/// Prepares `workspace` (at least `workspace_size` bytes of device memory, 16-byte aligned) for the
/// given sequence starts: group mode passes the host copies of `seqstart_q/k` (`[batch + 1]` int32),
/// batch mode passes NULL for both. Synchronous. The workspace then describes itself (its header
/// records the layout it was prepared for: mode, determinism, batch, kv heads, query heads per kv head
/// × hdim_q, lengths, tile and CU count): any launcher with that layout may run with it (mask, dtype,
/// scale and hdim_v do not enter), on any stream, and `run` initializes its dq_acc region itself, so
/// one prepare serves any number of runs with the same sequence starts.
#[no_mangle]
pub extern "C" fn fmha_bwd_launcher_prepare_workspace(
    launcher: *mut fmha_bwd_launcher,
    workspace: *mut c_void,
    workspace_size: usize,
    seqstart_q: *const i32,
    seqstart_k: *const i32,
) -> fmha_status {
    boundary(|| {
        let launcher = launcher_ref(launcher)?;
        let n = launcher.traits().batch as usize + 1;
        let optional = |ptr: *const i32, field: &str| -> Result<Option<&[i32]>> {
            if ptr.is_null() {
                Ok(None)
            } else {
                read_slice(ptr, n, field).map(Some)
            }
        };
        let (q, k) = (optional(seqstart_q, "seqstart_q")?, optional(seqstart_k, "seqstart_k")?);
        launcher.prepare_workspace(DevicePtr::new(workspace as usize), workspace_size, q, k)
    })
}

/// Enqueues the backward on `stream`: dot_do_o → dq_dk_dv → convert_dq. Returns once queued.
///
/// The kernels check that `args.workspace` was prepared for these sequence starts and traits (the
/// header's fingerprint); when it was not, nothing is computed: the host backend reports
/// FMHA_ERR_WORKSPACE_NOT_PREPARED at the stream's next synchronize, and on a GPU dq, dk and dv are left
/// unwritten (a kernel has no error channel).
#[no_mangle]
pub extern "C" fn fmha_bwd_launcher_run(
    launcher: *const fmha_bwd_launcher,
    args: *const fmha_bwd_args,
    stream: fmha_stream_t,
) -> fmha_status {
    boundary(|| {
        let launcher = launcher_ref(launcher)?;
        let args = read_extensible(args, "args")?.to_args()?;
        launcher.run(&args, Stream(stream as usize))
    })
}

/// The workspace size a launcher for `traits` would need, without creating one (any sequence starts
/// consistent with the traits fit in it).
#[no_mangle]
pub extern "C" fn fmha_bwd_workspace_size_upper_bound(
    traits: *const fmha_bwd_traits,
    bytes: *mut usize,
) -> fmha_status {
    boundary(|| {
        let traits = read_extensible(traits, "traits")?.to_traits()?;
        let size = launcher::workspace_size_upper_bound(&traits)?;
        write_out(bytes, "bytes", size)
    })
}

pub use crate::abi_values::{
    FMHA_DQ_SCHEME_AUTO, FMHA_DQ_SCHEME_ORDERED, FMHA_DQ_SCHEME_SPLIT_SLOTS, FMHA_PREPARE_AUTO, FMHA_PREPARE_DEVICE,
    FMHA_PREPARE_HOST,
};

/// Prepares `workspace` (16-byte aligned) on `stream` and returns at once: nothing blocks the host,
/// on the first call too. `seqstart_q/k` are the device arrays (group mode; NULL in batch mode).
///
/// `method`: `FMHA_PREPARE_DEVICE` builds the metadata in a single-thread kernel (no host function, no
/// pinned memory: safe under stream/graph capture); `FMHA_PREPARE_HOST` copies the seqstarts to pinned
/// memory, packs the metadata in a stream host function and copies it back (the staging buffer lives
/// until the stream consumed it, even if the launcher is destroyed first); `FMHA_PREPARE_AUTO` is the
/// device kernel. Both check the device seqstarts (from 0, non-decreasing, within the launcher's
/// bounds): invalid ones leave the workspace unprepared, so a run with it computes nothing (see
/// `fmha_bwd_launcher_run`), and the cause, naming the field, becomes the stream's error, reported by
/// the next `fmha_stream_synchronize` of `stream` or `fmha_device_synchronize` — on the host backend
/// for both methods, on a GPU for the host method (a kernel has no error channel).
/// `allocator` supplies the host method's pinned memory (NULL: the library's pooled pinned buffers).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn fmha_bwd_launcher_prepare_workspace_async(
    launcher: *mut fmha_bwd_launcher,
    workspace: *mut c_void,
    workspace_size: usize,
    seqstart_q: *const i32,
    seqstart_k: *const i32,
    stream: fmha_stream_t,
    allocator: *const super::pinned::fmha_pinned_allocator,
    method: i32,
) -> fmha_status {
    boundary(|| {
        let launcher = launcher_ref(launcher)?;
        let method = crate::bwd::PrepareMethod::from_i32(method)?;
        let allocator = if allocator.is_null() {
            None
        } else {
            Some(super::pinned::CallerAllocator::new(&read_extensible(allocator, "allocator")?)?.into_allocator())
        };
        launcher.prepare_workspace_async(
            DevicePtr::new(workspace as usize),
            workspace_size,
            DevicePtr::new(seqstart_q as usize),
            DevicePtr::new(seqstart_k as usize),
            Stream(stream as usize),
            allocator,
            method,
        )
    })
}
