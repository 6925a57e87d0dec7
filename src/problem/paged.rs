//! A paged KV cache: the three page-table kinds, each sequence's KV length, and the addressing rule
//! that takes a token to its physical page (spec/inference.md §1.4, §1.5, §1.8). Every backend reads
//! tables with these rules; the host backend reports each bad value as an error naming its field,
//! where a GPU kernel clamps it.

use crate::abi_values::{
    abi_enum, FMHA_KV_BLOCK_TABLE, FMHA_KV_CONTIGUOUS, FMHA_KV_LAYOUT_STRIDED, FMHA_KV_LAYOUT_VECTORIZED,
    FMHA_KV_PAGE_CSR,
};
use crate::error::{ensure, Error, Result};

abi_enum! {
    /// How a sequence's tokens are found in the cache (`FMHA_KV_*`).
    pub enum TableKind {
        Contiguous = FMHA_KV_CONTIGUOUS => "contiguous",
        BlockTable = FMHA_KV_BLOCK_TABLE => "block table",
        PageCsr = FMHA_KV_PAGE_CSR => "page csr",
    }
}

impl TableKind {
    pub fn from_i32(value: i32) -> Result<TableKind> {
        TableKind::parse(value).ok_or_else(|| {
            Error::invalid("kv_table_kind", format!("{value} is not a table kind ({})", TableKind::choices()))
        })
    }
}

abi_enum! {
    /// Byte order of the K/V pools (`FMHA_KV_LAYOUT_*`).
    pub enum PoolLayout {
        Strided = FMHA_KV_LAYOUT_STRIDED => "strided",
        Vectorized = FMHA_KV_LAYOUT_VECTORIZED => "vectorized",
    }
}

impl PoolLayout {
    pub fn from_i32(value: i32) -> Result<PoolLayout> {
        PoolLayout::parse(value).ok_or_else(|| {
            Error::invalid("kv_layout", format!("{value} is not a pool layout ({})", PoolLayout::choices()))
        })
    }
}

/// The page table of one call, over host copies of its device arrays.
#[derive(Debug, Clone, Copy)]
pub struct PageTable<'a> {
    pub kind: TableKind,
    /// Tokens per page (CONTIGUOUS: the slot capacity).
    pub page_size: i64,
    /// Pages in the pool (CONTIGUOUS: slots).
    pub num_pages: i64,
    /// `[batch]` KV lengths: BLOCK_TABLE and CONTIGUOUS.
    pub seqlen_k: &'a [i32],
    /// BLOCK_TABLE: row `b` holds sequence `b`'s page ids, `max_pages_per_seq` of them.
    pub block_table: &'a [i32],
    pub block_table_stride: i64,
    pub max_pages_per_seq: i64,
    /// PAGE_CSR: sequence `b`'s page ids are `page_indices[kv_indptr[b]..kv_indptr[b + 1]]`; its last
    /// page holds `last_page_len[b]` tokens (empty = every last page is full, allowed when the page
    /// size is 1).
    pub kv_indptr: &'a [i32],
    pub page_indices: &'a [i32],
    pub last_page_len: &'a [i32],
    /// CONTIGUOUS, optional: the slot of sequence `b` (empty = slot `b`).
    pub cache_batch_idx: &'a [i32],
}

/// One sequence's place in the table: its KV length and where its page ids start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequencePages {
    pub batch: usize,
    /// Tokens in the cache for this sequence (`L_b`).
    pub kv_len: i64,
    /// Index of logical page 0 in the table array (CONTIGUOUS: the slot itself).
    first: i64,
}

