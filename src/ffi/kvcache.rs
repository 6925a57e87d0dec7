//! The kv-cache C API (paged prefill and chunked prefill): traits, arguments, the launcher handle and
//! its functions, and the one-shot `fmha_kvcache_fwd`.

use super::attention::{fmha_scale, fmha_tensor, input_dtype, mask_type};
use super::handle::HandleTable;
use super::runtime::fmha_stream_t;
use super::{boundary, flag, fmha_status, read_extensible, write_out, Extensible};
use crate::error::{Error, Result};
use crate::kvcache::{launcher, KvCacheArgs, KvCacheLauncher, KvCacheTraits};
use crate::problem::paged::{PoolLayout, TableKind};
use crate::problem::scale::ScaleGranularity;
use crate::problem::Mode;
use crate::runtime::{DevicePtr, Stream};
use std::ffi::{c_char, c_void};
use std::sync::Arc;

pub use crate::abi_values::{
    FMHA_DTYPE_FP8_E4M3FN, FMHA_DTYPE_FP8_E4M3FNUZ, FMHA_KV_BLOCK_TABLE, FMHA_KV_CONTIGUOUS, FMHA_KV_LAYOUT_STRIDED,
    FMHA_KV_LAYOUT_VECTORIZED, FMHA_KV_PAGE_CSR, FMHA_KV_SCALE_PAGE, FMHA_KV_SCALE_TENSOR,
};

/// kv-cache dispatch key and the bounds every call of a launcher stays within. Extensible: set
/// `struct_size = sizeof(fmha_kvcache_traits)`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_kvcache_traits {
    pub struct_size: usize,
    /// `FMHA_DTYPE_*` of q, k and v: fp16, bf16, or an fp8 format (`FMHA_DTYPE_FP8_E4M3FN`,
    /// `FMHA_DTYPE_FP8_E4M3FNUZ`).
    pub dtype: i32,
    /// The output type, read only for fp8 inputs: `FMHA_DTYPE_BF16` (fp32 is reserved). Other inputs
    /// write o in their own type.
    pub o_dtype: i32,
    pub hdim_q: i32,
    pub hdim_v: i32,
    pub nhead_q: i32,
    /// Key/value heads: `nhead_q` must be a multiple (GQA/MQA).
    pub nhead_k: i32,
    /// 1: varlen queries (`seqstart_q`); 0: every sequence has `args.seqlen_q` rows, at batch b of q/o.
    pub is_group_mode: i32,
    /// `FMHA_MASK_NONE` or `FMHA_MASK_BOTTOM_RIGHT` (causal / window, aligned to each sequence's KV
    /// length: its queries are the last tokens of the sequence).
    pub mask_type: i32,
    /// 0 or 1: the natural-log LSE is written to `args.lse`.
    pub has_lse: i32,
    /// `FMHA_KV_CONTIGUOUS`, `FMHA_KV_BLOCK_TABLE` or `FMHA_KV_PAGE_CSR`.
    pub kv_table_kind: i32,
    /// `FMHA_KV_LAYOUT_STRIDED` or `FMHA_KV_LAYOUT_VECTORIZED`.
    pub kv_layout: i32,
    /// `FMHA_KV_SCALE_TENSOR` or `FMHA_KV_SCALE_PAGE` (fp8 with a paged table only).
    pub kv_scale_granularity: i32,
    /// Tokens per page, any value >= 1 (CONTIGUOUS: the slot capacity).
    pub page_size: i32,
    /// Upper bounds of every call: sequences, query rows in all (group mode), query rows and KV tokens
    /// of one sequence.
    pub batch: i32,
    pub total_q: i32,
    pub max_seqlen_q: i32,
    pub max_seqlen_k: i32,
    /// Split-KV (decode: few query rows against long caches). A splitting launcher cuts each
    /// sequence's keys into chunks attended in parallel into partial results in the workspace, then
    /// combines them in chunk order (bitwise reproducible for the same call). `max_splits` (0..=256)
    /// bounds the chunks per sequence: 1 never splits; 0 lets the library choose from the traits and
    /// the device's CU count, with `batch` for the batch. Decode (every sequence's query rows of one
    /// kv head fit the packed decode tile): no split when batch × nhead_k reaches 3 CTAs per CU or
    /// max_seqlen_k spans fewer than 64 key tiles; otherwise fixed chunks of max_seqlen_k's tiles, as
    /// many as bring the grid to 3 CTAs per CU (at most 128, none shorter than 32 tiles). Prefill:
    /// FA3's rule (no split when the tiles of batch × heads × max_seqlen_q query rows fill 80 % of the
    /// CUs, or when max_seqlen_k spans at most 4 key tiles; otherwise the smallest count whose wave
    /// efficiency is within 85 % of the best),
    /// and the prepare picks the chunk length of each call from its lengths (the call's work over the
    /// CUs, plus 10 %); so does an explicit max_splits. A launcher whose calls have far fewer sequences
    /// than `batch` should set max_splits. `kv_split_tokens` > 0 fixes the chunk length instead
    /// (rounded up to whole key tiles), so that a sequence's result depends on its own length only
    /// (batch invariance); max_seqlen_k must then fit in max_splits (or 256) chunks.
    pub max_splits: i32,
    pub kv_split_tokens: i32,
    /// 0 or 1: the prepare checks every page id the sequences use, not only their lengths.
    pub check_tables: i32,
}

