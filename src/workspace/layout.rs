//! The workspace's sizes and offsets, from the launcher's traits alone: the metadata sections, the
//! dq_acc region's upper bound, and where each batch's dq_acc block lies.

use super::metadata::MetadataView;
use crate::error::{ensure, Error, Result, Status};
use crate::schedule::{ceil_div, BatchPersistent, XcdRemap};

/// Alignment of every metadata section (the device reads them as 16-byte aligned structs).
pub const SECTION_ALIGNMENT: usize = 16;

/// Refuses a workspace (or metadata buffer) at `address` that does not start [`SECTION_ALIGNMENT`]-aligned.
pub fn check_section_aligned(field: &str, address: usize) -> Result<()> {
    let misalign = address % SECTION_ALIGNMENT;
    ensure(misalign == 0, field, || {
        format!("{address:#x} is not {SECTION_ALIGNMENT}-byte aligned (address mod {SECTION_ALIGNMENT} = {misalign})")
    })
}
/// Checks a launcher's workspace argument at `address`: not null, [`SECTION_ALIGNMENT`]-aligned (the
/// kernels read its sections as aligned structs), and — when the caller says how large it is (`bytes > 0`,
/// or always with `size_required`) — at least `need` bytes, the size `size_function` reports.
pub fn check_workspace_argument(
    address: usize,
    bytes: usize,
    need: usize,
    size_required: bool,
    size_function: &str,
) -> Result<()> {
    check_named_workspace_argument("workspace", address, bytes, need, size_required, size_function)
}

/// Bytes of a scheduler workspace (`fmha_fwd_args.workspace`, `fmha_kvcache_args.scheduler_workspace`;
/// `fmha_fwd_workspace_size`, `fmha_kvcache_launcher_scheduler_workspace_size`): the sm_90a launch's tile
/// counter (int32), padded to the 16 bytes a workspace is aligned to. The call writes these bytes.
pub const SCHEDULER_WORKSPACE_BYTES: usize = 16;

/// Checks an optional scheduler workspace passed as `field` at `address` (its size as `{field}_size`):
/// NULL is none, whatever the size; otherwise it is checked like a launcher's workspace against
/// [`SCHEDULER_WORKSPACE_BYTES`], which `size_function` reports, its size required. Returns whether one
/// was given.
pub fn check_scheduler_workspace(field: &str, address: usize, bytes: usize, size_function: &str) -> Result<bool> {
    if address == 0 {
        return Ok(false);
    }
    check_named_workspace_argument(field, address, bytes, SCHEDULER_WORKSPACE_BYTES, true, size_function)?;
    Ok(true)
}

/// [`check_workspace_argument`] of a workspace passed as `field` (its size as `{field}_size`): the errors
/// name that field.
fn check_named_workspace_argument(
    field: &str,
    address: usize,
    bytes: usize,
    need: usize,
    size_required: bool,
    size_function: &str,
) -> Result<()> {
    if address == 0 {
        return Err(Error::null(field));
    }
    check_section_aligned(field, address)?;
    if (size_required || bytes > 0) && bytes < need {
        return Err(Error::new(
            Status::WorkspaceTooSmall,
            format!("{field}_size: {bytes} bytes given, {need} needed ({size_function})"),
        ));
    }
    Ok(())
}

// The host builds metadata regions in `AlignedBytes`.
const _: () = assert!(crate::host_buffer::ALIGNMENT % SECTION_ALIGNMENT == 0);
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
    /// Deterministic mode's dQ scheme: `true` adds every unit's dQ partial into one dq_acc in a fixed
    /// order per q tile, each (batch, query head, q tile) counting its writers in a semaphore after
    /// dq_acc (FlashAttention-3's scheme: the NVIDIA kernel and the host executor); `false` gives each
    /// persistent workgroup split slots of its own, summed by convert_dq (CK's scheme: every backend).
    /// The launcher chooses (`bwd::dq_scheme::runs_ordered`).
    pub ordered_dq: bool,
    pub batch: i64,
    /// Query heads: the ordered scheme's semaphores are per query head.
    pub nhead_q: i64,
    /// Key/value heads: the schedule's work unit is one (batch, kv head, K tile), which loops over the
    /// query heads of its kv head, so dK/dV are reduced over the GQA group inside the unit.
    pub nhead_k: i64,
    /// fp32 elements of one dq_acc row: the `nhead_q / nhead_k` query heads of a kv head times
    /// `hdim_q` (with `nhead_q == nhead_k` exactly CK's `[b][h][split][sq][dq]`).
    pub row_elements: i64,
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
    /// Whether the kernel masks: the group-mode schedule then weighs a chunk by the rows a causal mask
    /// keeps ([`crate::schedule::chunk_weight`]).
    pub masked: bool,
}

