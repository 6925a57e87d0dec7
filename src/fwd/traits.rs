//! The forward dispatch key.

use crate::error::Result;
use crate::problem::mask::MaskType;
use crate::problem::{check_head_dims, require_no_dropout, BiasType, CacheDtype, Mode};

/// What selects the forward kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FwdTraits {
    /// q, k and v's type; fp8 inputs write bf16 (the FFI checked `o_dtype`).
    pub dtype: CacheDtype,
    pub hdim_q: i64,
    pub hdim_v: i64,
    pub mode: Mode,
    pub mask_type: MaskType,
    pub bias_type: BiasType,
    pub has_dropout: bool,
}

impl FwdTraits {
    /// What the forward checks of the traits alone, before any argument (the FFI checked the enum
    /// values and flags): no bias, no dropout, head dims in range.
    pub fn validate(&self) -> Result<()> {
        self.bias_type.require_none()?;
        require_no_dropout(self.has_dropout)?;
        check_head_dims(self.hdim_q, self.hdim_v)
    }
}
