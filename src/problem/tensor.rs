//! Strided tensors and device arrays as the ABI describes them, and the checks that their memory is
//! addressable (bytes, alignment, address space).

use super::Mode;
use crate::error::{ensure, ensure_field, Error, Result};
use crate::runtime::{DeviceAddr, DevicePtr};

/// A strided tensor in device memory, indexed `[batch][head][row][column]`, columns contiguous.
/// Strides are in elements. In group mode the batch stride is unused: batch `b` starts at row
/// `seqstart[b]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tensor {
    pub ptr: DeviceAddr,
    pub batch_stride: i64,
    pub head_stride: i64,
    pub row_stride: i64,
}

impl Tensor {
    /// Number of elements from the base to one past the last element the tensor covers for the
    /// given extents (0 when any extent is 0), after checking that the description is addressable:
    /// strides non-negative (the batch stride only in batch mode; group mode ignores it), `ptr`
    /// aligned to the element, the extent in bytes below 2^63, and `ptr` plus that extent inside the
    /// address space.
    #[allow(clippy::too_many_arguments)]
    pub fn extent(
        &self,
        field: &str,
        mode: Mode,
        batch: i64,
        heads: i64,
        rows: i64,
        columns: i64,
        element_bytes: usize,
    ) -> Result<usize> {
        let batch_stride = if mode == Mode::Batch { Some(("batch_stride", self.batch_stride)) } else { None };
        for (name, stride) in
            batch_stride.into_iter().chain([("head_stride", self.head_stride), ("row_stride", self.row_stride)])
        {
            ensure_field(stride >= 0, || format!("{field}.{name}"), || format!("{stride} is negative"))?;
        }
        if batch == 0 || heads == 0 || rows == 0 || columns == 0 {
            return Ok(0);
        }
        if self.ptr.is_null() {
            return Err(Error::null(&format!("{field}.data")));
        }
        let ptr = self.ptr.0;
        ensure_field(
            ptr % element_bytes == 0,
            || format!("{field}.data"),
            || format!("{ptr:#x} is not aligned to its {element_bytes}-byte elements"),
        )?;
        let batch_span = if mode == Mode::Batch { (batch - 1).checked_mul(self.batch_stride) } else { Some(0) };
        let last = batch_span
            .and_then(|b| (heads - 1).checked_mul(self.head_stride).and_then(|h| h.checked_add(b)))
            .and_then(|x| (rows - 1).checked_mul(self.row_stride).and_then(|r| r.checked_add(x)))
            .and_then(|x| x.checked_add(columns));
        let elements = last.and_then(|x| usize::try_from(x).ok());
        let bytes = elements.and_then(|e| e.checked_mul(element_bytes)).filter(|&b| b <= isize::MAX as usize);
        match (elements, bytes) {
            (Some(elements), Some(bytes)) if ptr.checked_add(bytes).is_some() => Ok(elements),
            (Some(elements), Some(bytes)) => Err(Error::invalid(
                field,
                format!(
                    "{elements} elements ({bytes} bytes) from data = {ptr:#x} run past the end of the address space"
                ),
            )),
            _ => Err(Error::invalid(
                field,
                format!(
                    "the strides (batch {}, head {}, row {}) and the shape (batch {batch}, heads {heads}, rows \
                     {rows}, columns {columns}) span 2^63 bytes or more",
                    self.batch_stride, self.head_stride, self.row_stride
                ),
            )),
        }
    }

    /// Element offset of `(batch, head, row)`, where in group mode `row` is the physical row.
    pub fn offset(&self, mode: Mode, batch: i64, head: i64, row: i64) -> usize {
        let batch_part = if mode == Mode::Batch { batch * self.batch_stride } else { 0 };
        (batch_part + head * self.head_stride + row * self.row_stride) as usize
    }
}

/// LSE (and the backward's D) must have unit stride along q: kernels index them as packed rows.
pub fn check_lse_layout(lse: &Tensor, field: &str) -> Result<()> {
    if lse.row_stride != 1 {
        return Err(Error::invalid(
            &format!("{field}.row_stride"),
            format!("{} must be 1 (LSE is [batch][nhead_q][seqlen_q] fp32 with unit stride along q)", lse.row_stride),
        ));
    }
    Ok(())
}

/// Checks a device array argument of `count` elements of `element_bytes` bytes (seqstarts, logical
/// lengths): aligned to its elements, and its bytes inside the address space. A null `ptr` passes
/// (whether the array is required is the caller's rule).
pub fn check_device_array<T>(array: DevicePtr<T>, count: usize, field: &str) -> Result<()> {
    let (ptr, element_bytes) = (array.addr().0, std::mem::size_of::<T>());
    if ptr == 0 {
        return Ok(());
    }
    ensure(ptr % element_bytes == 0, field, || {
        format!("{ptr:#x} is not aligned to its {element_bytes}-byte elements")
    })?;
    let end = count.checked_mul(element_bytes).and_then(|bytes| ptr.checked_add(bytes));
    ensure(end.is_some(), field, || format!("{count} elements from {ptr:#x} run past the end of the address space"))
}
