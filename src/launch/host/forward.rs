//! The forward kernel on the host: one block per (q tile, query head, batch), streaming K/V tiles
//! with an online softmax in f32, writing O (the input type; bf16 for fp8 inputs) and the natural-log
//! LSE. fp8 codes are decoded and multiplied by their (sequence, kv head) descales, as the kv-cache's
//! host kernel does.

use super::attend::{KeyValueRows, QueryIo, QueryTile};
use super::grid::for_each_block;
use super::sequence::Sequences;
use super::tensor_view::{DescaleView, TensorView};
use crate::error::Result;
use crate::launch::FwdKargs;
use crate::problem::Scalar;

/// Runs the whole forward grid on up to `cu_count` threads: `E` is the element type of q, k and v,
/// `O` that of o.
pub fn run<E: Scalar, O: Scalar>(k: &FwdKargs, cu_count: i64) -> Result<()> {
    let s = &k.shape;
    let mode = s.mode;
    let q = TensorView::<E>::new(k.q, k.extents.q, mode, "q")?;
    let kt = TensorView::<E>::new(k.k, k.extents.k, mode, "k")?;
    let v = TensorView::<E>::new(k.v, k.extents.v, mode, "v")?;
    let o = TensorView::<O>::new(k.o, k.extents.o, mode, "o")?;
    let lse = if k.lse.ptr.is_null() { None } else { Some(TensorView::<f32>::new(k.lse, k.extents.lse, mode, "lse")?) };
    let [q_descale, k_descale, v_descale] = DescaleView::of_call(&k.descales, k.descale_extents)?;
    let io = QueryIo { q: &q, o: &o, lse: lse.as_ref() };
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
        let m = ((i0 + m0).min(rows.sq) - i0) as usize;
        let tile = QueryTile {
            i0,
            rows: m,
            hdim_q: s.hdim_q as usize,
            hdim_v: s.hdim_v as usize,
            scale: s.scale,
            n0,
            mask: s.mask.resolve(rows.sq, rows.sk),
            keys: 0..i64::MAX,
            round_p: E::round_probability, // P enters P·V in the input type, as on the matrix units
        };
        let g = h / s.group_size();
        let mut kv = DenseRows {
            k: &kt,
            v: &v,
            batch: b,
            head: g,
            first_row: rows.k_start,
            k_descale: k_descale.value(b, g, 0),
            v_descale: v_descale.value(b, g, 0),
            staging: Vec::new(),
        };
        io.attend_block(b, h, rows.q_start + i0, q_descale.value(b, g, 0), &tile, &mut kv)?;
        Ok(())
    })
}

/// Key and value rows of one (batch, kv head) of dense K and V tensors, in true values (times their
/// descales: 1 for 16-bit inputs, which leaves them exact).
struct DenseRows<'a, E> {
    k: &'a TensorView<E>,
    v: &'a TensorView<E>,
    batch: i64,
    head: i64,
    first_row: i64,
    k_descale: f32,
    v_descale: f32,
    staging: Vec<E>,
}

impl<E: Scalar> KeyValueRows for DenseRows<'_, E> {
    fn read(&mut self, j: i64, k: &mut [f32], v: &mut [f32]) -> Result<()> {
        self.k.read_row(self.batch, self.head, self.first_row + j, k, &mut self.staging);
        self.v.read_row(self.batch, self.head, self.first_row + j, v, &mut self.staging);
        k.iter_mut().for_each(|x| *x *= self.k_descale);
        v.iter_mut().for_each(|x| *x *= self.v_descale);
        Ok(())
    }
}
