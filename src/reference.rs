//! CPU reference attention, forward and backward, independent of strides and kernels.
//!
//! Two precisions, for the field's error rule (design.md, "Correctness rules"): a kernel's max error
//! against the [`Precision::F64`] reference must stay within 2× (outputs) / 3× (gradients) the max
//! error of the *same computation done in the input precision* ([`Precision::LowPrecision`]) against
//! that reference, plus a small absolute floor.
//!
//! `LowPrecision(dtype)` follows what the kernels (and CK's host reference) do:
//! - inputs are used as given (the caller passes values representable in `dtype`);
//! - every intermediate (dot products, softmax, LSE, `D = rowsum(dO∘O)`, dP, dS, accumulators) is
//!   computed in f32: each operation's result is cast through f32, which is exactly f32 arithmetic for
//!   `+`, `-`, `×` of f32 values since f64 holds their exact result before the single rounding;
//! - P is rounded to `dtype` before `P·V` and before `dV = Pᵀ·dO`; dS is rounded to `dtype` before
//!   `dQ = dS·K` and `dK = dSᵀ·Q` (the GEMM operands of the kernels);
//! - O, dQ, dK, dV are rounded to `dtype`; LSE stays f32 (it is fp32 in the forward contract);
//! - GQA: each q-head's scaled dK/dV is summed in f32 over the `nhead_q / nhead_k` heads of its K/V
//!   head, then rounded once.
//!
//! Layouts are dense per batch: `q [hq][sq][dq]`, `k [hk][sk][dq]`, `v [hk][sk][dv]`,
//! `o`/`dO [hq][sq][dv]`, `lse [hq][sq]`, `dq [hq][sq][dq]`, `dk [hk][sk][dq]`, `dv [hk][sk][dv]`.
//! LSE is the natural log; a fully masked row (or `sk == 0`) has `O = 0`, `LSE = -inf` and gives zero
//! gradients; `sq == 0` gives zero dK/dV.

use crate::error::{ensure, Error, Result};
use crate::problem::mask::{Mask, ResolvedMask};
use crate::problem::{Dtype, Fp8Format};

/// How the reference computes; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    F64,
    LowPrecision(Dtype),
    /// fp8 inputs (already dequantised): f32 intermediates, P rounded to the format as the kernels
    /// round it (`Fp8Format::round_probability`), bf16 outputs.
    Fp8(Fp8Format),
}

impl Precision {
    /// An intermediate result: f32 in low precision.
    fn acc(self, x: f64) -> f64 {
        match self {
            Precision::F64 => x,
            Precision::LowPrecision(_) | Precision::Fp8(_) => f64::from(x as f32),
        }
    }

    /// A GEMM operand or an output: the input dtype in low precision.
    fn lp(self, x: f64) -> f64 {
        match self {
            Precision::F64 => x,
            Precision::LowPrecision(t) => t.round_f64(x),
            Precision::Fp8(_) => Dtype::Bf16.round_f64(x),
        }
    }

    /// P as the P·V product takes it.
    fn probability(self, p: f64) -> f64 {
        match self {
            Precision::Fp8(format) => f64::from(format.round_probability(p as f32)),
            _ => self.lp(p),
        }
    }
}

/// Shapes of a (possibly varlen) attention problem; `seqlens[b] = (sq, sk)` per batch.
#[derive(Debug, Clone, PartialEq)]
pub struct RefProblem {
    pub nhead_q: usize,
    pub nhead_k: usize,
    pub hdim_q: usize,
    pub hdim_v: usize,
    /// Softmax scale (applied to `Q·Kᵀ`).
    pub scale: f64,
    pub mask: Mask,
    pub seqlens: Vec<(usize, usize)>,
}

/// Forward outputs of one batch.
#[derive(Debug, Clone, PartialEq)]
pub struct RefForward {
    /// `[hq][sq][dv]`.
    pub o: Vec<f64>,
    /// `[hq][sq]`, natural log.
    pub lse: Vec<f64>,
}

/// Gradients of one batch, dK/dV already reduced to `nhead_k` heads.
#[derive(Debug, Clone, PartialEq)]
pub struct RefGrads {
    /// `[hq][sq][dq]`.
    pub dq: Vec<f64>,
    /// `[hk][sk][dq]`.
    pub dk: Vec<f64>,
    /// `[hk][sk][dv]`.
    pub dv: Vec<f64>,
}