// SAFETY: repr(C), begins with `struct_size`, every field is an integer.
unsafe impl Extensible for fmha_kvcache_traits {}

/// kv-cache arguments. Extensible: set `struct_size = sizeof(fmha_kvcache_args)`.
///
/// Group mode: q/o are `[total rows][nhead_q][hdim]` by head and row strides (batch strides ignored),
/// rows of sequence b at `seqstart_q[b]..seqstart_q[b + 1]`; lse `[nhead_q][rows]` (row stride 1).
/// Batch mode: `[batch][nhead_q][seqlen_q][hdim]` by strides; lse `[batch][nhead_q][seqlen_q]`.
/// The pools: STRIDED k/v are `[num_pages][page_size][nhead_k][hdim]` or `[num_pages][nhead_k][page_size][hdim]`
/// by strides (`batch_stride` = page stride, `row_stride` = token stride, `head_stride`); VECTORIZED
/// pools use `batch_stride` and `head_stride` only. CONTIGUOUS: a page is a sequence's slot.
///
/// The KV length of sequence b: BLOCK_TABLE and CONTIGUOUS `seqlen_k[b]`; PAGE_CSR
/// `n = kv_indptr[b + 1] - kv_indptr[b]`, `(n - 1) * page_size + last_page_len[b]` (0 when n = 0;
/// `last_page_len` may be NULL when page_size is 1). Token j is row `j % page_size` of page
/// `block_table[b * block_table_stride + j / page_size]` or `page_indices[kv_indptr[b] + j / page_size]`
/// (CONTIGUOUS: of slot `cache_batch_idx[b]`, or b). Table entries past a sequence's last page are never
/// read. Bad device values (a page id outside `[0, num_pages)`, a negative or too long length,
/// a decreasing indptr, `last_page_len` outside `[1, page_size]`): the host backend fails the run with
/// the field named (reported at the stream's next synchronize); a GPU kernel clamps every value it
/// reads, so it never reads or writes outside the buffers, and the rows of that sequence are
/// unspecified — `fmha_kvcache_launcher_prepare_async` + `_check` report the value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fmha_kvcache_args {
    pub struct_size: usize,
    pub q: fmha_tensor,
    /// The pools (see above).
    pub k: fmha_tensor,
    pub v: fmha_tensor,
    /// fp16/bf16 inputs: their type; fp8 inputs: bf16.
    pub o: fmha_tensor,
    /// fp32, natural log, row stride 1; data NULL unless `traits.has_lse`. A row with no kept key gets
    /// O = 0 and LSE = -inf.
    pub lse: fmha_tensor,
    /// Group mode: `[batch + 1]` device int32 row offsets into q/o; NULL in batch mode.
    pub seqstart_q: *const i32,
    /// Sequences in this call (at most `traits.batch`).
    pub batch: i32,
    /// Batch mode: rows of every sequence; group mode: rows of q (at most `traits.total_q`).
    pub seqlen_q: i32,
    /// Pages in the pools (CONTIGUOUS: slots).
    pub num_pages: i32,
    /// BLOCK_TABLE: entries per row of the table.
    pub max_pages_per_seq: i32,
    /// PAGE_CSR: entries of `page_indices`.
    pub num_page_indices: i32,
    /// `[batch]` KV lengths: BLOCK_TABLE and CONTIGUOUS.
    pub seqlen_k: *const i32,
    /// BLOCK_TABLE: `[batch][block_table_stride]`, the first `max_pages_per_seq` entries of a row used.
    pub block_table: *const i32,
    pub block_table_stride: i64,
    /// PAGE_CSR: `kv_indptr [batch + 1]`, `page_indices [num_page_indices]`, `last_page_len [batch]`.
    pub kv_indptr: *const i32,
    pub page_indices: *const i32,
    pub last_page_len: *const i32,
    /// CONTIGUOUS, optional: `[batch]` slot of each sequence.
    pub cache_batch_idx: *const i32,
    /// Softmax scale; 0 selects `1 / sqrt(hdim_q)`.
    pub scale: f32,
    /// Window sizes of `FMHA_MASK_BOTTOM_RIGHT` (-1 = unbounded; causal is -1, 0).
    pub window_size_left: i32,
    pub window_size_right: i32,
    /// fp8 descales (all zero for fp16/bf16).
    pub q_descale: fmha_scale,
    pub k_descale: fmha_scale,
    pub v_descale: fmha_scale,
    /// 16-byte aligned, `fmha_kvcache_launcher_workspace_size` bytes: written by the prepare (fault
    /// record, split plan, the sequences in longest-first order), read by `_check`. A run reads the
    /// plan and the order (GPU grids start the longest sequences first; a workspace no prepare wrote
    /// runs unsplit in sequence order); a splitting launcher's run writes partial results into it. An
    /// unsplit launcher's run takes NULL too. `workspace_size` 0 skips the size check.
    pub workspace: *mut c_void,
    pub workspace_size: usize,
    /// Added in 0.3: an optional scheduler workspace, `fmha_kvcache_launcher_scheduler_workspace_size`
    /// bytes of device memory (16-byte aligned); NULL: none. With it, sm_90a runs whose tiles differ in
    /// cost may run a persistent grid that takes tiles from a counter in it (the run zeroes it on
    /// `stream` first, so its contents on entry do not matter); without it, one CTA per tile. Like any
    /// buffer it serves one run at a time: calls that may overlap in time (on other streams, from other
    /// threads even on one stream, graphs replayed concurrently) need their own. It may share no byte
    /// with the tensors, the descales, the tables or `workspace`. The host backend checks it and does
    /// not use it; `fmha_kvcache_launcher_prepare_async` ignores it.
    pub scheduler_workspace: *mut c_void,
    /// Added in 0.3: the bytes at `scheduler_workspace` (ignored when it is NULL); at least
    /// `fmha_kvcache_launcher_scheduler_workspace_size`.
    pub scheduler_workspace_size: usize,
}

