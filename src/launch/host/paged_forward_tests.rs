//! The paged forward on random batches against the float64 reference.

use super::*;
use crate::launch::{FwdExtents, KvTableArgs};
use crate::problem::mask::Mask;
use crate::problem::{Dtype, Tensor};
use crate::reference::{Precision, RefProblem};
use crate::runtime::host::runtime;
use crate::runtime::{CopyKind, DeviceAddr, Runtime};
use crate::test_rng::{starts, Rng};
use half::bf16;

const HQ: usize = 4;
const HK: usize = 2;
const D: usize = 32;

fn upload<T: Copy>(values: &[T]) -> usize {
    let bytes = std::mem::size_of_val(values).max(4);
    let dev = runtime().malloc(bytes).unwrap();
    runtime().memcpy(dev, values.as_ptr() as usize, std::mem::size_of_val(values), CopyKind::HostToDevice).unwrap();
    dev
}

fn download<T: Copy + Default>(dev: usize, len: usize) -> Vec<T> {
    let mut out = vec![T::default(); len];
    runtime().memcpy(out.as_mut_ptr() as usize, dev, len * std::mem::size_of::<T>(), CopyKind::DeviceToHost).unwrap();
    out
}

/// A random batch through a random table kind, page size, pool layout and mask, against the
/// float64 reference with the field's rule. Unused pages and table entries past each sequence's
/// pages hold NaNs and out-of-range ids: reading one would fail the comparison or the call.
#[test]
fn paged_prefill_matches_the_reference() {
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for case in 0..60 {
        let kind = rng.pick(&[TableKind::PageCsr, TableKind::BlockTable, TableKind::Contiguous]);
        let batch = rng.size(1, 5);
        // (new queries, kv length): queries are the last tokens of the sequence, or none.
        let lens: Vec<(usize, usize)> = (0..batch)
            .map(|_| {
                let kv = if rng.range(0, 4) == 0 { rng.size(0, 1) } else { rng.size(1, 90) };
                (rng.size(0, kv.max(1)).min(kv + rng.size(0, 1)), kv)
            })
            .collect();
        let max_kv = lens.iter().map(|l| l.1).max().unwrap().max(1);
        let page = match kind {
            TableKind::Contiguous => max_kv + rng.size(0, 3),
            _ => rng.pick(&[1, 5, 16, 19, 128]),
        };
        let mask = rng.pick(&[
            Mask::NONE,
            Mask::causal(MaskType::BottomRight),
            Mask { kind: MaskType::BottomRight, left: 7, right: 0 },
            Mask { kind: MaskType::BottomRight, left: 3, right: 5 },
        ]);
        let ctx = format!("seed {seed} case {case}: {kind:?} page {page} {mask:?} lens {lens:?}");

        // Pages: each sequence's are drawn from a shuffled pool with spare pages.
        let pages_of: Vec<usize> = lens.iter().map(|l| l.1.div_ceil(page)).collect();
        let num_pages = match kind {
            TableKind::Contiguous => batch + 2,
            _ => pages_of.iter().sum::<usize>() + 3,
        };
        let mut order: Vec<usize> = (0..num_pages).collect();
        for i in (1..num_pages).rev() {
            order.swap(i, rng.size(0, i));
        }
        let mut next = order.into_iter();
        let assigned: Vec<Vec<usize>> = match kind {
            TableKind::Contiguous => (0..batch).map(|_| vec![next.next().unwrap()]).collect(),
            _ => pages_of.iter().map(|&n| next.by_ref().take(n).collect()).collect(),
        };
        let hnd = rng.range(0, 1) == 1;
        let (page_stride, row_stride, head_stride) =
            if hnd { (HK * page * D, D, page * D) } else { (page * HK * D, HK * D, D) };
        let pool_len = num_pages * page_stride;
        let mut k_pool = vec![bf16::NAN; pool_len];
        let mut v_pool = vec![bf16::NAN; pool_len];
        let mut q_all = Vec::new();
        let mut refs = Vec::new();
        for (b, &(sq, kv)) in lens.iter().enumerate() {
            let draw = |rng: &mut Rng, n| (0..n).map(|_| bf16::from_f64(rng.unit())).collect::<Vec<_>>();
            let (q, k, v) = (draw(&mut rng, sq * HQ * D), draw(&mut rng, kv * HK * D), draw(&mut rng, kv * HK * D));
            for j in 0..kv {
                let (p, r) = (assigned[b][j / page], j % page);
                for g in 0..HK {
                    let at = p * page_stride + r * row_stride + g * head_stride;
                    k_pool[at..at + D].copy_from_slice(&k[(j * HK + g) * D..][..D]);
                    v_pool[at..at + D].copy_from_slice(&v[(j * HK + g) * D..][..D]);
                }
            }
            q_all.extend_from_slice(&q);
            refs.push((q, k, v));
        }
        let q_lens: Vec<i32> = lens.iter().map(|l| l.0 as i32).collect();
        let seqstart_q = starts(&q_lens);
        let total_q = *seqstart_q.last().unwrap() as usize;
        let kv_lens: Vec<i32> = lens.iter().map(|l| l.1 as i32).collect();

        let garbage = [i32::MAX, -1, num_pages as i32, i32::MIN];
        let mut table = KvTableArgs {
            kind,
            page_size: page as i64,
            num_pages: num_pages as i64,
            max_pages_per_seq: 0,
            num_page_indices: 0,
            seqlen_k: DevicePtr::new(0),
            block_table: DevicePtr::new(0),
            block_table_stride: 0,
            kv_indptr: DevicePtr::new(0),
            page_indices: DevicePtr::new(0),
            last_page_len: DevicePtr::new(0),
            cache_batch_idx: DevicePtr::new(0),
        };
        match kind {
            TableKind::Contiguous => {
                table.seqlen_k = DevicePtr::new(upload(&kv_lens));
                let slots: Vec<i32> = assigned.iter().map(|p| p[0] as i32).collect();
                table.cache_batch_idx = DevicePtr::new(upload(&slots));
            }
            TableKind::BlockTable => {
                let max_pages = pages_of.iter().copied().max().unwrap().max(1) + rng.size(0, 2);
                let stride = max_pages + rng.size(0, 2);
                let mut rows = vec![0i32; (batch - 1) * stride + max_pages];
                for (b, pages) in assigned.iter().enumerate() {
                    for t in 0..stride.min(rows.len() - b * stride) {
                        rows[b * stride + t] = pages.get(t).map_or(rng.pick(&garbage), |&p| p as i32);
                    }
                }
                table.seqlen_k = DevicePtr::new(upload(&kv_lens));
                table.block_table = DevicePtr::new(upload(&rows));
                table.block_table_stride = stride as i64;
                table.max_pages_per_seq = max_pages as i64;
            }
            TableKind::PageCsr => {
                let mut indices: Vec<i32> = assigned.iter().flatten().map(|&p| p as i32).collect();
                let counts: Vec<i32> = assigned.iter().map(|p| p.len() as i32).collect();
                indices.push(rng.pick(&garbage)); // past the last sequence's pages
                let last: Vec<i32> =
                    lens.iter().map(|l| if l.1 == 0 { 0 } else { ((l.1 - 1) % page + 1) as i32 }).collect();
                table.kv_indptr = DevicePtr::new(upload(&starts(&counts)));
                table.page_indices = DevicePtr::new(upload(&indices));
                table.num_page_indices = indices.len() as i64;
                table.last_page_len = DevicePtr::new(upload(&last));
            }
        }
        let o_len = total_q * HQ * D;
        let o = upload(&vec![bf16::NAN; o_len.max(1)]);
        let lse = upload(&vec![f32::NAN; (HQ * total_q).max(1)]);
        let rows = |ptr, head_stride, row_stride| Tensor {
            ptr: DeviceAddr(ptr),
            batch_stride: 0,
            head_stride: head_stride as i64,
            row_stride: row_stride as i64,
        };
        let pool = |ptr| Tensor {
            ptr: DeviceAddr(ptr),
            batch_stride: page_stride as i64,
            head_stride: head_stride as i64,
            row_stride: row_stride as i64,
        };
        let kargs = KvCacheKargs {
            dtype: Dtype::Bf16,
            batch: batch as i64,
            nhead_q: HQ as i64,
            nhead_k: HK as i64,
            hdim_q: D as i64,
            hdim_v: D as i64,
            total_q: total_q as i64,
            mask,
            scale: 1.0 / (D as f32).sqrt(),
            m0: 16,
            n0: 32,
            q: rows(upload(&q_all), D, HQ * D),
            o: rows(o, D, HQ * D),
            lse: rows(lse, total_q, 1),
            k: pool(upload(&k_pool)),
            v: pool(upload(&v_pool)),
            extents: FwdExtents { q: o_len, k: pool_len, v: pool_len, o: o_len, lse: HQ * total_q },
            seqstart_q: DevicePtr::new(upload(&seqstart_q)),
            table,
        };
        run::<bf16>(&kargs, 4).unwrap_or_else(|e| panic!("{ctx}: {e}"));

        let o_out: Vec<bf16> = download(o, o_len);
        let lse_out: Vec<f32> = download(lse, HQ * total_q);
        let problem = RefProblem {
            nhead_q: HQ,
            nhead_k: HK,
            hdim_q: D,
            hdim_v: D,
            scale: 1.0 / (D as f64).sqrt(),
            mask,
            seqlens: lens.clone(),
        };
        for (b, (q, k, v)) in refs.iter().enumerate() {
            let sq = lens[b].0;
            // Reference layout: [h][s][d].
            let bhsd = |x: &[bf16], s: usize, h: usize| -> Vec<f64> {
                let mut out = vec![0.0; x.len()];
                for (i, value) in x.iter().enumerate() {
                    let (row, head, col) = (i / (h * D), (i / D) % h, i % D);
                    out[(head * s + row) * D + col] = value.to_f64();
                }
                out
            };
            let (q, k, v) = (bhsd(q, sq, HQ), bhsd(k, lens[b].1, HK), bhsd(v, lens[b].1, HK));
            let exact = problem.forward(b, &q, &k, &v, Precision::F64).unwrap();
            let low = problem.forward(b, &q, &k, &v, Precision::LowPrecision(Dtype::Bf16)).unwrap();
            let (mut err, mut base, mut lse_err) = (0f64, 0f64, 0f64);
            for h in 0..HQ {
                for i in 0..sq {
                    let row = seqstart_q[b] as usize + i;
                    for d in 0..D {
                        let want = exact.o[(h * sq + i) * D + d];
                        err = err.max((o_out[(row * HQ + h) * D + d].to_f64() - want).abs());
                        base = base.max((low.o[(h * sq + i) * D + d] - want).abs());
                    }
                    let (got, want) = (f64::from(lse_out[h * total_q + row]), exact.lse[h * sq + i]);
                    lse_err = lse_err.max(if got == want { 0.0 } else { (got - want).abs() });
                }
            }
            let floor = 0.25 * 2f64.powi(-7);
            assert!(err <= 2.0 * base + floor, "{ctx}: sequence {b}: O error {err:e} > 2 × {base:e} + {floor:e}");
            assert!(lse_err <= 1e-4, "{ctx}: sequence {b}: LSE error {lse_err:e}");
        }
    }
}