/// One batch's inputs, checked against the problem.
struct Batch<'a> {
    sq: usize,
    sk: usize,
    mask: ResolvedMask,
    q: &'a [f64],
    k: &'a [f64],
    v: &'a [f64],
}

impl RefProblem {
    fn batch<'a>(&self, b: usize, q: &'a [f64], k: &'a [f64], v: &'a [f64]) -> Result<Batch<'a>> {
        ensure(self.nhead_k >= 1 && self.nhead_q % self.nhead_k == 0, "nhead_k", || {
            format!("nhead_q {} must be a positive multiple of nhead_k {}", self.nhead_q, self.nhead_k)
        })?;
        self.mask.validate()?;
        let &(sq, sk) = self
            .seqlens
            .get(b)
            .ok_or_else(|| Error::invalid("batch", format!("{b} out of range 0..{}", self.seqlens.len())))?;
        for (field, len, want) in [
            ("q", q.len(), self.nhead_q * sq * self.hdim_q),
            ("k", k.len(), self.nhead_k * sk * self.hdim_q),
            ("v", v.len(), self.nhead_k * sk * self.hdim_v),
        ] {
            ensure(len == want, field, || format!("batch {b}: {len} elements, expected {want}"))?;
        }
        Ok(Batch { sq, sk, mask: self.mask.resolve(sq as i64, sk as i64), q, k, v })
    }

    /// Probabilities of row `i` of q-head `h` (`[sk]`, 0 where masked) and its LSE.
    fn softmax_row(&self, x: &Batch<'_>, pr: Precision, h: usize, i: usize) -> (Vec<f64>, f64) {
        let (dq, hk) = (self.hdim_q, h / (self.nhead_q / self.nhead_k));
        let q_row = &x.q[(h * x.sq + i) * dq..][..dq];
        let scale = pr.acc(self.scale);
        let t: Vec<Option<f64>> = (0..x.sk)
            .map(|j| {
                x.mask.is_kept(i as i64, j as i64).then(|| {
                    let k_row = &x.k[(hk * x.sk + j) * dq..][..dq];
                    let s = q_row.iter().zip(k_row).fold(0.0, |a, (q, k)| pr.acc(a + pr.acc(q * k)));
                    pr.acc(scale * s)
                })
            })
            .collect();
        let Some(max) = t.iter().flatten().copied().reduce(f64::max) else {
            return (vec![0.0; x.sk], f64::NEG_INFINITY);
        };
        let sum = t.iter().flatten().fold(0.0, |a, &t| pr.acc(a + pr.acc(pr.acc(t - max).exp())));
        let lse = pr.acc(max + pr.acc(sum.ln()));
        let p = t.iter().map(|t| t.map_or(0.0, |t| pr.acc(pr.acc(t - lse).exp()))).collect();
        (p, lse)
    }

    /// One output row of q-head `h` from its probabilities: `O = lp(P)·V`, rounded to the dtype.
    fn output_row(&self, x: &Batch<'_>, pr: Precision, h: usize, p: &[f64]) -> Vec<f64> {
        let (dv, hk) = (self.hdim_v, h / (self.nhead_q / self.nhead_k));
        (0..dv)
            .map(|d| {
                let o = p
                    .iter()
                    .enumerate()
                    .fold(0.0, |a, (j, &pj)| pr.acc(a + pr.acc(pr.probability(pj) * x.v[(hk * x.sk + j) * dv + d])));
                pr.lp(o)
            })
            .collect()
    }

    /// Forward of batch `b`: `O = softmax(scale·Q·Kᵀ + mask)·V` and the natural-log LSE.
    pub fn forward(&self, b: usize, q: &[f64], k: &[f64], v: &[f64], precision: Precision) -> Result<RefForward> {
        let x = self.batch(b, q, k, v)?;
        let mut out = RefForward { o: Vec::with_capacity(self.nhead_q * x.sq * self.hdim_v), lse: Vec::new() };
        for h in 0..self.nhead_q {
            for i in 0..x.sq {
                let (p, lse) = self.softmax_row(&x, precision, h, i);
                out.o.extend(self.output_row(&x, precision, h, &p));
                out.lse.push(lse);
            }
        }
        Ok(out)
    }

    /// The forward's rows `rows` (`(q head, query row)` pairs) of batch `b`, in that order: O as
    /// `[rows][dv]`, LSE as `[rows]`. For checking a sample of a problem too large to compute whole.
    pub fn forward_rows(
        &self,
        b: usize,
        (q, k, v): (&[f64], &[f64], &[f64]),
        precision: Precision,
        rows: &[(usize, usize)],
    ) -> Result<RefForward> {
        let x = self.batch(b, q, k, v)?;
        let mut out = RefForward { o: Vec::with_capacity(rows.len() * self.hdim_v), lse: Vec::new() };
        for &(h, i) in rows {
            ensure(h < self.nhead_q && i < x.sq, "rows", || format!("({h}, {i}) is outside the batch"))?;
            let (p, lse) = self.softmax_row(&x, precision, h, i);
            out.o.extend(self.output_row(&x, precision, h, &p));
            out.lse.push(lse);
        }
        Ok(out)
    }

    /// Gradients of batch `b` for the output gradient `d_o` (`[hq][sq][dv]`): the forward is
    /// recomputed, then `D = rowsum(dO∘O)`, `dS = P∘(dO·Vᵀ − D)`, `dQ = scale·dS·K`,
    /// `dK = scale·dSᵀ·Q`, `dV = Pᵀ·dO`, with dK/dV summed over the q-heads of each K/V head.
    pub fn backward(
        &self,
        b: usize,
        q: &[f64],
        k: &[f64],
        v: &[f64],
        d_o: &[f64],
        precision: Precision,
    ) -> Result<RefGrads> {
        let pr = precision;
        let x = self.batch(b, q, k, v)?;
        let (hq, hk, dq, dv, sq, sk) = (self.nhead_q, self.nhead_k, self.hdim_q, self.hdim_v, x.sq, x.sk);
        ensure(d_o.len() == hq * sq * dv, "do", || {
            format!("batch {b}: {} elements, expected {}", d_o.len(), hq * sq * dv)
        })?;
        let r = hq / hk;
        let scale = pr.acc(self.scale);
        let mut grads =
            RefGrads { dq: vec![0.0; hq * sq * dq], dk: vec![0.0; hk * sk * dq], dv: vec![0.0; hk * sk * dv] };
        // Per q-head accumulators, reduced into the K/V head after the head is done.
        let mut dk_h = vec![0.0; sk * dq];
        let mut dv_h = vec![0.0; sk * dv];
        for h in 0..hq {
            let kv = h / r;
            dk_h.fill(0.0);
            dv_h.fill(0.0);
            for i in 0..sq {
                let (p, _) = self.softmax_row(&x, pr, h, i);
                let o = self.output_row(&x, pr, h, &p);
                let g = &d_o[(h * sq + i) * dv..][..dv];
                let q_row = &q[(h * sq + i) * dq..][..dq];
                let big_d = g.iter().zip(&o).fold(0.0, |a, (g, o)| pr.acc(a + pr.acc(g * o)));
                let mut dq_row = vec![0.0; dq];
                for (j, &pj) in p.iter().enumerate() {
                    if pj == 0.0 {
                        continue; // masked (or underflowed): contributes exactly zero everywhere
                    }
                    let v_row = &v[(kv * sk + j) * dv..][..dv];
                    let k_row = &k[(kv * sk + j) * dq..][..dq];
                    let dp = g.iter().zip(v_row).fold(0.0, |a, (g, v)| pr.acc(a + pr.acc(g * v)));
                    let ds = pr.lp(pr.acc(pj * pr.acc(dp - big_d)));
                    let p_lp = pr.lp(pj);
                    for d in 0..dq {
                        dq_row[d] = pr.acc(dq_row[d] + pr.acc(ds * k_row[d]));
                        dk_h[j * dq + d] = pr.acc(dk_h[j * dq + d] + pr.acc(ds * q_row[d]));
                    }
                    for d in 0..dv {
                        dv_h[j * dv + d] = pr.acc(dv_h[j * dv + d] + pr.acc(p_lp * g[d]));
                    }
                }
                for (d, acc) in dq_row.iter().enumerate() {
                    grads.dq[(h * sq + i) * dq + d] = pr.lp(pr.acc(acc * scale));
                }
            }
            let dk_out = &mut grads.dk[kv * sk * dq..][..sk * dq];
            dk_out.iter_mut().zip(&dk_h).for_each(|(o, a)| *o = pr.acc(*o + pr.acc(a * scale)));
            let dv_out = &mut grads.dv[kv * sk * dv..][..sk * dv];
            dv_out.iter_mut().zip(&dv_h).for_each(|(o, a)| *o = pr.acc(*o + a));
        }
        grads.dk.iter_mut().chain(grads.dv.iter_mut()).for_each(|x| *x = pr.lp(*x));
        Ok(grads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::mask::MaskType;

    use crate::test_rng::Rng;

    /// `n` values uniform in [-1, 1), rounded to `t` when given.
    fn random_vec(rng: &mut Rng, n: usize, t: Option<Dtype>) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let u = rng.unit();
                t.map_or(u, |t| t.round_f64(u))
            })
            .collect()
    }

    struct Inputs {
        q: Vec<f64>,
        k: Vec<f64>,
        v: Vec<f64>,
        d_o: Vec<f64>,
    }

    fn inputs(p: &RefProblem, b: usize, rng: &mut Rng, t: Option<Dtype>) -> Inputs {
        let (sq, sk) = p.seqlens[b];
        Inputs {
            q: random_vec(rng, p.nhead_q * sq * p.hdim_q, t),
            k: random_vec(rng, p.nhead_k * sk * p.hdim_q, t),
            v: random_vec(rng, p.nhead_k * sk * p.hdim_v, t),
            d_o: random_vec(rng, p.nhead_q * sq * p.hdim_v, t),
        }
    }

    fn random_mask(rng: &mut Rng) -> Mask {
        match rng.size(0, 4) {
            0 => Mask::NONE,
            1 => Mask::causal(MaskType::TopLeft),
            2 => Mask::causal(MaskType::BottomRight),
            n => Mask {
                kind: if n == 3 { MaskType::TopLeft } else { MaskType::BottomRight },
                left: rng.size(0, 3) as i32 - 1,
                right: rng.size(0, 3) as i32 - 1,
            },
        }
    }

    fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
    }

    /// The scalar loss whose gradients `backward` returns: `sum(O ∘ dO)`.
    fn loss(p: &RefProblem, x: &Inputs) -> f64 {
        let f = p.forward(0, &x.q, &x.k, &x.v, Precision::F64).unwrap();
        f.o.iter().zip(&x.d_o).map(|(o, g)| o * g).sum()
    }

    fn tensor(x: &mut Inputs, which: usize) -> &mut Vec<f64> {
        match which {
            0 => &mut x.q,
            1 => &mut x.k,
            _ => &mut x.v,
        }
    }

    /// Central differences of `sum(O ∘ dO)` against `backward`, at f64, on tiny random problems
    /// with every mask kind, GQA, zero lengths and fully masked rows.
    #[test]
    fn gradients_match_finite_differences() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        for case in 0..300 {
            let nhead_k = rng.size(1, 2);
            let p = RefProblem {
                nhead_q: nhead_k * rng.size(1, 3),
                nhead_k,
                hdim_q: rng.size(1, 4),
                hdim_v: rng.size(1, 4),
                scale: 0.3 + rng.unit().abs(),
                mask: random_mask(&mut rng),
                seqlens: vec![(rng.size(0, 6), rng.size(0, 6))],
            };
            let mut x = inputs(&p, 0, &mut rng, None);
            let g = p.backward(0, &x.q, &x.k, &x.v, &x.d_o, Precision::F64).unwrap();
            let eps = 1e-5;
            for (which, analytic) in [(0, &g.dq), (1, &g.dk), (2, &g.dv)] {
                for (idx, &a) in analytic.iter().enumerate() {
                    let orig = tensor(&mut x, which)[idx];
                    tensor(&mut x, which)[idx] = orig + eps;
                    let up = loss(&p, &x);
                    tensor(&mut x, which)[idx] = orig - eps;
                    let down = loss(&p, &x);
                    tensor(&mut x, which)[idx] = orig;
                    let numeric = (up - down) / (2.0 * eps);
                    assert!(
                        (numeric - a).abs() <= 1e-7 * (1.0 + a.abs()),
                        "seed {seed} case {case} {p:?}: d{}[{idx}] analytic {a} numeric {numeric}",
                        ["q", "k", "v"][which]
                    );
                }
            }
        }
    }

    /// The forward against a differently written softmax: subtract the row max, normalise by the sum.
    #[test]
    fn forward_matches_direct_softmax() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        for case in 0..200 {
            let p = RefProblem {
                nhead_q: 2,
                nhead_k: 1,
                hdim_q: rng.size(1, 8),
                hdim_v: rng.size(1, 8),
                scale: 0.5,
                mask: random_mask(&mut rng),
                seqlens: vec![(rng.size(0, 9), rng.size(0, 9))],
            };
            let x = inputs(&p, 0, &mut rng, None);
            let f = p.forward(0, &x.q, &x.k, &x.v, Precision::F64).unwrap();
            let (sq, sk) = p.seqlens[0];
            let m = p.mask.resolve(sq as i64, sk as i64);
            for h in 0..2 {
                for i in 0..sq {
                    let s: Vec<(usize, f64)> = (0..sk)
                        .filter(|&j| m.is_kept(i as i64, j as i64))
                        .map(|j| {
                            (
                                j,
                                0.5 * (0..p.hdim_q)
                                    .map(|d| x.q[(h * sq + i) * p.hdim_q + d] * x.k[j * p.hdim_q + d])
                                    .sum::<f64>(),
                            )
                        })
                        .collect();
                    let max = s.iter().map(|e| e.1).fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = s.iter().map(|e| (e.1 - max).exp()).sum();
                    let lse = if s.is_empty() { f64::NEG_INFINITY } else { max + z.ln() };
                    let got = f.lse[h * sq + i];
                    assert!(got == lse || (got - lse).abs() < 1e-12, "seed {seed} case {case}: lse {got} vs {lse}");
                    for d in 0..p.hdim_v {
                        let o: f64 = s.iter().map(|&(j, t)| (t - max).exp() / z * x.v[j * p.hdim_v + d]).sum();
                        let got = f.o[(h * sq + i) * p.hdim_v + d];
                        assert!((got - o).abs() < 1e-12, "seed {seed} case {case}: o {got} vs {o}");
                    }
                }
            }
        }
    }

    /// A sample of rows, in any order, equals those rows of the whole forward, in every precision.
    #[test]
    fn forward_rows_are_the_forwards_rows() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        for case in 0..50 {
            let p = RefProblem {
                nhead_q: 4,
                nhead_k: 2,
                hdim_q: rng.size(1, 8),
                hdim_v: rng.size(1, 8),
                scale: 0.5,
                mask: random_mask(&mut rng),
                seqlens: vec![(rng.size(1, 9), rng.size(0, 9))],
            };
            let x = inputs(&p, 0, &mut rng, None);
            let sq = p.seqlens[0].0;
            let rows: Vec<(usize, usize)> = (0..6).map(|_| (rng.size(0, 3), rng.size(0, sq - 1))).collect();
            for precision in [Precision::F64, Precision::LowPrecision(Dtype::Bf16)] {
                let whole = p.forward(0, &x.q, &x.k, &x.v, precision).unwrap();
                let some = p.forward_rows(0, (&x.q, &x.k, &x.v), precision, &rows).unwrap();
                for (r, &(h, i)) in rows.iter().enumerate() {
                    let at = h * sq + i;
                    assert_eq!(some.lse[r].to_bits(), whole.lse[at].to_bits(), "seed {seed} case {case}");
                    assert_eq!(some.o[r * p.hdim_v..][..p.hdim_v], whole.o[at * p.hdim_v..][..p.hdim_v]);
                }
            }
            assert!(p.forward_rows(0, (&x.q, &x.k, &x.v), Precision::F64, &[(4, 0)]).is_err());
        }
    }

    #[test]
    fn causal_first_row_sees_only_the_first_key() {
        let mut rng = Rng::fresh();
        let p = RefProblem {
            nhead_q: 1,
            nhead_k: 1,
            hdim_q: 3,
            hdim_v: 2,
            scale: 0.7,
            mask: Mask::causal(MaskType::TopLeft),
            seqlens: vec![(4, 4)],
        };
        let x = inputs(&p, 0, &mut rng, None);
        let f = p.forward(0, &x.q, &x.k, &x.v, Precision::F64).unwrap();
        assert_eq!(&f.o[..2], &x.v[..2]);
        let s: f64 = (0..3).map(|d| x.q[d] * x.k[d]).sum();
        assert!((f.lse[0] - 0.7 * s).abs() < 1e-15);
    }

    #[test]
    fn gqa_sums_the_expanded_heads() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        let p = RefProblem {
            nhead_q: 6,
            nhead_k: 2,
            hdim_q: 4,
            hdim_v: 3,
            scale: 0.4,
            mask: Mask { kind: MaskType::BottomRight, left: 2, right: 1 },
            seqlens: vec![(5, 7)],
        };
        let x = inputs(&p, 0, &mut rng, None);
        // The same problem with K/V copied to every q-head.
        let expanded = RefProblem { nhead_k: 6, ..p.clone() };
        let copy = |t: &[f64], per_head: usize| -> Vec<f64> {
            (0..6).flat_map(|h| t[(h / 3) * per_head..][..per_head].to_vec()).collect()
        };
        let (k6, v6) = (copy(&x.k, 7 * 4), copy(&x.v, 7 * 3));
        for pr in [Precision::F64, Precision::LowPrecision(Dtype::F16)] {
            let g = p.backward(0, &x.q, &x.k, &x.v, &x.d_o, pr).unwrap();
            let e = expanded.backward(0, &x.q, &k6, &v6, &x.d_o, Precision::F64).unwrap();
            let tol = if pr == Precision::F64 { 1e-13 } else { 1e-2 };
            assert!(max_abs_diff(&g.dq, &e.dq) <= tol, "seed {seed} {pr:?}");
            let reduce = |t: &[f64], per_head: usize| -> Vec<f64> {
                (0..2)
                    .flat_map(|kv| {
                        (0..per_head).map(move |i| (0..3).map(|g| t[(kv * 3 + g) * per_head + i]).sum::<f64>())
                    })
                    .collect()
            };
            assert!(max_abs_diff(&g.dk, &reduce(&e.dk, 7 * 4)) <= tol, "seed {seed} {pr:?}");
            assert!(max_abs_diff(&g.dv, &reduce(&e.dv, 7 * 3)) <= tol, "seed {seed} {pr:?}");
            let f = p.forward(0, &x.q, &x.k, &x.v, Precision::F64).unwrap();
            assert_eq!(f, expanded.forward(0, &x.q, &k6, &v6, Precision::F64).unwrap());
        }
    }

    #[test]
    fn zero_lengths_and_fully_masked_rows() {
        let mut rng = Rng::fresh();
        // Top-left window (0, 0) with sq > sk: rows 3.. keep no key.
        let p = RefProblem {
            nhead_q: 2,
            nhead_k: 1,
            hdim_q: 3,
            hdim_v: 2,
            scale: 1.0,
            mask: Mask { kind: MaskType::TopLeft, left: 0, right: 0 },
            seqlens: vec![(0, 4), (3, 0), (0, 0), (5, 3)],
        };
        for pr in [Precision::F64, Precision::LowPrecision(Dtype::Bf16)] {
            for b in 0..4 {
                let x = inputs(&p, b, &mut rng, Some(Dtype::Bf16));
                let f = p.forward(b, &x.q, &x.k, &x.v, pr).unwrap();
                let g = p.backward(b, &x.q, &x.k, &x.v, &x.d_o, pr).unwrap();
                let (sq, sk) = p.seqlens[b];
                let all_finite = f.o.iter().chain(&g.dq).chain(&g.dk).chain(&g.dv).all(|v| v.is_finite());
                assert!(all_finite, "batch {b} {pr:?}");
                if sq == 0 {
                    assert!(g.dk.iter().chain(&g.dv).all(|&v| v == 0.0) && g.dk.len() == sk * 3);
                }
                if sk == 0 {
                    assert!(f.o.iter().chain(&g.dq).all(|&v| v == 0.0));
                    assert!(f.lse.iter().all(|&l| l == f64::NEG_INFINITY));
                }
                if b == 3 {
                    for h in 0..2 {
                        for i in 3..5 {
                            assert_eq!(f.lse[h * 5 + i], f64::NEG_INFINITY);
                            assert!(f.o[(h * 5 + i) * 2..][..2].iter().all(|&v| v == 0.0));
                            assert!(g.dq[(h * 5 + i) * 3..][..3].iter().all(|&v| v == 0.0));
                        }
                        // Row 0 keeps only key 0: O = V[0] exactly (also after rounding: V is bf16).
                        assert_eq!(&f.o[h * 10..][..2], &x.v[..2]);
                    }
                }
            }
        }
    }

    #[test]
    fn low_precision_is_close_to_f64_and_representable() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        let p = RefProblem {
            nhead_q: 2,
            nhead_k: 1,
            hdim_q: 64,
            hdim_v: 64,
            scale: 0.125,
            mask: Mask::causal(MaskType::BottomRight),
            seqlens: vec![(24, 40)],
        };
        let mut errs = Vec::new();
        for t in [Dtype::F16, Dtype::Bf16] {
            let x = inputs(&p, 0, &mut rng, Some(t));
            let lp = Precision::LowPrecision(t);
            let (f, f64f) =
                (p.forward(0, &x.q, &x.k, &x.v, lp).unwrap(), p.forward(0, &x.q, &x.k, &x.v, Precision::F64).unwrap());
            let (g, g64) = (
                p.backward(0, &x.q, &x.k, &x.v, &x.d_o, lp).unwrap(),
                p.backward(0, &x.q, &x.k, &x.v, &x.d_o, Precision::F64).unwrap(),
            );
            for v in f.o.iter().chain(&g.dq).chain(&g.dk).chain(&g.dv) {
                assert_eq!(t.round_f64(*v), *v, "{t:?}: output not representable");
            }
            assert!(f.lse.iter().all(|&l| f64::from(l as f32) == l), "{t:?}: LSE not f32");
            let err = [
                max_abs_diff(&f.o, &f64f.o),
                max_abs_diff(&g.dq, &g64.dq),
                max_abs_diff(&g.dk, &g64.dk),
                max_abs_diff(&g.dv, &g64.dv),
            ];
            let bound = if t == Dtype::F16 { 5e-3 } else { 4e-2 };
            assert!(err.iter().all(|&e| e > 0.0 && e < bound), "seed {seed} {t:?}: errors {err:?}");
            assert!(max_abs_diff(&f.lse, &f64f.lse) < 1e-5, "seed {seed} {t:?}");
            errs.push(err);
        }
        assert!((0..4).all(|i| errs[1][i] > errs[0][i]), "seed {seed}: bf16 not coarser than f16: {errs:?}");
    }

    #[test]
    fn dtype_rounding_ties_to_even() {
        let (one, ulp16, ulpbf) = (1.0f64, 2f64.powi(-10), 2f64.powi(-7));
        assert_eq!(Dtype::F16.round_f64(one + ulp16), one + ulp16);
        assert_eq!(Dtype::F16.round_f64(one + ulp16 / 2.0), one);
        assert_eq!(Dtype::F16.round_f64(one + 1.5 * ulp16), one + 2.0 * ulp16);
        assert_eq!(Dtype::Bf16.round_f64(one + ulpbf), one + ulpbf);
        assert_eq!(Dtype::Bf16.round_f64(one + ulpbf / 2.0), one);
        assert_eq!(Dtype::F16.round_f64(1e6), f64::INFINITY);
        assert_eq!(Dtype::Bf16.round_f64(1e6), 999424.0);
    }

    #[test]
    fn shape_errors_name_the_tensor() {
        let p = RefProblem {
            nhead_q: 3,
            nhead_k: 2,
            hdim_q: 1,
            hdim_v: 1,
            scale: 1.0,
            mask: Mask::NONE,
            seqlens: vec![(1, 1)],
        };
        let e = p.forward(0, &[0.0; 3], &[0.0; 2], &[0.0; 2], Precision::F64).unwrap_err();
        assert!(e.message.starts_with("nhead_k"), "{}", e.message);
        let p = RefProblem { nhead_k: 1, ..p };
        let e = p.forward(0, &[0.0; 3], &[0.0; 2], &[0.0; 1], Precision::F64).unwrap_err();
        assert!(e.message.starts_with("k"), "{}", e.message);
        let e = p.backward(0, &[0.0; 3], &[0.0; 1], &[0.0; 1], &[0.0; 2], Precision::F64).unwrap_err();
        assert!(e.message.starts_with("do"), "{}", e.message);
        let e = p.forward(1, &[0.0; 3], &[0.0; 1], &[0.0; 1], Precision::F64).unwrap_err();
        assert!(e.message.starts_with("batch"), "{}", e.message);
    }
}
