//! The dense forward with fp8 e4m3 inputs (spec/inference.md §2.6) through the C ABI: both formats on
//! the host backend (the device's own format on a GPU, the other refused naming `dtype`), descales
//! per tensor and per (sequence, kv head), masks, GQA, batch and group mode with padding rows; O
//! (bf16) and the LSE against the float64 reference on the dequantised inputs with the fp8 rule of
//! the kv-cache tests; fresh random codes, NaN-poisoned outputs; bad arguments refused naming their
//! field.

mod common;

use common::attention::{download_lse, poison_32, Buffers, Case, DeviceTensor, Inputs, Layout, Rng};
use common::{abs_dot_max, expect_error, fp8_accumulation, fp8_output_rule, host_backend, last_error, no_device, ok};
use fmha::ffi::attention::*;
use fmha::ffi::backward::*;
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::problem::fp8::Fp8Format;
use fmha::problem::mask::{Mask, MaskType};
use fmha::problem::{CacheDtype, Dtype};
use fmha::reference::Precision;
use std::ffi::c_void;
use std::ptr::null_mut;

const FORMATS: [Fp8Format; 2] = [Fp8Format::E4m3fn, Fp8Format::E4m3fnuz];

fn abi(format: Fp8Format) -> i32 {
    match format {
        Fp8Format::E4m3fn => FMHA_DTYPE_FP8_E4M3FN,
        Fp8Format::E4m3fnuz => FMHA_DTYPE_FP8_E4M3FNUZ,
    }
}

/// What the descales vary over.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scales {
    Tensor,
    SequenceHead,
}

/// Device fp32 arrays of one call, freed on drop.
#[derive(Default)]
struct Floats(Vec<*mut c_void>);

impl Floats {
    fn upload(&mut self, values: &[f32]) -> *const f32 {
        let mut ptr = null_mut();
        ok(fmha_device_malloc(&mut ptr, values.len() * 4));
        ok(fmha_memcpy(ptr, values.as_ptr().cast(), values.len() * 4, FMHA_MEMCPY_HOST_TO_DEVICE));
        self.0.push(ptr);
        ptr.cast()
    }
}

impl Drop for Floats {
    fn drop(&mut self) {
        for &ptr in &self.0 {
            fmha_device_free(ptr);
        }
    }
}

/// One tensor of random codes (every element, padding rows included) and its logical rows' decoded
/// values per batch, `[head][row][dim]`.
fn random_codes(
    case: &Case,
    format: Fp8Format,
    heads: usize,
    dim: usize,
    k_side: bool,
    rng: &mut Rng,
) -> (DeviceTensor, Vec<Vec<f64>>) {
    let t = DeviceTensor::new(case, heads, dim, k_side, 1);
    let codes: Vec<u8> = (0..t.elements).map(|_| format.encode((rng.unit() * 2.0) as f32)).collect();
    t.upload(&codes);
    let values = (0..case.seqlens.len())
        .map(|b| {
            let rows = if k_side { case.seqlens[b].1 } else { case.seqlens[b].0 };
            let mut out = vec![0.0; heads * rows * dim];
            for h in 0..heads {
                for r in 0..rows {
                    for e in 0..dim {
                        out[(h * rows + r) * dim + e] =
                            f64::from(format.decode(codes[t.index(case, b, h, r, e, k_side)]));
                    }
                }
            }
            out
        })
        .collect();
    (t, values)
}

/// A call's descales: the device struct and the value of each (sequence, kv head).
fn random_scales(
    scales: Scales,
    batch: usize,
    hk: usize,
    floats: &mut Floats,
    rng: &mut Rng,
) -> (fmha_scale, Vec<f64>) {
    // Positive, as the ABI requires: [0.5, 2).
    let mut draw = || (1.25 + 0.75 * rng.unit()) as f32;
    match scales {
        Scales::Tensor => {
            let value = draw();
            let scale = fmha_scale { data: floats.upload(&[value]), ..fmha_scale::default() };
            (scale, vec![f64::from(value); batch * hk])
        }
        Scales::SequenceHead => {
            let values: Vec<f32> = (0..batch * hk).map(|_| draw()).collect();
            let scale =
                fmha_scale { data: floats.upload(&values), batch_stride: hk as i64, head_stride: 1, page_stride: 0 };
            (scale, values.iter().map(|&v| f64::from(v)).collect())
        }
    }
}

