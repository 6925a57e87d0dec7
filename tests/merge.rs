//! `fmha_merge_attention_states` through the C ABI (spec/inference.md §3.5): random states against a
//! float64 merge, with empty (±inf), all-empty and NaN rows, random strides, both LSE bases and every
//! pair of element types, outputs poisoned and their gaps checked untouched; in place; the merge of two
//! forwards over the halves of the keys against one forward over all of them; bitwise repeatability;
//! and every bad argument refused with its field named. On every backend (GPU builds without a device
//! skip).

mod common;

use common::attention::{Buffers, Case, Dtype, Inputs, Rng};
use common::{expect_error, last_error, no_device, ok};
use fmha::ffi::attention::{fmha_fwd, fmha_tensor};
use fmha::ffi::merge::*;
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::problem::mask::Mask;
use fmha::problem::merge::{LseBase, StateDtype};
use fmha::reference::Precision;
use std::ffi::c_void;
use std::ptr::null_mut;

const DTYPES: [StateDtype; 3] = [StateDtype::F16, StateDtype::Bf16, StateDtype::F32];

fn encode(dtype: StateDtype, x: f64) -> Vec<u8> {
    match dtype {
        StateDtype::F16 => half::f16::from_f64(x).to_le_bytes().to_vec(),
        StateDtype::Bf16 => half::bf16::from_f64(x).to_le_bytes().to_vec(),
        StateDtype::F32 => (x as f32).to_le_bytes().to_vec(),
    }
}

fn decode(dtype: StateDtype, bytes: &[u8]) -> f64 {
    match dtype {
        StateDtype::F16 => half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
        StateDtype::Bf16 => half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
        StateDtype::F32 => f32::from_le_bytes(bytes[..4].try_into().unwrap()) as f64,
    }
}

/// Relative spacing of the type's values (its epsilon).
fn epsilon(dtype: StateDtype) -> f64 {
    match dtype {
        StateDtype::F16 => 2f64.powi(-10),
        StateDtype::Bf16 => 2f64.powi(-7),
        StateDtype::F32 => 2f64.powi(-23),
    }
}

/// A device buffer with its host image (bytes).
struct Buffer {
    ptr: *mut c_void,
    host: Vec<u8>,
}

impl Buffer {
    fn new(bytes: usize) -> Buffer {
        let mut ptr = null_mut();
        ok(fmha_device_malloc(&mut ptr, bytes.max(16)));
        Buffer { ptr, host: vec![0; bytes] }
    }
    fn upload(&self) {
        ok(fmha_memcpy(self.ptr, self.host.as_ptr().cast(), self.host.len(), FMHA_MEMCPY_HOST_TO_DEVICE));
    }
    fn download(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.host.len()];
        ok(fmha_memcpy(out.as_mut_ptr().cast(), self.ptr, out.len(), FMHA_MEMCPY_DEVICE_TO_HOST));
        out
    }
    fn at(&self, element: usize, bytes: usize) -> *mut c_void {
        (self.ptr as usize + element * bytes) as *mut c_void
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        fmha_device_free(self.ptr);
    }
}

/// Strides of a tensor whose dimensions `sizes` (outermost first) are laid out in a random order with
/// random padding, rows of `columns` elements; and the elements it spans from its base.
fn random_strides(rng: &mut Rng, sizes: &[usize], columns: usize, padded: bool) -> (Vec<i64>, usize) {
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.size(0, i));
    }
    let pad = |rng: &mut Rng| if padded { rng.size(0, 3) } else { 0 };
    let mut running = columns + pad(rng);
    let mut strides = vec![0i64; sizes.len()];
    for &dim in &order {
        strides[dim] = running as i64;
        running = running * sizes[dim] + pad(rng);
    }
    (strides, running)
}

#[derive(Debug, Clone, Copy)]
struct MergeCase {
    states: usize,
    rows: usize,
    heads: usize,
    d: usize,
    in_dtype: StateDtype,
    out_dtype: StateDtype,
    base: LseBase,
    write_lse: bool,
    /// o_out is state 0 of o_in, lse_out state 0 of lse_in.
    in_place: bool,
    /// Strides with odd padding and bases off by an element (the kernels' element-wise path).
    padded: bool,
}

