//! The kv-cache forward on the host: the forward's blocks (q tile, query head, sequence) with key and
//! value rows looked up through the page table, fp8 codes decoded and multiplied by their descales.
//! Every sequence's rows and table are checked before any block runs, naming the field at fault (a GPU
//! kernel clamps instead); the prepare records the same faults in the workspace, and the chunk length
//! of a splitting launcher. Split calls attend chunk by chunk into the workspace's partials and then
//! combine them, in the GPU's chunks and order (`problem::split`, `problem::merge`).

use super::attend::{Attended, KeyValueRows, QueryIo, QueryTile};
use super::grid::for_each_block;
use super::tensor_view::{DescaleView, TensorView};
use crate::error::{Error, Result};
use crate::host_buffer::try_filled;
use crate::launch::abi::{KvCacheFault, KvCacheSplitPlan, KVCACHE_PREPARED};
use crate::launch::{KvCacheKargs, KvSplitArgs, KvTableArgs};
use crate::problem::mask::MaskType;
use crate::problem::merge::merge_row;
use crate::problem::paged::{resolve_sequences, PageTable, PoolLayout, Sequence, SequencePages, TableFault, TableKind};
use crate::problem::split::{adaptive_tiles, chunks, longest_first, order_key, work_units, Chunks};
use crate::problem::{Mode, Scalar};
use crate::runtime::host::DeviceSlice;
use crate::runtime::DevicePtr;

/// A host copy of a device array; empty for a null pointer (an optional array).
fn read_array(ptr: DevicePtr<i32>, len: usize, field: &str) -> Result<Vec<i32>> {
    if ptr.is_null() {
        return Ok(Vec::new());
    }
    let slice = DeviceSlice::<i32>::new(ptr, len, field)?;
    let mut out = try_filled(len, 0, field)?;
    slice.read_into(0, &mut out);
    Ok(out)
}

/// Host copies of a call's length and table arrays (what a prepare reads); empty where the call has
/// none.
#[derive(Debug, Default)]
pub struct TableArrays {
    pub seqstart_q: Vec<i32>,
    pub seqlen_k: Vec<i32>,
    pub cache_batch_idx: Vec<i32>,
    pub block_table: Vec<i32>,
    pub kv_indptr: Vec<i32>,
    pub page_indices: Vec<i32>,
    pub last_page_len: Vec<i32>,
}

impl TableArrays {
    pub fn read(k: &KvCacheKargs) -> Result<TableArrays> {
        let (b, t) = (k.batch as usize, &k.table);
        let mut arrays = TableArrays::default();
        if k.mode == Mode::Group {
            arrays.seqstart_q = read_array(k.seqstart_q, b + 1, "seqstart_q")?;
        }
        match t.kind {
            TableKind::Contiguous => {
                arrays.seqlen_k = read_array(t.seqlen_k, b, "seqlen_k")?;
                arrays.cache_batch_idx = read_array(t.cache_batch_idx, b, "cache_batch_idx")?;
            }
            TableKind::BlockTable => {
                arrays.seqlen_k = read_array(t.seqlen_k, b, "seqlen_k")?;
                let len = t.block_table_len(b).ok_or_else(|| {
                    Error::invalid("block_table_stride", "batch rows of the table span more than the address space")
                })?;
                arrays.block_table = read_array(t.block_table, len, "block_table")?;
            }
            TableKind::PageCsr => {
                arrays.kv_indptr = read_array(t.kv_indptr, b + 1, "kv_indptr")?;
                arrays.page_indices = read_array(t.page_indices, t.num_page_indices as usize, "page_indices")?;
                arrays.last_page_len = read_array(t.last_page_len, b, "last_page_len")?;
            }
        }
        Ok(arrays)
    }

    pub fn table<'a>(&'a self, t: &KvTableArgs) -> PageTable<'a> {
        PageTable {
            kind: t.kind,
            page_size: t.page_size,
            num_pages: t.num_pages,
            seqlen_k: &self.seqlen_k,
            block_table: &self.block_table,
            block_table_stride: t.block_table_stride,
            max_pages_per_seq: t.max_pages_per_seq,
            kv_indptr: &self.kv_indptr,
            page_indices: &self.page_indices,
            last_page_len: &self.last_page_len,
            cache_batch_idx: &self.cache_batch_idx,
        }
    }

    /// Every sequence, checked (with `check_pages`, every page id they use too).
    pub fn sequences(&self, k: &KvCacheKargs, check_pages: bool) -> std::result::Result<Vec<Sequence>, TableFault> {
        resolve_sequences(&self.table(&k.table), &self.seqstart_q, k.batch as usize, k.bounds, check_pages)
    }
}

