//! The ABI between the Rust host side and the HIP C++ kernels: the parameter blocks the launch stubs
//! take and the stubs' prototypes (the metadata records the workspace holds are in
//! `schedule/records.rs`). Defined here once; `hip/launch.h` is generated from these two files by
//! cbindgen (`cbindgen-kernels.toml`, from build.rs),
//! committed, and drift-checked by `tests/kernel_abi.rs`, which also checks `hip/launch_layout.h`, the
//! C++ compiler's `static_assert`s of every size and offset below.
//!
//! Rules: plain `#[repr(C)]` structs of fixed-width integers and floats; addresses as `u64` (the kernels
//! and the host agree on the width whatever the pointer size); strides in elements; lengths `i32` (the
//! C ABI passes them so); flags 0 or 1 as `i32`.

use std::ffi::c_void;

/// The forward kernels' parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    /// 0: the LSE is not written.
    pub lse: u64,
    /// Group mode: `[batch + 1]` physical starts; 0 in batch mode.
    pub seqstart_q: u64,
    pub seqstart_k: u64,
    /// Optional logical lengths `[batch]` (0 when absent).
    pub seqlen_q_ptr: u64,
    pub seqlen_k_ptr: u64,
    pub q_batch_stride: i64,
    pub q_head_stride: i64,
    pub q_row_stride: i64,
    pub k_batch_stride: i64,
    pub k_head_stride: i64,
    pub k_row_stride: i64,
    pub v_batch_stride: i64,
    pub v_head_stride: i64,
    pub v_row_stride: i64,
    pub o_batch_stride: i64,
    pub o_head_stride: i64,
    pub o_row_stride: i64,
    pub lse_batch_stride: i64,
    pub lse_head_stride: i64,
    pub batch: i32,
    pub nhead_q: i32,
    /// Key/value heads (GQA/MQA: fewer than `nhead_q`).
    pub nhead_k: i32,
    pub hdim_q: i32,
    pub hdim_v: i32,
    /// Batch mode: per batch; group mode: total physical rows.
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    /// Batch mode: `seqlen_q`; group mode: a bound of every batch's length (sizes the grid).
    pub max_seqlen_q: i32,
    pub group_mode: i32,
    /// 0 none, 1 top-left, 2 bottom-right.
    pub mask_type: i32,
    pub window_left: i32,
    pub window_right: i32,
    /// Softmax scale times log2(e): the kernels work in the exp2 domain.
    pub scale_log2: f32,
    /// Instance selection (what the launch stub dispatches on): `FMHA_DTYPE_*` of q, k and v (0 fp16,
    /// 1 bf16, 3 fp8 e4m3fn, whose o is bf16).
    pub dtype: i32,
    /// The compiled head dim the tiles are sized for.
    pub hdim_bucket: i32,
    /// The masked instance (any mask type other than none).
    pub masked: i32,
    /// fp8 descales per tensor or per (sequence, kv head) (page strides 0; data 0 = 1).
    pub q_descale: DescaleParams,
    pub k_descale: DescaleParams,
    pub v_descale: DescaleParams,
    /// Device address of the scheduler workspace's tile counter (int32), 0 when the call has no
    /// workspace: the sm_90a launch zeroes it on the stream and runs a persistent grid that takes tiles
    /// from it.
    pub tile_counter: u64,
}

