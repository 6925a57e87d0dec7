//! Stage 1: `D[i] = Σ_d dO[i,d] · O[i,d]` per query row (fp32, the LSE layout).

use super::BwdContext;
use crate::error::Result;
use crate::launch::host::grid::for_each_block;
use crate::launch::host::tile_math::dot;
use crate::problem::Element;

/// Rows per block, as CK's 1-D kernels.
const ROWS: i64 = 64;

pub fn run<E: Element>(c: &BwdContext<E>, workers: i64) -> Result<()> {
    let s = &c.kargs.shape;
    let tiles = ((s.max_seqlen_q + ROWS - 1) / ROWS) as usize; // no rows: nothing to do
    let heads = s.nhead_q as usize;
    let dv = s.hdim_v as usize;
    for_each_block(tiles * heads * s.batch as usize, workers, |block| {
        let (tile, rest) = (block % tiles, block / tiles);
        let (h, b) = ((rest % heads) as i64, (rest / heads) as i64);
        let rows = c.sequences.rows(b as usize)?;
        let (mut o, mut g, mut staging) = (vec![0f32; dv], vec![0f32; dv], Vec::new());
        for i in (tile as i64 * ROWS)..((tile as i64 + 1) * ROWS).min(rows.sq) {
            let row = rows.q_start + i;
            c.o.read_row(b, h, row, &mut o, &mut staging);
            c.d_o.read_row(b, h, row, &mut g, &mut staging);
            c.d.slice().set(c.d.row_offset(b, h, row), dot(&o, &g));
        }
        Ok(())
    })
}
