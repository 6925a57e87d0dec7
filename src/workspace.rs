//! The backward workspace: one buffer = metadata region, then the compact fp32 dq_acc region
//! (spec `ck_fmha_bwd.md` §3).
//!
//! Metadata byte layout (all little-endian, every section 16-byte aligned, region rounded up to
//! 4096 so that dq_acc starts on a page; `G` = group mode and deterministic):
//!
//! | section | offset | contents |
//! |---|---|---|
//! | header (ours) | 0 | `u32` magic `"FMHW"`, `u32` format version, `u64` [`fingerprint`] of the inputs |
//! | nsplits | 16 | `i32 × (G ? batch : 1)` |
//! | dq_acc_offsets | after nsplits | `i64 × (G ? batch + 1 : 0)` (elements; the last is the total) |
//! | cu_state | after offsets | [`CuState`] × (G ? num_cus : 0), 32 bytes each |
//! | batch_state | after cu_state | [`BatchState`] × (G ? batch : 0), 16 bytes each |
//!
//! Bytes not covered by a section are zero, so the region is a pure function of the inputs and a
//! device-side prepare can be compared byte for byte with the host one. The header is our addition to
//! CK's layout: `run` checks it to refuse a workspace prepared for other arguments.

use crate::error::{ensure, Error, Result, Status};
use crate::schedule::{
    build_group_table, ceil_div, check_seqstart, BatchPersistent, BatchState, CuState, GroupTableOut, XcdRemap,
};

/// Alignment of every metadata section (the device reads them as 16-byte aligned structs).
pub const SECTION_ALIGNMENT: usize = 16;
/// The metadata region is rounded up to this, so dq_acc starts page-aligned.
pub const METADATA_ALIGNMENT: usize = 4096;
/// Largest metadata region a layout may have (1 GiB: some 38 million sequences in deterministic group
/// mode, far beyond any batch a kernel launch serves).
pub const MAX_METADATA_BYTES: usize = 1 << 30;
/// First word of a prepared metadata region: `"FMHW"` in little-endian byte order.
pub const MAGIC: u32 = u32::from_le_bytes(*b"FMHW");
/// Version of the byte layout above; part of the header and of the fingerprint.
pub const FORMAT_VERSION: u32 = 1;

/// Everything that shapes the workspace; known from the launcher's traits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceParams {
    pub group_mode: bool,
    pub deterministic: bool,
    pub batch: i64,
    pub nhead_q: i64,
    pub hdim_q: i64,
    /// Batch mode: per-batch Sq. Group mode: total physical q (`seqstart_q[batch]`).
    pub seqlen_q: i64,
    /// Batch mode: Sk. Group mode: total physical k (`seqstart_k[batch]`).
    pub seqlen_k: i64,
    /// Bound on every batch's physical k length (group mode).
    pub max_seqlen_k: i64,
    /// Rows of a q tile of the dq_dk_dv kernel (`kM0`).
    pub m0: i64,
    /// Rows of a K tile of the dq_dk_dv kernel (`kN0`).
    pub n0: i64,
    /// Workgroups of the persistent grid; the device prepare must use the same value.
    pub num_cus: i64,
    pub remap: XcdRemap,
}

impl WorkspaceParams {
    /// Whether the group-mode persistent table (offsets, cu_state, batch_state) is present.
    fn group_persistent(&self) -> bool {
        self.group_mode && self.deterministic
    }
}

/// One section of the metadata region (bytes relative to the workspace start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    pub offset: usize,
    pub count: usize,
    /// `count * element size` rounded up to [`SECTION_ALIGNMENT`].
    pub bytes: usize,
}

impl Section {
    fn after(prev: Option<Section>, count: usize, elem_bytes: usize) -> Section {
        let offset = prev.map_or(0, |p| p.offset + p.bytes);
        Section { offset, count, bytes: (count * elem_bytes).next_multiple_of(SECTION_ALIGNMENT) }
    }
}

/// Sizes and offsets of the workspace for one set of [`WorkspaceParams`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLayout {
    pub params: WorkspaceParams,
    pub header: Section,
    pub nsplits: Section,
    pub dq_acc_offsets: Section,
    pub cu_state: Section,
    pub batch_state: Section,
    /// Size of the metadata region = byte offset of dq_acc in the workspace.
    pub metadata_bytes: usize,
    dq_acc_upper_bytes: usize,
}

