//! The C++ kv-cache prepare (the code the GPU prepare kernel runs, compiled for the CPU) against the
//! Rust rules the host backend runs, on random tables with random faults: the same first fault, field,
//! sequence, value and bound, and the same split plan; and the C++ chunks of a sequence against
//! `problem::split::chunks`.

use super::abi::{KvCacheParams, KvCacheSplitPlan, KVCACHE_PREPARED};
use super::cpu_twin;
use super::host::paged_forward::TableArrays;
use crate::problem::paged::{resolve_sequences, PageTable, SequenceBounds, TableKind};
use crate::problem::split::{adaptive_tiles, chunks, longest_first, order_key, work_units, SplitPolicy};
use crate::test_rng::{starts, Rng};

fn spoil(rng: &mut Rng, values: &mut [i32]) {
    if !values.is_empty() && rng.range(0, 3) == 0 {
        let i = rng.size(0, values.len() - 1);
        values[i] = rng.pick(&[-1, -7, values[i] + 1, values[i] + 1000, i32::MAX, 0]);
    }
}

#[test]
fn cpu_prepare_finds_the_rust_fault() {
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for case in 0..3000 {
        let kind = rng.pick(&[TableKind::Contiguous, TableKind::BlockTable, TableKind::PageCsr]);
        let batch = rng.size(0, 6);
        let page = rng.pick(&[1i64, 3, 16]);
        let num_pages = rng.range(1, 20);
        let group = rng.range(0, 3) != 0;
        let max_pages_per_seq = rng.range(1, 5);
        let stride = max_pages_per_seq + rng.range(0, 2);
        let kv: Vec<i32> = (0..batch).map(|_| rng.range(0, page * max_pages_per_seq) as i32).collect();
        let q_lens: Vec<i32> = (0..batch).map(|_| rng.range(0, 6) as i32).collect();
        let mut a = TableArrays {
            seqstart_q: starts(&q_lens),
            seqlen_k: kv.clone(),
            cache_batch_idx: (0..batch).map(|_| rng.range(0, num_pages - 1) as i32).collect(),
            block_table: (0..batch as i64 * stride).map(|_| rng.range(0, num_pages - 1) as i32).collect(),
            kv_indptr: Vec::new(),
            page_indices: Vec::new(),
            last_page_len: Vec::new(),
        };
        let counts: Vec<i32> = kv.iter().map(|&l| (i64::from(l) + page - 1).div_euclid(page) as i32).collect();
        a.kv_indptr = starts(&counts);
        a.page_indices = (0..*a.kv_indptr.last().unwrap() + 2).map(|_| rng.range(0, num_pages - 1) as i32).collect();
        a.last_page_len = kv.iter().map(|&l| if l == 0 { 0 } else { ((i64::from(l) - 1) % page + 1) as i32 }).collect();
        let total_q = i64::from(*a.seqstart_q.last().unwrap()) + rng.range(-1, 1);
        for values in [
            &mut a.seqstart_q,
            &mut a.seqlen_k,
            &mut a.cache_batch_idx,
            &mut a.block_table,
            &mut a.kv_indptr,
            &mut a.page_indices,
            &mut a.last_page_len,
        ] {
            spoil(&mut rng, values);
        }
        let bounds = SequenceBounds {
            total_q: if group { total_q.max(0) } else { batch as i64 * 3 },
            max_seqlen_q: if group { rng.range(3, 6) } else { 3 },
            max_seqlen_k: rng.range(page * max_pages_per_seq - 2, page * max_pages_per_seq),
        };
        let check_pages = rng.range(0, 1) == 1;
        let page_size = if kind == TableKind::Contiguous { page * max_pages_per_seq } else { page };
        let table = PageTable {
            kind,
            page_size,
            num_pages,
            seqlen_k: &a.seqlen_k,
            block_table: &a.block_table,
            block_table_stride: stride,
            max_pages_per_seq,
            kv_indptr: &a.kv_indptr,
            page_indices: &a.page_indices,
            last_page_len: &a.last_page_len,
            cache_batch_idx: &a.cache_batch_idx,
        };
        let starts_q: &[i32] = if group { &a.seqstart_q } else { &[] };
        let resolved = resolve_sequences(&table, starts_q, batch, bounds, check_pages);
        let (block_m, block_n, cu_count) = (rng.pick(&[1i64, 2, 64]), rng.pick(&[1i64, 4, 128]), rng.range(1, 200));
        let (hk, heads_per_kv, packed) = (rng.range(1, 3), rng.range(1, 8), rng.range(0, 1) == 1);
        let pack = if packed { heads_per_kv } else { 1 };
        let plan = match &resolved {
            Ok(sequences) => {
                let work: i64 =
                    sequences.iter().map(|s| work_units(s.sq * pack, s.pages.kv_len, block_m, block_n)).sum();
                let tiles = adaptive_tiles(work * hk * heads_per_kv / pack, cu_count) as i32;
                KvCacheSplitPlan { magic: KVCACHE_PREPARED, tiles_per_split: tiles, ordered: batch as i32, pad: 0 }
            }
            Err(_) => KvCacheSplitPlan::default(),
        };
        let order = resolved.as_ref().ok().map(|sequences| {
            let keys: Vec<u8> = sequences
                .iter()
                .map(|s| order_key(work_units(s.sq * pack, s.pages.kv_len, block_m, block_n)))
                .collect();
            longest_first(&keys)
        });
        let rust = resolved.err();

        let host = |v: &Vec<i32>| v.as_ptr() as u64;
        let params = KvCacheParams {
            seqstart_q: if group { host(&a.seqstart_q) } else { 0 },
            seqlen_k: host(&a.seqlen_k),
            block_table: host(&a.block_table),
            kv_indptr: host(&a.kv_indptr),
            page_indices: host(&a.page_indices),
            last_page_len: host(&a.last_page_len),
            cache_batch_idx: host(&a.cache_batch_idx),
            block_table_stride: stride,
            batch: batch as i32,
            seqlen_q: if group { bounds.total_q } else { 3 } as i32,
            max_seqlen_q: bounds.max_seqlen_q as i32,
            max_seqlen_k: bounds.max_seqlen_k as i32,
            group_mode: i32::from(group),
            table_kind: kind as i32,
            page_size: page_size as i32,
            num_pages: num_pages as i32,
            max_pages_per_seq: max_pages_per_seq as i32,
            num_page_indices: a.page_indices.len() as i32,
            check_tables: i32::from(check_pages),
            nhead_q: (hk * heads_per_kv) as i32,
            nhead_k: hk as i32,
            pack_gqa: i32::from(packed),
            block_m: block_m as i32,
            block_n: block_n as i32,
            cu_count: cu_count as i32,
            ..KvCacheParams::default()
        };
        let (record, cpp_plan, cpp_order) = cpu_twin::kvcache_prepare(&params);
        assert_eq!(record.outcome().unwrap(), rust, "seed {seed} case {case}: {kind:?} page {page_size}");
        assert_eq!(cpp_plan, plan, "seed {seed} case {case}: the split plan");
        if let Some(order) = order {
            assert_eq!(cpp_order, order, "seed {seed} case {case}: the longest-first order");
        }
    }
}

