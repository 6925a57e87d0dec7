//! Asynchronous workspace preparation (spec §5.2, and beyond it): everything on the caller's stream,
//! nothing blocking the host.
//!
//! Host path: device→pinned copies of the seqstarts, a stream host function that packs the metadata
//! with the same `workspace::prepare_metadata` as the synchronous path, a pinned→device copy, and a
//! last host function that drops the staging buffer (handing it to the pinned releaser). The staging
//! buffer is owned by those host functions, not by the launcher, so destroying the launcher while
//! the stream still works is safe.
//!
//! Device path: one single-thread kernel builds the same bytes from the device seqstarts: no host
//! function, no pinned memory, safe under stream/graph capture. `Auto` chooses it in batch mode and
//! when the stream is capturing: the host path's round trip (copy, host function, copy back) leaves the
//! GPU idle while the host works (about 0.8 ms per backward on an H200, docs/perf.md), and in batch
//! mode it has nothing to check that the host did not already check. Group mode outside capture keeps
//! the host path: it validates the device seqstarts and reports invalid ones through the launcher,
//! where the kernel can only leave the workspace unprepared.

use super::launcher::{AlignedBytes, BwdLauncher};
use crate::error::{Error, Result, Status};
use crate::pinned::{PinnedAllocator, PinnedStaging};
use crate::problem::Mode;
use crate::runtime::host::DeviceSlice;
use crate::runtime::{self, CopyKind, Stream};
use crate::workspace::{self, SECTION_ALIGNMENT};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

/// How `prepare_workspace_async` builds the metadata (`fmha_prepare_method`; values are ABI).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrepareMethod {
    /// Device kernel in batch mode or when the stream is capturing, host function otherwise.
    Auto = 0,
    Host = 1,
    Device = 2,
}

impl PrepareMethod {
    pub fn from_i32(value: i32) -> Result<PrepareMethod> {
        match value {
            0 => Ok(PrepareMethod::Auto),
            1 => Ok(PrepareMethod::Host),
            2 => Ok(PrepareMethod::Device),
            _ => Err(Error::invalid("method", format!("{value} is not a prepare method (0 auto, 1 host, 2 device)"))),
        }
    }
}

/// An error raised inside a stream host function, reported by the launcher's next call.
pub type AsyncErrorSlot = Arc<Mutex<Option<Error>>>;