/// The backward kernels' parameters, shared by the three stages. The workspace fields are the layout
/// the host computed (`workspace::WorkspaceLayout`), so the kernels read exactly the bytes the prepare
/// wrote.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BwdParams {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub d_o: u64,
    /// fp32 scratch in the LSE layout, written by dot_do_o.
    pub d: u64,
    pub dq: u64,
    /// dK/dV have `nhead_k` heads: the GQA reduction happens inside the kernels.
    pub dk: u64,
    pub dv: u64,
    /// Group mode: `[batch + 1]` physical starts; 0 in batch mode.
    pub seqstart_q: u64,
    pub seqstart_k: u64,
    /// Optional logical lengths `[batch]` (0 when absent).
    pub seqlen_q_ptr: u64,
    pub seqlen_k_ptr: u64,
    /// The metadata region, then dq_acc.
    pub workspace: u64,
    pub q_batch_stride: i64,
    pub q_head_stride: i64,
    pub q_row_stride: i64,
    pub k_batch_stride: i64,
    pub k_head_stride: i64,
    pub k_row_stride: i64,
    pub v_batch_stride: i64,
    pub v_head_stride: i64,
    pub v_row_stride: i64,
    pub o_batch_stride: i64,
    pub o_head_stride: i64,
    pub o_row_stride: i64,
    pub do_batch_stride: i64,
    pub do_head_stride: i64,
    pub do_row_stride: i64,
    pub dq_batch_stride: i64,
    pub dq_head_stride: i64,
    pub dq_row_stride: i64,
    pub dk_batch_stride: i64,
    pub dk_head_stride: i64,
    pub dk_row_stride: i64,
    pub dv_batch_stride: i64,
    pub dv_head_stride: i64,
    pub dv_row_stride: i64,
    /// LSE and D share the LSE layout (row stride 1).
    pub lse_batch_stride: i64,
    pub lse_head_stride: i64,
    pub d_batch_stride: i64,
    pub d_head_stride: i64,
    /// Byte size of the metadata region (= dq_acc's offset in the workspace).
    pub metadata_bytes: i64,
    /// Byte offsets of the metadata sections in the workspace.
    pub nsplits_offset: i64,
    pub dq_acc_offsets_offset: i64,
    pub cu_state_offset: i64,
    pub batch_state_offset: i64,
    /// fp32 elements of the dq_acc region (its upper bound).
    pub dq_acc_elements: i64,
    /// `workspace::fingerprint` after the params words: the kernels absorb the seqstarts they were
    /// given and compare with the header, so a workspace prepared for other sequences is never trusted.
    pub fingerprint_params: u64,
    /// The batch-mode persistent schedule (`schedule::BatchPersistent`), deterministic mode: units per
    /// (batch, kv head), units per worker, all units.
    pub jobs_per_head: i64,
    pub jobs_per_worker: i64,
    pub total_jobs: i64,
    /// The ordered dQ scheme (`WorkspaceParams::ordered_dq`), deterministic mode: 1 where the units add
    /// into one dq_acc in turn, counted by `dq_semaphore_words` int32 semaphores after the dq_acc region
    /// (zeroed with it); 0 and 0 otherwise.
    pub ordered_dq: i64,
    pub dq_semaphore_words: i64,
    pub batch: i32,
    pub nhead_q: i32,
    pub nhead_k: i32,
    pub hdim_q: i32,
    pub hdim_v: i32,
    /// Batch mode: per batch; group mode: totals (physical rows).
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    /// Batch mode: the lengths; group mode: bounds of every batch's length.
    pub max_seqlen_q: i32,
    pub max_seqlen_k: i32,
    pub group_mode: i32,
    pub deterministic: i32,
    /// 0 none, 1 top-left, 2 bottom-right.
    pub mask_type: i32,
    pub window_left: i32,
    pub window_right: i32,
    /// Workgroups of the persistent grid (the workspace was laid out for it).
    pub num_cus: i32,
    /// The dq_dk_dv tile: q rows per step (kM0), keys per work unit (kN0).
    pub m0: i32,
    pub n0: i32,
    pub scale: f32,
    /// `scale` times log2(e).
    pub scale_log2: f32,
    /// Instance selection (what the launch stub dispatches on): 0 fp16, 1 bf16.
    pub dtype: i32,
    /// The compiled head dim the tiles are sized for.
    pub hdim_bucket: i32,
    pub masked: i32,
}