/// What [`prepare_metadata`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreparedInfo {
    /// dq_acc bytes this call's schedule addresses (≤ [`WorkspaceLayout::upper_bound_dq_acc_bytes`]).
    pub dq_acc_bytes: usize,
    /// The fingerprint written to the header.
    pub fingerprint: u64,
}

fn to_usize(v: i64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid(what, format!("{v} does not fit the address space")))
}

/// Product of non-negative factors, or `InvalidArgument` naming `what` and the factors.
fn size_product(factors: &[(&str, i64)], what: &str) -> Result<usize> {
    factors.iter().try_fold(1usize, |acc, &(_, f)| usize::try_from(f).ok().and_then(|f| acc.checked_mul(f))).ok_or_else(
        || {
            let list: Vec<String> = factors.iter().map(|(n, f)| format!("{n}={f}")).collect();
            Error::invalid(what, format!("{} overflows the address space", list.join(" * ")))
        },
    )
}

impl WorkspaceLayout {
    /// The layout for `params`; fails with `InvalidArgument` on out-of-range values or when a size
    /// overflows.
    pub fn new(params: &WorkspaceParams) -> Result<WorkspaceLayout> {
        let p = *params;
        let i32_max = i64::from(i32::MAX);
        for (field, value, min, max) in [
            ("batch", p.batch, 0, i32_max),
            ("nhead_q", p.nhead_q, 1, i32_max),
            ("hdim_q", p.hdim_q, 1, i32_max),
            ("seqlen_q", p.seqlen_q, 0, i32_max),
            ("seqlen_k", p.seqlen_k, 0, i32_max),
            ("max_seqlen_k", p.max_seqlen_k, 0, i32_max),
            ("m0", p.m0, 1, i32_max),
            ("n0", p.n0, 1, i32_max),
            ("num_cus", p.num_cus, 1, i32_max),
        ] {
            ensure((min..=max).contains(&value), field, || format!("{value} not in {min}..={max}"))?;
        }
        let g = p.group_persistent();
        let (b, ncu) = (p.batch as usize, p.num_cus as usize);
        let header = Section::after(None, 1, 16);
        let nsplits = Section::after(Some(header), if g { b } else { 1 }, 4);
        let dq_acc_offsets = Section::after(Some(nsplits), if g { b + 1 } else { 0 }, 8);
        let cu_state = Section::after(Some(dq_acc_offsets), if g { ncu } else { 0 }, 32);
        let batch_state = Section::after(Some(cu_state), if g { b } else { 0 }, 16);
        let metadata_bytes = (batch_state.offset + batch_state.bytes).next_multiple_of(METADATA_ALIGNMENT);
        // The host builds the region in memory of its own (and the device prepare walks it with one
        // thread): bound it rather than let an absurd batch size fail an allocation later.
        ensure(metadata_bytes <= MAX_METADATA_BYTES, "batch", || {
            format!(
                "{} sequences need a metadata region of {metadata_bytes} bytes; the most one launcher serves is \
                 {MAX_METADATA_BYTES} bytes (about {} sequences in deterministic group mode)",
                p.batch,
                MAX_METADATA_BYTES / 28
            )
        })?;

        // §3.4: 4 * nhead_q * F * total_q_padded * hdim_q, F = split slots per (batch, head).
        let total_q = if p.group_mode { p.seqlen_q } else { p.batch * p.seqlen_q };
        let splits = match (p.deterministic, p.group_mode) {
            (false, _) => 1,
            (true, true) => ceil_div(p.max_seqlen_k, p.n0),
            // Evaluated with the batch-mode Sk that `run` uses: the formula is not monotone in Sk,
            // so max_seqlen_k could give fewer splits than the schedule needs.
            (true, false) => BatchPersistent::new(p.batch, p.nhead_q, p.seqlen_k, p.n0, p.num_cus)?.nsplits,
        };
        let factors =
            [("4", 4), ("nhead_q", p.nhead_q), ("splits", splits), ("total_q", total_q), ("hdim_q", p.hdim_q)];
        let dq_acc_upper_bytes = size_product(&factors, "workspace_size")?;
        metadata_bytes.checked_add(dq_acc_upper_bytes).ok_or_else(|| {
            Error::invalid("workspace_size", format!("{metadata_bytes} + {dq_acc_upper_bytes} overflows"))
        })?;
        Ok(WorkspaceLayout {
            params: p,
            header,
            nsplits,
            dq_acc_offsets,
            cu_state,
            batch_state,
            metadata_bytes,
            dq_acc_upper_bytes,
        })
    }