/// The float64 merge of one (row, head): states' natural-log LSEs and rows → (O, natural-log LSE).
fn merge_f64(lses: &[f64], rows: &[Vec<f64>], d: usize) -> (Vec<f64>, f64) {
    if lses.iter().any(|x| x.is_nan()) {
        return (vec![f64::NAN; d], f64::NAN);
    }
    let max = lses.iter().copied().filter(|x| x.is_finite()).fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return (vec![0.0; d], f64::NEG_INFINITY);
    }
    let weights: Vec<f64> = lses.iter().map(|&x| if x.is_finite() { (x - max).exp() } else { 0.0 }).collect();
    let total: f64 = weights.iter().sum();
    let o = (0..d)
        .map(|c| weights.iter().zip(rows).filter(|(w, _)| **w > 0.0).map(|(w, r)| w * r[c]).sum::<f64>() / total)
        .collect();
    (o, max + total.ln())
}

/// The tensors of one merge call, their host values and the expected results.
struct Prepared {
    args: fmha_merge_args,
    buffers: Vec<Buffer>,
    /// (buffer index, element offset) of o_out[h][r][0] and lse_out[h][r], per (r, h).
    o_out_at: Vec<(usize, usize)>,
    lse_out_at: Vec<(usize, usize)>,
    expected_o: Vec<Vec<f64>>,
    expected_lse: Vec<f64>,
    /// Per (r, h): the largest |O| of its non-empty states (the fp32 error scale).
    scale_o: Vec<f64>,
    /// The output buffers' images as they must be after the call except at the written elements.
    untouched: Vec<Vec<u8>>,
}

