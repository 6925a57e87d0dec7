//! Row access to strided tensors in host-backend device memory, converting to and from f32.

use crate::error::Result;
use crate::problem::scale::{Descale, Descales};
use crate::problem::{Mode, Scalar, Tensor};
use crate::runtime::host::DeviceSlice;

#[derive(Debug, Clone, Copy)]
pub struct TensorView<T> {
    data: DeviceSlice<T>,
    layout: Tensor,
    mode: Mode,
}

impl<T: Copy> TensorView<T> {
    pub fn new(layout: Tensor, extent: usize, mode: Mode, field: &str) -> Result<Self> {
        Ok(TensorView { data: DeviceSlice::new(layout.ptr.cast(), extent, field)?, layout, mode })
    }

    /// Element offset of column 0 of `(batch, head, physical row)`.
    pub fn row_offset(&self, batch: i64, head: i64, row: i64) -> usize {
        self.layout.offset(self.mode, batch, head, row)
    }

    pub fn slice(&self) -> DeviceSlice<T> {
        self.data
    }
}

impl<E: Scalar> TensorView<E> {
    /// Reads `out.len()` columns of a row as f32.
    pub fn read_row(&self, batch: i64, head: i64, row: i64, out: &mut [f32], staging: &mut Vec<E>) {
        staging.resize(out.len(), E::from_f32(0.0));
        self.data.read_into(self.row_offset(batch, head, row), staging);
        for (o, s) in out.iter_mut().zip(staging.iter()) {
            *o = s.to_f32();
        }
    }

    /// Writes a row, rounding each value to the element type.
    pub fn write_row(&self, batch: i64, head: i64, row: i64, values: &[f32], staging: &mut Vec<E>) {
        staging.clear();
        staging.extend(values.iter().map(|&v| E::from_f32(v)));
        self.data.write_from(self.row_offset(batch, head, row), staging);
    }
}

/// A descale array read on the host (1 where none was given).
pub struct DescaleView {
    descale: Descale,
    data: Option<DeviceSlice<f32>>,
}

impl DescaleView {
    pub fn new(descale: Descale, extent: usize, field: &str) -> Result<DescaleView> {
        let data = (!descale.is_none()).then(|| DeviceSlice::new(descale.data, extent, field)).transpose()?;
        Ok(DescaleView { descale, data })
    }

    /// The views of a call's q, k and v descales, spanning `extents` elements.
    pub fn of_call(descales: &Descales, [q, k, v]: [usize; 3]) -> Result<[DescaleView; 3]> {
        Ok([
            DescaleView::new(descales.q, q, "q_descale")?,
            DescaleView::new(descales.k, k, "k_descale")?,
            DescaleView::new(descales.v, v, "v_descale")?,
        ])
    }

    pub fn value(&self, b: i64, g: i64, page: i64) -> f32 {
        self.data.as_ref().map_or(1.0, |d| d.get(self.descale.offset(b, g, page)))
    }
}
