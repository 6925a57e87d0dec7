//! The paged KV-cache forward on the host: the forward's blocks (q tile, query head, sequence) with
//! key/value rows looked up through the page table. Every sequence's rows and table are checked before
//! any block runs, naming the field at fault (a GPU kernel clamps instead).

use super::attend::{attend, KeyValueRows, QueryTile};
use super::grid::for_each_block;
use super::tensor_view::TensorView;
use crate::error::{ensure, Error, Result};
use crate::host_buffer::try_filled;
use crate::launch::KvCacheKargs;
use crate::problem::mask::MaskType;
use crate::problem::paged::{PageTable, SequencePages, TableKind};
use crate::problem::{Element, Mode};
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

/// One sequence: its query rows in `q`/`o` and its pages.
struct Sequence {
    q_start: i64,
    sq: i64,
    pages: SequencePages,
}

pub fn run<E: Element>(k: &KvCacheKargs, cu_count: i64) -> Result<()> {
    if k.mask.kind == MaskType::TopLeft {
        return Err(Error::unsupported("mask_type: a KV cache's mask is aligned to the bottom-right corner"));
    }
    let (b, t) = (k.batch as usize, &k.table);
    let seqstart_q = read_array(k.seqstart_q, b + 1, "seqstart_q")?;
    let per_sequence = |ptr, field| read_array(ptr, b, field);
    let (seqlen_k, cache_batch_idx, block_table, kv_indptr, page_indices, last_page_len) = match t.kind {
        TableKind::Contiguous => (
            per_sequence(t.seqlen_k, "seqlen_k")?,
            per_sequence(t.cache_batch_idx, "cache_batch_idx")?,
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        ),
        TableKind::BlockTable => {
            let len = if b == 0 { 0 } else { (b - 1) * t.block_table_stride as usize + t.max_pages_per_seq as usize };
            (
                per_sequence(t.seqlen_k, "seqlen_k")?,
                Vec::new(),
                read_array(t.block_table, len, "block_table")?,
                Vec::new(),
                Vec::new(),
                Vec::new(),
            )
        }
        TableKind::PageCsr => (
            Vec::new(),
            Vec::new(),
            Vec::new(),
            read_array(t.kv_indptr, b + 1, "kv_indptr")?,
            read_array(t.page_indices, t.num_page_indices as usize, "page_indices")?,
            per_sequence(t.last_page_len, "last_page_len")?,
        ),
    };
    let table = PageTable {
        kind: t.kind,
        page_size: t.page_size,
        num_pages: t.num_pages,
        seqlen_k: &seqlen_k,
        block_table: &block_table,
        block_table_stride: t.block_table_stride,
        max_pages_per_seq: t.max_pages_per_seq,
        kv_indptr: &kv_indptr,
        page_indices: &page_indices,
        last_page_len: &last_page_len,
        cache_batch_idx: &cache_batch_idx,
    };
    let mut sequences = Vec::with_capacity(b);
    for batch in 0..b {
        let (start, end) = (i64::from(seqstart_q[batch]), i64::from(seqstart_q[batch + 1]));
        ensure(start >= 0 && start <= end && end <= k.total_q, "seqstart_q", || {
            format!("entries {batch}..{} are {start}, {end}: not non-decreasing within 0..={}", batch + 1, k.total_q)
        })?;
        sequences.push(Sequence { q_start: start, sq: end - start, pages: table.sequence(batch)? });
    }

    let q = TensorView::<E>::new(k.q, k.extents.q, Mode::Group, "q")?;
    let o = TensorView::<E>::new(k.o, k.extents.o, Mode::Group, "o")?;
    let lse = if k.lse.ptr.is_null() {
        None
    } else {
        Some(TensorView::<f32>::new(k.lse, k.extents.lse, Mode::Group, "lse")?)
    };
    // The pools are addressed as batch-mode tensors whose batch is the page.
    let k_pool = TensorView::<E>::new(k.k, k.extents.k, Mode::Batch, "k")?;
    let v_pool = TensorView::<E>::new(k.v, k.extents.v, Mode::Batch, "v")?;
    let m0 = k.m0;
    let q_tiles = sequences.iter().map(|s| (s.sq + m0 - 1) / m0).max().unwrap_or(0) as usize;
    let heads = k.nhead_q as usize;
    let (dq, dv) = (k.hdim_q as usize, k.hdim_v as usize);
    let group = k.nhead_q / k.nhead_k;

    for_each_block(q_tiles * heads * b, cu_count, |block| {
        let (tile, rest) = (block % q_tiles, block / q_tiles);
        let (h, seq) = ((rest % heads) as i64, &sequences[rest / heads]);
        let i0 = tile as i64 * m0;
        if i0 >= seq.sq {
            return Ok(());
        }
        let m = ((i0 + m0).min(seq.sq) - i0) as usize;
        let mut staging = Vec::new();
        let mut q_tile = vec![0f32; m * dq];
        for i in 0..m {
            q.read_row(0, h, seq.q_start + i0 + i as i64, &mut q_tile[i * dq..(i + 1) * dq], &mut staging);
        }
        let tile = QueryTile {
            q: &q_tile,
            i0,
            rows: m,
            hdim_q: dq,
            hdim_v: dv,
            scale: k.scale,
            n0: k.n0,
            mask: k.mask.resolve(seq.sq, seq.pages.kv_len),
            round_p: |p| E::DTYPE.round(p),
        };
        let mut kv = PagedRows { table: &table, seq: &seq.pages, k: &k_pool, v: &v_pool, head: h / group, staging };
        let out = attend(&tile, &mut kv)?;
        let mut staging = kv.staging;
        for i in 0..m {
            let row = seq.q_start + i0 + i as i64;
            o.write_row(0, h, row, &out.o[i * dv..(i + 1) * dv], &mut staging);
            if let Some(lse) = &lse {
                lse.slice().set(lse.row_offset(0, h, row), out.lse[i]);
            }
        }
        Ok(())
    })
}

/// Key and value rows of one sequence and kv head, through the page table.
struct PagedRows<'a, E> {
    table: &'a PageTable<'a>,
    seq: &'a SequencePages,
    k: &'a TensorView<E>,
    v: &'a TensorView<E>,
    head: i64,
    staging: Vec<E>,
}

impl<E: Element> KeyValueRows for PagedRows<'_, E> {
    fn read(&mut self, j: i64, k: &mut [f32], v: &mut [f32]) -> Result<()> {
        let (page, row) = self.table.locate(self.seq, j)?;
        self.k.read_row(page, self.head, row, k, &mut self.staging);
        self.v.read_row(page, self.head, row, v, &mut self.staging);
        Ok(())
    }
}

#[cfg(test)]
#[path = "paged_forward_tests.rs"]
mod tests;
