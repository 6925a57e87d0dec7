//! Forward throughput of fmha on the build's backend, timed with device events, on the shape grid
//! of the FlashAttention papers (B·S = 16k tokens, H·D = 2048, D ∈ {64, 128}, S from 512 to 16k,
//! causal and not). Prints TFLOPS (4·B·H·S²·D, halved when causal), median of repeated runs after
//! warm-up. `bench/attention.py` compares against PyTorch SDPA in the same run; this one needs only
//! the library.
//!
//! `cargo run --release --features cuda --example bench_forward [-- --quick]`

use fmha::ffi::attention::*;
use fmha::ffi::runtime::*;
use fmha::ffi::status::*;
use fmha::runtime::{self, Stream};
use std::ptr::null;

fn check(status: fmha_status, what: &str) {
    if status != FMHA_OK {
        let mut buffer = [0u8; 512];
        let len = fmha_last_error_message(buffer.as_mut_ptr() as *mut _, buffer.len()).min(511);
        panic!("{what} failed ({status}): {}", String::from_utf8_lossy(&buffer[..len]));
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = runtime::current().expect("a device");
    let sequence_lengths: &[usize] = if quick { &[2048] } else { &[512, 1024, 2048, 4096, 8192, 16384] };
    println!("| D | S | causal | fmha ms | fmha TFLOPS |");
    println!("|---|---|---|---|---|");
    for dim in [64usize, 128] {
        let heads = 2048 / dim;
        for &seq in sequence_lengths {
            let batch = 16384 / seq;
            let elements = batch * seq * heads * dim;
            let mut buffers = [std::ptr::null_mut(); 5];
            for (i, b) in buffers.iter_mut().enumerate() {
                let bytes = if i == 4 { batch * heads * seq * 4 } else { elements * 2 };
                check(fmha_device_malloc(b, bytes), "malloc");
                // Random-looking, never zero: 0x3C00 family values (small normal bf16) with variation.
                check(fmha_memset(*b, 0x3B, bytes), "memset");
            }
            let tensor = |data| fmha_tensor {
                data,
                batch_stride: (seq * heads * dim) as i64,
                head_stride: dim as i64,
                row_stride: (heads * dim) as i64,
            };
            for causal in [false, true] {
                let traits = fmha_fwd_traits {
                    struct_size: std::mem::size_of::<fmha_fwd_traits>(),
                    dtype: FMHA_DTYPE_BF16,
                    hdim_q: dim as i32,
                    hdim_v: dim as i32,
                    is_group_mode: 0,
                    mask_type: if causal { FMHA_MASK_BOTTOM_RIGHT } else { FMHA_MASK_NONE },
                    bias_type: FMHA_BIAS_NONE,
                    has_dropout: 0,
                    o_dtype: 0,
                };
                // The scheduler workspace the Python binding passes on a GPU (the persistent grid).
                let mut workspace_size = 0;
                check(fmha_fwd_workspace_size(&traits, &mut workspace_size), "fmha_fwd_workspace_size");
                let mut workspace = std::ptr::null_mut();
                check(fmha_device_malloc(&mut workspace, workspace_size), "malloc");
                let args = fmha_fwd_args {
                    struct_size: std::mem::size_of::<fmha_fwd_args>(),
                    q: tensor(buffers[0]),
                    k: tensor(buffers[1]),
                    v: tensor(buffers[2]),
                    o: tensor(buffers[3]),
                    lse: fmha_tensor {
                        data: buffers[4],
                        batch_stride: (heads * seq) as i64,
                        head_stride: seq as i64,
                        row_stride: 1,
                    },
                    seqstart_q: null(),
                    seqstart_k: null(),
                    seqlen_q_ptr: null(),
                    seqlen_k_ptr: null(),
                    batch: batch as i32,
                    seqlen_q: seq as i32,
                    seqlen_k: seq as i32,
                    max_seqlen_q: seq as i32,
                    max_seqlen_k: seq as i32,
                    nhead_q: heads as i32,
                    nhead_k: heads as i32,
                    scale: 0.0,
                    window_size_left: -1,
                    window_size_right: if causal { 0 } else { -1 },
                    q_descale: fmha_scale::default(),
                    k_descale: fmha_scale::default(),
                    v_descale: fmha_scale::default(),
                    workspace,
                    workspace_size,
                };
                let (start, end) = (rt.event_create().unwrap(), rt.event_create().unwrap());
                for _ in 0..5 {
                    check(fmha_fwd(&traits, &args, std::ptr::null_mut()), "fmha_fwd");
                }
                let mut times = Vec::new();
                for _ in 0..if quick { 10 } else { 30 } {
                    rt.event_record(start, Stream(0)).unwrap();
                    check(fmha_fwd(&traits, &args, std::ptr::null_mut()), "fmha_fwd");
                    rt.event_record(end, Stream(0)).unwrap();
                    rt.event_synchronize(end).unwrap();
                    times.push(rt.event_elapsed_ms(start, end).unwrap() as f64);
                }
                times.sort_by(|a, b| a.partial_cmp(b).unwrap());
                let ms = times[times.len() / 2];
                let flops = 4.0 * (batch * heads * seq * seq * dim) as f64 / if causal { 2.0 } else { 1.0 };
                println!("| {dim} | {seq} | {causal} | {ms:.3} | {:.0} |", flops / (ms * 1e-3) / 1e12);
                rt.event_destroy(start).unwrap();
                rt.event_destroy(end).unwrap();
                check(fmha_device_free(workspace), "free");
            }
            for b in buffers {
                check(fmha_device_free(b), "free");
            }
        }
    }
}