// SAFETY: repr(C), begins with `struct_size`, every field is an integer, a float or a raw pointer.
unsafe impl Extensible for fmha_kvcache_args {
    /// The struct of 0.1 and 0.2, up to `workspace_size` (before the scheduler workspace).
    const EARLIER_VERSION_SIZES: &'static [usize] = &[384];
}

impl fmha_kvcache_traits {
    pub(crate) fn to_traits(self) -> Result<KvCacheTraits> {
        Ok(KvCacheTraits {
            dtype: input_dtype(self.dtype, self.o_dtype)?,
            hdim_q: i64::from(self.hdim_q),
            hdim_v: i64::from(self.hdim_v),
            nhead_q: i64::from(self.nhead_q),
            nhead_k: i64::from(self.nhead_k),
            mode: Mode::from_flag(self.is_group_mode, "is_group_mode")?,
            mask_type: mask_type(self.mask_type)?,
            has_lse: flag(self.has_lse, "has_lse")?,
            table_kind: TableKind::from_i32(self.kv_table_kind)?,
            layout: PoolLayout::from_i32(self.kv_layout)?,
            scale_granularity: ScaleGranularity::from_i32(self.kv_scale_granularity)?,
            page_size: i64::from(self.page_size),
            batch: i64::from(self.batch),
            total_q: i64::from(self.total_q),
            max_seqlen_q: i64::from(self.max_seqlen_q),
            max_seqlen_k: i64::from(self.max_seqlen_k),
            max_splits: i64::from(self.max_splits),
            kv_split_tokens: i64::from(self.kv_split_tokens),
            check_tables: flag(self.check_tables, "check_tables")?,
        })
    }
}

