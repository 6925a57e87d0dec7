//! The forward dispatch key.

use crate::problem::mask::MaskType;
use crate::problem::{BiasType, CacheDtype, Mode};

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
