//! The forward kernel on the host: one block per (q tile, query head, batch), streaming K/V tiles
//! with an online softmax in f32, writing O in the input type and the natural-log LSE.

use super::grid::for_each_block;
use super::sequence::Sequences;
use super::tensor_view::TensorView;
use super::tile_math::{axpy, dot, scale};
use crate::error::Result;
use crate::launch::FwdKargs;
use crate::problem::Element;

/// Runs the whole forward grid on up to `cu_count` threads.
pub fn run<E: Element>(k: &FwdKargs, cu_count: i64) -> Result<()> {
    let s = &k.shape;
    let mode = s.mode;
    let q = TensorView::<E>::new(k.q, k.extents.q, mode, "q")?;
    let kt = TensorView::<E>::new(k.k, k.extents.k, mode, "k")?;
    let v = TensorView::<E>::new(k.v, k.extents.v, mode, "v")?;
    let o = TensorView::<E>::new(k.o, k.extents.o, mode, "o")?;
    let lse = if k.lse.ptr.is_null() { None } else { Some(TensorView::<f32>::new(k.lse, k.extents.lse, mode, "lse")?) };
    let seqs = Sequences::new(s, &k.sequences)?;
    let (m0, n0) = (k.instance.m0, k.instance.n0);
    let q_tiles = ((s.max_seqlen_q + m0 - 1) / m0) as usize;
    let heads = s.nhead_q as usize;
    let blocks = q_tiles * heads * s.batch as usize;

    for_each_block(blocks, cu_count, |block| {
        let (tile, rest) = (block % q_tiles, block / q_tiles);
        let (h, b) = ((rest % heads) as i64, (rest / heads) as i64);
        let rows = seqs.rows(b as usize)?;
        let i0 = tile as i64 * m0;
        if i0 >= rows.sq {
            return Ok(());
        }
        let i1 = (i0 + m0).min(rows.sq);
        let hk = h / s.group_size();
        let mask = s.mask.resolve(rows.sq, rows.sk);
        let (j0, j1) = if s.masked() { mask.key_range(i0, i1) } else { (0, rows.sk) };
        let (dq, dv) = (s.hdim_q as usize, s.hdim_v as usize);
        let m = (i1 - i0) as usize;

        let mut staging = Vec::new();
        let mut q_tile = vec![0f32; m * dq];
        for i in 0..m {
            q.read_row(b, h, rows.q_start + i0 + i as i64, &mut q_tile[i * dq..(i + 1) * dq], &mut staging);
        }
        let mut row_max = vec![f32::NEG_INFINITY; m];
        let mut row_sum = vec![0f32; m];
        let mut acc = vec![0f32; m * dv];
        let mut k_tile = vec![0f32; n0 as usize * dq];
        let mut v_tile = vec![0f32; n0 as usize * dv];
        let mut scores = vec![0f32; n0 as usize];

        let mut jt = j0;
        while jt < j1 {
            let n = ((jt + n0).min(j1) - jt) as usize;
            for j in 0..n {
                let row = rows.k_start + jt + j as i64;
                kt.read_row(b, hk, row, &mut k_tile[j * dq..(j + 1) * dq], &mut staging);
                v.read_row(b, hk, row, &mut v_tile[j * dv..(j + 1) * dv], &mut staging);
            }
            let edge = s.masked() && mask.tile_needs_mask(i0, i1, jt, jt + n as i64);
            for i in 0..m {
                let qi = &q_tile[i * dq..(i + 1) * dq];
                let mut tile_max = f32::NEG_INFINITY;
                for j in 0..n {
                    let kept = !edge || mask.is_kept(i0 + i as i64, jt + j as i64);
                    scores[j] = if kept { dot(qi, &k_tile[j * dq..(j + 1) * dq]) * s.scale } else { f32::NEG_INFINITY };
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
                    // P enters the P·V product in the input type, as on the GPU's matrix units.
                    axpy(E::DTYPE.round(p), &v_tile[j * dv..(j + 1) * dv], acc_i);
                }
            }
            jt += n0;
        }

        for i in 0..m {
            let row = rows.q_start + i0 + i as i64;
            let acc_i = &mut acc[i * dv..(i + 1) * dv];
            let fully_masked = row_sum[i] == 0.0;
            if fully_masked {
                acc_i.fill(0.0);
            } else {
                scale(1.0 / row_sum[i], acc_i);
            }
            o.write_row(b, h, row, acc_i, &mut staging);
            if let Some(lse) = &lse {
                let value = if fully_masked { f32::NEG_INFINITY } else { row_max[i] + row_sum[i].ln() };
                lse.slice().set(lse.row_offset(b, h, row), value);
            }
        }
        Ok(())
    })
}
