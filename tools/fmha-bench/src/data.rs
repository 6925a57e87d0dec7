//! Inputs: random values in [-1, 1) encoded in the case's dtype, kept on the host as encoded bytes
//! (the reference decodes what it samples, so big shapes cost no float64 copies).

use crate::matrix::DtypeName;
use fmha::problem::Fp8Format;
use fmha::test_rng::Rng;

/// Encoded elements of one dtype.
pub struct Encoded {
    pub dtype: DtypeName,
    pub bytes: Vec<u8>,
}

impl DtypeName {
    pub fn fp8_format(self) -> Option<Fp8Format> {
        match self {
            DtypeName::Fp8 => Some(Fp8Format::E4m3fn),
            DtypeName::Fp8fnuz => Some(Fp8Format::E4m3fnuz),
            _ => None,
        }
    }

    /// The ABI's `FMHA_DTYPE_*`.
    pub fn abi(self) -> i32 {
        use fmha::ffi::attention::*;
        match self {
            DtypeName::Fp16 => FMHA_DTYPE_FP16,
            DtypeName::Bf16 => FMHA_DTYPE_BF16,
            DtypeName::Fp8 => FMHA_DTYPE_FP8_E4M3FN,
            DtypeName::Fp8fnuz => FMHA_DTYPE_FP8_E4M3FNUZ,
        }
    }

    /// The output's dtype: the input's, bf16 for fp8 inputs.
    pub fn output(self) -> DtypeName {
        if self.is_fp8() {
            DtypeName::Bf16
        } else {
            self
        }
    }
}

impl Encoded {
    pub fn random(dtype: DtypeName, count: usize, rng: &mut Rng) -> Encoded {
        let mut bytes = Vec::with_capacity(count * dtype.bytes());
        for _ in 0..count {
            let x = rng.unit();
            match (dtype, dtype.fp8_format()) {
                (_, Some(format)) => bytes.push(format.encode(x as f32)),
                (DtypeName::Fp16, _) => bytes.extend(half::f16::from_f64(x).to_le_bytes()),
                _ => bytes.extend(half::bf16::from_f64(x).to_le_bytes()),
            }
        }
        Encoded { dtype, bytes }
    }

    pub fn get(&self, index: usize) -> f64 {
        decode(self.dtype, &self.bytes, index)
    }
}

/// Element `index` of encoded `bytes`.
pub fn decode(dtype: DtypeName, bytes: &[u8], index: usize) -> f64 {
    match (dtype, dtype.fp8_format()) {
        (_, Some(format)) => f64::from(format.decode(bytes[index])),
        (DtypeName::Fp16, _) => half::f16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]).to_f64(),
        _ => half::bf16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]]).to_f64(),
    }
}

/// Element `index` of little-endian fp32 `bytes` (the LSE a call wrote).
pub fn f32_at(bytes: &[u8], index: usize) -> f64 {
    f64::from(f32::from_le_bytes(bytes[4 * index..4 * index + 4].try_into().unwrap()))
}

/// Rows `[token][head][dim]` of a (possibly varlen) tensor: the element of (sequence b, head h, row i,
/// column d) for sequences starting at `starts[b]` tokens.
#[derive(Clone, Copy)]
pub struct TokenMajor {
    pub heads: usize,
    pub dim: usize,
}

impl TokenMajor {
    pub fn index(self, token: usize, head: usize, d: usize) -> usize {
        (token * self.heads + head) * self.dim + d
    }

    /// `[head][row][dim]` of one sequence's `rows` tokens starting at `start`, decoded (the
    /// reference's layout).
    pub fn gather(self, t: &Encoded, start: usize, rows: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.heads * rows * self.dim);
        for h in 0..self.heads {
            for i in 0..rows {
                for d in 0..self.dim {
                    out.push(t.get(self.index(start + i, h, d)));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_values_decode_to_their_rounding() {
        let mut rng = Rng(7);
        for dtype in [DtypeName::Fp16, DtypeName::Bf16, DtypeName::Fp8, DtypeName::Fp8fnuz] {
            let t = Encoded::random(dtype, 100, &mut rng);
            assert_eq!(t.bytes.len(), 100 * dtype.bytes());
            for i in 0..100 {
                let x = t.get(i);
                assert!((-1.0..=1.0).contains(&x), "{dtype:?} {x}");
            }
            assert!((0..100).map(|i| t.get(i)).any(|x| x != 0.0));
        }
    }

    #[test]
    fn gather_orders_heads_then_rows() {
        let layout = TokenMajor { heads: 2, dim: 1 };
        let t = Encoded {
            dtype: DtypeName::Fp16,
            bytes: [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0]
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
        };
        // tokens 1..3: (token 1: h0 = 2, h1 = 3), (token 2: h0 = 4, h1 = 5)
        assert_eq!(layout.gather(&t, 1, 2), vec![2.0, 4.0, 3.0, 5.0]);
    }
}