    /// Bytes reserved for dq_acc: the most any sequence lengths allowed by the params can use.
    pub fn upper_bound_dq_acc_bytes(&self) -> usize {
        self.dq_acc_upper_bytes
    }

    /// Bytes the caller allocates: metadata region plus the dq_acc upper bound (checked in `new`).
    pub fn workspace_size(&self) -> usize {
        self.metadata_bytes + self.dq_acc_upper_bytes
    }

    /// Whether the run must zero the whole dq_acc region before dq_dk_dv (§3.5): in non-deterministic
    /// mode, where units add into shared slots. Deterministic mode departs from CK there: a worker's
    /// first unit in a split slot writes every row of it (see `WorkUnit::first_in_slot`), so batch
    /// mode zeroes nothing (convert_dq reads only the written slots, [`Self::summed_splits`]) and group
    /// mode zeroes only the used prefix, for the slots some head leaves unused
    /// ([`WorkspaceLayout::zero_dq_acc_elements`]). This is the host executor's and the NVIDIA kernel's
    /// rule; the AMD kernels keep CK's, zeroing before every run (`kFirstUnitWritesSlot` in
    /// `hip/bwd/workspace_view.h`).
    pub fn needs_zero_dq_acc(&self) -> bool {
        !self.params.deterministic
    }

    /// fp32 elements at the start of dq_acc that `run` must zero before dq_dk_dv when it need not zero
    /// the whole region (CK's `DqAccPrezeroKernel`): `offsets[batch]` in deterministic group mode, 0
    /// otherwise.
    pub fn zero_dq_acc_elements(&self, meta: &MetadataView<'_>) -> usize {
        if self.params.group_persistent() {
            meta.dq_acc_offset(self.params.batch as usize) as usize
        } else {
            0
        }
    }

    /// Where batch `b`'s dq_acc block lies (§3.2). `seqstart_q` is required in non-deterministic
    /// group mode and ignored otherwise.
    ///
    /// A batch whose Sk is 0 contributes nothing to dQ: convert_dq must write zeros for it without
    /// reading dq_acc (in deterministic group mode with no keys at all the block has 0 rows).
    pub fn dq_acc_block(&self, meta: &MetadataView<'_>, seqstart_q: Option<&[i32]>, b: usize) -> Result<DqAccBlock> {
        let p = &self.params;
        ensure((b as i64) < p.batch, "batch", || format!("index {b} out of range 0..{}", p.batch))?;
        let (hq, dq) = (p.nhead_q as usize, p.hdim_q as usize);
        let (base, nsplits, rows) = match (p.group_mode, p.deterministic) {
            (false, _) => {
                let (ns, sq) = (meta.nsplits(0) as usize, p.seqlen_q as usize);
                (b * hq * ns * sq * dq, ns, sq)
            }
            (true, false) => {
                let s = seqstart_q.ok_or_else(|| Error::null("seqstart_q"))?;
                ensure(s.len() as i64 == p.batch + 1, "seqstart_q", || format!("has {} entries", s.len()))?;
                let start = to_usize(i64::from(s[b]), "seqstart_q")?;
                let rows = to_usize(i64::from(s[b + 1]) - i64::from(s[b]), "seqstart_q")?;
                (start * hq * dq, 1, rows)
            }
            (true, true) => {
                let (lo, hi) = (meta.dq_acc_offset(b), meta.dq_acc_offset(b + 1));
                let ns = meta.nsplits(b);
                (lo as usize, ns as usize, ((hi - lo) / (p.nhead_q * ns * p.hdim_q)) as usize)
            }
        };
        Ok(DqAccBlock { base, nsplits, rows, hdim: dq })
    }

    /// The split slots of batch `b`, head `head` that hold its dQ partials, which convert_dq sums:
    /// in deterministic batch mode only those some worker wrote (`BatchPersistent::splits_used`; the
    /// rest were never zeroed), elsewhere all of the block's (zeroed before the run).
    pub fn summed_splits(&self, block: &DqAccBlock, b: usize, head: usize) -> Result<usize> {
        let p = &self.params;
        if p.group_mode || !p.deterministic {
            return Ok(block.nsplits);
        }
        let plan = BatchPersistent::new(p.batch, p.nhead_q, p.seqlen_k, p.n0, p.num_cus)?;
        Ok(plan.splits_used((b * p.nhead_q as usize + head) as i64) as usize)
    }
}

