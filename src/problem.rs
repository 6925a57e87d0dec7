//! The attention problem shared by the forward and backward operations: element types, strided
//! tensors, and the validated shape (mode, lengths, heads, head dims, scale, mask).

use crate::error::{ensure, Error, Result};
use crate::mask::{Mask, MaskType};
use crate::overlap::{overlap, self_overlap, Overlap, Region};

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

/// Attention bias kinds (`fmha_bias_type`; values are ABI). Named so callers can ask; no kernel
/// supports them yet, and asking answers "unsupported".
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BiasType {
    None = 0,
    Elementwise = 1,
    Alibi = 2,
}

impl BiasType {
    pub fn from_i32(value: i32) -> Result<BiasType> {
        match value {
            0 => Ok(BiasType::None),
            1 => Ok(BiasType::Elementwise),
            2 => Ok(BiasType::Alibi),
            _ => {
                Err(Error::invalid("bias_type", format!("{value} is not a bias type (0 none, 1 elementwise, 2 alibi)")))
            }
        }
    }

    /// Bias and ALiBi are named in the traits but not implemented: refuse clearly, never ignore.
    pub fn require_none(self) -> Result<()> {
        match self {
            BiasType::None => Ok(()),
            BiasType::Elementwise => {
                Err(Error::unsupported("bias_type: elementwise attention bias is not supported yet"))
            }
            BiasType::Alibi => Err(Error::unsupported("bias_type: ALiBi is not supported yet")),
        }
    }
}

/// Refuses dropout, which is named in the traits but not implemented.
pub fn require_no_dropout(has_dropout: bool) -> Result<()> {
    if has_dropout {
        Err(Error::unsupported("has_dropout: dropout is not supported yet (pass 0)"))
    } else {
        Ok(())
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
            ensure(stride >= 0, &format!("{field}.{name}"), || format!("{stride} is negative"))?;
        }
        if batch == 0 || heads == 0 || rows == 0 || columns == 0 {
            return Ok(0);
        }
        if self.ptr == 0 {
            return Err(Error::null(&format!("{field}.data")));
        }
        ensure(self.ptr % element_bytes == 0, &format!("{field}.data"), || {
            format!("{:#x} is not aligned to its {element_bytes}-byte elements", self.ptr)
        })?;
        let batch_span = if mode == Mode::Batch { (batch - 1).checked_mul(self.batch_stride) } else { Some(0) };
        let last = batch_span
            .and_then(|b| (heads - 1).checked_mul(self.head_stride).and_then(|h| h.checked_add(b)))
            .and_then(|x| (rows - 1).checked_mul(self.row_stride).and_then(|r| r.checked_add(x)))
            .and_then(|x| x.checked_add(columns));
        let elements = last.and_then(|x| usize::try_from(x).ok());
        let bytes = elements.and_then(|e| e.checked_mul(element_bytes)).filter(|&b| b <= isize::MAX as usize);
        match (elements, bytes) {
            (Some(elements), Some(bytes)) if self.ptr.checked_add(bytes).is_some() => Ok(elements),
            (Some(elements), Some(bytes)) => Err(Error::invalid(
                field,
                format!(
                    "{elements} elements ({bytes} bytes) from data = {:#x} run past the end of the address space",
                    self.ptr
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

/// Checks the sequence arrays against the mode: group mode needs `seqstart_q/k` (`[batch + 1]`) and
/// may pass logical lengths `seqlen_q/k_ptr` (`[batch]`); batch mode must not pass any of them (they
/// would be silently ignored otherwise). Each array is checked as a device array of int32.
pub fn check_sequence_arrays(
    shape: &Shape,
    seqstart_q: usize,
    seqstart_k: usize,
    lens_q: usize,
    lens_k: usize,
) -> Result<()> {
    let arrays =
        [("seqstart_q", seqstart_q), ("seqstart_k", seqstart_k), ("seqlen_q_ptr", lens_q), ("seqlen_k_ptr", lens_k)];
    match shape.mode {
        Mode::Group => {
            for (name, ptr) in &arrays[..2] {
                ensure(*ptr != 0, name, || "must not be null in group mode".into())?;
            }
            let batch = shape.batch as usize;
            for (i, (name, ptr)) in arrays.into_iter().enumerate() {
                check_device_array(ptr, if i < 2 { batch + 1 } else { batch }, 4, name)?;
            }
        }
        Mode::Batch => {
            for (name, ptr) in arrays {
                ensure(ptr == 0, name, || "must be null in batch mode (set is_group_mode for varlen)".into())?;
            }
        }
    }
    Ok(())
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

/// One memory argument of a call, for [`check_memory_overlap`]: its C field, the bytes it covers, and
/// whether the call writes it.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    pub field: &'a str,
    pub region: Region,
    pub written: bool,
}

impl<'a> Operand<'a> {
    /// The bytes `tensor` covers with the given extents; `written` for outputs.
    pub fn tensor(
        field: &'a str,
        tensor: &Tensor,
        mode: Mode,
        extents: (i64, i64, i64, i64),
        element_bytes: u64,
        written: bool,
    ) -> Result<Operand<'a>> {
        Ok(Operand { field, region: Region::of_tensor(field, tensor, mode, extents, element_bytes)?, written })
    }

    /// `bytes` contiguous bytes at `ptr` (a workspace).
    pub fn bytes(field: &'a str, ptr: usize, bytes: usize, written: bool) -> Operand<'a> {
        let one = crate::overlap::Dim::ONE;
        Operand { field, region: Region { base: ptr as u64, dims: [one; 3], run: bytes as u64 }, written }
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

/// Checks a device array argument of `count` elements of `element_bytes` bytes (seqstarts, logical
/// lengths): aligned to its elements, and its bytes inside the address space. A null `ptr` passes
/// (whether the array is required is the caller's rule).
pub fn check_device_array(ptr: usize, count: usize, element_bytes: usize, field: &str) -> Result<()> {
    if ptr == 0 {
        return Ok(());
    }
    ensure(ptr % element_bytes == 0, field, || {
        format!("{ptr:#x} is not aligned to its {element_bytes}-byte elements")
    })?;
    let end = count.checked_mul(element_bytes).and_then(|bytes| ptr.checked_add(bytes));
    ensure(end.is_some(), field, || format!("{count} elements from {ptr:#x} run past the end of the address space"))
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
