//! The validated shape of one attention call, and the sequence arrays it implies.

use super::{check_device_array, check_head_dims, CacheDtype, Mask, MaskType, Mode};
use crate::error::{ensure, Result};
use crate::runtime::DevicePtr;

/// The validated shape of one attention call, shared by forward and backward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// q, k and v's element type (the backward's is 16-bit).
    pub dtype: CacheDtype,
    pub mode: Mode,
    pub batch: i64,
    pub nhead_q: i64,
    pub nhead_k: i64,
    pub hdim_q: i64,
    pub hdim_v: i64,
    /// Batch mode: the length of every batch; group mode: total physical rows (`seqstart_q[batch]`).
    pub seqlen_q: i64,
    pub seqlen_k: i64,
    /// Upper bounds of the per-batch physical lengths (grid sizing, workspace bounds).
    pub max_seqlen_q: i64,
    pub max_seqlen_k: i64,
    pub scale: f32,
    pub mask: Mask,
}

impl Shape {
    /// Checks the shape's internal consistency; messages name the C field.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dtype: CacheDtype,
        mode: Mode,
        batch: i64,
        (nhead_q, nhead_k): (i64, i64),
        (hdim_q, hdim_v): (i64, i64),
        (seqlen_q, seqlen_k): (i64, i64),
        (max_seqlen_q, max_seqlen_k): (i64, i64),
        scale: f32,
        mask: Mask,
    ) -> Result<Shape> {
        ensure(batch >= 1, "batch", || format!("{batch} must be at least 1"))?;
        ensure(nhead_q >= 1, "nhead_q", || format!("{nhead_q} must be at least 1"))?;
        ensure(nhead_k >= 1, "nhead_k", || format!("{nhead_k} must be at least 1"))?;
        ensure(nhead_q % nhead_k == 0, "nhead_q", || {
            format!("{nhead_q} is not a multiple of nhead_k = {nhead_k} (GQA/MQA need nhead_q % nhead_k == 0)")
        })?;
        check_head_dims(hdim_q, hdim_v)?;
        for (name, s) in [
            ("seqlen_q", seqlen_q),
            ("seqlen_k", seqlen_k),
            ("max_seqlen_q", max_seqlen_q),
            ("max_seqlen_k", max_seqlen_k),
        ] {
            ensure(s >= 0, name, || format!("{s} is negative"))?;
        }
        if mode == Mode::Batch {
            ensure(max_seqlen_q == seqlen_q || max_seqlen_q == 0, "max_seqlen_q", || {
                format!("{max_seqlen_q} differs from seqlen_q = {seqlen_q} in batch mode (pass 0 or seqlen_q)")
            })?;
            ensure(max_seqlen_k == seqlen_k || max_seqlen_k == 0, "max_seqlen_k", || {
                format!("{max_seqlen_k} differs from seqlen_k = {seqlen_k} in batch mode (pass 0 or seqlen_k)")
            })?;
        }
        // Group mode: max_seqlen_* bound the per-batch physical lengths, which the kernels check as
        // they read the seqstarts; a bound above the total (a configured maximum) is fine.
        ensure(scale.is_finite() && scale >= 0.0, "scale", || {
            format!("{scale} must be finite and non-negative (0 selects 1/sqrt(hdim_q))")
        })?;
        mask.validate()?;
        let scale = if scale == 0.0 { 1.0 / (hdim_q as f32).sqrt() } else { scale };
        // Group mode: no batch is longer than all rows together, so a larger bound (a configured maximum)
        // is clamped to the total: the grids and loops sized by it stay as large as the data.
        let (max_seqlen_q, max_seqlen_k) = match mode {
            Mode::Batch => (seqlen_q, seqlen_k),
            Mode::Group => (max_seqlen_q.min(seqlen_q), max_seqlen_k.min(seqlen_k)),
        };
        Ok(Shape {
            dtype,
            mode,
            batch,
            nhead_q,
            nhead_k,
            hdim_q,
            hdim_v,
            seqlen_q,
            seqlen_k,
            max_seqlen_q,
            max_seqlen_k,
            scale,
            mask,
        })
    }

    /// Query heads per key/value head.
    pub fn group_size(&self) -> i64 {
        self.nhead_q / self.nhead_k
    }

    pub fn masked(&self) -> bool {
        self.mask.kind != MaskType::None
    }

    /// Rows of the q-side tensors (q, o, do, dq, lse) per head that the tensors must hold.
    pub fn q_rows(&self) -> i64 {
        self.seqlen_q
    }

    pub fn k_rows(&self) -> i64 {
        self.seqlen_k
    }
}

/// The device arrays of a call: in group (varlen) mode `seqstart_q/k` (`[batch + 1]` physical row
/// offsets) and optional logical lengths `seqlen_q/k` (`[batch]`, the C fields `seqlen_q_ptr/k_ptr`);
/// in batch mode all null.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceArrays {
    pub seqstart_q: DevicePtr<i32>,
    pub seqstart_k: DevicePtr<i32>,
    pub seqlen_q: DevicePtr<i32>,
    pub seqlen_k: DevicePtr<i32>,
}

impl SequenceArrays {
    /// Checks the arrays against the mode: group mode needs `seqstart_q/k` and may pass logical lengths;
    /// batch mode must not pass any of them (they would be silently ignored otherwise). Each array is
    /// checked as a device array of int32.
    pub fn check(&self, shape: &Shape) -> Result<()> {
        let arrays = [
            ("seqstart_q", self.seqstart_q),
            ("seqstart_k", self.seqstart_k),
            ("seqlen_q_ptr", self.seqlen_q),
            ("seqlen_k_ptr", self.seqlen_k),
        ];
        match shape.mode {
            Mode::Group => {
                for (name, ptr) in &arrays[..2] {
                    ensure(!ptr.is_null(), name, || "must not be null in group mode".into())?;
                }
                let batch = shape.batch as usize;
                for (i, (name, ptr)) in arrays.into_iter().enumerate() {
                    check_device_array(ptr, if i < 2 { batch + 1 } else { batch }, name)?;
                }
            }
            Mode::Batch => {
                for (name, ptr) in arrays {
                    ensure(ptr.is_null(), name, || "must be null in batch mode (set is_group_mode for varlen)".into())?;
                }
            }
        }
        Ok(())
    }
}