/// The arguments of the workspace prepare routine (`hip/bwd/prepare_workspace.h`, on the GPU and on
/// the CPU): the workspace parameters and the metadata layout the host computed, so the device-side
/// prepare neither recomputes nor can disagree with the layout. Every field is `i64` (no padding);
/// booleans and the XCD remap are 0 or 1.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareParams {
    pub group_mode: i64,
    pub deterministic: i64,
    pub batch: i64,
    /// Key/value heads: the schedule's unit is one (batch, kv head, K tile).
    pub nhead_k: i64,
    /// fp32 elements of one dq_acc row: the query heads of a kv head times `hdim_q`.
    pub row_elements: i64,
    /// Batch mode: per-batch Sq; group mode: `seqstart_q[batch]` bound.
    pub seqlen_q: i64,
    /// Batch mode: Sk; group mode: `seqstart_k[batch]` bound.
    pub seqlen_k: i64,
    pub max_seqlen_k: i64,
    pub m0: i64,
    pub n0: i64,
    pub num_cus: i64,
    /// 0: none, 1: 8 XCDs.
    pub remap: i64,
    /// Byte offset (from the workspace start) and element count of each metadata section.
    pub nsplits_offset: i64,
    pub nsplits_count: i64,
    pub dq_acc_offsets_offset: i64,
    pub dq_acc_offsets_count: i64,
    pub cu_state_offset: i64,
    pub cu_state_count: i64,
    pub batch_state_offset: i64,
    pub batch_state_count: i64,
    /// Size of the whole metadata region (a multiple of 4096).
    pub metadata_bytes: i64,
    /// Whether the kernel masks (the group-mode chunk weights, `schedule::chunk_weight`).
    pub masked: i64,
    /// The ordered dQ scheme (no split slots in deterministic mode) and the query heads (its semaphores
    /// are per query head): both shape the layout, so the fingerprint absorbs them.
    pub ordered_dq: i64,
    pub nhead_q: i64,
}

/// The kv-cache workspace's first bytes: what the last prepare found (spec/inference.md §1.8), written
/// by the prepare (the GPU kernel or the host) and read by `fmha_kvcache_launcher_check`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvCacheFault {
    /// `KVCACHE_PREPARED` once a prepare wrote the record.
    pub magic: u32,
    /// 0: no fault; otherwise the field at fault (`problem::paged::KvField`).
    pub field: i32,
    /// The sequence, the value that broke the rule, and the rule's bound.
    pub sequence: i64,
    pub value: i64,
    pub bound: i64,
}

/// An fp8 descale array on the device: the value for (sequence b, kv head g, physical page p) is
/// `data[b·batch_stride + g·head_stride + p·page_stride]` (fp32); `data` 0 means 1.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DescaleParams {
    pub data: u64,
    pub batch_stride: i64,
    pub head_stride: i64,
    pub page_stride: i64,
}