fn prepare(case: &MergeCase, rng: &mut Rng) -> Prepared {
    let (s, r, h, d) = (case.states, case.rows, case.heads, case.d);
    let (ib, ob) = (case.in_dtype.bytes(), case.out_dtype.bytes());
    let base_offset = |rng: &mut Rng| if case.padded { rng.size(0, 2) } else { 0 };

    // States: LSEs mostly finite, some empty (±inf); a row of all-empty states and a NaN row now and then.
    let all_empty = rng.range(0, 2) == 0;
    let nan_row = rng.range(0, 3) == 0;
    let mut lse = vec![vec![vec![0.0f64; r]; h]; s];
    let mut o = vec![vec![vec![Vec::new(); r]; h]; s];
    for (si, (lse_s, o_s)) in lse.iter_mut().zip(o.iter_mut()).enumerate() {
        for (hi, (lse_h, o_h)) in lse_s.iter_mut().zip(o_s.iter_mut()).enumerate() {
            for (ri, (x, row)) in lse_h.iter_mut().zip(o_h.iter_mut()).enumerate() {
                *x = match rng.range(0, 15) {
                    0 | 1 => f64::NEG_INFINITY,
                    2 => f64::INFINITY,
                    _ => ((rng.unit() * 6.0) as f32) as f64,
                };
                if all_empty && ri == 0 && hi == 0 {
                    *x = if si % 2 == 0 { f64::NEG_INFINITY } else { f64::INFINITY };
                }
                if nan_row && ri == r - 1 && hi == h - 1 && si == s / 2 {
                    *x = f64::NAN;
                }
                // An empty state's O is never read: poison it.
                *row = (0..d)
                    .map(|_| {
                        if x.is_infinite() {
                            f64::NAN
                        } else {
                            decode(case.in_dtype, &encode(case.in_dtype, rng.unit()))
                        }
                    })
                    .collect();
            }
        }
    }

    // o_in [s][h][r][d] and lse_in [s][h][r] by random strides.
    let (o_in_strides, o_in_span) = random_strides(rng, &[s, h, r], d, case.padded);
    let (lse_in_strides, lse_in_span) = random_strides(rng, &[s, h, r], 1, case.padded);
    let (o_in_base, lse_in_base) = (base_offset(rng), base_offset(rng));
    let mut o_in = Buffer::new((o_in_base + o_in_span) * ib);
    let mut lse_in = Buffer::new((lse_in_base + lse_in_span) * 4);
    for byte in o_in.host.chunks_exact_mut(ib) {
        byte.copy_from_slice(&encode(case.in_dtype, 1e4)); // gaps: large values, visible if read
    }
    lse_in.host.fill(0x7F); // gaps: a huge LSE, visible if read
    let o_in_index = |si: usize, hi: usize, ri: usize| {
        o_in_base + (si as i64 * o_in_strides[0] + hi as i64 * o_in_strides[1] + ri as i64 * o_in_strides[2]) as usize
    };
    let lse_in_index = |si: usize, hi: usize, ri: usize| {
        lse_in_base
            + (si as i64 * lse_in_strides[0] + hi as i64 * lse_in_strides[1] + ri as i64 * lse_in_strides[2]) as usize
    };
    for si in 0..s {
        for hi in 0..h {
            for ri in 0..r {
                let stored = match case.base {
                    LseBase::Natural => lse[si][hi][ri] as f32,
                    LseBase::Base2 => (lse[si][hi][ri] / std::f64::consts::LN_2) as f32,
                };
                let at = lse_in_index(si, hi, ri) * 4;
                lse_in.host[at..at + 4].copy_from_slice(&stored.to_le_bytes());
                // The reference reads what the kernel reads.
                lse[si][hi][ri] = match case.base {
                    LseBase::Natural => stored as f64,
                    LseBase::Base2 => stored as f64 * std::f64::consts::LN_2,
                };
                for (c, &x) in o[si][hi][ri].iter().enumerate() {
                    let at = (o_in_index(si, hi, ri) + c) * ib;
                    o_in.host[at..at + ib].copy_from_slice(&encode(case.in_dtype, x));
                }
            }
        }
    }

    // Expected results, from the states as stored.
    let (mut expected_o, mut expected_lse, mut scale_o) = (Vec::new(), Vec::new(), Vec::new());
    for ri in 0..r {
        for hi in 0..h {
            let lses: Vec<f64> = (0..s).map(|si| lse[si][hi][ri]).collect();
            let rows: Vec<Vec<f64>> = (0..s).map(|si| o[si][hi][ri].clone()).collect();
            let (eo, el) = merge_f64(&lses, &rows, d);
            expected_o.push(eo);
            expected_lse.push(match case.base {
                LseBase::Natural => el,
                LseBase::Base2 => el / std::f64::consts::LN_2,
            });
            let finite = rows.iter().zip(&lses).filter(|(_, l)| l.is_finite());
            scale_o.push(finite.flat_map(|(row, _)| row.iter().map(|x| x.abs())).fold(0.0, f64::max));
        }
    }

    let mut buffers = Vec::new();
    let (o_out_tensor, lse_out_tensor, o_out_at, lse_out_at);
    let tensor = |b: &Buffer, base: usize, bytes: usize, batch: i64, head: i64, row: i64| fmha_tensor {
        data: b.at(base, bytes),
        batch_stride: batch,
        head_stride: head,
        row_stride: row,
    };
    let o_in_tensor = tensor(&o_in, o_in_base, ib, o_in_strides[0], o_in_strides[1], o_in_strides[2]);
    let lse_in_tensor = tensor(&lse_in, lse_in_base, 4, lse_in_strides[0], lse_in_strides[1], lse_in_strides[2]);
    if case.in_place {
        o_out_tensor = fmha_tensor { batch_stride: 0, ..o_in_tensor };
        lse_out_tensor = fmha_tensor { batch_stride: 0, ..lse_in_tensor };
        o_out_at = (0..r * h).map(|i| (0, o_in_index(0, i % h, i / h))).collect::<Vec<_>>();
        lse_out_at = (0..r * h).map(|i| (1, lse_in_index(0, i % h, i / h))).collect::<Vec<_>>();
        buffers.push(o_in);
        buffers.push(lse_in);
    } else {
        let (o_strides, o_span) = random_strides(rng, &[h, r], d, case.padded);
        let (l_strides, l_span) = random_strides(rng, &[h, r], 1, case.padded);
        let (o_base, l_base) = (base_offset(rng), base_offset(rng));
        let mut o_out = Buffer::new((o_base + o_span) * ob);
        let mut lse_out = Buffer::new((l_base + l_span) * 4);
        for x in o_out.host.chunks_exact_mut(ob) {
            x.copy_from_slice(&encode(case.out_dtype, f64::NAN));
        }
        for x in lse_out.host.chunks_exact_mut(4) {
            x.copy_from_slice(&f32::NAN.to_le_bytes());
        }
        // A batch stride that would be wrong if it were used.
        o_out_tensor = tensor(&o_out, o_base, ob, -7, o_strides[0], o_strides[1]);
        lse_out_tensor = tensor(&lse_out, l_base, 4, -7, l_strides[0], l_strides[1]);
        let o_index = |i: usize| o_base + ((i % h) as i64 * o_strides[0] + (i / h) as i64 * o_strides[1]) as usize;
        let l_index = |i: usize| l_base + ((i % h) as i64 * l_strides[0] + (i / h) as i64 * l_strides[1]) as usize;
        o_out_at = (0..r * h).map(|i| (2, o_index(i))).collect();
        lse_out_at = (0..r * h).map(|i| (3, l_index(i))).collect();
        buffers.extend([o_in, lse_in, o_out, lse_out]);
    }
    for b in &buffers {
        b.upload();
    }
    let untouched = buffers.iter().map(|b| b.host.clone()).collect();
    let args = fmha_merge_args {
        struct_size: std::mem::size_of::<fmha_merge_args>(),
        num_states: s as i32,
        num_rows: r as i32,
        nhead: h as i32,
        hdim: d as i32,
        in_dtype: case.in_dtype as i32,
        out_dtype: case.out_dtype as i32,
        lse_base: case.base as i32,
        o_in: o_in_tensor,
        lse_in: lse_in_tensor,
        o_out: o_out_tensor,
        lse_out: if case.write_lse { lse_out_tensor } else { fmha_tensor { data: null_mut(), ..lse_out_tensor } },
    };
    Prepared { args, buffers, o_out_at, lse_out_at, expected_o, expected_lse, scale_o, untouched }
}

