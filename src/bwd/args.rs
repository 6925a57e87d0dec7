//! The backward's runtime arguments and their validation against the launcher's traits.

use super::traits::BwdTraits;
use crate::error::{ensure, ensure_field, Result};
use crate::launch::BwdExtents;
use crate::problem::mask::Mask;
use crate::problem::{check_lse_layout, check_memory_overlap, Operand, SequenceArrays, Shape, Tensor};
use crate::runtime::DevicePtr;

/// Pointers, strides (elements), lengths and scalars of one backward call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwdArgs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub o: Tensor,
    pub lse: Tensor,
    pub d_o: Tensor,
    pub d: Tensor,
    pub dq: Tensor,
    pub dk: Tensor,
    pub dv: Tensor,
    pub workspace: DevicePtr<u8>,
    /// Bytes at `workspace`, or 0 when the caller did not say (checked against the launcher's size).
    pub workspace_size: usize,
    pub sequences: SequenceArrays,
    pub batch: i64,
    pub seqlen_q: i64,
    pub seqlen_k: i64,
    pub max_seqlen_q: i64,
    pub max_seqlen_k: i64,
    pub nhead_q: i64,
    pub nhead_k: i64,
    pub hdim_q: i64,
    pub hdim_v: i64,
    pub scale: f32,
    pub window_size_left: i32,
    pub window_size_right: i32,
}

impl BwdArgs {
    /// The call's shape, checked field by field against the traits the launcher was created with. In
    /// group mode the traits' total and maximum lengths are bounds (the workspace is sized for them),
    /// so one launcher serves every varlen batch that fits; everything else must be equal.
    pub fn shape(&self, traits: &BwdTraits) -> Result<Shape> {
        for (name, arg, trait_value) in [
            ("batch", self.batch, traits.batch),
            ("nhead_q", self.nhead_q, traits.nhead_q),
            ("nhead_k", self.nhead_k, traits.nhead_k),
            ("hdim_q", self.hdim_q, traits.hdim_q),
            ("hdim_v", self.hdim_v, traits.hdim_v),
        ] {
            ensure(arg == trait_value, name, || {
                format!("{arg} disagrees with the launcher's traits ({trait_value}); create a launcher for this shape")
            })?;
        }
        let group = traits.mode == crate::problem::Mode::Group;
        for (name, arg, trait_value) in [
            ("seqlen_q", self.seqlen_q, traits.seqlen_q),
            ("seqlen_k", self.seqlen_k, traits.seqlen_k),
            ("max_seqlen_q", self.max_seqlen_q, traits.max_seqlen_q),
            ("max_seqlen_k", self.max_seqlen_k, traits.max_seqlen_k),
        ] {
            let fits = if group { arg <= trait_value } else { arg == trait_value };
            ensure(fits, name, || {
                if group {
                    format!("{arg} exceeds the launcher's bound ({trait_value}); create a launcher with larger traits")
                } else {
                    format!(
                        "{arg} disagrees with the launcher's traits ({trait_value}); create a launcher for this shape"
                    )
                }
            })?;
        }
        let mask = Mask { kind: traits.mask_type, left: self.window_size_left, right: self.window_size_right };
        let call = BwdTraits {
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            max_seqlen_q: self.max_seqlen_q,
            max_seqlen_k: self.max_seqlen_k,
            ..*traits
        };
        let mut shape = call.shape(mask)?;
        ensure(self.scale.is_finite() && self.scale >= 0.0, "scale", || {
            format!("{} must be finite and non-negative (0 selects 1/sqrt(hdim_q))", self.scale)
        })?;
        if self.scale != 0.0 {
            shape.scale = self.scale;
        }
        self.sequences.check(&shape)?;
        Ok(shape)
    }

    /// Every tensor argument, checked (the LSE/D layouts, then each extent), in the order q, k, v, o,
    /// lse, d_o, d, dq, dk, dv.
    pub fn tensors(&self, s: &Shape) -> Result<[Operand<'static>; 10]> {
        let (m, b) = (s.mode, s.batch);
        check_lse_layout(&self.lse, "lse")?;
        check_lse_layout(&self.d, "d")?;
        for (name, t) in [("lse", &self.lse), ("d", &self.d)] {
            ensure_field(!t.ptr.is_null() || s.seqlen_q == 0, || format!("{name}.data"), || "must not be null".into())?;
        }
        let (q, k) = ((b, s.nhead_q, s.seqlen_q), (b, s.nhead_k, s.seqlen_k));
        let with = |(b, h, r): (i64, i64, i64), columns: i64| (b, h, r, columns);
        Ok([
            Operand::tensor("q", &self.q, m, with(q, s.hdim_q), 2, false)?,
            Operand::tensor("k", &self.k, m, with(k, s.hdim_q), 2, false)?,
            Operand::tensor("v", &self.v, m, with(k, s.hdim_v), 2, false)?,
            Operand::tensor("o", &self.o, m, with(q, s.hdim_v), 2, false)?,
            Operand::tensor("lse", &self.lse, m, with(q, 1), 4, false)?,
            Operand::tensor("d_o", &self.d_o, m, with(q, s.hdim_v), 2, false)?,
            Operand::tensor("d", &self.d, m, with(q, 1), 4, true)?,
            Operand::tensor("dq", &self.dq, m, with(q, s.hdim_q), 2, true)?,
            Operand::tensor("dk", &self.dk, m, with(k, s.hdim_q), 2, true)?,
            Operand::tensor("dv", &self.dv, m, with(k, s.hdim_v), 2, true)?,
        ])
    }

    /// Refuses outputs (dq, dk, dv, the D scratch, the workspace of `workspace_bytes`) that share
    /// memory with each other or with an input; `tensors` is [`tensors`](Self::tensors).
    pub fn check_overlap(&self, tensors: &[Operand<'static>; 10], workspace_bytes: usize) -> Result<()> {
        let workspace = Operand::bytes("workspace", self.workspace.addr(), workspace_bytes, true);
        let operands: Vec<Operand<'_>> = tensors.iter().copied().chain([workspace]).collect();
        check_memory_overlap(&operands)
    }
}

/// The element extents of [`BwdArgs::tensors`].
pub fn extents(tensors: &[Operand<'_>; 10]) -> BwdExtents {
    let [q, k, v, o, lse, d_o, d, dq, dk, dv] = tensors.map(|t| t.elements);
    BwdExtents { q, k, v, o, lse, d_o, d, dq, dk, dv }
}