/// The kv-cache kernels' parameters (the forward and the prepare). The q/o/lse fields are named as
/// the forward's, so the forward kernel serves both (`hip/fwd/sm90/kernel.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KvCacheParams {
    pub q: u64,
    /// The pools.
    pub k: u64,
    pub v: u64,
    pub o: u64,
    /// 0: the LSE is not written.
    pub lse: u64,
    /// Group mode: `[batch + 1]` row offsets; 0 in batch mode.
    pub seqstart_q: u64,
    /// The table's arrays (0 where the kind has none).
    pub seqlen_k: u64,
    pub block_table: u64,
    pub kv_indptr: u64,
    pub page_indices: u64,
    pub last_page_len: u64,
    pub cache_batch_idx: u64,
    /// The prepare's fault record (`KvCacheFault`); 0 for the forward.
    pub workspace: u64,
    pub q_batch_stride: i64,
    pub q_head_stride: i64,
    pub q_row_stride: i64,
    /// `k_batch_stride`: the page stride (CONTIGUOUS: the slot stride).
    pub k_batch_stride: i64,
    pub k_head_stride: i64,
    pub k_row_stride: i64,
    pub v_batch_stride: i64,
    pub v_head_stride: i64,
    pub v_row_stride: i64,
    pub o_batch_stride: i64,
    pub o_head_stride: i64,
    pub o_row_stride: i64,
    pub lse_batch_stride: i64,
    pub lse_head_stride: i64,
    pub block_table_stride: i64,
    /// fp8 descales of q, k and v.
    pub q_descale: DescaleParams,
    pub k_descale: DescaleParams,
    pub v_descale: DescaleParams,
    pub batch: i32,
    pub nhead_q: i32,
    pub nhead_k: i32,
    pub hdim_q: i32,
    pub hdim_v: i32,
    /// Batch mode: every sequence's query rows; group mode: the rows of q.
    pub seqlen_q: i32,
    /// The traits' bounds: query rows and KV tokens of one sequence.
    pub max_seqlen_q: i32,
    pub max_seqlen_k: i32,
    pub group_mode: i32,
    /// 0 none, 2 bottom-right.
    pub mask_type: i32,
    pub window_left: i32,
    pub window_right: i32,
    /// Softmax scale times log2(e).
    pub scale_log2: f32,
    /// `FMHA_DTYPE_*` of q, k and v (fp8: o is bf16).
    pub dtype: i32,
    pub hdim_bucket: i32,
    pub masked: i32,
    /// `FMHA_KV_*` table kind.
    pub table_kind: i32,
    pub page_size: i32,
    pub num_pages: i32,
    pub max_pages_per_seq: i32,
    pub num_page_indices: i32,
    /// The prepare checks every page id used.
    pub check_tables: i32,
    /// Split-KV (spec/inference.md §3): chunks per sequence at most (1: unsplit, the fields below
    /// unused), fixed chunk length in key tiles (0: the prepare's `KvCacheSplitPlan`).
    pub max_splits: i32,
    pub split_tiles: i32,
    /// The forward's tile (query rows, keys) and the device's CU count: the prepare's adaptive chunk
    /// length is computed from them.
    pub block_m: i32,
    pub block_n: i32,
    pub cu_count: i32,
    /// The workspace's split plan (`KvCacheSplitPlan`, written by the prepare) and the partial
    /// results: fp32 LSE `[split][head][row]` and O `[split][head][row][hdim_v]`, `partial_rows` rows
    /// per plane (a row is `q_start + i` in group mode, `b·seqlen_q + i` in batch mode).
    pub split_plan: u64,
    pub partial_lse: u64,
    pub partial_o: u64,
    pub partial_rows: i64,
    /// 1: the decode tile with packed GQA (each tile row a (query row, query head) pair of one kv head;
    /// the instance's `block_m` rows count those pairs).
    pub pack_gqa: i32,
    pub pad: i32,
    /// The workspace's longest-first sequence order (i32 `[batch]`, valid where the plan's `ordered`
    /// equals `batch`) and the classes the prepare sorts it by (u8 `[batch]`); 0 where the workspace
    /// has none.
    pub sequence_order: u64,
    pub order_keys: u64,
    /// Device address of the scheduler workspace's tile counter (int32), 0 when the run has none: the
    /// sm_90a launch may zero it on the stream and run a persistent grid that takes tiles from it.
    pub tile_counter: u64,
}

/// The chunk length the prepare chose for a call (`problem::split::adaptive_tiles`); read by the
/// forward and the combine of a splitting launcher. Without `KVCACHE_PREPARED` in `magic` the kernels
/// split nothing.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvCacheSplitPlan {
    pub magic: u32,
    pub tiles_per_split: i32,
    /// The batch whose longest-first order the workspace holds (`problem::split::longest_first`), 0
    /// for none: the grid then runs the sequences in their order.
    pub ordered: i32,
    pub pad: i32,
}

