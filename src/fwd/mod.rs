//! The forward operation: traits (dispatch key), args, validation into kernel arguments, launch.

pub mod args;
pub mod launcher;
pub mod traits;

pub use args::FwdArgs;
pub use launcher::{plan, run, workspace_size};
pub use traits::FwdTraits;
