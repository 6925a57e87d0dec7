//! The forward's runtime arguments and their validation against the traits.

use super::traits::FwdTraits;
use crate::error::Result;
use crate::launch::{FwdExtents, FwdKargs};
use crate::problem::mask::Mask;
use crate::problem::scale::{Descale, Descales};
use crate::problem::{check_lse_layout, check_memory_overlap, Operand, SequenceArrays, Shape, Tensor};
use crate::registry::{Operation, Request};
use crate::runtime::{Arch, DevicePtr};
use crate::workspace::{check_scheduler_workspace, SCHEDULER_WORKSPACE_BYTES};

/// Pointers, strides (elements) and lengths of one forward call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FwdArgs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub o: Tensor,
    pub lse: Tensor,
    pub sequences: SequenceArrays,
    pub batch: i64,
    pub seqlen_q: i64,
    pub seqlen_k: i64,
    pub max_seqlen_q: i64,
    pub max_seqlen_k: i64,
    pub nhead_q: i64,
    pub nhead_k: i64,
    pub scale: f32,
    pub window_size_left: i32,
    pub window_size_right: i32,
    /// fp8 descales: per tensor or per (sequence, kv head).
    pub q_descale: Descale,
    pub k_descale: Descale,
    pub v_descale: Descale,
    /// The scheduler workspace, [`SCHEDULER_WORKSPACE_BYTES`] written by the call; null: none.
    pub workspace: DevicePtr<u8>,
    /// Bytes at `workspace` (ignored when it is null).
    pub workspace_size: usize,
}

impl FwdArgs {
    /// Validates the args against the traits and selects the kernel instance for `arch`.
    pub fn validate(&self, traits: &FwdTraits, arch: Arch) -> Result<FwdKargs> {
        traits.validate()?;
        let mask = Mask { kind: traits.mask_type, left: self.window_size_left, right: self.window_size_right };
        let shape = Shape::new(
            traits.dtype,
            traits.mode,
            self.batch,
            (self.nhead_q, self.nhead_k),
            (traits.hdim_q, traits.hdim_v),
            (self.seqlen_q, self.seqlen_k),
            (self.max_seqlen_q, self.max_seqlen_k),
            self.scale,
            mask,
        )?;
        self.sequences.check(&shape)?;
        let (b, mode) = (shape.batch, shape.mode);
        let (q_rows, k_rows) = (shape.seqlen_q, shape.seqlen_k);
        // fp8 inputs are bytes and write bf16; fp16/bf16 write their own type.
        let (in_bytes, out_bytes) = (shape.dtype.bytes(), 2);
        let q = Operand::tensor("q", &self.q, mode, (b, shape.nhead_q, q_rows, shape.hdim_q), in_bytes, false)?;
        let k = Operand::tensor("k", &self.k, mode, (b, shape.nhead_k, k_rows, shape.hdim_q), in_bytes, false)?;
        let v = Operand::tensor("v", &self.v, mode, (b, shape.nhead_k, k_rows, shape.hdim_v), in_bytes, false)?;
        let o = Operand::tensor("o", &self.o, mode, (b, shape.nhead_q, q_rows, shape.hdim_v), out_bytes, true)?;
        let lse = if self.lse.ptr.is_null() {
            None
        } else {
            check_lse_layout(&self.lse, "lse")?;
            Some(Operand::tensor("lse", &self.lse, mode, (b, shape.nhead_q, q_rows, 1), 4, true)?)
        };
        let extents = FwdExtents {
            q: q.elements,
            k: k.elements,
            v: v.elements,
            o: o.elements,
            lse: lse.map_or(0, |lse| lse.elements),
        };
        let descales = Descales { q: self.q_descale, k: self.k_descale, v: self.v_descale };
        let descale_extents = descales.extents(shape.dtype, b, shape.nhead_k, None)?;
        // The scheduler workspace (written: the call zeroes its counter).
        let address = self.workspace.addr();
        let workspace =
            check_scheduler_workspace("workspace", address.0, self.workspace_size, "fmha_fwd_workspace_size")?
                .then(|| Operand::bytes("workspace", address, SCHEDULER_WORKSPACE_BYTES, true));
        // The fp8 descales are inputs too: the outputs may share no byte with them.
        let operands: Vec<Operand<'_>> =
            workspace.into_iter().chain([q, k, v, o]).chain(lse).chain(descales.operands(descale_extents)).collect();
        check_memory_overlap(&operands)?;
        let instance = crate::registry::select(
            arch,
            &Request {
                operation: Operation::Forward,
                dtype: shape.dtype,
                hdim_q: shape.hdim_q,
                hdim_v: shape.hdim_v,
                masked: shape.masked(),
                deterministic: false,
                packed_gqa: false,
            },
        )?;
        instance.check_grid(shape.nhead_q, shape.batch)?;
        // (field, tensor, loaded by the kernels' tiles)
        for (field, tensor, bytes, input) in [
            ("q", &self.q, in_bytes, true),
            ("k", &self.k, in_bytes, true),
            ("v", &self.v, in_bytes, true),
            ("o", &self.o, out_bytes, false),
        ] {
            instance.check_tensor(field, tensor, shape.mode, bytes)?;
            if input {
                instance.check_input_rows(field, tensor)?;
            }
        }
        Ok(FwdKargs {
            shape,
            instance,
            q: self.q,
            k: self.k,
            v: self.v,
            o: self.o,
            lse: self.lse,
            extents,
            sequences: self.sequences,
            descales,
            descale_extents,
            workspace: self.workspace,
        })
    }
}