/// Whether this build has a forward kernel for `format` and the case's head dims; a GPU build refuses
/// a format its device has no kernel for, naming `dtype` (checked by the caller).
fn has_kernel(case: &Case, format: Fp8Format) -> bool {
    let Ok(rt) = fmha::runtime::current() else { return false };
    let request = fmha::registry::Request {
        operation: fmha::registry::Operation::Forward,
        dtype: CacheDtype::Fp8(format),
        hdim_q: case.hdim_q as i64,
        hdim_v: case.hdim_v as i64,
        masked: case.mask.kind != MaskType::None,
        deterministic: false,
        packed_gqa: false,
    };
    fmha::registry::select(rt.arch().unwrap(), &request).is_ok()
}

/// Whether any forward kernel of this build takes `format` (else the call is refused naming `dtype`).
fn format_served(format: Fp8Format) -> bool {
    host_backend() || format == Fp8Format::E4m3fn && fmha::runtime::ACTIVE_BACKEND == fmha::runtime::BackendKind::Cuda
}

fn check(case: &Case, format: Fp8Format, scales: Scales, rng: &mut Rng) {
    let ctx = format!("{format:?} {scales:?} descales, {}", case.name());
    let (hq, hk, dq, dv) = (case.nhead_q, case.nhead_k, case.hdim_q, case.hdim_v);
    let (q, q_vals) = random_codes(case, format, hq, dq, false, rng);
    let (k, k_vals) = random_codes(case, format, hk, dq, true, rng);
    let (v, v_vals) = random_codes(case, format, hk, dv, true, rng);
    let o = DeviceTensor::new(case, hq, dv, false, 2);
    o.upload(&vec![0xFFu8; o.elements * 2]); // NaN in bf16
    let buffers = Buffers::with_tensors(case, q, k, v, o);
    poison_32(&buffers.lse);
    let batch = case.seqlens.len();
    let mut floats = Floats::default();
    let (q_descale, dq_of) = random_scales(scales, batch, hk, &mut floats, rng);
    let (k_descale, dk_of) = random_scales(scales, batch, hk, &mut floats, rng);
    let (v_descale, dv_of) = random_scales(scales, batch, hk, &mut floats, rng);
    let traits = fmha_fwd_traits { dtype: abi(format), o_dtype: FMHA_DTYPE_BF16, ..Buffers::fwd_traits(case) };
    let args = fmha_fwd_args { q_descale, k_descale, v_descale, ..buffers.fwd_args(case) };

    if !format_served(format) {
        expect_error(fmha_fwd(&traits, &args, null_mut()), FMHA_ERR_UNSUPPORTED, &["dtype", "fwd"]);
        return;
    }
    if !has_kernel(case, format) {
        eprintln!("skipped (no fwd kernel in this build): {ctx}");
        return;
    }
    let status = fmha_fwd(&traits, &args, null_mut());
    assert_eq!(status, FMHA_OK, "{ctx}: {}", last_error());
    ok(fmha_stream_synchronize(null_mut()));
    let o_bytes = buffers.o.download();
    let lse = download_lse(case, &buffers.lse);

    let problem = case.reference();
    let group = hq / hk;
    let (mut err_max, mut base_max, mut err_sum, mut base_sum, mut count) = (0f64, 0f64, 0f64, 0f64, 0usize);
    for b in 0..batch {
        let (sq, sk) = case.seqlens[b];
        let dequantised = |values: &[f64], rows: usize, dim: usize, heads: usize, scale: &[f64], per_q_head: bool| {
            let mut out = values.to_vec();
            for h in 0..heads {
                let g = if per_q_head { h / group } else { h };
                out[h * rows * dim..(h + 1) * rows * dim].iter_mut().for_each(|x| *x *= scale[b * hk + g]);
            }
            out
        };
        let qd = dequantised(&q_vals[b], sq, dq, hq, &dq_of, true);
        let kd = dequantised(&k_vals[b], sk, dq, hk, &dk_of, false);
        let vd = dequantised(&v_vals[b], sk, dv, hk, &dv_of, false);
        let exact = problem.forward(b, &qd, &kd, &vd, Precision::F64).unwrap();
        let low = problem.forward(b, &qd, &kd, &vd, Precision::Fp8(format)).unwrap();
        for h in 0..hq {
            for i in 0..sq {
                for e in 0..dv {
                    let at = 2 * buffers.o.index(case, b, h, i, e, false);
                    let got = half::bf16::from_le_bytes([o_bytes[at], o_bytes[at + 1]]).to_f64();
                    let want = exact.o[(h * sq + i) * dv + e];
                    let (err, base) = ((got - want).abs(), (low.o[(h * sq + i) * dv + e] - want).abs());
                    assert!(!err.is_nan(), "{ctx}: batch {b} head {h} row {i}: NaN (unwritten or poisoned input read)");
                    (err_max, base_max, err_sum, base_sum, count) =
                        (err_max.max(err), base_max.max(base), err_sum + err, base_sum + base, count + 1);
                }
                let (got, want) = (lse[b][h * sq + i], exact.lse[h * sq + i]);
                let lse_err = if got == want { 0.0 } else { (got - want).abs() };
                let allowed = 1e-4 * (1.0 + want.abs())
                    + fp8_accumulation(dq, problem.scale * abs_dot_max(&qd, &kd, h, i, (hq, hk, sq, sk, dq)));
                assert!(lse_err <= allowed, "{ctx}: batch {b} head {h} row {i}: LSE {got} vs {want}");
            }
        }
    }
    fp8_output_rule(&ctx, (err_max, base_max), (err_sum, base_sum), count);
}

