//! End-to-end attention cases through the C ABI: fresh random inputs, NaN-poisoned outputs, device
//! buffers in BSHD/BHSD (batch mode) or THD (group mode, optionally with physical padding rows), and
//! the field's error rule against the float64 reference (`fmha::reference`).
#![allow(dead_code)]

use super::{last_error, ok};
use fmha::ffi::attention::*;
use fmha::ffi::backward::{fmha_bwd_args, fmha_bwd_traits, FMHA_DQ_SCHEME_AUTO};
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::problem::mask::{Mask, MaskType};
use fmha::reference::{Precision, RefProblem};
use std::ffi::c_void;
use std::ptr::null_mut;

pub use fmha::problem::Dtype;

pub use fmha::test_rng::Rng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[batch][seq][head][dim]` (batch mode) — also the row order of group mode `[total][head][dim]`.
    Bshd,
    /// `[batch][head][seq][dim]` (batch mode only).
    Bhsd,
}

#[derive(Debug, Clone)]
pub struct Case {
    pub dtype: Dtype,
    pub group: bool,
    pub nhead_q: usize,
    pub nhead_k: usize,
    pub hdim_q: usize,
    pub hdim_v: usize,
    /// Logical `(sq, sk)` per batch (all equal in batch mode).
    pub seqlens: Vec<(usize, usize)>,
    /// Extra physical rows after each batch's logical rows (group mode; exercises logical lengths).
    pub padding: Vec<(usize, usize)>,
    pub mask: Mask,
    pub deterministic: bool,
    /// `FMHA_DQ_SCHEME_*` of the backward traits.
    pub dq_scheme: i32,
    pub layout: Layout,
    pub scale: f32,
    /// Group mode: `max_seqlen_q/k` to declare instead of the actual maxima (a launcher reused
    /// across calls declares a bound that holds for all of them).
    pub max_seqlen: Option<(usize, usize)>,
}

impl Case {
    pub fn batch_mode(
        dtype: Dtype,
        b: usize,
        h: usize,
        hk: usize,
        (sq, sk): (usize, usize),
        (dq, dv): (usize, usize),
        mask: Mask,
    ) -> Case {
        Case {
            dtype,
            group: false,
            nhead_q: h,
            nhead_k: hk,
            hdim_q: dq,
            hdim_v: dv,
            seqlens: vec![(sq, sk); b],
            padding: vec![(0, 0); b],
            mask,
            deterministic: false,
            dq_scheme: FMHA_DQ_SCHEME_AUTO,
            layout: Layout::Bshd,
            scale: 0.0,
            max_seqlen: None,
        }
    }

    /// A small group-mode problem (bf16, 4 query heads over 2 kv heads, head dim 64, bottom-right
    /// causal) with the given (q, k) lengths: the async-preparation and hardening tests' workload.
    pub fn varlen_causal(seqlens: Vec<(usize, usize)>, deterministic: bool) -> Case {
        let mut case =
            Case::batch_mode(Dtype::Bf16, seqlens.len(), 4, 2, (1, 1), (64, 64), Mask::causal(MaskType::BottomRight));
        case.group = true;
        case.padding = vec![(0, 0); seqlens.len()];
        case.seqlens = seqlens;
        case.deterministic = deterministic;
        case
    }

    fn physical(&self, b: usize) -> (usize, usize) {
        (self.seqlens[b].0 + self.padding[b].0, self.seqlens[b].1 + self.padding[b].1)
    }
    pub fn starts(&self, k_side: bool) -> Vec<i32> {
        let mut starts = vec![0i32];
        for b in 0..self.seqlens.len() {
            let (pq, pk) = self.physical(b);
            starts.push(starts[b] + if k_side { pk } else { pq } as i32);
        }
        starts
    }
    fn total(&self, k_side: bool) -> usize {
        *self.starts(k_side).last().unwrap() as usize
    }
    pub fn scale_value(&self) -> f64 {
        if self.scale == 0.0 {
            1.0 / (self.hdim_q as f64).sqrt()
        } else {
            self.scale as f64
        }
    }
    pub fn reference(&self) -> RefProblem {
        RefProblem {
            nhead_q: self.nhead_q,
            nhead_k: self.nhead_k,
            hdim_q: self.hdim_q,
            hdim_v: self.hdim_v,
            scale: self.scale_value() as f32 as f64,
            mask: self.mask,
            seqlens: self.seqlens.clone(),
        }
    }
    pub fn name(&self) -> String {
        format!(
            "{} {} b={} h={}/{} d={}x{} seqlens={:?} pad={:?} mask={:?} det={} {:?}",
            self.dtype.name(),
            if self.group { "group" } else { "batch" },
            self.seqlens.len(),
            self.nhead_q,
            self.nhead_k,
            self.hdim_q,
            self.hdim_v,
            self.seqlens,
            self.padding,
            self.mask,
            self.deterministic,
            self.layout
        )
    }
}

/// A device tensor `[batch][head][row][dim]` with a chosen layout, kept as dense host data too.
pub struct DeviceTensor {
    pub ptr: *mut c_void,
    pub elements: usize,
    pub element_bytes: usize,
    pub tensor: fmha_tensor,
}

impl DeviceTensor {
    /// Allocates a tensor for `heads` heads of `dim` columns: q-side (`k_side = false`) or k-side rows.
    pub fn new(case: &Case, heads: usize, dim: usize, k_side: bool, element_bytes: usize) -> DeviceTensor {
        let b = case.seqlens.len();
        let rows = if case.group {
            case.total(k_side)
        } else if k_side {
            case.seqlens[0].1
        } else {
            case.seqlens[0].0
        };
        let elements = if case.group { rows * heads * dim } else { b * rows * heads * dim };
        let (batch_stride, head_stride, row_stride) = match (case.group, case.layout) {
            (true, _) | (false, Layout::Bshd) => ((rows * heads * dim) as i64, dim as i64, (heads * dim) as i64),
            (false, Layout::Bhsd) => ((rows * heads * dim) as i64, (rows * dim) as i64, dim as i64),
        };
        let mut ptr = null_mut();
        ok(fmha_device_malloc(&mut ptr, (elements * element_bytes).max(1)));
        DeviceTensor {
            ptr,
            elements,
            element_bytes,
            tensor: fmha_tensor { data: ptr, batch_stride, head_stride, row_stride },
        }
    }

    /// Element index of (b, h, logical row, d) given the batch's physical start row (group mode).
    pub fn index(&self, case: &Case, b: usize, h: usize, row: usize, d: usize, k_side: bool) -> usize {
        let t = &self.tensor;
        let start = if case.group { case.starts(k_side)[b] as usize } else { 0 };
        let batch = if case.group { 0 } else { b as i64 * t.batch_stride };
        (batch + h as i64 * t.head_stride + (start + row) as i64 * t.row_stride) as usize + d
    }

    pub fn upload(&self, bytes: &[u8]) {
        ok(fmha_memcpy(self.ptr, bytes.as_ptr() as *const c_void, bytes.len(), FMHA_MEMCPY_HOST_TO_DEVICE));
    }
    pub fn download(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; self.elements * self.element_bytes];
        ok(fmha_memcpy(bytes.as_mut_ptr() as *mut c_void, self.ptr, bytes.len(), FMHA_MEMCPY_DEVICE_TO_HOST));
        bytes
    }
}

impl Drop for DeviceTensor {
    fn drop(&mut self) {
        fmha_device_free(self.ptr);
    }
}

fn encode(dtype: Dtype, x: f64) -> u16 {
    match dtype {
        Dtype::F16 => half::f16::from_f64(x).to_bits(),
        Dtype::Bf16 => half::bf16::from_f64(x).to_bits(),
    }
}
fn decode(dtype: Dtype, bits: u16) -> f64 {
    match dtype {
        Dtype::F16 => half::f16::from_bits(bits).to_f64(),
        Dtype::Bf16 => half::bf16::from_bits(bits).to_f64(),
    }
}
fn nan_bits(dtype: Dtype) -> u16 {
    encode(dtype, f64::NAN)
}

/// Per-batch dense `[head][row][dim]` values.
pub type Dense = Vec<Vec<f64>>;

/// Fills a 16-bit tensor: logical rows from `dense`, every other element (padding, gaps) random.
fn upload_16(case: &Case, t: &DeviceTensor, dense: &Dense, heads: usize, dim: usize, k_side: bool, rng: &mut Rng) {
    let mut bits: Vec<u16> = (0..t.elements).map(|_| encode(case.dtype, rng.unit())).collect();
    for (b, values) in dense.iter().enumerate() {
        let rows = if k_side { case.seqlens[b].1 } else { case.seqlens[b].0 };
        for h in 0..heads {
            for r in 0..rows {
                for d in 0..dim {
                    bits[t.index(case, b, h, r, d, k_side)] = encode(case.dtype, values[(h * rows + r) * dim + d]);
                }
            }
        }
    }
    t.upload(&bits.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>());
}

fn poison_16(case: &Case, t: &DeviceTensor) {
    let bits = vec![nan_bits(case.dtype); t.elements];
    t.upload(&bits.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>());
}

fn download_16(case: &Case, t: &DeviceTensor, heads: usize, dim: usize, k_side: bool) -> Dense {
    let bytes = t.download();
    let bits: Vec<u16> = bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    (0..case.seqlens.len())
        .map(|b| {
            let rows = if k_side { case.seqlens[b].1 } else { case.seqlens[b].0 };
            let mut out = vec![0.0; heads * rows * dim];
            for h in 0..heads {
                for r in 0..rows {
                    for d in 0..dim {
                        out[(h * rows + r) * dim + d] = decode(case.dtype, bits[t.index(case, b, h, r, d, k_side)]);
                    }
                }
            }
            out
        })
        .collect()
}

/// The q-side rows of a 16-bit tensor (O) as per-batch dense `[head][row][dim]` values.
pub fn download_dense(case: &Case, t: &DeviceTensor, heads: usize, dim: usize) -> Dense {
    download_16(case, t, heads, dim, false)
}

/// `[nhead_q][rows]` fp32 with unit row stride (the LSE and D layout).
pub fn lse_tensor(case: &Case) -> (DeviceTensor, usize) {
    let rows = if case.group { case.total(false) } else { case.seqlens[0].0 };
    let b = if case.group { 1 } else { case.seqlens.len() };
    let elements = b * case.nhead_q * rows;
    let mut ptr = null_mut();
    ok(fmha_device_malloc(&mut ptr, (elements * 4).max(1)));
    let tensor =
        fmha_tensor { data: ptr, batch_stride: (case.nhead_q * rows) as i64, head_stride: rows as i64, row_stride: 1 };
    (DeviceTensor { ptr, elements, element_bytes: 4, tensor }, rows)
}

pub fn poison_32(t: &DeviceTensor) {
    let bytes: Vec<u8> = (0..t.elements).flat_map(|_| f32::NAN.to_le_bytes()).collect();
    t.upload(&bytes);
}

pub fn download_lse(case: &Case, t: &DeviceTensor) -> Dense {
    let bytes = t.download();
    let values: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let starts = case.starts(false);
    (0..case.seqlens.len())
        .map(|b| {
            let sq = case.seqlens[b].0;
            let mut out = vec![0.0; case.nhead_q * sq];
            for h in 0..case.nhead_q {
                for r in 0..sq {
                    let (base, row) =
                        if case.group { (0, starts[b] as usize + r) } else { (b as i64 * t.tensor.batch_stride, r) };
                    out[h * sq + r] = values[(base + h as i64 * t.tensor.head_stride) as usize + row] as f64;
                }
            }
            out
        })
        .collect()
}

/// Max |a - b| over all batches; NaN (an unwritten or broken element) counts as infinite. Equal
/// infinities (fully masked LSE) count as zero.
pub fn max_error(a: &Dense, b: &Dense) -> f64 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| {
            if x == y {
                0.0
            } else if x.is_nan() || y.is_nan() {
                f64::INFINITY
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f64::max)
}

fn max_abs(a: &Dense) -> f64 {
    a.iter().flatten().filter(|x| x.is_finite()).map(|x| x.abs()).fold(0.0, f64::max)
}

/// A quarter of `eps` (the output type's epsilon) times the largest reference magnitude: the
/// rounding noise of one output element, the small absolute floor of the field's rule.
pub fn rounding_floor(exact: &Dense, eps: f64) -> f64 {
    0.25 * eps * max_abs(exact).max(1e-3)
}

/// The field's rule: kernel error ≤ factor × (same-precision error) + floor.
pub fn check_rule(
    case: &Case,
    what: &str,
    kernel: &Dense,
    exact: &Dense,
    same_precision: &Dense,
    factor: f64,
    floor: f64,
) {
    let err = max_error(kernel, exact);
    let base = max_error(same_precision, exact);
    assert!(
        err <= factor * base + floor,
        "{what}: max error {err:.3e} > {factor} × {base:.3e} (same-precision error) + {floor:.3e}; case {}",
        case.name()
    );
}

pub fn epsilon(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F16 => 2f64.powi(-10),
        Dtype::Bf16 => 2f64.powi(-7),
    }
}

pub fn random_dense(case: &Case, rng: &mut Rng, heads: usize, dim: usize, k_side: bool) -> Dense {
    (0..case.seqlens.len())
        .map(|b| {
            let rows = if k_side { case.seqlens[b].1 } else { case.seqlens[b].0 };
            (0..heads * rows * dim).map(|_| case.dtype.round(rng.unit() as f32) as f64).collect()
        })
        .collect()
}

/// Device buffers of one case.
pub struct Buffers {
    pub q: DeviceTensor,
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    pub o: DeviceTensor,
    pub lse: DeviceTensor,
    pub seqstart_q: DeviceArray,
    pub seqstart_k: DeviceArray,
    pub seqlen_q: DeviceArray,
    pub seqlen_k: DeviceArray,
}

/// An int32 device array (null when empty).
pub struct DeviceArray {
    pub ptr: *mut c_void,
}

impl DeviceArray {
    pub fn new(values: &[i32]) -> DeviceArray {
        if values.is_empty() {
            return DeviceArray { ptr: null_mut() };
        }
        let mut ptr = null_mut();
        ok(fmha_device_malloc(&mut ptr, values.len() * 4));
        ok(fmha_memcpy(ptr, values.as_ptr() as *const c_void, values.len() * 4, FMHA_MEMCPY_HOST_TO_DEVICE));
        DeviceArray { ptr }
    }
    pub fn as_ptr(&self) -> *const i32 {
        self.ptr as *const i32
    }
}

impl Drop for DeviceArray {
    fn drop(&mut self) {
        fmha_device_free(self.ptr);
    }
}

pub struct Inputs {
    pub q: Dense,
    pub k: Dense,
    pub v: Dense,
}

impl Inputs {
    /// Fresh random q, k, v for `case`.
    pub fn random(case: &Case, rng: &mut Rng) -> Inputs {
        Inputs {
            q: random_dense(case, rng, case.nhead_q, case.hdim_q, false),
            k: random_dense(case, rng, case.nhead_k, case.hdim_q, true),
            v: random_dense(case, rng, case.nhead_k, case.hdim_v, true),
        }
    }
}

impl Buffers {
    pub fn new(case: &Case, inputs: &Inputs, rng: &mut Rng) -> Buffers {
        let (hq, hk, dq, dv) = (case.nhead_q, case.nhead_k, case.hdim_q, case.hdim_v);
        let q = DeviceTensor::new(case, hq, dq, false, 2);
        let k = DeviceTensor::new(case, hk, dq, true, 2);
        let v = DeviceTensor::new(case, hk, dv, true, 2);
        let o = DeviceTensor::new(case, hq, dv, false, 2);
        upload_16(case, &q, &inputs.q, hq, dq, false, rng);
        upload_16(case, &k, &inputs.k, hk, dq, true, rng);
        upload_16(case, &v, &inputs.v, hk, dv, true, rng);
        Buffers::with_tensors(case, q, k, v, o)
    }

    /// The buffers of `case` around filled q, k, v and an output o: the LSE and the sequence arrays.
    pub fn with_tensors(case: &Case, q: DeviceTensor, k: DeviceTensor, v: DeviceTensor, o: DeviceTensor) -> Buffers {
        let (lse, _) = lse_tensor(case);
        let group = |values: Vec<i32>| DeviceArray::new(if case.group { &values } else { &[] });
        let padded = case.padding.iter().any(|&(a, b)| a > 0 || b > 0);
        let logical = |k_side: bool| -> Vec<i32> {
            if padded {
                case.seqlens.iter().map(|&(a, b)| if k_side { b } else { a } as i32).collect()
            } else {
                Vec::new()
            }
        };
        Buffers {
            q,
            k,
            v,
            o,
            lse,
            seqstart_q: group(case.starts(false)),
            seqstart_k: group(case.starts(true)),
            seqlen_q: group(logical(false)),
            seqlen_k: group(logical(true)),
        }
    }

    pub fn fwd_traits(case: &Case) -> fmha_fwd_traits {
        fmha_fwd_traits {
            struct_size: std::mem::size_of::<fmha_fwd_traits>(),
            dtype: match case.dtype {
                Dtype::F16 => FMHA_DTYPE_FP16,
                Dtype::Bf16 => FMHA_DTYPE_BF16,
            },
            hdim_q: case.hdim_q as i32,
            hdim_v: case.hdim_v as i32,
            is_group_mode: case.group as i32,
            mask_type: case.mask.kind as i32,
            bias_type: FMHA_BIAS_NONE,
            has_dropout: 0,
            o_dtype: 0,
        }
    }

    /// (seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k) as the C args expect them.
    pub fn lengths(case: &Case) -> (i32, i32, i32, i32) {
        if case.group {
            let max = |k: bool| {
                (0..case.seqlens.len())
                    .map(|b| if k { case.physical(b).1 } else { case.physical(b).0 })
                    .max()
                    .unwrap_or(0)
            };
            let (max_q, max_k) = case.max_seqlen.unwrap_or((max(false), max(true)));
            (case.total(false) as i32, case.total(true) as i32, max_q as i32, max_k as i32)
        } else {
            (case.seqlens[0].0 as i32, case.seqlens[0].1 as i32, case.seqlens[0].0 as i32, case.seqlens[0].1 as i32)
        }
    }

    pub fn fwd_args(&self, case: &Case) -> fmha_fwd_args {
        let (seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k) = Self::lengths(case);
        fmha_fwd_args {
            struct_size: std::mem::size_of::<fmha_fwd_args>(),
            q: self.q.tensor,
            k: self.k.tensor,
            v: self.v.tensor,
            o: self.o.tensor,
            lse: self.lse.tensor,
            seqstart_q: self.seqstart_q.as_ptr(),
            seqstart_k: self.seqstart_k.as_ptr(),
            seqlen_q_ptr: self.seqlen_q.as_ptr(),
            seqlen_k_ptr: self.seqlen_k.as_ptr(),
            batch: case.seqlens.len() as i32,
            seqlen_q,
            seqlen_k,
            max_seqlen_q,
            max_seqlen_k,
            nhead_q: case.nhead_q as i32,
            nhead_k: case.nhead_k as i32,
            scale: case.scale,
            window_size_left: case.mask.left,
            window_size_right: case.mask.right,
            q_descale: fmha_scale::default(),
            k_descale: fmha_scale::default(),
            v_descale: fmha_scale::default(),
            workspace: null_mut(),
            workspace_size: 0,
        }
    }

    /// Poisons O and LSE, runs the forward, synchronizes.
    pub fn forward(&self, case: &Case) -> fmha_status {
        self.forward_with(case, &self.fwd_args(case))
    }

    /// [`forward`](Self::forward) with these arguments (e.g. `fwd_args` with a scheduler workspace).
    pub fn forward_with(&self, case: &Case, args: &fmha_fwd_args) -> fmha_status {
        poison_16(case, &self.o);
        poison_32(&self.lse);
        let traits = Self::fwd_traits(case);
        let status = fmha_fwd(&traits, args, null_mut());
        if status != FMHA_OK {
            return status;
        }
        fmha_stream_synchronize(null_mut())
    }
}

/// Whether this build has a kernel for the forward of `case` on the current device (GPU builds
/// compile a subset of head dims; what the registry lists must pass).
pub fn forward_supported(case: &Case) -> bool {
    supported(case, fmha::registry::Operation::Forward)
}

/// Whether this build has the forward and the backward kernels of `case` (its `deterministic` flag).
pub fn backward_supported(case: &Case) -> bool {
    forward_supported(case) && supported(case, fmha::registry::Operation::Backward)
}

fn supported(case: &Case, operation: fmha::registry::Operation) -> bool {
    let Ok(rt) = fmha::runtime::current() else { return false };
    let request = fmha::registry::Request {
        operation,
        dtype: case.dtype.into(),
        hdim_q: case.hdim_q as i64,
        hdim_v: case.hdim_v as i64,
        masked: case.mask.kind != fmha::problem::mask::MaskType::None,
        deterministic: case.deterministic,
        packed_gqa: false,
    };
    let supported = fmha::registry::select(rt.arch().unwrap(), &request).is_ok();
    if !supported {
        eprintln!("skipped (no {} kernel in this build): {}", operation.name(), case.name());
    }
    supported
}

/// Runs the forward of `case` and checks O and LSE against the reference with the field's rule.
/// Returns the buffers (with O and LSE written) for a following backward.
pub fn check_forward(case: &Case, rng: &mut Rng) -> (Buffers, Inputs) {
    let inputs = Inputs {
        q: random_dense(case, rng, case.nhead_q, case.hdim_q, false),
        k: random_dense(case, rng, case.nhead_k, case.hdim_q, true),
        v: random_dense(case, rng, case.nhead_k, case.hdim_v, true),
    };
    let buffers = Buffers::new(case, &inputs, rng);
    let status = buffers.forward(case);
    assert_eq!(status, FMHA_OK, "forward failed: {} ({})", last_error(), case.name());
    let o = download_16(case, &buffers.o, case.nhead_q, case.hdim_v, false);
    let lse = download_lse(case, &buffers.lse);
    let problem = case.reference();
    let (mut o64, mut lse64, mut o_lp, mut lse_lp) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for b in 0..case.seqlens.len() {
        let exact = problem.forward(b, &inputs.q[b], &inputs.k[b], &inputs.v[b], Precision::F64).unwrap();
        let low =
            problem.forward(b, &inputs.q[b], &inputs.k[b], &inputs.v[b], Precision::LowPrecision(case.dtype)).unwrap();
        o64.push(exact.o);
        lse64.push(exact.lse);
        o_lp.push(low.o);
        lse_lp.push(low.lse);
    }
    check_rule(case, "O", &o, &o64, &o_lp, 2.0, rounding_floor(&o64, epsilon(case.dtype)));
    // LSE is fp32. GPU kernels evaluate exp2 with the special-function unit (as FlashAttention does
    // with fast math), whose absolute error of about 2^-22 per probability adds up over the keys like
    // a random walk: 4 · 2^-22 · sqrt(max sk) on top of the fp32 rounding floor.
    let max_keys = case.seqlens.iter().map(|s| s.1).max().unwrap_or(0) as f64;
    let lse_floor = rounding_floor(&lse64, 2f64.powi(-20)) + 4.0 * 2f64.powi(-22) * max_keys.sqrt();
    check_rule(case, "LSE", &lse, &lse64, &lse_lp, 2.0, lse_floor);
    (buffers, inputs)
}

/// [`check_forward`], then the same call twice with a scheduler workspace whose bytes are garbage before
/// the first (the call zeroes its counter; the first leaves it counted past the grid): O and LSE must
/// have the bits of the call without one (on a GPU, a persistent grid taking tiles from the counter
/// where the tiles outnumber the SMs, one CTA per tile without it).
pub fn check_forward_with_workspace(case: &Case, rng: &mut Rng) {
    let (buffers, _) = check_forward(case, rng);
    let bits = |b: &Buffers| (b.o.download(), b.lse.download());
    let expected = bits(&buffers);
    let mut size = 0usize;
    ok(fmha_fwd_workspace_size(&Buffers::fwd_traits(case), &mut size));
    let mut workspace = null_mut();
    ok(fmha_device_malloc(&mut workspace, size));
    ok(fmha_memset(workspace, 0x5A, size));
    let args = fmha_fwd_args { workspace, workspace_size: size, ..buffers.fwd_args(case) };
    for run in 0..2 {
        let status = buffers.forward_with(case, &args);
        assert_eq!(status, FMHA_OK, "forward with a workspace failed: {} ({})", last_error(), case.name());
        let got = bits(&buffers);
        assert!(
            got == expected,
            "run {run} with a scheduler workspace differs from the call without one ({})",
            case.name()
        );
    }
    ok(fmha_device_free(workspace));
}

/// Gradients as raw bits, for bitwise comparisons between runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GradientBits {
    pub dq: Vec<u8>,
    pub dk: Vec<u8>,
    pub dv: Vec<u8>,
}

/// Everything a backward needs beyond the forward's buffers.
pub struct BackwardBuffers {
    pub d_o: DeviceTensor,
    pub d: DeviceTensor,
    pub dq: DeviceTensor,
    pub dk: DeviceTensor,
    pub dv: DeviceTensor,
    pub d_o_dense: Dense,
}

pub fn bwd_traits(case: &Case) -> fmha_bwd_traits {
    let (seqlen_q, seqlen_k, max_seqlen_q, max_seqlen_k) = Buffers::lengths(case);
    let fwd = Buffers::fwd_traits(case);
    fmha_bwd_traits {
        struct_size: std::mem::size_of::<fmha_bwd_traits>(),
        seqlen_q,
        seqlen_k,
        batch: case.seqlens.len() as i32,
        max_seqlen_q,
        max_seqlen_k,
        hdim_q: case.hdim_q as i32,
        hdim_v: case.hdim_v as i32,
        nhead_q: case.nhead_q as i32,
        nhead_k: case.nhead_k as i32,
        dtype: fwd.dtype,
        is_group_mode: fwd.is_group_mode,
        mask_type: fwd.mask_type,
        bias_type: FMHA_BIAS_NONE,
        has_dbias: 0,
        has_dropout: 0,
        is_store_randval: 0,
        is_deterministic: case.deterministic as i32,
        dq_scheme: i64::from(case.dq_scheme),
    }
}

impl BackwardBuffers {
    pub fn new(case: &Case, rng: &mut Rng) -> BackwardBuffers {
        let (hq, hk, dq, dv) = (case.nhead_q, case.nhead_k, case.hdim_q, case.hdim_v);
        let d_o_dense = random_dense(case, rng, hq, dv, false);
        let d_o = DeviceTensor::new(case, hq, dv, false, 2);
        upload_16(case, &d_o, &d_o_dense, hq, dv, false, rng);
        BackwardBuffers {
            d_o,
            d: lse_tensor(case).0,
            dq: DeviceTensor::new(case, hq, dq, false, 2),
            dk: DeviceTensor::new(case, hk, dq, true, 2),
            dv: DeviceTensor::new(case, hk, dv, true, 2),
            d_o_dense,
        }
    }

    pub fn args(&self, case: &Case, fwd: &Buffers, workspace: *mut c_void) -> fmha_bwd_args {
        let f = fwd.fwd_args(case);
        fmha_bwd_args {
            struct_size: std::mem::size_of::<fmha_bwd_args>(),
            q: f.q,
            k: f.k,
            v: f.v,
            o: f.o,
            lse: f.lse,
            d_o: self.d_o.tensor,
            d: self.d.tensor,
            dq: self.dq.tensor,
            dk: self.dk.tensor,
            dv: self.dv.tensor,
            workspace,
            seqstart_q: f.seqstart_q,
            seqstart_k: f.seqstart_k,
            seqlen_q_ptr: f.seqlen_q_ptr,
            seqlen_k_ptr: f.seqlen_k_ptr,
            batch: f.batch,
            seqlen_q: f.seqlen_q,
            seqlen_k: f.seqlen_k,
            max_seqlen_q: f.max_seqlen_q,
            max_seqlen_k: f.max_seqlen_k,
            nhead_q: f.nhead_q,
            nhead_k: f.nhead_k,
            hdim_q: case.hdim_q as i32,
            hdim_v: case.hdim_v as i32,
            scale: f.scale,
            window_size_left: f.window_size_left,
            window_size_right: f.window_size_right,
            workspace_size: 0,
        }
    }

    pub fn poison(&self, case: &Case) {
        poison_16(case, &self.dq);
        poison_16(case, &self.dk);
        poison_16(case, &self.dv);
        poison_32(&self.d);
    }

    pub fn bits(&self) -> GradientBits {
        GradientBits { dq: self.dq.download(), dk: self.dk.download(), dv: self.dv.download() }
    }
}

/// A launcher with a prepared workspace (garbage-filled first, so missing zeroing shows).
pub struct PreparedLauncher {
    pub launcher: *mut fmha::ffi::backward::fmha_bwd_launcher,
    pub workspace: *mut c_void,
    pub workspace_size: usize,
}

impl PreparedLauncher {
    pub fn new(case: &Case) -> PreparedLauncher {
        use fmha::ffi::backward::*;
        let traits = bwd_traits(case);
        let mut launcher = null_mut();
        ok(fmha_bwd_launcher_create(&traits, &mut launcher));
        let mut size = 0usize;
        ok(fmha_bwd_launcher_workspace_size(launcher, &mut size));
        let mut upper = 0usize;
        ok(fmha_bwd_workspace_size_upper_bound(&traits, &mut upper));
        assert_eq!(size, upper, "launcher and standalone workspace sizes differ");
        let mut workspace = null_mut();
        ok(fmha_device_malloc(&mut workspace, size));
        ok(fmha_memset(workspace, 0x7F, size));
        let (starts_q, starts_k) = (case.starts(false), case.starts(true));
        let (q, k) =
            if case.group { (starts_q.as_ptr(), starts_k.as_ptr()) } else { (std::ptr::null(), std::ptr::null()) };
        ok(fmha_bwd_launcher_prepare_workspace(launcher, workspace, size, q, k));
        PreparedLauncher { launcher, workspace, workspace_size: size }
    }

    pub fn run(&self, case: &Case, fwd: &Buffers, bwd: &BackwardBuffers) {
        bwd.poison(case);
        let args = bwd.args(case, fwd, self.workspace);
        ok(fmha::ffi::backward::fmha_bwd_launcher_run(self.launcher, &args, null_mut()));
        let status = fmha_stream_synchronize(null_mut());
        assert_eq!(status, FMHA_OK, "backward failed: {} ({})", last_error(), case.name());
    }
}

impl Drop for PreparedLauncher {
    fn drop(&mut self) {
        fmha::ffi::backward::fmha_bwd_launcher_destroy(self.launcher);
        fmha_device_free(self.workspace);
    }
}

/// Reference gradients: float64 and same-precision, per batch.
pub struct ExpectedGradients {
    pub exact: [Dense; 3],
    pub low: [Dense; 3],
}

pub fn expected_gradients(case: &Case, inputs: &Inputs, d_o: &Dense) -> ExpectedGradients {
    let problem = case.reference();
    let mut exact: [Dense; 3] = Default::default();
    let mut low: [Dense; 3] = Default::default();
    for (b, d_o) in d_o.iter().enumerate() {
        let args = (&inputs.q[b], &inputs.k[b], &inputs.v[b], d_o);
        let e = problem.backward(b, args.0, args.1, args.2, args.3, Precision::F64).unwrap();
        let l = problem.backward(b, args.0, args.1, args.2, args.3, Precision::LowPrecision(case.dtype)).unwrap();
        for (slot, value) in exact.iter_mut().zip([e.dq, e.dk, e.dv]) {
            slot.push(value);
        }
        for (slot, value) in low.iter_mut().zip([l.dq, l.dk, l.dv]) {
            slot.push(value);
        }
    }
    ExpectedGradients { exact, low }
}

/// Checks the gradients in `bwd` (after a run) with the field's rule (3×).
pub fn check_gradients(case: &Case, bwd: &BackwardBuffers, expected: &ExpectedGradients) {
    let dq = download_16(case, &bwd.dq, case.nhead_q, case.hdim_q, false);
    let dk = download_16(case, &bwd.dk, case.nhead_k, case.hdim_q, true);
    let dv = download_16(case, &bwd.dv, case.nhead_k, case.hdim_v, true);
    let eps = epsilon(case.dtype);
    for (i, (name, kernel)) in [("dQ", &dq), ("dK", &dk), ("dV", &dv)].into_iter().enumerate() {
        check_rule(
            case,
            name,
            kernel,
            &expected.exact[i],
            &expected.low[i],
            3.0,
            rounding_floor(&expected.exact[i], eps),
        );
    }
}

/// Forward, then a backward through a fresh launcher for each of `deterministic` (the references are
/// computed once); checks every output. Returns the buffers for further runs.
pub fn check_backward_modes(case: &Case, modes: &[bool], rng: &mut Rng) -> Option<(Buffers, BackwardBuffers)> {
    let modes: Vec<bool> = modes
        .iter()
        .copied()
        .filter(|&deterministic| backward_supported(&Case { deterministic, ..case.clone() }))
        .collect();
    if modes.is_empty() {
        return None;
    }
    let (fwd, inputs) = check_forward(case, rng);
    let bwd = BackwardBuffers::new(case, rng);
    let expected = expected_gradients(case, &inputs, &bwd.d_o_dense);
    for deterministic in modes {
        let case = Case { deterministic, ..case.clone() };
        let launcher = PreparedLauncher::new(&case);
        launcher.run(&case, &fwd, &bwd);
        check_gradients(&case, &bwd, &expected);
    }
    Some((fwd, bwd))
}

/// Forward and backward of `case` (its own `deterministic` flag), checked; `None` (skipped, with a
/// message) where this build has no kernel for it.
pub fn check_backward(case: &Case, rng: &mut Rng) -> Option<(Buffers, BackwardBuffers)> {
    check_backward_modes(case, &[case.deterministic], rng)
}

/// Forward of `case` checked, plus backward buffers and the expected gradients, for tests that drive
/// the backward launcher themselves.
pub fn forward_and_expected(case: &Case, rng: &mut Rng) -> (Buffers, BackwardBuffers, ExpectedGradients) {
    let (fwd, inputs) = check_forward(case, rng);
    let bwd = BackwardBuffers::new(case, rng);
    let expected = expected_gradients(case, &inputs, &bwd.d_o_dense);
    (fwd, bwd, expected)
}
