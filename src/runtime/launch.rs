//! Kernel launches: the host backend queues the Rust kernel of `host_kernels/` on the stream, the GPU
//! backends call the C launch stubs of `hip/launch.h` (compiled from `hip/` by `build.rs`).

use super::Stream;
use crate::bwd::BwdKargs;
use crate::error::{Error, Result};
use crate::fwd::FwdKargs;
use crate::host_buffer::AlignedBytes;
use crate::workspace::{PrepareParams, WorkspaceLayout, SECTION_ALIGNMENT};

#[cfg(any(feature = "cuda", feature = "rocm"))]
mod stubs {
    use std::ffi::c_void;
    // Prototypes from hip/launch.h. Each stub launches one kernel on `stream` and returns the
    // runtime's error code of the launch (0 = success).
    extern "C" {
        pub fn fmha_hip_load_fill() -> i32;
        pub fn fmha_hip_load_prepare() -> i32;
        pub fn fmha_hip_load_forward() -> i32;
        pub fn fmha_hip_load_backward() -> i32;
        pub fn fmha_hip_fill_u32(dst: *mut c_void, value: u32, count: u64, stream: *mut c_void) -> i32;
        pub fn fmha_hip_prepare_workspace(
            workspace: *mut c_void,
            seqstart_q: *const i32,
            seqstart_k: *const i32,
            params_host: *const crate::workspace::PrepareParams,
            stream: *mut c_void,
        ) -> i32;
        pub fn fmha_hip_fwd(params: *const crate::fwd::kargs::FwdParams, stream: *mut c_void) -> i32;
        pub fn fmha_hip_bwd(params: *const crate::bwd::kargs::BwdParams, stream: *mut c_void) -> i32;
    }
}

/// The C++ routines compiled for the host CPU in every backend (`build.rs`, `build_cpu_prepare`).
mod cpu_stubs {
    use crate::workspace::PrepareParams;
    extern "C" {
        // hip/bwd/prepare_workspace_cpu.cpp: returns 0 or the `Status` code of the failure.
        pub fn fmha_cpu_prepare_workspace(
            metadata: *mut u8,
            len: usize,
            seqstart_q: *const i32,
            seqstart_k: *const i32,
            params: *const PrepareParams,
        ) -> i32;
    }
}

/// Loads the library's kernel modules onto the current device before its first launch there. A module
/// the runtime loads on first use can wait for all work queued on the device, which would make the
/// first call of a new kernel (a new shape, a new mode) block the host (docs/perf.md, 2026-11-23): so
/// all of them load together, once per device, at the first launch. (Devices past 64 load every time;
/// loading a loaded module is a lookup.)
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub fn load_kernel_modules() -> Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LOADED: AtomicU64 = AtomicU64::new(0);
    let device = super::current()?.device()?;
    let bit = if (0..64).contains(&device) { 1u64 << device } else { 0 };
    if bit != 0 && LOADED.load(Ordering::Acquire) & bit != 0 {
        return Ok(());
    }
    let loads: [(&str, unsafe extern "C" fn() -> i32); 4] = [
        ("fill", stubs::fmha_hip_load_fill),
        ("prepare", stubs::fmha_hip_load_prepare),
        ("forward", stubs::fmha_hip_load_forward),
        ("backward", stubs::fmha_hip_load_backward),
    ];
    for (module, load) in loads {
        // SAFETY: the loader only asks the runtime for a kernel's attributes on the current device.
        launch_result(&format!("module load {module}"), unsafe { load() })?;
    }
    LOADED.fetch_or(bit, Ordering::AcqRel);
    Ok(())
}

/// The host backend has no kernel modules to load.
#[cfg(not(any(feature = "cuda", feature = "rocm")))]
pub fn load_kernel_modules() -> Result<()> {
    super::current().map(|_| ())
}

