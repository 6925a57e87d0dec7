//! The kv-cache operation through the C ABI: random batches against the float64 reference (every
//! table kind, pool layout, page size, mask, dtype and descale granularity; pages scattered and shared
//! between sequences; table entries past each sequence's pages holding ids the pool does not have;
//! unused pages and outputs poisoned), paged == dense bitwise, the prepare's fault record, and every
//! bad argument refused naming its field.

mod common;

use common::{
    abs_dot_max, expect_error, fp8_accumulation, fp8_output_rule, host_backend, last_error, no_device, ok, GuardedBytes,
};
use fmha::ffi::attention::*;
use fmha::ffi::kvcache::*;
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::problem::fp8::Fp8Format;
use fmha::problem::mask::{Mask, MaskType};
use fmha::reference::{Precision, RefProblem};
use fmha::runtime::Arch;
use fmha::test_rng::{starts, Rng};
use std::ffi::c_void;
use std::ptr::{null, null_mut};

/// Device buffers of one call, freed on drop.
#[derive(Default)]
struct Device(Vec<*mut c_void>);

impl Device {
    fn upload<T: Copy>(&mut self, values: &[T]) -> *mut c_void {
        let bytes = std::mem::size_of_val(values);
        let mut ptr = null_mut();
        ok(fmha_device_malloc(&mut ptr, bytes.max(16)));
        ok(fmha_memcpy(ptr, values.as_ptr().cast(), bytes, FMHA_MEMCPY_HOST_TO_DEVICE));
        self.0.push(ptr);
        ptr
    }

    fn download<T: Copy + Default>(ptr: *const c_void, len: usize) -> Vec<T> {
        let mut out = vec![T::default(); len];
        ok(fmha_memcpy(out.as_mut_ptr().cast(), ptr, len * std::mem::size_of::<T>(), FMHA_MEMCPY_DEVICE_TO_HOST));
        out
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        for &ptr in &self.0 {
            fmha_device_free(ptr);
        }
    }
}

/// The input types under test, with their codes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Input {
    F16,
    Bf16,
    Fp8(Fp8Format),
}

impl Input {
    fn abi(self) -> i32 {
        match self {
            Input::F16 => FMHA_DTYPE_FP16,
            Input::Bf16 => FMHA_DTYPE_BF16,
            Input::Fp8(Fp8Format::E4m3fn) => FMHA_DTYPE_FP8_E4M3FN,
            Input::Fp8(Fp8Format::E4m3fnuz) => FMHA_DTYPE_FP8_E4M3FNUZ,
        }
    }

    fn bytes(self) -> usize {
        if let Input::Fp8(_) = self {
            1
        } else {
            2
        }
    }

    /// The nearest code of `x` (little-endian bytes) and the value it holds.
    fn encode(self, x: f64) -> (u16, f64) {
        match self {
            Input::F16 => {
                let h = half::f16::from_f64(x);
                (h.to_bits(), h.to_f64())
            }
            Input::Bf16 => {
                let h = half::bf16::from_f64(x);
                (h.to_bits(), h.to_f64())
            }
            Input::Fp8(format) => {
                let code = format.encode(x as f32);
                (u16::from(code), f64::from(format.decode(code)))
            }
        }
    }

    fn poison(self) -> u16 {
        match self {
            Input::F16 => half::f16::NAN.to_bits(),
            Input::Bf16 => half::bf16::NAN.to_bits(),
            Input::Fp8(Fp8Format::E4m3fn) => 0x7F,
            Input::Fp8(Fp8Format::E4m3fnuz) => 0x80,
        }
    }

    fn output_value(self, bits: u16) -> f64 {
        match self {
            Input::F16 => half::f16::from_bits(bits).to_f64(),
            _ => half::bf16::from_bits(bits).to_f64(),
        }
    }

    fn baseline(self) -> Precision {
        match self {
            Input::F16 => Precision::LowPrecision(fmha::problem::Dtype::F16),
            Input::Bf16 => Precision::LowPrecision(fmha::problem::Dtype::Bf16),
            Input::Fp8(format) => Precision::Fp8(format),
        }
    }
}

