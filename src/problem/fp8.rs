//! The two fp8 e4m3 encodings the ABI names (`FMHA_DTYPE_FP8_E4M3FN`, `FMHA_DTYPE_FP8_E4M3FNUZ`):
//! OCP E4M3FN (NVIDIA sm_90, AMD gfx950) and E4M3FNUZ (AMD gfx942). The same byte means different
//! values in the two (FNUZ has bias 8, one zero and one NaN, `0x80`), so a tensor's format is always
//! named, never inferred. Decoding is exact; encoding rounds to nearest, ties to even, and saturates to
//! ±max as CK's fp8 outputs do.

use microfloat::{f8e4m3fn, f8e4m3fnuz};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    /// OCP E4M3FN: bias 7, max 448, NaN `0x7F`/`0xFF`, ±0.
    E4m3fn,
    /// E4M3FNUZ: bias 8, max 240, NaN `0x80` only, one zero.
    E4m3fnuz,
}

impl Fp8Format {
    /// The largest finite value.
    pub fn max(self) -> f32 {
        match self {
            Fp8Format::E4m3fn => 448.0,
            Fp8Format::E4m3fnuz => 240.0,
        }
    }

    /// The value of a code (NaN for the NaN codes).
    pub fn decode(self, code: u8) -> f32 {
        match self {
            Fp8Format::E4m3fn => f8e4m3fn::from_bits(code).to_f32(),
            Fp8Format::E4m3fnuz => f8e4m3fnuz::from_bits(code).to_f32(),
        }
    }

    /// The nearest code (ties to even), saturating at ±max; NaN stays NaN.
    pub fn encode(self, x: f32) -> u8 {
        // The formats have no infinity: clamping first makes the conversion saturate instead of
        // producing NaN, and no value inside ±max rounds past it.
        let x = if x.is_nan() { x } else { x.clamp(-self.max(), self.max()) };
        match self {
            Fp8Format::E4m3fn => f8e4m3fn::from_f32(x).to_bits(),
            Fp8Format::E4m3fnuz => f8e4m3fnuz::from_f32(x).to_bits(),
        }
    }

    /// Rounds an f32 to this format and back.
    pub fn round(self, x: f32) -> f32 {
        self.decode(self.encode(x))
    }

    /// The power of two a probability in [0, 1] is multiplied by before it is rounded to this format
    /// for the P·V product (FA3's and CK's shift of the row max): 2^8 = 256 fits OCP's 448; FNUZ's
    /// 240 takes 2^7. The product is divided by it again, exactly.
    pub fn probability_scale(self) -> f32 {
        match self {
            Fp8Format::E4m3fn => 256.0,
            Fp8Format::E4m3fnuz => 128.0,
        }
    }

    /// P rounded as the kernels round it before the P·V product.
    pub fn round_probability(self, p: f32) -> f32 {
        let s = self.probability_scale();
        self.round(p * s) / s
    }
}

/// fp8 element types of the host kernels: a code of one format.
macro_rules! fp8_element {
    ($name:ident, $format:expr) => {
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[repr(transparent)]
        pub struct $name(pub u8);

        impl crate::problem::Scalar for $name {
            fn to_f32(self) -> f32 {
                $format.decode(self.0)
            }
            fn from_f32(x: f32) -> Self {
                $name($format.encode(x))
            }
            fn round_probability(p: f32) -> f32 {
                $format.round_probability(p)
            }
        }
    };
}

fp8_element!(E4m3fn, Fp8Format::E4m3fn);
fp8_element!(E4m3fnuz, Fp8Format::E4m3fnuz);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code against the format's definition (spec §2.1), computed here from the bit fields.
    #[test]
    fn every_code_decodes_to_its_definition() {
        for format in [Fp8Format::E4m3fn, Fp8Format::E4m3fnuz] {
            let bias = if format == Fp8Format::E4m3fn { 7 } else { 8 };
            for code in 0..=255u8 {
                let (sign, exponent, mantissa) = (code >> 7, i32::from((code >> 3) & 0xF), f64::from(code & 7));
                let magnitude = if exponent == 0 {
                    mantissa / 8.0 * 2f64.powi(1 - bias)
                } else {
                    (1.0 + mantissa / 8.0) * 2f64.powi(exponent - bias)
                };
                let nan = match format {
                    Fp8Format::E4m3fn => code & 0x7F == 0x7F,
                    Fp8Format::E4m3fnuz => code == 0x80,
                };
                let got = format.decode(code);
                if nan {
                    assert!(got.is_nan(), "{format:?} {code:#04x}");
                } else {
                    let expected = if sign == 1 { -magnitude } else { magnitude };
                    assert_eq!(f64::from(got), expected, "{format:?} {code:#04x}");
                    assert_eq!(got.is_sign_negative(), sign == 1, "{format:?} {code:#04x}: sign of zero");
                }
            }
        }
        assert_eq!(Fp8Format::E4m3fn.decode(0x7E), 448.0);
        assert_eq!(Fp8Format::E4m3fnuz.decode(0x7F), 240.0);
        assert_eq!(Fp8Format::E4m3fnuz.decode(0x01), 2f32.powi(-10));
        assert_eq!(Fp8Format::E4m3fn.decode(0x01), 2f32.powi(-9));
    }

    /// Encoding: every finite code round-trips; midpoints between neighbours go to the even code; values
    /// past max (infinity included) saturate; NaN stays NaN.
    #[test]
    fn encoding_rounds_to_nearest_even_and_saturates() {
        for format in [Fp8Format::E4m3fn, Fp8Format::E4m3fnuz] {
            let mut finite: Vec<(f32, u8)> = (0..=255u8)
                .map(|c| (format.decode(c), c))
                .filter(|(v, c)| !(v.is_nan() || *v == 0.0 && *c != 0)) // one code per value
                .collect();
            finite.sort_by(|a, b| a.0.total_cmp(&b.0));
            for &(value, code) in &finite {
                assert_eq!(format.encode(value), code, "{format:?} {value}");
            }
            for pair in finite.windows(2) {
                let ((lo, lo_code), (hi, hi_code)) = (pair[0], pair[1]);
                let mid = (lo + hi) / 2.0; // exact: both have at most 4 significant bits
                let even = if lo_code & 1 == 0 { lo_code } else { hi_code };
                let got = format.encode(mid);
                // The midpoint between -min_subnormal and +0 rounds to a zero of either sign.
                if lo != 0.0 && hi != 0.0 || format.decode(got) != 0.0 {
                    assert_eq!(got, even, "{format:?} midpoint of {lo} and {hi}");
                }
                assert_eq!(format.round(mid.next_down()), lo, "{format:?} below {mid}");
                assert_eq!(format.round(mid.next_up()), hi, "{format:?} above {mid}");
            }
            let max = format.max();
            for x in [max * 1.01, max * 4.0, f32::MAX, f32::INFINITY] {
                assert_eq!(format.round(x), max, "{format:?} {x}");
                assert_eq!(format.round(-x), -max, "{format:?} {}", -x);
            }
            assert!(format.round(f32::NAN).is_nan());
        }
    }
}
