//! Attention over a paged KV cache (`fmha_kvcache_launcher_*`): batch prefill, chunked prefill and
//! decode (`seqlen` 1/N). The pools are `[page][page_size][h_k][d]` (NHD), each sequence's pages drawn
//! from a shuffled pool, found through a block table or a CSR page list.

use super::{Bench, Work};
use crate::data::{decode, f32_at, Encoded, TokenMajor};
use crate::device::{check, Buffer};
use crate::matrix::Case;
use crate::verify::{self, Sequence, Verdict};
use anyhow::Result;
use fmha::ffi::attention::*;
use fmha::ffi::kvcache::*;
use fmha::ffi::runtime::fmha_stream_synchronize;
use fmha::test_rng::Rng;
use std::ptr::{null, null_mut};

/// The scheduler workspace of `launcher`'s runs: `fmha_kvcache_launcher_scheduler_workspace_size` bytes.
fn scheduler_workspace(launcher: *mut fmha_kvcache_launcher) -> Result<Buffer> {
    let mut bytes = 0usize;
    check(
        fmha_kvcache_launcher_scheduler_workspace_size(launcher, &mut bytes),
        "fmha_kvcache_launcher_scheduler_workspace_size",
    )?;
    Buffer::zeroed(bytes)
}

pub struct KvCache {
    case: Case,
    seqlens: Vec<(usize, usize)>,
    starts_q: Vec<usize>,
    /// Each sequence's pages, in order.
    pages: Vec<Vec<usize>>,
    q: (Encoded, Buffer),
    k: (Encoded, Buffer),
    v: (Encoded, Buffer),
    o: Buffer,
    lse: Buffer,
    /// Device arrays the args point at (kept alive).
    arrays: Vec<Buffer>,
    workspace: Buffer,
    /// The run's scheduler workspace (`fmha_kvcache_launcher_scheduler_workspace_size` bytes),
    /// allocated once and passed to every run, as the Python binding does on a GPU.
    scheduler_workspace: Buffer,
    launcher: *mut fmha_kvcache_launcher,
    args: fmha_kvcache_args,
}

