//! The dense forward (`fmha_fwd`) and the backward launcher (`fmha_bwd_launcher_*`) over token-major
//! tensors `[token][head][dim]`: batch mode is the varlen layout with sequences `seqlen` tokens apart.

use super::{Bench, Work};
use crate::data::{decode, f32_at, Encoded, TokenMajor};
use crate::device::{check, Buffer};
use crate::matrix::{Case, DtypeName};
use crate::verify::{self, Sequence, Verdict};
use anyhow::Result;
use fmha::ffi::attention::*;
use fmha::ffi::backward::*;
use fmha::ffi::runtime::fmha_stream_synchronize;
use fmha::test_rng::Rng;
use std::ffi::c_void;
use std::ptr::{null, null_mut};

/// Inputs, outputs and sequence arrays of one dense problem.
struct Tensors {
    case: Case,
    seqlens: Vec<(usize, usize)>,
    starts_q: Vec<usize>,
    starts_k: Vec<usize>,
    q: (Encoded, Buffer),
    k: (Encoded, Buffer),
    v: (Encoded, Buffer),
    o: Buffer,
    /// fp32 `[head][total_q]`.
    lse: Buffer,
    seqstart_q: Buffer,
    seqstart_k: Buffer,
    /// The forward's scheduler workspace (`fmha_fwd_workspace_size` bytes), allocated once and passed
    /// to every call, as the Python binding does on a GPU.
    workspace: Buffer,
}

fn starts(lengths: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut out = vec![0];
    for len in lengths {
        out.push(out.last().unwrap() + len);
    }
    out
}

fn fwd_traits(c: &Case) -> fmha_fwd_traits {
    fmha_fwd_traits {
        struct_size: std::mem::size_of::<fmha_fwd_traits>(),
        dtype: c.dtype.abi(),
        hdim_q: c.hdim_q as i32,
        hdim_v: c.hdim_v as i32,
        is_group_mode: c.varlen as i32,
        mask_type: c.mask.kind as i32,
        bias_type: FMHA_BIAS_NONE,
        has_dropout: 0,
        o_dtype: if c.dtype.is_fp8() { FMHA_DTYPE_BF16 } else { 0 },
    }
}

impl Tensors {
    fn new(case: &Case, rng: &mut Rng) -> Result<Tensors> {
        let seqlens = case.seqlens();
        let starts_q = starts(seqlens.iter().map(|s| s.0));
        let starts_k = starts(seqlens.iter().map(|s| s.1));
        let (total_q, total_k) = (*starts_q.last().unwrap(), *starts_k.last().unwrap());
        let tensor = |count: usize, rng: &mut Rng| -> Result<(Encoded, Buffer)> {
            let t = Encoded::random(case.dtype, count, rng);
            let buffer = Buffer::upload(&t.bytes)?;
            Ok((t, buffer))
        };
        let i32s = |v: &[usize]| v.iter().map(|&x| x as i32).collect::<Vec<i32>>();
        let mut workspace_bytes = 0usize;
        check(fmha_fwd_workspace_size(&fwd_traits(case), &mut workspace_bytes), "fmha_fwd_workspace_size")?;
        Ok(Tensors {
            q: tensor(total_q * case.nhead_q * case.hdim_q, rng)?,
            k: tensor(total_k * case.nhead_k * case.hdim_q, rng)?,
            v: tensor(total_k * case.nhead_k * case.hdim_v, rng)?,
            o: Buffer::zeroed(total_q * case.nhead_q * case.hdim_v * case.dtype.output().bytes())?,
            lse: Buffer::zeroed(total_q * case.nhead_q * 4)?,
            seqstart_q: Buffer::upload(&i32s(&starts_q))?,
            seqstart_k: Buffer::upload(&i32s(&starts_k))?,
            workspace: Buffer::zeroed(workspace_bytes)?,
            case: case.clone(),
            seqlens,
            starts_q,
            starts_k,
        })
    }

    fn total_q(&self) -> usize {
        *self.starts_q.last().unwrap()
    }