/// Runs a prepared merge and checks every output and every untouched byte. Returns the buffers' bytes.
fn run_and_check(case: &MergeCase, p: &Prepared, ctx: &str) -> Vec<Vec<u8>> {
    let status = fmha_merge_attention_states(&p.args, null_mut());
    assert_eq!(status, FMHA_OK, "{ctx}: {}", last_error());
    ok(fmha_stream_synchronize(null_mut()));
    let after: Vec<Vec<u8>> = p.buffers.iter().map(Buffer::download).collect();
    let mut expected_bytes = p.untouched.clone();
    let (ob, d) = (case.out_dtype.bytes(), case.d);
    let fp32_error = 2f64.powi(-24) * 8.0 * (case.states as f64 + 2.0);
    for i in 0..case.rows * case.heads {
        let (buffer, at) = p.o_out_at[i];
        for c in 0..d {
            let bytes = &after[buffer][(at + c) * ob..(at + c + 1) * ob];
            let (got, want) = (decode(case.out_dtype, bytes), p.expected_o[i][c]);
            // One rounding to the output type plus the fp32 arithmetic (weights, sums) of the rule.
            let tolerance = epsilon(case.out_dtype) * want.abs() + fp32_error * p.scale_o[i];
            let good = if want.is_nan() { got.is_nan() } else { (got - want).abs() <= tolerance };
            assert!(
                good,
                "{ctx}: O (row {}, head {}, column {c}) = {got:e}, expected {want:e}",
                i / case.heads,
                i % case.heads
            );
            expected_bytes[buffer][(at + c) * ob..(at + c + 1) * ob].copy_from_slice(bytes);
        }
        if case.write_lse {
            let (buffer, at) = p.lse_out_at[i];
            let bytes = &after[buffer][at * 4..at * 4 + 4];
            let (got, want) = (f32::from_le_bytes(bytes.try_into().unwrap()) as f64, p.expected_lse[i]);
            let tolerance = fp32_error * (want.abs() + case.states as f64 + 1.0);
            let good = if want.is_nan() {
                got.is_nan()
            } else if want.is_infinite() {
                got == want
            } else {
                (got - want).abs() <= tolerance
            };
            assert!(good, "{ctx}: LSE (row {}, head {}) = {got:e}, expected {want:e}", i / case.heads, i % case.heads);
            expected_bytes[buffer][at * 4..at * 4 + 4].copy_from_slice(bytes);
        }
    }
    for (b, (got, want)) in after.iter().zip(&expected_bytes).enumerate() {
        if let Some(at) = got.iter().zip(want).position(|(x, y)| x != y) {
            panic!("{ctx}: buffer {b} byte {at} changed though no output element is there");
        }
    }
    after
}

