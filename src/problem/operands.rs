//! The memory arguments of a call, and the rule that what a call writes shares no byte with anything
//! else it touches.

use super::overlap::{overlap, self_overlap, Overlap, Region};
use super::{Mode, Tensor};
use crate::error::{Error, Result};
use crate::runtime::DeviceAddr;

/// One memory argument of a call, checked: its C field, the elements from its base that the kernels
/// may touch, the bytes it covers (for [`check_memory_overlap`]), and whether the call writes it.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    pub field: &'a str,
    /// [`Tensor::extent`]: one past the last element the shape covers, counted from the base.
    pub elements: usize,
    pub region: Region,
    pub written: bool,
}

impl<'a> Operand<'a> {
    /// `tensor` with the given `(batch, heads, rows, columns)`, checked as [`Tensor::extent`] checks it;
    /// `written` for outputs.
    pub fn tensor(
        field: &'a str,
        tensor: &Tensor,
        mode: Mode,
        extents: (i64, i64, i64, i64),
        element_bytes: usize,
        written: bool,
    ) -> Result<Operand<'a>> {
        let (batch, heads, rows, columns) = extents;
        let elements = tensor.extent(field, mode, batch, heads, rows, columns, element_bytes)?;
        let region = Region::of_tensor(field, tensor, mode, extents, element_bytes as u64)?;
        Ok(Operand { field, elements, region, written })
    }

    /// `bytes` contiguous bytes at `ptr` (a workspace).
    pub fn bytes(field: &'a str, ptr: DeviceAddr, bytes: usize, written: bool) -> Operand<'a> {
        let one = super::overlap::Dim::ONE;
        let region = Region { base: ptr.0 as u64, dims: [one; 3], run: bytes as u64 };
        Operand { field, elements: bytes, region, written }
    }
}

/// Refuses a written argument that shares memory with another argument, or whose own elements share
/// memory (a zero stride on a dimension longer than 1): the kernels write it in parallel, so the
/// result would depend on timing. Inputs may alias each other freely (broadcasts, packed qkv), and
/// outputs may interleave as views of one buffer (packed dqkv) as long as no byte is shared. Layouts
/// too irregular for the exact test ([`Overlap::Unknown`]) are accepted.
pub fn check_memory_overlap(operands: &[Operand<'_>]) -> Result<()> {
    for (i, a) in operands.iter().enumerate() {
        if !a.written || a.region.is_empty() {
            continue;
        }
        if self_overlap(&a.region) == Overlap::Overlapping {
            return Err(Error::invalid(
                a.field,
                "its strides map two of its elements to the same memory (e.g. a zero stride on a dimension \
                 longer than 1); an output needs an element of its own for every index",
            ));
        }
        for (j, b) in operands.iter().enumerate() {
            if j == i || (b.written && j < i) || b.region.is_empty() {
                continue; // each pair of outputs once
            }
            if overlap(&a.region, &b.region) == Overlap::Overlapping {
                let what = if b.written { "the output" } else { "the input" };
                return Err(Error::invalid(
                    a.field,
                    format!(
                        "shares memory with {what} {} (outputs may interleave with other arguments, not overlap them)",
                        b.field
                    ),
                ));
            }
        }
    }
    Ok(())
}