    fn token_tensor(&self, data: *mut c_void, heads: usize, dim: usize, k_side: bool) -> fmha_tensor {
        let len = if k_side { self.case.seqlen_k } else { self.case.seqlen_q };
        fmha_tensor {
            data,
            batch_stride: (len * heads * dim) as i64,
            head_stride: dim as i64,
            row_stride: (heads * dim) as i64,
        }
    }

    /// `[head][total_q]` fp32 (LSE, D): rows of a sequence follow its token offset in both modes.
    fn row_tensor(&self, data: *mut c_void) -> fmha_tensor {
        fmha_tensor { data, batch_stride: self.case.seqlen_q as i64, head_stride: self.total_q() as i64, row_stride: 1 }
    }

    fn traits(&self) -> fmha_fwd_traits {
        fwd_traits(&self.case)
    }

    /// (seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k) as the C args take them.
    fn lengths(&self) -> (i32, i32, i32, i32) {
        let c = &self.case;
        if c.varlen {
            let max = |k: bool| self.seqlens.iter().map(|s| if k { s.1 } else { s.0 }).max().unwrap_or(0) as i32;
            (self.total_q() as i32, *self.starts_k.last().unwrap() as i32, max(false), max(true))
        } else {
            (c.seqlen_q as i32, c.seqlen_k as i32, c.seqlen_q as i32, c.seqlen_k as i32)
        }
    }

    fn args(&self) -> fmha_fwd_args {
        let c = &self.case;
        let (seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k) = self.lengths();
        let group = |b: &Buffer| if c.varlen { b.ptr as *const i32 } else { null() };
        fmha_fwd_args {
            struct_size: std::mem::size_of::<fmha_fwd_args>(),
            q: self.token_tensor(self.q.1.ptr, c.nhead_q, c.hdim_q, false),
            k: self.token_tensor(self.k.1.ptr, c.nhead_k, c.hdim_q, true),
            v: self.token_tensor(self.v.1.ptr, c.nhead_k, c.hdim_v, true),
            o: self.token_tensor(self.o.ptr, c.nhead_q, c.hdim_v, false),
            lse: self.row_tensor(self.lse.ptr),
            seqstart_q: group(&self.seqstart_q),
            seqstart_k: group(&self.seqstart_k),
            seqlen_q_ptr: null(),
            seqlen_k_ptr: null(),
            batch: c.batch as i32,
            seqlen_q,
            seqlen_k,
            max_seqlen_q,
            max_seqlen_k,
            nhead_q: c.nhead_q as i32,
            nhead_k: c.nhead_k as i32,
            scale: 0.0,
            window_size_left: c.mask.left,
            window_size_right: c.mask.right,
            q_descale: fmha_scale::default(),
            k_descale: fmha_scale::default(),
            v_descale: fmha_scale::default(),
            workspace: self.workspace.ptr,
            workspace_size: self.workspace.bytes,
        }
    }

    fn sequence(&self, b: usize) -> Sequence {
        let c = &self.case;
        let (sq, sk) = self.seqlens[b];
        Sequence {
            q: TokenMajor { heads: c.nhead_q, dim: c.hdim_q }.gather(&self.q.0, self.starts_q[b], sq),
            k: TokenMajor { heads: c.nhead_k, dim: c.hdim_q }.gather(&self.k.0, self.starts_k[b], sk),
            v: TokenMajor { heads: c.nhead_k, dim: c.hdim_v }.gather(&self.v.0, self.starts_k[b], sk),
        }
    }

    fn run_forward(&self) -> Result<()> {
        check(fmha_fwd(&self.traits(), &self.args(), null_mut()), "fmha_fwd")
    }
}

pub struct Forward {
    t: Tensors,
}

impl Forward {
    pub fn new(case: &Case, rng: &mut Rng) -> Result<Forward> {
        Ok(Forward { t: Tensors::new(case, rng)? })
    }
}

impl Bench for Forward {
    fn plan_json(&self) -> Result<String> {
        super::json_out(|b, l, r| fmha_fwd_plan_json(&self.t.traits(), &self.t.args(), b, l, r), "fmha_fwd_plan_json")
    }

    fn launch(&mut self) -> Result<()> {
        self.t.run_forward()
    }

