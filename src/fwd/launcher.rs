//! Runs the forward on a stream.

use super::{FwdArgs, FwdTraits};
use crate::error::Result;
use crate::registry::{Operation, Plan, Stage};
use crate::runtime::{self, Stream};
use crate::workspace::SCHEDULER_WORKSPACE_BYTES;

/// Validates, selects the kernel instance for the current device and enqueues the forward on
/// `stream`. Returns once the work is queued.
pub fn run(traits: &FwdTraits, args: &FwdArgs, stream: Stream) -> Result<()> {
    let rt = runtime::current()?;
    let kargs = args.validate(traits, rt.arch()?)?;
    crate::launch::forward(&kargs, stream)
}

/// What [`run`] would launch for these arguments (validated as `run` validates them): one kernel.
pub fn plan(traits: &FwdTraits, args: &FwdArgs) -> Result<Plan> {
    let arch = runtime::current()?.arch()?;
    let kargs = args.validate(traits, arch)?;
    Ok(Plan { operation: Operation::Forward, arch, stages: vec![Stage::instance("fwd", kargs.instance)] })
}

/// Bytes of the scheduler workspace (`FwdArgs::workspace`) a forward with `traits` takes: the traits
/// are validated as [`run`] validates them; the size is the same on every backend and device.
pub fn workspace_size(traits: &FwdTraits) -> Result<usize> {
    traits.validate()?;
    Ok(SCHEDULER_WORKSPACE_BYTES)
}