/// The prepare: checks the call's lengths and tables and writes the outcome into the workspace's
/// fault record (the first fault in sequence order, or none), and into its split plan the adaptive
/// chunk length (no plan when a fault was found: the forward then splits nothing).
pub fn prepare(k: &KvCacheKargs, record: DeviceSlice<KvCacheFault>) -> Result<()> {
    let arrays = TableArrays::read(k)?;
    let sequences = arrays.sequences(k, k.check_tables);
    if !k.splits.plan.is_null() {
        let plan = match &sequences {
            Ok(sequences) => KvCacheSplitPlan {
                magic: KVCACHE_PREPARED,
                tiles_per_split: planned_tiles(k, sequences),
                ordered: write_order(k, sequences)?,
                pad: 0,
            },
            Err(_) => KvCacheSplitPlan::default(),
        };
        DeviceSlice::new(k.splits.plan, 1, "workspace")?.set(0, plan);
    }
    record.set(0, KvCacheFault::new(sequences.err()));
    Ok(())
}

/// Writes the call's longest-first sequence order (`problem::split::longest_first`) and its classes
/// into the workspace; returns the batch it covers (0: the call has more sequences than it holds).
fn write_order(k: &KvCacheKargs, sequences: &[Sequence]) -> Result<i32> {
    if k.splits.order.is_null() || k.batch > k.splits.order_len {
        return Ok(0);
    }
    let keys: Vec<u8> = sequences.iter().map(|s| order_key(sequence_work(k, s))).collect();
    let order_keys = DeviceSlice::new(k.splits.order_keys, keys.len(), "workspace")?;
    let order = DeviceSlice::new(k.splits.order, keys.len(), "workspace")?;
    for (i, (&key, b)) in keys.iter().zip(longest_first(&keys)).enumerate() {
        order_keys.set(i, key);
        order.set(i, b);
    }
    Ok(k.batch as i32)
}

/// A sequence's work units (`problem::split::work_units`, per tile head).
fn sequence_work(k: &KvCacheKargs, s: &Sequence) -> i64 {
    let pack = if k.instance.packed_gqa { k.nhead_q / k.nhead_k } else { 1 };
    work_units(s.sq * pack, s.pages.kv_len, k.instance.m0, k.instance.n0)
}

/// The adaptive chunk length of the call (`problem::split::adaptive_tiles`), as an i32 plan value.
fn planned_tiles(k: &KvCacheKargs, sequences: &[Sequence]) -> i32 {
    // A packed tile's rows are (query row, query head) pairs of one kv head.
    let pack = if k.instance.packed_gqa { k.nhead_q / k.nhead_k } else { 1 };
    let work: i64 = sequences.iter().map(|s| sequence_work(k, s)).sum();
    adaptive_tiles(work.saturating_mul(k.nhead_q / pack), k.splits.cu_count).min(i64::from(i32::MAX)) as i32
}

/// The workspace's partial results, as the split forward writes them and the combine reads them.
struct Partials {
    lse: DeviceSlice<f32>,
    o: DeviceSlice<f32>,
    rows: i64,
    heads: i64,
    /// The prepare's chunk length (0: no plan).
    planned: i64,
}

impl Partials {
    fn new(s: &KvSplitArgs, heads: i64, dv: usize) -> Result<Partials> {
        let plan = DeviceSlice::new(s.plan, 1, "workspace")?.get(0);
        let planned = if plan.magic == KVCACHE_PREPARED { i64::from(plan.tiles_per_split) } else { 0 };
        let states = (s.policy.max_splits * heads * s.rows) as usize;
        Ok(Partials {
            lse: DeviceSlice::new(s.partial_lse, states, "workspace")?,
            o: DeviceSlice::new(s.partial_o, states * dv, "workspace")?,
            rows: s.rows,
            heads,
            planned,
        })
    }