impl KvCache {
    pub fn new(case: &Case, rng: &mut Rng) -> Result<KvCache> {
        let (c, p) = (case, case.page_size.max(1));
        let seqlens = case.seqlens();
        let mut starts_q = vec![0usize];
        for s in &seqlens {
            starts_q.push(starts_q.last().unwrap() + s.0);
        }
        let total_q = *starts_q.last().unwrap();
        let counts: Vec<usize> = seqlens.iter().map(|s| s.1.div_ceil(p)).collect();
        let num_pages: usize = counts.iter().sum::<usize>().max(1);
        // A shuffled pool: sequence b takes the next counts[b] pages of a random permutation.
        let mut order: Vec<usize> = (0..num_pages).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.size(0, i));
        }
        let mut next = order.into_iter();
        let pages: Vec<Vec<usize>> = counts.iter().map(|&n| next.by_ref().take(n).collect()).collect();

        let pool_elements = |d: usize| num_pages * p * c.nhead_k * d;
        let upload = |t: Encoded| -> Result<(Encoded, Buffer)> {
            let b = Buffer::upload(&t.bytes)?;
            Ok((t, b))
        };
        let q = upload(Encoded::random(c.dtype, total_q * c.nhead_q * c.hdim_q, rng))?;
        let k = upload(Encoded::random(c.dtype, pool_elements(c.hdim_q), rng))?;
        let v = upload(Encoded::random(c.dtype, pool_elements(c.hdim_v), rng))?;
        let o = Buffer::zeroed(total_q * c.nhead_q * c.hdim_v * c.dtype.output().bytes())?;
        let lse = Buffer::zeroed(total_q * c.nhead_q * 4)?;

        let max_q = seqlens.iter().map(|s| s.0).max().unwrap_or(0);
        let max_k = seqlens.iter().map(|s| s.1).max().unwrap_or(0);
        let traits = fmha_kvcache_traits {
            struct_size: std::mem::size_of::<fmha_kvcache_traits>(),
            dtype: c.dtype.abi(),
            o_dtype: c.dtype.output().abi(),
            hdim_q: c.hdim_q as i32,
            hdim_v: c.hdim_v as i32,
            nhead_q: c.nhead_q as i32,
            nhead_k: c.nhead_k as i32,
            is_group_mode: c.varlen as i32,
            mask_type: c.mask.kind as i32,
            has_lse: 1,
            kv_table_kind: if c.table == "csr" { FMHA_KV_PAGE_CSR } else { FMHA_KV_BLOCK_TABLE },
            kv_layout: FMHA_KV_LAYOUT_STRIDED,
            kv_scale_granularity: FMHA_KV_SCALE_TENSOR,
            page_size: p as i32,
            batch: c.batch as i32,
            total_q: total_q as i32,
            max_seqlen_q: max_q as i32,
            max_seqlen_k: max_k as i32,
            max_splits: c.splits as i32,
            kv_split_tokens: 0,
            check_tables: 1,
        };
        let mut launcher = null_mut();
        check(fmha_kvcache_launcher_create(&traits, &mut launcher), "fmha_kvcache_launcher_create")?;
        let scheduler_workspace = match scheduler_workspace(launcher) {
            Ok(buffer) => buffer,
            Err(e) => {
                fmha_kvcache_launcher_destroy(launcher);
                return Err(e);
            }
        };
        let mut me = KvCache {
            case: case.clone(),
            seqlens,
            starts_q,
            pages,
            q,
            k,
            v,
            o,
            lse,
            arrays: Vec::new(),
            workspace: Buffer::zeroed(16)?,
            launcher,
            args: fmha_kvcache_args {
                struct_size: std::mem::size_of::<fmha_kvcache_args>(),
                q: NO_TENSOR,
                k: NO_TENSOR,
                v: NO_TENSOR,
                o: NO_TENSOR,
                lse: NO_TENSOR,
                seqstart_q: null(),
                batch: c.batch as i32,
                seqlen_q: if c.varlen { total_q as i32 } else { c.seqlen_q as i32 },
                num_pages: num_pages as i32,
                max_pages_per_seq: 0,
                num_page_indices: 0,
                seqlen_k: null(),
                block_table: null(),
                block_table_stride: 0,
                kv_indptr: null(),
                page_indices: null(),
                last_page_len: null(),
                cache_batch_idx: null(),
                scale: 0.0,
                window_size_left: c.mask.left,
                window_size_right: c.mask.right,
                q_descale: fmha_scale::default(),
                k_descale: fmha_scale::default(),
                v_descale: fmha_scale::default(),
                workspace: null_mut(),
                workspace_size: 0,
                scheduler_workspace: null_mut(),
                scheduler_workspace_size: 0,
            },
            scheduler_workspace,
        };
        me.fill_args(total_q, p)?;
        check(
            fmha_kvcache_launcher_prepare_async(me.launcher, &me.args, null_mut()),
            "fmha_kvcache_launcher_prepare_async",
        )?;
        check(
            fmha_kvcache_launcher_check(me.launcher, me.args.workspace, me.args.workspace_size, null_mut()),
            "fmha_kvcache_launcher_check",
        )?;
        Ok(me)
    }

    fn fill_args(&mut self, total_q: usize, p: usize) -> Result<()> {
        let c = self.case.clone();
        let i32s = |v: &mut dyn Iterator<Item = usize>| v.map(|x| x as i32).collect::<Vec<i32>>();
        let mut keep = |values: Vec<i32>| -> Result<*const i32> {
            let b = Buffer::upload(&values)?;
            let ptr = b.ptr as *const i32;
            self.arrays.push(b);
            Ok(ptr)
        };
        let mut args = self.args;
        if c.table == "csr" {
            let mut indptr = vec![0usize];
            for pages in &self.pages {
                indptr.push(indptr.last().unwrap() + pages.len());
            }
            let indices: Vec<i32> = self.pages.iter().flatten().map(|&x| x as i32).collect();
            args.num_page_indices = indices.len() as i32;
            args.kv_indptr = keep(i32s(&mut indptr.into_iter()))?;
            args.page_indices = keep(if indices.is_empty() { vec![0] } else { indices })?;
            args.last_page_len =
                keep(self.seqlens.iter().map(|s| if s.1 == 0 { 0 } else { ((s.1 - 1) % p + 1) as i32 }).collect())?;
        } else {
            let stride = self.pages.iter().map(Vec::len).max().unwrap_or(0).max(1);
            let mut table = vec![0i32; c.batch * stride];
            for (b, pages) in self.pages.iter().enumerate() {
                for (j, &page) in pages.iter().enumerate() {
                    table[b * stride + j] = page as i32;
                }
            }
            args.max_pages_per_seq = stride as i32;
            args.block_table_stride = stride as i64;
            args.block_table = keep(table)?;
            args.seqlen_k = keep(self.seqlens.iter().map(|s| s.1 as i32).collect())?;
        }
        if c.varlen {
            args.seqstart_q = keep(i32s(&mut self.starts_q.clone().into_iter()))?;
        }
        let row = (c.nhead_q * c.hdim_q) as i64;
        let q_batch = if c.varlen { 0 } else { (c.seqlen_q * c.nhead_q * c.hdim_q) as i64 };
        args.q =
            fmha_tensor { data: self.q.1.ptr, batch_stride: q_batch, head_stride: c.hdim_q as i64, row_stride: row };
        let o_batch = if c.varlen { 0 } else { (c.seqlen_q * c.nhead_q * c.hdim_v) as i64 };
        args.o = fmha_tensor {
            data: self.o.ptr,
            batch_stride: o_batch,
            head_stride: c.hdim_v as i64,
            row_stride: (c.nhead_q * c.hdim_v) as i64,
        };
        // [head][total_q] in both modes (batch mode: sequence b's rows at b · seqlen_q).
        args.lse = fmha_tensor {
            data: self.lse.ptr,
            batch_stride: if c.varlen { 0 } else { c.seqlen_q as i64 },
            head_stride: total_q as i64,
            row_stride: 1,
        };
        let pool = |data, d: usize| fmha_tensor {
            data,
            batch_stride: (p * c.nhead_k * d) as i64,
            head_stride: d as i64,
            row_stride: (c.nhead_k * d) as i64,
        };
        args.k = pool(self.k.1.ptr, c.hdim_q);
        args.v = pool(self.v.1.ptr, c.hdim_v);
        let mut size = 0usize;
        check(fmha_kvcache_launcher_workspace_size(self.launcher, &mut size), "fmha_kvcache_launcher_workspace_size")?;
        self.workspace = Buffer::zeroed(size)?;
        args.workspace = self.workspace.ptr;
        args.workspace_size = size;
        args.scheduler_workspace = self.scheduler_workspace.ptr;
        args.scheduler_workspace_size = self.scheduler_workspace.bytes;
        self.args = args;
        Ok(())
    }

    /// Element (token t of sequence b, kv head h, column d) of a pool.
    fn pool_index(&self, b: usize, t: usize, h: usize, d: usize, dim: usize) -> usize {
        let p = self.case.page_size.max(1);
        let page = self.pages[b][t / p];
        ((page * p + t % p) * self.case.nhead_k + h) * dim + d
    }

    fn sequence(&self, b: usize) -> Sequence {
        let c = &self.case;
        let (sq, sk) = self.seqlens[b];
        let pool = |t: &Encoded, dim: usize| {
            let mut out = Vec::with_capacity(c.nhead_k * sk * dim);
            for h in 0..c.nhead_k {
                for j in 0..sk {
                    for d in 0..dim {
                        out.push(t.get(self.pool_index(b, j, h, d, dim)));
                    }
                }
            }
            out
        };
        Sequence {
            q: TokenMajor { heads: c.nhead_q, dim: c.hdim_q }.gather(&self.q.0, self.starts_q[b], sq),
            k: pool(&self.k.0, c.hdim_q),
            v: pool(&self.v.0, c.hdim_v),
        }
    }
}