fn masks() -> Vec<Mask> {
    vec![
        Mask::NONE,
        Mask::causal(MaskType::TopLeft),
        Mask::causal(MaskType::BottomRight),
        Mask { kind: MaskType::TopLeft, left: 128, right: 30 },
        Mask { kind: MaskType::BottomRight, left: 4, right: 35 },
    ]
}

#[test]
fn batch_mode_formats_descales_masks_and_gqa() {
    if no_device() {
        return;
    }
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    for format in FORMATS {
        for (i, mask) in masks().into_iter().enumerate() {
            let d = [64, 128][i % 2];
            let mut case = Case::batch_mode(Dtype::Bf16, 2, 4, [4, 2, 1][i % 3], (97, 181), (d, d), mask);
            case.layout = if i % 2 == 0 { Layout::Bshd } else { Layout::Bhsd };
            let scales = if i % 2 == 0 { Scales::SequenceHead } else { Scales::Tensor };
            check(&case, format, scales, &mut rng);
        }
    }
}

#[test]
fn head_dims_including_unequal_q_and_v() {
    if no_device() {
        return;
    }
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    // GPU kernels take head dims in multiples of 16 bytes (fp8: 16 elements) up to their bucket; the
    // host backend takes any.
    let dims: &[(usize, usize)] =
        if host_backend() { &[(16, 16), (40, 88), (128, 64), (256, 256)] } else { &[(16, 16), (96, 96), (128, 64)] };
    for &(dq, dv) in dims {
        let case = Case::batch_mode(Dtype::Bf16, 1, 2, 1, (70, 131), (dq, dv), Mask::causal(MaskType::BottomRight));
        check(&case, Fp8Format::E4m3fn, Scales::SequenceHead, &mut rng);
    }
}

#[test]
fn group_mode_with_zero_lengths_and_padding() {
    if no_device() {
        return;
    }
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    for format in FORMATS {
        for mask in masks() {
            let mut case = Case::batch_mode(Dtype::Bf16, 5, 6, 2, (0, 0), (128, 128), mask);
            case.group = true;
            case.seqlens = vec![(0, 40), (33, 0), (129, 77), (1, 1), (64, 300)];
            case.padding = vec![(3, 0), (0, 5), (7, 1), (0, 0), (0, 64)];
            check(&case, format, Scales::SequenceHead, &mut rng);
        }
    }
}