impl fmha_kvcache_args {
    pub(crate) fn to_args(self) -> KvCacheArgs {
        let ptr = |p: *const i32| DevicePtr::new(p as usize);
        KvCacheArgs {
            q: self.q.to_tensor(),
            k: self.k.to_tensor(),
            v: self.v.to_tensor(),
            o: self.o.to_tensor(),
            lse: self.lse.to_tensor(),
            seqstart_q: ptr(self.seqstart_q),
            batch: i64::from(self.batch),
            seqlen_q: i64::from(self.seqlen_q),
            num_pages: i64::from(self.num_pages),
            max_pages_per_seq: i64::from(self.max_pages_per_seq),
            num_page_indices: i64::from(self.num_page_indices),
            seqlen_k: ptr(self.seqlen_k),
            block_table: ptr(self.block_table),
            block_table_stride: self.block_table_stride,
            kv_indptr: ptr(self.kv_indptr),
            page_indices: ptr(self.page_indices),
            last_page_len: ptr(self.last_page_len),
            cache_batch_idx: ptr(self.cache_batch_idx),
            scale: self.scale,
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            q_descale: self.q_descale.to_descale(),
            k_descale: self.k_descale.to_descale(),
            v_descale: self.v_descale.to_descale(),
            workspace: DevicePtr::new(self.workspace as usize),
            workspace_size: self.workspace_size,
            scheduler_workspace: DevicePtr::new(self.scheduler_workspace as usize),
            scheduler_workspace_size: self.scheduler_workspace_size,
        }
    }
}

/// A kv-cache launcher (opaque; a checked id like every handle).
pub struct fmha_kvcache_launcher {
    _opaque: [u8; 0],
}

static LAUNCHERS: HandleTable<KvCacheLauncher> = HandleTable::new(0x4B56, "fmha_kvcache_launcher");

fn launcher_ref(launcher: *const fmha_kvcache_launcher) -> Result<Arc<KvCacheLauncher>> {
    LAUNCHERS.get(launcher as usize, "launcher")
}

/// Creates a kv-cache launcher for `traits` on the current device into `*launcher` (selects the
/// kernel instance; FMHA_ERR_UNSUPPORTED names what this build cannot run).
#[no_mangle]
pub extern "C" fn fmha_kvcache_launcher_create(
    traits: *const fmha_kvcache_traits,
    launcher: *mut *mut fmha_kvcache_launcher,
) -> fmha_status {
    boundary(|| {
        if launcher.is_null() {
            return Err(Error::null("launcher"));
        }
        let traits = read_extensible(traits, "traits")?.to_traits()?;
        let handle = LAUNCHERS.insert(KvCacheLauncher::new(traits)?)?;
        write_out(launcher, "launcher", handle as *mut fmha_kvcache_launcher)
    })
}

/// Destroys a launcher (NULL is a no-op; queued work is unaffected; a destroyed handle is
/// FMHA_ERR_INVALID_ARGUMENT).
#[no_mangle]
pub extern "C" fn fmha_kvcache_launcher_destroy(launcher: *mut fmha_kvcache_launcher) -> fmha_status {
    boundary(|| {
        if !launcher.is_null() {
            drop(LAUNCHERS.remove(launcher as usize, "launcher")?);
        }
        Ok(())
    })
}

/// The workspace bytes this launcher's prepare and check need.
#[no_mangle]
pub extern "C" fn fmha_kvcache_launcher_workspace_size(
    launcher: *const fmha_kvcache_launcher,
    bytes: *mut usize,
) -> fmha_status {
    boundary(|| {
        let size = launcher_ref(launcher)?.workspace_size();
        write_out(bytes, "bytes", size)
    })
}

