//! Merging attention states (spec/inference.md §3.1, §3.5): states `(O_c, LSE_c)` of one row, each O
//! normalised over its own keys, become the state over all their keys. In f32, in state order:
//! `M = max LSE_c`, `w_c = exp(LSE_c − M)`, `O = Σ (w_c / W)·O_c`, `LSE = M + ln W`. An LSE of −inf or
//! +inf (the field's fill for an empty call) is an empty state of weight 0; no state left gives O = 0,
//! LSE = −inf; a NaN LSE makes the row NaN. The C++ twin is `hip/common/merge_states.h`.
//!
//! The standalone merge (`fmha_merge_attention_states`) also reads and writes base-2 LSEs
//! (flashinfer's): [`LseBase`] converts them to and from the natural log at load and store, so the rule
//! itself stays one.

use crate::abi_values::{
    abi_enum, FMHA_DTYPE_BF16, FMHA_DTYPE_FP16, FMHA_DTYPE_FP32, FMHA_LSE_BASE2, FMHA_LSE_NATURAL,
};
use crate::error::{Error, Result};

abi_enum! {
    /// The element type of merged states and of the merged output (`FMHA_DTYPE_*`).
    pub enum StateDtype {
        F16 = FMHA_DTYPE_FP16 => "fp16",
        Bf16 = FMHA_DTYPE_BF16 => "bf16",
        F32 = FMHA_DTYPE_FP32 => "fp32",
    }
}

impl StateDtype {
    pub fn from_i32(value: i32, field: &str) -> Result<StateDtype> {
        StateDtype::parse(value)
            .ok_or_else(|| Error::invalid(field, format!("{value} is not a dtype ({})", StateDtype::choices())))
    }

    pub fn bytes(self) -> usize {
        match self {
            StateDtype::F16 | StateDtype::Bf16 => 2,
            StateDtype::F32 => 4,
        }
    }
}

abi_enum! {
    /// The base of the logarithm in an LSE (`FMHA_LSE_*`).
    pub enum LseBase {
        Natural = FMHA_LSE_NATURAL => "natural",
        Base2 = FMHA_LSE_BASE2 => "base2",
    }
}

impl LseBase {
    pub fn from_i32(value: i32, field: &str) -> Result<LseBase> {
        LseBase::parse(value)
            .ok_or_else(|| Error::invalid(field, format!("{value} is not an LSE base ({})", LseBase::choices())))
    }

    /// A stored LSE in the natural log (±inf and NaN stay what they are).
    pub fn to_natural(self, lse: f32) -> f32 {
        match self {
            LseBase::Natural => lse,
            LseBase::Base2 => lse * std::f32::consts::LN_2,
        }
    }

    /// A natural-log LSE as stored in this base.
    pub fn from_natural(self, lse: f32) -> f32 {
        match self {
            LseBase::Natural => lse,
            LseBase::Base2 => lse * std::f32::consts::LOG2_E,
        }
    }
}

/// The weights of one row's states: `weight(lse_c)` multiplies `O_c`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MergeScale {
    max: f32,
    inverse: f32,
    /// The merged row's natural-log LSE.
    pub lse: f32,
}

impl MergeScale {
    /// The scale of the states whose LSEs `lses` yields, in state order.
    pub fn of(lses: impl Iterator<Item = f32> + Clone) -> MergeScale {
        let mut max = f32::NEG_INFINITY;
        for x in lses.clone() {
            if x.is_nan() {
                return MergeScale { max: f32::NAN, inverse: f32::NAN, lse: f32::NAN };
            }
            if x.is_finite() {
                max = max.max(x);
            }
        }
        if max == f32::NEG_INFINITY {
            return MergeScale { max, inverse: 0.0, lse: f32::NEG_INFINITY };
        }
        let sum: f32 = lses.filter(|x| x.is_finite()).map(|x| (x - max).exp()).sum();
        MergeScale { max, inverse: 1.0 / sum, lse: max + sum.ln() }
    }

    pub fn weight(&self, lse: f32) -> f32 {
        if lse.is_nan() || self.max.is_nan() {
            f32::NAN
        } else if lse.is_finite() {
            (lse - self.max).exp() * self.inverse
        } else {
            0.0
        }
    }
}

/// Merges `count` states of one row into `out`: `lse(c)` and `o(c)` (its `out.len()` values) give
/// state `c`. Returns the merged LSE.
pub fn merge_row<'a>(count: usize, lse: impl Fn(usize) -> f32, o: impl Fn(usize) -> &'a [f32], out: &mut [f32]) -> f32 {
    let scale = MergeScale::of((0..count).map(&lse));
    out.fill(0.0);
    for c in 0..count {
        let w = scale.weight(lse(c));
        if w != 0.0 || w.is_nan() {
            out.iter_mut().zip(o(c)).for_each(|(acc, &x)| *acc += w * x);
        }
    }
    scale.lse
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(lses: &[f32], os: &[f32]) -> (f32, f32) {
        let mut out = [0.0f32];
        let lse = merge_row(lses.len(), |c| lses[c], |c| &os[c..c + 1], &mut out);
        (out[0], lse)
    }

    #[test]
    fn two_halves_make_the_whole() {
        // Keys with scores 0 and ln 3 and values 1 and 5: O = (1 + 3·5) / 4 = 4, LSE = ln 4.
        let (o, lse) = merged(&[0.0, 3f32.ln()], &[1.0, 5.0]);
        assert!((o - 4.0).abs() < 1e-6 && (lse - 4f32.ln()).abs() < 1e-6, "{o} {lse}");
    }

    #[test]
    fn empty_states_weigh_nothing_and_nan_propagates() {
        assert_eq!(merged(&[f32::NEG_INFINITY, 2.0, f32::INFINITY], &[7.0, 3.0, 9.0]), (3.0, 2.0));
        assert_eq!(merged(&[f32::NEG_INFINITY, f32::INFINITY], &[7.0, 9.0]), (0.0, f32::NEG_INFINITY));
        assert_eq!(merged(&[], &[]), (0.0, f32::NEG_INFINITY));
        let (o, lse) = merged(&[1.0, f32::NAN], &[1.0, 1.0]);
        assert!(o.is_nan() && lse.is_nan());
    }
}