/// Codes packed as the element size says.
fn pack(input: Input, codes: &[u16]) -> Vec<u8> {
    if input.bytes() == 1 {
        codes.iter().map(|&c| c as u8).collect()
    } else {
        codes.iter().flat_map(|c| c.to_le_bytes()).collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Pool {
    Nhd,
    Hnd,
    Vectorized,
}

#[derive(Debug, Clone)]
struct Case {
    input: Input,
    kind: i32,
    pool: Pool,
    page: usize,
    group: bool,
    mask: Mask,
    per_page_scales: bool,
    hq: usize,
    hk: usize,
    d: usize,
    /// (new query rows, kv length) per sequence.
    lens: Vec<(usize, usize)>,
    /// Sequences after the first share its first full pages (prefix caching).
    share_prefix: bool,
    /// The traits' `max_splits` and `kv_split_tokens`.
    splits: (i32, i32),
}

fn base_traits(case: &Case, total_q: usize) -> fmha_kvcache_traits {
    let max_q = case.lens.iter().map(|l| l.0).max().unwrap_or(0);
    let max_k = case.lens.iter().map(|l| l.1).max().unwrap_or(0);
    fmha_kvcache_traits {
        struct_size: std::mem::size_of::<fmha_kvcache_traits>(),
        dtype: case.input.abi(),
        o_dtype: FMHA_DTYPE_BF16,
        hdim_q: case.d as i32,
        hdim_v: case.d as i32,
        nhead_q: case.hq as i32,
        nhead_k: case.hk as i32,
        is_group_mode: case.group as i32,
        mask_type: if case.mask.kind == MaskType::None { FMHA_MASK_NONE } else { FMHA_MASK_BOTTOM_RIGHT },
        has_lse: 1,
        kv_table_kind: case.kind,
        kv_layout: if case.pool == Pool::Vectorized { FMHA_KV_LAYOUT_VECTORIZED } else { FMHA_KV_LAYOUT_STRIDED },
        kv_scale_granularity: if case.per_page_scales { FMHA_KV_SCALE_PAGE } else { FMHA_KV_SCALE_TENSOR },
        page_size: case.page as i32,
        batch: case.lens.len() as i32,
        total_q: total_q as i32,
        max_seqlen_q: max_q as i32,
        max_seqlen_k: max_k as i32,
        max_splits: case.splits.0,
        kv_split_tokens: case.splits.1,
        check_tables: 1,
    }
}

const NO_SCALE: fmha_scale = fmha_scale { data: null(), batch_stride: 0, head_stride: 0, page_stride: 0 };
const NO_TENSOR: fmha_tensor = fmha_tensor { data: null_mut(), batch_stride: 0, head_stride: 0, row_stride: 0 };

/// Arguments with every pointer null, every count and stride 0, no descales and no workspace: the
/// calls below set what they use.
fn blank_args() -> fmha_kvcache_args {
    fmha_kvcache_args {
        struct_size: std::mem::size_of::<fmha_kvcache_args>(),
        q: NO_TENSOR,
        k: NO_TENSOR,
        v: NO_TENSOR,
        o: NO_TENSOR,
        lse: NO_TENSOR,
        seqstart_q: null(),
        batch: 0,
        seqlen_q: 0,
        num_pages: 0,
        max_pages_per_seq: 0,
        num_page_indices: 0,
        seqlen_k: null(),
        block_table: null(),
        block_table_stride: 0,
        kv_indptr: null(),
        page_indices: null(),
        last_page_len: null(),
        cache_batch_idx: null(),
        scale: 0.0,
        window_size_left: -1,
        window_size_right: -1,
        q_descale: NO_SCALE,
        k_descale: NO_SCALE,
        v_descale: NO_SCALE,
        workspace: null_mut(),
        workspace_size: 0,
        scheduler_workspace: null_mut(),
        scheduler_workspace_size: 0,
    }
}

/// Runs `case` (prepare, run, check) against the float64 reference; returns O's bits and the LSE
/// (None where this build refuses the case, as it must).
fn run_case(case: &Case, rng: &mut Rng, ctx: &str) -> Option<(Vec<u16>, Vec<f32>)> {
    let scheduler = rng.pick(&[false, true]);
    run_case_with(case, rng, ctx, scheduler)
}

/// `run_case`, the run given a scheduler workspace (poisoned: the run zeroes its counter) or not: with
/// one, sm_90a's masked tiles come from the counter on a persistent grid where there are more tiles
/// than SMs.
fn run_case_with(case: &Case, rng: &mut Rng, ctx: &str, scheduler: bool) -> Option<(Vec<u16>, Vec<f32>)> {
    let (hq, hk, d, p, input) = (case.hq, case.hk, case.d, case.page, case.input);
    let batch = case.lens.len();
    let contiguous = case.kind == FMHA_KV_CONTIGUOUS;
    let mut dev = Device::default();

    // Pages: sequence 0's are drawn first; with `share_prefix` the others start with its full pages.
    let pages_of: Vec<usize> = case.lens.iter().map(|l| l.1.div_ceil(p)).collect();
    let num_pages = if contiguous { batch + 2 } else { pages_of.iter().sum::<usize>() + 3 };
    let mut order: Vec<usize> = (0..num_pages).collect();
    for i in (1..num_pages).rev() {
        order.swap(i, rng.size(0, i));
    }
    let mut free = order.into_iter();
    let mut assigned: Vec<Vec<usize>> = Vec::new();
    for (b, &n) in pages_of.iter().enumerate() {
        let shared = if case.share_prefix && b > 0 && !contiguous {
            (case.lens[0].1 / p).min(n.saturating_sub(1)).min(assigned[0].len())
        } else {
            0
        };
        let mut pages: Vec<usize> = assigned.first().map_or(Vec::new(), |a: &Vec<usize>| a[..shared].to_vec());
        pages.extend(free.by_ref().take(if contiguous { 1 } else { n - shared }));
        assigned.push(pages);
    }

    // Pool addressing (elements): page, head and row strides; VECTORIZED orders within a page.
    let x = 16 / input.bytes();
    let (page_stride, head_stride, row_stride) = match case.pool {
        Pool::Nhd => (p * hk * d, d, hk * d),
        Pool::Hnd | Pool::Vectorized => (hk * p * d, p * d, d),
    };
    let at = |page: usize, g: usize, u: usize, e: usize, is_v: bool| -> usize {
        let base = page * page_stride + g * head_stride;
        match case.pool {
            Pool::Vectorized if is_v => base + (u / x) * d * x + e * x + u % x,
            Pool::Vectorized => base + (e / x) * p * x + u * x + e % x,
            _ => base + u * row_stride + e,
        }
    };
    let pool_len = num_pages * page_stride;
    let mut k_codes = vec![input.poison(); pool_len];
    let mut v_codes = vec![input.poison(); pool_len];
    let mut k_vals = vec![f64::NAN; pool_len];
    let mut v_vals = vec![f64::NAN; pool_len];
    let fp8 = matches!(input, Input::Fp8(_));
    let draw = |rng: &mut Rng| if fp8 { rng.unit() * 2.0 } else { rng.unit() };
    for pages in &assigned {
        for &page in pages {
            if !k_vals[at(page, 0, 0, 0, false)].is_nan() {
                continue; // a shared page, filled once
            }
            for g in 0..hk {
                for u in 0..p {
                    for e in 0..d {
                        for (codes, vals, is_v) in
                            [(&mut k_codes, &mut k_vals, false), (&mut v_codes, &mut v_vals, true)]
                        {
                            let (code, value) = input.encode(draw(rng));
                            let i = at(page, g, u, e, is_v);
                            codes[i] = code;
                            vals[i] = value;
                        }
                    }
                }
            }
        }
    }

    // Descales (fp8): q per (sequence, kv head); k/v per (sequence, kv head), or per (page, kv head)
    // packed as aiter's [num_pages][h_k][2].
    // Positive, as the ABI requires: [0.5, 2).
    let descale = |rng: &mut Rng| 1.25 + 0.75 * rng.unit();
    let seq_scales = |rng: &mut Rng| (0..batch * hk).map(|_| descale(rng) as f32).collect::<Vec<f32>>();
    let (mut q_ds, mut k_ds, mut v_ds) = (NO_SCALE, NO_SCALE, NO_SCALE);
    let (mut dq_of, mut dk_of, mut dv_of): (Vec<f32>, Vec<f32>, Vec<f32>) = (vec![], vec![], vec![]);
    if fp8 {
        dq_of = seq_scales(rng);
        q_ds = fmha_scale { data: dev.upload(&dq_of).cast(), batch_stride: hk as i64, head_stride: 1, page_stride: 0 };
        if case.per_page_scales {
            let packed: Vec<f32> = (0..num_pages * hk * 2).map(|_| descale(rng) as f32).collect();
            let base: *const f32 = dev.upload(&packed).cast();
            let two_hk = 2 * hk as i64;
            k_ds = fmha_scale { data: base, batch_stride: 0, head_stride: 2, page_stride: two_hk };
            // SAFETY: one element further inside the same allocation.
            v_ds = fmha_scale { data: unsafe { base.add(1) }, batch_stride: 0, head_stride: 2, page_stride: two_hk };
            dk_of = (0..num_pages * hk).map(|i| packed[2 * i]).collect();
            dv_of = (0..num_pages * hk).map(|i| packed[2 * i + 1]).collect();
        } else {
            dk_of = seq_scales(rng);
            dv_of = seq_scales(rng);
            k_ds =
                fmha_scale { data: dev.upload(&dk_of).cast(), batch_stride: hk as i64, head_stride: 1, page_stride: 0 };
            v_ds =
                fmha_scale { data: dev.upload(&dv_of).cast(), batch_stride: hk as i64, head_stride: 1, page_stride: 0 };
        }
    }
    let k_scale = |b: usize, g: usize, page: usize| -> f64 {
        if !fmha_fp8(input) {
            1.0
        } else if case.per_page_scales {
            f64::from(dk_of[page * hk + g])
        } else {
            f64::from(dk_of[b * hk + g])
        }
    };
    let v_scale = |b: usize, g: usize, page: usize| -> f64 {
        if !fmha_fp8(input) {
            1.0
        } else if case.per_page_scales {
            f64::from(dv_of[page * hk + g])
        } else {
            f64::from(dv_of[b * hk + g])
        }
    };

    // Queries: group mode [total][hq][d]; batch mode [batch][sq][hq][d] (every sequence sq rows).
    let q_lens: Vec<i32> = case.lens.iter().map(|l| l.0 as i32).collect();
    let seqstart_q = starts(&q_lens);
    let total_q = *seqstart_q.last().unwrap() as usize;
    let sq_batch = case.lens[0].0;
    let mut q_codes = Vec::with_capacity(total_q * hq * d);
    let mut q_vals = Vec::with_capacity(total_q * hq * d);
    for _ in 0..total_q * hq * d {
        let (code, value) = input.encode(draw(rng));
        q_codes.push(code);
        q_vals.push(value);
    }

    // The table.
    let kv_lens: Vec<i32> = case.lens.iter().map(|l| l.1 as i32).collect();
    let garbage = [i32::MAX, -1, num_pages as i32, i32::MIN];
    let mut args = fmha_kvcache_args {
        batch: batch as i32,
        seqlen_q: if case.group { total_q as i32 } else { sq_batch as i32 },
        num_pages: num_pages as i32,
        window_size_left: case.mask.left,
        window_size_right: case.mask.right,
        q_descale: q_ds,
        k_descale: k_ds,
        v_descale: v_ds,
        ..blank_args()
    };
    match case.kind {
        FMHA_KV_CONTIGUOUS => {
            args.seqlen_k = dev.upload(&kv_lens).cast();
            let slots: Vec<i32> = assigned.iter().map(|pages| pages[0] as i32).collect();
            args.cache_batch_idx = dev.upload(&slots).cast();
        }
        FMHA_KV_BLOCK_TABLE => {
            let max_pages = pages_of.iter().copied().max().unwrap().max(1) + rng.size(0, 2);
            let stride = max_pages + rng.size(0, 2);
            let mut rows = vec![0i32; (batch - 1) * stride + max_pages];
            for (b, pages) in assigned.iter().enumerate() {
                for t in 0..stride.min(rows.len() - b * stride) {
                    rows[b * stride + t] = pages.get(t).map_or(rng.pick(&garbage), |&page| page as i32);
                }
            }
            args.seqlen_k = dev.upload(&kv_lens).cast();
            args.block_table = dev.upload(&rows).cast();
            args.block_table_stride = stride as i64;
            args.max_pages_per_seq = max_pages as i32;
        }
        _ => {
            let mut indices: Vec<i32> = assigned.iter().flatten().map(|&page| page as i32).collect();
            indices.push(rng.pick(&garbage)); // past the last sequence's pages
            let counts: Vec<i32> = assigned.iter().map(|pages| pages.len() as i32).collect();
            let last: Vec<i32> =
                case.lens.iter().map(|l| if l.1 == 0 { 0 } else { ((l.1 - 1) % p + 1) as i32 }).collect();
            args.kv_indptr = dev.upload(&starts(&counts)).cast();
            args.page_indices = dev.upload(&indices).cast();
            args.num_page_indices = indices.len() as i32;
            args.last_page_len = dev.upload(&last).cast();
        }
    }

    let row = (hq * d) as i64;
    let tensor =
        |data, batch_stride, head_stride, row_stride| fmha_tensor { data, batch_stride, head_stride, row_stride };
    let q_batch_stride = if case.group { 0 } else { (sq_batch * hq * d) as i64 };
    args.q = tensor(dev.upload(&pack(input, &q_codes)), q_batch_stride, d as i64, row);
    let o_len = total_q * hq * d;
    let o = dev.upload(&vec![0xFFFFu16; o_len]); // NaN in fp16 and bf16
    args.o = tensor(o, q_batch_stride, d as i64, row);
    let lse_len = hq * total_q;
    let lse = dev.upload(&vec![f32::NAN; lse_len]);
    args.lse = if case.group {
        tensor(lse, 0, total_q as i64, 1)
    } else {
        tensor(lse, (hq * sq_batch) as i64, sq_batch as i64, 1)
    };
    let pool = |data| tensor(data, page_stride as i64, head_stride as i64, row_stride as i64);
    args.k = pool(dev.upload(&pack(input, &k_codes)));
    args.v = pool(dev.upload(&pack(input, &v_codes)));
    if case.group {
        args.seqstart_q = dev.upload(&seqstart_q).cast();
    }

    // Launcher: prepare, run, check. GPU builds refuse what they have no kernel for.
    let traits = base_traits(case, total_q);
    let mut launcher = null_mut();
    if let Some(field) = gpu_lacks(case) {
        expect_error(fmha_kvcache_launcher_create(&traits, &mut launcher), FMHA_ERR_UNSUPPORTED, &[field]);
        return None;
    }
    ok(fmha_kvcache_launcher_create(&traits, &mut launcher));
    let mut bytes = 0;
    ok(fmha_kvcache_launcher_workspace_size(launcher, &mut bytes));
    let workspace = dev.upload(&vec![0xFFu8; bytes]); // NaN partials: each must be written before it is read
    args.workspace = workspace;
    args.workspace_size = bytes;
    if scheduler {
        let mut scheduler = 0;
        ok(fmha_kvcache_launcher_scheduler_workspace_size(launcher, &mut scheduler));
        args.scheduler_workspace = dev.upload(&vec![0x7Fu8; scheduler]);
        args.scheduler_workspace_size = scheduler;
    }
    let mut stream = null_mut();
    ok(fmha_stream_create(&mut stream));
    ok(fmha_kvcache_launcher_prepare_async(launcher, &args, stream));
    let status = fmha_kvcache_launcher_run(launcher, &args, stream);
    assert_eq!(status, FMHA_OK, "{ctx}: {}", last_error());
    let status = fmha_stream_synchronize(stream);
    assert_eq!(status, FMHA_OK, "{ctx}: {}", last_error());
    let status = fmha_kvcache_launcher_check(launcher, workspace, bytes, stream);
    assert_eq!(status, FMHA_OK, "{ctx}: {}", last_error());
    ok(fmha_stream_destroy(stream));
    ok(fmha_kvcache_launcher_destroy(launcher));

    let o_bits: Vec<u16> = Device::download(o, o_len);
    let o_out: Vec<f64> = o_bits.iter().map(|&bits| input.output_value(bits)).collect();
    let lse_out: Vec<f32> = Device::download(lse, lse_len);

    // Reference per sequence, on the true (dequantised) values.
    let problem = RefProblem {
        nhead_q: hq,
        nhead_k: hk,
        hdim_q: d,
        hdim_v: d,
        scale: 1.0 / (d as f64).sqrt(),
        mask: case.mask,
        seqlens: case.lens.clone(),
    };
    let (mut err_max, mut base_max, mut err_sum, mut base_sum, mut count) = (0f64, 0f64, 0f64, 0f64, 0usize);
    for (b, &(sq, kv)) in case.lens.iter().enumerate() {
        let q_start = seqstart_q[b] as usize;
        let mut q = vec![0.0; hq * sq * d];
        for h in 0..hq {
            let dq = if fp8 { f64::from(dq_of[b * hk + h / (hq / hk)]) } else { 1.0 };
            for i in 0..sq {
                for e in 0..d {
                    q[(h * sq + i) * d + e] = q_vals[((q_start + i) * hq + h) * d + e] * dq;
                }
            }
        }
        let (mut k, mut v) = (vec![0.0; hk * kv * d], vec![0.0; hk * kv * d]);
        for g in 0..hk {
            for j in 0..kv {
                let (page, u) = if contiguous { (assigned[b][0], j) } else { (assigned[b][j / p], j % p) };
                for e in 0..d {
                    k[(g * kv + j) * d + e] = k_vals[at(page, g, u, e, false)] * k_scale(b, g, page);
                    v[(g * kv + j) * d + e] = v_vals[at(page, g, u, e, true)] * v_scale(b, g, page);
                }
            }
        }
        let exact = problem.forward(b, &q, &k, &v, Precision::F64).unwrap();
        let low = problem.forward(b, &q, &k, &v, input.baseline()).unwrap();
        for h in 0..hq {
            for i in 0..sq {
                let (r, lse_at) = if case.group {
                    ((q_start + i) * hq + h, h * total_q + q_start + i)
                } else {
                    ((b * sq_batch + i) * hq + h, (b * hq + h) * sq_batch + i)
                };
                for e in 0..d {
                    let want = exact.o[(h * sq + i) * d + e];
                    let (err, base) = ((o_out[r * d + e] - want).abs(), (low.o[(h * sq + i) * d + e] - want).abs());
                    assert!(!err.is_nan(), "{ctx}: sequence {b} head {h} row {i}: NaN (a poisoned element was read)");
                    (err_max, base_max, err_sum, base_sum, count) =
                        (err_max.max(err), base_max.max(base), err_sum + err, base_sum + base, count + 1);
                }
                let (got, want) = (f64::from(lse_out[lse_at]), exact.lse[h * sq + i]);
                let lse_err = if got == want { 0.0 } else { (got - want).abs() };
                let accumulation = if fp8 {
                    fp8_accumulation(d, problem.scale * abs_dot_max(&q, &k, h, i, (hq, hk, sq, kv, d)))
                } else {
                    0.0
                };
                assert!(
                    lse_err <= 1e-4 * (1.0 + want.abs()) + accumulation,
                    "{ctx}: sequence {b} head {h} row {i}: LSE {got} vs {want}"
                );
            }
        }
    }
    // The field's rules (spec/inference.md §2.5, design.md): fp16/bf16 within 2× the error of the
    // same computation in the input precision; fp8: `fp8_output_rule`.
    if fp8 {
        fp8_output_rule(ctx, (err_max, base_max), (err_sum, base_sum), count);
    } else {
        let floor = 0.25 * 2f64.powi(-7);
        assert!(err_max <= 2.0 * base_max + floor, "{ctx}: O max error {err_max:e} > 2 × {base_max:e} + {floor:e}");
    }
    Some((o_bits, lse_out))
}

fn fmha_fp8(input: Input) -> bool {
    matches!(input, Input::Fp8(_))
}

/// What this build's kv-cache kernels lack for `case` (the field the refusal names); None where they
/// run it. The host backend runs everything; the GPU kernels read strided pools and take fp8 in the
/// device's own format (sm90 and gfx950: OCP e4m3fn; gfx942: e4m3fnuz); per-page descales sm90 takes
/// for pages of whole tiles, the AMD kernels not at all.
fn gpu_lacks(case: &Case) -> Option<&'static str> {
    if host_backend() {
        return None;
    }
    let arch = current_arch();
    let native = match arch {
        Arch::Sm90 | Arch::Gfx950 => Some(Fp8Format::E4m3fn),
        Arch::Gfx942 => Some(Fp8Format::E4m3fnuz),
        _ => None,
    };
    // In the launcher's order: the kernel for the dtype, then the layout, then the descales.
    let fp8 = match case.input {
        Input::Fp8(format) if Some(format) == native => true,
        Input::Fp8(_) => return Some("kvcache"),
        _ => false,
    };
    if case.pool == Pool::Vectorized {
        return Some("kv_layout");
    }
    // Per-page descales: sm90, pages holding whole 128-key tiles.
    // Per-page descales on a GPU: pages of whole key tiles (sm90 fp8: 128 keys, AMD fp8: 64).
    let tile = if arch == Arch::Sm90 { 128 } else { 64 };
    (fp8 && case.per_page_scales && case.page % tile != 0).then_some("kv_scale_granularity")
}

/// GPU builds without a device only check the clean failure elsewhere.
fn skip() -> bool {
    no_device()
}

fn random_case(rng: &mut Rng, input: Input) -> Case {
    let kind = rng.pick(&[FMHA_KV_PAGE_CSR, FMHA_KV_BLOCK_TABLE, FMHA_KV_CONTIGUOUS]);
    let group = rng.range(0, 3) != 0;
    let batch = rng.size(1, 4);
    let sq_fixed = rng.size(0, 9);
    let lens: Vec<(usize, usize)> = (0..batch)
        .map(|_| {
            let kv = if rng.range(0, 4) == 0 { rng.size(0, 1) } else { rng.size(1, 80) };
            let sq = if group { rng.size(0, kv.max(1)).min(kv + rng.size(0, 1)) } else { sq_fixed };
            (sq, kv)
        })
        .collect();
    let max_kv = lens.iter().map(|l| l.1).max().unwrap().max(1);
    let vectorized = rng.range(0, 3) == 0;
    let x = 16 / if fmha_fp8(input) { 1 } else { 2 };
    let page = if kind == FMHA_KV_CONTIGUOUS {
        (max_kv + rng.size(0, 3)).next_multiple_of(if vectorized { x } else { 1 })
    } else if vectorized {
        rng.pick(&[16, 32, 128])
    } else {
        rng.pick(&[1, 5, 16, 19, 128, 1024])
    };
    let pool = if vectorized { Pool::Vectorized } else { rng.pick(&[Pool::Nhd, Pool::Hnd]) };
    let mask = rng.pick(&[
        Mask::NONE,
        Mask::causal(MaskType::BottomRight),
        Mask { kind: MaskType::BottomRight, left: 7, right: 0 },
        Mask { kind: MaskType::BottomRight, left: 3, right: 5 },
    ]);
    let (hq, hk) = rng.pick(&[(4, 2), (2, 2), (4, 1)]);
    Case {
        input,
        kind,
        pool,
        page,
        group,
        mask,
        per_page_scales: fmha_fp8(input) && kind != FMHA_KV_CONTIGUOUS && rng.range(0, 1) == 1,
        hq,
        hk,
        d: rng.pick(&[16, 32, 48]),
        lens,
        share_prefix: rng.range(0, 2) == 0,
        splits: (rng.pick(&[0, 1, 2, 5]), 0),
    }
}

#[test]
fn random_batches_match_the_reference() {
    if skip() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for case_index in 0..48 {
        let input =
            [Input::Bf16, Input::F16, Input::Fp8(Fp8Format::E4m3fn), Input::Fp8(Fp8Format::E4m3fnuz)][case_index % 4];
        let case = random_case(&mut rng, input);
        let ctx = format!("seed {seed} case {case_index}: {case:?}");
        run_case(&case, &mut rng, &ctx);
    }
}

/// The sizes the issue names, each once: pages of 1, 16, 128 and 1024 tokens, kv lengths that are not
/// multiples of them, sequences of length 0 and 1.
#[test]
fn page_sizes_and_edge_lengths() {
    if skip() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for (i, page) in [1usize, 16, 128, 1024].into_iter().enumerate() {
        for kind in [FMHA_KV_BLOCK_TABLE, FMHA_KV_PAGE_CSR] {
            let case = Case {
                input: if i % 2 == 0 { Input::Bf16 } else { Input::Fp8(Fp8Format::E4m3fn) },
                kind,
                pool: Pool::Nhd,
                page,
                group: true,
                mask: Mask::causal(MaskType::BottomRight),
                per_page_scales: i == 3,
                hq: 4,
                hk: 2,
                d: 32,
                lens: vec![(1, 1), (0, 17), (3, 0), (5, 130), (2, 1025), (1, 2)],
                share_prefix: false,
                splits: (0, 0),
            };
            run_case(&case, &mut rng, &format!("seed {seed}: page {page} kind {kind}"));
        }
    }
}

/// fp8 at the full head dim over many key tiles (the GPU kernel's transposed-V path at its shape):
/// both table formats, small and tile-sized pages (with per-page descales), causal and not, GQA.
#[test]
fn fp8_full_head_dim_over_many_tiles() {
    if skip() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for (i, (kind, page)) in
        [(FMHA_KV_PAGE_CSR, 16usize), (FMHA_KV_BLOCK_TABLE, 128), (FMHA_KV_BLOCK_TABLE, 7)].into_iter().enumerate()
    {
        let case = Case {
            input: Input::Fp8(Fp8Format::E4m3fn),
            kind,
            pool: if i == 1 { Pool::Hnd } else { Pool::Nhd },
            page,
            group: i != 2,
            mask: if i == 0 { Mask::NONE } else { Mask::causal(MaskType::BottomRight) },
            per_page_scales: i == 1,
            hq: 4,
            hk: 2,
            d: 128,
            lens: if i == 2 { vec![(200, 333), (200, 600)] } else { vec![(130, 400), (1, 1), (257, 700)] },
            share_prefix: i == 0,
            splits: (0, 0),
        };
        run_case(&case, &mut rng, &format!("seed {seed}: fp8 d128 page {page} kind {kind}"));
    }
}

/// Head dims inside the D = 128 bucket but below it (the GPU's D = 128 prefill tile with columns past the
/// head dim): pages whose size no run of rows divides (sm90 gathers those rows with lanes that pass each
/// other the rows' offsets, with and without a run wholly inside the sequence in one warp) and pages of 16
/// and 24, kv lengths over several key tiles and not multiples of them, bf16 and fp8.
#[test]
fn head_dims_below_the_bucket_on_gathered_pages() {
    if skip() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for (i, (d, page)) in [(96usize, 1usize), (112, 3), (80, 16), (96, 24), (120, 5)].into_iter().enumerate() {
        let case = Case {
            input: if i % 2 == 0 { Input::Bf16 } else { Input::Fp8(Fp8Format::E4m3fn) },
            kind: if i % 2 == 0 { FMHA_KV_BLOCK_TABLE } else { FMHA_KV_PAGE_CSR },
            pool: if i == 3 { Pool::Hnd } else { Pool::Nhd },
            page,
            group: true,
            mask: if i == 4 { Mask::NONE } else { Mask::causal(MaskType::BottomRight) },
            per_page_scales: false,
            hq: 4,
            hk: 2,
            d,
            lens: vec![(130, 300), (1, 257), (64, 64), (200, 455)],
            share_prefix: i == 1,
            splits: (0, 0),
        };
        run_case(&case, &mut rng, &format!("seed {seed}: d {d} page {page}"));
    }
}

/// Split-KV decode (spec/inference.md §3): few query rows per sequence against long caches, every
/// split count from 1 to the longest sequence's tile count, the heuristic, and fixed chunk lengths;
/// empty and one-token sequences and lengths on page boundaries; both table formats, fp8 and GQA.
/// The workspace starts as NaN, so a partial read before it is written fails the NaN check; a rerun
/// gives the same bits.
#[test]
fn split_kv_decode_matches_the_reference() {
    if skip() {
        return;
    }
    // The host backend plans chunks for an H100-sized GPU (its default, one CU per thread, would
    // rarely split); results may not depend on it.
    if host_backend() {
        ok(fmha_host_set_cu_count(132));
    }
    let rng = Rng::fresh();
    let seed = rng.0;
    let lens = vec![(1usize, 700usize), (4, 0), (1, 1), (16, 2048), (3, 129), (1, 256)];
    // Bounds on the adaptive chunks, then fixed chunks of 1..16 key tiles (the longest sequence's 16
    // tiles in 16 down to 1 chunks), then the heuristic.
    let tiles = 2048 / 128;
    let mut splits: Vec<(i32, i32)> = (1..=tiles).map(|s| (s, 0)).collect();
    splits.extend([1, 2, 3, 5, 7, 16].map(|t| (0, 128 * t)));
    splits.extend([(0, 0), (0, 200), (64, 1000)]);
    for (i, &split) in splits.iter().enumerate() {
        let input = match i % 4 {
            0 => Input::Fp8(Fp8Format::E4m3fn),
            1 => Input::F16,
            _ => Input::Bf16,
        };
        let case = Case {
            input,
            kind: if i % 2 == 0 { FMHA_KV_PAGE_CSR } else { FMHA_KV_BLOCK_TABLE },
            pool: if i % 3 == 0 { Pool::Hnd } else { Pool::Nhd },
            page: [16, 1, 128, 5][i % 4],
            group: i % 5 != 4,
            mask: if i % 3 == 1 {
                Mask { kind: MaskType::BottomRight, left: 300, right: 0 }
            } else {
                Mask::causal(MaskType::BottomRight)
            },
            per_page_scales: false,
            hq: 8,
            hk: 2,
            d: if i % 2 == 0 { 128 } else { 64 },
            lens: if i % 5 == 4 { lens.iter().map(|l| (2, l.1)).collect() } else { lens.clone() },
            share_prefix: i % 2 == 1,
            splits: split,
        };
        let ctx = format!("seed {seed}: splits {split:?} {case:?}");
        let case_seed = rng.0 ^ i as u64;
        let first = run_case(&case, &mut Rng(case_seed), &ctx);
        if i % 6 == 0 {
            assert_eq!(first, run_case(&case, &mut Rng(case_seed), &ctx), "{ctx}: a rerun changed the bits");
        }
    }
}

/// The pipeline of the instance a launcher for `case` runs (its plan's first stage).
fn planned_pipeline(case: &Case) -> String {
    let traits = base_traits(case, case.lens.iter().map(|l| l.0).sum());
    let mut launcher = null_mut();
    ok(fmha_kvcache_launcher_create(&traits, &mut launcher));
    let mut required = 0usize;
    ok(fmha_kvcache_launcher_plan_json(launcher, null_mut(), 0, &mut required));
    let mut buffer = vec![0u8; required + 1];
    ok(fmha_kvcache_launcher_plan_json(launcher, buffer.as_mut_ptr() as *mut _, buffer.len(), &mut required));
    ok(fmha_kvcache_launcher_destroy(launcher));
    let json = std::str::from_utf8(&buffer[..required]).unwrap();
    let at = json.find("\"pipeline\":\"").expect("the plan names its instance") + "\"pipeline\":\"".len();
    json[at..at + json[at..].find('"').unwrap()].to_string()
}

/// Decode with packed GQA at D = 128 for 16-bit and fp8 inputs: on sm_90a the warp-specialized tile
/// where TMA boxes take a tile's (query row, query head) pairs (the GQA group divides its 128 rows) and
/// the descales are uniform (its producer takes every page: TMA boxes of whole-tile pages, gathered
/// others). Every group from 1 to 16, up to the 128 rows of one tile, pages of 1 to 256, both table
/// formats and layouts, batch and varlen queries, every mask, split and unsplit; a group of 6 and fp8
/// per-page descales take the one-warpgroup tile of the cp.async kernel.
#[test]
fn packed_decode_on_every_group_and_page() {
    if skip() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    let pages = [8usize, 16, 1, 64, 128, 256, 5, 48];
    for i in 0..16 {
        let input = if i % 2 == 0 { Input::Bf16 } else { Input::F16 };
        packed_decode(i, input, pages[i % pages.len()], false, 128, &mut rng, seed);
    }
    // fp8: the warp-specialized tile takes every page size; per-page descales take the one-warpgroup tile.
    for (i, page) in [8usize, 16, 128, 1, 256, 3, 128, 24].into_iter().enumerate() {
        packed_decode(i, Input::Fp8(Fp8Format::E4m3fn), page, i == 6, 128, &mut rng, seed);
    }
}

/// The same at D = 64 (and 40) and D = 256 (and 200) for 16-bit inputs: on sm_90a the warp-specialized
/// tile (D = 256: 64 keys, pages of 64 and 128 as TMA boxes, others gathered); a group of 6 takes D = 64's
/// one-warpgroup tile and, at D = 256, which has none, the prefill tile.
#[test]
fn packed_decode_at_d64_and_d256() {
    if skip() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    let pages = [16usize, 1, 128, 5, 32, 64];
    for i in 0..12 {
        let input = if i % 2 == 0 { Input::Bf16 } else { Input::F16 };
        let d = if i < 6 { [64, 40][i % 2] } else { [256, 200][i % 2] };
        packed_decode(i, input, pages[i % pages.len()], false, d, &mut rng, seed);
    }
}

/// Case `i` of the packed decode tests at head dim `d`: its heads, masks, lengths and splits by `i`.
fn packed_decode(i: usize, input: Input, page: usize, per_page_scales: bool, d: usize, rng: &mut Rng, seed: u64) {
    let heads = [(4, 4), (8, 4), (8, 2), (16, 2), (32, 2), (12, 2)];
    let (hq, hk) = heads[i % heads.len()];
    let group_size = hq / hk;
    let varlen = i % 3 == 1;
    // sm_90a's warp-specialized tile (128 rows) where it takes the group and the descales, else the
    // one-warpgroup tile (64 rows).
    let fp8 = fmha_fp8(input);
    let boxes = 128 % group_size == 0 && !per_page_scales;
    let rows = (if boxes { 128 } else { 64 } / group_size).max(1);
    // One sequence fills the tile (varlen), the others take fewer rows; kv lengths of none, one key, a
    // page boundary and several key tiles.
    let sq = |full: bool| if full || !varlen { rows } else { 1 + i % rows };
    let lens = vec![(sq(true), 700), (sq(false), 0), (sq(false), 1), (sq(false), 2 * page), (sq(false), 1025)];
    let case = Case {
        input,
        kind: if i % 2 == 0 { FMHA_KV_PAGE_CSR } else { FMHA_KV_BLOCK_TABLE },
        pool: if i % 4 < 2 { Pool::Nhd } else { Pool::Hnd },
        page,
        group: varlen,
        mask: [
            Mask::NONE,
            Mask::causal(MaskType::BottomRight),
            Mask { kind: MaskType::BottomRight, left: 300, right: 0 },
        ][i % 3],
        per_page_scales,
        hq,
        hk,
        d,
        lens,
        share_prefix: i % 2 == 1,
        splits: [(0, 0), (1, 0), (3, 0), (0, 256)][i % 4],
    };
    let expected = match (boxes, fp8) {
        (true, false) => "wgmma_ws_paged_gqa",
        (false, false) if d > 128 => "wgmma_ws_paged",
        (false, false) => "wgmma_cp_async_paged_gqa",
        (true, true) => "wgmma_ws_paged_vt_gqa",
        (false, true) => "wgmma_cp_async_paged_vt_gqa",
    };
    run_planned(&case, expected, rng, &format!("seed {seed}: case {i} {case:?}"));
}

/// Prefill at D = 128 for 16-bit inputs (on sm_90a the warp-specialized instance: its producer loads K
/// and V as TMA boxes of whole-tile pages or gathers other pages, a page lookup per run of rows or, for
/// pages that are not a multiple of the run, per row): pages of 1 to 256 tokens, both table formats and
/// layouts, batch and varlen queries, every mask, shared prefixes.
#[test]
fn prefill_at_d128_on_every_page() {
    prefill_on_pages(&[1, 5, 16, 48, 64, 128, 256], |_| 128);
}

/// The same at D = 64 and at a head dim below it (40: TMA boxes and gathered rows with zero columns past
/// it), on sm_90a the warp-specialized instance of the 64 bucket, its runs of 8 rows: pages of 1, 3 and
/// 5 (a page lookup per row), 8 and 16 (gathered runs), 32 (a box per page), 128 and 256 (whole tiles).
#[test]
fn prefill_at_d64_on_every_page() {
    prefill_on_pages(&[1, 3, 5, 8, 16, 32, 128, 256], |i| if i % 3 == 1 { 40 } else { 64 });
}

/// Case i of the 16-bit prefill tests (`prefill_case`, bf16 and fp16 in turn) on pages of `pages[i]` tokens
/// at head dim `head_dim(i)`, on sm_90a the warp-specialized instance.
fn prefill_on_pages(pages: &[usize], head_dim: impl Fn(usize) -> usize) {
    if skip() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for (i, &page) in pages.iter().enumerate() {
        let base = prefill_case(i, if i % 2 == 0 { Input::Bf16 } else { Input::F16 }, page);
        let case = Case { d: head_dim(i), ..base };
        run_planned(&case, "wgmma_ws_paged", &mut rng, &format!("seed {seed}: page {page} {case:?}"));
    }
}

/// Prefill and decode at D = 256 (and 200: zero columns past it) for 16-bit inputs, on sm_90a the
/// warp-specialized kernel's tiles of 64 keys: TMA boxes for pages of 32 (a box per page), 64 and 128
/// (whole tiles), gathered runs of 16 rows for pages of 16, a page lookup per row for pages of 1 and 5;
/// both table formats and layouts, batch and varlen queries, every mask; decode rows (one query row
/// against long caches: the packed-GQA tile of the same kernel) split and unsplit.
#[test]
fn prefill_and_decode_at_d256() {
    if skip() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for (i, page) in [1usize, 16, 128, 5, 64, 16, 32, 128].into_iter().enumerate() {
        let base = prefill_case(i, if i % 2 == 0 { Input::Bf16 } else { Input::F16 }, page);
        let d = if i == 3 || i == 7 { 200 } else { 256 };
        let decode = i == 4 || i == 5;
        let case = if decode {
            let lens = vec![(1, 1500), (1, 0), (1, 2 * page + 1), (1, 700)];
            Case { d, lens, group: i == 5, splits: (if i == 4 { 3 } else { 0 }, 0), ..base }
        } else {
            Case { d, ..base }
        };
        let expected = if decode { "wgmma_ws_paged_gqa" } else { "wgmma_ws_paged" };
        run_planned(&case, expected, &mut rng, &format!("seed {seed}: page {page} {case:?}"));
    }
}

/// fp8 prefill with uniform descales: on sm_90a the warp-specialized tile, V transposed by its producer
/// warpgroup, K and V tiles TMA boxes of whole-tile pages or gathered (cp.async) from other ones. Pages
/// of 1 to 1024 tokens, both table formats and layouts, batch and
/// varlen queries, every mask, GQA and MHA, head dims 128 and 64 (zero columns past it), sequences that
/// end inside a tile (their last V tile with zeros past them), empty ones, split and unsplit.
#[test]
fn fp8_prefill_on_the_warp_specialized_tile() {
    if skip() {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for (i, page) in [128usize, 16, 1024, 1, 256, 8, 7, 32].into_iter().enumerate() {
        let base = prefill_case(i, Input::Fp8(Fp8Format::E4m3fn), page);
        let lens = if base.group {
            vec![(200, 333), (1, 1), (130, 700), (0, 5), (257, 257), (3, 0)]
        } else {
            vec![(140, 333), (140, 1100), (140, 140)]
        };
        let (hq, hk) = if i % 2 == 0 { (8, 2) } else { (4, 4) };
        let d = if i < 5 { 128 } else { 64 };
        let case = Case { lens, hq, hk, d, splits: (if i % 4 == 3 { 3 } else { 0 }, 0), ..base };
        run_planned(&case, "wgmma_ws_paged_vt", &mut rng, &format!("seed {seed}: page {page} {case:?}"));
    }
}

/// Causal prefill with more tiles than an H200 has SMs (3 q tiles × 16 heads × 4 sequences), run with and
/// without a scheduler workspace: with one, sm_90a takes the tiles from its counter on a persistent grid.
/// Pages gathered, of tile pieces and of whole-tile TMA boxes; 16- and 8-bit inputs, D = 128 and 64.
/// sm_90a only (the other backends have no counter, and the other tests run these paths there).
#[test]
fn prefill_with_more_tiles_than_sms() {
    more_tiles_than_sms(&[
        (Input::Bf16, 16, 128),
        (Input::Bf16, 32, 128),
        (Input::Fp8(Fp8Format::E4m3fn), 128, 128),
        (Input::F16, 16, 64),
    ]);
}

/// The same at D = 256 (64-key tiles): pages gathered and of tile pieces (TMA boxes). A test of its own:
/// the float64 reference at D = 256 costs twice as much.
#[test]
fn d256_prefill_with_more_tiles_than_sms() {
    more_tiles_than_sms(&[(Input::Bf16, 16, 256), (Input::F16, 32, 256)]);
}

/// Runs each (input, page, head dim) of `cases` as a causal varlen prefill of more tiles than SMs, with and
/// without a scheduler workspace, on sm_90a's warp-specialized kernel.
fn more_tiles_than_sms(cases: &[(Input, usize, usize)]) {
    let arch = current_arch();
    if skip() || arch != Arch::Sm90 {
        return;
    }
    let mut rng = Rng::fresh();
    let seed = rng.0;
    for (i, &(input, page, d)) in cases.iter().enumerate() {
        let base = prefill_case(3 * i, input, page); // (varlen, causal)
        let case = Case { hq: 16, hk: 4, d, lens: vec![(300, 400), (260, 260), (300, 500), (129, 200)], ..base };
        let pipeline = if matches!(input, Input::Fp8(_)) { "wgmma_ws_paged_vt" } else { "wgmma_ws_paged" };
        assert_eq!(planned_pipeline(&case), pipeline, "seed {seed}: {case:?}");
        for scheduler in [true, false] {
            run_case_with(
                &case,
                &mut rng,
                &format!("seed {seed}: scheduler workspace {scheduler} {case:?}"),
                scheduler,
            );
        }
    }
}

/// Case `i` of the D = 128 prefill tests: `input` on pages of `page` tokens, 8 query / 2 kv heads; by `i`
/// the table format, the pool layout, the mask, shared prefixes, and varlen queries (batch mode when
/// `i % 3 == 2`).
fn prefill_case(i: usize, input: Input, page: usize) -> Case {
    let varlen = i % 3 != 2;
    Case {
        input,
        kind: if i % 2 == 0 { FMHA_KV_BLOCK_TABLE } else { FMHA_KV_PAGE_CSR },
        pool: if i % 4 < 2 { Pool::Hnd } else { Pool::Nhd },
        page,
        group: varlen,
        mask: [
            Mask::causal(MaskType::BottomRight),
            Mask::NONE,
            Mask { kind: MaskType::BottomRight, left: 100, right: 20 },
        ][i % 3],
        per_page_scales: false,
        hq: 8,
        hk: 2,
        d: 128,
        lens: if varlen {
            vec![(200, 333), (1, 1), (130, 700), (0, 5), (257, 257)]
        } else {
            vec![(140, 333), (140, 700), (140, 140)]
        },
        share_prefix: i % 2 == 1,
        splits: (0, 0),
    }
}

/// The current device's architecture (`Other` on the host backend).
fn current_arch() -> Arch {
    fmha::runtime::current().and_then(|r| r.arch()).unwrap_or(Arch::Other)
}

/// Runs `case` against the reference; on sm_90a first asserts that its launcher plans `pipeline`.
fn run_planned(case: &Case, pipeline: &str, rng: &mut Rng, ctx: &str) {
    let arch = current_arch();
    if arch == Arch::Sm90 {
        assert_eq!(planned_pipeline(case), pipeline, "{ctx}");
    }
    run_case(case, rng, ctx);
}

/// Pages laid out contiguously give the dense forward's bits (same tiles, same loop, same descales),
/// for bf16 and for fp8 inputs with per-(sequence, kv head) descales.
#[test]
fn paged_equals_dense_bitwise_on_contiguous_pages() {
    if skip() {
        return;
    }
    for input in [Input::Bf16, Input::Fp8(Fp8Format::E4m3fn), Input::Fp8(Fp8Format::E4m3fnuz)] {
        if host_backend() || input != Input::Fp8(Fp8Format::E4m3fnuz) {
            paged_equals_dense(input);
        }
    }
}

fn paged_equals_dense(input: Input) {
    let (hq, hk, d, p) = (4usize, 2usize, 64usize, 16usize);
    let lens = [(5usize, 40usize), (17, 17), (0, 9), (33, 100)];
    let mut rng = Rng::fresh();
    let mut dev = Device::default();
    let pages: Vec<usize> = lens.iter().map(|l| l.1.div_ceil(p)).collect();
    let first_page = starts(&pages.iter().map(|&n| n as i32).collect::<Vec<_>>());
    let num_pages = *first_page.last().unwrap() as usize;
    let pool_len = num_pages * p * hk * d;
    let mut codes = |n: usize| pack(input, &(0..n).map(|_| input.encode(rng.unit() * 2.0).0).collect::<Vec<_>>());
    let (k, v) = (codes(pool_len), codes(pool_len));
    let q_lens: Vec<i32> = lens.iter().map(|l| l.0 as i32).collect();
    let seqstart_q = starts(&q_lens);
    let total_q = *seqstart_q.last().unwrap() as usize;
    let q = codes(total_q * hq * d);
    let (kp, vp, qp) = (dev.upload(&k), dev.upload(&v), dev.upload(&q));
    // fp8: descales per (sequence, kv head), in [0.5, 2).
    let mut descale = || {
        if !fmha_fp8(input) {
            return NO_SCALE;
        }
        let values: Vec<f32> = (0..lens.len() * hk).map(|_| (1.25 + 0.75 * rng.unit()) as f32).collect();
        fmha_scale { data: dev.upload(&values).cast(), batch_stride: hk as i64, head_stride: 1, page_stride: 0 }
    };
    let (q_descale, k_descale, v_descale) = (descale(), descale(), descale());
    let kv_lens: Vec<i32> = lens.iter().map(|l| l.1 as i32).collect();
    let seqstart_k: Vec<i32> = first_page.iter().map(|&f| f * p as i32).collect();
    let (sq_dev, sk_dev, lk_dev) = (dev.upload(&seqstart_q), dev.upload(&seqstart_k), dev.upload(&kv_lens));
    let rows = |data, heads: usize| fmha_tensor {
        data,
        batch_stride: 0,
        head_stride: d as i64,
        row_stride: (heads * d) as i64,
    };
    let lse_t = |data| fmha_tensor { data, batch_stride: 0, head_stride: total_q as i64, row_stride: 1 };
    let mut outputs = Vec::new();
    for paged in [false, true] {
        let o = dev.upload(&vec![0xFFFFu16; total_q * hq * d]);
        let lse = dev.upload(&vec![f32::NAN; hq * total_q]);
        if paged {
            let indptr = dev.upload(&first_page);
            let indices: Vec<i32> = (0..num_pages as i32).collect();
            let last: Vec<i32> = lens.iter().map(|l| if l.1 == 0 { 0 } else { ((l.1 - 1) % p + 1) as i32 }).collect();
            let case = Case {
                input,
                kind: FMHA_KV_PAGE_CSR,
                pool: Pool::Nhd,
                page: p,
                group: true,
                mask: Mask::causal(MaskType::BottomRight),
                per_page_scales: false,
                hq,
                hk,
                d,
                lens: lens.to_vec(),
                share_prefix: false,
                splits: (1, 0), // the dense forward's tiles
            };
            let traits = base_traits(&case, total_q);
            let args = fmha_kvcache_args {
                q: rows(qp, hq),
                k: fmha_tensor {
                    data: kp,
                    batch_stride: (p * hk * d) as i64,
                    head_stride: d as i64,
                    row_stride: (hk * d) as i64,
                },
                v: fmha_tensor {
                    data: vp,
                    batch_stride: (p * hk * d) as i64,
                    head_stride: d as i64,
                    row_stride: (hk * d) as i64,
                },
                o: rows(o, hq),
                lse: lse_t(lse),
                seqstart_q: sq_dev.cast(),
                batch: lens.len() as i32,
                seqlen_q: total_q as i32,
                num_pages: num_pages as i32,
                num_page_indices: num_pages as i32,
                kv_indptr: indptr.cast(),
                page_indices: dev.upload(&indices).cast(),
                last_page_len: dev.upload(&last).cast(),
                window_size_left: -1,
                window_size_right: 0,
                q_descale,
                k_descale,
                v_descale,
                ..blank_args()
            };
            ok(fmha_kvcache_fwd(&traits, &args, null_mut()));
        } else {
            let traits = fmha_fwd_traits {
                struct_size: std::mem::size_of::<fmha_fwd_traits>(),
                dtype: input.abi(),
                hdim_q: d as i32,
                hdim_v: d as i32,
                is_group_mode: 1,
                mask_type: FMHA_MASK_BOTTOM_RIGHT,
                bias_type: FMHA_BIAS_NONE,
                has_dropout: 0,
                o_dtype: FMHA_DTYPE_BF16,
            };
            let args = fmha_fwd_args {
                struct_size: std::mem::size_of::<fmha_fwd_args>(),
                q: rows(qp, hq),
                k: rows(kp, hk),
                v: rows(vp, hk),
                o: rows(o, hq),
                lse: lse_t(lse),
                seqstart_q: sq_dev.cast(),
                seqstart_k: sk_dev.cast(),
                seqlen_q_ptr: null(),
                seqlen_k_ptr: lk_dev.cast(),
                batch: lens.len() as i32,
                seqlen_q: total_q as i32,
                seqlen_k: (num_pages * p) as i32,
                max_seqlen_q: 33,
                max_seqlen_k: 112,
                nhead_q: hq as i32,
                nhead_k: hk as i32,
                scale: 0.0,
                window_size_left: -1,
                window_size_right: 0,
                q_descale,
                k_descale,
                v_descale,
                workspace: null_mut(),
                workspace_size: 0,
            };
            ok(fmha_fwd(&traits, &args, null_mut()));
        }
        ok(fmha_stream_synchronize(null_mut()));
        outputs.push((Device::download::<u16>(o, total_q * hq * d), Device::download::<u32>(lse, hq * total_q)));
    }
    assert!(outputs[0].0.iter().all(|&b| b != 0xFFFF), "{input:?}: dense output left unwritten");
    assert_eq!(outputs[0].0, outputs[1].0, "{input:?}: O differs between the paged and the dense call");
    assert_eq!(outputs[0].1, outputs[1].1, "{input:?}: LSE differs between the paged and the dense call");
}

/// A valid two-sequence CSR call (page 4, d 16, bf16) whose arrays the fault tests spoil.
struct Small {
    dev: Device,
    traits: fmha_kvcache_traits,
    args: fmha_kvcache_args,
    /// Host copies of the arrays uploaded at the matching `args` pointers.
    seqstart_q: Vec<i32>,
    kv_indptr: Vec<i32>,
    page_indices: Vec<i32>,
    last_page_len: Vec<i32>,
}

/// The small call's workspace: more than its launcher needs (the calls check the size).
const SMALL_WORKSPACE: usize = 256;

impl Small {
    fn new() -> Small {
        let mut dev = Device::default();
        let (hq, hk, d, p, pages) = (2usize, 1usize, 16usize, 4usize, 6usize);
        let pool = dev.upload(&vec![half::bf16::ONE; pages * p * hk * d]);
        let pool_v = dev.upload(&vec![half::bf16::ONE; pages * p * hk * d]);
        let q = dev.upload(&vec![half::bf16::ONE; 5 * hq * d]);
        let o = dev.upload(&vec![0u16; 5 * hq * d]);
        let lse = dev.upload(&vec![0f32; 5 * hq]);
        let workspace = dev.upload(&[0u8; SMALL_WORKSPACE]);
        let (seqstart_q, kv_indptr, page_indices, last_page_len) =
            (vec![0, 2, 5], vec![0, 2, 4], vec![3, 1, 0, 5], vec![3, 4]);
        let traits = fmha_kvcache_traits {
            struct_size: std::mem::size_of::<fmha_kvcache_traits>(),
            dtype: FMHA_DTYPE_BF16,
            o_dtype: FMHA_DTYPE_BF16,
            hdim_q: d as i32,
            hdim_v: d as i32,
            nhead_q: hq as i32,
            nhead_k: hk as i32,
            is_group_mode: 1,
            mask_type: FMHA_MASK_BOTTOM_RIGHT,
            has_lse: 1,
            kv_table_kind: FMHA_KV_PAGE_CSR,
            kv_layout: FMHA_KV_LAYOUT_STRIDED,
            kv_scale_granularity: FMHA_KV_SCALE_TENSOR,
            page_size: p as i32,
            batch: 2,
            total_q: 5,
            max_seqlen_q: 3,
            max_seqlen_k: 8,
            max_splits: 0,
            kv_split_tokens: 0,
            check_tables: 1,
        };
        let pool_t = |data| fmha_tensor {
            data,
            batch_stride: (p * hk * d) as i64,
            head_stride: d as i64,
            row_stride: (hk * d) as i64,
        };
        let rows = |data| fmha_tensor { data, batch_stride: 0, head_stride: d as i64, row_stride: (hq * d) as i64 };
        let args = fmha_kvcache_args {
            q: rows(q),
            k: pool_t(pool),
            v: pool_t(pool_v),
            o: rows(o),
            lse: fmha_tensor { data: lse, batch_stride: 0, head_stride: 5, row_stride: 1 },
            seqstart_q: dev.upload(&seqstart_q).cast(),
            batch: 2,
            seqlen_q: 5,
            num_pages: pages as i32,
            num_page_indices: 4,
            kv_indptr: dev.upload(&kv_indptr).cast(),
            page_indices: dev.upload(&page_indices).cast(),
            last_page_len: dev.upload(&last_page_len).cast(),
            window_size_left: -1,
            window_size_right: 0,
            workspace,
            workspace_size: SMALL_WORKSPACE,
            ..blank_args()
        };
        Small { dev, traits, args, seqstart_q, kv_indptr, page_indices, last_page_len }
    }

    /// Uploads the (spoiled) host arrays again.
    fn sync_arrays(&mut self) {
        for (ptr, values) in [
            (self.args.seqstart_q, &self.seqstart_q),
            (self.args.kv_indptr, &self.kv_indptr),
            (self.args.page_indices, &self.page_indices),
            (self.args.last_page_len, &self.last_page_len),
        ] {
            ok(fmha_memcpy(ptr as *mut c_void, values.as_ptr().cast(), values.len() * 4, FMHA_MEMCPY_HOST_TO_DEVICE));
        }
    }

    /// Prepare + check, then run + synchronize: the statuses of the check and of the run.
    fn prepare_check_run(&mut self) -> (fmha_status, String, fmha_status, String) {
        self.sync_arrays();
        // A stream of its own: a failed run's error stays with it, not with other tests' work.
        let (mut launcher, mut stream) = (null_mut(), null_mut());
        ok(fmha_stream_create(&mut stream));
        ok(fmha_kvcache_launcher_create(&self.traits, &mut launcher));
        ok(fmha_kvcache_launcher_prepare_async(launcher, &self.args, stream));
        let checked = fmha_kvcache_launcher_check(launcher, self.args.workspace, SMALL_WORKSPACE, stream);
        let check_message = last_error();
        let ran = match fmha_kvcache_launcher_run(launcher, &self.args, stream) {
            FMHA_OK => fmha_stream_synchronize(stream),
            status => status,
        };
        let run_message = last_error();
        ok(fmha_kvcache_launcher_destroy(launcher));
        fmha_stream_destroy(stream);
        (checked, check_message, ran, run_message)
    }
}

/// Each bad device value: the prepare records it and `check` names the field and the sequence; the
/// host backend's run fails naming the field too. Table entries past a sequence's pages are not
/// looked at, whatever they hold.
#[test]
fn prepare_records_the_first_fault_and_check_names_it() {
    if skip() {
        return;
    }
    let mut valid = Small::new();
    let (checked, message, ran, run_message) = valid.prepare_check_run();
    assert_eq!((checked, ran), (FMHA_OK, FMHA_OK), "{message} / {run_message}");
    let _ = &valid.dev;

    type Spoil = fn(&mut Small);
    let cases: [(&str, &str, bool, Spoil); 9] = [
        ("last_page_len", "entry 1 is 0", true, |s| s.last_page_len[1] = 0),
        ("last_page_len", "entry 0 is 5", true, |s| s.last_page_len[0] = 5),
        ("kv_indptr", "entries 0 and 1", true, |s| s.kv_indptr[1] = -1),
        ("kv_indptr", "entries 1 and 2", true, |s| s.kv_indptr[2] = 5),
        ("page_indices", "sequence 1 uses page id 6", true, |s| s.page_indices[3] = 6),
        ("seqstart_q", "entries 0 and 1", true, |s| s.seqstart_q[1] = -1),
        ("seqstart_q", "entry 2 is 6, past the 5 rows of q", true, |s| s.seqstart_q[2] = 6),
        ("traits.max_seqlen_q", "sequence 0 has 4 query rows", true, |s| s.seqstart_q[1] = 4),
        ("traits.max_seqlen_k", "sequence 0 holds 11 tokens", true, |s| {
            s.kv_indptr = vec![0, 3, 4];
            s.page_indices = vec![3, 1, 2, 5];
        }),
    ];
    for (field, detail, run_fails, spoil) in cases {
        let mut small = Small::new();
        spoil(&mut small);
        let (checked, message, ran, run_message) = small.prepare_check_run();
        assert_eq!(checked, FMHA_ERR_ASYNC_FAILURE, "{field}: check said {message:?}");
        assert!(message.contains(field) && message.contains(detail), "{field}: {message:?} lacks {detail:?}");
        if host_backend() && run_fails {
            assert_eq!(ran, FMHA_ERR_INVALID_ARGUMENT, "{field}: run said {run_message:?}");
            assert!(run_message.contains(field), "{field}: run message {run_message:?}");
        } else {
            // A GPU kernel clamps what it reads: the run completes, its rows unspecified.
            assert_eq!(ran, FMHA_OK, "{field}: run said {run_message:?}");
        }
    }

    // Without check_tables, a bad page id is found by the run, not by the prepare.
    let mut small = Small::new();
    small.traits.check_tables = 0;
    small.page_indices[3] = -2;
    let (checked, message, ran, run_message) = small.prepare_check_run();
    assert_eq!(checked, FMHA_OK, "{message}");
    if host_backend() {
        assert_eq!(ran, FMHA_ERR_INVALID_ARGUMENT, "{run_message}");
        assert!(run_message.contains("page_indices") && run_message.contains("-2"), "{run_message}");
    }

    // A workspace no prepare wrote.
    let small = Small::new();
    let mut launcher = null_mut();
    ok(fmha_kvcache_launcher_create(&small.traits, &mut launcher));
    expect_error(
        fmha_kvcache_launcher_check(launcher, small.args.workspace, SMALL_WORKSPACE, null_mut()),
        FMHA_ERR_WORKSPACE_NOT_PREPARED,
        &["workspace"],
    );
    ok(fmha_kvcache_launcher_destroy(launcher));
}

/// Every argument the host can see is checked before anything is queued, naming its field.
#[test]
fn bad_arguments_are_refused_naming_the_field() {
    if skip() {
        return;
    }
    type Spoil = fn(&mut fmha_kvcache_traits, &mut fmha_kvcache_args);
    let cases: [(fmha_status, &str, Spoil); 22] = [
        (FMHA_ERR_INVALID_ARGUMENT, "traits", |t, _| t.struct_size = 8),
        (FMHA_ERR_INVALID_ARGUMENT, "args", |_, a| a.struct_size = 1 << 20),
        (FMHA_ERR_INVALID_ARGUMENT, "dtype", |t, _| t.dtype = 9),
        (FMHA_ERR_UNSUPPORTED, "o_dtype", |t, _| {
            t.dtype = FMHA_DTYPE_FP8_E4M3FN;
            t.o_dtype = 2; // FMHA_DTYPE_FP32
        }),
        (FMHA_ERR_INVALID_ARGUMENT, "o_dtype", |t, _| {
            t.dtype = FMHA_DTYPE_FP8_E4M3FNUZ;
            t.o_dtype = FMHA_DTYPE_FP16;
        }),
        (FMHA_ERR_UNSUPPORTED, "mask_type", |t, _| t.mask_type = FMHA_MASK_TOP_LEFT),
        (FMHA_ERR_INVALID_ARGUMENT, "kv_table_kind", |t, _| t.kv_table_kind = 3),
        (FMHA_ERR_INVALID_ARGUMENT, "kv_layout", |t, _| t.kv_layout = -1),
        (FMHA_ERR_INVALID_ARGUMENT, "page_size", |t, _| {
            t.kv_layout = FMHA_KV_LAYOUT_VECTORIZED; // page 4 is not a multiple of 8 bf16 elements
        }),
        (FMHA_ERR_INVALID_ARGUMENT, "page_size", |t, _| t.page_size = 0),
        (FMHA_ERR_INVALID_ARGUMENT, "nhead_k", |t, _| t.nhead_k = 3),
        (FMHA_ERR_INVALID_ARGUMENT, "kv_scale_granularity", |t, _| t.kv_scale_granularity = FMHA_KV_SCALE_PAGE),
        (FMHA_ERR_INVALID_ARGUMENT, "max_splits", |t, _| t.max_splits = 257),
        (FMHA_ERR_INVALID_ARGUMENT, "check_tables", |t, _| t.check_tables = 2),
        (FMHA_ERR_NULL_POINTER, "kv_indptr", |_, a| a.kv_indptr = null()),
        (FMHA_ERR_NULL_POINTER, "last_page_len", |_, a| a.last_page_len = null()),
        (FMHA_ERR_INVALID_ARGUMENT, "block_table", |_, a| a.block_table = a.kv_indptr),
        (FMHA_ERR_INVALID_ARGUMENT, "q_descale.data", |_, a| a.q_descale.data = a.lse.data.cast()),
        (FMHA_ERR_INVALID_ARGUMENT, "batch", |_, a| a.batch = 3),
        (FMHA_ERR_INVALID_ARGUMENT, "num_pages", |_, a| a.num_pages = 0),
        (FMHA_ERR_INVALID_ARGUMENT, "o", |_, a| a.o.data = a.k.data),
        (FMHA_ERR_WORKSPACE_TOO_SMALL, "workspace_size", |_, a| a.workspace_size = 16),
    ];
    for (status, field, spoil) in cases {
        let mut small = Small::new();
        spoil(&mut small.traits, &mut small.args);
        let mut launcher = null_mut();
        let created = fmha_kvcache_launcher_create(&small.traits, &mut launcher);
        if created != FMHA_OK {
            expect_error(created, status, &[field]);
        } else {
            let got = fmha_kvcache_launcher_prepare_async(launcher, &small.args, null_mut());
            expect_error(got, status, &[field]);
            expect_error(fmha_kvcache_launcher_run(launcher, &small.args, null_mut()), status, &[field]);
            ok(fmha_kvcache_launcher_destroy(launcher));
            // The one-shot call refuses it the same way.
            expect_error(fmha_kvcache_fwd(&small.traits, &small.args, null_mut()), status, &[field]);
        }
    }
}

/// Outputs may share no byte with an input, and the device arrays and the fp8 descales are inputs
/// too: a table or a descale inside `o` or `lse` is refused before anything is queued (it was accepted,
/// and the run read the table and the descales while writing over them).
#[test]
fn outputs_may_not_overlap_the_tables_or_the_descales() {
    if skip() {
        return;
    }
    type Spoil = fn(&mut fmha_kvcache_traits, &mut fmha_kvcache_args);
    let cases: [(&str, Spoil); 5] = [
        ("kv_indptr", |_, a| a.kv_indptr = a.o.data.cast()),
        ("page_indices", |_, a| a.page_indices = a.lse.data.cast()),
        ("last_page_len", |_, a| a.last_page_len = a.o.data.cast()),
        ("seqstart_q", |_, a| a.seqstart_q = a.lse.data.cast()),
        ("k_descale", |t, a| {
            t.dtype = FMHA_DTYPE_FP8_E4M3FN;
            a.k_descale.data = a.o.data.cast();
        }),
    ];
    for (input, spoil) in cases {
        let mut small = Small::new();
        spoil(&mut small.traits, &mut small.args);
        let mut launcher = null_mut();
        let created = fmha_kvcache_launcher_create(&small.traits, &mut launcher);
        if created == FMHA_ERR_UNSUPPORTED && !host_backend() {
            continue; // a GPU build without this fp8 format
        }
        ok(created);
        expect_error(
            fmha_kvcache_launcher_prepare_async(launcher, &small.args, null_mut()),
            FMHA_ERR_INVALID_ARGUMENT,
            &[input],
        );
        expect_error(fmha_kvcache_launcher_run(launcher, &small.args, null_mut()), FMHA_ERR_INVALID_ARGUMENT, &[input]);
        ok(fmha_kvcache_launcher_destroy(launcher));
        expect_error(fmha_kvcache_fwd(&small.traits, &small.args, null_mut()), FMHA_ERR_INVALID_ARGUMENT, &[input]);
    }
}

/// Runs `args` (the small call's, maybe from another copy of its struct) through a launcher for
/// `traits` on a stream of its own, the prepare first when `prepare`, with O and LSE poisoned before:
/// O's and LSE's bits after the stream's synchronize.
fn run_small(traits: &fmha_kvcache_traits, args: *const fmha_kvcache_args, prepare: bool) -> (Vec<u16>, Vec<u32>) {
    // SAFETY: the callers pass a pointer to at least `struct_size` readable bytes of a struct whose
    // leading fields (up to the workspace) are the small call's.
    let (o, lse) = unsafe { ((*args).o.data, (*args).lse.data) };
    let (o_len, lse_len) = (5 * 2 * 16, 5 * 2);
    ok(fmha_memset(o, 0xFF, o_len * 2));
    ok(fmha_memset(lse, 0xFF, lse_len * 4));
    let (mut launcher, mut stream) = (null_mut(), null_mut());
    ok(fmha_stream_create(&mut stream));
    ok(fmha_kvcache_launcher_create(traits, &mut launcher));
    if prepare {
        ok(fmha_kvcache_launcher_prepare_async(launcher, args, stream));
    }
    ok(fmha_kvcache_launcher_run(launcher, args, stream));
    ok(fmha_stream_synchronize(stream));
    ok(fmha_kvcache_launcher_destroy(launcher));
    ok(fmha_stream_destroy(stream));
    (Device::download(o, o_len), Device::download(lse, lse_len))
}

/// `fmha_kvcache_launcher_scheduler_workspace_size`: 16 bytes for every launcher (unsplit and
/// splitting, group and batch mode); a NULL `bytes` or a destroyed launcher is refused, nothing written.
#[test]
fn scheduler_workspace_size_is_16_bytes() {
    if skip() {
        return;
    }
    let small = Small::new();
    let t = small.traits;
    for traits in [
        t,
        fmha_kvcache_traits { max_splits: 4, ..t },
        fmha_kvcache_traits { mask_type: FMHA_MASK_NONE, has_lse: 0, ..t },
        fmha_kvcache_traits { is_group_mode: 0, kv_table_kind: FMHA_KV_BLOCK_TABLE, ..t },
    ] {
        let mut launcher = null_mut();
        ok(fmha_kvcache_launcher_create(&traits, &mut launcher));
        let mut bytes = 0usize;
        ok(fmha_kvcache_launcher_scheduler_workspace_size(launcher, &mut bytes));
        assert_eq!(bytes, 16, "{traits:?}");
        expect_error(
            fmha_kvcache_launcher_scheduler_workspace_size(launcher, null_mut()),
            FMHA_ERR_NULL_POINTER,
            &["bytes"],
        );
        ok(fmha_kvcache_launcher_destroy(launcher));
        bytes = 7;
        expect_error(
            fmha_kvcache_launcher_scheduler_workspace_size(launcher, &mut bytes),
            FMHA_ERR_INVALID_ARGUMENT,
            &["launcher"],
        );
        assert_eq!(bytes, 7, "written on failure");
    }
}

/// The run's optional scheduler workspace (`fmha_kvcache_args.scheduler_workspace`): a misaligned
/// one, one too small, or one that shares a byte with a tensor, a table or the workspace is refused by
/// the run and by the one-shot call (nothing queued: the one-shot call's prepare does not write the
/// workspace); the prepare ignores it; NULL is none whatever the size says; a valid one, whatever its
/// contents, gives the bits the run without it gives (on sm_90a it may switch the run to a persistent
/// grid).
#[test]
fn scheduler_workspace_is_checked_and_changes_no_result() {
    if skip() {
        return;
    }
    let mut small = Small::new();
    small.sync_arrays();
    let (traits, args) = (small.traits, small.args);
    // 64 bytes: room for a misaligned start and for a larger-than-needed workspace.
    let base = small.dev.upload(&[0xA5u8; 64]);
    assert_eq!(base as usize % 16, 0);
    let at = |offset: usize| (base as usize + offset) as *mut c_void;
    let with = |scheduler_workspace: *mut c_void, scheduler_workspace_size: usize| fmha_kvcache_args {
        scheduler_workspace,
        scheduler_workspace_size,
        ..args
    };
    let size_function = "fmha_kvcache_launcher_scheduler_workspace_size";
    let o_bytes = 5 * 2 * 16 * 2;
    let o_tail = ((args.o.data as usize + o_bytes - 16) & !15) as *mut c_void;
    type Refusal = (*mut c_void, usize, fmha_status, Vec<&'static str>);
    let refused: Vec<Refusal> = vec![
        (base, 8, FMHA_ERR_WORKSPACE_TOO_SMALL, vec!["scheduler_workspace_size", "8", "16", size_function]),
        (base, 0, FMHA_ERR_WORKSPACE_TOO_SMALL, vec!["scheduler_workspace_size", "0", size_function]),
        (base, 15, FMHA_ERR_WORKSPACE_TOO_SMALL, vec!["scheduler_workspace_size", size_function]),
        (at(4), 32, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "aligned"]),
        (at(8), 32, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "aligned"]),
        (at(1), 32, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "aligned"]),
        // Written by the run: it may share no byte with an output, an input, a table or the workspace.
        (args.o.data, 16, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "the output o"]),
        (o_tail, 16, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "the output o"]),
        (args.lse.data, 16, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "the output lse"]),
        (args.q.data, 16, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "the input q"]),
        (args.v.data, 64, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "the input v"]),
        (args.kv_indptr as *mut c_void, 16, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "kv_indptr"]),
        (args.page_indices as *mut c_void, 16, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "page_indices"]),
        (args.workspace, 16, FMHA_ERR_INVALID_ARGUMENT, vec!["scheduler_workspace", "the output workspace"]),
    ];
    let mut launcher = null_mut();
    ok(fmha_kvcache_launcher_create(&traits, &mut launcher));
    // A workspace passed without its size (0: no size check) spans the launcher's size: a scheduler
    // workspace in its last 16 bytes is refused too.
    let mut need = 0usize;
    ok(fmha_kvcache_launcher_workspace_size(launcher, &mut need));
    assert!((32..=SMALL_WORKSPACE).contains(&need), "{need}");
    let in_tail = fmha_kvcache_args {
        workspace_size: 0,
        ..with((args.workspace as usize + (need - 16) / 16 * 16) as *mut c_void, 16)
    };
    expect_error(
        fmha_kvcache_launcher_run(launcher, &in_tail, null_mut()),
        FMHA_ERR_INVALID_ARGUMENT,
        &["scheduler_workspace", "the output workspace"],
    );
    ok(fmha_kvcache_launcher_run(launcher, &fmha_kvcache_args { workspace_size: 0, ..with(at(16), 16) }, null_mut()));
    for (workspace, size, status, needles) in &refused {
        let a = with(*workspace, *size);
        expect_error(fmha_kvcache_launcher_run(launcher, &a, null_mut()), *status, needles);
        // The prepare ignores it (neither checks nor uses it).
        ok(fmha_kvcache_launcher_prepare_async(launcher, &a, null_mut()));
    }
    ok(fmha_stream_synchronize(null_mut()));
    ok(fmha_kvcache_launcher_check(launcher, args.workspace, SMALL_WORKSPACE, null_mut()));
    ok(fmha_kvcache_launcher_destroy(launcher));
    // The one-shot call checks the run's arguments before it enqueues the prepare: a refused call
    // leaves a zeroed workspace unprepared.
    for (workspace, size, status, needles) in &refused {
        if *workspace == args.workspace {
            continue; // the prepare would write over it: no zeroed workspace to look at
        }
        ok(fmha_memset(args.workspace, 0, SMALL_WORKSPACE));
        expect_error(fmha_kvcache_fwd(&traits, &with(*workspace, *size), null_mut()), *status, needles);
        ok(fmha_stream_synchronize(null_mut()));
        let bytes: Vec<u8> = Device::download(args.workspace, SMALL_WORKSPACE);
        assert!(bytes.iter().all(|&b| b == 0), "{workspace:?}/{size}: the refused call prepared the workspace");
    }

    // Without a scheduler workspace, then NULL with sizes that would be wrong for a real one, then valid
    // ones (exact size, larger, reused, poisoned in between), with and without the prepare: the same bits.
    let (o, lse) = run_small(&traits, &args, true);
    assert!(o.iter().all(|&x| x != 0xFFFF), "O left unwritten");
    for (workspace, size) in [(null_mut(), 0), (null_mut(), 1), (null_mut(), usize::MAX), (base, 16), (base, 64)] {
        for prepare in [true, false, true] {
            let (got_o, got_lse) = run_small(&traits, &with(workspace, size), prepare);
            assert!(got_o == o && got_lse == lse, "scheduler workspace {workspace:?}/{size}: other bits");
            ok(fmha_memset(base, 0x5A, 64));
        }
    }
    // The one-shot call forwards it to the run.
    ok(fmha_memset(args.o.data, 0xFF, o_bytes));
    ok(fmha_kvcache_fwd(&traits, &with(base, 16), null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    assert!(Device::download::<u16>(args.o.data, o_bytes / 2) == o, "fmha_kvcache_fwd: other bits");

    // The struct of 0.2 (384 bytes, before the scheduler workspace), ending at an unreadable page: the
    // fields past it are not read (here they would be refused); it runs without a scheduler workspace.
    let previous = 384;
    assert_eq!(std::mem::size_of::<fmha_kvcache_args>(), previous + 16);
    assert_eq!(std::mem::offset_of!(fmha_kvcache_args, scheduler_workspace), previous);
    let old = fmha_kvcache_args { struct_size: previous, ..with(at(4), 1) };
    let guarded = GuardedBytes::new(previous);
    let (got_o, got_lse) = run_small(&traits, guarded.place(&old, previous), true);
    assert!(got_o == o && got_lse == lse, "384-byte struct: other bits");
    ok(fmha_memset(args.workspace, 0, SMALL_WORKSPACE));
    ok(fmha_kvcache_fwd(&traits, guarded.place(&old, previous), null_mut()));
    ok(fmha_stream_synchronize(null_mut()));
    // Sizes between the versions or past this library's end inside a field: no header's struct.
    let mut launcher = null_mut();
    ok(fmha_kvcache_launcher_create(&traits, &mut launcher));
    for size in [previous - 8, previous + 8, previous + 15, previous + 24] {
        let a = fmha_kvcache_args { struct_size: size, ..args };
        expect_error(
            fmha_kvcache_launcher_run(launcher, &a, null_mut()),
            FMHA_ERR_INVALID_ARGUMENT,
            &["args", "struct_size"],
        );
        expect_error(
            fmha_kvcache_launcher_prepare_async(launcher, &a, null_mut()),
            FMHA_ERR_INVALID_ARGUMENT,
            &["args", "struct_size"],
        );
    }
    ok(fmha_kvcache_launcher_destroy(launcher));
}

/// GPU builds have kv-cache kernels for one fp8 format per device (sm90, gfx950: OCP; gfx942: FNUZ),
/// per-page descales for small pages (sm90) or none (AMD), and no VECTORIZED kernels: such a launcher
/// is refused as unsupported, naming what is missing, not run.
#[test]
fn gpu_builds_refuse_what_they_lack() {
    if host_backend() || no_device() {
        return;
    }
    let gfx942 = fmha::runtime::current().and_then(|r| r.arch()).is_ok_and(|a| a == Arch::Gfx942);
    let (own, other) = if gfx942 {
        (FMHA_DTYPE_FP8_E4M3FNUZ, FMHA_DTYPE_FP8_E4M3FN)
    } else {
        (FMHA_DTYPE_FP8_E4M3FN, FMHA_DTYPE_FP8_E4M3FNUZ)
    };
    let mut launcher = null_mut();
    let mut traits = Small::new().traits;
    traits.dtype = other;
    expect_error(fmha_kvcache_launcher_create(&traits, &mut launcher), FMHA_ERR_UNSUPPORTED, &["kvcache"]);
    traits.dtype = own;
    traits.kv_scale_granularity = FMHA_KV_SCALE_PAGE;
    expect_error(fmha_kvcache_launcher_create(&traits, &mut launcher), FMHA_ERR_UNSUPPORTED, &["kv_scale_granularity"]);
    let mut traits = Small::new().traits;
    traits.kv_layout = FMHA_KV_LAYOUT_VECTORIZED;
    traits.page_size = 16;
    expect_error(fmha_kvcache_launcher_create(&traits, &mut launcher), FMHA_ERR_UNSUPPORTED, &["kv_layout"]);
}

/// `fmha_kvcache_launcher_plan_json`: the attention with its instance, then the combine exactly when
/// the launcher splits the KV.
#[test]
fn plan_adds_the_combine_when_the_launcher_splits() {
    if skip() {
        return;
    }
    let small = Small::new();
    for (max_splits, expected) in [(1, &["kvcache_fwd"][..]), (4, &["kvcache_fwd", "combine"][..])] {
        let traits = fmha_kvcache_traits { max_splits, ..small.traits };
        let mut launcher = null_mut();
        ok(fmha_kvcache_launcher_create(&traits, &mut launcher));
        let mut required = 0usize;
        expect_error(
            fmha_kvcache_launcher_plan_json(launcher, null_mut(), 0, null_mut()),
            FMHA_ERR_NULL_POINTER,
            &["required"],
        );
        ok(fmha_kvcache_launcher_plan_json(launcher, null_mut(), 0, &mut required));
        let mut buffer = vec![0u8; required + 1];
        ok(fmha_kvcache_launcher_plan_json(launcher, buffer.as_mut_ptr() as *mut _, buffer.len(), &mut required));
        let json = std::str::from_utf8(&buffer[..required]).unwrap();
        let kernels: Vec<&str> = json.split("\"kernel\":\"").skip(1).map(|s| &s[..s.find('"').unwrap()]).collect();
        assert_eq!(kernels, expected, "{json}");
        assert!(json.contains("\"operation\":\"kvcache\"") && json.contains("\"hdim_q\":"), "{json}");
        ok(fmha_kvcache_launcher_destroy(launcher));
        expect_error(
            fmha_kvcache_launcher_plan_json(launcher, null_mut(), 0, &mut required),
            FMHA_ERR_INVALID_ARGUMENT,
            &["launcher"],
        );
    }
}