    fn work(&self) -> Work {
        let c = &self.t.case;
        Work { flops: c.attention_flops(), bytes: c.io_bytes() }
    }

    fn verify(&mut self) -> Result<Verdict> {
        let t = &self.t;
        t.o.fill(0xFF)?; // NaN in every output dtype: a row the kernel leaves unwritten fails
        t.lse.fill(0xFF)?;
        t.run_forward()?;
        check(fmha_stream_synchronize(null_mut()), "fmha_stream_synchronize")?;
        let (o, lse) = (t.o.download()?, t.lse.download()?);
        let c = &t.case;
        let out = TokenMajor { heads: c.nhead_q, dim: c.hdim_v };
        let o_at =
            |b: usize, h: usize, i: usize, d: usize| decode(c.dtype.output(), &o, out.index(t.starts_q[b] + i, h, d));
        let lse_at = |b: usize, h: usize, i: usize| f32_at(&lse, h * t.total_q() + t.starts_q[b] + i);
        Ok(verify::forward(c, &|b| t.sequence(b), &o_at, Some(&lse_at)))
    }
}

/// A backward launcher, destroyed on drop.
struct Launcher(*mut fmha_bwd_launcher);

impl Drop for Launcher {
    fn drop(&mut self) {
        fmha_bwd_launcher_destroy(self.0);
    }
}

pub struct Backward {
    t: Tensors,
    launcher: Launcher,
    d_o: (Encoded, Buffer),
    d: Buffer,
    grads: [Buffer; 3],
    workspace: Buffer,
}

impl Backward {
    pub fn new(case: &Case, rng: &mut Rng) -> Result<Backward> {
        let t = Tensors::new(case, rng)?;
        let (seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k) = t.lengths();
        let traits = fmha_bwd_traits {
            struct_size: std::mem::size_of::<fmha_bwd_traits>(),
            seqlen_q,
            seqlen_k,
            batch: case.batch as i32,
            max_seqlen_q,
            max_seqlen_k,
            hdim_q: case.hdim_q as i32,
            hdim_v: case.hdim_v as i32,
            nhead_q: case.nhead_q as i32,
            nhead_k: case.nhead_k as i32,
            dtype: case.dtype.abi(),
            is_group_mode: case.varlen as i32,
            mask_type: case.mask.kind as i32,
            bias_type: FMHA_BIAS_NONE,
            has_dbias: 0,
            has_dropout: 0,
            is_store_randval: 0,
            is_deterministic: case.deterministic as i32,
            dq_scheme: i64::from(match case.dq_scheme.as_str() {
                "split" => FMHA_DQ_SCHEME_SPLIT_SLOTS,
                "ordered" => FMHA_DQ_SCHEME_ORDERED,
                _ => FMHA_DQ_SCHEME_AUTO,
            }),
        };
        let mut raw = null_mut();
        check(fmha_bwd_launcher_create(&traits, &mut raw), "fmha_bwd_launcher_create")?;
        let launcher = Launcher(raw);
        let mut size = 0usize;
        check(fmha_bwd_launcher_workspace_size(launcher.0, &mut size), "fmha_bwd_launcher_workspace_size")?;
        let workspace = Buffer::zeroed(size)?;
        let seqstarts: Vec<Vec<i32>> =
            [&t.starts_q, &t.starts_k].iter().map(|s| s.iter().map(|&x| x as i32).collect()).collect();
        let (sq, sk) = if case.varlen { (seqstarts[0].as_ptr(), seqstarts[1].as_ptr()) } else { (null(), null()) };
        check(
            fmha_bwd_launcher_prepare_workspace(launcher.0, workspace.ptr, size, sq, sk),
            "fmha_bwd_launcher_prepare_workspace",
        )?;
        let (total_q, total_k) = (t.total_q(), *t.starts_k.last().unwrap());
        let d_o = Encoded::random(case.dtype, total_q * case.nhead_q * case.hdim_v, rng);
        let d_o_buffer = Buffer::upload(&d_o.bytes)?;
        let e = case.dtype.bytes();
        let d = Buffer::zeroed(total_q * case.nhead_q * 4)?;
        let grads = [
            Buffer::zeroed(total_q * case.nhead_q * case.hdim_q * e)?,
            Buffer::zeroed(total_k * case.nhead_k * case.hdim_q * e)?,
            Buffer::zeroed(total_k * case.nhead_k * case.hdim_v * e)?,
        ];
        let d_o = (d_o, d_o_buffer);
        // O and LSE of these inputs, which the backward reads.
        t.run_forward()?;
        Ok(Backward { t, launcher, d_o, d, grads, workspace })
    }