fn random_case(rng: &mut Rng) -> MergeCase {
    let in_dtype = rng.pick(&DTYPES);
    let states = if rng.range(0, 9) == 0 { 0 } else { rng.size(1, 8) };
    let in_place = states > 0 && rng.range(0, 4) == 0;
    MergeCase {
        states,
        rows: rng.size(1, 9),
        heads: rng.size(1, 4),
        d: rng.pick(&[1, 3, 4, 8, 16, 40, 64, 128, 136]),
        in_dtype,
        out_dtype: if in_place { in_dtype } else { rng.pick(&DTYPES) },
        base: rng.pick(&[LseBase::Natural, LseBase::Base2]),
        write_lse: rng.range(0, 4) != 0,
        in_place,
        padded: rng.range(0, 2) == 0,
    }
}

#[test]
fn random_states_match_the_float64_merge() {
    if no_device() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for index in 0..200 {
        let case = random_case(&mut rng);
        let ctx = format!("seed {seed} case {index}: {case:?}");
        let prepared = prepare(&case, &mut rng);
        run_and_check(&case, &prepared, &ctx);
    }
}

/// Every pair of element types, both bases, in place and not, on the vector and element paths.
#[test]
fn every_type_pair_and_base() {
    if no_device() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for in_dtype in DTYPES {
        for out_dtype in DTYPES {
            for base in [LseBase::Natural, LseBase::Base2] {
                for padded in [false, true] {
                    let case = MergeCase {
                        states: 8,
                        rows: 5,
                        heads: 3,
                        d: 128,
                        in_dtype,
                        out_dtype,
                        base,
                        write_lse: true,
                        in_place: in_dtype == out_dtype && !padded,
                        padded,
                    };
                    let ctx = format!("seed {seed}: {case:?}");
                    run_and_check(&case, &prepare(&case, &mut rng), &ctx);
                }
            }
        }
    }
}

/// Repeated runs give the same bits (outputs poisoned again before each).
#[test]
fn repeated_merges_are_bitwise_identical() {
    if no_device() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    let case = MergeCase {
        states: 7,
        rows: 33,
        heads: 4,
        d: 64,
        in_dtype: StateDtype::F32,
        out_dtype: StateDtype::Bf16,
        base: LseBase::Natural,
        write_lse: true,
        in_place: false,
        padded: false,
    };
    let prepared = prepare(&case, &mut rng);
    let first = run_and_check(&case, &prepared, &format!("seed {seed}"));
    for run in 0..3 {
        for b in &prepared.buffers {
            b.upload();
        }
        let again = run_and_check(&case, &prepared, &format!("seed {seed} run {run}"));
        assert!(again == first, "seed {seed}: run {run} differs from the first");
    }
}

