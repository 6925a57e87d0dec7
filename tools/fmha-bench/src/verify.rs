//! `--verify`: outputs against the float64 reference (`fmha::reference`) with the field's rule
//! (docs/design: kernel error ≤ factor × the same computation's error in the kernel's precision +
//! a rounding floor). Big forwards are checked on a sample of rows; big backwards are skipped.

use crate::matrix::{Case, DtypeName};
use fmha::reference::{Precision, RefProblem};

/// Float64 work (multiply-adds) one case's check may take: a few seconds of reference time.
const WORK_BUDGET: f64 = 4e8;

/// One sequence's inputs in the reference's layout (`[head][row][dim]`, decoded).
pub struct Sequence {
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Verdict {
    /// `pass`, `fail` or `skipped`.
    pub status: String,
    pub max_error: f64,
    pub bound: f64,
    /// Which outputs were checked, or why none were.
    pub detail: String,
}

impl Verdict {
    pub fn skipped(detail: String) -> Verdict {
        Verdict { status: "skipped".into(), detail, ..Verdict::default() }
    }
}

fn problem(case: &Case) -> RefProblem {
    RefProblem {
        nhead_q: case.nhead_q,
        nhead_k: case.nhead_k,
        hdim_q: case.hdim_q,
        hdim_v: case.hdim_v,
        scale: 1.0 / (case.hdim_q as f64).sqrt(),
        mask: case.mask,
        seqlens: case.seqlens(),
    }
}

fn low_precision(dtype: DtypeName) -> Precision {
    match (dtype, dtype.fp8_format()) {
        (_, Some(format)) => Precision::Fp8(format),
        (DtypeName::Fp16, _) => Precision::LowPrecision(fmha::problem::Dtype::F16),
        _ => Precision::LowPrecision(fmha::problem::Dtype::Bf16),
    }
}

fn epsilon(dtype: DtypeName) -> f64 {
    match dtype {
        DtypeName::Fp16 => 2f64.powi(-10),
        _ => 2f64.powi(-7), // bf16, and fp8's bf16 output
    }
}

/// Running (kernel error, same-precision error, largest exact magnitude) of one output.
#[derive(Default, Clone, Copy)]
struct Errors {
    kernel: f64,
    base: f64,
    magnitude: f64,
}

impl Errors {
    fn add(&mut self, kernel: f64, exact: f64, low: f64) {
        // A NaN kernel value is an error of infinite size (NaN would compare false).
        let e = if kernel.is_nan() { f64::INFINITY } else { (kernel - exact).abs() };
        self.kernel = self.kernel.max(e);
        self.base = self.base.max((low - exact).abs());
        self.magnitude = self.magnitude.max(exact.abs());
    }