    /// The index of (split, head, row) in the LSE plane (times `dv`: in O's).
    fn state(&self, split: i64, head: i64, row: i64) -> usize {
        ((split * self.heads + head) * self.rows + row) as usize
    }
}

/// Runs the call: `E` is the element type of q, k and v, `O` that of o.
pub fn run<E: Scalar, O: Scalar>(k: &KvCacheKargs, cu_count: i64) -> Result<()> {
    if k.mask.kind == MaskType::TopLeft {
        return Err(Error::unsupported("mask_type: a KV cache's mask is aligned to the bottom-right corner"));
    }
    let arrays = TableArrays::read(k)?;
    let table = arrays.table(&k.table);
    let sequences = arrays.sequences(k, false)?;

    let mode = k.mode;
    let q = TensorView::<E>::new(k.q, k.extents.q, mode, "q")?;
    let o = TensorView::<O>::new(k.o, k.extents.o, mode, "o")?;
    let lse = if k.lse.ptr.is_null() { None } else { Some(TensorView::<f32>::new(k.lse, k.extents.lse, mode, "lse")?) };
    // The pools are addressed as batch-mode tensors whose batch is the page.
    let k_pool = TensorView::<E>::new(k.k, k.extents.k, Mode::Batch, "k")?;
    let v_pool = TensorView::<E>::new(k.v, k.extents.v, Mode::Batch, "v")?;
    let [q_descale, k_descale, v_descale] = DescaleView::of_call(&k.descales, k.descale_extents)?;
    let io = QueryIo { q: &q, o: &o, lse: lse.as_ref() };
    let m0 = k.instance.m0;
    let q_tiles = sequences.iter().map(|s| (s.sq + m0 - 1) / m0).max().unwrap_or(0) as usize;
    let heads = k.nhead_q as usize;
    let (dq, dv) = (k.hdim_q as usize, k.hdim_v as usize);
    let group = k.nhead_q / k.nhead_k;
    let policy = k.splits.policy;
    let partials = if policy.splits() { Some(Partials::new(&k.splits, k.nhead_q, dv)?) } else { None };
    let chunks_of = |seq: &Sequence| match &partials {
        Some(p) => chunks(seq.pages.kv_len, k.instance.n0, policy, p.planned),
        None => Chunks { count: 1, tiles: 0 },
    };
    // Batch mode: sequence b is batch b of q/o/lse; group mode: its rows start at q_start.
    let batch_of = |seq: &Sequence| if mode == Mode::Batch { seq.pages.batch as i64 } else { 0 };
    // The partials' row of a sequence's row i (`fmha_kvcache_params::partial_rows`).
    let partial_row = |seq: &Sequence, i: i64| match mode {
        Mode::Group => seq.q_start + i,
        Mode::Batch => seq.pages.batch as i64 * k.bounds.max_seqlen_q + i,
    };
    let splits = policy.max_splits as usize;

    for_each_block(q_tiles * heads * sequences.len() * splits, cu_count, |block| {
        let (split, rest) = ((block % splits) as i64, block / splits);
        let (tile, rest) = (rest % q_tiles, rest / q_tiles);
        let (h, seq) = ((rest % heads) as i64, &sequences[rest / heads]);
        let i0 = tile as i64 * m0;
        let chunks = chunks_of(seq);
        if i0 >= seq.sq || split >= chunks.count {
            return Ok(());
        }
        let (b, g) = (seq.pages.batch as i64, h / group);
        let m = ((i0 + m0).min(seq.sq) - i0) as usize;
        let n0 = k.instance.n0;
        let keys =
            if chunks.count > 1 { split * chunks.tiles * n0..(split + 1) * chunks.tiles * n0 } else { 0..i64::MAX };
        let tile = QueryTile {
            i0,
            rows: m,
            hdim_q: dq,
            hdim_v: dv,
            scale: k.scale,
            n0,
            mask: k.mask.resolve(seq.sq, seq.pages.kv_len),
            keys,
            round_p: E::round_probability,
        };
        let mut kv = PagedRows {
            table: &table,
            seq: &seq.pages,
            k: &k_pool,
            v: &v_pool,
            layout: k.layout,
            k_descale: &k_descale,
            v_descale: &v_descale,
            head: g,
            staging: Vec::new(),
        };
        let (qb, first, q_scale) = (batch_of(seq), seq.q_start + i0, q_descale.value(b, g, 0));
        let out = io.attend_rows(qb, h, first, q_scale, &tile, &mut kv)?;
        match &partials {
            Some(p) if chunks.count > 1 => {
                for (i, &lse) in out.lse.iter().enumerate() {
                    let state = p.state(split, h, partial_row(seq, i0 + i as i64));
                    p.lse.set(state, lse);
                    p.o.write_from(state * dv, &out.o[i * dv..(i + 1) * dv]);
                }
            }
            _ => io.write_rows(qb, h, first, &out, dv),
        }
        Ok(())
    })?;

    // The combine: each split row's chunks merged in chunk order.
    let Some(p) = &partials else { return Ok(()) };
    for_each_block(heads * sequences.len(), cu_count, |block| {
        let (h, seq) = ((block % heads) as i64, &sequences[block / heads]);
        let count = chunks_of(seq).count as usize;
        if count == 1 {
            return Ok(());
        }
        let mut row = vec![0f32; dv];
        let mut states = vec![0f32; count * dv];
        for i in 0..seq.sq {
            let r = partial_row(seq, i);
            for (c, state) in states.chunks_exact_mut(dv).enumerate() {
                p.o.read_into(p.state(c as i64, h, r) * dv, state);
            }
            let lse =
                merge_row(count, |c| p.lse.get(p.state(c as i64, h, r)), |c| &states[c * dv..(c + 1) * dv], &mut row);
            let merged = Attended { o: row.clone(), lse: vec![lse] };
            io.write_rows(batch_of(seq), h, seq.q_start + i, &merged, dv);
        }
        Ok(())
    })
}