impl BwdLauncher {
    /// Prepares `workspace` on `stream` from device seqstarts (group mode; NULL in batch mode),
    /// returning without waiting. `allocator` supplies the pinned staging memory of the host path
    /// (the runtime's pinned memory when `None`).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_workspace_async(
        &self,
        workspace: usize,
        bytes: usize,
        seqstart_q: usize,
        seqstart_k: usize,
        stream: Stream,
        allocator: Option<PinnedAllocator>,
        method: PrepareMethod,
    ) -> Result<()> {
        self.take_async_error()?;
        self.check_workspace(workspace, bytes)?;
        match self.traits().mode {
            Mode::Group => {
                if seqstart_q == 0 {
                    return Err(Error::null("seqstart_q"));
                }
                if seqstart_k == 0 {
                    return Err(Error::null("seqstart_k"));
                }
            }
            Mode::Batch => {
                if seqstart_q != 0 || seqstart_k != 0 {
                    return Err(Error::invalid("seqstart_q", "must be null in batch mode"));
                }
            }
        }
        let rt = runtime::current()?;
        let device = match method {
            PrepareMethod::Auto => self.traits().mode == Mode::Batch || rt.stream_is_capturing(stream)?,
            PrepareMethod::Host => false,
            PrepareMethod::Device => true,
        };
        if device {
            runtime::launch::prepare_workspace_device(self.layout(), workspace, seqstart_q, seqstart_k, stream)?;
        } else {
            self.enqueue_host_prepare(
                workspace,
                seqstart_q,
                seqstart_k,
                stream,
                allocator.unwrap_or_else(PinnedAllocator::runtime),
            )?;
        }
        // The metadata's fingerprint depends on device data not read here; the kernels check it.
        self.set_prepared(workspace, bytes);
        Ok(())
    }

    fn enqueue_host_prepare(
        &self,
        workspace: usize,
        seqstart_q: usize,
        seqstart_k: usize,
        stream: Stream,
        allocator: PinnedAllocator,
    ) -> Result<()> {
        let rt = runtime::current()?;
        let layout = *self.layout();
        let group = self.traits().mode == Mode::Group;
        let entries = if group { self.traits().batch as usize + 1 } else { 0 };
        // [seqstart_q copy | seqstart_k copy | metadata], each 16-byte aligned.
        let stride = (entries * 4).next_multiple_of(SECTION_ALIGNMENT);
        let meta_at = 2 * stride;
        // Allocated before anything is queued: a failure leaves no partial work on the stream.
        let staging = Arc::new(PinnedStaging::allocate(&allocator, meta_at + layout.metadata_bytes)?);
        let base = staging.ptr();
        if base % SECTION_ALIGNMENT != 0 {
            return Err(Error::invalid("allocator.allocate", "returned memory that is not 16-byte aligned"));
        }
        if group {
            rt.memcpy_async(base, seqstart_q, entries * 4, CopyKind::DeviceToHost, stream)?;
            rt.memcpy_async(base + stride, seqstart_k, entries * 4, CopyKind::DeviceToHost, stream)?;
        }
        let errors = self.async_errors();
        let pack_staging = Arc::clone(&staging);
        rt.launch_host_func(
            stream,
            Box::new(move || {
                let meta = pack_staging.ptr() + meta_at;
                let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<Vec<u8>> {
                    let read = |at: usize, field: &str| -> Result<Vec<i32>> {
                        let mut values = vec![0i32; entries];
                        DeviceSlice::<i32>::new(at, entries, field)?.read_into(0, &mut values);
                        Ok(values)
                    };
                    let (q, k) = if group {
                        (Some(read(base, "seqstart_q")?), Some(read(base + stride, "seqstart_k")?))
                    } else {
                        (None, None)
                    };
                    let mut bytes = AlignedBytes::new(layout.metadata_bytes);
                    workspace::prepare_metadata(&layout, q.as_deref(), k.as_deref(), bytes.as_mut_slice())?;
                    Ok(bytes.as_mut_slice().to_vec())
                }))
                .unwrap_or_else(|panic| {
                    Err(Error::internal(format!(
                        "prepare host function panicked: {}",
                        crate::error::panic_message(&*panic)
                    )))
                });
                let out = DeviceSlice::<u8>::new(meta, layout.metadata_bytes, "staging");
                match (outcome, out) {
                    (Ok(bytes), Ok(out)) => out.write_from(0, &bytes),
                    (outcome, out) => {
                        // An all-zero region is "not prepared" with no work: kernels that read it do
                        // nothing harmful, and the error reaches the caller through the launcher.
                        if let Ok(out) = out {
                            out.write_from(0, &vec![0u8; layout.metadata_bytes]);
                        }
                        let error = outcome.err().unwrap_or_else(|| Error::internal("staging buffer unusable"));
                        let message = format!("prepare_workspace_async failed on the stream: {}", error.message);
                        errors
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(Error::new(Status::AsyncFailure, message));
                    }
                }
            }),
        )?;
        rt.memcpy_async(workspace, base + meta_at, layout.metadata_bytes, CopyKind::HostToDevice, stream)?;
        // The staging buffer is released only after the stream consumed it: its last reference
        // belongs to a host function queued after the copy.
        let release = Arc::clone(&staging);
        if let Err(e) = rt.launch_host_func(stream, Box::new(move || drop(release))) {
            // The copy above may still read the buffer: leaking it is the only safe option.
            std::mem::forget(staging);
            return Err(e);
        }
        Ok(())
    }

    /// `AsyncFailure` with the message of a failed stream-side step, once.
    pub fn take_async_error(&self) -> Result<()> {
        match self.async_errors().lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
