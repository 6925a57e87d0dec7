//! The forward dispatch key.

use crate::error::{Error, Result};
use crate::mask::MaskType;
use crate::problem::{Dtype, Mode};

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

/// What selects the forward kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FwdTraits {
    pub dtype: Dtype,
    pub hdim_q: i64,
    pub hdim_v: i64,
    pub mode: Mode,
    pub mask_type: MaskType,
    pub bias_type: BiasType,
    pub has_dropout: bool,
}
