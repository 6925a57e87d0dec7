//! A paged KV cache: the three page-table kinds, each sequence's KV length, and the addressing rule
//! that takes a token to its physical page (spec/inference.md §1.4, §1.5, §1.8). Every backend reads
//! tables with these rules; the host backend reports each bad value as an error naming its field,
//! where a GPU kernel clamps it.

use crate::abi_values::{
    abi_enum, FMHA_KV_BLOCK_TABLE, FMHA_KV_CONTIGUOUS, FMHA_KV_LAYOUT_STRIDED, FMHA_KV_LAYOUT_VECTORIZED,
    FMHA_KV_PAGE_CSR,
};
use crate::error::{Error, Result};

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

/// A field of a kv-cache call whose device values can be wrong: what a fault names. The values are
/// the `field` of the workspace's error record (`launch::abi::KvCacheFault`), which the GPU prepare
/// kernel writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum KvField {
    SeqstartQ = 1,
    SeqlenK = 2,
    CacheBatchIdx = 3,
    KvIndptr = 4,
    LastPageLen = 5,
    BlockTable = 6,
    PageIndices = 7,
    /// The traits' bounds: a sequence beyond what the launcher was created for.
    MaxSeqlenQ = 8,
    /// `seqstart_q` past the rows of q (`args.seqlen_q`, itself at most `traits.total_q`).
    TotalQ = 9,
    MaxSeqlenK = 10,
}

impl KvField {
    const ALL: [KvField; 10] = [
        KvField::SeqstartQ,
        KvField::SeqlenK,
        KvField::CacheBatchIdx,
        KvField::KvIndptr,
        KvField::LastPageLen,
        KvField::BlockTable,
        KvField::PageIndices,
        KvField::MaxSeqlenQ,
        KvField::TotalQ,
        KvField::MaxSeqlenK,
    ];

    pub fn from_i32(value: i32) -> Option<KvField> {
        KvField::ALL.into_iter().find(|f| *f as i32 == value)
    }

    pub fn name(self) -> &'static str {
        match self {
            KvField::SeqstartQ => "seqstart_q",
            KvField::SeqlenK => "seqlen_k",
            KvField::CacheBatchIdx => "cache_batch_idx",
            KvField::KvIndptr => "kv_indptr",
            KvField::LastPageLen => "last_page_len",
            KvField::BlockTable => "block_table",
            KvField::PageIndices => "page_indices",
            KvField::MaxSeqlenQ => "traits.max_seqlen_q",
            KvField::TotalQ => "seqstart_q",
            KvField::MaxSeqlenK => "traits.max_seqlen_k",
        }
    }
}

/// A bad value in the lengths or the page table of sequence `sequence`: `value` broke the rule whose
/// bound is `bound` (the host backend reports it at once; a GPU prepare records it, and
/// `fmha_kvcache_launcher_check` reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableFault {
    pub field: KvField,
    pub sequence: i64,
    pub value: i64,
    pub bound: i64,
}

impl TableFault {
    pub fn to_error(self) -> Error {
        let TableFault { field, sequence: b, value, bound } = self;
        let detail = match field {
            KvField::SeqstartQ | KvField::KvIndptr => format!(
                "entries {b} and {} must satisfy 0 <= entry {b} <= entry {} <= {bound}; one of them is {value}",
                b + 1,
                b + 1
            ),
            KvField::SeqlenK => format!("entry {b} is {value}, outside 0..={bound}"),
            KvField::LastPageLen => format!("entry {b} is {value}, outside 1..={bound} for a non-empty sequence"),
            KvField::CacheBatchIdx => format!("entry {b} is {value}, outside 0..{bound} (num_pages)"),
            KvField::BlockTable | KvField::PageIndices => {
                format!("sequence {b} uses page id {value}, outside 0..{bound} (num_pages)")
            }
            KvField::MaxSeqlenQ => format!("sequence {b} has {value} query rows, more than the bound {bound}"),
            KvField::TotalQ => format!("entry {} is {value}, past the {bound} rows of q (seqlen_q)", b + 1),
            KvField::MaxSeqlenK => format!("sequence {b} holds {value} tokens, more than the bound {bound}"),
        };
        Error::invalid(field.name(), detail)
    }
}

impl From<TableFault> for Error {
    fn from(fault: TableFault) -> Error {
        fault.to_error()
    }
}

