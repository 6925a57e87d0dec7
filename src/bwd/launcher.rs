//! The backward launcher: created from traits, it owns the kernel selection and the workspace
//! layout; `prepare_workspace` writes the metadata for a set of sequence starts; `run` enqueues the
//! stages on a stream.
//!
//! A launcher holds no state about workspaces: a prepared workspace describes itself (its header's
//! fingerprint covers the layout parameters and the sequence starts), and the kernels check it against
//! each run's arguments. So any number of workspaces can be used with one launcher, from any threads
//! and streams, and a workspace prepared by one launcher serves every launcher with the same traits.

use super::args::BwdArgs;
use super::dq_scheme::runs_ordered;
use super::traits::BwdTraits;
use crate::error::{ensure, Error, Result};
use crate::host_buffer::AlignedBytes;
use crate::launch::BwdKargs;
use crate::problem::{Mode, Shape};
use crate::registry::{Instance, Operation, Plan, Request, Stage};
use crate::runtime::{self, Arch, CopyKind, DevicePtr, Stream};
use crate::schedule::XcdRemap;
use crate::workspace::{self, WorkspaceLayout, WorkspaceParams};

#[derive(Debug)]
pub struct BwdLauncher {
    traits: BwdTraits,
    shape: Shape,
    instance: Instance,
    layout: WorkspaceLayout,
}

/// The workspace parameters of a problem for a dq_dk_dv instance on `num_cus` compute units.
///
/// The schedule's work unit is one (batch, kv head, K tile): it loops over the `nhead_q / nhead_k`
/// query heads of its kv head, so dK/dV are reduced over the GQA group inside the unit, in a fixed
/// order, without per-query-head copies. dq_acc therefore holds, per (batch, kv head, split), rows of
/// `group × hdim_q` floats; with `nhead_q == nhead_k` this is exactly CK's `[b][h][split][sq][dq]`.
/// `ordered_dq`: deterministic mode's dQ scheme ([`runs_ordered`]).
pub fn workspace_params(
    traits: &BwdTraits,
    instance: &Instance,
    num_cus: i64,
    arch: Arch,
    ordered_dq: bool,
) -> WorkspaceParams {
    let group = traits.nhead_q / traits.nhead_k.max(1);
    WorkspaceParams {
        group_mode: traits.mode == Mode::Group,
        deterministic: traits.deterministic,
        ordered_dq: traits.deterministic && ordered_dq,
        batch: traits.batch,
        nhead_q: traits.nhead_q,
        nhead_k: traits.nhead_k,
        row_elements: traits.hdim_q * group,
        seqlen_q: traits.seqlen_q,
        seqlen_k: traits.seqlen_k,
        max_seqlen_k: traits.max_seqlen_k,
        m0: instance.m0,
        n0: instance.n0,
        num_cus,
        remap: if arch.has_eight_xcds() { XcdRemap::Xcd8 } else { XcdRemap::None },
        masked: instance.masked,
    }
}

fn select(traits: &BwdTraits, shape: &Shape, arch: Arch) -> Result<Instance> {
    crate::registry::select(
        arch,
        &Request {
            operation: Operation::Backward,
            dtype: traits.dtype.into(),
            hdim_q: traits.hdim_q,
            hdim_v: traits.hdim_v,
            masked: shape.masked(),
            deterministic: traits.deterministic,
            packed_gqa: false,
        },
    )
}

/// The workspace size for `traits` on the current device without creating a launcher.
pub fn workspace_size_upper_bound(traits: &BwdTraits) -> Result<usize> {
    let shape = traits.validate()?;
    let rt = runtime::current()?;
    let arch = rt.arch()?;
    let instance = select(traits, &shape, arch)?;
    let ordered_dq = runs_ordered(traits, arch)?;
    workspace::workspace_size_upper_bound(&workspace_params(traits, &instance, rt.cu_count()?, arch, ordered_dq))
}

