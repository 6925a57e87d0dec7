//! The C++ the GPU kernels run, compiled for the host CPU in every backend (`build.rs`,
//! `build_cpu_twins`): the workspace prepare routine and the deterministic walkers. The tests hold them
//! to the Rust code that the host executor runs, so that CI checks the device code paths without a GPU.

use super::abi::{
    self, BwdParams, FwdParams, KvCacheFault, KvCacheParams, KvCacheSplitPlan, PrepareArgs, PrepareParams, UnitRecord,
    WalkArgs,
};
use crate::host_buffer::AlignedBytes;
use crate::problem::split::Chunks;
use crate::runtime::foreign::{call_pair, call_stub, call_table, call_walker};
use crate::runtime::Stream;
use crate::schedule::WorkUnit;
use crate::workspace::WorkspaceLayout;

/// Runs the C++ workspace prepare (`hip/bwd/prepare_workspace.h`, the code of the device-side prepare
/// kernel) on the host CPU and returns the routine's result (0, or the [`crate::Status`] code of the
/// error `workspace::prepare_metadata` returns for the same inputs) and the `layout.metadata_bytes`
/// bytes it wrote, which must equal the Rust prepare's byte for byte. Where the prepare fails, the
/// routine writes an all-zero region.
///
/// `seqstart_q`/`seqstart_k` as for `prepare_metadata` (`[batch + 1]` each in group mode, `None` in
/// batch mode).
pub fn prepare_workspace(
    layout: &WorkspaceLayout,
    seqstart_q: Option<&[i32]>,
    seqstart_k: Option<&[i32]>,
) -> (i32, Vec<u8>) {
    let len = layout.metadata_bytes;
    // The routine reads `batch + 1` entries of each array it is given (device memory has no length); an
    // array of another length is refused here, as `prepare_metadata` refuses it.
    let entries = layout.params.batch as usize + 1;
    if [seqstart_q, seqstart_k].iter().flatten().any(|s| s.len() != entries) {
        return (crate::Status::InvalidArgument as i32, vec![0; len]);
    }
    // Poisoned, so that a byte the routine does not write shows up in the comparison.
    let mut buffer = AlignedBytes::new(len, 0xA5, "metadata").expect("test-sized metadata fits in memory");
    let host_address = |s: Option<&[i32]>| s.map_or(0, |s| s.as_ptr() as u64);
    let args = PrepareArgs {
        workspace: buffer.as_mut_slice().as_mut_ptr() as u64,
        seqstart_q: host_address(seqstart_q),
        seqstart_k: host_address(seqstart_k),
        params: PrepareParams::new(layout),
    };
    // The routine writes `metadata_bytes` = `len` bytes at `args.workspace`, which `buffer` holds, and
    // reads `entries` values of each seqstart array (checked above), all alive across the call.
    let code = call_stub(abi::fmha_cpu_prepare_workspace, &args, Stream(0));
    (code, buffer.as_slice().to_vec())
}

/// Runs the C++ kv-cache prepare (`hip/kvcache/page_table.h`, `split.h`: the code of the GPU prepare
/// kernel) on the host CPU over the host arrays `params` addresses, and returns the fault record and
/// the split plan it writes.
pub fn kvcache_prepare(params: &KvCacheParams) -> (KvCacheFault, KvCacheSplitPlan, Vec<i32>) {
    let mut record = KvCacheFault::default();
    let mut plan = KvCacheSplitPlan::default();
    let batch = params.batch.max(0) as usize;
    let (mut order, mut keys) = (vec![-1i32; batch], vec![0u8; batch]);
    let params = KvCacheParams {
        workspace: &mut record as *mut KvCacheFault as u64,
        split_plan: &mut plan as *mut KvCacheSplitPlan as u64,
        sequence_order: order.as_mut_ptr() as u64,
        order_keys: keys.as_mut_ptr() as u64,
        ..*params
    };
    // The routine reads the arrays `params` points at (host memory the caller keeps alive, of the
    // lengths the table kind implies) and writes one record at `workspace`, one plan at `split_plan`
    // and `batch` entries at `sequence_order` and `order_keys`, which are `record`, `plan`, `order`
    // and `keys`.
    let code = call_stub(abi::fmha_cpu_kvcache_prepare, &params, Stream(0));
    assert_eq!(code, 0, "the record address is not null");
    (record, plan, order)
}

/// The C++ chunks (`hip/kvcache/split.h`) of a sequence of `kv_len` keys under `params`' split
/// fields; a split plan, if the policy reads one, at the host address `params.split_plan`.
pub fn kvcache_chunks(params: &KvCacheParams, kv_len: i64) -> Chunks {
    let [count, tiles] = call_pair(abi::fmha_cpu_kvcache_chunks, params, kv_len);
    Chunks { count, tiles }
}

fn units(records: Vec<UnitRecord>) -> Vec<WorkUnit> {
    records
        .into_iter()
        .map(|r| WorkUnit {
            batch: i64::from(r.batch),
            head: i64::from(r.head),
            k_tile: i64::from(r.k_tile),
            split: i64::from(r.split),
            first_in_slot: r.first_in_slot != 0,
        })
        .collect()
}

/// The units the C++ `for_each_batch_job` walks for workgroup `worker` (`hip/bwd/schedule.h`), from
/// the kernel parameters' batch-mode schedule; `None` if more than `capacity`, or if `next_batch_job`'s
/// walk (the sm_90a kernel's) differs from it.
pub fn batch_jobs(params: &BwdParams, worker: i64, masked: bool, capacity: usize) -> Option<Vec<WorkUnit>> {
    let args = WalkArgs { params: *params, worker, masked: i32::from(masked), pad: 0 };
    call_walker(abi::fmha_cpu_batch_jobs, &args, capacity).map(units)
}

/// The units the C++ `for_each_group_job` walks for workgroup `worker`, reading the metadata region at
/// the host address `params.workspace`, which must hold a prepared region of the params' layout.
pub fn group_jobs(params: &BwdParams, worker: i32, masked: bool, capacity: usize) -> Option<Vec<WorkUnit>> {
    let args = WalkArgs { params: *params, worker: i64::from(worker), masked: i32::from(masked), pad: 0 };
    call_walker(abi::fmha_cpu_group_jobs, &args, capacity).map(units)
}

/// The warp-specialized dense forward's grid of `params` on `sms` SMs (`hip/fwd/sm90/tile_walk.h`, the
/// code its launch and kernel run): 128-row tiles of 16-bit elements.
pub struct DenseGrid {
    pub ctas: i64,
    pub counted: bool,
    /// Each tile's (q block, batch · nhead_q + query head), in the order the grid takes them.
    pub tiles: Vec<(i64, i64)>,
}

pub fn dense_grid(params: &FwdParams, sms: i64) -> DenseGrid {
    let tiles = (i64::from(params.max_seqlen_q) + 127) / 128 * i64::from(params.nhead_q) * i64::from(params.batch);
    let values = 3 + 2 * usize::try_from(tiles).expect("a test-sized grid");
    let out = call_table(abi::fmha_cpu_dense_grid, params, sms, values).expect("the grid has the tiles computed here");
    assert_eq!(out[0], tiles, "the C++ grid's tile count");
    DenseGrid { ctas: out[1], counted: out[2] != 0, tiles: out[3..].chunks(2).map(|p| (p[0], p[1])).collect() }
}

/// `hip/common/fast_divide.h`'s quotient and remainder of `n` by `divisor`.
pub fn fast_divide(divisor: i64, n: i64) -> (i64, i64) {
    let [q, r] = call_pair(abi::fmha_cpu_fast_divide, &divisor, n);
    (q, r)
}
