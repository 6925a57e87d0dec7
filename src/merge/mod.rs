//! The standalone merge of attention states (spec/inference.md §3.5): partial `(O, LSE)` pairs from
//! any source (other GPUs of a ring, other chunks, a shared prefix) merged per (row, head) in state
//! order by the rule of `problem::merge`. No traits, no kernel choice, no workspace: arguments,
//! validation, launch.

pub mod args;

pub use args::MergeArgs;

use crate::error::Result;
use crate::runtime::Stream;

/// Validates `args` and enqueues the merge on `stream`; returns once it is queued.
pub fn run(args: &MergeArgs, stream: Stream) -> Result<()> {
    let kargs = args.validate()?;
    crate::launch::merge(&kargs, stream)
}