impl BwdLauncher {
    pub fn new(traits: BwdTraits) -> Result<BwdLauncher> {
        let shape = traits.validate()?;
        let rt = runtime::current()?;
        let arch = rt.arch()?;
        let instance = select(&traits, &shape, arch)?;
        let ordered_dq = runs_ordered(&traits, arch)?;
        // Invalid sizes (the workspace layout's bounds) are reported before what this build cannot run.
        let layout = WorkspaceLayout::new(&workspace_params(&traits, &instance, rt.cu_count()?, arch, ordered_dq))?;
        instance.check_grid(traits.nhead_q, traits.batch)?;
        Ok(BwdLauncher { traits, shape, instance, layout })
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

    /// Checks a workspace argument: not null, aligned, and — when the caller says how large it is
    /// (`bytes > 0`, or always with `size_required`) — at least [`workspace_size`](Self::workspace_size)
    /// bytes.
    pub(crate) fn check_workspace(&self, workspace: DevicePtr<u8>, bytes: usize, size_required: bool) -> Result<()> {
        let need = self.workspace_size();
        workspace::check_workspace_argument(
            workspace.addr().0,
            bytes,
            need,
            size_required,
            "fmha_bwd_launcher_workspace_size",
        )
    }

    /// Checks the seqstart arguments of a prepare against the mode: both in group mode, neither in
    /// batch mode (naming the one that is wrong).
    pub(crate) fn check_prepare_seqstarts(&self, seqstart_q: bool, seqstart_k: bool) -> Result<()> {
        match self.traits.mode {
            Mode::Group if !seqstart_q => Err(Error::null("seqstart_q")),
            Mode::Group if !seqstart_k => Err(Error::null("seqstart_k")),
            Mode::Group => Ok(()),
            Mode::Batch => {
                ensure(!seqstart_q, "seqstart_q", || "must be null in batch mode".into())?;
                ensure(!seqstart_k, "seqstart_k", || "must be null in batch mode".into())
            }
        }
    }

    /// Host seqstarts → metadata bytes, built on the host.
    pub fn metadata(&self, seqstart_q: Option<&[i32]>, seqstart_k: Option<&[i32]>) -> Result<AlignedBytes> {
        self.check_prepare_seqstarts(seqstart_q.is_some(), seqstart_k.is_some())?;
        let mut bytes = AlignedBytes::new(self.layout.metadata_bytes, 0, "batch")?;
        workspace::prepare_metadata(&self.layout, seqstart_q, seqstart_k, bytes.as_mut_slice())?;
        Ok(bytes)
    }

    /// Writes the metadata for these (host) sequence starts into the workspace and waits for the copy.
    pub fn prepare_workspace(
        &self,
        workspace: DevicePtr<u8>,
        bytes: usize,
        seqstart_q: Option<&[i32]>,
        seqstart_k: Option<&[i32]>,
    ) -> Result<()> {
        self.check_workspace(workspace, bytes, true)?;
        let metadata = self.metadata(seqstart_q, seqstart_k)?;
        let rt = runtime::current()?;
        let region = metadata.as_slice();
        rt.memcpy(workspace.addr().0, region.as_ptr() as usize, region.len(), CopyKind::HostToDevice)
    }

    /// Validates `args` against the traits and the prepared workspace, and enqueues the backward.
    pub fn run(&self, args: &BwdArgs, stream: Stream) -> Result<()> {
        let shape = args.shape(&self.traits)?;
        let tensors = args.tensors(&shape)?;
        // (field, tensor, loaded by the kernels' tiles)
        for (field, tensor, input) in [
            ("q", &args.q, true),
            ("k", &args.k, true),
            ("v", &args.v, true),
            ("o", &args.o, false),
            ("d_o", &args.d_o, true),
            ("dq", &args.dq, false),
            ("dk", &args.dk, false),
            ("dv", &args.dv, false),
        ] {
            self.instance.check_tensor(field, tensor, shape.mode, 2)?;
            if input {
                self.instance.check_input_rows(field, tensor)?;
            }
        }
        self.check_workspace(args.workspace, args.workspace_size, false)?;
        args.check_overlap(&tensors, self.workspace_size())?;
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
            extents: super::args::extents(&tensors),
            sequences: args.sequences,
            workspace: args.workspace,
            layout: self.layout,
        };
        crate::launch::backward(&kargs, stream)
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// What [`run`](Self::run) launches, in order. The dq_acc zeroing follows `WorkspaceLayout::
    /// needs_zero_dq_acc` and `zero_dq_acc_elements` (`dq_acc_needs_zeroing` in
    /// `hip/bwd/workspace_view.h`); the AMD kernels add into every split slot, so they always zero it.
    /// The GPU kernels zero it in the dot_do_o launch (`hip/bwd/dot_do_o.h`); the host executor in a stage
    /// of its own.
    pub fn plan(&self) -> Plan {
        let p = &self.layout.params;
        let zeroing = if p.ordered() {
            Some("the dq_acc region and the ordered dQ's semaphores")
        } else if self.layout.needs_zero_dq_acc() || self.instance.arch.has_eight_xcds() {
            Some("the whole dq_acc region")
        } else if self.traits.mode == Mode::Group {
            Some("the used prefix of dq_acc (deterministic group mode)")
        } else {
            None // deterministic batch mode: each slot's first unit writes it
        };
        let dq_dk_dv = Stage::instance("dq_dk_dv", self.instance);
        let dq_dk_dv = if p.split_slots() {
            dq_dk_dv.with_note("dQ in split slots")
        } else if p.ordered() {
            dq_dk_dv.with_note("dQ added in turn (ordered)")
        } else {
            dq_dk_dv
        };
        let mut stages = match zeroing {
            Some(note) if self.instance.arch != Arch::Host => {
                vec![Stage::kernel("dot_do_o_and_zero_dq_acc").with_note(note)]
            }
            Some(note) => vec![Stage::kernel("dot_do_o"), Stage::kernel("zero_dq_acc").with_note(note)],
            None => vec![Stage::kernel("dot_do_o")],
        };
        stages.push(dq_dk_dv);
        stages.push(Stage::kernel("convert_dq"));
        Plan { operation: Operation::Backward, arch: self.instance.arch, stages }
    }
}
