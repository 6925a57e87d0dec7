//! The backward launcher: created from traits, it owns the kernel selection and the workspace
//! layout; `prepare_workspace` writes the metadata for a set of sequence starts; `run` enqueues the
//! stages on a stream.

use super::args::BwdArgs;
use super::kargs::BwdKargs;
use super::prepare_async::AsyncErrorSlot;
use super::traits::BwdTraits;
use crate::error::{Error, Result, Status};
use crate::problem::{Mode, Shape};
use crate::registry::{Instance, Operation, Request};
use crate::runtime::{self, Arch, CopyKind, Stream};
use crate::schedule::XcdRemap;
use crate::workspace::{self, WorkspaceLayout, WorkspaceParams};
use std::sync::Mutex;

/// What the last prepare was given, so `run` can refuse a workspace it never saw. (Whether the
/// metadata matches the run's sequence starts is checked by the kernels, from the header's
/// fingerprint: after an asynchronous prepare the host never sees the device seqstarts.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Prepared {
    workspace: usize,
    bytes: usize,
}

#[derive(Debug)]
pub struct BwdLauncher {
    traits: BwdTraits,
    shape: Shape,
    instance: Instance,
    layout: WorkspaceLayout,
    prepared: Mutex<Option<Prepared>>,
    async_errors: AsyncErrorSlot,
}

/// The workspace parameters of a problem for a dq_dk_dv instance on `num_cus` compute units.
///
/// The schedule's work unit is one (batch, kv head, K tile): it loops over the `nhead_q / nhead_k`
/// query heads of its kv head, so dK/dV are reduced over the GQA group inside the unit, in a fixed
/// order, without per-query-head copies. dq_acc therefore holds, per (batch, kv head, split), rows of
/// `group × hdim_q` floats; with `nhead_q == nhead_k` this is exactly CK's `[b][h][split][sq][dq]`.
pub fn workspace_params(traits: &BwdTraits, instance: &Instance, num_cus: i64, arch: Arch) -> WorkspaceParams {
    let group = traits.nhead_q / traits.nhead_k.max(1);
    WorkspaceParams {
        group_mode: traits.mode == Mode::Group,
        deterministic: traits.deterministic,
        batch: traits.batch,
        nhead_q: traits.nhead_k,
        hdim_q: traits.hdim_q * group,
        seqlen_q: traits.seqlen_q,
        seqlen_k: traits.seqlen_k,
        max_seqlen_k: traits.max_seqlen_k,
        m0: instance.m0,
        n0: instance.n0,
        num_cus,
        remap: if arch.has_eight_xcds() { XcdRemap::Xcd8 } else { XcdRemap::None },
    }
}

fn select(traits: &BwdTraits, shape: &Shape, arch: Arch) -> Result<Instance> {
    crate::registry::select(
        arch,
        &Request {
            operation: Operation::Backward,
            dtype: traits.dtype,
            hdim_q: traits.hdim_q,
            hdim_v: traits.hdim_v,
            masked: shape.masked(),
            deterministic: traits.deterministic,
        },
    )
}

/// The workspace size for `traits` on the current device without creating a launcher.
pub fn workspace_size_upper_bound(traits: &BwdTraits) -> Result<usize> {
    let shape = traits.validate()?;
    let rt = runtime::current()?;
    let arch = rt.arch()?;
    let instance = select(traits, &shape, arch)?;
    workspace::workspace_size_upper_bound(&workspace_params(traits, &instance, rt.cu_count()?, arch))
}

impl BwdLauncher {
    pub fn new(traits: BwdTraits) -> Result<BwdLauncher> {
        let shape = traits.validate()?;
        let rt = runtime::current()?;
        let arch = rt.arch()?;
        let instance = select(&traits, &shape, arch)?;
        let layout = WorkspaceLayout::new(&workspace_params(&traits, &instance, rt.cu_count()?, arch))?;
        Ok(BwdLauncher {
            traits,
            shape,
            instance,
            layout,
            prepared: Mutex::new(None),
            async_errors: AsyncErrorSlot::default(),
        })
    }

    pub fn traits(&self) -> &BwdTraits {
        &self.traits
    }

    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    pub fn layout(&self) -> &WorkspaceLayout {
        &self.layout
    }

    /// Bytes of workspace `run` needs: the metadata region plus the dq_acc upper bound.
    pub fn workspace_size(&self) -> usize {
        self.layout.workspace_size()
    }

    pub(crate) fn check_workspace(&self, workspace: usize, bytes: usize) -> Result<()> {
        if workspace == 0 {
            return Err(Error::null("workspace"));
        }
        let need = self.workspace_size();
        if bytes < need {
            return Err(Error::new(
                Status::WorkspaceTooSmall,
                format!("workspace_size: {bytes} bytes given, this launcher needs {need} (fmha_bwd_launcher_workspace_size)"),
            ));
        }
        Ok(())
    }

