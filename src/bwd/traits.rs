//! The backward dispatch key: what the launcher is created with. It fixes the problem shape the
//! workspace is sized for; `run` refuses args that disagree with it.

use super::dq_scheme::DqScheme;
use crate::error::{Error, Result};
use crate::problem::mask::{Mask, MaskType};
use crate::problem::{require_no_dropout, BiasType, Dtype, Mode, Shape};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BwdTraits {
    pub dtype: Dtype,
    pub mode: Mode,
    pub mask_type: MaskType,
    pub bias_type: BiasType,
    pub has_dbias: bool,
    pub has_dropout: bool,
    pub is_store_randval: bool,
    pub deterministic: bool,
    /// Deterministic mode's dQ scheme (ignored otherwise).
    pub dq_scheme: DqScheme,
    pub batch: i64,
    /// Batch mode: per-batch lengths; group mode: total physical rows.
    pub seqlen_q: i64,
    pub seqlen_k: i64,
    pub max_seqlen_q: i64,
    pub max_seqlen_k: i64,
    pub nhead_q: i64,
    pub nhead_k: i64,
    pub hdim_q: i64,
    pub hdim_v: i64,
}

impl BwdTraits {
    /// Checks everything the traits alone determine and refuses the named-but-unsupported features.
    pub fn validate(&self) -> Result<Shape> {
        self.bias_type.require_none()?;
        if self.has_dbias {
            return Err(Error::unsupported(
                "has_dbias: bias gradients are not supported yet (needs an elementwise bias)",
            ));
        }
        require_no_dropout(self.has_dropout)?;
        if self.is_store_randval {
            return Err(Error::unsupported("is_store_randval: dropout random values are not supported yet"));
        }
        let mask = if self.mask_type == MaskType::None { Mask::NONE } else { Mask::causal(self.mask_type) };
        self.shape(mask)
    }

    /// The shape with the window of a particular call.
    pub fn shape(&self, mask: Mask) -> Result<Shape> {
        Shape::new(
            self.dtype.into(),
            self.mode,
            self.batch,
            (self.nhead_q, self.nhead_k),
            (self.hdim_q, self.hdim_v),
            (self.seqlen_q, self.seqlen_k),
            (self.max_seqlen_q, self.max_seqlen_k),
            0.0,
            mask,
        )
    }
}
