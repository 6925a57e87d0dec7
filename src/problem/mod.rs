//! The attention problem, shared by every operation: element types, modes, the ABI's named-but-
//! unsupported features, strided tensors and their memory checks, the validated shape and masks.
//! Operations validate their arguments with these; none imports another operation.

pub mod fp8;
pub mod mask;
pub mod merge;
pub mod operands;
pub mod overlap;
pub mod paged;
pub mod scale;
pub mod shape;
pub mod split;
pub mod tensor;

pub use fp8::Fp8Format;
pub use mask::{Mask, MaskType, ResolvedMask};
pub use operands::{check_memory_overlap, Operand};
pub use shape::{SequenceArrays, Shape};
pub use tensor::{check_device_array, check_lse_layout, Tensor};

use crate::abi_values::{
    abi_enum, FMHA_BIAS_ALIBI, FMHA_BIAS_ELEMENTWISE, FMHA_BIAS_NONE, FMHA_DTYPE_BF16, FMHA_DTYPE_FP16,
    FMHA_DTYPE_FP32, FMHA_DTYPE_FP8_E4M3FN, FMHA_DTYPE_FP8_E4M3FNUZ,
};
use crate::error::{ensure, Error, Result};

abi_enum! {
    /// Input element type (`FMHA_DTYPE_*`).
    pub enum Dtype {
        F16 = FMHA_DTYPE_FP16 => "fp16",
        Bf16 = FMHA_DTYPE_BF16 => "bf16",
    }
}

impl Dtype {
    pub fn from_i32(value: i32, field: &str) -> Result<Dtype> {
        Dtype::parse(value)
            .ok_or_else(|| Error::invalid(field, format!("{value} is not a dtype ({})", Dtype::choices())))
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

/// The element type of q, k and v in a kv-cache call: fp16/bf16, or fp8 of a named format (then the
/// output is bf16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheDtype {
    Half(Dtype),
    Fp8(Fp8Format),
}

impl CacheDtype {
    pub fn from_i32(value: i32, field: &str) -> Result<CacheDtype> {
        match value {
            FMHA_DTYPE_FP8_E4M3FN => Ok(CacheDtype::Fp8(Fp8Format::E4m3fn)),
            FMHA_DTYPE_FP8_E4M3FNUZ => Ok(CacheDtype::Fp8(Fp8Format::E4m3fnuz)),
            FMHA_DTYPE_FP32 => Err(Error::invalid(
                field,
                "2 (fp32) is not an input type: q, k and v are fp16, bf16, fp8 e4m3fn or fp8 e4m3fnuz",
            )),
            _ => Dtype::parse(value).map(CacheDtype::Half).ok_or_else(|| {
                Error::invalid(field, format!("{value} is not a dtype (fp16, bf16, fp8 e4m3fn, fp8 e4m3fnuz)"))
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CacheDtype::Half(dtype) => dtype.name(),
            CacheDtype::Fp8(Fp8Format::E4m3fn) => "fp8_e4m3fn",
            CacheDtype::Fp8(Fp8Format::E4m3fnuz) => "fp8_e4m3fnuz",
        }
    }

    /// Its `FMHA_DTYPE_*` value.
    pub fn abi_value(self) -> i32 {
        match self {
            CacheDtype::Half(dtype) => dtype as i32,
            CacheDtype::Fp8(Fp8Format::E4m3fn) => FMHA_DTYPE_FP8_E4M3FN,
            CacheDtype::Fp8(Fp8Format::E4m3fnuz) => FMHA_DTYPE_FP8_E4M3FNUZ,
        }
    }

    /// Bytes per element of q, k and v.
    pub fn bytes(self) -> usize {
        match self {
            CacheDtype::Half(_) => 2,
            CacheDtype::Fp8(_) => 1,
        }
    }
}

impl From<Dtype> for CacheDtype {
    fn from(dtype: Dtype) -> CacheDtype {
        CacheDtype::Half(dtype)
    }
}

/// An element as the host kernels read and write it: converted to f32 exactly, from f32 rounding to
/// nearest (ties to even).
pub trait Scalar: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
    /// P (a probability in [0, 1]) as the kernels hand it to the P·V product for inputs of this type.
    fn round_probability(p: f32) -> f32 {
        Self::from_f32(p).to_f32()
    }
}

/// fp32 states and outputs of the merge: exact both ways.
impl Scalar for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

/// A 16-bit input element of the dense operations.
pub trait Element: Scalar {
    const DTYPE: Dtype;
}

impl Scalar for half::f16 {
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

impl Element for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
}

impl Scalar for half::bf16 {
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}

impl Element for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
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

abi_enum! {
    /// Attention bias kinds (`FMHA_BIAS_*`). Named so callers can ask; no kernel supports them yet, and
    /// asking answers "unsupported".
    pub enum BiasType {
        None = FMHA_BIAS_NONE => "none",
        Elementwise = FMHA_BIAS_ELEMENTWISE => "elementwise",
        Alibi = FMHA_BIAS_ALIBI => "alibi",
    }
}

impl BiasType {
    pub fn from_i32(value: i32) -> Result<BiasType> {
        BiasType::parse(value)
            .ok_or_else(|| Error::invalid("bias_type", format!("{value} is not a bias type ({})", BiasType::choices())))
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

/// Checks that both head dims lie in `1..=MAX_HEAD_DIM` (the forward's and the kv cache's traits, and
/// every shape); errors name `hdim_q` or `hdim_v`.
pub fn check_head_dims(hdim_q: i64, hdim_v: i64) -> Result<()> {
    for (field, d) in [("hdim_q", hdim_q), ("hdim_v", hdim_v)] {
        ensure((1..=MAX_HEAD_DIM).contains(&d), field, || format!("{d} is outside 1..={MAX_HEAD_DIM}"))?;
    }
    Ok(())
}