/// The workspace size for `params` (metadata region + dq_acc upper bound), from the traits alone.
pub fn workspace_size_upper_bound(params: &WorkspaceParams) -> Result<usize> {
    Ok(WorkspaceLayout::new(params)?.workspace_size())
}

/// The arguments of the C++ workspace prepare (`fmha_prepare_params` of `hip/bwd/prepare_params.h`,
/// field for field): the params and the layout the host computed, so the device-side prepare neither
/// recomputes nor can disagree with the layout. Every field is `i64` (no padding); booleans and the
/// XCD remap are 0 or 1.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareParams {
    pub group_mode: i64,
    pub deterministic: i64,
    pub batch: i64,
    pub nhead_q: i64,
    pub hdim_q: i64,
    pub seqlen_q: i64,
    pub seqlen_k: i64,
    pub max_seqlen_k: i64,
    pub m0: i64,
    pub n0: i64,
    pub num_cus: i64,
    /// 0: none, 1: 8 XCDs.
    pub remap: i64,
    pub nsplits_offset: i64,
    pub nsplits_count: i64,
    pub dq_acc_offsets_offset: i64,
    pub dq_acc_offsets_count: i64,
    pub cu_state_offset: i64,
    pub cu_state_count: i64,
    pub batch_state_offset: i64,
    pub batch_state_count: i64,
    pub metadata_bytes: i64,
}

impl PrepareParams {
    /// The prepare arguments for `layout`. Every size of a layout fits `i64`: [`WorkspaceLayout::new`]
    /// bounds the counts by `i32::MAX` and the region by the address space.
    pub fn new(layout: &WorkspaceLayout) -> PrepareParams {
        let p = &layout.params;
        let size = |v: usize| v as i64;
        PrepareParams {
            group_mode: i64::from(p.group_mode),
            deterministic: i64::from(p.deterministic),
            batch: p.batch,
            nhead_q: p.nhead_q,
            hdim_q: p.hdim_q,
            seqlen_q: p.seqlen_q,
            seqlen_k: p.seqlen_k,
            max_seqlen_k: p.max_seqlen_k,
            m0: p.m0,
            n0: p.n0,
            num_cus: p.num_cus,
            remap: match p.remap {
                XcdRemap::None => 0,
                XcdRemap::Xcd8 => 1,
            },
            nsplits_offset: size(layout.nsplits.offset),
            nsplits_count: size(layout.nsplits.count),
            dq_acc_offsets_offset: size(layout.dq_acc_offsets.offset),
            dq_acc_offsets_count: size(layout.dq_acc_offsets.count),
            cu_state_offset: size(layout.cu_state.offset),
            cu_state_count: size(layout.cu_state.count),
            batch_state_offset: size(layout.batch_state.offset),
            batch_state_count: size(layout.batch_state.count),
            metadata_bytes: size(layout.metadata_bytes),
        }
    }
}

/// One batch's dq_acc block: `[nhead_q][nsplits][rows][hdim]` fp32, contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DqAccBlock {
    /// Element offset of the block within the dq_acc region.
    pub base: usize,
    pub nsplits: usize,
    /// Physical q rows of the batch.
    pub rows: usize,
    pub hdim: usize,
}

impl DqAccBlock {
    /// Element offset (within the dq_acc region) of `dq_acc[h][split][row][col]`.
    pub fn index(&self, head: usize, split: usize, row: usize, col: usize) -> usize {
        self.base + ((head * self.nsplits + split) * self.rows + row) * self.hdim + col
    }
}