/// Key and value rows of one sequence and kv head, through the page table, in true values.
struct PagedRows<'a, E> {
    table: &'a PageTable<'a>,
    seq: &'a SequencePages,
    k: &'a TensorView<E>,
    v: &'a TensorView<E>,
    layout: PoolLayout,
    k_descale: &'a DescaleView,
    v_descale: &'a DescaleView,
    head: i64,
    staging: Vec<E>,
}

impl<E: Scalar> PagedRows<'_, E> {
    /// Row `row` of `page` in the VECTORIZED order (spec §1.4), x = 16 bytes of elements: K's head
    /// dimension in vectors of x with the page's rows between them, V's rows in vectors of x.
    fn read_vectorized(&mut self, pool: &TensorView<E>, is_v: bool, page: i64, row: i64, out: &mut [f32]) {
        let x = (16 / std::mem::size_of::<E>()) as i64;
        let p = self.table.page_size;
        let base = pool.row_offset(page, self.head, 0) as i64;
        let d = out.len() as i64;
        let mut one = vec![E::from_f32(0.0)];
        for (e, value) in out.iter_mut().enumerate() {
            let e = e as i64;
            let at = if is_v {
                base + (row / x) * d * x + e * x + row % x
            } else {
                base + (e / x) * p * x + row * x + e % x
            };
            pool.slice().read_into(at as usize, &mut one);
            *value = one[0].to_f32();
        }
    }
}

impl<E: Scalar> KeyValueRows for PagedRows<'_, E> {
    fn read(&mut self, j: i64, k: &mut [f32], v: &mut [f32]) -> Result<()> {
        let (page, row) = self.table.locate(self.seq, j)?;
        match self.layout {
            PoolLayout::Strided => {
                self.k.read_row(page, self.head, row, k, &mut self.staging);
                self.v.read_row(page, self.head, row, v, &mut self.staging);
            }
            PoolLayout::Vectorized => {
                let (k_pool, v_pool) = (self.k, self.v);
                self.read_vectorized(k_pool, false, page, row, k);
                self.read_vectorized(v_pool, true, page, row, v);
            }
        }
        let b = self.seq.batch as i64;
        let (dk, dv) = (self.k_descale.value(b, self.head, page), self.v_descale.value(b, self.head, page));
        k.iter_mut().for_each(|x| *x *= dk);
        v.iter_mut().for_each(|x| *x *= dv);
        Ok(())
    }
}