    fn args(&self) -> fmha_bwd_args {
        let (t, c) = (&self.t, &self.t.case);
        let f = t.args();
        fmha_bwd_args {
            struct_size: std::mem::size_of::<fmha_bwd_args>(),
            q: f.q,
            k: f.k,
            v: f.v,
            o: f.o,
            lse: f.lse,
            d_o: t.token_tensor(self.d_o.1.ptr, c.nhead_q, c.hdim_v, false),
            d: t.row_tensor(self.d.ptr),
            dq: t.token_tensor(self.grads[0].ptr, c.nhead_q, c.hdim_q, false),
            dk: t.token_tensor(self.grads[1].ptr, c.nhead_k, c.hdim_q, true),
            dv: t.token_tensor(self.grads[2].ptr, c.nhead_k, c.hdim_v, true),
            workspace: self.workspace.ptr,
            seqstart_q: f.seqstart_q,
            seqstart_k: f.seqstart_k,
            seqlen_q_ptr: null(),
            seqlen_k_ptr: null(),
            batch: f.batch,
            seqlen_q: f.seqlen_q,
            seqlen_k: f.seqlen_k,
            max_seqlen_q: f.max_seqlen_q,
            max_seqlen_k: f.max_seqlen_k,
            nhead_q: f.nhead_q,
            nhead_k: f.nhead_k,
            hdim_q: c.hdim_q as i32,
            hdim_v: c.hdim_v as i32,
            scale: 0.0,
            window_size_left: f.window_size_left,
            window_size_right: f.window_size_right,
            workspace_size: self.workspace.bytes,
        }
    }
}

impl Bench for Backward {
    fn plan_json(&self) -> Result<String> {
        super::json_out(|b, l, r| fmha_bwd_launcher_plan_json(self.launcher.0, b, l, r), "fmha_bwd_launcher_plan_json")
    }

    fn launch(&mut self) -> Result<()> {
        check(fmha_bwd_launcher_run(self.launcher.0, &self.args(), null_mut()), "fmha_bwd_launcher_run")
    }

    /// FlashAttention's count: the backward does 2.5× the forward's matrix products.
    fn work(&self) -> Work {
        let c = &self.t.case;
        // q, k, v, o, dO read; dQ, dK, dV written.
        Work { flops: 2.5 * c.attention_flops(), bytes: 2.0 * c.io_bytes() }
    }

    fn verify(&mut self) -> Result<Verdict> {
        for g in &self.grads {
            g.fill(0xFF)?;
        }
        self.launch()?;
        check(fmha_stream_synchronize(null_mut()), "fmha_stream_synchronize")?;
        let grads: Vec<Vec<u8>> = self.grads.iter().map(Buffer::download).collect::<Result<_>>()?;
        let (t, c) = (&self.t, &self.t.case);
        let layouts = [
            (TokenMajor { heads: c.nhead_q, dim: c.hdim_q }, &t.starts_q),
            (TokenMajor { heads: c.nhead_k, dim: c.hdim_q }, &t.starts_k),
            (TokenMajor { heads: c.nhead_k, dim: c.hdim_v }, &t.starts_k),
        ];
        let dtype: DtypeName = c.dtype;
        let grad = |which: usize, b: usize, h: usize, i: usize, d: usize| {
            let (layout, starts) = layouts[which];
            decode(dtype, &grads[which], layout.index(starts[b] + i, h, d))
        };
        let d_o = |b: usize| {
            TokenMajor { heads: c.nhead_q, dim: c.hdim_v }.gather(&self.d_o.0, t.starts_q[b], t.seqlens[b].0)
        };
        Ok(verify::backward(c, &|b| t.sequence(b), &d_o, &grad))
    }
}