    /// The rule's bound: `factor × base + floor`.
    fn bound(&self, factor: f64, floor: f64) -> f64 {
        factor * self.base + floor
    }
}

/// Checks a forward's O (and LSE when given) on all rows when the reference fits the budget, else on
/// rows spread over the first and last sequence and every head. `sequence(b)` gives a sequence's
/// inputs; `o(b, h, i, d)` and `lse(b, h, i)` read the kernel's outputs.
pub fn forward(
    case: &Case,
    sequence: &dyn Fn(usize) -> Sequence,
    o: &dyn Fn(usize, usize, usize, usize) -> f64,
    lse: Option<&dyn Fn(usize, usize, usize) -> f64>,
) -> Verdict {
    let p = problem(case);
    let row_work = |sk: usize| (sk * (case.hdim_q + case.hdim_v) * 2) as f64;
    let total: f64 = p.seqlens.iter().map(|&(sq, sk)| (sq * case.nhead_q) as f64 * row_work(sk)).sum();
    let whole = total <= WORK_BUDGET;
    let mut batches: Vec<usize> = if whole {
        (0..case.batch).collect()
    } else {
        let nonempty: Vec<usize> = (0..case.batch).filter(|&b| p.seqlens[b].0 > 0).collect();
        [nonempty.first(), nonempty.last()].into_iter().flatten().copied().collect()
    };
    batches.dedup();
    let (mut out, mut lse_errors, mut rows_checked) = (Errors::default(), Errors::default(), 0usize);
    let low = low_precision(case.dtype);
    for &b in &batches {
        let (sq, sk) = p.seqlens[b];
        if sq == 0 {
            continue;
        }
        let rows: Vec<(usize, usize)> = if whole {
            (0..case.nhead_q).flat_map(|h| (0..sq).map(move |i| (h, i))).collect()
        } else {
            let count =
                ((WORK_BUDGET / batches.len() as f64 / row_work(sk).max(1.0)) as usize).clamp(4, sq * case.nhead_q);
            // Evenly spread (head, row) pairs, the first and last row included.
            (0..count)
                .map(|n| {
                    let flat = n * (sq * case.nhead_q - 1) / (count - 1).max(1);
                    (flat % case.nhead_q, flat / case.nhead_q)
                })
                .collect()
        };
        let s = sequence(b);
        let inputs = (&s.q[..], &s.k[..], &s.v[..]);
        let (exact, lowp) =
            match (p.forward_rows(b, inputs, Precision::F64, &rows), p.forward_rows(b, inputs, low, &rows)) {
                (Ok(e), Ok(l)) => (e, l),
                (Err(e), _) | (_, Err(e)) => {
                    return Verdict { status: "fail".into(), detail: e.message, ..Verdict::default() }
                }
            };
        for (r, &(h, i)) in rows.iter().enumerate() {
            for d in 0..case.hdim_v {
                out.add(o(b, h, i, d), exact.o[r * case.hdim_v + d], lowp.o[r * case.hdim_v + d]);
            }
            if let Some(lse) = lse {
                if exact.lse[r].is_finite() {
                    lse_errors.add(lse(b, h, i), exact.lse[r], lowp.lse[r]);
                }
            }
        }
        rows_checked += rows.len();
    }
    let eps = epsilon(case.dtype);
    let (factor, floor) = if case.dtype.is_fp8() {
        // spec/inference.md §2.5's fp8 output rule (its max-error part).
        (4.0, 2f64.powi(-8) * 4.0)
    } else {
        (2.0, 0.25 * eps * out.magnitude.max(1e-3))
    };
    let o_bound = out.bound(factor, floor);
    let mut verdict = Verdict {
        status: if out.kernel <= o_bound { "pass" } else { "fail" }.into(),
        max_error: out.kernel,
        bound: o_bound,
        detail: format!(
            "O: {rows_checked} rows of {} sequence(s){}",
            batches.len(),
            if whole { " (all rows)" } else { " (sampled)" }
        ),
    };
    // LSE is fp32: the rounding floor plus the exp2 unit's error summed over the keys (as the tests);
    // fp8's LSE also carries the e4m3 tensor cores' accumulation, which this sample rule leaves out.
    if lse.is_some() && !case.dtype.is_fp8() {
        let max_keys = p.seqlens.iter().map(|s| s.1).max().unwrap_or(0) as f64;
        let bound = lse_errors.bound(2.0, 0.25 * 2f64.powi(-20) * lse_errors.magnitude.max(1e-3))
            + 4.0 * 2f64.powi(-22) * max_keys.sqrt();
        verdict.detail += &format!(", LSE max error {:.3e} (bound {bound:.3e})", lse_errors.kernel);
        if lse_errors.kernel > bound {
            verdict.status = "fail".into();
        }
    }
    verdict
}

/// Checks dQ, dK, dV of a backward against the whole reference (3× the same-precision error plus
/// the rounding floor), when it fits the budget. `sequence(b)` gives the inputs and `d_o(b)` dO as
/// `[head][row][dim]`; `grad(which, b, h, i, d)` reads dQ (0), dK (1) or dV (2).
pub fn backward(
    case: &Case,
    sequence: &dyn Fn(usize) -> Sequence,
    d_o: &dyn Fn(usize) -> Vec<f64>,
    grad: &dyn Fn(usize, usize, usize, usize, usize) -> f64,
) -> Verdict {
    let p = problem(case);
    let work: f64 =
        p.seqlens.iter().map(|&(sq, sk)| (sq * sk * case.nhead_q * (case.hdim_q + case.hdim_v) * 8) as f64).sum();
    if work > WORK_BUDGET {
        return Verdict::skipped(format!(
            "the float64 backward would take {work:.1e} multiply-adds (budget {WORK_BUDGET:.0e}); smaller shapes are verified"
        ));
    }
    let low = low_precision(case.dtype);
    let mut errors = [Errors::default(); 3];
    for (b, &(sq, sk)) in p.seqlens.iter().enumerate() {
        let s = sequence(b);
        let g = d_o(b);
        let (exact, lowp) =
            match (p.backward(b, &s.q, &s.k, &s.v, &g, Precision::F64), p.backward(b, &s.q, &s.k, &s.v, &g, low)) {
                (Ok(e), Ok(l)) => (e, l),
                (Err(e), _) | (_, Err(e)) => {
                    return Verdict { status: "fail".into(), detail: e.message, ..Verdict::default() }
                }
            };
        let shapes =
            [(case.nhead_q, sq, case.hdim_q), (case.nhead_k, sk, case.hdim_q), (case.nhead_k, sk, case.hdim_v)];
        let pairs = [(&exact.dq, &lowp.dq), (&exact.dk, &lowp.dk), (&exact.dv, &lowp.dv)];
        for (which, ((heads, rows, dim), (e, l))) in shapes.into_iter().zip(pairs).enumerate() {
            for h in 0..heads {
                for i in 0..rows {
                    for d in 0..dim {
                        let at = (h * rows + i) * dim + d;
                        errors[which].add(grad(which, b, h, i, d), e[at], l[at]);
                    }
                }
            }
        }
    }
    let eps = epsilon(case.dtype);
    let mut verdict =
        Verdict { status: "pass".into(), detail: "dQ, dK, dV: all elements".into(), ..Verdict::default() };
    for e in errors {
        let bound = e.bound(3.0, 0.25 * eps * e.magnitude.max(1e-3));
        if e.kernel > bound {
            verdict.status = "fail".into();
        }
        if e.kernel / bound.max(f64::MIN_POSITIVE) >= verdict.max_error / verdict.bound.max(f64::MIN_POSITIVE) {
            verdict.max_error = e.kernel;
            verdict.bound = bound;
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use fmha::test_rng::Rng;

    fn case(batch: usize, sq: usize, sk: usize) -> Case {
        let mut c = crate::matrix::load("smoke").unwrap().into_iter().find(|c| c.dtype == DtypeName::Bf16).unwrap();
        (c.batch, c.seqlen_q, c.seqlen_k, c.varlen) = (batch, sq, sk, false);
        c
    }

    /// Random inputs of every sequence, and the bf16-rounded float64 forward as a "kernel" output.
    fn inputs(c: &Case, rng: &mut Rng) -> (Vec<Sequence>, Vec<fmha::reference::RefForward>) {
        let p = problem(c);
        let round = |x: f64| half::bf16::from_f64(x).to_f64();
        let seqs: Vec<Sequence> = p
            .seqlens
            .iter()
            .map(|&(sq, sk)| Sequence {
                q: (0..c.nhead_q * sq * c.hdim_q).map(|_| round(rng.unit())).collect(),
                k: (0..c.nhead_k * sk * c.hdim_q).map(|_| round(rng.unit())).collect(),
                v: (0..c.nhead_k * sk * c.hdim_v).map(|_| round(rng.unit())).collect(),
            })
            .collect();
        let outs =
            seqs.iter().enumerate().map(|(b, s)| p.forward(b, &s.q, &s.k, &s.v, Precision::F64).unwrap()).collect();
        (seqs, outs)
    }

    fn run(c: &Case, seqs: &[Sequence], outs: &[fmha::reference::RefForward], bad: Option<(usize, f64)>) -> Verdict {
        let seqlens = c.seqlens();
        let o = |b: usize, h: usize, i: usize, d: usize| {
            let at = (h * seqlens[b].0 + i) * c.hdim_v + d;
            let x = half::bf16::from_f64(outs[b].o[at]).to_f64();
            match bad {
                Some((which, by)) if which == at && b == c.batch - 1 => x + by,
                _ => x,
            }
        };
        let seq = |b: usize| Sequence { q: seqs[b].q.clone(), k: seqs[b].k.clone(), v: seqs[b].v.clone() };
        forward(c, &seq, &o, None)
    }

    #[test]
    fn a_rounded_exact_forward_passes_and_a_wrong_element_fails() {
        let mut rng = Rng::fresh();
        let seed = rng.0;
        let c = case(2, 9, 13);
        let (seqs, outs) = inputs(&c, &mut rng);
        assert_eq!(run(&c, &seqs, &outs, None).status, "pass", "seed {seed}");
        for bad in [(0, 0.05), (7, -0.05), (3, f64::NAN)] {
            let v = run(&c, &seqs, &outs, Some(bad));
            assert_eq!(v.status, "fail", "seed {seed}: {bad:?} {v:?}");
        }
    }

    #[test]
    fn big_forwards_check_a_sample_including_the_last_row() {
        let mut rng = Rng::fresh();
        let c = case(1, 3000, 3000);
        let (seqs, outs) = inputs(&c, &mut rng);
        let v = run(&c, &seqs, &outs, None);
        assert!(v.status == "pass" && v.detail.contains("sampled"), "{v:?}");
        // The last (head, row) pair is always sampled.
        let last = (c.nhead_q * 3000 - 1) * c.hdim_v;
        assert_eq!(run(&c, &seqs, &outs, Some((last, 0.5))).status, "fail");
    }
}
