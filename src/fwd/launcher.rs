//! Runs the forward on a stream.

use super::{FwdArgs, FwdTraits};
use crate::error::Result;
use crate::runtime::{self, Stream};

/// Validates, selects the kernel instance for the current device and enqueues the forward on
/// `stream`. Returns once the work is queued.
pub fn run(traits: &FwdTraits, args: &FwdArgs, stream: Stream) -> Result<()> {
    let rt = runtime::current()?;
    let kargs = args.validate(traits, rt.arch()?)?;
    crate::launch::forward(&kargs, stream)
}
