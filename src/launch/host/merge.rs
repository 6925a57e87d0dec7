//! The merge of attention states on the host (the twin of `hip/merge/merge.hip`): per (row, head), the
//! states' LSEs (in the natural log) and rows read as f32, merged in state order by
//! `problem::merge::merge_row`, and written with one rounding to the output type. Everything of a
//! (row, head) is read before anything of it is written, so an output that is state 0 itself merges
//! in place.

use super::grid::for_each_block;
use super::tensor_view::TensorView;
use crate::error::Result;
use crate::host_buffer::try_filled;
use crate::launch::MergeKargs;
use crate::problem::merge::{merge_row, StateDtype};
use crate::problem::{Mode, Scalar};
use half::{bf16, f16};

/// (row, head) pairs per block of the host grid.
const ITEMS_PER_BLOCK: usize = 64;

/// Runs the merge with the element types of `k`.
pub fn run(k: &MergeKargs, workers: i64) -> Result<()> {
    fn with_output<I: Scalar>(k: &MergeKargs, workers: i64) -> Result<()> {
        match k.out_dtype {
            StateDtype::F16 => merge::<I, f16>(k, workers),
            StateDtype::Bf16 => merge::<I, bf16>(k, workers),
            StateDtype::F32 => merge::<I, f32>(k, workers),
        }
    }
    match k.in_dtype {
        StateDtype::F16 => with_output::<f16>(k, workers),
        StateDtype::Bf16 => with_output::<bf16>(k, workers),
        StateDtype::F32 => with_output::<f32>(k, workers),
    }
}

fn merge<I: Scalar, O: Scalar>(k: &MergeKargs, workers: i64) -> Result<()> {
    let o_in = TensorView::<I>::new(k.o_in, k.extents.o_in, Mode::Batch, "o_in")?;
    let lse_in = TensorView::<f32>::new(k.lse_in, k.extents.lse_in, Mode::Batch, "lse_in")?;
    let o_out = TensorView::<O>::new(k.o_out, k.extents.o_out, Mode::Group, "o_out")?;
    let lse_out = (!k.lse_out.ptr.is_null())
        .then(|| TensorView::<f32>::new(k.lse_out, k.extents.lse_out, Mode::Group, "lse_out"))
        .transpose()?;
    let (states, hdim, nhead) = (k.num_states as usize, k.hdim as usize, k.nhead as usize);
    // The outputs hold a distinct element for every (row, head) (validated), so this count is bounded by
    // their memory.
    let items = k.num_rows as usize * nhead;
    for_each_block(items.div_ceil(ITEMS_PER_BLOCK), workers, |block| {
        let mut rows = try_filled(states * hdim, 0f32, "o_in")?;
        let mut lses = try_filled(states, 0f32, "lse_in")?;
        let mut out = try_filled(hdim, 0f32, "o_out")?;
        let (mut staging_in, mut staging_out) = (Vec::new(), Vec::new());
        for item in block * ITEMS_PER_BLOCK..items.min((block + 1) * ITEMS_PER_BLOCK) {
            let (row, head) = ((item / nhead) as i64, (item % nhead) as i64);
            for (s, (lse, o)) in lses.iter_mut().zip(rows.chunks_exact_mut(hdim)).enumerate() {
                *lse = k.lse_base.to_natural(lse_in.slice().get(lse_in.row_offset(s as i64, head, row)));
                o_in.read_row(s as i64, head, row, o, &mut staging_in);
            }
            let lse = merge_row(states, |s| lses[s], |s| &rows[s * hdim..(s + 1) * hdim], &mut out);
            o_out.write_row(0, head, row, &out, &mut staging_out);
            if let Some(lse_out) = &lse_out {
                lse_out.slice().set(lse_out.row_offset(0, head, row), k.lse_base.from_natural(lse));
            }
        }
        Ok(())
    })
}
