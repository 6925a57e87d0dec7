//! Per-batch row ranges, read the way the GPU kernels read them: from the `seqstart` (physical
//! offsets) and optional logical-length arrays in device memory, at execution time.

use crate::error::{ensure, Result};
use crate::problem::{Mode, SequenceArrays, Shape};
use crate::runtime::host::DeviceSlice;
use crate::runtime::DevicePtr;

/// Where each batch's rows are and how many of them attend.
#[derive(Debug, Clone, Copy)]
pub struct Sequences {
    mode: Mode,
    seqlen_q: i64,
    seqlen_k: i64,
    max_seqlen_q: i64,
    max_seqlen_k: i64,
    seqstart_q: Option<DeviceSlice<i32>>,
    seqstart_k: Option<DeviceSlice<i32>>,
    logical_q: Option<DeviceSlice<i32>>,
    logical_k: Option<DeviceSlice<i32>>,
}

/// One batch: physical first rows and logical lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRows {
    /// Physical row of the batch's first q/k row (0 in batch mode: the batch stride places it).
    pub q_start: i64,
    pub k_start: i64,
    /// Rows that attend (logical lengths).
    pub sq: i64,
    pub sk: i64,
    /// Rows the batch occupies in memory (physical lengths, ≥ logical).
    pub sq_physical: i64,
    pub sk_physical: i64,
}

impl Sequences {
    /// The device arrays: `seqstart_*` (`[batch + 1]`, group mode only) and optional logical lengths
    /// `seqlen_*_ptr` (`[batch]`). Every batch is checked here, once per kernel: a stage whose grid has
    /// no block (a maximum of 0) must still report a batch that is longer.
    pub fn new(shape: &Shape, arrays: &SequenceArrays) -> Result<Self> {
        let b = shape.batch as usize;
        let optional = |ptr: DevicePtr<i32>, len: usize, field: &str| -> Result<Option<DeviceSlice<i32>>> {
            if ptr.is_null() {
                Ok(None)
            } else {
                DeviceSlice::new(ptr, len, field).map(Some)
            }
        };
        let sequences = Sequences {
            mode: shape.mode,
            seqlen_q: shape.seqlen_q,
            seqlen_k: shape.seqlen_k,
            max_seqlen_q: shape.max_seqlen_q,
            max_seqlen_k: shape.max_seqlen_k,
            seqstart_q: optional(arrays.seqstart_q, b + 1, "seqstart_q")?,
            seqstart_k: optional(arrays.seqstart_k, b + 1, "seqstart_k")?,
            logical_q: optional(arrays.seqlen_q, b, "seqlen_q_ptr")?,
            logical_k: optional(arrays.seqlen_k, b, "seqlen_k_ptr")?,
        };
        if sequences.seqstart_q.is_some() {
            for batch in 0..b {
                sequences.rows(batch)?;
            }
        }
        Ok(sequences)
    }

    /// Rows of batch `b`, checked against the shape (a bad device array is an error of the kernel,
    /// reported by the stream, never an out-of-bounds access).
    pub fn rows(&self, b: usize) -> Result<BatchRows> {
        let (Some(starts_q), Some(starts_k)) = (self.seqstart_q, self.seqstart_k) else {
            return Ok(BatchRows {
                q_start: 0,
                k_start: 0,
                sq: self.seqlen_q,
                sk: self.seqlen_k,
                sq_physical: self.seqlen_q,
                sk_physical: self.seqlen_k,
            });
        };
        let side = |starts: DeviceSlice<i32>, logical: Option<DeviceSlice<i32>>, total: i64, max: i64, q: bool| {
            let (name, len_name, max_name) = if q {
                ("seqstart_q", "seqlen_q_ptr", "max_seqlen_q")
            } else {
                ("seqstart_k", "seqlen_k_ptr", "max_seqlen_k")
            };
            let (start, end) = (i64::from(starts.get(b)), i64::from(starts.get(b + 1)));
            ensure(start >= 0 && start <= end && end <= total, name, || {
                format!("entries {b}..{} are {start}, {end}: not monotone within 0..={total}", b + 1)
            })?;
            ensure(end - start <= max, max_name, || {
                format!("{max} is smaller than the length {} of batch {b}", end - start)
            })?;
            let physical = end - start;
            let attending = match logical {
                Some(l) => i64::from(l.get(b)),
                None => physical,
            };
            ensure((0..=physical).contains(&attending), len_name, || {
                format!("entry {b} is {attending}, outside 0..={physical} (the batch's physical length)")
            })?;
            Ok::<_, crate::error::Error>((start, attending, physical))
        };
        let (q_start, sq, sq_physical) = side(starts_q, self.logical_q, self.seqlen_q, self.max_seqlen_q, true)?;
        let (k_start, sk, sk_physical) = side(starts_k, self.logical_k, self.seqlen_k, self.max_seqlen_k, false)?;
        Ok(BatchRows { q_start, k_start, sq, sk, sq_physical, sk_physical })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }
}