#[test]
fn cpu_chunks_are_the_rust_chunks() {
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for case in 0..5000 {
        let policy = SplitPolicy { max_splits: rng.range(1, 300), split_tiles: rng.pick(&[0, 0, 1, 3, 40]) };
        let prepared = rng.range(0, 3) != 0;
        let plan = KvCacheSplitPlan {
            magic: if prepared { KVCACHE_PREPARED } else { rng.range(0, 1000) as u32 },
            tiles_per_split: rng.pick(&[-5, 0, 1, 2, 7, 1000]),
            ..KvCacheSplitPlan::default()
        };
        let n0 = rng.pick(&[1i64, 64, 128]);
        let any = rng.range(0, 100000);
        let kv_len = rng.pick(&[0i64, 1, 127, 128, 129, 5000, 131072, any]);
        let params = KvCacheParams {
            max_splits: policy.max_splits as i32,
            split_tiles: policy.split_tiles as i32,
            block_n: n0 as i32,
            split_plan: &plan as *const KvCacheSplitPlan as u64,
            ..KvCacheParams::default()
        };
        let planned = if prepared { i64::from(plan.tiles_per_split) } else { 0 };
        let want = chunks(kv_len, n0, policy, planned);
        assert_eq!(
            cpu_twin::kvcache_chunks(&params, kv_len),
            want,
            "seed {seed} case {case}: {policy:?} {plan:?} n0 {n0} L {kv_len}"
        );
    }
}
