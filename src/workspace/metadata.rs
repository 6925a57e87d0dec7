//! The metadata region: built from the sequence starts (`prepare_metadata`, the host twin of
//! `hip/bwd/prepare_workspace.h`), and read back (`MetadataView`, what the host executor's kernels use).

use super::fingerprint::fingerprint;
use super::layout::{size_product, to_usize, WorkspaceLayout, WorkspaceParams, FORMAT_VERSION, MAGIC};
use crate::error::{ensure, Error, Result, Status};
use crate::schedule::{build_group_table, check_seqstart, BatchState, CuState, GroupTableOut};

/// What [`prepare_metadata`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreparedInfo {
    /// dq_acc bytes this call's schedule addresses (≤ [`WorkspaceLayout::upper_bound_dq_acc_bytes`]).
    pub dq_acc_bytes: usize,
    /// The fingerprint written to the header.
    pub fingerprint: u64,
}

/// Checks group-mode seqstarts against the params: `[batch + 1]`, from 0, non-decreasing, ending at
/// most at the total physical length the workspace was sized for (one launcher serves every batch
/// whose totals fit), and no batch longer than `max_seqlen_k` in k.
fn check_group_seqstarts(p: &WorkspaceParams, seqstart_q: &[i32], seqstart_k: &[i32]) -> Result<()> {
    for (field, s, total, total_name) in
        [("seqstart_q", seqstart_q, p.seqlen_q, "seqlen_q"), ("seqstart_k", seqstart_k, p.seqlen_k, "seqlen_k")]
    {
        check_seqstart(field, s, p.batch)?;
        let last = i64::from(s[s.len() - 1]);
        ensure(last <= total, field, || {
            format!("[{}] = {last} exceeds {total_name} (the launcher's total physical length) = {total}", p.batch)
        })?;
    }
    match seqstart_k.windows(2).position(|w| i64::from(w[1]) - i64::from(w[0]) > p.max_seqlen_k) {
        Some(b) => Err(Error::invalid(
            "max_seqlen_k",
            format!(
                "batch {b} has {} keys (seqstart_k[{}] - seqstart_k[{b}]) > max_seqlen_k = {}",
                i64::from(seqstart_k[b + 1]) - i64::from(seqstart_k[b]),
                b + 1,
                p.max_seqlen_k
            ),
        )),
        None => Ok(()),
    }
}

fn put(bytes: &mut [u8], offset: usize, value: &[u8]) {
    bytes[offset..offset + value.len()].copy_from_slice(value);
}

/// Writes the metadata region for these sequence starts into `metadata[..layout.metadata_bytes]` (the
/// rest of the slice, e.g. dq_acc, is not touched; zeroing dq_acc is the caller's job, see
/// [`WorkspaceLayout::needs_zero_dq_acc`]).
///
/// `seqstart_q`/`seqstart_k` are the host copies of the `[batch + 1]` physical starts: required in
/// group mode, absent in batch mode. `metadata` must start 16-byte aligned (the device reads the
/// sections as aligned structs).
pub fn prepare_metadata(
    layout: &WorkspaceLayout,
    seqstart_q: Option<&[i32]>,
    seqstart_k: Option<&[i32]>,
    metadata: &mut [u8],
) -> Result<PreparedInfo> {
    let p = &layout.params;
    if metadata.len() < layout.metadata_bytes {
        return Err(Error::new(
            Status::WorkspaceTooSmall,
            format!("workspace: {} bytes given, the metadata region needs {}", metadata.len(), layout.metadata_bytes),
        ));
    }
    super::check_section_aligned("workspace", metadata.as_ptr() as usize)?;
    let seqstarts = match (p.group_mode, seqstart_q, seqstart_k) {
        (true, Some(q), Some(k)) => {
            check_group_seqstarts(p, q, k)?;
            Some((q, k))
        }
        (true, None, _) => return Err(Error::null("seqstart_q")),
        (true, _, None) => return Err(Error::null("seqstart_k")),
        (false, None, None) => None,
        (false, q, _) => {
            let field = if q.is_some() { "seqstart_q" } else { "seqstart_k" };
            return Err(Error::invalid(field, "must be null in batch mode"));
        }
    };

    let region = &mut metadata[..layout.metadata_bytes];
    region.fill(0);
    let fp = fingerprint(p, seqstart_q, seqstart_k);
    put(region, 0, &MAGIC.to_le_bytes());
    put(region, 4, &FORMAT_VERSION.to_le_bytes());
    put(region, 8, &fp.to_le_bytes());

    let ns_at = layout.nsplits.offset;
    let dq_acc_bytes = match (seqstarts, p.split_slots()) {
        (Some((q, k)), true) => {
            let b = p.batch as usize;
            let mut nsplits = vec![0i32; b];
            let mut offsets = vec![0i64; b + 1];
            let mut cu_state = vec![CuState::default(); p.num_cus as usize];
            let mut batch_state = vec![BatchState::default(); b];
            let mut out = GroupTableOut {
                nsplits: &mut nsplits,
                offsets: &mut offsets,
                cu_state: &mut cu_state,
                batch_state: &mut batch_state,
            };
            let bytes =
                build_group_table(q, k, p.nhead_k, p.row_elements, p.m0, p.n0, p.masked, p.num_cus, p.remap, &mut out)?;
            for (i, v) in nsplits.iter().enumerate() {
                put(region, ns_at + 4 * i, &v.to_le_bytes());
            }
            for (i, v) in offsets.iter().enumerate() {
                put(region, layout.dq_acc_offsets.offset + 8 * i, &v.to_le_bytes());
            }
            for (i, c) in cu_state.iter().enumerate() {
                let at = layout.cu_state.offset + 32 * i;
                put(region, at, &c.w_lo.to_le_bytes());
                put(region, at + 8, &c.w_hi.to_le_bytes());
                for (j, v) in [c.ibatch, c.isplit, c.head_start, c.c_start].iter().enumerate() {
                    put(region, at + 16 + 4 * j, &v.to_le_bytes());
                }
            }
            for (i, s) in batch_state.iter().enumerate() {
                for (j, v) in [s.sq, s.nc, s.nsplits, s.pad].iter().enumerate() {
                    put(region, layout.batch_state.offset + 16 * i + 4 * j, &v.to_le_bytes());
                }
            }
            to_usize(bytes, "workspace_size")?
        }
        (Some((q, _)), false) => {
            put(region, ns_at, &1i32.to_le_bytes());
            size_product(
                &[
                    ("4", 4),
                    ("nhead_k", p.nhead_k),
                    ("total_q", i64::from(q[q.len() - 1])),
                    ("row_elements", p.row_elements),
                ],
                "workspace_size",
            )?
        }
        (None, _) => {
            let splits = layout.batch_plan.map_or(1, |plan| plan.nsplits);
            put(region, ns_at, &(splits as i32).to_le_bytes());
            let factors = [
                ("4", 4),
                ("batch", p.batch),
                ("nhead_k", p.nhead_k),
                ("splits", splits),
                ("seqlen_q", p.seqlen_q),
                ("row_elements", p.row_elements),
            ];
            size_product(&factors, "workspace_size")?
        }
    };
    Ok(PreparedInfo { dq_acc_bytes, fingerprint: fp })
}

