//! The attention problem shared by the forward and backward operations: element types, strided
//! tensors, and the validated shape (mode, lengths, heads, head dims, scale, mask).

use crate::error::{ensure, Error, Result};
use crate::mask::{Mask, MaskType};

/// Input element type (`fmha_dtype`; values are ABI).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    F16 = 0,
    Bf16 = 1,
}

impl Dtype {
    pub fn from_i32(value: i32, field: &str) -> Result<Dtype> {
        match value {
            0 => Ok(Dtype::F16),
            1 => Ok(Dtype::Bf16),
            _ => Err(Error::invalid(field, format!("{value} is not a dtype (0 = fp16, 1 = bf16)"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "fp16",
            Dtype::Bf16 => "bf16",
        }
    }
    /// Rounds to the nearest value of this type (ties to even), in f64.
    pub fn round_f64(self, x: f64) -> f64 {
        match self {
            Dtype::F16 => half::f16::from_f64(x).to_f64(),
            Dtype::Bf16 => half::bf16::from_f64(x).to_f64(),
        }
    }
    /// Rounds an f32 value to this type and back (what a kernel does before a low-precision GEMM).
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F16 => half::f16::from_f32(x).to_f32(),
            Dtype::Bf16 => half::bf16::from_f32(x).to_f32(),
        }
    }
}

/// A 16-bit input element as the host kernels read and write it.
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: Dtype;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Element for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

impl Element for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}

/// Batch mode (equal lengths, batch stride) or group mode (varlen, `seqstart` offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Batch,
    Group,
}

impl Mode {
    pub fn from_flag(group: i32, field: &str) -> Result<Mode> {
        match group {
            0 => Ok(Mode::Batch),
            1 => Ok(Mode::Group),
            _ => Err(Error::invalid(field, format!("{group} is not 0 (batch mode) or 1 (group mode)"))),
        }
    }
}

/// Largest head dimension any instance supports.
pub const MAX_HEAD_DIM: i64 = 256;

/// A strided tensor in device memory, indexed `[batch][head][row][column]`, columns contiguous.
/// Strides are in elements. In group mode the batch stride is unused: batch `b` starts at row
/// `seqstart[b]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tensor {
    pub ptr: usize,
    pub batch_stride: i64,
    pub head_stride: i64,
    pub row_stride: i64,
}

impl Tensor {
    /// Number of elements from the base to one past the last element the tensor covers for the
    /// given extents (0 when any extent is 0). Strides must be non-negative.
    pub fn extent(&self, field: &str, mode: Mode, batch: i64, heads: i64, rows: i64, columns: i64) -> Result<usize> {
        for (name, stride) in
            [("batch_stride", self.batch_stride), ("head_stride", self.head_stride), ("row_stride", self.row_stride)]
        {
            ensure(stride >= 0, &format!("{field}.{name}"), || format!("{stride} is negative"))?;
        }
        if batch == 0 || heads == 0 || rows == 0 || columns == 0 {
            return Ok(0);
        }
        if self.ptr == 0 {
            return Err(Error::null(&format!("{field}.data")));
        }
        let batch_span = if mode == Mode::Batch { (batch - 1).checked_mul(self.batch_stride) } else { Some(0) };
        let last = batch_span
            .and_then(|b| (heads - 1).checked_mul(self.head_stride).and_then(|h| h.checked_add(b)))
            .and_then(|x| (rows - 1).checked_mul(self.row_stride).and_then(|r| r.checked_add(x)))
            .and_then(|x| x.checked_add(columns));
        last.and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| Error::invalid(field, "the strides and shape overflow the address space"))
    }

    /// Element offset of `(batch, head, row)`, where in group mode `row` is the physical row.
    pub fn offset(&self, mode: Mode, batch: i64, head: i64, row: i64) -> usize {
        let batch_part = if mode == Mode::Batch { batch * self.batch_stride } else { 0 };
        (batch_part + head * self.head_stride + row * self.row_stride) as usize
    }
}

/// The validated shape of one attention call, shared by forward and backward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    pub dtype: Dtype,
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
        dtype: Dtype,
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
        for (name, d) in [("hdim_q", hdim_q), ("hdim_v", hdim_v)] {
            ensure((1..=MAX_HEAD_DIM).contains(&d), name, || format!("{d} is outside 1..={MAX_HEAD_DIM}"))?;
        }
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
        let (max_seqlen_q, max_seqlen_k) = match mode {
            Mode::Batch => (seqlen_q, seqlen_k),
            Mode::Group => (max_seqlen_q, max_seqlen_k),
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
