//! Asynchronous workspace preparation (spec §5.2, and beyond it): everything on the caller's stream,
//! nothing blocking the host, on the first call too.
//!
//! Device path (the default, `Auto`): one single-thread kernel builds the metadata from the device
//! seqstarts, checking them as it goes: no host function, no pinned memory, safe under stream/graph
//! capture, and nothing that can wait for the device (measured on an H200, docs/perf.md: a first
//! host-path prepare of a new shape, or a runtime call that touches pinned memory, can stall the host
//! behind queued work). Invalid seqstarts leave the region all zero ("not prepared").
//!
//! Host path: device→pinned copies of the seqstarts, a stream host function that packs the metadata
//! with the same `workspace::prepare_metadata` as the synchronous path, a pinned→device copy, and a
//! last host function that drops the staging buffer (handing it to the pinned releaser). The staging
//! buffer is owned by those host functions, not by the launcher, so destroying the launcher while
//! the stream still works is safe. A failure inside the host function (invalid seqstarts) becomes the
//! stream's error, reported by its next synchronize.

use super::launcher::BwdLauncher;
use crate::abi_values::{abi_enum, FMHA_PREPARE_AUTO, FMHA_PREPARE_DEVICE, FMHA_PREPARE_HOST};
use crate::error::{Error, Result, Status};
use crate::launch::host::prepare_region;
use crate::pinned::{PinnedAllocator, PinnedStaging};
use crate::problem::Mode;
use crate::runtime::host::DeviceSlice;
use crate::runtime::{self, CopyKind, DevicePtr, Stream};
use crate::workspace::{self, SECTION_ALIGNMENT};
use std::sync::Arc;

abi_enum! {
    /// How `prepare_workspace_async` builds the metadata (`FMHA_PREPARE_*`).
    pub enum PrepareMethod {
        /// The device kernel.
        Auto = FMHA_PREPARE_AUTO => "auto",
        Host = FMHA_PREPARE_HOST => "host",
        Device = FMHA_PREPARE_DEVICE => "device",
    }
}

impl PrepareMethod {
    pub fn from_i32(value: i32) -> Result<PrepareMethod> {
        PrepareMethod::parse(value).ok_or_else(|| {
            Error::invalid("method", format!("{value} is not a prepare method ({})", PrepareMethod::choices()))
        })
    }
}

impl BwdLauncher {
    /// Prepares `workspace` on `stream` from device seqstarts (group mode; 0 in batch mode),
    /// returning without waiting. `allocator` supplies the pinned staging memory of the host method
    /// (the library's pooled pinned buffers when `None`).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_workspace_async(
        &self,
        workspace: DevicePtr<u8>,
        bytes: usize,
        seqstart_q: DevicePtr<i32>,
        seqstart_k: DevicePtr<i32>,
        stream: Stream,
        allocator: Option<PinnedAllocator>,
        method: PrepareMethod,
    ) -> Result<()> {
        self.check_workspace(workspace, bytes, true)?;
        self.check_prepare_seqstarts(!seqstart_q.is_null(), !seqstart_k.is_null())?;
        let entries = self.seqstart_entries();
        for (field, array) in [("seqstart_q", seqstart_q), ("seqstart_k", seqstart_k)] {
            crate::problem::check_device_array(array, entries, field)?;
        }
        match method {
            PrepareMethod::Auto | PrepareMethod::Device => {
                crate::launch::prepare_workspace(self.layout(), workspace, seqstart_q, seqstart_k, stream)
            }
            PrepareMethod::Host => self.enqueue_host_prepare(
                workspace,
                seqstart_q,
                seqstart_k,
                stream,
                allocator.unwrap_or_else(PinnedAllocator::runtime),
            ),
        }
    }

    /// Entries of each seqstart array a prepare reads: `batch + 1` in group mode, none in batch mode.
    fn seqstart_entries(&self) -> usize {
        match self.traits().mode {
            Mode::Group => self.traits().batch as usize + 1,
            Mode::Batch => 0,
        }
    }

    fn enqueue_host_prepare(
        &self,
        workspace: DevicePtr<u8>,
        seqstart_q: DevicePtr<i32>,
        seqstart_k: DevicePtr<i32>,
        stream: Stream,
        allocator: PinnedAllocator,
    ) -> Result<()> {
        let rt = runtime::current()?;
        let layout = *self.layout();
        let entries = self.seqstart_entries();
        // [seqstart_q copy | seqstart_k copy | metadata], each 16-byte aligned.
        let stride = (entries * 4).next_multiple_of(SECTION_ALIGNMENT);
        let meta_at = 2 * stride;
        let staging_bytes = meta_at.checked_add(layout.metadata_bytes).ok_or_else(|| {
            Error::new(Status::OutOfMemory, format!("batch: {entries} seqstart entries overflow a staging buffer"))
        })?;
        // Allocated before anything is queued: a failure leaves no partial work on the stream.
        let staging = Arc::new(PinnedStaging::allocate(&allocator, staging_bytes)?);
        let base = staging.ptr();
        workspace::check_section_aligned("allocator.allocate", base)?;
        if entries > 0 {
            rt.memcpy_async(base, seqstart_q.addr().0, entries * 4, CopyKind::DeviceToHost, stream)?;
            rt.memcpy_async(base + stride, seqstart_k.addr().0, entries * 4, CopyKind::DeviceToHost, stream)?;
        }
        let pack_staging = Arc::clone(&staging);
        rt.launch_host_func(
            stream,
            Box::new(move || {
                // Pinned host memory (this closure owns a reference, so it lives until the closure
                // ran): addressable from this host function as host-backend device memory is.
                let base = pack_staging.ptr();
                let meta = DeviceSlice::<u8>::new(DevicePtr::new(base + meta_at), layout.metadata_bytes, "staging")?;
                let seqstart = |at: usize, field: &str| {
                    (entries > 0).then(|| DeviceSlice::<i32>::new(DevicePtr::new(at), entries, field)).transpose()
                };
                let (q, k) = (seqstart(base, "seqstart_q")?, seqstart(base + stride, "seqstart_k")?);
                prepare_region(&layout, q, k, meta).map_err(|error| {
                    Error::new(
                        Status::AsyncFailure,
                        format!("prepare_workspace_async (host method) failed on the stream: {}", error.message),
                    )
                })
            }),
        )?;
        rt.memcpy_async(workspace.addr().0, base + meta_at, layout.metadata_bytes, CopyKind::HostToDevice, stream)?;
        // The staging buffer is released only after the stream consumed it: its last reference
        // belongs to a host function queued after the copy.
        let release = Arc::clone(&staging);
        let release_func = Box::new(move || {
            drop(release);
            Ok(())
        });
        if let Err(e) = rt.launch_host_func(stream, release_func) {
            // The copy above may still read the buffer: leaking it is the only safe option.
            std::mem::forget(staging);
            return Err(e);
        }
        Ok(())
    }
}