/// Writes into `*bytes` the size of the scheduler workspace `fmha_kvcache_args.scheduler_workspace`
/// that this launcher's runs take (16 bytes today, on every backend; ask rather than assume it). A
/// scheduler workspace serves any number of runs, one at a time (see
/// `fmha_kvcache_args.scheduler_workspace`).
#[no_mangle]
pub extern "C" fn fmha_kvcache_launcher_scheduler_workspace_size(
    launcher: *const fmha_kvcache_launcher,
    bytes: *mut usize,
) -> fmha_status {
    boundary(|| {
        let size = launcher_ref(launcher)?.scheduler_workspace_size();
        write_out(bytes, "bytes", size)
    })
}

/// Writes the stages `fmha_kvcache_launcher_run` launches as JSON into `buffer`, as
/// `fmha_registry_json` does: `{"operation":"kvcache","arch":…,"stages":[…]}`: `kvcache_fwd` (with its
/// `instance`) and, for a launcher that splits the KV, `combine`. (`prepare_async` launches one more
/// kernel, the check of the lengths and tables.)
#[no_mangle]
pub extern "C" fn fmha_kvcache_launcher_plan_json(
    launcher: *const fmha_kvcache_launcher,
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

/// The workspace bytes a launcher for `traits` would need, without creating one.
#[no_mangle]
pub extern "C" fn fmha_kvcache_workspace_size_upper_bound(
    traits: *const fmha_kvcache_traits,
    bytes: *mut usize,
) -> fmha_status {
    boundary(|| {
        let traits = read_extensible(traits, "traits")?.to_traits()?;
        write_out(bytes, "bytes", launcher::workspace_size_upper_bound(&traits)?)
    })
}

/// Enqueues on `stream` the check of the call's device lengths and tables (`args.seqstart_q`, the
/// table arrays; with `traits.check_tables` every page id used) against the rules above and the
/// traits' bounds, and returns at once (no host synchronization: graph-capture safe). The first fault
/// in sequence order is recorded in `args.workspace`; `fmha_kvcache_launcher_check` reports it. One
/// prepare serves every layer of a model step (same lengths and tables).
#[no_mangle]
pub extern "C" fn fmha_kvcache_launcher_prepare_async(
    launcher: *const fmha_kvcache_launcher,
    args: *const fmha_kvcache_args,
    stream: fmha_stream_t,
) -> fmha_status {
    boundary(|| {
        let launcher = launcher_ref(launcher)?;
        let args = read_extensible(args, "args")?.to_args();
        launcher.prepare_async(&args, Stream(stream as usize))
    })
}

/// Enqueues the attention on `stream` and returns once queued.
#[no_mangle]
pub extern "C" fn fmha_kvcache_launcher_run(
    launcher: *const fmha_kvcache_launcher,
    args: *const fmha_kvcache_args,
    stream: fmha_stream_t,
) -> fmha_status {
    boundary(|| {
        let launcher = launcher_ref(launcher)?;
        let args = read_extensible(args, "args")?.to_args();
        launcher.run(&args, Stream(stream as usize))
    })
}

/// Blocking (debugging and tests): waits for `stream`, then reports what the last prepare on
/// `workspace` found: FMHA_OK, FMHA_ERR_ASYNC_FAILURE with the field, sequence and value in the
/// message, or FMHA_ERR_WORKSPACE_NOT_PREPARED.
#[no_mangle]
pub extern "C" fn fmha_kvcache_launcher_check(
    launcher: *const fmha_kvcache_launcher,
    workspace: *const c_void,
    workspace_size: usize,
    stream: fmha_stream_t,
) -> fmha_status {
    boundary(|| {
        let launcher = launcher_ref(launcher)?;
        launcher.check(DevicePtr::new(workspace as usize), workspace_size, Stream(stream as usize))
    })
}

/// One call for bindings: creates a launcher for `traits`, enqueues `args` on `stream`, destroys it.
/// Given a workspace (`fmha_kvcache_workspace_size_upper_bound` bytes), it first enqueues the prepare
/// on it (the split plan and the longest-first sequence order; the faults it records nothing reports
/// here: use the launcher to have the tables checked); a launcher that splits the KV (see
/// `max_splits`) needs one. Without a workspace the sequences run unsplit in their order. The run
/// takes `args.scheduler_workspace` as `fmha_kvcache_launcher_run` does
/// (`fmha_kvcache_launcher_scheduler_workspace_size` bytes of a launcher for `traits`).
#[no_mangle]
pub extern "C" fn fmha_kvcache_fwd(
    traits: *const fmha_kvcache_traits,
    args: *const fmha_kvcache_args,
    stream: fmha_stream_t,
) -> fmha_status {
    boundary(|| {
        let traits = read_extensible(traits, "traits")?.to_traits()?;
        let args = read_extensible(args, "args")?.to_args();
        let (launcher, stream) = (KvCacheLauncher::new(traits)?, Stream(stream as usize));
        if !args.workspace.is_null() {
            if !args.scheduler_workspace.is_null() {
                // The prepare ignores the scheduler workspace: the run's checks of it come first, so
                // that a refused call enqueues nothing.
                launcher.check_run(&args)?;
            }
            launcher.prepare_async(&args, stream)?;
        }
        launcher.run(&args, stream)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi_values::{FMHA_DTYPE_BF16, FMHA_MASK_BOTTOM_RIGHT};
    use crate::ffi::last_error;
    use crate::ffi::status::{FMHA_ERR_INVALID_ARGUMENT, FMHA_ERR_NO_DEVICE, FMHA_ERR_NULL_POINTER, FMHA_OK};
    use std::ptr::{null_mut, NonNull};

    fn traits() -> fmha_kvcache_traits {
        fmha_kvcache_traits {
            struct_size: std::mem::size_of::<fmha_kvcache_traits>(),
            dtype: FMHA_DTYPE_BF16,
            o_dtype: FMHA_DTYPE_BF16,
            hdim_q: 128,
            hdim_v: 128,
            nhead_q: 8,
            nhead_k: 2,
            is_group_mode: 1,
            mask_type: FMHA_MASK_BOTTOM_RIGHT,
            has_lse: 1,
            kv_table_kind: FMHA_KV_BLOCK_TABLE,
            kv_layout: FMHA_KV_LAYOUT_STRIDED,
            kv_scale_granularity: FMHA_KV_SCALE_TENSOR,
            page_size: 16,
            batch: 4,
            total_q: 64,
            max_seqlen_q: 16,
            max_seqlen_k: 1024,
            max_splits: 0,
            kv_split_tokens: 0,
            check_tables: 0,
        }
    }

    #[test]
    fn scheduler_workspace_size_is_the_constant_for_every_launcher() {
        for t in [traits(), fmha_kvcache_traits { max_splits: 1, kv_table_kind: FMHA_KV_PAGE_CSR, ..traits() }] {
            let mut launcher = null_mut();
            let created = fmha_kvcache_launcher_create(&t, &mut launcher);
            if created == FMHA_ERR_NO_DEVICE {
                return; // a GPU build without a device
            }
            assert_eq!(created, FMHA_OK, "{}", last_error());
            let mut bytes = 0;
            assert_eq!(
                fmha_kvcache_launcher_scheduler_workspace_size(launcher, &mut bytes),
                FMHA_OK,
                "{}",
                last_error()
            );
            assert_eq!(bytes, 16); // (workspace::SCHEDULER_WORKSPACE_BYTES: the header's 16 bytes)
            assert_eq!(fmha_kvcache_launcher_destroy(launcher), FMHA_OK);
        }
    }

    /// Null pointers and handles that are not launchers are named, and nothing is written.
    #[test]
    fn scheduler_workspace_size_refuses_bad_pointers() {
        let mut bytes = 7;
        assert_eq!(fmha_kvcache_launcher_scheduler_workspace_size(null_mut(), &mut bytes), FMHA_ERR_NULL_POINTER);
        assert!(last_error().starts_with("launcher"), "{}", last_error());
        let garbage = NonNull::<fmha_kvcache_launcher>::dangling().as_ptr();
        assert_eq!(fmha_kvcache_launcher_scheduler_workspace_size(garbage, &mut bytes), FMHA_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("launcher"), "{}", last_error());
        assert_eq!(bytes, 7, "written on failure");
        let mut launcher = null_mut();
        if fmha_kvcache_launcher_create(&traits(), &mut launcher) == FMHA_OK {
            assert_eq!(fmha_kvcache_launcher_scheduler_workspace_size(launcher, null_mut()), FMHA_ERR_NULL_POINTER);
            assert!(last_error().starts_with("bytes"), "{}", last_error());
            assert_eq!(fmha_kvcache_launcher_destroy(launcher), FMHA_OK);
        }
    }
}