impl WorkspaceParams {
    /// Whether dQ goes to split slots of the persistent schedule (deterministic, not ordered).
    pub fn split_slots(&self) -> bool {
        self.deterministic && !self.ordered_dq
    }

    /// Whether dQ is added in turn into one dq_acc (deterministic, ordered).
    pub fn ordered(&self) -> bool {
        self.deterministic && self.ordered_dq
    }

    /// Whether the group-mode persistent table (offsets, cu_state, batch_state) is present.
    fn group_persistent(&self) -> bool {
        self.group_mode && self.split_slots()
    }

    /// The ordered scheme's semaphores (int32, zero before dq_dk_dv): one per (batch, query head, q tile)
    /// in batch mode, `(h * (ceil(seqlen_q / m0) + batch) + seqstart_q[b] / m0 + b + t)` in group mode,
    /// where a sequence's tiles fit between its neighbours' however its start falls against m0
    /// ([`WorkspaceLayout::dq_semaphore`]); 0 outside the ordered scheme.
    fn dq_semaphore_words(&self) -> Result<usize> {
        if !self.ordered() {
            return Ok(0);
        }
        let tiles = ceil_div(self.seqlen_q, self.m0);
        let per_head = if self.group_mode { tiles + self.batch } else { self.batch * tiles };
        Ok(size_product(&[("nhead_q", self.nhead_q), ("q tiles", per_head)], "workspace_size")?.next_multiple_of(4))
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
    /// The persistent schedule of deterministic batch mode (None otherwise), computed once.
    pub batch_plan: Option<BatchPersistent>,
    pub header: Section,
    pub nsplits: Section,
    pub dq_acc_offsets: Section,
    pub cu_state: Section,
    pub batch_state: Section,
    /// Size of the metadata region = byte offset of dq_acc in the workspace.
    pub metadata_bytes: usize,
    dq_acc_upper_bytes: usize,
    /// int32 words of the ordered scheme's semaphores, right after the dq_acc upper bound (a multiple
    /// of 4; 0 outside it).
    pub dq_semaphore_words: usize,
}

pub(super) fn to_usize(v: i64, what: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::invalid(what, format!("{v} does not fit the address space")))
}

