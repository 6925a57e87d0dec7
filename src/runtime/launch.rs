//! Kernel launches: the host backend queues the Rust kernel of `host_kernels/` on the stream, the GPU
//! backends call the C launch stubs of `hip/launch.h` (compiled from `hip/` by `build.rs`).

use super::Stream;
use crate::bwd::BwdKargs;
use crate::error::Result;
use crate::fwd::FwdKargs;

#[cfg(any(feature = "cuda", feature = "rocm"))]
mod stubs {
    use std::ffi::c_void;
    // Prototypes from hip/launch.h. Each stub launches one kernel on `stream` and returns the
    // runtime's error code of the launch (0 = success).
    extern "C" {
        pub fn fmha_hip_fill_u32(dst: *mut c_void, value: u32, count: u64, stream: *mut c_void) -> i32;
    }
}

/// Sets `count` 32-bit words at device address `dst` to `value`, on `stream`.
pub fn fill_u32(dst: usize, value: u32, count: usize, stream: Stream) -> Result<()> {
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    {
        super::current()?; // fails cleanly with NoDevice before touching the driver
        if count > 0 && dst == 0 {
            return Err(crate::error::Error::null("dst"));
        }
        // SAFETY: the stub only enqueues a kernel that writes `count` words at `dst`, which the caller
        // guarantees is device memory of at least that size; `stream` is a native stream handle.
        let code = unsafe { stubs::fmha_hip_fill_u32(dst as *mut _, value, count as u64, stream.0 as *mut _) };
        launch_result("fill_u32", code)
    }
    #[cfg(not(any(feature = "cuda", feature = "rocm")))]
    {
        let out = super::host::DeviceSlice::<u32>::new(dst, count, "dst")?;
        super::host::runtime().enqueue(stream, move || {
            crate::host_kernels::fill::fill_u32(out, value);
            Ok(())
        })
    }
}

/// Enqueues the forward described by `kargs` on `stream`.
pub fn forward(kargs: FwdKargs, stream: Stream) -> Result<()> {
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    {
        let _ = (kargs, stream);
        Err(crate::error::Error::unsupported("the GPU forward kernels are not part of this build yet"))
    }
    #[cfg(not(any(feature = "cuda", feature = "rocm")))]
    {
        let host = super::host::runtime();
        let cu_count = super::Runtime::cu_count(host)?;
        host.enqueue(stream, move || match kargs.shape.dtype {
            crate::problem::Dtype::F16 => crate::host_kernels::forward::run::<half::f16>(&kargs, cu_count),
            crate::problem::Dtype::Bf16 => crate::host_kernels::forward::run::<half::bf16>(&kargs, cu_count),
        })
    }
}

/// Enqueues the backward (dot_do_o → dq_acc zeroing → dq_dk_dv → convert_dq) on `stream`.
pub fn backward(kargs: BwdKargs, stream: Stream) -> Result<()> {
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    {
        let _ = (kargs, stream);
        Err(crate::error::Error::unsupported("the GPU backward kernels are not part of this build yet"))
    }
    #[cfg(not(any(feature = "cuda", feature = "rocm")))]
    {
        fn stages<E: crate::problem::Element>(kargs: &BwdKargs, workers: i64) -> Result<()> {
            use crate::host_kernels::backward::*;
            let context = BwdContext::<E>::new(kargs)?;
            dot_do_o::run(&context, workers)?;
            zero_dq_acc::run(&context)?;
            dq_dk_dv::run(&context, workers)?;
            convert_dq::run(&context, workers)
        }
        let workers = kargs.layout.params.num_cus;
        super::host::runtime().enqueue(stream, move || match kargs.shape.dtype {
            crate::problem::Dtype::F16 => stages::<half::f16>(&kargs, workers),
            crate::problem::Dtype::Bf16 => stages::<half::bf16>(&kargs, workers),
        })
    }
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
fn launch_result(kernel: &str, code: i32) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(crate::error::Error::runtime(format!("launch of kernel {kernel} failed with runtime error code {code}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{current, CopyKind};

    /// The first kernel path end to end: allocate, fill on a stream, copy back, verify (runs on the
    /// GPU in cuda/rocm builds, on the host executor otherwise).
    #[test]
    fn fill_kernel_writes_every_word_and_nothing_else() {
        let rt = match current() {
            Ok(rt) => rt,
            Err(e) if e.status == crate::Status::NoDevice => {
                eprintln!("skipped: {}", e.message);
                return;
            }
            Err(e) => panic!("{e}"),
        };
        for count in [0usize, 1, 255, 256, 257, 100_003, 70_000 * 256 + 5] {
            let total = count + 64; // guard words after the filled range must stay untouched
            let buffer = rt.malloc(total * 4).unwrap();
            rt.memset(buffer, 0xAB, total * 4).unwrap();
            let stream = rt.stream_create().unwrap();
            fill_u32(buffer, 0x1234_5678, count, stream).unwrap();
            rt.stream_synchronize(stream).unwrap();
            let mut back = vec![0u32; total];
            rt.memcpy(back.as_mut_ptr() as usize, buffer, total * 4, CopyKind::DeviceToHost).unwrap();
            assert!(back[..count].iter().all(|&w| w == 0x1234_5678), "count {count}: unfilled word");
            assert!(back[count..].iter().all(|&w| w == 0xABAB_ABAB), "count {count}: write past the end");
            rt.stream_destroy(stream).unwrap();
            rt.free(buffer).unwrap();
        }
    }
}
