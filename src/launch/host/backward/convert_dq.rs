//! Stage 3: `dQ = Σ_split dq_acc[split]` over the slots that hold partials
//! (`WorkspaceLayout::summed_splits`), summed in split order (bit-reproducible), cast to the input type.
//! Batches without keys get dQ = 0 without reading dq_acc.

use super::BwdContext;
use crate::error::Result;
use crate::launch::host::grid::for_each_block;
use crate::problem::Element;

const ROWS: i64 = 64;

pub fn run<E: Element>(c: &BwdContext<E>, workers: i64) -> Result<()> {
    let s = &c.kargs.shape;
    let meta = c.metadata()?;
    let layout = &c.kargs.layout;
    let tiles = ((s.max_seqlen_q + ROWS - 1) / ROWS) as usize; // no rows: nothing to do
    let heads = s.nhead_q as usize;
    let (dq, group) = (s.hdim_q as usize, s.group_size());
    for_each_block(tiles * heads * s.batch as usize, workers, |block| {
        let (tile, rest) = (block % tiles, block / tiles);
        let (h, b) = ((rest % heads) as i64, (rest / heads) as i64);
        let rows = c.sequences.rows(b as usize)?;
        let (hk, g) = ((h / group) as usize, (h % group) as usize);
        let acc = layout.dq_acc_block(&meta, c.seqstart_q.as_deref(), b as usize)?;
        let splits = layout.summed_splits(&acc, b as usize, hk);
        let (mut sum, mut staging) = (vec![0f32; dq], Vec::new());
        for i in (tile as i64 * ROWS)..((tile as i64 + 1) * ROWS).min(rows.sq) {
            sum.fill(0.0);
            if rows.sk > 0 {
                for split in 0..splits {
                    let start = acc.index(hk, split, i as usize, g * dq);
                    for (col, x) in sum.iter_mut().enumerate() {
                        *x += c.dq_acc.get(start + col);
                    }
                }
            }
            c.dq.write_row(b, h, rows.q_start + i, &sum, &mut staging);
        }
        Ok(())
    })
}