/// Longer sequences on a GPU: many q and k tiles.
#[test]
fn long_sequences() {
    if no_device() || host_backend() {
        return;
    }
    let mut rng = Rng::fresh();
    eprintln!("seed {}", rng.0);
    for (sq, sk) in [(1, 1), (17, 4096), (1000, 1000), (4096, 127), (129, 4096)] {
        for (i, mask) in masks().into_iter().enumerate() {
            let case = Case::batch_mode(Dtype::Bf16, 1, 2, 1, (sq, sk), (128, 128), mask);
            check(&case, Fp8Format::E4m3fn, [Scales::Tensor, Scales::SequenceHead][i % 2], &mut rng);
        }
    }
}

/// The device's fp8 format on a small valid call, for the refusal tests.
fn native_format() -> Fp8Format {
    if format_served(Fp8Format::E4m3fn) {
        Fp8Format::E4m3fn
    } else {
        Fp8Format::E4m3fnuz
    }
}

#[test]
fn bad_arguments_are_refused_naming_the_field() {
    if no_device() {
        return;
    }
    let mut rng = Rng::fresh();
    let case = Case::batch_mode(Dtype::Bf16, 2, 4, 2, (8, 8), (64, 64), Mask::NONE);
    let format = native_format();
    let (q, _) = random_codes(&case, format, 4, 64, false, &mut rng);
    let (k, _) = random_codes(&case, format, 2, 64, true, &mut rng);
    let (v, _) = random_codes(&case, format, 2, 64, true, &mut rng);
    let o = DeviceTensor::new(&case, 4, 64, false, 2);
    let buffers = Buffers::with_tensors(&case, q, k, v, o);
    let mut floats = Floats::default();
    let (descale, _) = random_scales(Scales::SequenceHead, 2, 2, &mut floats, &mut rng);
    let traits = fmha_fwd_traits { dtype: abi(format), o_dtype: FMHA_DTYPE_BF16, ..Buffers::fwd_traits(&case) };
    let args = fmha_fwd_args { q_descale: descale, k_descale: descale, v_descale: descale, ..buffers.fwd_args(&case) };
    let run = |traits: fmha_fwd_traits, args: fmha_fwd_args| fmha_fwd(&traits, &args, null_mut());
    if format_served(format) {
        ok(run(traits, args));
        ok(fmha_stream_synchronize(null_mut()));
    }

    // o_dtype: bf16 only (fp32 reserved; anything else invalid).
    expect_error(
        run(fmha_fwd_traits { o_dtype: FMHA_DTYPE_FP16, ..traits }, args),
        FMHA_ERR_INVALID_ARGUMENT,
        &["o_dtype"],
    );
    expect_error(run(fmha_fwd_traits { o_dtype: 2, ..traits }, args), FMHA_ERR_UNSUPPORTED, &["o_dtype", "fp32"]);
    expect_error(run(fmha_fwd_traits { o_dtype: 99, ..traits }, args), FMHA_ERR_INVALID_ARGUMENT, &["o_dtype"]);
    // The dense forward has no pages.
    let paged = fmha_scale { page_stride: 1, ..descale };
    expect_error(
        run(traits, fmha_fwd_args { k_descale: paged, ..args }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["k_descale.page_stride"],
    );
    expect_error(
        run(traits, fmha_fwd_args { v_descale: paged, ..args }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["v_descale.page_stride"],
    );
    let negative = fmha_scale { head_stride: -1, ..descale };
    expect_error(
        run(traits, fmha_fwd_args { q_descale: negative, ..args }),
        FMHA_ERR_INVALID_ARGUMENT,
        &["q_descale.head_stride"],
    );
    // Descales are inputs: an output over one is refused (it was accepted, and the run read the
    // descales it was overwriting).
    type Over = fn(fmha_fwd_args, fmha_scale) -> fmha_fwd_args;
    let overs: [(&str, Over); 2] = [
        ("q_descale", |a, over| fmha_fwd_args { q_descale: over, ..a }),
        ("v_descale", |a, over| fmha_fwd_args { v_descale: over, ..a }),
    ];
    for (field, with) in overs {
        let over = fmha_scale { data: args.o.data.cast(), ..descale };
        expect_error(run(traits, with(args, over)), FMHA_ERR_INVALID_ARGUMENT, &["o", field]);
    }
    // Descales belong to fp8 inputs.
    let bf16 = Buffers::new(&case, &Inputs::random(&case, &mut rng), &mut rng);
    let bf16_args = fmha_fwd_args { q_descale: descale, ..bf16.fwd_args(&case) };
    expect_error(run(Buffers::fwd_traits(&case), bf16_args), FMHA_ERR_INVALID_ARGUMENT, &["q_descale.data", "bf16"]);
    // The other format: refused on GPUs without a kernel for it, naming the dtype.
    for other in FORMATS {
        if !format_served(other) {
            expect_error(run(fmha_fwd_traits { dtype: abi(other), ..traits }, args), FMHA_ERR_UNSUPPORTED, &["dtype"]);
        }
    }
    // The backward takes 16-bit inputs.
    let bwd = fmha_bwd_traits {
        struct_size: std::mem::size_of::<fmha_bwd_traits>(),
        dtype: abi(format),
        hdim_q: 64,
        hdim_v: 64,
        batch: 2,
        seqlen_q: 8,
        seqlen_k: 8,
        max_seqlen_q: 8,
        max_seqlen_k: 8,
        nhead_q: 4,
        nhead_k: 2,
        ..zeroed_bwd_traits()
    };
    let mut launcher = null_mut();
    expect_error(fmha_bwd_launcher_create(&bwd, &mut launcher), FMHA_ERR_UNSUPPORTED, &["dtype", "fp8"]);
}

fn zeroed_bwd_traits() -> fmha_bwd_traits {
    // SAFETY: a C struct of integers, for which all-zero bytes are valid (as a C caller's memset).
    unsafe { std::mem::zeroed() }
}

/// A caller built against the first `fmha_fwd_args` (no descale fields) gets descales of 1: the same
/// bits as NULL descales.
#[test]
fn old_struct_size_means_no_descales() {
    if no_device() || !format_served(native_format()) {
        return;
    }
    let mut rng = Rng::fresh();
    let case = Case::batch_mode(Dtype::Bf16, 2, 4, 2, (40, 70), (64, 64), Mask::causal(MaskType::BottomRight));
    let format = native_format();
    let (q, _) = random_codes(&case, format, 4, 64, false, &mut rng);
    let (k, _) = random_codes(&case, format, 2, 64, true, &mut rng);
    let (v, _) = random_codes(&case, format, 2, 64, true, &mut rng);
    let o = DeviceTensor::new(&case, 4, 64, false, 2);
    let buffers = Buffers::with_tensors(&case, q, k, v, o);
    let traits = fmha_fwd_traits { dtype: abi(format), o_dtype: FMHA_DTYPE_BF16, ..Buffers::fwd_traits(&case) };
    let mut floats = Floats::default();
    let (stale, _) = random_scales(Scales::Tensor, 2, 2, &mut floats, &mut rng);
    let mut outputs = Vec::new();
    for struct_size in [std::mem::size_of::<fmha_fwd_args>(), 240] {
        buffers.o.upload(&vec![0xFFu8; buffers.o.elements * 2]);
        // Past an old struct_size the library reads nothing: the stale descales there are ignored.
        let descales = if struct_size == 240 { stale } else { fmha_scale::default() };
        let args = fmha_fwd_args {
            struct_size,
            q_descale: descales,
            k_descale: descales,
            v_descale: descales,
            ..buffers.fwd_args(&case)
        };
        ok(fmha_fwd(&traits, &args, null_mut()));
        ok(fmha_stream_synchronize(null_mut()));
        outputs.push(buffers.o.download());
    }
    assert!(outputs[0].chunks_exact(2).all(|c| c != [0xFF, 0xFF]), "output left unwritten");
    assert_eq!(outputs[0], outputs[1], "struct_size 240 is not the same as NULL descales");
}