/// Sets `count` 32-bit words at device address `dst` to `value`, on `stream`.
pub fn fill_u32(dst: usize, value: u32, count: usize, stream: Stream) -> Result<()> {
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    {
        load_kernel_modules()?; // fails cleanly with NoDevice before touching the driver
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

/// Runs the C++ workspace prepare (`hip/bwd/prepare_workspace.h`, the code of the device-side prepare
/// kernel) on the host CPU and returns the `layout.metadata_bytes` bytes it wrote. Tests compare them
/// with [`crate::workspace::prepare_metadata`]: both must be identical, byte for byte.
///
/// `seqstart_q`/`seqstart_k` as for `prepare_metadata` (`[batch + 1]` each in group mode, `None` in
/// batch mode). Where `prepare_metadata` fails, the routine writes an all-zero region.
pub fn prepare_workspace_cpu(
    layout: &WorkspaceLayout,
    seqstart_q: Option<&[i32]>,
    seqstart_k: Option<&[i32]>,
) -> Vec<u8> {
    prepare_workspace_cpu_status(layout, seqstart_q, seqstart_k).1
}

/// [`prepare_workspace_cpu`] with the routine's result: 0, or the [`crate::Status`] code of the error
/// `prepare_metadata` returns for the same inputs.
fn prepare_workspace_cpu_status(
    layout: &WorkspaceLayout,
    seqstart_q: Option<&[i32]>,
    seqstart_k: Option<&[i32]>,
) -> (i32, Vec<u8>) {
    let len = layout.metadata_bytes;
    // The routine reads `batch + 1` entries of each array it is given (device memory has no length); an
    // array of another length is refused here, as `prepare_metadata` refuses it.
    let entries = layout.params.batch as usize + 1;
    if [seqstart_q, seqstart_k].iter().flatten().any(|s| s.len() != entries) {
        return (crate::Status::InvalidArgument as i32, vec![0; len]);
    }
    let params = PrepareParams::new(layout);
    // Poisoned, so that a byte the routine does not write shows up in the comparison.
    let mut buffer = AlignedBytes::new(len, 0xA5, "metadata").expect("test-sized metadata fits in memory");
    let pointer = |s: Option<&[i32]>| s.map_or(std::ptr::null(), <[i32]>::as_ptr);
    let region = buffer.as_mut_slice();
    // SAFETY: `region` is `len` writable bytes, and the routine writes at most `params.metadata_bytes`
    // = `len` bytes; each seqstart pointer is null or holds `batch + 1` readable entries (checked above);
    // `params` lives across the call; nothing is retained after it returns.
    let code = unsafe {
        cpu_stubs::fmha_cpu_prepare_workspace(
            region.as_mut_ptr(),
            len,
            pointer(seqstart_q),
            pointer(seqstart_k),
            &params,
        )
    };
    (code, region.to_vec())
}

/// Prepares the backward workspace's metadata region at device address `workspace` from the sequence
/// starts in device memory, on `stream`, without synchronizing with the host: graph-capture safe (spec
/// `ck_fmha_bwd.md` §4.3). `seqstart_q_dev`/`seqstart_k_dev` are device addresses of `[batch + 1]`
/// `i32` each in group mode, 0 in batch mode; `workspace` holds at least `layout.metadata_bytes` bytes
/// and is 16-byte aligned. The dq_acc region after the metadata is not touched.
///
/// GPU builds launch the one-thread kernel of `hip/bwd/prepare_workspace.hip`; the host backend queues
/// [`crate::workspace::prepare_metadata`] on the stream, which writes the same bytes. Invalid seqstarts
/// (only seen when the stream gets there) leave an all-zero region, which `run` refuses as not
/// prepared; the host backend also reports the error at the stream's next synchronize.
pub fn prepare_workspace_device(
    layout: &WorkspaceLayout,
    workspace: usize,
    seqstart_q_dev: usize,
    seqstart_k_dev: usize,
    stream: Stream,
) -> Result<()> {
    if workspace == 0 {
        return Err(Error::null("workspace"));
    }
    let misalign = workspace % SECTION_ALIGNMENT;
    crate::error::ensure(misalign == 0, "workspace", || {
        format!("must be {SECTION_ALIGNMENT}-byte aligned (address mod {SECTION_ALIGNMENT} = {misalign})")
    })?;
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    {
        load_kernel_modules()?; // fails cleanly with NoDevice before touching the driver
        let params = PrepareParams::new(layout);
        // SAFETY: the stub copies `params` into the launch before returning. The kernel writes
        // `layout.metadata_bytes` bytes at `workspace` and reads `batch + 1` entries of each non-null
        // seqstart array: device memory of those sizes, as the caller guarantees. `stream` is a native
        // stream handle.
        let code = unsafe {
            stubs::fmha_hip_prepare_workspace(
                workspace as *mut _,
                seqstart_q_dev as *const i32,
                seqstart_k_dev as *const i32,
                &params,
                stream.0 as *mut _,
            )
        };
        launch_result("prepare_workspace", code)
    }
    #[cfg(not(any(feature = "cuda", feature = "rocm")))]
    {
        use super::host::DeviceSlice;
        use crate::host_buffer::try_filled;
        let out = DeviceSlice::<u8>::new(workspace, layout.metadata_bytes, "workspace")?;
        let entries = layout.params.batch as usize + 1;
        let seqstart = |address: usize, field: &str| {
            (address != 0).then(|| DeviceSlice::<i32>::new(address, entries, field)).transpose()
        };
        let (q, k) = (seqstart(seqstart_q_dev, "seqstart_q")?, seqstart(seqstart_k_dev, "seqstart_k")?);
        let layout = *layout;
        super::host::runtime().enqueue(stream, move || {
            let read = |s: Option<DeviceSlice<i32>>, field: &str| -> Result<Option<Vec<i32>>> {
                s.map(|s| {
                    let mut host = try_filled(s.len(), 0, field)?;
                    s.read_into(0, &mut host);
                    Ok(host)
                })
                .transpose()
            };
            let (q, k) = (read(q, "seqstart_q")?, read(k, "seqstart_k")?);
            let mut buffer = AlignedBytes::new(layout.metadata_bytes, 0, "batch")?;
            let region = buffer.as_mut_slice();
            let outcome = crate::workspace::prepare_metadata(&layout, q.as_deref(), k.as_deref(), region);
            if outcome.is_err() {
                region.fill(0); // as the GPU kernel leaves it: "not prepared", no work
            }
            out.write_from(0, region);
            outcome.map(|_| ())
        })
    }
}

/// Enqueues the forward described by `kargs` on `stream`.
pub fn forward(kargs: FwdKargs, stream: Stream) -> Result<()> {
    #[cfg(any(feature = "cuda", feature = "rocm"))]
    {
        load_kernel_modules()?;
        let params = crate::fwd::kargs::FwdParams::new(&kargs);
        // SAFETY: the parameter block describes tensors validated against their shapes and strides
        // (FwdArgs::validate) for an instance this build compiled; the stub copies the block into the
        // launch before returning; `stream` is a native stream handle.
        let code = unsafe { stubs::fmha_hip_fwd(&params, stream.0 as *mut _) };
        launch_result("fwd", code)
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
        load_kernel_modules()?;
        let params = crate::bwd::kargs::BwdParams::new(&kargs)?;
        // SAFETY: the parameter block describes tensors validated against their shapes and strides
        // (BwdArgs::extents, Instance::check_tensor) and a workspace of at least the launcher's size,
        // for an instance this build compiled; the stub copies the block into the launches before
        // returning; `stream` is a native stream handle.
        let code = unsafe { stubs::fmha_hip_bwd(&params, stream.0 as *mut _) };
        launch_result("bwd", code)
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
mod prepare_tests;

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