/// Folds one 64-bit word into the fingerprint state: `mix((h ^ word) + 0x9E3779B97F4A7C15)` with `mix`
/// the splitmix64 finaliser (a bijection with full avalanche; the added constant keeps a zero state
/// from absorbing zero words unchanged).
fn absorb(h: u64, word: u64) -> u64 {
    let mut z = (h ^ word).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Identifies what a workspace was prepared for: every field of `params` and the seqstart arrays.
///
/// Definition (reproducible on a device): start from `FORMAT_VERSION` and absorb, as 64-bit words,
/// `group_mode, deterministic, batch, nhead_q, hdim_q, seqlen_q, seqlen_k, max_seqlen_k, m0, n0,
/// num_cus, remap (0 none, 1 xcd8)`, then for each of seqstart_q, seqstart_k: `u64::MAX` when absent,
/// else its length followed by every entry sign-extended to 64 bits. Not a cryptographic hash: it
/// catches accidental reuse, not forgery.
pub fn fingerprint(params: &WorkspaceParams, seqstart_q: Option<&[i32]>, seqstart_k: Option<&[i32]>) -> u64 {
    let mut h = fingerprint_of_params(params);
    for seqstart in [seqstart_q, seqstart_k] {
        h = match seqstart {
            None => absorb(h, u64::MAX),
            Some(s) => s.iter().fold(absorb(h, s.len() as u64), |h, &v| absorb(h, i64::from(v) as u64)),
        };
    }
    h
}

/// The [`fingerprint`] state after the params words, before the seqstarts: the GPU kernels absorb the
/// device seqstarts of a run into it and compare with the header.
pub fn fingerprint_of_params(params: &WorkspaceParams) -> u64 {
    let p = params;
    let remap = match p.remap {
        XcdRemap::None => 0,
        XcdRemap::Xcd8 => 1,
    };
    let words = [
        i64::from(p.group_mode),
        i64::from(p.deterministic),
        p.batch,
        p.nhead_q,
        p.hdim_q,
        p.seqlen_q,
        p.seqlen_k,
        p.max_seqlen_k,
        p.m0,
        p.n0,
        p.num_cus,
        remap,
    ];
    words.iter().fold(u64::from(FORMAT_VERSION), |h, &w| absorb(h, w as u64))
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
    let misalign = metadata.as_ptr() as usize % SECTION_ALIGNMENT;
    ensure(misalign == 0, "workspace", || {
        format!("must be {SECTION_ALIGNMENT}-byte aligned (address mod {SECTION_ALIGNMENT} = {misalign})")
    })?;
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
    let dq_acc_bytes = match (seqstarts, p.deterministic) {
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
            let bytes = build_group_table(q, k, p.nhead_q, p.hdim_q, p.m0, p.n0, p.num_cus, p.remap, &mut out)?;
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
                &[("4", 4), ("nhead_q", p.nhead_q), ("total_q", i64::from(q[q.len() - 1])), ("hdim_q", p.hdim_q)],
                "workspace_size",
            )?
        }
        (None, deterministic) => {
            let splits = if deterministic {
                BatchPersistent::new(p.batch, p.nhead_q, p.seqlen_k, p.n0, p.num_cus)?.nsplits
            } else {
                1
            };
            put(region, ns_at, &(splits as i32).to_le_bytes());
            let factors = [
                ("4", 4),
                ("batch", p.batch),
                ("nhead_q", p.nhead_q),
                ("splits", splits),
                ("seqlen_q", p.seqlen_q),
                ("hdim_q", p.hdim_q),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::group_jobs;

    /// splitmix64, seeded from the clock (or `FMHA_TEST_SEED`); the seed is in every failure message.
    use crate::test_rng::Rng;

    /// A zeroed buffer of `len` bytes starting 16-byte aligned (plus `skew` bytes), in safe code.
    fn aligned(len: usize, skew: usize) -> (Vec<u8>, usize) {
        let v = vec![0u8; len + 32];
        let start = (16 - v.as_ptr() as usize % 16) % 16 + skew;
        (v, start)
    }

    fn params(group_mode: bool, deterministic: bool) -> WorkspaceParams {
        WorkspaceParams {
            group_mode,
            deterministic,
            batch: 2,
            nhead_q: 4,
            hdim_q: 64,
            seqlen_q: if group_mode { 250 } else { 100 },
            seqlen_k: if group_mode { 320 } else { 300 },
            max_seqlen_k: 300,
            m0: 64,
            n0: 128,
            num_cus: 16,
            remap: XcdRemap::None,
        }
    }

    const SQ: [i32; 3] = [0, 100, 250];
    const SK: [i32; 3] = [0, 300, 320];

    fn seqstarts(p: &WorkspaceParams) -> (Option<&'static [i32]>, Option<&'static [i32]>) {
        if p.group_mode {
            (Some(&SQ), Some(&SK))
        } else {
            (None, None)
        }
    }

    #[test]
    fn sizes_by_scenario() {
        // (group, det) -> (metadata bytes, dq_acc upper bound, needs zero)
        let cases = [
            // 4 * Hq 4 * F 1 * (B 2 * Sq 100) * Dq 64
            ((false, false), 4096, 204_800, true),
            // F = persistent nsplits: jph 3, total 24, jpw ceil(24/16) = 2 -> 1 + ceil(2/2) = 2
            ((false, true), 4096, 409_600, false),
            // 4 * 4 * 1 * total_q 250 * 64
            ((true, false), 4096, 256_000, true),
            // F = ceil(300/128) = 3; sections 16 + 16 + 32 + 16*32 + 2*16 = 608 -> 4096
            ((true, true), 4096, 768_000, false),
        ];
        for ((group, det), meta, upper, zero) in cases {
            let p = params(group, det);
            let l = WorkspaceLayout::new(&p).unwrap();
            assert_eq!((l.metadata_bytes, l.upper_bound_dq_acc_bytes(), l.needs_zero_dq_acc()), (meta, upper, zero));
            assert_eq!(l.workspace_size(), meta + upper);
            assert_eq!(workspace_size_upper_bound(&p), Ok(meta + upper));
            let (q, k) = seqstarts(&p);
            let (mut buf, at) = aligned(l.workspace_size(), 0);
            let info = prepare_metadata(&l, q, k, &mut buf[at..]).unwrap();
            assert!(info.dq_acc_bytes <= upper);
            let view = MetadataView::new(&l, &buf[at..]).unwrap();
            let exact = match (group, det) {
                (false, false) => 204_800,
                (false, true) => 409_600,
                (true, false) => 256_000,
                // sqw 128/192, nc 3/1, total_w 2304, target 144. Head 1 of batch 0 spans
                // 384..768: CU 2 (raw 288, past head 0's last chunk start) begins there with split
                // 0, CU 3 (raw 432) runs chunk 1 with split ceil(48/144) = 1, CU 4 (raw 576) chunk 2
                // with split ceil(192/144) = 2. nsplits = [3, 1]: 4 * 4 * 64 * (3*100 + 1*150).
                (true, true) => {
                    assert_eq!((view.nsplits(0), view.nsplits(1)), (3, 1));
                    460_800
                }
            };
            assert_eq!(info.dq_acc_bytes, exact);
            let zero_elems = if group && det { exact / 4 } else { 0 };
            assert_eq!(l.zero_dq_acc_elements(&view), zero_elems);
        }
        let p = params(true, true);
        let l = WorkspaceLayout::new(&p).unwrap();
        let offs: Vec<usize> =
            [l.header, l.nsplits, l.dq_acc_offsets, l.cu_state, l.batch_state].iter().map(|s| s.offset).collect();
        assert_eq!(offs, [0, 16, 32, 64, 576]);
    }

    #[test]
    fn large_metadata_rounds_to_pages() {
        let p = WorkspaceParams { batch: 1000, num_cus: 304, ..params(true, true) };
        let l = WorkspaceLayout::new(&p).unwrap();
        // 16 + 4000 + up(8008, 16) + 304*32 + 1000*16 = 37760 -> 10 pages
        assert_eq!(l.batch_state.offset + l.batch_state.bytes, 37_760);
        assert_eq!(l.metadata_bytes, 40_960);
        for s in [l.header, l.nsplits, l.dq_acc_offsets, l.cu_state, l.batch_state] {
            assert_eq!((s.offset % 16, s.bytes % 16), (0, 0));
        }
    }

    #[test]
    fn overflow_and_ranges_are_invalid_arguments() {
        let p = WorkspaceParams {
            nhead_q: i32::MAX as i64,
            hdim_q: i32::MAX as i64,
            seqlen_q: i32::MAX as i64,
            ..params(true, true)
        };
        let e = WorkspaceLayout::new(&p).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(e.message.starts_with("workspace_size") && e.message.contains("nhead_q=2147483647"), "{}", e.message);
        for (p, field) in [
            (WorkspaceParams { num_cus: 0, ..params(false, true) }, "num_cus"),
            (WorkspaceParams { nhead_q: 0, ..params(false, true) }, "nhead_q"),
            (WorkspaceParams { seqlen_q: -1, ..params(false, true) }, "seqlen_q"),
            (WorkspaceParams { n0: 0, ..params(true, true) }, "n0"),
        ] {
            let e = WorkspaceLayout::new(&p).unwrap_err();
            assert!(e.message.starts_with(field), "{field}: {}", e.message);
        }
    }

    #[test]
    fn prepare_validation_names_fields() {
        let l = WorkspaceLayout::new(&params(true, true)).unwrap();
        let (mut buf, at) = aligned(l.metadata_bytes, 0);
        let mut run = |q: Option<&[i32]>, k: Option<&[i32]>| prepare_metadata(&l, q, k, &mut buf[at..]).unwrap_err();
        type Case<'a> = (Option<&'a [i32]>, Option<&'a [i32]>, &'a str, &'a str);
        let cases: [Case; 8] = [
            (None, Some(&SK), "seqstart_q", "null"),
            (Some(&SQ), None, "seqstart_k", "null"),
            (Some(&[0, 100]), Some(&SK), "seqstart_q", "3"),
            (Some(&[1, 100, 250]), Some(&SK), "seqstart_q", "[0] = 1"),
            (Some(&[0, 100, 90]), Some(&SK), "seqstart_q", "batch 1"),
            (Some(&[0, 100, 251]), Some(&SK), "seqstart_q", "seqlen_q"),
            (Some(&SQ), Some(&[0, 10, 320]), "max_seqlen_k", "batch 1 has 310"),
            (Some(&SQ), Some(&[0, 300, 321]), "seqstart_k", "seqlen_k"),
        ];
        for (q, k, field, detail) in cases {
            let e = run(q, k);
            assert!(e.message.starts_with(field) && e.message.contains(detail), "{field}: {}", e.message);
        }
        let lb = WorkspaceLayout::new(&params(false, false)).unwrap();
        let e = prepare_metadata(&lb, Some(&SQ), None, &mut buf[at..]).unwrap_err();
        assert!(e.message.starts_with("seqstart_q") && e.message.contains("batch mode"), "{}", e.message);
        // Too small, misaligned.
        let e = prepare_metadata(&lb, None, None, &mut buf[at..at + 100]).unwrap_err();
        assert_eq!(e.status, Status::WorkspaceTooSmall);
        let (mut skewed, at) = aligned(lb.metadata_bytes, 4);
        let e = prepare_metadata(&lb, None, None, &mut skewed[at..]).unwrap_err();
        assert!(e.status == Status::InvalidArgument && e.message.starts_with("workspace"), "{}", e.message);
    }

    #[test]
    fn view_refuses_unprepared_and_foreign_workspaces() {
        let p = params(true, true);
        let l = WorkspaceLayout::new(&p).unwrap();
        let (mut buf, at) = aligned(l.metadata_bytes, 0);
        assert_eq!(MetadataView::new(&l, &buf[at..]).unwrap_err().status, Status::WorkspaceNotPrepared);
        let info = prepare_metadata(&l, Some(&SQ), Some(&SK), &mut buf[at..]).unwrap();
        let view = MetadataView::new(&l, &buf[at..]).unwrap();
        assert_eq!(view.fingerprint(), info.fingerprint);
        assert!(view.check_prepared_for(fingerprint(&p, Some(&SQ), Some(&SK))).is_ok());
        let other = fingerprint(&p, Some(&[0, 101, 250]), Some(&SK));
        assert_eq!(view.check_prepared_for(other).unwrap_err().status, Status::WorkspaceNotPrepared);
        let p2 = WorkspaceParams { num_cus: 17, ..p };
        assert_ne!(fingerprint(&p2, Some(&SQ), Some(&SK)), info.fingerprint);
        assert_ne!(fingerprint(&p, Some(&SK), Some(&SQ)), info.fingerprint);
        assert_ne!(fingerprint(&p, None, None), fingerprint(&p, Some(&[]), Some(&[])));
    }

    #[test]
    fn header_bytes_are_documented_layout() {
        let p = params(false, true);
        let l = WorkspaceLayout::new(&p).unwrap();
        let (mut buf, at) = aligned(l.metadata_bytes, 0);
        buf.fill(0xAB);
        let info = prepare_metadata(&l, None, None, &mut buf[at..]).unwrap();
        let m = &buf[at..at + l.metadata_bytes];
        assert_eq!(&m[0..4], b"FMHW");
        assert_eq!(&m[4..8], &1u32.to_le_bytes());
        assert_eq!(&m[8..16], &info.fingerprint.to_le_bytes());
        assert_eq!(&m[16..20], &2i32.to_le_bytes()); // nsplits of `sizes_by_scenario`
        assert!(m[20..].iter().all(|&b| b == 0));
        assert!(buf[at + l.metadata_bytes..].iter().all(|&b| b == 0xAB), "wrote past the metadata region");
    }

    /// Random group/batch cases: bytes used within the bound, bytes a pure function of the inputs, the
    /// view reads back what the builder computed, and dq_acc blocks tile the used prefix exactly.
    #[test]
    fn random_prepare_round_trip() {
        let mut rng = Rng::from_clock();
        let seed = rng.0;
        for case in 0..400 {
            let group_mode = rng.range(0, 2) > 0;
            let deterministic = rng.range(0, 2) > 0;
            let batch = rng.range(1, 40);
            let lens = |rng: &mut Rng, zero_all: bool| -> Vec<i32> {
                (0..batch)
                    .map(|_| if zero_all || rng.range(0, 3) == 0 { 0 } else { rng.range(1, 3000) as i32 })
                    .collect()
            };
            let sq = lens(&mut rng, false);
            let no_keys = rng.range(0, 10) == 0;
            let sk = lens(&mut rng, no_keys);
            let starts = |l: &[i32]| {
                std::iter::once(0)
                    .chain(l.iter().scan(0, |a, &x| {
                        *a += x;
                        Some(*a)
                    }))
                    .collect::<Vec<i32>>()
            };
            let (qs, ks) = (starts(&sq), starts(&sk));
            let max_sk = *sk.iter().max().unwrap() as i64 + rng.range(0, 1) * rng.range(0, 500);
            let p = WorkspaceParams {
                group_mode,
                deterministic,
                batch,
                nhead_q: [1, 2, 8, 32][rng.range(0, 3) as usize],
                hdim_q: [8, 64, 128][rng.range(0, 2) as usize],
                seqlen_q: if group_mode { qs[batch as usize] as i64 } else { rng.range(0, 3000) },
                seqlen_k: if group_mode { ks[batch as usize] as i64 } else { max_sk },
                max_seqlen_k: max_sk,
                m0: [16, 32, 64, 128][rng.range(0, 3) as usize],
                n0: [16, 64, 128][rng.range(0, 2) as usize],
                num_cus: rng.range(1, 320),
                remap: if rng.range(0, 1) == 0 { XcdRemap::None } else { XcdRemap::Xcd8 },
            };
            let ctx = format!("seed {seed} case {case}: {p:?} sq {sq:?} sk {sk:?}");
            let l = WorkspaceLayout::new(&p).unwrap();
            let (q, k) = if group_mode { (Some(&qs[..]), Some(&ks[..])) } else { (None, None) };
            let (mut a, at_a) = aligned(l.metadata_bytes, 0);
            let (mut b, at_b) = aligned(l.metadata_bytes + 64, 0);
            b.fill(0x5A);
            let info = prepare_metadata(&l, q, k, &mut a[at_a..]).unwrap();
            assert_eq!(prepare_metadata(&l, q, k, &mut b[at_b..]).unwrap(), info, "{ctx}");
            assert_eq!(&a[at_a..at_a + l.metadata_bytes], &b[at_b..at_b + l.metadata_bytes], "{ctx}: bytes differ");
            assert!(info.dq_acc_bytes <= l.upper_bound_dq_acc_bytes(), "{ctx}: {info:?} above bound");
            let view = MetadataView::new(&l, &a[at_a..]).unwrap();
            // Blocks are contiguous and end at the bytes used.
            let mut next = 0;
            for bi in 0..batch as usize {
                let blk = l.dq_acc_block(&view, q, bi).unwrap();
                let rows = if group_mode { (qs[bi + 1] - qs[bi]) as usize } else { p.seqlen_q as usize };
                let no_keys = group_mode && deterministic && ks[batch as usize] == 0;
                assert_eq!(blk.rows, if no_keys { 0 } else { rows }, "{ctx}: batch {bi}");
                assert_eq!(blk.base, next, "{ctx}: batch {bi}");
                next = blk.base + p.nhead_q as usize * blk.nsplits * blk.rows * blk.hdim;
                if blk.rows > 0 {
                    let last = blk.index(p.nhead_q as usize - 1, blk.nsplits - 1, blk.rows - 1, blk.hdim - 1);
                    assert_eq!(last + 1, next, "{ctx}");
                }
            }
            assert_eq!(next * 4, info.dq_acc_bytes, "{ctx}");
            if group_mode && deterministic {
                // Every unit's split fits the batch's slots, read back through the view.
                let states = view.batch_states();
                for i in 0..p.num_cus as usize {
                    for u in group_jobs(&view.cu_state(i), &states, p.nhead_q, false) {
                        assert!(u.split < view.nsplits(u.batch as usize), "{ctx}");
                    }
                }
                assert_eq!(l.zero_dq_acc_elements(&view) * 4, info.dq_acc_bytes, "{ctx}");
            }
        }
    }
}