/// Returns a fault unless `condition` holds.
fn require(
    condition: bool,
    field: KvField,
    sequence: usize,
    value: i64,
    bound: i64,
) -> std::result::Result<(), TableFault> {
    if condition {
        Ok(())
    } else {
        Err(TableFault { field, sequence: sequence as i64, value, bound })
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
    pub fn sequence(&self, b: usize) -> std::result::Result<SequencePages, TableFault> {
        let p = self.page_size;
        let (kv_len, first) = match self.kind {
            TableKind::Contiguous => {
                let len = i64::from(self.seqlen_k[b]);
                require((0..=p).contains(&len), KvField::SeqlenK, b, len, p)?;
                let slot = self.cache_batch_idx.get(b).map_or(b as i64, |&slot| i64::from(slot));
                require((0..self.num_pages).contains(&slot), KvField::CacheBatchIdx, b, slot, self.num_pages)?;
                (len, slot)
            }
            TableKind::BlockTable => {
                let len = i64::from(self.seqlen_k[b]);
                let cap = self.max_pages_per_seq * p;
                require((0..=cap).contains(&len), KvField::SeqlenK, b, len, cap)?;
                (len, b as i64 * self.block_table_stride)
            }
            TableKind::PageCsr => {
                let (start, end) = (i64::from(self.kv_indptr[b]), i64::from(self.kv_indptr[b + 1]));
                let total = self.page_indices.len() as i64;
                let bad = if start < 0 { start } else { end };
                require(start >= 0 && start <= end && end <= total, KvField::KvIndptr, b, bad, total)?;
                let pages = end - start;
                let len = if pages == 0 {
                    0
                } else {
                    // Absent only when the page size is 1 (checked with the arguments).
                    let last = self.last_page_len.get(b).map_or(p, |&last| i64::from(last));
                    require((1..=p).contains(&last), KvField::LastPageLen, b, last, p)?;
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
    pub fn locate(&self, seq: &SequencePages, j: i64) -> std::result::Result<(i64, i64), TableFault> {
        debug_assert!((0..seq.kv_len).contains(&j), "token {j} outside the sequence");
        let (t, row) = (j / self.page_size, j % self.page_size);
        let last = (seq.kv_len - 1) / self.page_size;
        let t = t.min(last);
        let (page, field) = match self.kind {
            TableKind::Contiguous => return Ok((seq.first, j)),
            TableKind::BlockTable => (self.block_table[(seq.first + t) as usize], KvField::BlockTable),
            TableKind::PageCsr => (self.page_indices[(seq.first + t) as usize], KvField::PageIndices),
        };
        let page = i64::from(page);
        require((0..self.num_pages).contains(&page), field, seq.batch, page, self.num_pages)?;
        Ok((page, row))
    }

    /// Checks every page id sequence `seq` uses (the prepare's full scan, `traits.check_tables`).
    pub fn check_pages(&self, seq: &SequencePages) -> std::result::Result<(), TableFault> {
        if self.kind == TableKind::Contiguous {
            return Ok(());
        }
        let pages = (seq.kv_len + self.page_size - 1) / self.page_size;
        (0..pages).try_for_each(|t| self.locate(seq, t * self.page_size).map(|_| ()))
    }
}

/// The upper bounds a launcher was created for (its traits): sequences beyond them are faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceBounds {
    pub total_q: i64,
    pub max_seqlen_q: i64,
    pub max_seqlen_k: i64,
}

/// One sequence of a call: its query rows and its pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequence {
    /// Group mode: its first row in `q`/`o`; batch mode: 0 (the rows are batch `pages.batch`'s).
    pub q_start: i64,
    pub sq: i64,
    pub pages: SequencePages,
}

/// Every sequence of a call, checked in order, the first fault reported: `seqstart_q` (group mode;
/// empty in batch mode, where every sequence has `bounds.max_seqlen_q` rows), the KV lengths and table
/// structure, the bounds, and with `check_pages` every page id used.
pub fn resolve_sequences(
    table: &PageTable<'_>,
    seqstart_q: &[i32],
    batch: usize,
    bounds: SequenceBounds,
    check_pages: bool,
) -> std::result::Result<Vec<Sequence>, TableFault> {
    let mut out = Vec::with_capacity(batch);
    for b in 0..batch {
        let (q_start, sq) = if seqstart_q.is_empty() {
            (0, bounds.max_seqlen_q)
        } else {
            let (start, end) = (i64::from(seqstart_q[b]), i64::from(seqstart_q[b + 1]));
            let bad = if start < 0 { start } else { end };
            require(start >= 0 && start <= end, KvField::SeqstartQ, b, bad, bounds.total_q)?;
            require(end <= bounds.total_q, KvField::TotalQ, b, end, bounds.total_q)?;
            (start, end - start)
        };
        require(sq <= bounds.max_seqlen_q, KvField::MaxSeqlenQ, b, sq, bounds.max_seqlen_q)?;
        let pages = table.sequence(b)?;
        require(pages.kv_len <= bounds.max_seqlen_k, KvField::MaxSeqlenK, b, pages.kv_len, bounds.max_seqlen_k)?;
        if check_pages && sq > 0 {
            table.check_pages(&pages)?;
        }
        out.push(Sequence { q_start, sq, pages });
    }
    Ok(out)
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
        let message = |e: TableFault| e.to_error().to_string();
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
