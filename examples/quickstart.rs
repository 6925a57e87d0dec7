//! The main job: a varlen (group mode) causal GQA attention forward and deterministic backward on the
//! build's default backend, entirely through the C ABI, checked against the float64 reference with the
//! field's error rule (kernel error ≤ 2× outputs / 3× gradients the same-precision error + a floor).

use fmha::ffi::attention::*;
use fmha::ffi::backward::*;
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::ffi::version::*;
use fmha::problem::mask::{Mask, MaskType};
use fmha::problem::Dtype;
use fmha::reference::{Precision, RefProblem};
use half::bf16;
use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};
use std::time::Instant;

const NHEAD_Q: usize = 8;
const NHEAD_K: usize = 2;
const HDIM: usize = 64;
/// Per-sequence lengths of the packed batch (q and k equal: causal self-attention).
const SEQLENS: [usize; 4] = [173, 512, 1, 290];

fn check(status: fmha_status, what: &str) {
    if status != FMHA_OK {
        let mut buffer = [0u8; 1024];
        let len = fmha_last_error_message(buffer.as_mut_ptr() as *mut _, buffer.len()).min(1023);
        eprintln!("{what} failed ({status}): {}", String::from_utf8_lossy(&buffer[..len]));
        std::process::exit(1);
    }
}

/// A device buffer of `len` elements of `T`, uploaded from `data` (or poisoned with `fill`).
fn device<T: Copy>(data: &[T]) -> *mut c_void {
    let mut ptr = null_mut();
    check(fmha_device_malloc(&mut ptr, std::mem::size_of_val(data).max(1)), "fmha_device_malloc");
    check(
        fmha_memcpy(ptr, data.as_ptr() as *const c_void, std::mem::size_of_val(data), FMHA_MEMCPY_HOST_TO_DEVICE),
        "upload",
    );
    ptr
}

fn download<T: Copy + Default>(ptr: *mut c_void, len: usize) -> Vec<T> {
    let mut out = vec![T::default(); len];
    check(
        fmha_memcpy(out.as_mut_ptr() as *mut c_void, ptr, std::mem::size_of_val(&out[..]), FMHA_MEMCPY_DEVICE_TO_HOST),
        "download",
    );
    out
}

/// Packed `[total][heads][dim]` tensor descriptor (group mode: no batch stride).
fn thd(data: *mut c_void, heads: usize, dim: usize) -> fmha_tensor {
    fmha_tensor { data, batch_stride: 0, head_stride: dim as i64, row_stride: (heads * dim) as i64 }
}

/// `[heads][total]` fp32 (LSE and D).
fn lse_layout(data: *mut c_void, total: usize) -> fmha_tensor {
    fmha_tensor { data, batch_stride: 0, head_stride: total as i64, row_stride: 1 }
}

struct Rng(u64);
impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn tensor(&mut self, n: usize) -> Vec<bf16> {
        (0..n).map(|_| bf16::from_f32(self.unit())).collect()
    }
}

/// Per-sequence dense `[heads][rows][dim]` f64 copy of a packed tensor (the reference's layout).
fn unpack(packed: &[bf16], starts: &[i32], heads: usize, dim: usize) -> Vec<Vec<f64>> {
    (0..starts.len() - 1)
        .map(|b| {
            let rows = (starts[b + 1] - starts[b]) as usize;
            let mut out = Vec::with_capacity(heads * rows * dim);
            for h in 0..heads {
                for r in 0..rows {
                    let base = ((starts[b] as usize + r) * heads + h) * dim;
                    out.extend(packed[base..base + dim].iter().map(|x| x.to_f64()));
                }
            }
            out
        })
        .collect()
}

