//! The forward dispatch key.

use crate::problem::mask::MaskType;
use crate::problem::{BiasType, Dtype, Mode};

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