impl PageTable<'_> {
    /// Sequence `b`'s KV length and page list, every value checked (§1.8).
    pub fn sequence(&self, b: usize) -> Result<SequencePages> {
        let p = self.page_size;
        let (kv_len, first) = match self.kind {
            TableKind::Contiguous => {
                let len = i64::from(self.seqlen_k[b]);
                ensure((0..=p).contains(&len), "seqlen_k", || {
                    format!("entry {b} is {len}, outside 0..={p} (the slot capacity, page_size)")
                })?;
                let slot = match self.cache_batch_idx.get(b) {
                    Some(&slot) => i64::from(slot),
                    None => b as i64,
                };
                let field = if self.cache_batch_idx.is_empty() { "batch" } else { "cache_batch_idx" };
                ensure((0..self.num_pages).contains(&slot), field, || {
                    format!("sequence {b} uses slot {slot}, outside 0..{} (num_pages)", self.num_pages)
                })?;
                (len, slot)
            }
            TableKind::BlockTable => {
                let len = i64::from(self.seqlen_k[b]);
                let cap = self.max_pages_per_seq * p;
                ensure((0..=cap).contains(&len), "seqlen_k", || {
                    format!("entry {b} is {len}, outside 0..={cap} (max_pages_per_seq × page_size)")
                })?;
                (len, b as i64 * self.block_table_stride)
            }
            TableKind::PageCsr => {
                let (start, end) = (i64::from(self.kv_indptr[b]), i64::from(self.kv_indptr[b + 1]));
                let total = self.page_indices.len() as i64;
                ensure(start >= 0 && start <= end && end <= total, "kv_indptr", || {
                    format!("entries {b}..{} are {start}, {end}: not non-decreasing within 0..={total}", b + 1)
                })?;
                let pages = end - start;
                let len = if pages == 0 {
                    0
                } else {
                    let last = match self.last_page_len.get(b) {
                        Some(&last) => i64::from(last),
                        None => p, // absent only when the page size is 1 (checked with the arguments)
                    };
                    ensure((1..=p).contains(&last), "last_page_len", || {
                        format!("entry {b} is {last}, outside 1..={p} for a sequence with {pages} page(s)")
                    })?;
                    (pages - 1) * p + last
                };
                (len, start)
            }
        };
        Ok(SequencePages { batch: b, kv_len, first })
    }

    /// The physical page and the row within it of token `j < kv_len`. Only table entries up to the
    /// sequence's last page (`(kv_len − 1) / page_size`) are ever read: entries past it may be
    /// padding, the next sequence's pages or past the array (CK's AICK-1171).
    pub fn locate(&self, seq: &SequencePages, j: i64) -> Result<(i64, i64)> {
        debug_assert!((0..seq.kv_len).contains(&j), "token {j} outside the sequence");
        let (t, row) = (j / self.page_size, j % self.page_size);
        let last = (seq.kv_len - 1) / self.page_size;
        let t = t.min(last);
        let (page, field) = match self.kind {
            TableKind::Contiguous => return Ok((seq.first, j)),
            TableKind::BlockTable => (self.block_table[(seq.first + t) as usize], "block_table"),
            TableKind::PageCsr => (self.page_indices[(seq.first + t) as usize], "page_indices"),
        };
        let page = i64::from(page);
        ensure((0..self.num_pages).contains(&page), field, || {
            format!(
                "entry {} (sequence {}, page {t}) is {page}, outside 0..{} (num_pages)",
                seq.first + t,
                seq.batch,
                self.num_pages
            )
        })?;
        Ok((page, row))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr<'a>(indptr: &'a [i32], indices: &'a [i32], last: &'a [i32], page_size: i64) -> PageTable<'a> {
        PageTable {
            kind: TableKind::PageCsr,
            page_size,
            num_pages: 8,
            seqlen_k: &[],
            block_table: &[],
            block_table_stride: 0,
            max_pages_per_seq: 0,
            kv_indptr: indptr,
            page_indices: indices,
            last_page_len: last,
            cache_batch_idx: &[],
        }
    }

    #[test]
    fn csr_lengths_and_pages_follow_the_indptr() {
        // Sequence 0: pages 5, 2 (3 tokens in the last); sequence 1: empty; sequence 2: page 7, full.
        let table = csr(&[0, 2, 2, 3], &[5, 2, 7, -1], &[3, 0, 4], 4);
        let seqs: Vec<_> = (0..3).map(|b| table.sequence(b).unwrap()).collect();
        assert_eq!(seqs.iter().map(|s| s.kv_len).collect::<Vec<_>>(), [7, 0, 4]);
        let pages: Vec<_> = (0..7).map(|j| table.locate(&seqs[0], j).unwrap()).collect();
        assert_eq!(pages, [(5, 0), (5, 1), (5, 2), (5, 3), (2, 0), (2, 1), (2, 2)]);
        assert_eq!(table.locate(&seqs[2], 3).unwrap(), (7, 3));
    }

    #[test]
    fn bad_values_name_their_field() {
        let message = |e: Error| e.to_string();
        let table = csr(&[0, 2, 1], &[0, 1], &[1, 1], 4);
        assert!(message(table.sequence(1).unwrap_err()).contains("kv_indptr"));
        let table = csr(&[0, 1], &[0], &[5], 4);
        assert!(message(table.sequence(0).unwrap_err()).contains("last_page_len"));
        let table = csr(&[0, 1], &[8], &[4], 4);
        let seq = table.sequence(0).unwrap();
        let error = message(table.locate(&seq, 0).unwrap_err());
        assert!(error.contains("page_indices") && error.contains("sequence 0"), "{error}");
        let blocks = PageTable {
            kind: TableKind::BlockTable,
            seqlen_k: &[9],
            block_table: &[0, 1],
            block_table_stride: 2,
            max_pages_per_seq: 2,
            ..csr(&[], &[], &[], 4)
        };
        assert!(message(blocks.sequence(0).unwrap_err()).contains("seqlen_k"));
        let slots = PageTable { kind: TableKind::Contiguous, seqlen_k: &[3], cache_batch_idx: &[8], ..blocks };
        assert!(message(slots.sequence(0).unwrap_err()).contains("cache_batch_idx"));
    }

    /// Entries past a sequence's last page are never read, whatever they hold.
    #[test]
    fn entries_past_the_last_page_are_not_read() {
        let blocks = PageTable {
            kind: TableKind::BlockTable,
            seqlen_k: &[5, 1],
            block_table: &[3, 4, -7, 6, i32::MAX, i32::MIN],
            block_table_stride: 3,
            max_pages_per_seq: 3,
            ..csr(&[], &[], &[], 4)
        };
        for b in 0..2 {
            let seq = blocks.sequence(b).unwrap();
            for j in 0..seq.kv_len {
                blocks.locate(&seq, j).unwrap();
            }
        }
    }
}