/// Product of non-negative factors, or `InvalidArgument` naming `what` and the factors.
pub(super) fn size_product(factors: &[(&str, i64)], what: &str) -> Result<usize> {
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
            ("nhead_k", p.nhead_k, 1, i32_max),
            ("row_elements", p.row_elements, 1, i32_max),
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

        // The deterministic batch-mode schedule, computed once here: every user (metadata, kernel
        // parameters, host executor, convert_dq's sums) reads it from the layout.
        let batch_plan = (p.split_slots() && !p.group_mode)
            .then(|| BatchPersistent::new(p.batch, p.nhead_k, p.seqlen_k, p.n0, p.num_cus))
            .transpose()?;
        // §3.4: 4 * heads * F * total_q_padded * row elements, F = split slots per (batch, kv head).
        let total_q = if p.group_mode { p.seqlen_q } else { p.batch * p.seqlen_q };
        let splits = match (&batch_plan, p.split_slots()) {
            (_, false) => 1,
            // Evaluated with the batch-mode Sk that `run` uses: the formula is not monotone in Sk,
            // so max_seqlen_k could give fewer splits than the schedule needs.
            (Some(plan), true) => plan.nsplits,
            (None, true) => ceil_div(p.max_seqlen_k, p.n0),
        };
        let factors = [
            ("4", 4),
            ("nhead_k", p.nhead_k),
            ("splits", splits),
            ("total_q", total_q),
            ("row_elements", p.row_elements),
        ];
        let dq_acc_upper_bytes = size_product(&factors, "workspace_size")?;
        let dq_semaphore_words = p.dq_semaphore_words()?;
        metadata_bytes
            .checked_add(dq_acc_upper_bytes)
            .and_then(|b| b.checked_add(dq_semaphore_words.checked_mul(4)?))
            .ok_or_else(|| {
                Error::invalid(
                    "workspace_size",
                    format!("{metadata_bytes} + {dq_acc_upper_bytes} + 4 * {dq_semaphore_words} overflows"),
                )
            })?;
        Ok(WorkspaceLayout {
            params: p,
            batch_plan,
            header,
            nsplits,
            dq_acc_offsets,
            cu_state,
            batch_state,
            metadata_bytes,
            dq_acc_upper_bytes,
            dq_semaphore_words,
        })
    }

    /// Bytes reserved for dq_acc: the most any sequence lengths allowed by the params can use.
    pub fn upper_bound_dq_acc_bytes(&self) -> usize {
        self.dq_acc_upper_bytes
    }

    /// Bytes the caller allocates: metadata region, the dq_acc upper bound and the ordered scheme's
    /// semaphores (checked in `new`).
    pub fn workspace_size(&self) -> usize {
        self.metadata_bytes + self.dq_acc_upper_bytes + 4 * self.dq_semaphore_words
    }

    /// Whether the run must zero the whole dq_acc region before dq_dk_dv (§3.5): in non-deterministic
    /// mode, where units add into shared slots. Deterministic mode departs from CK there: a worker's
    /// first unit in a split slot writes every row of it (see `WorkUnit::first_in_slot`), so batch
    /// mode zeroes nothing (convert_dq reads only the written slots, [`Self::summed_splits`]) and group
    /// mode zeroes only the used prefix, for the slots some head leaves unused
    /// ([`WorkspaceLayout::zero_dq_acc_elements`]). This is the host executor's and the NVIDIA kernel's
    /// rule; the AMD kernels keep CK's, zeroing before every run (`kFirstUnitWritesSlot` in
    /// `hip/bwd/workspace_view.h`). The ordered scheme adds into one zeroed dq_acc, like the
    /// non-deterministic mode (the GPU zeroes its semaphores with it; the host executor keeps its turn
    /// counters in memory of its own).
    pub fn needs_zero_dq_acc(&self) -> bool {
        !self.params.split_slots()
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
        let (hq, dq) = (p.nhead_k as usize, p.row_elements as usize);
        let (base, nsplits, rows) = match (p.group_mode, p.split_slots()) {
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
                (lo as usize, ns as usize, ((hi - lo) / (p.nhead_k * ns * p.row_elements)) as usize)
            }
        };
        Ok(DqAccBlock { base, nsplits, rows, hdim: dq })
    }

    /// The split slots of batch `b`, head `head` that hold its dQ partials, which convert_dq sums:
    /// in deterministic batch mode only those some worker wrote (`BatchPersistent::splits_used`; the
    /// rest were never zeroed), elsewhere all of the block's (zeroed before the run).
    pub fn summed_splits(&self, block: &DqAccBlock, b: usize, head: usize) -> usize {
        match &self.batch_plan {
            Some(plan) => plan.splits_used((b * self.params.nhead_k as usize + head) as i64) as usize,
            None => block.nsplits,
        }
    }
}

impl WorkspaceLayout {
    /// The ordered scheme's semaphore (word index after dq_acc) of query head `head`'s q tile `tile`
    /// (rows `tile * m0..`) of batch `b`, whose rows start at `q_start` in group mode (`seqstart_q[b]`;
    /// ignored in batch mode). `hip/bwd/dq_order.h`'s `dq_semaphore` is its twin.
    pub fn dq_semaphore(&self, b: i64, q_start: i64, head: i64, tile: i64) -> usize {
        let p = &self.params;
        let tiles = ceil_div(p.seqlen_q, p.m0);
        let word = if p.group_mode {
            head * (tiles + p.batch) + q_start / p.m0 + b + tile
        } else {
            (b * p.nhead_q + head) * tiles + tile
        };
        word as usize
    }
}

/// The workspace size for `params` (metadata region + dq_acc upper bound), from the traits alone.
pub fn workspace_size_upper_bound(params: &WorkspaceParams) -> Result<usize> {
    Ok(WorkspaceLayout::new(params)?.workspace_size())
}

/// One batch's dq_acc block: `[nhead_k][nsplits][rows][row_elements]` fp32, contiguous.
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
