//! One query tile of one head against one sequence's keys: the online-softmax loop of every forward
//! kernel on the host (dense and paged KV differ only in where key/value rows come from, so on the
//! same tiles they give the same bits).

use super::tensor_view::TensorView;
use super::tile_math::{axpy, dot, scale};
use crate::error::Result;
use crate::problem::mask::ResolvedMask;
use crate::problem::Scalar;

/// Where key and value rows come from: `read(j, k, v)` fills row `j` of the sequence (0-based).
pub trait KeyValueRows {
    fn read(&mut self, j: i64, k: &mut [f32], v: &mut [f32]) -> Result<()>;
}

/// The query tile: rows `i0..i0 + rows` of a sequence, `dq` columns each, and the math around it.
pub struct QueryTile {
    pub i0: i64,
    pub rows: usize,
    pub hdim_q: usize,
    pub hdim_v: usize,
    /// Softmax scale applied to `q · k`.
    pub scale: f32,
    /// Keys per tile.
    pub n0: i64,
    /// The sequence's mask (resolved to its lengths; unmasked keeps every key).
    pub mask: ResolvedMask,
    /// The keys this block attends to at most: a split's chunk (`0..i64::MAX` unsplit).
    pub keys: std::ops::Range<i64>,
    /// Rounds P before the P·V product (the input type of the GPU's matrix units).
    pub round_p: fn(f32) -> f32,
}

/// A finished tile: each row's normalised output and natural-log LSE (O = 0, LSE = −inf for a row
/// with no kept key).
pub struct Attended {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
}

/// The query-side tensors of a forward block: q is read, O and the LSE written, at the same (batch,
/// head, physical row) coordinates.
pub struct QueryIo<'a, E, O> {
    pub q: &'a TensorView<E>,
    pub o: &'a TensorView<O>,
    pub lse: Option<&'a TensorView<f32>>,
}

impl<E: Scalar, O: Scalar> QueryIo<'_, E, O> {
    /// One block: physical rows `first..first + t.rows` of (`batch`, `head`) — q times `q_scale` —
    /// attend over `kv`; O and the LSE are written at the same rows.
    pub fn attend_block(
        &self,
        batch: i64,
        head: i64,
        first: i64,
        q_scale: f32,
        t: &QueryTile,
        kv: &mut impl KeyValueRows,
    ) -> Result<()> {
        let out = self.attend_rows(batch, head, first, q_scale, t, kv)?;
        self.write_rows(batch, head, first, &out, t.hdim_v);
        Ok(())
    }

    /// The block's rows attended (`attend_block` without the writes).
    pub fn attend_rows(
        &self,
        batch: i64,
        head: i64,
        first: i64,
        q_scale: f32,
        t: &QueryTile,
        kv: &mut impl KeyValueRows,
    ) -> Result<Attended> {
        let (m, dq) = (t.rows, t.hdim_q);
        let mut q_staging = Vec::new();
        let mut q = vec![0f32; m * dq];
        for (i, row) in q.chunks_exact_mut(dq).enumerate() {
            self.q.read_row(batch, head, first + i as i64, row, &mut q_staging);
            row.iter_mut().for_each(|x| *x *= q_scale);
        }
        attend(t, &q, kv)
    }

    /// Writes finished rows' O and LSE from physical row `first` on.
    pub fn write_rows(&self, batch: i64, head: i64, first: i64, out: &Attended, dv: usize) {
        let mut o_staging = Vec::new();
        for (i, lse_i) in out.lse.iter().enumerate() {
            let row = first + i as i64;
            self.o.write_row(batch, head, row, &out.o[i * dv..(i + 1) * dv], &mut o_staging);
            if let Some(lse) = self.lse {
                lse.slice().set(lse.row_offset(batch, head, row), *lse_i);
            }
        }
    }
}

/// Streams the keys some row of the tile keeps, in tiles of `n0`, with an online softmax in f32; `q`
/// holds the tile's rows, `t.hdim_q` columns each.
pub fn attend(t: &QueryTile, q: &[f32], kv: &mut impl KeyValueRows) -> Result<Attended> {
    let (m, dq, dv, n0) = (t.rows, t.hdim_q, t.hdim_v, t.n0);
    let mut row_max = vec![f32::NEG_INFINITY; m];
    let mut row_sum = vec![0f32; m];
    let mut acc = vec![0f32; m * dv];
    let mut k_tile = vec![0f32; n0 as usize * dq];
    let mut v_tile = vec![0f32; n0 as usize * dv];
    let mut scores = vec![0f32; n0 as usize];
    let (j0, j1) = t.mask.key_range(t.i0, t.i0 + m as i64);
    let (j0, j1) = (j0.max(t.keys.start), j1.min(t.keys.end));

    let mut jt = j0;
    while jt < j1 {
        let n = ((jt + n0).min(j1) - jt) as usize;
        for j in 0..n {
            kv.read(jt + j as i64, &mut k_tile[j * dq..(j + 1) * dq], &mut v_tile[j * dv..(j + 1) * dv])?;
        }
        let edge = t.mask.tile_needs_mask(t.i0, t.i0 + m as i64, jt, jt + n as i64);
        for i in 0..m {
            let qi = &q[i * dq..(i + 1) * dq];
            let mut tile_max = f32::NEG_INFINITY;
            for j in 0..n {
                let kept = !edge || t.mask.is_kept(t.i0 + i as i64, jt + j as i64);
                scores[j] = if kept { dot(qi, &k_tile[j * dq..(j + 1) * dq]) * t.scale } else { f32::NEG_INFINITY };
                tile_max = tile_max.max(scores[j]);
            }
            let new_max = row_max[i].max(tile_max);
            if new_max == f32::NEG_INFINITY {
                continue; // every key so far is masked for this row
            }
            let correction = (row_max[i] - new_max).exp(); // exp(-inf) = 0 on the first kept tile
            row_max[i] = new_max;
            row_sum[i] *= correction;
            let acc_i = &mut acc[i * dv..(i + 1) * dv];
            scale(correction, acc_i);
            for j in 0..n {
                let p = (scores[j] - new_max).exp();
                row_sum[i] += p;
                axpy((t.round_p)(p), &v_tile[j * dv..(j + 1) * dv], acc_i);
            }
        }
        jt += n0;
    }

    let mut lse = vec![f32::NEG_INFINITY; m];
    for i in 0..m {
        let acc_i = &mut acc[i * dv..(i + 1) * dv];
        if row_sum[i] == 0.0 {
            acc_i.fill(0.0); // fully masked
        } else {
            scale(1.0 / row_sum[i], acc_i);
            lse[i] = row_max[i] + row_sum[i].ln();
        }
    }
    Ok(Attended { o: acc, lse })
}