/// Read access to a prepared metadata region (what kernels of the host backend use).
#[derive(Debug, Clone, Copy)]
pub struct MetadataView<'a> {
    layout: WorkspaceLayout,
    bytes: &'a [u8],
}

fn read4(bytes: &[u8], at: usize) -> [u8; 4] {
    [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]
}

fn read8(bytes: &[u8], at: usize) -> [u8; 8] {
    let (lo, hi) = (read4(bytes, at), read4(bytes, at + 4));
    [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
}

impl<'a> MetadataView<'a> {
    /// Views `bytes` (the workspace start) as metadata of `layout`: `WorkspaceTooSmall` if shorter than
    /// the region, `WorkspaceNotPrepared` if the header is not one [`prepare_metadata`] writes.
    pub fn new(layout: &WorkspaceLayout, bytes: &'a [u8]) -> Result<MetadataView<'a>> {
        if bytes.len() < layout.metadata_bytes {
            return Err(Error::new(
                Status::WorkspaceTooSmall,
                format!("workspace: {} bytes given, the metadata region needs {}", bytes.len(), layout.metadata_bytes),
            ));
        }
        let (magic, version) = (u32::from_le_bytes(read4(bytes, 0)), u32::from_le_bytes(read4(bytes, 4)));
        if magic != MAGIC || version != FORMAT_VERSION {
            return Err(Error::new(
                Status::WorkspaceNotPrepared,
                format!(
                    "workspace: no prepared metadata (header {magic:#010x} v{version}); call prepare_workspace first"
                ),
            ));
        }
        Ok(MetadataView { layout: *layout, bytes: &bytes[..layout.metadata_bytes] })
    }

    /// The fingerprint stored by [`prepare_metadata`].
    pub fn fingerprint(&self) -> u64 {
        u64::from_le_bytes(read8(self.bytes, 8))
    }

    /// `WorkspaceNotPrepared` unless the workspace was prepared for inputs with fingerprint `expected`.
    pub fn check_prepared_for(&self, expected: u64) -> Result<()> {
        let found = self.fingerprint();
        if found == expected {
            Ok(())
        } else {
            Err(Error::new(
                Status::WorkspaceNotPrepared,
                format!(
                    "workspace: prepared for other arguments (fingerprint {found:#018x}, these arguments \
                     {expected:#018x}); prepare it again with these sequence lengths"
                ),
            ))
        }
    }

    /// Split slots per (batch, head) of batch `b`; outside deterministic group mode one value holds
    /// for all batches.
    pub fn nsplits(&self, b: usize) -> i64 {
        let i = if self.layout.nsplits.count == 1 { 0 } else { b };
        i64::from(i32::from_le_bytes(read4(self.bytes, self.layout.nsplits.offset + 4 * i)))
    }

    /// `dq_acc_offsets[b]` (elements), `b` in `0..=batch`; deterministic group mode only.
    pub fn dq_acc_offset(&self, b: usize) -> i64 {
        i64::from_le_bytes(read8(self.bytes, self.layout.dq_acc_offsets.offset + 8 * b))
    }

    /// The state of workgroup `i` (deterministic group mode only).
    pub fn cu_state(&self, i: usize) -> CuState {
        let at = self.layout.cu_state.offset + 32 * i;
        let word = |k: usize| i32::from_le_bytes(read4(self.bytes, at + 16 + 4 * k));
        CuState {
            w_lo: i64::from_le_bytes(read8(self.bytes, at)),
            w_hi: i64::from_le_bytes(read8(self.bytes, at + 8)),
            ibatch: word(0),
            isplit: word(1),
            head_start: word(2),
            c_start: word(3),
        }
    }

    /// The state of batch `b` (deterministic group mode only).
    pub fn batch_state(&self, b: usize) -> BatchState {
        let at = self.layout.batch_state.offset + 16 * b;
        let word = |k: usize| i32::from_le_bytes(read4(self.bytes, at + 4 * k));
        BatchState { sq: word(0), nc: word(1), nsplits: word(2), pad: word(3) }
    }

    /// All batch states, as [`crate::schedule::group_jobs`] takes them.
    pub fn batch_states(&self) -> Vec<BatchState> {
        (0..self.layout.batch_state.count).map(|b| self.batch_state(b)).collect()
    }
}