/// Attention over all keys equals the merge of attention over the two halves of the keys (the rule of
/// ring/context parallelism), within the field's error rule: at most 2× the error of the same
/// computation in the input precision (the halves' forwards in low precision, rounded, then merged)
/// plus a rounding floor.
#[test]
fn merging_two_halves_gives_the_whole() {
    if no_device() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for index in 0..8 {
        let dtype = if index % 2 == 0 { Dtype::Bf16 } else { Dtype::F16 };
        let (hq, hk) = rng.pick(&[(4, 2), (2, 2), (4, 1)]);
        let d = rng.pick(&[64, 128]);
        let (sq, sk) = (rng.size(1, 40), rng.size(2, 200));
        let split = rng.size(1, sk - 1);
        let case = Case::batch_mode(dtype, 1, hq, hk, (sq, sk), (d, d), Mask::NONE);
        if !common::attention::forward_supported(&case) {
            continue;
        }
        let ctx = format!("seed {seed} case {index}: {} split at {split}", case.name());
        let inputs = Inputs::random(&case, &mut rng);
        let whole = Buffers::new(&case, &inputs, &mut rng);
        // Two forwards over keys [0, split) and [split, sk) into states 0 and 1 of one O and one LSE.
        let (o_states, lse_states) = (Buffer::new(2 * sq * hq * d * 2), Buffer::new(2 * hq * sq * 4));
        let traits = Buffers::fwd_traits(&case);
        let row = whole.k.tensor.row_stride;
        for (state, (first, keys)) in [(0, split), (split, sk - split)].into_iter().enumerate() {
            let offset =
                |t: fmha_tensor| fmha_tensor { data: (t.data as usize + first * row as usize * 2) as *mut _, ..t };
            let o = fmha_tensor { data: o_states.at(state * sq * hq * d, 2), ..whole.o.tensor };
            let lse = fmha_tensor { data: lse_states.at(state * hq * sq, 4), ..whole.lse.tensor };
            let args = whole.fwd_args(&case);
            let args = fmha::ffi::attention::fmha_fwd_args {
                k: offset(args.k),
                v: offset(args.v),
                o,
                lse,
                seqlen_k: keys as i32,
                max_seqlen_k: keys as i32,
                ..args
            };
            assert_eq!(fmha_fwd(&traits, &args, null_mut()), FMHA_OK, "{ctx}: {}", last_error());
        }
        // Merged into the whole forward's (poisoned) O and LSE: [sq][hq][d] rows, [hq][sq] LSEs.
        let poison =
            |b: &common::attention::DeviceTensor, byte| ok(fmha_memset(b.ptr, byte, b.elements * b.element_bytes));
        poison(&whole.o, 0xFF);
        poison(&whole.lse, 0xFF);
        let dtype_code = if dtype == Dtype::Bf16 { StateDtype::Bf16 } else { StateDtype::F16 } as i32;
        let merge = fmha_merge_args {
            struct_size: std::mem::size_of::<fmha_merge_args>(),
            num_states: 2,
            num_rows: sq as i32,
            nhead: hq as i32,
            hdim: d as i32,
            in_dtype: dtype_code,
            out_dtype: dtype_code,
            lse_base: FMHA_LSE_NATURAL,
            o_in: fmha_tensor { data: o_states.ptr, batch_stride: (sq * hq * d) as i64, ..whole.o.tensor },
            lse_in: fmha_tensor { data: lse_states.ptr, batch_stride: (hq * sq) as i64, ..whole.lse.tensor },
            o_out: whole.o.tensor,
            lse_out: whole.lse.tensor,
        };
        ok(fmha_merge_attention_states(&merge, null_mut()));
        ok(fmha_stream_synchronize(null_mut()));
        let merged_o = common::attention::download_dense(&case, &whole.o, hq, d);
        let merged_lse = common::attention::download_lse(&case, &whole.lse);

        // References: float64 over all keys; the same computation in low precision.
        let problem = case.reference();
        let exact = problem.forward(0, &inputs.q[0], &inputs.k[0], &inputs.v[0], Precision::F64).unwrap();
        let halves: Vec<_> = [(0, split), (split, sk)]
            .iter()
            .map(|&(a, b)| {
                let cut = |x: &[f64], dim: usize| -> Vec<f64> {
                    (0..hk).flat_map(|g| x[(g * sk + a) * dim..(g * sk + b) * dim].to_vec()).collect()
                };
                let half = fmha::reference::RefProblem { seqlens: vec![(sq, b - a)], ..problem.clone() };
                let k = cut(&inputs.k[0], d);
                let v = cut(&inputs.v[0], d);
                half.forward(0, &inputs.q[0], &k, &v, Precision::LowPrecision(dtype)).unwrap()
            })
            .collect();
        let mut low_o = Vec::new();
        let mut low_lse = Vec::new();
        for i in 0..hq * sq {
            let lses = [halves[0].lse[i] as f32 as f64, halves[1].lse[i] as f32 as f64];
            let rows = [halves[0].o[i * d..(i + 1) * d].to_vec(), halves[1].o[i * d..(i + 1) * d].to_vec()];
            let (o, lse) = merge_f64(&lses, &rows, d);
            low_o.extend(o.into_iter().map(|x| dtype.round_f64(x)));
            low_lse.push(lse);
        }
        let eps = common::attention::epsilon(dtype);
        let exact_o = vec![exact.o.clone()];
        common::attention::check_rule(
            &case,
            &format!("{ctx}: merged O"),
            &merged_o,
            &exact_o,
            &vec![low_o],
            2.0,
            common::attention::rounding_floor(&exact_o, eps),
        );
        let exact_lse = vec![exact.lse.clone()];
        let lse_floor =
            common::attention::rounding_floor(&exact_lse, 2f64.powi(-20)) + 4.0 * 2f64.powi(-22) * (sk as f64).sqrt();
        common::attention::check_rule(
            &case,
            &format!("{ctx}: merged LSE"),
            &merged_lse,
            &exact_lse,
            &vec![low_lse],
            2.0,
            lse_floor,
        );
    }
}