/// `KvCacheFault::magic` of a prepared workspace ("KVCP").
pub const KVCACHE_PREPARED: u32 = 0x4B56_4350;

/// The merge kernel's parameters (`hip/merge/merge.hip`): states `[state][head][row][hdim]` and their
/// LSEs `[state][head][row]` (fp32) by strides, merged into `o_out [head][row][hdim]` and `lse_out
/// [head][row]`. Columns are contiguous; `o_out` may be state 0 itself (same address and strides).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeParams {
    pub o_in: u64,
    pub lse_in: u64,
    pub o_out: u64,
    /// 0: the merged LSE is not written.
    pub lse_out: u64,
    pub o_in_state_stride: i64,
    pub o_in_head_stride: i64,
    pub o_in_row_stride: i64,
    pub lse_in_state_stride: i64,
    pub lse_in_head_stride: i64,
    pub lse_in_row_stride: i64,
    pub o_out_head_stride: i64,
    pub o_out_row_stride: i64,
    pub lse_out_head_stride: i64,
    pub lse_out_row_stride: i64,
    pub num_states: i32,
    pub num_rows: i32,
    pub nhead: i32,
    pub hdim: i32,
    /// `FMHA_DTYPE_*` of the states and of the output: 0 fp16, 1 bf16, 2 fp32.
    pub in_dtype: i32,
    pub out_dtype: i32,
    /// 1: the LSEs read and written are base 2 (flashinfer's); 0: natural log.
    pub lse_base2: i32,
    pub pad: i32,
}

/// The fill kernel's arguments.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FillParams {
    /// `count` 32-bit words at `dst` are set to `value`.
    pub dst: u64,
    pub count: u64,
    pub value: u32,
    pub pad: u32,
}

/// The workspace prepare's arguments: where the metadata goes, the seqstarts it is built from
/// (`[batch + 1]` each in group mode, 0 in batch mode; device addresses for the GPU kernel, host
/// addresses for the CPU routine), and the layout.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareArgs {
    /// The workspace's first byte: the metadata region (`params.metadata_bytes` bytes) starts here.
    pub workspace: u64,
    pub seqstart_q: u64,
    pub seqstart_k: u64,
    pub params: PrepareParams,
}

/// A unit of the deterministic backward's schedule as the CPU-compiled C++ walkers report it
/// (`schedule::WorkUnit`; the tests compare the two walks).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct UnitRecord {
    pub batch: i32,
    /// The kv head.
    pub head: i32,
    pub k_tile: i32,
    pub split: i32,
    /// 1: the workgroup's first unit in this split slot.
    pub first_in_slot: i32,
}

/// The arguments of the CPU-compiled walkers: the backward's parameters (group mode: `workspace` is the
/// host address of a prepared metadata region) and which workgroup's walk.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WalkArgs {
    pub params: BwdParams,
    pub worker: i64,
    /// 1: the masked kernels' order (interleaved K tiles).
    pub masked: i32,
    pub pad: i32,
}