const NO_TENSOR: fmha_tensor = fmha_tensor { data: null_mut(), batch_stride: 0, head_stride: 0, row_stride: 0 };

impl Drop for KvCache {
    fn drop(&mut self) {
        fmha_kvcache_launcher_destroy(self.launcher);
    }
}

impl Bench for KvCache {
    fn plan_json(&self) -> Result<String> {
        super::json_out(
            |b, l, r| fmha_kvcache_launcher_plan_json(self.launcher, b, l, r),
            "fmha_kvcache_launcher_plan_json",
        )
    }

    fn launch(&mut self) -> Result<()> {
        check(fmha_kvcache_launcher_run(self.launcher, &self.args, null_mut()), "fmha_kvcache_launcher_run")
    }

    /// The matrix products over the kept (query, key) pairs; the bytes of q, the sequences' K/V tokens
    /// and o (decode is bound by the K/V reads: GB/s is its figure).
    fn work(&self) -> Work {
        Work { flops: self.case.attention_flops(), bytes: self.case.io_bytes() }
    }

    fn verify(&mut self) -> Result<Verdict> {
        self.o.fill(0xFF)?;
        self.lse.fill(0xFF)?;
        self.launch()?;
        check(fmha_stream_synchronize(null_mut()), "fmha_stream_synchronize")?;
        let (o, lse) = (self.o.download()?, self.lse.download()?);
        let c = &self.case;
        let total_q = *self.starts_q.last().unwrap();
        let out = TokenMajor { heads: c.nhead_q, dim: c.hdim_v };
        let o_at = |b: usize, h: usize, i: usize, d: usize| {
            decode(c.dtype.output(), &o, out.index(self.starts_q[b] + i, h, d))
        };
        let lse_at = |b: usize, h: usize, i: usize| f32_at(&lse, h * total_q + self.starts_q[b] + i);
        Ok(verify::forward(c, &|b| self.sequence(b), &o_at, Some(&lse_at)))
    }
}