/// Every bad argument is refused with its status and a message naming the field; nothing is queued.
#[test]
fn bad_arguments_are_refused_naming_the_field() {
    if no_device() {
        // No device memory to describe: the argument struct alone is checked, then the device.
        expect_error(fmha_merge_attention_states(std::ptr::null(), null_mut()), FMHA_ERR_NULL_POINTER, &["args"]);
        return;
    }
    let mut rng = Rng::fresh();
    let case = MergeCase {
        states: 3,
        rows: 4,
        heads: 2,
        d: 16,
        in_dtype: StateDtype::Bf16,
        out_dtype: StateDtype::Bf16,
        base: LseBase::Natural,
        write_lse: true,
        in_place: false,
        padded: false,
    };
    let p = prepare(&case, &mut rng);
    let a = p.args;
    let run = |args: fmha_merge_args| fmha_merge_attention_states(&args, null_mut());
    const INVALID: fmha_status = FMHA_ERR_INVALID_ARGUMENT;
    expect_error(fmha_merge_attention_states(std::ptr::null(), null_mut()), FMHA_ERR_NULL_POINTER, &["args"]);
    let size = std::mem::size_of::<fmha_merge_args>();
    for struct_size in [0, 8, size - 8, size + 8] {
        expect_error(run(fmha_merge_args { struct_size, ..a }), INVALID, &["args", "struct_size"]);
    }
    // Counts and enumerations.
    expect_error(run(fmha_merge_args { num_states: -1, ..a }), INVALID, &["num_states", "-1"]);
    expect_error(run(fmha_merge_args { num_rows: -2, ..a }), INVALID, &["num_rows"]);
    expect_error(run(fmha_merge_args { nhead: -1, ..a }), INVALID, &["nhead"]);
    expect_error(run(fmha_merge_args { hdim: 0, ..a }), INVALID, &["hdim"]);
    expect_error(run(fmha_merge_args { in_dtype: 3, ..a }), INVALID, &["in_dtype", "fp32"]);
    expect_error(run(fmha_merge_args { out_dtype: -1, ..a }), INVALID, &["out_dtype"]);
    expect_error(run(fmha_merge_args { lse_base: 2, ..a }), INVALID, &["lse_base", "base2"]);
    // Pointers, strides, extents.
    let with = |t: fmha_tensor, data: *mut c_void| fmha_tensor { data, ..t };
    expect_error(run(fmha_merge_args { o_in: with(a.o_in, null_mut()), ..a }), FMHA_ERR_NULL_POINTER, &["o_in.data"]);
    expect_error(
        run(fmha_merge_args { lse_in: with(a.lse_in, null_mut()), ..a }),
        FMHA_ERR_NULL_POINTER,
        &["lse_in.data"],
    );
    expect_error(
        run(fmha_merge_args { o_out: with(a.o_out, null_mut()), ..a }),
        FMHA_ERR_NULL_POINTER,
        &["o_out.data"],
    );
    let odd = |t: fmha_tensor| with(t, (t.data as usize + 1) as *mut c_void);
    expect_error(run(fmha_merge_args { o_in: odd(a.o_in), ..a }), INVALID, &["o_in.data", "aligned"]);
    expect_error(run(fmha_merge_args { lse_out: odd(a.lse_out), ..a }), INVALID, &["lse_out.data", "aligned"]);
    expect_error(
        run(fmha_merge_args { o_in: fmha_tensor { batch_stride: -1, ..a.o_in }, ..a }),
        INVALID,
        &["o_in.batch_stride", "negative"],
    );
    expect_error(
        run(fmha_merge_args { lse_in: fmha_tensor { row_stride: -3, ..a.lse_in }, ..a }),
        INVALID,
        &["lse_in.row_stride"],
    );
    expect_error(
        run(fmha_merge_args { o_out: fmha_tensor { head_stride: -1, ..a.o_out }, ..a }),
        INVALID,
        &["o_out.head_stride"],
    );
    expect_error(
        run(fmha_merge_args { o_in: fmha_tensor { head_stride: 1 << 62, ..a.o_in }, ..a }),
        INVALID,
        &["o_in", "2^63"],
    );
    let top = (usize::MAX - 31) as *mut c_void; // 32 bytes below the top: the LSEs span 96
    expect_error(run(fmha_merge_args { lse_in: with(a.lse_in, top), ..a }), INVALID, &["lse_in", "address space"]);
    // Overlaps: outputs share nothing but (exactly) state 0.
    let state = |t: fmha_tensor, s: usize, bytes: usize| fmha_tensor {
        data: (t.data as usize + s * t.batch_stride as usize * bytes) as *mut c_void,
        batch_stride: 0,
        ..t
    };
    expect_error(run(fmha_merge_args { o_out: state(a.o_in, 1, 2), ..a }), INVALID, &["o_out", "o_in"]);
    expect_error(run(fmha_merge_args { lse_out: state(a.lse_in, 2, 4), ..a }), INVALID, &["lse_out", "lse_in"]);
    let skewed = fmha_tensor { row_stride: a.o_in.row_stride + 1, ..state(a.o_in, 0, 2) };
    // (Refused as overlapping o_in, or itself when the skew makes rows of two heads meet.)
    expect_error(run(fmha_merge_args { o_out: skewed, ..a }), INVALID, &["o_out"]);
    let other_type = fmha_merge_args { o_out: state(a.o_in, 0, 2), out_dtype: FMHA_DTYPE_FP16_CODE, ..a };
    expect_error(run(other_type), INVALID, &["o_out", "o_in"]);
    let broadcast_states =
        fmha_merge_args { o_in: fmha_tensor { batch_stride: 0, ..a.o_in }, o_out: state(a.o_in, 0, 2), ..a };
    expect_error(run(broadcast_states), INVALID, &["o_out", "o_in"]);
    expect_error(run(fmha_merge_args { lse_out: with(a.lse_out, a.o_out.data), ..a }), INVALID, &["o_out", "lse_out"]);
    expect_error(run(fmha_merge_args { o_out: with(a.o_out, a.lse_in.data), ..a }), INVALID, &["o_out", "lse_in"]);
    expect_error(
        run(fmha_merge_args { o_out: fmha_tensor { row_stride: 0, ..a.o_out }, ..a }),
        INVALID,
        &["o_out", "same memory"],
    );
    // Nothing was queued; the arguments as they were still work, in place too.
    run_and_check(&case, &p, "the valid arguments");
    let in_place = MergeCase { in_place: true, ..case };
    run_and_check(&in_place, &prepare(&in_place, &mut rng), "in place");
}

const FMHA_DTYPE_FP16_CODE: i32 = StateDtype::F16 as i32;