    /// Host seqstarts → metadata bytes, built on the host.
    pub fn metadata(&self, seqstart_q: Option<&[i32]>, seqstart_k: Option<&[i32]>) -> Result<Vec<u8>> {
        match self.traits.mode {
            Mode::Group => {
                if seqstart_q.is_none() {
                    return Err(Error::null("seqstart_q"));
                }
                if seqstart_k.is_none() {
                    return Err(Error::null("seqstart_k"));
                }
            }
            Mode::Batch => {
                if seqstart_q.is_some() || seqstart_k.is_some() {
                    return Err(Error::invalid("seqstart_q", "must be null in batch mode"));
                }
            }
        }
        let mut bytes = AlignedBytes::new(self.layout.metadata_bytes);
        workspace::prepare_metadata(&self.layout, seqstart_q, seqstart_k, bytes.as_mut_slice())?;
        Ok(bytes.as_mut_slice().to_vec())
    }

    /// Writes the metadata for these (host) sequence starts into the workspace and waits for the copy.
    pub fn prepare_workspace(
        &self,
        workspace: usize,
        bytes: usize,
        seqstart_q: Option<&[i32]>,
        seqstart_k: Option<&[i32]>,
    ) -> Result<()> {
        self.take_async_error()?;
        self.check_workspace(workspace, bytes)?;
        let metadata = self.metadata(seqstart_q, seqstart_k)?;
        let rt = runtime::current()?;
        rt.memcpy(workspace, metadata.as_ptr() as usize, metadata.len(), CopyKind::HostToDevice)?;
        self.set_prepared(workspace, bytes);
        Ok(())
    }

    pub(crate) fn set_prepared(&self, workspace: usize, bytes: usize) {
        *self.prepared.lock().unwrap_or_else(|p| p.into_inner()) = Some(Prepared { workspace, bytes });
    }

    pub(crate) fn async_errors(&self) -> AsyncErrorSlot {
        std::sync::Arc::clone(&self.async_errors)
    }

    /// Validates `args` against the traits and the prepared workspace, and enqueues the backward.
    pub fn run(&self, args: &BwdArgs, stream: Stream) -> Result<()> {
        self.take_async_error()?;
        let shape = args.shape(&self.traits)?;
        let extents = args.extents(&shape)?;
        // (field, tensor, loaded by the kernels' tiles)
        for (field, tensor, input) in [
            ("q", &args.q, true),
            ("k", &args.k, true),
            ("v", &args.v, true),
            ("o", &args.o, false),
            ("do", &args.d_o, true),
            ("dq", &args.dq, false),
            ("dk", &args.dk, false),
            ("dv", &args.dv, false),
        ] {
            self.instance.check_tensor(field, tensor, 2)?;
            if input {
                self.instance.check_input_rows(field, tensor)?;
            }
        }
        let prepared = self.prepared.lock().unwrap_or_else(|p| p.into_inner()).ok_or_else(|| {
            Error::new(
                Status::WorkspaceNotPrepared,
                "workspace: never prepared by this launcher (call fmha_bwd_launcher_prepare_workspace first)",
            )
        })?;
        if args.workspace != prepared.workspace {
            return Err(Error::new(
                Status::WorkspaceNotPrepared,
                format!(
                    "workspace: {:#x} is not the buffer this launcher prepared ({:#x})",
                    args.workspace, prepared.workspace
                ),
            ));
        }
        self.check_workspace(args.workspace, prepared.bytes)?;
        let kargs = BwdKargs {
            shape,
            instance: self.instance,
            deterministic: self.traits.deterministic,
            q: args.q,
            k: args.k,
            v: args.v,
            o: args.o,
            lse: args.lse,
            d_o: args.d_o,
            d: args.d,
            dq: args.dq,
            dk: args.dk,
            dv: args.dv,
            extents,
            seqstart_q: args.seqstart_q,
            seqstart_k: args.seqstart_k,
            seqlen_q_ptr: args.seqlen_q_ptr,
            seqlen_k_ptr: args.seqlen_k_ptr,
            workspace: args.workspace,
            layout: self.layout,
        };
        runtime::launch::backward(kargs, stream)
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }
}

/// A byte buffer whose start is 16-byte aligned (the metadata sections are read as aligned structs).
pub(crate) struct AlignedBytes {
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

impl AlignedBytes {
    pub(crate) fn new(len: usize) -> AlignedBytes {
        let storage = vec![0u8; len + workspace::SECTION_ALIGNMENT];
        let offset = storage.as_ptr().align_offset(workspace::SECTION_ALIGNMENT);
        AlignedBytes { storage, offset, len }
    }
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + self.len]
    }
}