fn max_error(kernel: &[Vec<f64>], reference: &[Vec<f64>]) -> f64 {
    kernel
        .iter()
        .flatten()
        .zip(reference.iter().flatten())
        .map(|(a, b)| {
            if a == b {
                0.0
            } else if a.is_finite() {
                (a - b).abs()
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max)
}

fn main() {
    let version = unsafe { CStr::from_ptr(fmha_version()) }.to_string_lossy();
    let backend = match fmha_backend() {
        FMHA_BACKEND_CUDA => "cuda",
        FMHA_BACKEND_ROCM => "rocm",
        _ => "host",
    };
    let mut cus = 0;
    check(fmha_device_cu_count(&mut cus), "fmha_device_cu_count");
    println!("fmha {version}, backend {backend}, {cus} compute units");

    let starts: Vec<i32> = std::iter::once(0)
        .chain(SEQLENS.iter().scan(0, |acc, &s| {
            *acc += s as i32;
            Some(*acc)
        }))
        .collect();
    let total = *starts.last().unwrap() as usize;
    let batch = SEQLENS.len();
    let max_seqlen = *SEQLENS.iter().max().unwrap();
    println!(
        "problem: varlen batch {batch} (lengths {SEQLENS:?}, {total} tokens), {NHEAD_Q} query / {NHEAD_K} kv heads (GQA), \
         head dim {HDIM}, bf16, causal (bottom-right)"
    );

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ std::process::id() as u64);
    let (q, k, v, d_o) = (
        rng.tensor(total * NHEAD_Q * HDIM),
        rng.tensor(total * NHEAD_K * HDIM),
        rng.tensor(total * NHEAD_K * HDIM),
        rng.tensor(total * NHEAD_Q * HDIM),
    );
    let nan_q = vec![bf16::NAN; total * NHEAD_Q * HDIM];
    let nan_k = vec![bf16::NAN; total * NHEAD_K * HDIM];
    let nan_lse = vec![f32::NAN; NHEAD_Q * total];
    let (q_d, k_d, v_d, do_d) = (device(&q), device(&k), device(&v), device(&d_o));
    let (o_d, lse_d, d_d) = (device(&nan_q), device(&nan_lse), device(&nan_lse));
    let (dq_d, dk_d, dv_d) = (device(&nan_q), device(&nan_k), device(&nan_k));
    let starts_d = device(&starts);

    let mut stream = null_mut();
    check(fmha_stream_create(&mut stream), "fmha_stream_create");
    let started = Instant::now();

    // Forward.
    let fwd_traits = fmha_fwd_traits {
        struct_size: std::mem::size_of::<fmha_fwd_traits>(),
        dtype: FMHA_DTYPE_BF16,
        hdim_q: HDIM as i32,
        hdim_v: HDIM as i32,
        is_group_mode: 1,
        mask_type: FMHA_MASK_BOTTOM_RIGHT,
        bias_type: FMHA_BIAS_NONE,
        has_dropout: 0,
        o_dtype: 0,
    };
    let fwd_args = fmha_fwd_args {
        struct_size: std::mem::size_of::<fmha_fwd_args>(),
        q: thd(q_d, NHEAD_Q, HDIM),
        k: thd(k_d, NHEAD_K, HDIM),
        v: thd(v_d, NHEAD_K, HDIM),
        o: thd(o_d, NHEAD_Q, HDIM),
        lse: lse_layout(lse_d, total),
        seqstart_q: starts_d as *const i32,
        seqstart_k: starts_d as *const i32,
        seqlen_q_ptr: null(),
        seqlen_k_ptr: null(),
        batch: batch as i32,
        seqlen_q: total as i32,
        seqlen_k: total as i32,
        max_seqlen_q: max_seqlen as i32,
        max_seqlen_k: max_seqlen as i32,
        nhead_q: NHEAD_Q as i32,
        nhead_k: NHEAD_K as i32,
        scale: 0.0,
        window_size_left: -1,
        window_size_right: 0,
        q_descale: fmha_scale::default(),
        k_descale: fmha_scale::default(),
        v_descale: fmha_scale::default(),
        workspace: null_mut(),
        workspace_size: 0,
    };
    check(fmha_fwd(&fwd_traits, &fwd_args, stream), "fmha_fwd");

    // Deterministic backward through the launcher.
    let bwd_traits = fmha_bwd_traits {
        struct_size: std::mem::size_of::<fmha_bwd_traits>(),
        seqlen_q: total as i32,
        seqlen_k: total as i32,
        batch: batch as i32,
        max_seqlen_q: max_seqlen as i32,
        max_seqlen_k: max_seqlen as i32,
        hdim_q: HDIM as i32,
        hdim_v: HDIM as i32,
        nhead_q: NHEAD_Q as i32,
        nhead_k: NHEAD_K as i32,
        dtype: FMHA_DTYPE_BF16,
        is_group_mode: 1,
        mask_type: FMHA_MASK_BOTTOM_RIGHT,
        bias_type: FMHA_BIAS_NONE,
        has_dbias: 0,
        has_dropout: 0,
        is_store_randval: 0,
        is_deterministic: 1,
        dq_scheme: i64::from(FMHA_DQ_SCHEME_AUTO),
    };
    let mut launcher = null_mut();
    check(fmha_bwd_launcher_create(&bwd_traits, &mut launcher), "fmha_bwd_launcher_create");
    let mut workspace_size = 0usize;
    check(fmha_bwd_launcher_workspace_size(launcher, &mut workspace_size), "workspace_size");
    let mut workspace = null_mut();
    check(fmha_device_malloc(&mut workspace, workspace_size), "workspace alloc");
    check(
        fmha_bwd_launcher_prepare_workspace(launcher, workspace, workspace_size, starts.as_ptr(), starts.as_ptr()),
        "prepare_workspace",
    );
    let bwd_args = fmha_bwd_args {
        struct_size: std::mem::size_of::<fmha_bwd_args>(),
        q: fwd_args.q,
        k: fwd_args.k,
        v: fwd_args.v,
        o: fwd_args.o,
        lse: fwd_args.lse,
        d_o: thd(do_d, NHEAD_Q, HDIM),
        d: lse_layout(d_d, total),
        dq: thd(dq_d, NHEAD_Q, HDIM),
        dk: thd(dk_d, NHEAD_K, HDIM),
        dv: thd(dv_d, NHEAD_K, HDIM),
        workspace,
        seqstart_q: fwd_args.seqstart_q,
        seqstart_k: fwd_args.seqstart_k,
        seqlen_q_ptr: null(),
        seqlen_k_ptr: null(),
        batch: batch as i32,
        seqlen_q: total as i32,
        seqlen_k: total as i32,
        max_seqlen_q: max_seqlen as i32,
        max_seqlen_k: max_seqlen as i32,
        nhead_q: NHEAD_Q as i32,
        nhead_k: NHEAD_K as i32,
        hdim_q: HDIM as i32,
        hdim_v: HDIM as i32,
        scale: 0.0,
        window_size_left: -1,
        window_size_right: 0,
        workspace_size,
    };
    check(fmha_bwd_launcher_run(launcher, &bwd_args, stream), "fmha_bwd_launcher_run");
    check(fmha_stream_synchronize(stream), "fmha_stream_synchronize");
    let elapsed = started.elapsed();
    println!(
        "forward + deterministic backward: {:.1} ms (workspace {workspace_size} bytes)",
        elapsed.as_secs_f64() * 1e3
    );

    // Check against the float64 reference and the same computation in bf16.
    let reference = RefProblem {
        nhead_q: NHEAD_Q,
        nhead_k: NHEAD_K,
        hdim_q: HDIM,
        hdim_v: HDIM,
        scale: f64::from(1.0 / (HDIM as f32).sqrt()),
        mask: Mask::causal(MaskType::BottomRight),
        seqlens: SEQLENS.iter().map(|&s| (s, s)).collect(),
    };
    let (qd, kd, vd, dod) = (
        unpack(&q, &starts, NHEAD_Q, HDIM),
        unpack(&k, &starts, NHEAD_K, HDIM),
        unpack(&v, &starts, NHEAD_K, HDIM),
        unpack(&d_o, &starts, NHEAD_Q, HDIM),
    );
    let to_dense = |ptr, heads| unpack(&download::<bf16>(ptr, total * heads * HDIM), &starts, heads, HDIM);
    let outputs = [
        ("O", to_dense(o_d, NHEAD_Q)),
        ("dQ", to_dense(dq_d, NHEAD_Q)),
        ("dK", to_dense(dk_d, NHEAD_K)),
        ("dV", to_dense(dv_d, NHEAD_K)),
    ];
    let mut exact: [Vec<Vec<f64>>; 4] = Default::default();
    let mut low: [Vec<Vec<f64>>; 4] = Default::default();
    for b in 0..batch {
        for (precision, slots) in [(Precision::F64, &mut exact), (Precision::LowPrecision(Dtype::Bf16), &mut low)] {
            let f = reference.forward(b, &qd[b], &kd[b], &vd[b], precision).expect("reference forward");
            let g = reference.backward(b, &qd[b], &kd[b], &vd[b], &dod[b], precision).expect("reference backward");
            for (slot, value) in slots.iter_mut().zip([f.o, g.dq, g.dk, g.dv]) {
                slot.push(value);
            }
        }
    }
    let mut all_ok = true;
    println!("{:<4} {:>12} {:>16} {:>8}", "", "max error", "bf16 reference", "verdict");
    for (i, (name, kernel)) in outputs.iter().enumerate() {
        let (err, base) = (max_error(kernel, &exact[i]), max_error(&low[i], &exact[i]));
        let magnitude = exact[i].iter().flatten().map(|x| x.abs()).fold(0.0, f64::max);
        let factor = if i == 0 { 2.0 } else { 3.0 };
        let ok = err <= factor * base + 0.25 * 2f64.powi(-7) * magnitude;
        all_ok &= ok;
        println!("{name:<4} {err:>12.3e} {base:>16.3e} {:>8}", if ok { "ok" } else { "FAIL" });
    }
    check(fmha_bwd_launcher_destroy(launcher), "launcher destroy");
    check(fmha_stream_destroy(stream), "stream destroy");
    for ptr in [q_d, k_d, v_d, do_d, o_d, lse_d, d_d, dq_d, dk_d, dv_d, starts_d, workspace] {
        check(fmha_device_free(ptr), "fmha_device_free");
    }
    if !all_ok {
        eprintln!("results outside the tolerance rule");
        std::process::exit(1);
    }
    println!("all outputs within the tolerance rule");
}