// Every C++ entry point takes one argument block and returns a status: the launch stubs also take the
// stream they enqueue on (a `cudaStream_t` / `hipStream_t`); the CPU-compiled twins take an output
// buffer and its capacity. Each returns the runtime's error code of the launch, or the routine's
// status / count, as documented.
extern "C" {
    /// Loads each translation unit's code module onto the current device (one kernel of each; the rest
    /// of a loaded module's kernels load without waiting for the device). Returns the runtime's error
    /// code, 0 on success.
    pub fn fmha_hip_load_fill() -> i32;
    pub fn fmha_hip_load_prepare() -> i32;
    pub fn fmha_hip_load_forward() -> i32;
    pub fn fmha_hip_load_backward() -> i32;
    pub fn fmha_hip_load_kvcache() -> i32;
    pub fn fmha_hip_load_merge() -> i32;

    /// Sets the words `*args` names, on `stream`.
    pub fn fmha_hip_fill_u32(args: *const FillParams, stream: *mut c_void) -> i32;

    /// Builds the backward workspace's metadata region from the device seqstarts, in one thread, without
    /// host synchronization. `*args` is copied into the launch; invalid seqstarts leave an all-zero
    /// region ("not prepared").
    pub fn fmha_hip_prepare_workspace(args: *const PrepareArgs, stream: *mut c_void) -> i32;

    /// Runs the attention forward described by `*params` (an instance the registry listed).
    pub fn fmha_hip_fwd(params: *const FwdParams, stream: *mut c_void) -> i32;

    /// Runs the kv-cache forward described by `*params` (an instance the registry listed).
    pub fn fmha_hip_kvcache_fwd(params: *const KvCacheParams, stream: *mut c_void) -> i32;

    /// Merges the attention states `*params` describes (one wave per (row, head); no workspace).
    pub fn fmha_hip_merge(params: *const MergeParams, stream: *mut c_void) -> i32;

    /// Checks the lengths and tables `*params` describes and writes the fault record at
    /// `params.workspace` (one workgroup; no host synchronization).
    pub fn fmha_hip_kvcache_prepare(params: *const KvCacheParams, stream: *mut c_void) -> i32;

    /// Runs the backward described by `*params` (an instance the registry listed) on a workspace prepared
    /// for it: dot_do_o with the dq_acc zeroing, dq_dk_dv, convert_dq.
    pub fn fmha_hip_bwd(params: *const BwdParams, stream: *mut c_void) -> i32;

    /// The prepare routine compiled for the host CPU (every backend), on host addresses: writes
    /// `args.params.metadata_bytes` bytes at `args.workspace`. Returns 0, or the status code of the
    /// failure (the region is then all zero). `unused` is null.
    pub fn fmha_cpu_prepare_workspace(args: *const PrepareArgs, unused: *mut c_void) -> i32;

    /// The kv-cache prepare compiled for the host CPU (every backend), on host addresses: writes the
    /// fault record at `params.workspace` and the split plan at `params.split_plan` (when not 0). Returns 0, or 8 (null pointer) when that is 0.
    pub fn fmha_cpu_kvcache_prepare(params: *const KvCacheParams, unused: *mut c_void) -> i32;

    /// `hip/kvcache/split.h`'s chunks of a sequence of `kv_len` keys under `*params`' split policy,
    /// compiled for the host CPU: `out[0]` the count, `out[1]` the key tiles per chunk.
    pub fn fmha_cpu_kvcache_chunks(params: *const KvCacheParams, kv_len: i64, out: *mut i64);

    /// The warp-specialized dense forward's grid (`hip/fwd/sm90/tile_walk.h`) compiled for the host CPU:
    /// the grid of `*params` on `sms` SMs into `out` (its tiles, CTAs, 1 if counted, then each tile's q
    /// block and pair), if `capacity` values hold it; returns the count of values it has.
    pub fn fmha_cpu_dense_grid(params: *const FwdParams, sms: i64, out: *mut i64, capacity: i64) -> i64;

    /// `hip/common/fast_divide.h` compiled for the host CPU: `n` divided by `*divisor`, `out[0]` the
    /// quotient, `out[1]` the remainder.
    pub fn fmha_cpu_fast_divide(divisor: *const i64, n: i64, out: *mut i64);

    /// The deterministic walkers compiled for the host CPU (every backend): the units workgroup
    /// `args.worker` runs, in order, into `units` (at most `capacity`); returns how many there are (more
    /// than `capacity` when they did not fit).
    pub fn fmha_cpu_batch_jobs(args: *const WalkArgs, units: *mut UnitRecord, capacity: i64) -> i64;
    pub fn fmha_cpu_group_jobs(args: *const WalkArgs, units: *mut UnitRecord, capacity: i64) -> i64;
}
